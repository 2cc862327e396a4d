"""The one streaming compactor: many index files (one per step and rank) into one
``_compact.parquet`` with the same rows, which readers scan instead of the files while
every file it covers is still listed (its ``covers`` metadata).

Memory holds one input table and at most one output row group: the rows are written to a
local temporary Parquet file as they come, and the file goes to the store in one streamed
put at the end. :func:`compact_index` groups a lake's files per run
(``run=<run>/_compact.parquet``, :func:`msprobe.readers.index.build_index`);
:mod:`msprobe.lake` compacts per (run, step) with :func:`compact_files`, or streams the
tables it has just built into a :class:`CompactWriter`.
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Iterable, Optional

from msprobe.backends import Store, open_store
from msprobe.errors import require
from msprobe.format.layout import FORMAT_VERSION, join_key
from msprobe.index.files import (
    COMPACT_FILE,
    INDEX_VERSION,
    META_PREFIX,
    partition_order,
    partition_value,
    read_index_table,
)
from msprobe.index.rows import arrow_schema

__all__ = ["CompactWriter", "compact_files", "compact_index", "run_compact_key", "ROW_GROUP_ROWS"]

#: rows per output row group (the writer flushes once half of them are pending)
ROW_GROUP_ROWS = 1 << 17
#: what a rank's index metadata says about that one file only: not carried into a compaction
_PER_FILE_META = ("step", "rank", "rank_dir", "source", "doc", "doc_size", "doc_mtime", "records", "covers")


def run_compact_key(run: Optional[str]) -> str:
    """``run=<run>/_compact.parquet`` (``_compact.parquet`` without a run)."""
    return join_key(f"run={partition_value(run)}" if run else "", COMPACT_FILE)


class CompactWriter:
    """Streams index tables into one compacted file ``ckey`` of ``store``.

    :meth:`add` each file's table (its key and its ``records`` metadata are noted), then
    :meth:`close` (or :meth:`abort`); as a context manager it closes on success and aborts on
    an exception. The compaction's metadata is the first table's minus what describes one file
    only, plus ``index_version``, ``format_version``, ``covers`` (the keys relative to the
    compacted file's directory) and ``records`` (their sum)."""

    def __init__(self, store: Store, ckey: str):
        require("pyarrow", "parquet")
        import pyarrow.parquet as pq

        self.store, self.ckey = store, ckey
        self.schema = arrow_schema()
        self.keys: list = []
        self.records = 0
        self._meta: Optional[dict] = None
        self._pending: list = []
        self._n = 0
        handle, self._tmp = tempfile.mkstemp(suffix=".parquet", prefix=".msprobe-compact-")
        os.close(handle)
        self._w = pq.ParquetWriter(self._tmp, self.schema, compression="zstd", write_statistics=True)

    def __enter__(self) -> "CompactWriter":
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def add(self, key: str, table: Any) -> None:
        metadata = table.schema.metadata or {}
        if self._meta is None:
            self._meta = {meta_key.decode(): value.decode() for meta_key, value in metadata.items()
                          if meta_key.startswith(META_PREFIX.encode())
                          and meta_key.decode()[len(META_PREFIX):] not in _PER_FILE_META}
        self.records += int(metadata.get((META_PREFIX + "records").encode(), b"0") or 0)
        self._pending.append(table.replace_schema_metadata(None).cast(self.schema))
        self._n += table.num_rows
        self.keys.append(key)
        if self._n >= ROW_GROUP_ROWS // 2:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        if self._pending:
            self._w.write_table(pa.concat_tables(self._pending), row_group_size=ROW_GROUP_ROWS)
        self._pending, self._n = [], 0

    def close(self) -> str:
        """Write the file to the store (one streamed put); returns its key."""
        try:
            self._flush()
            base = self.ckey[: -len(COMPACT_FILE)]
            meta = dict(self._meta or {})
            meta.update({META_PREFIX + "index_version": INDEX_VERSION, META_PREFIX + "format_version": FORMAT_VERSION,
                         META_PREFIX + "covers": json.dumps([key[len(base):] for key in self.keys]),
                         META_PREFIX + "records": str(self.records)})
            self._w.add_key_value_metadata(meta)
            self._w.close()
            with open(self._tmp, "rb") as file:
                self.store.put_stream(self.ckey, file)
        finally:
            self.abort()
        return self.ckey

    def abort(self) -> None:
        """Drop what was written (the store is not touched)."""
        try:
            self._w.close()
        except Exception:  # noqa: BLE001 - closing twice, or after a failed write: nothing to keep
            pass
        try:
            os.remove(self._tmp)
        except OSError:
            pass


def compact_files(store: Store, ckey: str, keys: Iterable[str]) -> str:
    """Stream the index files ``keys`` of ``store`` (in that order) into ``ckey``; one input
    file in memory at a time. Returns ``ckey``."""
    require("pyarrow", "parquet")

    with CompactWriter(store, ckey) as compact_writer:
        for key in keys:
            compact_writer.add(key, read_index_table(store, key))
    return ckey


def _partition_dir(key: str) -> str:
    """The run partition a lake key belongs to ('' without one)."""
    first = key.split("/", 1)[0]
    return first if first.startswith("run=") and "/" in key else ""


def compact_index(out: Any, *, storage_options: Optional[dict] = None, runs: Optional[Iterable] = None) -> list:
    """Merge the per-(step, rank) index files of each run of a lake into one
    ``run=<run>/_compact.parquet`` (row order as a reader lists them). Returns the keys written.

    ``out``: a Store or a URL/path (opened with ``storage_options``). Opening and scanning
    hundreds of small files costs more than reading their rows; the compacted file is what
    readers scan while it covers every file of its run.
    """
    store = out if hasattr(out, "list_prefix") else open_store(out, storage_options, create=True)
    wanted = None if runs is None else {f"run={partition_value(run)}" if run else "" for run in runs}
    groups: dict = {}
    for key in store.list_prefix(""):
        if not key.endswith(".parquet") or key.rsplit("/", 1)[-1] == COMPACT_FILE:
            continue
        part = _partition_dir(key)
        if wanted is None or part in wanted:
            groups.setdefault(part, []).append(key)
    return [compact_files(store, join_key(part, COMPACT_FILE), sorted(keys, key=partition_order))
            for part, keys in sorted(groups.items())]
