"""BackgroundWriter: bounded, retrying, atomic background writes of many objects."""
from __future__ import annotations

import dataclasses
import datetime as _dt
import logging
import os
import queue
import threading
import time
import zlib
from typing import TYPE_CHECKING, Any, Callable, Iterable, NamedTuple, Union

from msprobe.backends._keys import validate_key
from msprobe.backends._retry import RetryPolicy, reraise
from msprobe.errors import (
    ConfigError,
    StorageError,
    StorageNotFoundError,
    StoragePermissionError,
    StorageTransientError,
)

if TYPE_CHECKING:
    from msprobe.backends._base import Store

__all__ = ["BackgroundWriter", "Digested", "WriterStats", "append_log_line"]

log = logging.getLogger("msprobe.backends")

Payload = Union[bytes, bytearray, memoryview, Callable[[], Union[bytes, bytearray, memoryview]]]


@dataclasses.dataclass
class WriterStats:
    """Counters of a :class:`BackgroundWriter` (a snapshot; see ``writer.stats``)."""

    objects_submitted: int = 0
    bytes_submitted: int = 0
    objects_written: int = 0
    bytes_written: int = 0
    retries: int = 0
    failures: int = 0
    #: objects not written because the same key was submitted again before they were
    superseded: int = 0
    bytes_in_flight: int = 0
    peak_bytes_in_flight: int = 0
    #: total time submit() spent waiting for room (back-pressure)
    blocked_seconds: float = 0.0


def append_log_line(store: "Store", key: str, line: bytes | str, *, retry_policy: RetryPolicy | None = None) -> None:
    """Append one line to a log object (``dump_error_info.log``); a newline is added if missing.

    Local stores append with ``O_APPEND`` (one ``write`` per line, so lines from
    several writers never interleave) and fsync. Object stores cannot append:
    the object is read, extended and rewritten (fine for rare error lines; two
    processes appending at the same instant to one object may lose a line).
    """
    key = validate_key(key)
    data = line.encode("utf-8", "replace") if isinstance(line, str) else bytes(line)
    if not data.endswith(b"\n"):
        data += b"\n"
    store.check_writable()
    policy = retry_policy or RetryPolicy()
    path = store.local_path(key) if store.is_local else None
    if path is not None:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o666)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            reraise(exc, f"append {path}")
        return

    def rewrite() -> None:
        try:
            old = store.get(key)
        except StorageNotFoundError:
            old = b""
        store.put(key, old + data)

    policy.call(rewrite)


class _Task:
    __slots__ = ("key", "data", "reserved", "on_done", "seq")

    def __init__(self, key: str, data: Payload, reserved: int,
                 on_done: "Callable[[BaseException | None], None] | None" = None, seq: int = 0) -> None:
        self.key, self.data, self.reserved, self.on_done, self.seq = key, data, reserved, on_done, seq


class _Superseded(Exception):
    """The key was submitted again: this task's bytes are not the object's any more."""


def _nbytes(data: Any) -> int:
    return memoryview(data).nbytes


class Digested(NamedTuple):
    """What a ``submit``'s callable may return: the object's bytes with their CRC-32 computed already
    (by its producer, on the way: :attr:`BackgroundWriter.digests` then need not read them again)."""

    data: Any
    crc: int


class BackgroundWriter:
    """Write objects to a store from worker threads, with a bound on memory.

    ``submit(key, data)`` queues an atomic ``store.put`` and returns at once,
    unless the bytes submitted but not yet written would exceed
    ``max_bytes_in_flight``; then it waits for room (back-pressure). An object
    larger than the bound is accepted once nothing else is in flight.
    ``data`` may be a callable producing the bytes in the worker (lazy
    serialization); pass its expected size as ``nbytes`` so it is counted
    against the bound from the start. Buffers passed in must not be mutated
    until written. A key submitted again replaces the earlier submission: the
    last one submitted is what the key holds once :meth:`flush` returns, in
    whatever order workers pick them up or retries delay them (an earlier one
    not yet written is skipped, one being written finishes first; counted in
    ``stats.superseded``).

    Workers retry transient errors (timeouts, 5xx, throttling, connection
    resets) ``retries`` times with exponential backoff and jitter between
    ``backoff[0]`` and ``backoff[1]`` seconds; permanent errors are not
    retried. Every failure is logged, appended as one line (UTC time, key,
    error type, message) to ``error_log_key`` in the store when given, and
    reported by the next :meth:`flush`, which raises a :class:`StorageError`
    (the common subtype when all failures agree) whose ``failures`` maps each
    failed key to its error.

    ``retry_policy`` replaces the policy built from ``retries``/``backoff`` (a deadline
    and a :class:`Breaker` shared with other writers); ``on_failure(key, error)`` is
    called once per object that failed for good (in the worker, before ``on_done``).
    The error log is appended with one attempt, never retried into the store that
    just failed. ``digests=True`` records ``(size, CRC32)`` of each object written in
    :attr:`digests`.

    ``verify=True`` checks the size of each object after writing it, and its
    CRC32 when the object is at most ``verify_crc_max_bytes``;
    ``verify="crc"`` always compares the CRC32. A mismatch is rewritten like a
    transient error.
    """

    def __init__(
        self,
        store: "Store",
        *,
        max_bytes_in_flight: int = 1 << 30,
        workers: int = 4,
        retries: int = 5,
        backoff: tuple[float, float] = (0.05, 2.0),
        error_log_key: str | None = None,
        verify: bool | str = False,
        verify_crc_max_bytes: int = 1 << 20,
        overwrite: bool = True,
        extra_transient_errnos: Iterable[int] = (),
        name: str = "msprobe-writer",
        retry_policy: RetryPolicy | None = None,
        on_failure: "Callable[[str, BaseException], None] | None" = None,
        digests: bool = False,
    ) -> None:
        if workers < 1:
            raise ConfigError(f"BackgroundWriter workers={workers!r} is not valid; valid values: an int >= 1")
        if max_bytes_in_flight < 1:
            raise ConfigError(f"BackgroundWriter max_bytes_in_flight={max_bytes_in_flight!r} is not valid; valid values: an int >= 1")
        if verify not in (False, True, "crc"):
            raise ConfigError(f"BackgroundWriter verify={verify!r} is not valid; valid values: False, True, 'crc'")
        store.check_writable()
        self._store = store
        self._max = int(max_bytes_in_flight)
        self._policy = retry_policy or RetryPolicy(
            retries=retries, backoff_base=backoff[0], backoff_max=backoff[1],
            extra_transient_errnos=frozenset(extra_transient_errnos),
        )
        self._on_failure = on_failure
        #: key -> (size, CRC32) of every object written (``digests=True``)
        self.digests: dict[str, tuple[int, int]] | None = {} if digests else None
        self._error_log_key = validate_key(error_log_key) if error_log_key else None
        self._verify = verify
        self._crc_max = verify_crc_max_bytes
        self._overwrite = overwrite
        self._cond = threading.Condition()
        self._stats = WriterStats()
        self._pending = 0
        self._seq = 0
        #: key -> the sequence number of its last submission, while one of it is queued or being written
        self._latest: dict[str, int] = {}
        #: the keys a worker is writing now (a later submission of one waits for it)
        self._writing: set[str] = set()
        self._failed: dict[str, BaseException] = {}
        self._closed = False
        self._log_lock = threading.Lock()
        self._queue: "queue.SimpleQueue[_Task | None]" = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    # -- public -----------------------------------------------------------
    @property
    def store(self) -> "Store":
        return self._store

    @property
    def max_bytes_in_flight(self) -> int:
        return self._max

    @property
    def stats(self) -> WriterStats:
        with self._cond:
            return dataclasses.replace(self._stats)

    def submit(self, key: str, data: Payload, nbytes: int | None = None,
               on_done: "Callable[[BaseException | None], None] | None" = None) -> None:
        """Queue ``data`` for an atomic write at ``key``; blocks only for back-pressure.

        ``on_done(error)`` is called in the worker once the object is published under its
        final name (``error`` None) or has failed for good (the error), before :meth:`flush`
        can return; it must not wait for anything that waits for this writer."""
        key = validate_key(key)
        if callable(data) and not isinstance(data, (bytes, bytearray, memoryview)):
            size = int(nbytes or 0)
        else:
            size = _nbytes(data) if nbytes is None else int(nbytes)
        with self._cond:
            if self._closed:
                raise StorageError(f"BackgroundWriter for {self._store.url} is closed")
            if self._stats.bytes_in_flight and self._stats.bytes_in_flight + size > self._max:
                start = time.monotonic()
                while self._stats.bytes_in_flight and self._stats.bytes_in_flight + size > self._max:
                    self._cond.wait()
                self._stats.blocked_seconds += time.monotonic() - start
            self._reserve(size)
            self._pending += 1
            self._stats.objects_submitted += 1
            self._seq += 1
            seq = self._latest[key] = self._seq
        self._queue.put(_Task(key, data, size, on_done, seq))

    def flush(self) -> None:
        """Wait until everything submitted is written; raise if anything failed since the last flush."""
        with self._cond:
            while self._pending:
                self._cond.wait()
            failed, self._failed = self._failed, {}
        if failed:
            raise self._failure_error(failed)

    def close(self) -> None:
        """Flush, then stop the workers. Safe to call twice."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            with self._cond:
                self._closed = True
            for _ in self._threads:
                self._queue.put(None)
            for thread in self._threads:
                thread.join()

    def __enter__(self) -> "BackgroundWriter":
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
            return
        try:
            self.close()
        except StorageError as err:  # do not mask the exception already in flight
            log.error("%s", err)

    # -- workers ----------------------------------------------------------
    def _reserve(self, size: int) -> None:
        s = self._stats
        s.bytes_in_flight += size
        s.bytes_submitted += size
        s.peak_bytes_in_flight = max(s.peak_bytes_in_flight, s.bytes_in_flight)

    def _run(self) -> None:
        while True:
            task = self._queue.get()
            if task is None:
                return
            succeeded = False
            error: BaseException | None = None
            written = -1
            try:
                if self._claim(task):
                    try:
                        written = self._write(task)
                    except _Superseded:
                        pass  # (written stays -1: counted as superseded)
                    finally:
                        self._release(task)
                succeeded = True
            except BaseException as exc:  # noqa: BLE001 - every failure is reported by flush()
                error = exc
                self._record_failure(task.key, exc)
            finally:
                if task.on_done is not None:
                    try:
                        task.on_done(error)
                    except Exception as cb_exc:  # noqa: BLE001 - a callback must not stop the worker
                        log.error("on_done callback of %s failed: %s", task.key, cb_exc)
                    task.on_done = None
                task.data = b""
                with self._cond:
                    self._stats.bytes_in_flight -= task.reserved
                    if succeeded and written < 0:
                        self._stats.superseded += 1
                    elif succeeded:
                        self._stats.objects_written += 1
                        self._stats.bytes_written += written
                    self._pending -= 1
                    self._cond.notify_all()

    def _claim(self, task: _Task) -> bool:
        """Wait while another worker writes ``task.key``; False when a later submission replaced it."""
        with self._cond:
            while task.key in self._writing:
                self._cond.wait()
            if self._latest.get(task.key) != task.seq:
                return False
            self._writing.add(task.key)
            return True

    def _release(self, task: _Task) -> None:
        with self._cond:
            self._writing.discard(task.key)
            if self._latest.get(task.key) == task.seq:
                del self._latest[task.key]
            self._cond.notify_all()

    def _superseded(self, task: _Task) -> bool:
        with self._cond:
            return self._latest.get(task.key) != task.seq

    def _write(self, task: _Task) -> int:
        data = task.data
        crc = None
        if callable(data) and not isinstance(data, (bytes, bytearray, memoryview)):
            data = data()
            if isinstance(data, Digested):
                data, crc = data.data, data.crc
            size = _nbytes(data)
            if size > task.reserved:  # the estimate was low: count the real size
                with self._cond:
                    self._stats.bytes_submitted -= task.reserved
                    self._stats.bytes_in_flight -= task.reserved
                    self._reserve(size)
                    task.reserved = size
        body = data
        def note(attempt: int, exc: BaseException, delay: float) -> None:
            with self._cond:
                self._stats.retries += 1
            log.debug("retrying %s (attempt %d) after %s", task.key, attempt, type(exc).__name__)
            if self._superseded(task):  # submitted again meanwhile: the later bytes are written, not these
                raise _Superseded(task.key) from exc

        def attempt() -> None:
            self._store.put(task.key, body, overwrite=self._overwrite)
            if self._verify:
                self._check(task.key, body)

        try:
            self._policy.call(attempt, on_retry=note)
        except StoragePermissionError:
            # An earlier attempt (ours, or the HTTP client's own resend) may have
            # landed before its response was lost: the object holding exactly
            # these bytes means the write is done.
            if self._overwrite or not self._same(task.key, body):
                raise
        if self.digests is not None:
            self.digests[task.key] = (_nbytes(body), crc if crc is not None else zlib.crc32(body))
        return _nbytes(body)

    def _same(self, key: str, body: Any) -> bool:
        try:
            return self._policy.call(lambda: self._store.get(key)) == bytes(body)
        except Exception:  # noqa: BLE001 - an unreadable read-back counts as not written
            return False

    def _check(self, key: str, body: Any) -> None:
        expected = _nbytes(body)
        actual = self._store.size(key)
        if actual != expected:
            raise StorageTransientError(f"verify {key}: {actual} bytes stored, {expected} written")
        if self._verify == "crc" or expected <= self._crc_max:
            if zlib.crc32(self._store.get(key)) != zlib.crc32(body):
                raise StorageTransientError(f"verify {key}: CRC32 of the stored object differs")

    # -- failures ---------------------------------------------------------
    def _record_failure(self, key: str, exc: BaseException) -> None:
        with self._cond:
            self._failed[key] = exc
            self._stats.failures += 1
        log.debug("could not write %s/%s: %s: %s", self._store.url, key, type(exc).__name__, exc)
        if self._on_failure is not None:
            try:
                self._on_failure(key, exc)
            except Exception as cb_exc:  # noqa: BLE001 - a callback must not stop the worker
                log.error("on_failure callback of %s failed: %s", key, cb_exc)
        else:
            log.warning("could not write %s/%s: %s: %s", self._store.url, key, type(exc).__name__, exc)
        if self._error_log_key:
            self._append_error_log(key, exc)

    def _append_error_log(self, key: str, exc: BaseException) -> None:
        stamp = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")
        message = " ".join(str(exc).split())
        line = f"{stamp}\t{key}\t{type(exc).__name__}\t{message}\n".encode("utf-8", "replace")
        assert self._error_log_key is not None
        with self._log_lock:
            try:
                # one attempt: never retried into the store that just failed
                append_log_line(self._store, self._error_log_key, line, retry_policy=RetryPolicy(retries=0))
            except Exception as log_exc:  # noqa: BLE001 - the log must not hide the real failure
                log.error("could not append to error log %s: %s", self._error_log_key, log_exc)

    def _failure_error(self, failed: dict[str, BaseException]) -> StorageError:
        kinds = {type(error) for error in failed.values()}
        cls = kinds.pop() if len(kinds) == 1 else StorageError
        if not (isinstance(cls, type) and issubclass(cls, StorageError)):
            cls = StorageError
        shown = "; ".join(f"{k} ({type(error).__name__}: {error})" for k, error in list(failed.items())[:20])
        more = f"; ... and {len(failed) - 20} more" if len(failed) > 20 else ""
        err = cls(f"{len(failed)} object(s) could not be written to {self._store.url}: {shown}{more}")
        err.failures = dict(failed)  # type: ignore[attr-defined]
        return err
