"""Transient vs permanent classification, translation and the retry helper."""
from __future__ import annotations

import errno
import socket

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from msprobe.backends import RetryPolicy, classify_error, is_transient, retry, translate_error
from msprobe.errors import (
    ConfigError,
    StorageError,
    StorageNotFoundError,
    StoragePermissionError,
    StorageTransientError,
    UnsafePathError,
)


def client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": f"{code} message"}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "PutObject",
    )


def chained(outer: BaseException, cause: BaseException) -> BaseException:
    outer.__cause__ = cause
    return outer


@pytest.mark.parametrize(
    "exc, verdict",
    [
        (TimeoutError("t"), "transient"),
        (socket.timeout("t"), "transient"),
        (ConnectionResetError(errno.ECONNRESET, "reset"), "transient"),
        (BrokenPipeError(errno.EPIPE, "pipe"), "transient"),
        (OSError(errno.ETIMEDOUT, "timed out"), "transient"),
        (OSError(errno.ENOSPC, "full"), "permanent"),
        (OSError(errno.EIO, "io"), "permanent"),
        (PermissionError(errno.EACCES, "no"), "denied"),
        (OSError(errno.EROFS, "ro"), "denied"),
        (FileNotFoundError(errno.ENOENT, "gone"), "missing"),
        (ValueError("bug"), "permanent"),
        (EndpointConnectionError(endpoint_url="http://x"), "transient"),
        (ReadTimeoutError(endpoint_url="http://x"), "transient"),
        (ConnectionClosedError(endpoint_url="http://x"), "transient"),
        (client_error("SlowDown", 503), "transient"),
        (client_error("InternalError", 500), "transient"),
        (client_error("ServiceUnavailable", 503), "transient"),
        (client_error("Throttling", 400), "transient"),
        (client_error("RequestTimeout", 400), "transient"),
        (client_error("WhoKnows", 502), "transient"),
        (client_error("AccessDenied", 403), "denied"),
        (client_error("NoSuchBucket", 404), "missing"),
        (client_error("NoSuchKey", 404), "missing"),
        (client_error("InvalidArgument", 400), "permanent"),
        # what s3fs raises: a built-in translated from the ClientError
        (chained(OSError(errno.EIO, "odd"), client_error("WhoKnows", 503)), "transient"),
        (chained(OSError(errno.EREMOTEIO, "internal"), client_error("InternalError", 500)), "transient"),
        (chained(PermissionError("Access Denied"), client_error("AccessDenied", 403)), "denied"),
        (StorageTransientError("x"), "transient"),
        (StorageNotFoundError("x"), "missing"),
        (StoragePermissionError("x"), "denied"),
        (chained(StorageError("x"), OSError(errno.ECONNRESET, "r")), "transient"),
        (StorageError("x"), "permanent"),
        (ConfigError("x"), "permanent"),
        (UnsafePathError("x"), "permanent"),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else v,
)
def test_classify(exc: BaseException, verdict: str) -> None:
    assert classify_error(exc) == verdict
    assert is_transient(exc) == (verdict == "transient")


def test_enospc_can_be_made_transient() -> None:
    exc = OSError(errno.ENOSPC, "full")
    assert not is_transient(exc)
    assert is_transient(exc, extra_transient_errnos=[errno.ENOSPC])


def test_translate_error() -> None:
    err = translate_error(client_error("SlowDown", 503), "put s3://b/k")
    assert isinstance(err, StorageTransientError) and "put s3://b/k" in str(err)
    assert isinstance(translate_error(FileNotFoundError(2, "x", "/p"), "get /p"), FileNotFoundError)
    assert isinstance(translate_error(PermissionError(13, "x"), "put"), StoragePermissionError)
    same = StorageNotFoundError("already ours")
    assert translate_error(same, "get") is same
    scrubbed = translate_error(ValueError("token=abcdef123"), "op", scrub=lambda s: s.replace("abcdef123", "***"))
    assert "abcdef123" not in str(scrubbed)


def test_retry_transient_then_success() -> None:
    calls, retries = [], []

    def flaky(x: int) -> int:
        calls.append(x)
        if len(calls) < 3:
            raise ConnectionResetError(errno.ECONNRESET, "reset")
        return x * 2

    assert retry(flaky, 21, backoff=(0.001, 0.002), on_retry=lambda *a: retries.append(a)) == 42
    assert len(calls) == 3 and [a[0] for a in retries] == [1, 2]


def test_retry_permanent_is_not_retried() -> None:
    calls = []

    def denied() -> None:
        calls.append(1)
        raise StoragePermissionError("403 AccessDenied")

    with pytest.raises(StoragePermissionError):
        retry(denied, backoff=(0.001, 0.002))
    assert len(calls) == 1


def test_retry_gives_up() -> None:
    calls = []

    def always() -> None:
        calls.append(1)
        raise StorageTransientError("503")

    with pytest.raises(StorageTransientError):
        retry(always, retries=3, backoff=(0.001, 0.002))
    assert len(calls) == 4


def test_backoff_is_exponential_with_jitter() -> None:
    slept: list[float] = []
    policy = RetryPolicy(retries=6, backoff_base=0.05, backoff_max=0.4, sleep=slept.append)
    with pytest.raises(TimeoutError):
        policy.call(lambda: (_ for _ in ()).throw(TimeoutError("t")))
    caps = [0.05, 0.1, 0.2, 0.4, 0.4, 0.4]
    assert len(slept) == 6
    for delay, cap in zip(slept, caps):
        assert cap / 2 <= delay <= cap
