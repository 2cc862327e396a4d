"""A backend written only here (not a LocalStore or FsspecStore, no file system, no fsspec):
a dict in memory behind the :class:`Store` ABC that counts the requests it serves. It passes
the shipped suite (:class:`msprobe.testing.StoreTests`); tests/test_store_flow.py runs the
whole flow through it."""
from __future__ import annotations

import io
import threading
from collections import Counter
from typing import IO, BinaryIO

import pytest

from msprobe.backends import Store
from msprobe.backends._base import BytesLike
from msprobe.errors import StorageError, StorageNotFoundError, StoragePermissionError
from msprobe.testing import StoreTests


class CountingStore(Store):
    """Objects in a shared dict; every request counted in a shared :class:`Counter`."""

    def __init__(self, objects: dict | None = None, prefix: str = "", *, read_only: bool = False,
                 counts: Counter | None = None, lock: threading.Lock | None = None) -> None:
        super().__init__(read_only=read_only)
        self.objects: dict[str, bytes] = {} if objects is None else objects
        self.counts: Counter = Counter() if counts is None else counts
        self._lock = lock or threading.Lock()
        self._at = prefix

    @property
    def url(self) -> str:
        return f"counting://{self._at}"

    def _full(self, key: str) -> str:
        return f"{self._at}/{key}" if self._at and key else (self._at or key)

    def _count(self, operation: str) -> None:
        with self._lock:
            self.counts[operation] += 1

    def _object(self, key: str) -> bytes:
        try:
            return self.objects[self._full(self._key(key))]
        except KeyError:
            raise StorageNotFoundError(f"{self._where(key)}: no such object") from None

    def get(self, key: str) -> bytes:
        self._count("get")
        return self._object(key)

    def get_range(self, key: str, start: int, end: int | None = None) -> bytes:
        self._count("get_range")
        if start < 0 or (end is not None and end < 0):
            raise StorageError(f"{self._where(key)}: negative range {start}..{end}")
        return self._object(key)[start:end]

    def exists(self, key: str) -> bool:
        self._count("exists")
        return self._full(self._key(key)) in self.objects

    def size(self, key: str) -> int:
        self._count("size")
        return len(self._object(key))

    def list_prefix(self, prefix: str = "") -> list[str]:
        self._count("list_prefix")
        below = self._full(self._prefix(prefix).rstrip("/"))
        start = f"{below}/" if below else ""
        skip = len(f"{self._at}/") if self._at else 0
        return sorted(key[skip:] for key in list(self.objects) if key.startswith(start))

    def list_dir(self, prefix: str = "") -> list[str]:
        self._count("list_dir")
        below = self._full(self._prefix(prefix).rstrip("/"))
        start = f"{below}/" if below else ""
        return sorted({key[len(start):].split("/", 1)[0] for key in list(self.objects) if key.startswith(start)})

    def open_read(self, key: str) -> IO[bytes]:
        self._count("open_read")
        return io.BytesIO(self._object(key))

    def put(self, key: str, data: BytesLike, *, overwrite: bool = True) -> None:
        self.check_writable()
        self._count("put")
        full = self._full(self._key(key))
        payload = bytes(data)
        with self._lock:
            if not overwrite and full in self.objects:
                raise StoragePermissionError(f"{self._where(key)} exists")
            self.objects[full] = payload

    def put_stream(self, key: str, fileobj: BinaryIO, *, overwrite: bool = True) -> int:
        self.check_writable()
        self._key(key)
        parts = []
        while True:
            try:
                chunk = fileobj.read(1 << 20)
            except Exception as exc:
                raise StorageError(f"put_stream {self._where(key)}: {exc}") from exc
            if not chunk:
                break
            parts.append(chunk)
        data = b"".join(parts)
        self.put(key, data, overwrite=overwrite)
        return len(data)

    def delete(self, key: str) -> None:
        self.check_writable()
        self._count("delete")
        with self._lock:
            self.objects.pop(self._full(self._key(key)), None)

    def child(self, prefix: str) -> "CountingStore":
        prefix = self._prefix(prefix).rstrip("/")
        if not prefix:
            return self
        return CountingStore(self.objects, self._full(prefix), read_only=self.read_only, counts=self.counts,
                             lock=self._lock)


class TestCountingStore(StoreTests):
    @pytest.fixture
    def store(self) -> Store:
        return CountingStore()

    @pytest.fixture
    def other(self, store: CountingStore) -> Store:
        return CountingStore(store.objects, counts=store.counts)

    def reopen(self, store: Store, *, read_only: bool) -> Store:
        assert isinstance(store, CountingStore)
        return CountingStore(store.objects, read_only=read_only, counts=store.counts)

    def test_counts_and_no_shortcuts(self, store: CountingStore) -> None:
        store.put("a/b", b"x")
        assert store.get("a/b") == b"x"
        assert store.counts["put"] == 1 and store.counts["get"] == 1
        assert store.local_path("a/b") is None
        filesystem, path = store.arrow_location("a/b")  # the generic view: through get/size/list
        before = store.counts["get"]
        with filesystem.open_input_file(path) as f:
            assert f.read() == b"x"
        assert store.counts["get"] == before + 1
        assert store.append_dir("a") is None and store.fsspec_location() is None
        assert not store.is_local and not store.exact_mtimes and not store.cheap_requests
