"""Index building and compaction: each rank directory's index file (its documents prefetched in
one round of requests on an object store), its manifest row, and each step's compacted file."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

from msprobe.errors import MsprobeError, StorageNotFoundError
from msprobe.format.documents import CONSTRUCT_JSON, DEBUG_JSON, DUMP_JSON, STACK_JSON
from msprobe.format.gcpause import gc_paused
from msprobe.format.layout import MAPPING_CSV, TENSOR_DIR, RankLocation
from msprobe.format.protocols import ReadableStore
from msprobe.index import (
    CompactWriter,
    compact_files,
    doc_stat,
    mtime_of,
    rank_index_table,
    read_index_metadata,
    table_bytes,
)
from msprobe.lake._core import _COMM_NAMES, cached_store, index_key
from msprobe.readers import Dump, RankSource

__all__ = ["doc_stats", "Prefetched", "BuildJob", "CompactJob", "build_batch", "rebuild_rows", "compact_group",
           "gather_listings"]


def gather_listings(filesystem: Any, method: str, paths: list) -> list:
    """``fs.<method>(path, detail=True)`` of every path at once on an async fsspec file system
    (``"ls"`` or ``"find"``), its cache dropped first; a path that fails gives its exception.

    fsspec's async file systems offer each method as a coroutine named with a leading underscore
    (``_ls``, ``_find``: their documented async API); they are gathered on the file system's loop."""
    import asyncio

    from fsspec.asyn import sync

    coroutine = getattr(filesystem, f"_{method}")

    async def gather() -> list:
        return await asyncio.gather(*[coroutine(path, detail=True) for path in paths], return_exceptions=True)

    filesystem.invalidate_cache()
    return sync(filesystem.loop, gather)


def doc_stats(root_url: str, storage_options: Optional[dict], prefixes: list, flat_steps: tuple = ()) -> dict:
    """Task: {rank prefix: (document name, size, mtime)} of each rank directory's dump.json
    (or debug.json), from one listing per directory (concurrent on object stores): what an
    open compares with what each index covers. ``flat_steps``: step prefixes whose rank
    directories hold few files (statistics dumps): on an object store they are listed with
    one recursive listing each (a page per 1,000 keys instead of a request per rank dir)."""
    base = cached_store(root_url, storage_options)
    out: dict = {}
    filesystem, root = base.fsspec_location("") or (None, None)
    listable = filesystem is not None and getattr(filesystem, "async_impl", False)
    if flat_steps and listable:
        full = [(f"{root}/{step_prefix}" if root else step_prefix).rstrip("/") for step_prefix in flat_steps]
        wanted = set(prefixes)
        for step, step_root, found in zip(flat_steps, full, gather_listings(filesystem, "find", full)):
            if isinstance(found, BaseException):
                continue  # listed one by one below
            docs: dict = {}
            for path, info in found.items():
                parts = path[len(step_root) + 1:].split("/") if path.startswith(step_root + "/") else []
                if len(parts) == 2 and parts[1] in (DUMP_JSON, DEBUG_JSON):
                    docs.setdefault(f"{step}/{parts[0]}", {})[parts[1]] = (info.get("size"), mtime_of(info))
            for prefix in wanted:
                if prefix.rsplit("/", 1)[0] == step:
                    found_docs = docs.get(prefix, {})
                    name = DUMP_JSON if DUMP_JSON in found_docs else DEBUG_JSON if DEBUG_JSON in found_docs else None
                    out[prefix] = (name, *found_docs[name]) if name else (None, None, None)
    rest = [prefix for prefix in prefixes if prefix not in out]
    store = Prefetched(base)
    store.prefetch(rest, ())
    for prefix in rest:
        try:
            names = set(store.list_dir(prefix))
        except MsprobeError:
            continue
        name = DUMP_JSON if DUMP_JSON in names else DEBUG_JSON if DEBUG_JSON in names else None
        if name is None:
            out[prefix] = (None, None, None)
            continue
        key = f"{prefix}/{name}" if prefix else name
        size, mtime = store.info.get(key) or doc_stat(store, key)
        out[prefix] = (name, size, mtime)
    return out


def _tensor_bytes(store: ReadableStore, prefix: str) -> tuple:
    """(files, bytes) below the rank's dump_tensor_data/ (one recursive listing)."""
    key = f"{prefix}/{TENSOR_DIR}" if prefix else TENSOR_DIR
    try:
        return store.disk_usage(key)
    except (OSError, MsprobeError):
        return 0, 0


class Prefetched:
    """A store whose listings and small documents for a batch of rank directories were
    fetched concurrently up front (one round of requests instead of one per file on an
    object store); everything else goes to the wrapped store."""

    def __init__(self, store: ReadableStore):
        self._s = store
        self._data: dict = {}
        self._dirs: dict = {}
        self.info: dict = {}  # key -> (size, mtime) from the listings

    def __getattr__(self, name: str) -> Any:
        return getattr(self._s, name)

    def get(self, key: str) -> bytes:
        value = self._data.pop(key, None)
        return value if value is not None else self._s.get(key)

    def list_dir(self, prefix: str = "") -> list:
        value = self._dirs.get(prefix.strip("/"))
        return list(value) if value is not None else self._s.list_dir(prefix)

    def prefetch(self, prefixes: list, names: tuple) -> None:
        """List each rank directory (with sizes and times) and read its ``names`` that exist."""
        filesystem, root = self._s.fsspec_location("") or (None, None)
        if filesystem is None or not getattr(filesystem, "async_impl", False):
            for prefix in prefixes:
                try:
                    entries = self._s.list_dir_stats(prefix)
                except OSError:
                    continue
                if entries is None:
                    return  # no such listing: read one by one
                self._dirs[prefix] = sorted(name for name in entries if not name.startswith(".msprobe-tmp"))
                for name, stat in entries.items():
                    if stat is not None:
                        self.info[f"{prefix}/{name}" if prefix else name] = stat
            return
        full = {prefix: (f"{root}/{prefix}" if root else prefix).rstrip("/") for prefix in prefixes}
        listed = gather_listings(filesystem, "ls", list(map(full.get, prefixes)))
        want = []
        for prefix, entries in zip(prefixes, listed):
            if isinstance(entries, BaseException):
                continue
            kids = []
            for entry in entries:
                name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
                kids.append(name)
                key = f"{prefix}/{name}" if prefix else name
                modified = entry.get("LastModified") or entry.get("mtime")
                modified = modified.timestamp() if hasattr(modified, "timestamp") else modified
                self.info[key] = (entry.get("size"), float(modified) if isinstance(modified, (int, float)) else None)
                if name in names and entry.get("type") == "file":
                    want.append(key)
            self._dirs[prefix] = sorted(set(kids))
        if want:
            self._data.update(self._s.get_many(want))


@dataclass(frozen=True)
class BuildJob:
    """What one index-building task does (:func:`build_batch`): the rank directories ``locs``
    ((prefix, step, rank_dir, rank, split) each) of run ``run`` under the root, indexed into the
    lake directory; with ``compact_key`` they are every rank of one step, streamed into that
    step's ``_compact.parquet`` as they are built."""

    root_url: str
    storage_options: Optional[dict]
    lake_url: str
    lake_options: Optional[dict]
    run: str
    run_prefix: str
    locs: list
    compact_key: Optional[str] = None


@dataclass(frozen=True)
class CompactJob:
    """One step's compaction (:func:`compact_group`): the index files ``keys`` into ``ckey``."""

    lake_url: str
    lake_options: Optional[dict]
    ckey: str
    keys: list


def build_batch(job: BuildJob) -> list:
    """Task: write the index of each rank directory of ``job.locs`` to ``index/...`` of the
    lake directory; returns one manifest row per rank directory (no second pass over the
    files for the step's compaction when ``job.compact_key`` is set)."""
    root_url, storage_options, lake_url, lake_options = (job.root_url, job.storage_options, job.lake_url,
                                                         job.lake_options)
    run, run_prefix, locs, compact_key = job.run, job.run_prefix, job.locs, job.compact_key
    import pyarrow.compute as pc

    store = Prefetched(cached_store(root_url, storage_options))
    store.prefetch([loc[0] for loc in locs], (DUMP_JSON, DEBUG_JSON, STACK_JSON, CONSTRUCT_JSON))
    out_store = cached_store(lake_url, lake_options, write=True)
    compact_writer = CompactWriter(out_store, compact_key) if compact_key else None
    rows = []
    from concurrent.futures import ThreadPoolExecutor

    # index files are written concurrently (object stores: latency-bound PUTs); at most 8 in flight
    pool = ThreadPoolExecutor(max_workers=1 if out_store.cheap_requests else 8)
    puts: list = []
    try:
        for prefix, step, rank_dir, rank, split in locs:
            with gc_paused():  # a parsed document holds no cycle: no collection while it is indexed
                src = RankSource(store, RankLocation(prefix, step, rank_dir, rank, split), run=run)
                dump = Dump(store, [src], engine="msprobe", url=root_url, storage_options=storage_options, run=run)
                key = index_key(run, step, rank, rank_dir, split)
                doc_name = src.doc_name
                size, mtime = (store.info.get(src.doc_key) or doc_stat(store, src.doc_key)) if doc_name else (None, None)
                try:
                    doc = src.document()
                except StorageNotFoundError:
                    continue  # the rank directory went away
                try:
                    dialect = dump.dialect_of(src)
                except MsprobeError:
                    dialect = None
                names = src.names()
                has_map = (TENSOR_DIR in names or MAPPING_CSV in names) and src.has_mapping()
                table = rank_index_table(doc, step=step, rank=rank, rank_dir=rank_dir, split=split, run=run,
                                         stack=src.stack(), construct=src.construct(),
                                         mapping=src.mapping() if has_map else None,
                                         source=src.url, dialect=dialect, doc_name=doc_name or "dump.json",
                                         doc_size=src.doc_size if src.doc_size is not None else size,
                                         doc_mtime=mtime)
                puts.append(pool.submit(out_store.put, key, table_bytes(table)))
                if len(puts) > 16:
                    puts.pop(0).result()
                data = doc.data
                has_nan, has_inf = table.column("has_nan"), table.column("has_inf")
                n_rows = table.num_rows - has_nan.null_count  # the record-only placeholder rows have no statistics
                nan_rows = pc.sum(pc.or_(has_nan, has_inf).cast("int64")).as_py() or 0
                if compact_writer is not None:
                    compact_writer.add(key, table)
                del table
                files, tbytes = _tensor_bytes(store, prefix) if doc.task == "tensor" else (0, 0)
                rows.append({
                    "run": run, "run_prefix": run_prefix, "split": split, "step": step, "rank": rank,
                    "rank_dir": rank_dir, "prefix": prefix, "index_key": key, "compact_key": compact_key,
                    "doc": doc_name, "doc_size": src.doc_size if src.doc_size is not None else size,
                    "mtime": mtime, "tensor_files": files, "tensor_bytes": tbytes, "records": len(data),
                    "rows": n_rows, "nan_rows": nan_rows, "framework": doc.framework, "task": doc.task,
                    "level": doc.level, "dialect": dialect, "built_at": time.time(),
                    "comm_calls": sum(1 for name in data if name.startswith(_COMM_NAMES)),
                })
                src.release()  # one document in memory at a time
        for future in puts:
            future.result()
        if compact_writer is not None:
            compact_writer.close()
            compact_writer = None
    finally:
        pool.shutdown(wait=True)
        if compact_writer is not None:
            compact_writer.abort()
    return rows


def _manifest_row_from_index(lake_url: str, lake_options: Optional[dict], run: str, run_prefix: str,
                             loc: tuple) -> Optional[dict]:
    """A manifest row rebuilt from an existing index file's metadata (a lost or partial manifest)."""
    prefix, step, rank_dir, rank, split = loc
    store = cached_store(lake_url, lake_options)
    key = index_key(run, step, rank, rank_dir, split)
    try:
        meta = read_index_metadata(store, key)
    except MsprobeError:
        return None
    return {"run": run, "run_prefix": run_prefix, "split": split, "step": step, "rank": rank, "rank_dir": rank_dir,
            "prefix": prefix, "index_key": key, "compact_key": None, "doc": meta.get("doc"),
            "doc_size": meta.get("doc_size"), "mtime": meta.get("doc_mtime"), "tensor_files": None,
            "tensor_bytes": None, "records": meta.get("records"), "rows": None, "nan_rows": None,
            "framework": meta.get("framework"), "task": meta.get("task"), "level": meta.get("level"),
            "dialect": meta.get("dialect"), "built_at": None}


def rebuild_rows(lake_url: str, lake_options: Optional[dict], items: list) -> list:
    """Task: manifest rows from the metadata of existing index files ([(run, run_prefix, loc)])."""
    out = []
    for run, run_prefix, loc in items:
        row = _manifest_row_from_index(lake_url, lake_options, run, run_prefix, loc)
        if row is not None:
            out.append(row)
    return out


def compact_group(job: CompactJob) -> str:
    """Task: stream the index files of one step of one run into its compacted file, with the
    readers' ``covers`` metadata; memory holds one input file and one output row group."""
    return compact_files(cached_store(job.lake_url, job.lake_options, write=True), job.ckey, job.keys)
