"""URL and storage-option resolution: which filesystem, which root, which credentials.

Pure functions, no network: :func:`split_url` parses a URL, :func:`resolve_s3` turns a
``s3://`` or ``cos://`` URL plus ``storage_options`` (and the usual environment
variables, read through :func:`fastload.config.env`) into :class:`S3Settings`, whose
``repr`` never shows the secret.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from fastload.config import env
from fastload.errors import ConfigError
from fastload.storage.schemes import check_protocol, supported_protocols

__all__ = [
    "S3Settings",
    "credential_values",
    "is_credential_key",
    "is_s3_like",
    "join",
    "redact_options",
    "redact_url",
    "resolve_s3",
    "split_url",
    "url_credentials",
]

_S3_PROTOCOLS = ("s3", "s3a", "cos")
#: Parts of an option or query-parameter name that mark its value as a credential
#: (matched case-insensitively, ignoring ``-`` and ``_``): ``secret``, ``aws_session_token``,
#: ``password``, ``X-Amz-Signature``, ``sas_token``, ``account_key``, ``client_secret``...
_CREDENTIAL_PARTS = (
    "secret", "token", "password", "passwd", "passphrase", "credential", "signature",
    "auth", "privatekey", "apikey", "accountkey", "accesskey", "keyid", "connectionstring",
    "sessionkey", "cookie",
)  # fmt: skip
_CREDENTIAL_NAMES = ("key", "sas", "sig", "pass", "pwd")
_NOT_CREDENTIALS = ("signatureversion", "authtype")
_REDACTED = "***"
_USERINFO_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)([^/?#@]*)@")


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


def is_credential_key(name: object) -> bool:
    """Whether an option (or URL query parameter) called ``name`` holds a credential."""
    if not isinstance(name, str):
        return False
    flat = name.lower().replace("-", "").replace("_", "")
    if flat in _NOT_CREDENTIALS:
        return False
    return flat in _CREDENTIAL_NAMES or any(p in flat for p in _CREDENTIAL_PARTS)


def url_credentials(url: str) -> tuple[str, ...]:
    """The credentials embedded in ``url``: the password of
    ``scheme://user:password@host/...`` and the values of credential-like query
    parameters (``?X-Amz-Signature=...``)."""
    found: list[str] = []
    m = _USERINFO_RE.match(url)
    if m:
        password = m.group(2).partition(":")[2]
        if password:
            found.append(password)
    if "?" in url:
        query = url.split("?", 1)[1].split("#", 1)[0]
        found.extend(
            v for k, v in parse_qsl(query, keep_blank_values=False) if is_credential_key(k)
        )
    return tuple(found)


def redact_url(url: str) -> str:
    """``url`` with its embedded credentials (``user:password@``, credential-like query
    parameters) replaced by ``***``; other URLs unchanged."""
    if not isinstance(url, str) or "://" not in url:
        return url
    out = _USERINFO_RE.sub(lambda m: f"{m.group(1)}{_REDACTED}@", url, count=1)
    if "?" in out:
        with_query = urlsplit(out)
        parts = []
        for piece in with_query.query.split("&"):
            k, eq, _ = piece.partition("=")
            parts.append(f"{k}={_REDACTED}" if eq and is_credential_key(k) else piece)
        out = out.replace("?" + with_query.query, "?" + "&".join(parts), 1)
    return out


def _walk_values(value: Any, inherited: bool, found: list[str], depth: int = 0) -> None:
    if depth > 64:
        return
    if isinstance(value, Mapping):
        for k, v in value.items():
            _walk_values(v, inherited or is_credential_key(k), found, depth + 1)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _walk_values(v, inherited, found, depth + 1)
    elif isinstance(value, (str, bytes)):
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        if inherited and text:
            found.append(text)
        elif "://" in text:
            found.extend(url_credentials(text))


def credential_values(options: Mapping[str, Any] | None) -> tuple[str, ...]:
    """Every credential string in ``options``, at any depth (``client_kwargs``,
    ``config_kwargs``, lists): values of credential-like keys and credentials
    embedded in URL values. Longest first, so a redaction replaces whole secrets."""
    found: list[str] = []
    _walk_values(options or {}, False, found)
    return tuple(sorted(set(found), key=len, reverse=True))


def redact_options(options: Any, _depth: int = 0) -> Any:
    """A copy of ``options`` with every credential-like key's value, at any depth,
    replaced by ``***`` and credentials embedded in URL values redacted: safe to
    print, log or store in a report."""
    if _depth > 64:
        return _REDACTED
    if isinstance(options, Mapping):
        return {
            k: (_REDACTED if is_credential_key(k) and v not in (None, "", False)
                else redact_options(v, _depth + 1))
            for k, v in options.items()
        }  # fmt: skip
    if isinstance(options, (list, tuple)):
        return type(options)(redact_options(v, _depth + 1) for v in options)
    if isinstance(options, str):
        return redact_url(options)
    return options


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
        """The secret strings that must never appear in logs or messages: the secret,
        the token and every credential in the passed-through options, at any depth."""
        nested = credential_values(
            {"client_kwargs": self.client_kwargs, "config_kwargs": self.config_kwargs,
             "extra": self.extra, "endpoint_url": self.endpoint_url or ""}
        )  # fmt: skip
        return tuple(s for s in (self.secret, self.token, *nested) if s)


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
    shown = redact_url(url)
    if protocol not in _S3_PROTOCOLS:
        raise ConfigError(f"{shown}: not an s3:// or cos:// URL")
    if url_credentials(url):
        raise ConfigError(
            f"{shown}: credentials in the URL are not supported (they would show in process "
            "lists and logs); pass them in storage_options (a file: --storage-options @FILE) "
            "or the AWS_*/COS_* environment variables"
        )
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ConfigError(f"{shown}: the URL names no bucket (expected {protocol}://bucket/path)")
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
                f"{shown}: a cos:// URL needs a region: set COS_REGION=ap-guangzhou, or give "
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
        raise ConfigError(
            f"{shown}: endpoint_url {redact_url(endpoint)!r} must start with http:// or https://"
        )
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
