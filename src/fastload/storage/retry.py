"""The retry policy for object-storage reads: which failures are retried and how long to wait.

A :class:`RetryPolicy` is built from :class:`fastload.config.RetryConfig` and passed to
the store that uses it (never a module global). It retries transient failures (HTTP 5xx,
``SlowDown`` and other throttling codes, connection resets, timeouts, truncated bodies)
with exponential backoff and full jitter, bounded by a number of attempts and a total
deadline, and gives up with :class:`fastload.errors.FetchError`. Permanent failures
(403, 404, ``NoSuchKey``) are raised at once as :class:`StorageError` subclasses.
"""

from __future__ import annotations

import errno
import os
import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from fastload.config import RetryConfig
from fastload.errors import (
    AccessDeniedError,
    FastloadError,
    FetchError,
    ObjectNotFoundError,
    StorageError,
    TruncatedBodyError,
)

__all__ = [
    "AccessDeniedError",
    "ObjectNotFoundError",
    "RetryPolicy",
    "TruncatedBodyError",
    "classify",
]

T = TypeVar("T")

# S3 error codes (and HTTP statuses) that mean "try again later".
_RETRYABLE_CODES = frozenset(
    {
        "SlowDown",
        "ServiceUnavailable",
        "InternalError",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "BandwidthLimitExceeded",
        "ProvisionedThroughputExceededException",
        "EC2ThrottledException",
        "PriorRequestNotComplete",
        "OperationAborted",
        "500",
        "502",
        "503",
        "504",
    }
)
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "NotFound", "404", "NoSuchVersion"})
_DENIED_CODES = frozenset(
    {"AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled"}
)
_RETRYABLE_ERRNOS = frozenset(
    {
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.ECONNREFUSED,
        errno.EPIPE,
        errno.ETIMEDOUT,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ENETRESET,
    }
)
# Exception class names of botocore/aiohttp transport failures; matched by name so this
# module imports neither package.
_RETRYABLE_NAMES = frozenset(
    {
        "ClientPayloadError",
        "ServerDisconnectedError",
        "ClientOSError",
        "ClientConnectionError",
        "ClientConnectorError",
        "ServerTimeoutError",
        "ConnectionTimeoutError",
        "SocketTimeoutError",
        "EndpointConnectionError",
        "ConnectionClosedError",
        "ReadTimeoutError",
        "AioReadTimeoutError",
        "ConnectTimeoutError",
        "IncompleteReadError",
        "ResponseStreamingError",
        "HTTPClientError",
        "ProxyConnectionError",
        "ContentLengthError",
        "TransferEncodingError",
        "IncompleteRead",
        "RemoteDisconnected",
        "SSLEOFError",  # a TLS connection dropped (the direct body path's http.client)
        "SSLZeroReturnError",
    }
)


def _error_code(exc: BaseException) -> tuple[str, int]:
    """The S3 error code and HTTP status of a botocore ``ClientError`` (``("", 0)`` else)."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return "", 0
    code = str(response.get("Error", {}).get("Code", "") or "")
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0
    return code, int(status)


def _status(exc: BaseException) -> int:
    """The HTTP status an aiohttp ``ClientResponseError`` carries (0 if none)."""
    status = getattr(exc, "status", 0)
    return status if isinstance(status, int) else 0


def _transient(exc: BaseException) -> bool:
    return classify(exc) == "retry" or _status(exc) >= 500 or _status(exc) == 429


def classify(exc: BaseException) -> str:
    """Sort a failure into ``"retry"``, ``"not_found"``, ``"denied"`` or ``"fatal"``.

    Pure and dependency-free: botocore/aiohttp exceptions are recognised by their error
    code, HTTP status or class name.
    """
    if isinstance(exc, TruncatedBodyError):
        return "retry"
    if isinstance(exc, FastloadError):
        if isinstance(exc, ObjectNotFoundError):
            return "not_found"
        if isinstance(exc, AccessDeniedError):
            return "denied"
        return "fatal"
    code, status = _error_code(exc)
    if code or status:
        if code in _NOT_FOUND_CODES or status == 404:
            return "not_found"
        if code in _DENIED_CODES or status == 403:
            return "denied"
        if code in _RETRYABLE_CODES or status >= 500 or status == 429:
            return "retry"
        return "fatal"
    if isinstance(exc, FileNotFoundError):
        # fsspec's HTTP filesystem raises FileNotFoundError(url) *from* whatever made
        # its request fail, a refused connection or a 503 included: that is a failure
        # to retry, not a missing object
        # (also one raised inside the handler of the failure without ``from``, and
        # one wrapped twice)
        cause = _wrapped(exc)
        if isinstance(cause, FileNotFoundError):
            return classify(cause)
        if cause is not None and _transient(cause):
            return "retry"
        return "not_found"
    if isinstance(exc, PermissionError):
        return "denied"
    for cls in type(exc).__mro__:
        if cls.__name__ in _RETRYABLE_NAMES:
            return "retry"
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return "retry"
    if isinstance(exc, OSError) and exc.errno in _RETRYABLE_ERRNOS:
        return "retry"
    return "fatal"


def _wrapped(exc: BaseException) -> BaseException | None:
    """What ``exc`` was raised from: its ``__cause__``, else the exception being handled
    when it was raised (unless suppressed)."""
    cause = exc.__cause__
    if cause is None and not exc.__suppress_context__:
        cause = exc.__context__
    return None if cause is exc else cause


def describe(exc: BaseException) -> str:
    """A one-line description of a failure for error messages (class and message); a
    "not found" raised from a transient failure is described by that failure."""
    cause = _wrapped(exc)
    if isinstance(exc, FileNotFoundError) and cause is not None and classify(exc) == "retry":
        return describe(cause)
    code, status = _error_code(exc)
    text = str(exc) or type(exc).__name__
    if code or status:
        return f"{type(exc).__name__} {code or status}: {text}"
    return f"{type(exc).__name__}: {text}"


class RetryPolicy:
    """Exponential backoff with full jitter, bounded by attempts and a total deadline.

    ``rng`` (a seedable :class:`random.Random`), ``sleep`` and ``clock`` are injectable
    for tests. :meth:`call` runs an operation under the policy. Thread-safe.
    """

    def __init__(
        self,
        config: RetryConfig | None = None,
        *,
        rng: random.Random | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config if config is not None else RetryConfig()
        self._rng = rng if rng is not None else random.Random()
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._sleep = sleep
        self._clock = clock

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def __repr__(self) -> str:
        c = self.config
        return (
            f"RetryPolicy(max_attempts={c.max_attempts}, initial_backoff_s={c.initial_backoff_s}, "
            f"max_backoff_s={c.max_backoff_s}, deadline_s={c.deadline_s}, timeout_s={c.timeout_s})"
        )

    def backoff(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1-based): uniform in
        ``[0, min(max_backoff_s, initial_backoff_s * 2**(retry-1))]``."""
        c = self.config
        cap = min(c.max_backoff_s, c.initial_backoff_s * (2.0 ** max(0, retry - 1)))
        if self._pid != os.getpid():
            # Forked while another thread may have held the lock: take a fresh one.
            self._lock, self._pid = threading.Lock(), os.getpid()
        with self._lock:
            return self._rng.uniform(0.0, cap)

    def call(
        self,
        url: str,
        operation: Callable[[int], T],
        on_retry: Callable[[int, BaseException], None] | None = None,
        redact: Callable[[str], str] | None = None,
    ) -> T:
        """Run ``operation(attempt)`` (attempt counts from 1) until it succeeds.

        Returns its result. Retries failures that :func:`classify` calls ``"retry"``,
        calling ``on_retry(attempt, exc)`` before each wait; ``redact`` scrubs secrets
        from the cause text put into error messages. Raises
        :class:`ObjectNotFoundError` / :class:`AccessDeniedError` naming ``url`` at once
        for missing or forbidden objects, :class:`StorageError` for other permanent
        failures, and :class:`FetchError` once attempts or the deadline run out.
        """
        c = self.config
        start = self._clock()
        attempt = 0
        while True:
            attempt += 1
            try:
                return operation(attempt)
            except Exception as exc:
                kind = classify(exc)
                cause = describe(exc) if redact is None else redact(describe(exc))
                if kind == "not_found":
                    if isinstance(exc, ObjectNotFoundError):
                        raise
                    raise ObjectNotFoundError(f"{url}: no such object ({cause})") from exc
                if kind == "denied":
                    if isinstance(exc, AccessDeniedError):
                        raise
                    raise AccessDeniedError(f"{url}: access denied ({cause})") from exc
                if kind != "retry":
                    if isinstance(exc, FastloadError):
                        raise
                    raise StorageError(f"{url}: {cause}") from exc
                if attempt >= c.max_attempts:
                    raise FetchError(url, attempt, cause) from exc
                delay = self.backoff(attempt)
                if self._clock() - start + delay >= c.deadline_s:
                    raise FetchError(
                        url, attempt, f"{cause} (deadline of {c.deadline_s:g} s reached)"
                    ) from exc
                if on_retry is not None:
                    on_retry(attempt, exc)
                self._sleep(delay)
