"""Error classification (transient vs permanent), translation to msprobe errors, retries.

Every backend maps what its library raises onto the shared hierarchy in
:mod:`msprobe.errors` through :func:`translate_error`; the writer and anyone
else retries through :func:`retry`, which retries transient errors only.
"""
from __future__ import annotations

import errno
import logging
import random
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, NoReturn, Protocol, TypeVar

from msprobe.errors import (
    MsprobeError,
    StorageError,
    StorageNotFoundError,
    StoragePermissionError,
    StorageTransientError,
)

__all__ = [
    "TRANSIENT",
    "PERMANENT",
    "MISSING",
    "DENIED",
    "MISSING_ERRORS",
    "classify_error",
    "is_transient",
    "translate_error",
    "reraise",
    "RetryPolicy",
    "Breaker",
    "retry",
    "remaining_time",
    "is_disk_full",
    "StoreLike",
    "put_retrying",
]

log = logging.getLogger("msprobe.backends")
_Result = TypeVar("_Result")

#: errnos that mean "no room left": never transient (retrying only slows training down)
DISK_FULL_ERRNOS = frozenset(getattr(errno, n) for n in ("ENOSPC", "EDQUOT") if hasattr(errno, n))

_DEADLINE = threading.local()


def remaining_time() -> float | None:
    """Seconds left of the deadline of the :meth:`RetryPolicy.call` running in this thread
    (``None``: no deadline). Stores pass it on as the time limit of one request."""
    end = getattr(_DEADLINE, "end", None)
    if end is None:
        return None
    return max(0.05, end - time.monotonic())


def is_disk_full(exc: BaseException) -> bool:
    """True if ``exc`` (or an error it was raised from) is ENOSPC / EDQUOT."""
    for link in _chain(exc):
        if isinstance(link, OSError) and link.errno in DISK_FULL_ERRNOS:
            return True
        if "No space left on device" in str(link) or "Disk quota exceeded" in str(link):
            return True
    return False


class StoreLike(Protocol):
    """What :func:`put_retrying` needs of a store."""

    def put(self, key: str, data: bytes, *, overwrite: bool = True) -> None: ...

    def get(self, key: str) -> bytes: ...

TRANSIENT = "transient"
PERMANENT = "permanent"
MISSING = "missing"
DENIED = "denied"

#: The one tuple of exceptions that mean "the key does not exist", for every backend.
MISSING_ERRORS: tuple[type[BaseException], ...] = (FileNotFoundError, NotADirectoryError, IsADirectoryError)

_TRANSIENT_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "ETIMEDOUT", "ECONNRESET", "ECONNABORTED", "ECONNREFUSED", "EPIPE", "EAGAIN",
        "EBUSY", "EINTR", "EREMOTEIO", "ENETUNREACH", "ENETRESET", "EHOSTUNREACH",
        "ENETDOWN", "ESTALE",
    )
    if hasattr(errno, name)
)
# Exception classes (by name, so botocore/aiohttp need not be imported) that mean a
# dropped, timed out or garbled exchange with a remote store.
_TRANSIENT_NAMES = frozenset(
    {
        "EndpointConnectionError", "ConnectionClosedError", "ReadTimeoutError",
        "ConnectTimeoutError", "ProxyConnectionError", "HTTPClientError",
        "IncompleteReadError", "ResponseStreamingError", "ResponseParserError",
        "ServerDisconnectedError", "ClientConnectionError", "ClientPayloadError",
        "ClientOSError", "ServerTimeoutError", "ClientConnectorError", "FSTimeoutError",
        "IncompleteRead", "RemoteDisconnected", "AWSConnectionError",
    }
)
_TRANSIENT_CODES = frozenset(
    {
        "SlowDown", "Throttling", "ThrottlingException", "ThrottledException",
        "RequestThrottled", "RequestThrottledException", "TooManyRequestsException",
        "RequestLimitExceeded", "ProvisionedThroughputExceededException",
        "BandwidthLimitExceeded", "RequestTimeout", "RequestTimeoutException",
        "InternalError", "InternalFailure", "ServiceUnavailable", "OperationAborted",
        "PriorRequestNotComplete", "EC2ThrottledException", "TransientError",
        "XAmzContentSHA256Mismatch", "429", "500", "502", "503", "504",
    }
)
_MISSING_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "NoSuchUpload", "NotFound", "404"})
_DENIED_CODES = frozenset(
    {
        "AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch",
        "ExpiredToken", "InvalidToken", "AccountProblem", "403", "401",
    }
)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen and len(seen) < 16:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def _classify_response(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    code = str((response.get("Error") or {}).get("Code", ""))
    status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    if code in _TRANSIENT_CODES or (isinstance(status, int) and (status >= 500 or status == 429)):
        return TRANSIENT
    if code in _MISSING_CODES or status == 404:
        return MISSING
    if code in _DENIED_CODES or status in (401, 403):
        return DENIED
    return PERMANENT if (code or status) else None


def _classify_one(exc: BaseException, extra_errnos: frozenset[int]) -> str | None:
    if isinstance(exc, StorageTransientError):
        return TRANSIENT
    if isinstance(exc, StorageNotFoundError):
        return MISSING
    if isinstance(exc, StoragePermissionError):
        return DENIED
    if isinstance(exc, StorageError) and type(exc) is StorageError:
        return None  # a plain StorageError: let its cause decide (extra_transient_errnos)
    if isinstance(exc, MsprobeError):  # ConfigError, UnsafePathError, ...
        return PERMANENT
    verdict = _classify_response(exc)
    if verdict is not None:
        return verdict
    if any(cls.__name__ in _TRANSIENT_NAMES for cls in type(exc).__mro__):
        return TRANSIENT
    if isinstance(exc, MISSING_ERRORS):
        return MISSING
    if isinstance(exc, PermissionError):
        return DENIED
    if isinstance(exc, FileExistsError):
        return DENIED
    if isinstance(exc, (TimeoutError, socket.timeout, ConnectionError)):
        return TRANSIENT
    if isinstance(exc, OSError) and exc.errno is not None:
        if exc.errno in _TRANSIENT_ERRNOS or exc.errno in extra_errnos:
            return TRANSIENT
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return DENIED
        if exc.errno == errno.ENOENT:
            return MISSING
    return None


def classify_error(exc: BaseException, *, extra_transient_errnos: Iterable[int] = ()) -> str:
    """Classify an exception as ``'transient'``, ``'missing'``, ``'denied'`` or ``'permanent'``.

    Walks the ``__cause__``/``__context__`` chain and returns the first verdict:
    S3-style error codes and HTTP status (5xx, 429, SlowDown → transient; 403 →
    denied; 404/NoSuchKey/NoSuchBucket → missing), connection and timeout errors
    (transient), then errno. ENOSPC is permanent unless listed in
    ``extra_transient_errnos``. Anything unrecognised is permanent.
    """
    extra = frozenset(extra_transient_errnos)
    for link in _chain(exc):
        verdict = _classify_one(link, extra)
        if verdict is not None:
            return verdict
    return PERMANENT


def is_transient(exc: BaseException, *, extra_transient_errnos: Iterable[int] = ()) -> bool:
    """True if ``exc`` is worth retrying (see :func:`classify_error`)."""
    return classify_error(exc, extra_transient_errnos=extra_transient_errnos) == TRANSIENT


_ERROR_TYPES: dict[str, type[StorageError]] = {
    TRANSIENT: StorageTransientError,
    MISSING: StorageNotFoundError,
    DENIED: StoragePermissionError,
    PERMANENT: StorageError,
}


def translate_error(
    exc: BaseException,
    what: str,
    *,
    scrub: Callable[[str], str] = lambda text: text,
    extra_transient_errnos: Iterable[int] = (),
) -> BaseException:
    """Turn a library exception into the matching :class:`StorageError` subtype.

    ``what`` names the operation and location, e.g. ``"get s3://b/k"``. Errors
    already in the msprobe hierarchy are returned unchanged; ``scrub`` removes
    secrets from the underlying message. Raise the result ``from exc``.
    """
    if isinstance(exc, MsprobeError):
        return exc
    kind = classify_error(exc, extra_transient_errnos=extra_transient_errnos)
    if isinstance(exc, OSError) and exc.strerror and exc.filename:
        detail = scrub(exc.strerror)  # the path is already in ``what``
    else:
        detail = scrub(str(exc) or "")
    message = f"{what}: {type(exc).__name__}" + (f": {detail}" if detail else "")
    return _ERROR_TYPES[kind](message)


def reraise(
    exc: BaseException,
    what: str,
    *,
    scrub: Callable[[str], str] = lambda text: text,
    extra_transient_errnos: Iterable[int] = (),
) -> NoReturn:
    """Raise :func:`translate_error` of ``exc``, chained to it (or ``exc`` itself if already ours)."""
    err = translate_error(exc, what, scrub=scrub, extra_transient_errnos=extra_transient_errnos)
    if err is exc:
        raise exc
    raise err from exc


class Breaker:
    """Shared by every storage operation of one writer (the dumper's session): once an
    operation has spent its whole deadline on a store that does not answer (retries of
    transient errors exhausted), later operations fail at once instead of each waiting out
    its own deadline, until ``cooldown`` seconds have passed; then one operation may try
    again (and closes the breaker when it succeeds)."""

    def __init__(self, cooldown: float = 60.0) -> None:
        self.cooldown = float(cooldown)
        self._lock = threading.Lock()
        self._opened: float | None = None
        self._cause: BaseException | None = None
        self._probing = False
        #: operations refused while open
        self.refused = 0

    @property
    def open(self) -> bool:
        return self._opened is not None

    def allow(self) -> None:
        """Raise :class:`StorageTransientError` when the breaker is open (and it is not time to probe)."""
        with self._lock:
            if self._opened is None:
                return
            if not self._probing and time.monotonic() - self._opened >= self.cooldown:
                self._probing = True  # this call probes; the others keep failing fast
                return
            self.refused += 1
            cause = self._cause
        raise StorageTransientError(
            f"not attempted: the store did not answer {time.monotonic() - self._opened:.0f} s ago "
            f"({type(cause).__name__}: {str(cause) or 'no answer in time'}); retrying it in {self.cooldown:.0f} s steps"
        )

    def success(self) -> None:
        if self._opened is not None:
            with self._lock:
                self._opened, self._cause, self._probing = None, None, False

    def trip(self, exc: BaseException) -> None:
        with self._lock:
            self._opened, self._cause, self._probing = time.monotonic(), exc, False


@dataclass
class RetryPolicy:
    """How to retry: ``retries`` extra attempts, exponential backoff with jitter.

    The n-th retry sleeps a uniform random time in ``[d/2, d]`` with
    ``d = min(backoff_max, backoff_base * 2**n)``. ``deadline`` (seconds) bounds one
    :meth:`call`, retries and sleeps included: no retry starts that could not finish in
    time, and stores limit each request to the time left (:func:`remaining_time`).
    ``breaker``: a :class:`Breaker` shared by the operations of one writer.
    """

    retries: int = 5
    backoff_base: float = 0.05
    backoff_max: float = 2.0
    extra_transient_errnos: frozenset[int] = field(default_factory=frozenset)
    sleep: Callable[[float], None] = time.sleep
    deadline: float | None = None
    breaker: Breaker | None = None

    def delay(self, attempt: int) -> float:
        d = min(self.backoff_max, self.backoff_base * (2 ** attempt))
        return random.uniform(d / 2, d)

    def is_transient(self, exc: BaseException) -> bool:
        return is_transient(exc, extra_transient_errnos=self.extra_transient_errnos)

    def call(
        self,
        fn: Callable[[], _Result],
        *,
        on_retry: Callable[[int, BaseException, float], None] | None = None,
    ) -> _Result:
        """Call ``fn()``; on a transient error sleep and try again, up to ``retries`` times
        (and within ``deadline``)."""
        if self.breaker is not None:
            self.breaker.allow()
        outer = getattr(_DEADLINE, "end", None)
        end = None if self.deadline is None else time.monotonic() + self.deadline
        if outer is not None and (end is None or outer < end):
            end = outer  # nested calls never outlive the outer deadline
        _DEADLINE.end = end
        attempt = 0
        try:
            while True:
                try:
                    result = fn()
                except Exception as exc:
                    transient = self.is_transient(exc)
                    delay = self.delay(attempt) if transient else 0.0
                    late = end is not None and time.monotonic() + delay >= end
                    if attempt >= self.retries or not transient or late:
                        if self.breaker is not None:  # no answer: open; any answer (403, ...): closed
                            self.breaker.trip(exc) if transient else self.breaker.success()
                        raise
                    if on_retry is not None:
                        on_retry(attempt + 1, exc, delay)
                    log.debug("retry %d after %s: %s", attempt + 1, type(exc).__name__, exc)
                    self.sleep(delay)
                    attempt += 1
                else:
                    if self.breaker is not None:
                        self.breaker.success()
                    return result
        finally:
            _DEADLINE.end = outer


def retry(
    fn: Callable[..., _Result],
    *args: object,
    retries: int = 5,
    backoff: tuple[float, float] = (0.05, 2.0),
    extra_transient_errnos: Iterable[int] = (),
    on_retry: Callable[[int, BaseException, float], None] | None = None,
    **kwargs: object,
) -> _Result:
    """Call ``fn(*args, **kwargs)``, retrying transient errors with exponential backoff.

    Permanent errors (403, missing bucket, permission, anything unrecognised) and
    the last transient error after ``retries`` retries are raised unchanged.
    ``on_retry(attempt, exc, delay)`` is called before each sleep.
    """
    policy = RetryPolicy(
        retries=retries,
        backoff_base=backoff[0],
        backoff_max=backoff[1],
        extra_transient_errnos=frozenset(extra_transient_errnos),
    )
    return policy.call(lambda: fn(*args, **kwargs), on_retry=on_retry)


def put_retrying(
    store: "StoreLike",
    key: str,
    data: bytes,
    *,
    overwrite: bool,
    policy: RetryPolicy,
    on_retry: Callable[[int, BaseException, float], None] | None = None,
) -> None:
    """``store.put`` with retries of transient errors, safe for exclusive creates.

    A failed request may hide a write that reached the store (the response
    was lost, and our retry or the HTTP client's own resend then finds the key
    taken). So with ``overwrite=False``, a key found taken that holds exactly
    ``data`` counts as written by this call. Callers that need to tell two
    writers apart put something unique in ``data`` (claim markers carry a
    random token).
    """
    from msprobe.errors import StoragePermissionError

    try:
        policy.call(lambda: store.put(key, data, overwrite=overwrite), on_retry=on_retry)
    except StoragePermissionError:
        if overwrite:
            raise
        try:
            same = policy.call(lambda: store.get(key)) == bytes(data)
        except Exception:  # noqa: BLE001 - an unreadable read-back counts as not written
            same = False
        if not same:
            raise
