"""BackgroundWriter: back-pressure, failures, error log, lazy payloads, lifecycle."""
from __future__ import annotations

import threading
import time
import zlib

import pytest

from msprobe.backends import BackgroundWriter, LocalStore, open_store
from msprobe.errors import ConfigError, StorageError, StorageTransientError, UnsafePathError


class SlowStore(LocalStore):
    """A real LocalStore whose puts take a while, and that measures what it is handed."""

    def __init__(self, root, delay: float) -> None:
        super().__init__(root, fsync=False)
        self.delay = delay
        self.lock = threading.Lock()
        self.concurrent = 0
        self.max_concurrent = 0

    def put(self, key, data, *, overwrite=True):
        with self.lock:
            self.concurrent += 1
            self.max_concurrent = max(self.max_concurrent, self.concurrent)
        try:
            time.sleep(self.delay)
            super().put(key, data, overwrite=overwrite)
        finally:
            with self.lock:
                self.concurrent -= 1


class FlakyStore(LocalStore):
    """Fails the first ``n`` puts of every key with a transient error."""

    def __init__(self, root, n: int) -> None:
        super().__init__(root, fsync=False)
        self.n, self.seen, self.lock = n, {}, threading.Lock()

    def put(self, key, data, *, overwrite=True):
        with self.lock:
            self.seen[key] = self.seen.get(key, 0) + 1
            fail = self.seen[key] <= self.n
        if fail:
            raise StorageTransientError(f"503 SlowDown for {key}")
        super().put(key, data, overwrite=overwrite)


def test_back_pressure_bounds_bytes_in_flight(tmp_path) -> None:
    bound = 1 << 20
    store = SlowStore(tmp_path, delay=0.004)
    chunk = 64 << 10
    in_flight_seen: list[int] = []
    with BackgroundWriter(store, max_bytes_in_flight=bound, workers=4) as w:
        for i in range(200):
            w.submit(f"t/{i}.bin", bytes([i % 256]) * chunk)
            in_flight_seen.append(w.stats.bytes_in_flight)
    stats = w.stats
    assert stats.peak_bytes_in_flight <= bound
    assert max(in_flight_seen) <= bound
    assert stats.blocked_seconds > 0  # submit() really waited
    assert stats.objects_written == 200 and stats.bytes_written == 200 * chunk
    assert stats.bytes_in_flight == 0
    assert store.max_concurrent <= 4
    assert len(store.list_prefix("t")) == 200


def test_object_larger_than_bound_does_not_deadlock(tmp_path) -> None:
    store = LocalStore(tmp_path, fsync=False)
    with BackgroundWriter(store, max_bytes_in_flight=1000, workers=2) as w:
        w.submit("small", b"x" * 600)
        w.submit("huge", b"y" * 5000)  # waits until 'small' is out, then goes alone
        w.submit("small2", b"z" * 600)
    assert store.size("huge") == 5000 and w.stats.peak_bytes_in_flight == 5000


def test_lazy_payload_counts_nbytes(tmp_path) -> None:
    store = LocalStore(tmp_path, fsync=False)
    produced = threading.Event()

    def serialize() -> bytes:
        produced.set()
        return b"p" * 2048

    with BackgroundWriter(store, max_bytes_in_flight=4096) as w:
        w.submit("lazy", serialize, nbytes=2048)
        w.submit("lazy-underestimated", lambda: b"q" * 3000, nbytes=10)
        w.submit("mv", memoryview(bytearray(b"m" * 100)))
    assert produced.is_set() and store.get("lazy") == b"p" * 2048
    assert store.size("lazy-underestimated") == 3000 and store.get("mv") == b"m" * 100
    assert w.stats.bytes_written == 2048 + 3000 + 100


def test_transient_errors_are_retried(tmp_path) -> None:
    store = FlakyStore(tmp_path, n=2)
    with BackgroundWriter(store, retries=3, backoff=(0.001, 0.004)) as w:
        for i in range(20):
            w.submit(f"k{i}", str(i).encode())
    assert w.stats.retries == 40 and w.stats.failures == 0
    assert all(store.get(f"k{i}") == str(i).encode() for i in range(20))


def test_exhausted_retries_fail_and_are_logged(tmp_path) -> None:
    store = FlakyStore(tmp_path, n=10)
    w = BackgroundWriter(store, retries=2, backoff=(0.001, 0.002), error_log_key="rank0/dump_error_info.log")
    w.submit("doomed.bin", b"x")
    with pytest.raises(StorageTransientError, match="doomed.bin") as info:
        w.flush()
    assert set(info.value.failures) == {"doomed.bin"}
    w.flush()  # each failure is reported once
    w.close()
    log = store.get("rank0/dump_error_info.log").decode()
    stamp, key, kind, message = log.strip().split("\t")
    assert key == "doomed.bin" and kind == "StorageTransientError" and "503" in message
    assert stamp.endswith("+00:00")


def test_permanent_failure_local(tmp_path) -> None:
    """A key under an existing file cannot be written: no retries, flush names it, the log too."""
    store = LocalStore(tmp_path)
    store.put("rank0/blocker", b"a file")
    w = BackgroundWriter(store, retries=5, backoff=(0.5, 1.0), error_log_key="rank0/dump_error_info.log")
    for i in range(5):
        w.submit(f"rank0/ok{i}.pt", b"fine")
    w.submit("rank0/blocker/t.pt", b"cannot")
    with pytest.raises(StorageError, match="rank0/blocker/t.pt"):
        w.close()
    assert w.stats.retries == 0 and w.stats.failures == 1 and w.stats.objects_written == 5
    assert "rank0/blocker/t.pt" in store.get("rank0/dump_error_info.log").decode()


def test_callable_that_raises_is_a_failure(tmp_path) -> None:
    store = LocalStore(tmp_path)

    def broken() -> bytes:
        raise RuntimeError("serializer bug")

    w = BackgroundWriter(store)
    w.submit("a", broken, nbytes=10)
    w.submit("b", b"ok")
    with pytest.raises(StorageError, match="serializer bug"):
        w.close()
    assert store.get("b") == b"ok" and not store.exists("a") and w.stats.bytes_in_flight == 0


def test_error_log_on_object_store_keeps_every_line() -> None:
    store = open_store("memory://writer-log-test")
    w = BackgroundWriter(store, retries=0, error_log_key="rank0/dump_error_info.log", overwrite=False)
    store.put("exists/a", b"1")
    store.put("exists/b", b"1")
    w.submit("exists/a", b"2")
    w.submit("exists/b", b"2")
    with pytest.raises(StorageError):
        w.close()
    lines = store.get("rank0/dump_error_info.log").decode().splitlines()
    assert sorted(line.split("\t")[1] for line in lines) == ["exists/a", "exists/b"]


def test_verify_crc(tmp_path) -> None:
    store = LocalStore(tmp_path, fsync=False)
    payload = bytes(range(256)) * 1000
    with BackgroundWriter(store, verify="crc") as w:
        w.submit("v", payload)
    assert zlib.crc32(store.get("v")) == zlib.crc32(payload)


def test_lifecycle_and_validation(tmp_path) -> None:
    store = LocalStore(tmp_path)
    for bad in ({"workers": 0}, {"max_bytes_in_flight": 0}, {"verify": "md5"}):
        with pytest.raises(ConfigError):
            BackgroundWriter(store, **bad)
    w = BackgroundWriter(store)
    with pytest.raises(UnsafePathError):
        w.submit("../escape", b"x")
    w.close()
    w.close()
    with pytest.raises(StorageError, match="closed"):
        w.submit("late", b"x")
    assert all(not t.is_alive() for t in w._threads)


def test_exit_with_exception_does_not_mask_it(tmp_path) -> None:
    store = LocalStore(tmp_path)
    store.put("f", b"file")
    with pytest.raises(KeyError):
        with BackgroundWriter(store) as w:
            w.submit("f/under", b"x")  # will fail too
            raise KeyError("the real problem")


@pytest.mark.parametrize("kind", ["local", "memory"])
def test_append_log_line_keeps_other_writers_lines(tmp_path, kind) -> None:
    """The writer's error lines never erase lines someone else appended meanwhile."""
    from msprobe.backends import append_log_line

    store = LocalStore(tmp_path) if kind == "local" else open_store(f"memory://append-{tmp_path.name}")
    append_log_line(store, "rank0/dump_error_info.log", "from the session")
    store.put("rank0/blocker", b"file")
    w = BackgroundWriter(store, error_log_key="rank0/dump_error_info.log")
    w.submit("rank0/blocker/x", b"1")
    with pytest.raises(StorageError):
        w.flush()
    append_log_line(store, "rank0/dump_error_info.log", b"again from the session\n")
    w.submit("rank0/blocker/y", b"1")
    with pytest.raises(StorageError):
        w.close()
    lines = store.get("rank0/dump_error_info.log").decode().splitlines()
    assert lines[0] == "from the session" and lines[2] == "again from the session"
    assert "rank0/blocker/x" in lines[1] and "rank0/blocker/y" in lines[3] and len(lines) == 4


class FirstFailsSlowly(LocalStore):
    """The first put of ``bad`` bytes fails transiently, after ``delay`` seconds (a write that
    times out); every other put works."""

    def __init__(self, root, bad: bytes, delay: float) -> None:
        super().__init__(root, fsync=False)
        self.bad, self.delay, self.failed, self.puts = bad, delay, False, []

    def put(self, key, data, *, overwrite=True):
        self.puts.append(bytes(data))
        if bytes(data) == self.bad and not self.failed:
            self.failed = True
            time.sleep(self.delay)
            raise StorageTransientError(f"timed out writing {key}")
        super().put(key, data, overwrite=overwrite)


def test_a_key_submitted_again_holds_the_last_bytes_whatever_the_retries(tmp_path) -> None:
    """A key submitted twice (a parameter's gradient rewritten after a second backward): the first
    write times out and is retried while the second is written by another worker; the key must hold
    the second submission's bytes (before, the first one's retry landed last)."""
    store = FirstFailsSlowly(tmp_path, bad=b"v1" * 100, delay=0.2)
    with BackgroundWriter(store, workers=4, backoff=(0.3, 0.3)) as w:
        w.submit("g.pt", b"v1" * 100)
        time.sleep(0.05)  # the first is being written (and about to fail)
        w.submit("g.pt", b"v2" * 100)
        w.flush()
        assert store.get("g.pt") == b"v2" * 100
        assert w.stats.superseded == 1 and w.stats.objects_written == 1
    assert store.puts.count(b"v1" * 100) == 1  # its retry was dropped, not written


def test_a_queued_submission_replaced_before_it_starts_is_not_produced(tmp_path) -> None:
    store = LocalStore(tmp_path, fsync=False)
    gate, produced = threading.Event(), []

    def blocker() -> bytes:
        gate.wait(5)
        return b"other"

    def producer(tag: bytes):
        return lambda: produced.append(tag) or tag * 10

    with BackgroundWriter(store, workers=1, digests=True) as w:
        w.submit("other", blocker, nbytes=5)
        for tag in (b"a", b"b", b"c"):
            w.submit("k", producer(tag), nbytes=10)
        gate.set()
        w.flush()
        assert store.get("k") == b"c" * 10 and produced == [b"c"]
        assert w.stats.superseded == 2 and w.digests["k"] == (10, zlib.crc32(b"c" * 10))
