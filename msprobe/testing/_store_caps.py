"""The capability part of the Store suite (:class:`msprobe.testing.StoreTests` inherits it): what
callers ask of a store instead of its type. Its tests use the fixtures ``store``, ``other`` and
``reader`` that :class:`~msprobe.testing.StoreTests` and its subclasses provide."""
from __future__ import annotations

import os

import pytest

from msprobe.backends import Store, read_journal
from msprobe.errors import StorageNotFoundError, StoragePermissionError

__all__ = ["StoreCapabilityTests"]


class StoreCapabilityTests:
    """The capability flags and methods every backend must get right (their defaults included)."""

    def test_capability_flags(self, store: Store) -> None:
        for flag in ("supports_writes", "supports_deletes", "supports_listing", "exact_mtimes", "cheap_requests"):
            assert isinstance(getattr(store, flag), bool), flag
        assert store.supports_writes and not store.read_only

    def test_stat(self, store: Store, other: Store) -> None:
        store.put("s/doc.json", b"0123456789")
        size, mtime = other.stat("s/doc.json")
        assert size == 10
        assert mtime is None or mtime > 0
        store.put("s/doc.json", b"01234")
        assert other.stat("s/doc.json")[0] == 5  # read fresh, no cache in the way
        with pytest.raises((StorageNotFoundError, OSError)):
            other.stat("s/missing.json")

    def test_disk_usage(self, store: Store, other: Store) -> None:
        store.put("du/a/x.bin", b"abc")
        store.put("du/a/b/y.bin", b"12345")
        store.put("du/z.bin", b"")
        assert other.disk_usage("du/a") == (2, 8)
        assert other.disk_usage("du") == (3, 8)
        assert other.disk_usage("du/none") == (0, 0)

    def test_arrow_location(self, store: Store, other: Store) -> None:
        """Where the store names a pyarrow file system, pyarrow reads the same bytes through it."""
        store.put("arrow/t.bin", b"tensor bytes")
        located = other.arrow_location("arrow/t.bin")
        if located is None:
            return  # readers then go through get/open_read (tested above)
        filesystem, path = located
        with filesystem.open_input_file(path) as f:
            assert f.read() == b"tensor bytes"

    def test_fsspec_location(self, store: Store, other: Store) -> None:
        store.put("fs/t.bin", b"abc")
        located = other.fsspec_location("fs/t.bin")
        if located is None:
            return
        filesystem, path = located
        filesystem.invalidate_cache()
        assert filesystem.cat_file(path) == b"abc"

    def test_append_dir(self, store: Store, other: Store) -> None:
        """A store that offers in-place appends names a directory the journal may append to;
        the lines written there are read back through the store."""
        where = store.append_dir("ap/journal")
        assert where is None or isinstance(where, str)
        with store.journal("ap/journal") as j:
            j.append(b'{"n": 1}')
        assert list(read_journal(other, "ap/journal")) == [b'{"n": 1}']

    def test_delete_prefix(self, store: Store, other: Store, reader: Store) -> None:
        store.put("dp/a/x", b"1")
        store.put("dp/a/b/y", b"2")
        store.put("dp/keep", b"3")
        store.delete_prefix("dp/a")
        assert other.list_prefix("dp") == ["dp/keep"] and other.list_dir("dp") == ["keep"]
        store.delete_prefix("dp/none")  # a missing prefix is not an error
        with pytest.raises(StoragePermissionError):
            reader.delete_prefix("dp")
        assert other.get("dp/keep") == b"3"

    def test_location(self, store: Store) -> None:
        """Where a person finds a key: a path that exists on this machine, or the store's URL."""
        store.put("loc/x.bin", b"1")
        where = store.location("loc/x.bin")
        assert where.endswith("loc/x.bin")
        assert where == f"{store.url.rstrip('/')}/loc/x.bin" or os.path.isfile(where)

    def test_without_fsync(self, store: Store, other: Store) -> None:
        """The unflushed view writes the same place, atomically, as the store."""
        fast = store.without_fsync()
        assert isinstance(fast, Store) and fast.url == store.url
        fast.put("nf/doc.json", b"{}")
        assert other.get("nf/doc.json") == b"{}"

    def test_remove_empty_dirs_and_temps(self, store: Store, other: Store) -> None:
        store.put("ed/a/x", b"1")
        store.put("ed/b/y", b"2")
        store.delete("ed/a/x")
        store.remove_empty_dirs("ed/a")
        store.remove_empty_dirs("ed/b")  # holds an object: kept
        assert "a" not in other.list_dir("ed") and other.get("ed/b/y") == b"2"
        store.remove_temps("ed/b")  # a finished write leaves no temporary file: nothing listed goes
        assert other.list_prefix("ed") == ["ed/b/y"]

    def test_duckdb_path(self, store: Store) -> None:
        """Where the store names a path for DuckDB's own readers, the object's bytes are there."""
        store.put("duck/t.parquet", b"PAR1")
        path = store.duckdb_path("duck/t.parquet")
        if path is None:
            return  # the lake reads through arrow_location then
        with open(path, "rb") as f:
            assert f.read() == b"PAR1"

    def test_duckdb_setup(self, store: Store) -> None:
        """A store that sets DuckDB up to read it names a location its objects lie under; one
        that cannot says None (the lake reads through duckdb_path or arrow_location then)."""
        duckdb = pytest.importorskip("duckdb")
        store.put("duck/u.bin", b"x")
        con = duckdb.connect(":memory:")
        try:
            where = store.duckdb_setup(con)
        finally:
            con.close()
        assert where is None or (isinstance(where, str) and where.rstrip("/") == store.url.rstrip("/")), where

    def test_get_many(self, store: Store, other: Store) -> None:
        """The objects asked for that exist, by key, read at once; missing ones are left out."""
        store.put("many/a.json", b"1")
        store.put("many/sub/b.json", b"22")
        assert other.get_many(["many/a.json", "many/sub/b.json", "many/none.json"]) == {
            "many/a.json": b"1", "many/sub/b.json": b"22"}
        assert other.get_many([]) == {}

    def test_list_dir_stats(self, store: Store, other: Store) -> None:
        """Where the store lists a directory with sizes and times, it agrees with list_dir and stat."""
        store.put("ls/a.json", b"123")
        store.put("ls/sub/b.bin", b"1")
        entries = other.list_dir_stats("ls")
        if entries is None:
            return  # callers list and stat one by one then
        assert sorted(entries) == other.list_dir("ls")
        size_and_time = entries["a.json"]
        assert size_and_time is not None and size_and_time[0] == 3
