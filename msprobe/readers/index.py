"""Building the Parquet index of a whole dump (:func:`build_index`).

The index itself (rows, schema, files, metadata, staleness, compaction) is
:mod:`msprobe.index`; its public names are importable from here too, where this
package's users have always found them.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from msprobe.backends import Store
from msprobe.errors import StorageNotFoundError, require
from msprobe.format.gcpause import gc_paused
from msprobe.format.layout import join_key
from msprobe.format.protocols import ReadableStore
from msprobe.index.compact import CompactWriter, compact_index, run_compact_key

# the public index names this module has always offered (msprobe.index is their home)
from msprobe.index.files import (
    COMPACT_FILE,
    INDEX_FILE,
    INDEX_VERSION,
    META_PREFIX,
    StaleIndexWarning,
    doc_stat,
    partition_key,
    partition_order,
    partition_value,
    read_index_metadata,
    stale_reason,
    write_rank_index,
)
from msprobe.progress import Progress
from msprobe.readers._api import open as open_dump
from msprobe.readers._dump import Dump
from msprobe.readers._source import RankSource
from msprobe.readers._store import open_store

__all__ = ["build_index", "compact_index", "COMPACT_FILE", "INDEX_FILE", "INDEX_VERSION", "META_PREFIX",
           "StaleIndexWarning", "doc_stat", "partition_key", "read_index_metadata", "stale_reason", "write_rank_index"]

log = logging.getLogger("msprobe.readers")


def build_index(dump_or_path: Any, out: Any = None, *, storage_options: Optional[dict] = None,
                out_storage_options: Optional[dict] = None, run: Optional[str] = None,
                progress: Any = None, skip_existing: bool = False, compact: bool = True,
                leaf_tables: Optional[Callable] = None) -> list:
    """Build the Parquet index of every rank of a dump; returns the URLs written.

    ``dump_or_path``: a :class:`~msprobe.readers.Dump` or anything ``open()`` takes.
    ``out``: None writes ``<rank dir>/index/records.parquet`` into the dump itself;
    a URL/path (or Store) writes hive partitions there instead. ``run`` names the
    dump in the ``run`` column (default: the dump's directory name). ``progress``:
    True for :class:`msprobe.progress.Progress` on stderr, ``"auto"`` for it when stderr is a
    terminal, or a callable ``(done, total, what)``. With ``out``,
    ``compact=True`` finally merges the run's partitions into ``run=<run>/_compact.parquet``
    (see :func:`compact_index`); the per-(step, rank) files stay. ``leaf_tables``: without ``out``,
    also called as ``leaf_tables(store, rank_prefix, document, doc_size, doc_mtime)`` for each rank
    directory indexed (``msprobe index`` passes compare's leaf table writer,
    :func:`msprobe.compare.write_compare_leaves`).
    """
    require("pyarrow", "parquet")
    dump = dump_or_path if isinstance(dump_or_path, Dump) else open_dump(
        dump_or_path, engine="msprobe", storage_options=storage_options, run=run)
    run = run or dump.run
    dump_store = None
    if out is not None:
        # the index is derived from the documents (rebuilt at will, a stale or unreadable one read around):
        # its files are written atomically, not fsync'ed one by one, as the dumper writes its documents
        out_store = open_store(out, out_storage_options, create=True).without_fsync()
        stale = run_compact_key(run)
        if out_store.exists(stale):
            out_store.delete(stale)  # the run's files change: its compaction no longer holds
    else:
        out_store = None
        if isinstance(dump.store, Store) and not dump.store.read_only:
            dump_store = dump.store.without_fsync()
        else:  # the reader's store is read-only: a writable one on the same place
            dump_store = open_store(dump.url, dump.storage_options or None, read_only=False,
                                    create=False).without_fsync()
    sources = [s for s in dump.sources if isinstance(s, RankSource) and not getattr(s, "index_only", False)]
    show = None
    if progress is True or progress == "auto":
        show = Progress(len(sources), "index", "rank dirs", enabled=None if progress == "auto" else True)
    written: list = []
    stream = _RunCompaction.start(out_store, run) if out_store is not None and compact else None
    try:
        _index_sources(sources, dump, out_store, dump_store, run, skip_existing, show, progress, written, stream,
                       leaf_tables)
    except BaseException:
        if stream is not None:
            stream.abort()
        raise
    if show is not None:
        show.close()
    if out_store is not None and compact and written:
        if stream is None or not stream.finish():  # other files in the run, or another order: read them all
            compact_index(out_store, runs=[run])
    elif stream is not None:
        stream.abort()
    return written


def _index_sources(sources: list, dump: Dump, out_store: Any, dump_store: Any, run: Optional[str],
                   skip_existing: bool, show: Any, progress: Any, written: list, stream: Any,
                   leaf_tables: Optional[Callable] = None) -> None:
    """Index each rank directory of ``sources`` (see :func:`build_index`); their URLs appended to
    ``written``, their tables streamed into ``stream`` (the run's compaction) as they are built."""
    for i, src in enumerate(sources):
        if out_store is None:
            store, prefix = dump_store, src.prefix
            key = join_key(prefix, INDEX_FILE)
        else:
            store, prefix = out_store, ""
            key = partition_key(run, src.step, src.rank, src.rank_dir, src.split)
        if not (skip_existing and store.exists(key) and _covers(store, key, src)):
            with gc_paused():  # a parsed document holds no cycle: no collection while it is indexed
                was_loaded = src.loaded
                size, mtime = doc_stat(src.store, src.doc_key) if src.doc_name else (None, None)
                try:
                    doc = src.document()
                except StorageNotFoundError:
                    continue
                write_rank_index(store, prefix, doc, step=src.step, rank=src.rank, rank_dir=src.rank_dir,
                                 split=src.split, run=run, stack=src.stack(), construct=src.construct(),
                                 mapping=src.mapping() if src.has_mapping() else None,
                                 dialect=dump.dialect_of(src), key=key, doc_name=src.doc_name or "dump.json",
                                 doc_size=src.doc_size if src.doc_size is not None else size,
                                 doc_mtime=mtime, source=src.url, locations=src.tensor_locations(),
                                 written=None if stream is None else stream.add)
                if leaf_tables is not None and out_store is None:
                    leaf_tables(store, prefix, doc, src.doc_size if src.doc_size is not None else size, mtime)
                if not was_loaded:
                    src.release()  # bound memory: one document at a time
        written.append(f"{store.url.rstrip('/')}/{key}")
        if show is not None:
            show.update()
        elif callable(progress):
            progress(i + 1, len(sources), src.url)


class _RunCompaction:
    """The run's ``_compact.parquet`` streamed from the tables as they are built, so that
    :func:`build_index` need not read its index files back: kept only when those tables are
    all of the run's files, added in the order readers list them (else :func:`compact_index`
    reads the files, as it always did)."""

    def __init__(self, store: Store, run: str):
        self.store, self.run = store, run
        self.part = f"run={partition_value(run)}/"
        self.keys: list = []
        self.writer = CompactWriter(store, run_compact_key(run))

    @classmethod
    def start(cls, store: Any, run: Optional[str]) -> Optional["_RunCompaction"]:
        return cls(store, run) if run and isinstance(store, Store) else None

    def _files(self) -> list:
        return [key for key in self.store.list_prefix(self.part)
                if key.endswith(".parquet") and key.rsplit("/", 1)[-1] != COMPACT_FILE]

    def add(self, key: str, table: Any) -> None:
        self.keys.append(key)
        self.writer.add(key, table)

    def finish(self) -> bool:
        """Write the compacted file when it holds exactly the run's files in order; else drop it."""
        if (self.keys and len(set(self.keys)) == len(self.keys) and self.keys == sorted(self.keys, key=partition_order)
                and set(self._files()) == set(self.keys)):
            self.writer.close()
            return True
        self.abort()
        return False

    def abort(self) -> None:
        self.writer.abort()


def _covers(store: ReadableStore, key: str, src: RankSource) -> bool:
    """True while the index at ``key`` still covers ``src``'s document (skip_existing)."""
    try:
        meta = read_index_metadata(store, key)
    except (ValueError, OSError):  # a damaged index (MsprobeError and ArrowInvalid are ValueErrors)
        return False
    if not src.doc_name:
        return True
    size, mtime = doc_stat(src.store, src.doc_key)
    reason = stale_reason(meta, size, mtime, local=bool(getattr(src.store, "exact_mtimes", False)))
    if reason is not None:
        log.info("re-indexing %s: %s", src.url, reason)
    return reason is None
