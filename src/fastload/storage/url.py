"""URL and storage-option resolution: which filesystem, which root, which credentials.

Pure functions, no network: :func:`split_url` parses a URL, :func:`resolve_s3` turns a
``s3://`` or ``cos://`` URL plus ``storage_options`` (and the usual environment
variables, read through :func:`fastload.config.env`) into :class:`S3Settings`, whose
``repr`` never shows the secret.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fastload.config import env
from fastload.errors import ConfigError
from fastload.storage.schemes import check_protocol, supported_protocols

__all__ = ["S3Settings", "is_s3_like", "join", "resolve_s3", "split_url"]

_S3_PROTOCOLS = ("s3", "s3a", "cos")


def split_url(url: str) -> tuple[str, str]:
    """Split ``url`` into ``(protocol, rest)``; a plain path has protocol ``"file"``.

    ``rest`` has no trailing slash (except for a bare ``/``). Raises
    :class:`ConfigError` for a malformed URL (``s3:/bucket``, ``s3:bucket``: a
    known scheme without ``//``) and what
    :func:`fastload.storage.schemes.check_protocol` raises.
    """
    url = os.fspath(url)
    if "://" in url:
        protocol, rest = url.split("://", 1)
        protocol = protocol.lower()
        check_protocol(protocol, url)
    else:
        protocol, rest = "file", url
        scheme, colon, _ = url.partition(":")
        if colon and len(scheme) > 1 and scheme.lower() in supported_protocols():
            raise ConfigError(
                f"{url}: malformed URL (a scheme needs '://', as in "
                f"{scheme.lower()}://bucket/path); a local path starting with '{scheme}:' "
                f"can be given as ./{url}"
            )
    if protocol == "file":
        rest = os.path.abspath(os.path.expanduser(rest)) if rest else os.getcwd()
    rest = rest.rstrip("/") or ("/" if rest.startswith("/") else "")
    return protocol, rest


def is_s3_like(url: str) -> bool:
    """Whether ``url`` is served through s3fs (``s3://``, ``s3a://``, ``cos://``)."""
    return split_url(url)[0] in _S3_PROTOCOLS


def join(url: str, name: str) -> str:
    """``url`` and a relative ``name`` joined with exactly one ``/``."""
    if not name:
        return url
    return url.rstrip("/") + "/" + name.lstrip("/")


@dataclass(frozen=True)
class S3Settings:
    """Everything needed to make an s3fs filesystem for one bucket.

    ``key``/``secret``/``token`` are credentials (``None``: let botocore find them);
    ``extra`` holds other ``S3FileSystem`` keyword arguments passed through. The repr
    hides the secret and the token.
    """

    protocol: str
    bucket: str
    prefix: str
    endpoint_url: str | None = None
    region: str | None = None
    key: str | None = field(default=None, repr=False)
    secret: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    anon: bool = False
    virtual_hosted: bool = False
    client_kwargs: dict[str, Any] = field(default_factory=dict, repr=False)
    config_kwargs: dict[str, Any] = field(default_factory=dict, repr=False)
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __repr__(self) -> str:
        return (
            f"S3Settings(protocol={self.protocol!r}, bucket={self.bucket!r}, "
            f"prefix={self.prefix!r}, endpoint_url={self.endpoint_url!r}, "
            f"region={self.region!r}, key={'***' if self.key else None}, anon={self.anon})"
        )

    @property
    def secrets(self) -> tuple[str, ...]:
        """The secret strings that must never appear in logs or messages."""
        return tuple(s for s in (self.secret, self.token) if s)


def _pop(options: dict[str, Any], *names: str) -> Any:
    value = None
    for name in names:
        if name in options:
            got = options.pop(name)
            if value is None:
                value = got
    return value


def resolve_s3(url: str, storage_options: Mapping[str, Any] | None = None) -> S3Settings:
    """Resolve an ``s3://`` or ``cos://`` URL and its options into :class:`S3Settings`.

    ``storage_options`` may hold ``key``/``secret``/``token`` (or the botocore names
    ``aws_access_key_id``/…), ``endpoint_url`` (top level or in ``client_kwargs``),
    ``region``/``region_name``, ``anon``, ``client_kwargs``, ``config_kwargs`` and any
    other ``S3FileSystem`` argument. Missing values come from ``AWS_ENDPOINT_URL``,
    ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
    ``AWS_REGION``/``AWS_DEFAULT_REGION``; for ``cos://`` first from ``COS_REGION``,
    ``COS_SECRET_ID``, ``COS_SECRET_KEY``, with endpoint
    ``https://cos.<region>.myqcloud.com``. Raises :class:`ConfigError` on a URL
    without a bucket or a ``cos://`` URL without a region.
    """
    protocol, rest = split_url(url)
    if protocol not in _S3_PROTOCOLS:
        raise ConfigError(f"{url}: not an s3:// or cos:// URL")
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ConfigError(f"{url}: the URL names no bucket (expected {protocol}://bucket/path)")
    opts = dict(storage_options or {})
    client_kwargs = dict(opts.pop("client_kwargs", None) or {})
    config_kwargs = dict(opts.pop("config_kwargs", None) or {})
    key = _pop(opts, "key", "aws_access_key_id", "access_key", "secret_id")
    secret = _pop(opts, "secret", "aws_secret_access_key", "secret_key")
    token = _pop(opts, "token", "aws_session_token", "session_token")
    endpoint = _pop(opts, "endpoint_url") or client_kwargs.pop("endpoint_url", None)
    client_kwargs.pop("endpoint_url", None)
    region = _pop(opts, "region", "region_name") or client_kwargs.pop("region_name", None)
    client_kwargs.pop("region_name", None)
    anon = bool(_pop(opts, "anon"))
    virtual_hosted = False

    if protocol == "cos":
        region = region or env("COS_REGION") or env("AWS_REGION") or env("AWS_DEFAULT_REGION")
        if not region:
            raise ConfigError(
                f"{url}: a cos:// URL needs a region: set COS_REGION=ap-guangzhou, or give "
                "the region in the storage options (on the command line: --storage-options "
                '\'{"region": "ap-guangzhou"}\'; in Python: '
                "storage_options={'region': 'ap-guangzhou'})"
            )
        endpoint = endpoint or env("COS_ENDPOINT_URL") or f"https://cos.{region}.myqcloud.com"
        if key is None and secret is None and not anon:
            key, secret = env("COS_SECRET_ID"), env("COS_SECRET_KEY")
            token = token or env("COS_SESSION_TOKEN")
        virtual_hosted = True
    else:
        endpoint = endpoint or env("AWS_ENDPOINT_URL_S3") or env("AWS_ENDPOINT_URL")
        region = region or env("AWS_REGION") or env("AWS_DEFAULT_REGION")
    if key is None and secret is None and not anon:
        key, secret = env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")
        token = token or env("AWS_SESSION_TOKEN")
    if endpoint is not None and "://" not in endpoint:
        raise ConfigError(f"{url}: endpoint_url {endpoint!r} must start with http:// or https://")
    return S3Settings(
        protocol=protocol,
        bucket=bucket,
        prefix=prefix,
        endpoint_url=endpoint,
        region=region,
        key=key,
        secret=secret,
        token=token,
        anon=anon,
        virtual_hosted=virtual_hosted,
        client_kwargs=client_kwargs,
        config_kwargs=config_kwargs,
        extra=opts,
    )
