"""The Store suite every backend must pass, shipped for backends written elsewhere.

Like ``zarr.testing.store.StoreTests``: :class:`StoreTests` holds the tests; a subclass per
backend provides the fixtures ``store`` (a writable, empty store) and ``other`` (a second,
independent handle on the same location, to prove that what one handle writes the other sees,
with no cache in the way), and :meth:`StoreTests.reopen`. Run it with pytest::

    from msprobe.testing import StoreTests

    class TestMyStore(StoreTests):
        @pytest.fixture
        def store(self): ...
        @pytest.fixture
        def other(self, store): ...
        def reopen(self, store, *, read_only): ...

``import msprobe`` never imports this module (nor pytest).
"""
from __future__ import annotations

import io
import threading
import warnings

import numpy as np
import pytest

from msprobe.backends import (
    CLAIM_MARKER,
    BackgroundWriter,
    JournalTruncatedWarning,
    Store,
    claim_run_dir,
    read_journal,
)
from msprobe.errors import (
    ConfigError,
    MsprobeError,
    StorageError,
    StorageNotFoundError,
    StoragePermissionError,
    UnsafePathError,
)
from msprobe.testing._store_caps import StoreCapabilityTests

__all__ = ["StoreTests", "BAD_KEYS"]

BAD_KEYS = [
    "", "/abs", "../up", "a/../b", "a/..", "./a", "a/./b", ".", "..", "a//b", "a/", "a\\b",
    "a\x00b", "C:/windows", "c:x",
]


class StoreTests(StoreCapabilityTests):
    """Every backend must pass these."""

    #: objects written by test_background_writer (fewer on slow servers)
    writer_objects = 40

    # -- fixtures the subclasses provide -----------------------------------
    @pytest.fixture
    def store(self) -> Store:  # pragma: no cover - overridden
        raise NotImplementedError

    @pytest.fixture
    def other(self, store: Store) -> Store:  # pragma: no cover - overridden
        raise NotImplementedError

    @pytest.fixture
    def reader(self, other: Store) -> Store:
        """A read-only handle on the same location."""
        return self.reopen(other, read_only=True)

    def reopen(self, store: Store, *, read_only: bool) -> Store:
        raise NotImplementedError

    def test_is_a_readable_store(self, store: Store, reader: Store) -> None:
        """Every backend (and its read-only handle and children) meets the readers' contract."""
        from msprobe.format.protocols import ReadableStore

        for s in (store, reader, store.child("x")):
            assert isinstance(s, ReadableStore), type(s)

    # -- put / get ---------------------------------------------------------
    def test_put_get_roundtrip(self, store: Store, other: Store) -> None:
        store.put("a/b/c.bin", b"hello")
        store.put("empty", b"")
        store.put("ba", bytearray(b"\x00\x01\x02"))
        arr = np.arange(1000, dtype=np.float32)
        store.put("arr.bin", memoryview(arr))  # type: ignore[arg-type]  # numpy arrays are buffers
        for s in (store, other):
            assert s.get("a/b/c.bin") == b"hello"
            assert s.get("empty") == b""
            assert s.get("ba") == b"\x00\x01\x02"
            assert np.array_equal(np.frombuffer(s.get("arr.bin"), dtype=np.float32), arr)
        assert isinstance(store.get("a/b/c.bin"), bytes)

    def test_get_missing(self, store: Store) -> None:
        with pytest.raises(StorageNotFoundError):
            store.get("missing/key")
        with pytest.raises(FileNotFoundError):  # the built-in it also is
            store.get("missing")
        store.put("dir/obj", b"x")
        with pytest.raises(StorageNotFoundError):
            store.get("dir")  # a prefix is not an object
        with pytest.raises(StorageNotFoundError):
            store.open_read("missing")

    def test_get_range(self, store: Store) -> None:
        store.put("r", b"0123456789")
        assert store.get_range("r", 0, 3) == b"012"
        assert store.get_range("r", 2, None) == b"23456789"
        assert store.get_range("r", 7) == b"789"
        assert store.get_range("r", 5, 100) == b"56789"
        assert store.get_range("r", 20, 30) == b""
        assert store.get_range("r", 4, 4) == b""
        with pytest.raises(StorageNotFoundError):
            store.get_range("nope", 0, 1)
        with pytest.raises(MsprobeError):
            store.get_range("r", -1, 2)

    def test_exists_and_size(self, store: Store, other: Store) -> None:
        store.put("d/obj", b"12345")
        assert store.exists("d/obj") and other.exists("d/obj")
        assert not store.exists("d")  # a prefix is not an object
        assert not store.exists("nope")
        assert not store.exists("d/obj/below")
        assert store.size("d/obj") == other.size("d/obj") == 5
        with pytest.raises(StorageNotFoundError):
            store.size("nope")
        with pytest.raises(StorageNotFoundError):
            store.size("d")

    def test_open_read(self, store: Store) -> None:
        payload = bytes(range(256)) * 100
        store.put("f", payload)
        with store.open_read("f") as f:
            assert f.read(10) == payload[:10]
            f.seek(1000)
            assert f.read(5) == payload[1000:1005]
            f.seek(0)
            assert f.read() == payload

    # -- listing -------------------------------------------------------------
    def test_list_prefix(self, store: Store, other: Store) -> None:
        keys = ["a/x", "a/b/y", "a/b/c/z", "ab/w", "top"]
        for k in keys:
            store.put(k, k.encode())
        for s in (store, other):
            assert s.list_prefix() == sorted(keys)
            assert s.list_prefix("") == sorted(keys)
            assert s.list_prefix("a") == ["a/b/c/z", "a/b/y", "a/x"]
            assert s.list_prefix("a/") == ["a/b/c/z", "a/b/y", "a/x"]
            assert s.list_prefix("a/b") == ["a/b/c/z", "a/b/y"]
            assert s.list_prefix("missing") == []
            assert s.list_prefix("top") == []  # an object is not a prefix
        for k in store.list_prefix():
            assert store.get(k) == k.encode()

    def test_list_dir(self, store: Store, other: Store) -> None:
        for k in ["step0/rank0/dump.json", "step0/rank1/dump.json", "step1/rank0/x", "README"]:
            store.put(k, b"1")
        for s in (store, other):
            assert s.list_dir() == ["README", "step0", "step1"]
            assert s.list_dir("") == ["README", "step0", "step1"]
            assert s.list_dir("step0") == ["rank0", "rank1"]
            assert s.list_dir("step0/") == ["rank0", "rank1"]
            assert s.list_dir("step0/rank0") == ["dump.json"]
            assert s.list_dir("nope") == []

    def test_list_sees_later_writes(self, store: Store, other: Store) -> None:
        assert other.list_dir("late") == []
        store.put("late/one", b"1")
        assert other.list_dir("late") == ["one"]
        store.put("late/two", b"2")
        assert other.list_prefix("late") == ["late/one", "late/two"]
        store.delete("late/one")
        assert other.list_prefix("late") == ["late/two"]

    # -- delete / overwrite --------------------------------------------------
    def test_delete(self, store: Store) -> None:
        store.put("d/k", b"1")
        store.delete("d/k")
        assert not store.exists("d/k")
        store.delete("d/k")  # idempotent
        store.delete("never/was")

    def test_overwrite(self, store: Store, other: Store) -> None:
        store.put("k", b"first")
        store.put("k", b"second")
        assert other.get("k") == b"second"
        with pytest.raises(StoragePermissionError, match="exists"):
            store.put("k", b"third", overwrite=False)
        with pytest.raises(StoragePermissionError):
            store.put_stream("k", io.BytesIO(b"fourth"), overwrite=False)
        assert other.get("k") == b"second"
        store.put("fresh", b"new", overwrite=False)
        assert other.get("fresh") == b"new"

    def test_exclusive_create_race(self, store: Store, other: Store) -> None:
        """Of 8 threads creating one key exclusively, exactly one wins."""
        results: list[str] = []
        barrier = threading.Barrier(8)

        def claim(i: int) -> None:
            s = store if i % 2 else other
            barrier.wait()
            try:
                s.put("race/marker", f"{i}".encode(), overwrite=False)
                results.append(f"won{i}")
            except StoragePermissionError:
                results.append("lost")

        threads = [threading.Thread(target=claim, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [r for r in results if r.startswith("won")]
        assert len(winners) == 1 and len(results) == 8
        assert store.get("race/marker") == winners[0][3:].encode()

    # -- streams -------------------------------------------------------------
    def test_put_stream(self, store: Store, other: Store) -> None:
        payload = np.random.default_rng(0).bytes(3 * 2**20 + 17)
        assert store.put_stream("s/big.bin", io.BytesIO(payload)) == len(payload)
        assert other.get("s/big.bin") == payload
        assert store.put_stream("s/empty", io.BytesIO(b"")) == 0
        assert other.get("s/empty") == b""

    def test_put_stream_failure_publishes_nothing(self, store: Store, other: Store) -> None:
        class Failing(io.RawIOBase):
            def __init__(self) -> None:
                self.calls = 0

            def readable(self) -> bool:
                return True

            def readinto(self, b: bytearray) -> int:  # type: ignore[override]
                self.calls += 1
                if self.calls > 3:
                    raise RuntimeError("source died")
                b[:] = b"x" * len(b)
                return len(b)

        with pytest.raises(StorageError):
            store.put_stream("s/partial", Failing())  # type: ignore[arg-type]  # a raw stream
        assert not other.exists("s/partial")
        assert other.list_prefix() == []

    # -- key validation ------------------------------------------------------
    def test_unsafe_keys(self, store: Store) -> None:
        for key in BAD_KEYS:
            for call in (
                lambda: store.get(key),
                lambda: store.put(key, b"x"),
                lambda: store.put_stream(key, io.BytesIO(b"x")),
                lambda: store.exists(key),
                lambda: store.size(key),
                lambda: store.delete(key),
                lambda: store.get_range(key, 0, 1),
                lambda: store.open_read(key),
            ):
                with pytest.raises(UnsafePathError):
                    call()
            if key not in ("", "a/"):  # '' is the root and 'a/' a prefix, both fine for listing
                for listing in (lambda: store.list_prefix(key), lambda: store.list_dir(key), lambda: store.child(key)):
                    with pytest.raises(UnsafePathError):
                        listing()
        assert store.list_prefix() == []

    def test_unsafe_key_is_permission_error(self, store: Store) -> None:
        with pytest.raises(PermissionError):
            store.put("../../etc/passwd", b"x")

    # -- read-only -----------------------------------------------------------
    def test_read_only(self, store: Store, reader: Store) -> None:
        store.put("k", b"v")
        assert reader.read_only and not store.read_only
        assert reader.get("k") == b"v" and reader.list_prefix() == ["k"]
        for call in (
            lambda: reader.put("k2", b"x"),
            lambda: reader.put_stream("k2", io.BytesIO(b"x")),
            lambda: reader.delete("k"),
            lambda: reader.journal("j"),
            lambda: claim_run_dir(reader, "run"),
            lambda: BackgroundWriter(reader),
            lambda: reader.child("sub").put("x", b"1"),
        ):
            with pytest.raises(StoragePermissionError, match="read-only"):
                call()
        assert store.list_prefix() == ["k"]

    # -- child stores --------------------------------------------------------
    def test_child(self, store: Store, other: Store) -> None:
        rank = store.child("step0/rank0")
        rank.put("dump.json", b"{}")
        assert other.get("step0/rank0/dump.json") == b"{}"
        assert rank.list_prefix() == ["dump.json"]
        assert rank.list_dir() == ["dump.json"]
        assert rank.url.endswith("step0/rank0")
        assert type(rank) is type(store)
        assert store.child("") is store
        deeper = rank.child("sub/dir")
        deeper.put("t.pt", b"1")
        assert store.list_prefix("step0") == ["step0/rank0/dump.json", "step0/rank0/sub/dir/t.pt"]
        with pytest.raises(UnsafePathError):
            rank.get("../rank1/dump.json")

    def test_url_and_repr(self, store: Store) -> None:
        assert store.url in repr(store)
        assert type(store).__name__ in repr(store)

    # -- journal ---------------------------------------------------------------
    def test_journal_roundtrip(self, store: Store, other: Store) -> None:
        with store.journal("rank0/journal") as j:
            for i in range(5):
                j.append(f'{{"i": {i}}}'.encode())
            j.flush()
            j.append('{"i": 5}')
            j.flush()
            j.flush()  # nothing buffered: no new segment
            j.append(b'{"i": 6}')
        lines = list(read_journal(other, "rank0/journal"))
        assert lines == [f'{{"i": {i}}}'.encode() for i in range(7)]
        with store.journal("rank0/journal") as j2:  # a later session continues, never rewrites
            j2.append(b'{"i": 7}')
        assert list(read_journal(other, "rank0/journal"))[-1] == b'{"i": 7}'
        segments = other.list_dir("rank0/journal")
        assert segments == sorted(segments) and all(s.endswith(".jsonl") for s in segments)
        assert list(read_journal(other, "no/journal")) == []

    def test_journal_truncated_tail(self, store: Store, other: Store) -> None:
        with store.journal("j") as j:
            j.append(b'{"a": 1}')
        store.put("j/000002.jsonl", b'{"b": 2}\n{"c": 3}\n{"d": 4')
        store.put("j/000003.jsonl", b'{"e": 5}\n')
        seen: list[tuple[str, bytes]] = []
        lines = list(read_journal(other, "j", on_truncated=lambda key, tail: seen.append((key, tail))))
        assert lines == [b'{"a": 1}', b'{"b": 2}', b'{"c": 3}', b'{"e": 5}']
        assert seen == [("j/000002.jsonl", b'{"d": 4')]
        with pytest.warns(JournalTruncatedWarning, match="000002.jsonl"):
            assert len(list(read_journal(other, "j"))) == 4
        with store.journal("j") as j:  # a new session starts a new segment after the torn one
            j.append(b'{"f": 6}')
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", JournalTruncatedWarning)
            assert list(read_journal(other, "j"))[-1] == b'{"f": 6}'

    def test_journal_rejects_newlines(self, store: Store) -> None:
        with store.journal("j") as j:
            with pytest.raises(MsprobeError):
                j.append(b"two\nlines")
        with pytest.raises(MsprobeError):
            j.append(b"closed")
        j.close()  # twice is fine

    # -- run directories -------------------------------------------------------
    def test_claim_run_dir_refuse(self, store: Store, other: Store) -> None:
        assert claim_run_dir(store, "dump") == "dump"
        assert other.exists(f"dump/{CLAIM_MARKER}")
        with pytest.raises(StoragePermissionError, match="dump"):
            claim_run_dir(other, "dump")
        store.put("legacy/step0/rank0/dump.json", b"{}")  # someone else's dump, no marker
        with pytest.raises(StoragePermissionError, match="legacy"):
            claim_run_dir(store, "legacy", policy="refuse")
        with pytest.raises(ConfigError, match="refuse"):
            claim_run_dir(store, "x", policy="overwrite")

    def test_claim_run_dir_new(self, store: Store, other: Store) -> None:
        names = [claim_run_dir(s, "runs/dump", policy="new") for s in (store, other, store)]
        assert names == ["runs/dump", "runs/dump.1", "runs/dump.2"]
        store.put("runs/busy/x", b"1")
        assert claim_run_dir(store, "runs/busy", policy="new") == "runs/busy.1"

    def test_claim_run_dir_race(self, store: Store, other: Store) -> None:
        claimed: list[str] = []
        barrier = threading.Barrier(6)

        def run(i: int) -> None:
            barrier.wait()
            claimed.append(claim_run_dir(store if i % 2 else other, "race", policy="new"))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(claimed) == sorted(["race"] + [f"race.{i}" for i in range(1, 6)])

    # -- background writer -----------------------------------------------------
    def test_background_writer(self, store: Store, other: Store) -> None:
        payloads = {f"rank0/t{i}.bin": np.random.default_rng(i).bytes(1000 + i) for i in range(self.writer_objects)}
        with BackgroundWriter(store, workers=3, max_bytes_in_flight=8000, verify=True) as w:
            for key, data in payloads.items():
                w.submit(key, data)
            w.submit("rank0/lazy.bin", lambda: b"lazy" * 10, nbytes=40)
        assert w.stats.objects_written == len(payloads) + 1 and w.stats.failures == 0
        assert w.stats.peak_bytes_in_flight <= 8000
        for key, data in payloads.items():
            assert other.get(key) == data
        assert other.get("rank0/lazy.bin") == b"lazy" * 10
