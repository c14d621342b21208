"""RetryPolicy: backoff, attempts, deadline, and which failures are retried."""

from __future__ import annotations

import random
import ssl

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError

from fastload.config import RetryConfig
from fastload.errors import FetchError, StorageError
from fastload.storage import (
    AccessDeniedError,
    ObjectNotFoundError,
    RetryPolicy,
    TruncatedBodyError,
    classify,
)
from fastload.storage.retry import describe


def client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "GetObject",
    )


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def policy(clock: FakeClock, max_attempts: int = 8, deadline_s: float = 300.0) -> RetryPolicy:
    cfg = RetryConfig(
        max_attempts=max_attempts,
        initial_backoff_s=0.1,
        max_backoff_s=1.0,
        deadline_s=deadline_s,
    )
    return RetryPolicy(cfg, rng=random.Random(7), sleep=clock.sleep, clock=clock)


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (client_error("SlowDown", 503), "retry"),
        (client_error("InternalError", 500), "retry"),
        (client_error("ThrottlingException", 400), "retry"),
        (client_error("Whatever", 502), "retry"),
        (client_error("TooManyRequests", 429), "retry"),
        (client_error("NoSuchKey", 404), "not_found"),
        (client_error("NoSuchBucket", 404), "not_found"),
        (client_error("AccessDenied", 403), "denied"),
        (client_error("InvalidArgument", 400), "fatal"),
        (ConnectionResetError(104, "reset"), "retry"),
        (TimeoutError("t"), "retry"),
        (ReadTimeoutError(endpoint_url="http://x"), "retry"),
        (TruncatedBodyError("short"), "retry"),
        (ssl.SSLEOFError(8, "EOF occurred in violation of protocol"), "retry"),
        (ssl.SSLZeroReturnError(6, "TLS/SSL connection has been closed"), "retry"),
        (ssl.SSLError(1, "a TLS setup that cannot work"), "fatal"),
        (FileNotFoundError("f"), "not_found"),
        (ValueError("v"), "fatal"),
    ],
)
def test_classify(exc: BaseException, kind: str) -> None:
    assert classify(exc) == kind


def test_backoff_is_full_jitter_and_seeded() -> None:
    cfg = RetryConfig(initial_backoff_s=0.1, max_backoff_s=1.0)
    a = RetryPolicy(cfg, rng=random.Random(1))
    b = RetryPolicy(cfg, rng=random.Random(1))
    waits = [a.backoff(r) for r in range(1, 10)]
    assert waits == [b.backoff(r) for r in range(1, 10)]
    for r, w in enumerate(waits, start=1):
        assert 0.0 <= w <= min(1.0, 0.1 * 2 ** (r - 1))


def test_retries_transient_until_success() -> None:
    clock = FakeClock()
    calls: list[int] = []
    retried: list[int] = []

    def op(attempt: int) -> str:
        calls.append(attempt)
        if attempt < 4:
            raise client_error("SlowDown", 503)
        return "ok"

    result = policy(clock).call("s3://b/k", op, on_retry=lambda n, e: retried.append(n))
    assert result == "ok"
    assert calls == [1, 2, 3, 4]
    assert retried == [1, 2, 3]
    assert len(clock.sleeps) == 3


def test_gives_up_after_max_attempts_with_fetch_error() -> None:
    clock = FakeClock()

    def op(attempt: int) -> None:
        raise ConnectionResetError(104, "Connection reset by peer")

    with pytest.raises(FetchError) as info:
        policy(clock, max_attempts=5).call("s3://b/k", op)
    assert info.value.attempts == 5
    assert info.value.url == "s3://b/k"
    assert "s3://b/k" in str(info.value)
    assert "5 attempt" in str(info.value)


def test_deadline_bounds_total_time() -> None:
    clock = FakeClock()
    n = 0

    def op(attempt: int) -> None:
        nonlocal n
        n = attempt
        clock.now += 0.5  # each attempt takes half a second
        raise TimeoutError("read timed out")

    with pytest.raises(FetchError, match="deadline") as info:
        policy(clock, max_attempts=1000, deadline_s=3.0).call("s3://b/k", op)
    assert info.value.attempts == n
    assert n < 10
    assert clock.now < 3.0


@pytest.mark.parametrize(
    ("exc", "cls"),
    [
        (client_error("NoSuchKey", 404), ObjectNotFoundError),
        (client_error("AccessDenied", 403), AccessDeniedError),
        (client_error("InvalidArgument", 400), StorageError),
    ],
)
def test_permanent_errors_are_not_retried(exc: BaseException, cls: type[Exception]) -> None:
    clock = FakeClock()
    calls = 0

    def op(attempt: int) -> None:
        nonlocal calls
        calls += 1
        raise exc

    with pytest.raises(cls, match="s3://b/missing"):
        policy(clock).call("s3://b/missing", op)
    assert calls == 1
    assert clock.sleeps == []


def test_redact_scrubs_secret_from_messages() -> None:
    clock = FakeClock()

    def op(attempt: int) -> None:
        raise ConnectionResetError("reset while sending SECRETVALUE")

    with pytest.raises(FetchError) as info:
        policy(clock, max_attempts=2).call(
            "s3://b/k", op, redact=lambda s: s.replace("SECRETVALUE", "***")
        )
    assert "SECRETVALUE" not in str(info.value)
    assert "SECRETVALUE" not in repr(info.value)


def _raised_from(exc: BaseException, cause: BaseException) -> BaseException:
    try:
        raise exc from cause
    except BaseException as e:
        return e


class _Status(Exception):
    """An exception carrying an HTTP status as aiohttp's ClientResponseError does."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


@pytest.mark.parametrize(
    ("cause", "kind"),
    [
        (ConnectionRefusedError(111, "refused"), "retry"),
        (TimeoutError("t"), "retry"),
        (_Status(503), "retry"),
        (_Status(429), "retry"),
        (_Status(404), "not_found"),
        (ValueError("a body that is not a listing"), "not_found"),
    ],
)
def test_a_not_found_raised_from_a_transient_failure_is_retried(
    cause: BaseException, kind: str
) -> None:
    """fsspec's HTTP filesystem raises ``FileNotFoundError(url) from`` whatever failed."""
    assert classify(_raised_from(FileNotFoundError("http://h/x"), cause)) == kind


def _not_found_while_handling_a_reset(cut: bool) -> FileNotFoundError:
    """A FileNotFoundError raised in the handler of a connection reset (``from None``
    with ``cut``)."""
    try:
        try:
            raise ConnectionResetError(104, "reset by peer")
        except ConnectionResetError:
            if cut:
                raise FileNotFoundError("http://h/x") from None
            raise FileNotFoundError("http://h/x")  # noqa: B904
    except FileNotFoundError as exc:
        return exc
    raise AssertionError("not raised")


def test_a_connection_error_wrapped_as_not_found_implicitly_or_twice_is_retried() -> None:
    """A ``FileNotFoundError`` raised while handling a connection failure (no ``from``),
    or wrapping another ``FileNotFoundError`` that wraps one, is a failure to retry."""
    suppressed = _not_found_while_handling_a_reset(cut=True)
    assert classify(suppressed) == "not_found"  # explicitly cut off: what it says
    implicit = _not_found_while_handling_a_reset(cut=False)
    assert classify(implicit) == "retry"
    assert "reset by peer" in describe(implicit)
    twice = _raised_from(
        FileNotFoundError("http://h/x"),
        _raised_from(FileNotFoundError("inner"), ConnectionRefusedError(111, "refused")),
    )
    assert classify(twice) == "retry"
    missing = _raised_from(FileNotFoundError("http://h/x"), FileNotFoundError("inner"))
    assert classify(missing) == "not_found"
