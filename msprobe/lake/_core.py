"""Discovery, index building, compaction, manifest and catalog of a lake root.

Every function that runs as a task of :class:`msprobe.execution.Executor` (``discover_run``,
``build_batch`` with a :class:`BuildJob`, ``compact_group`` with a :class:`CompactJob`...)
takes the root URL and storage options, opens its own store, and returns plain data: it can
run in this process, in a LocalCluster worker or on a remote cluster.
"""
from __future__ import annotations

import io
import json
import os
import time
from dataclasses import dataclass
from typing import Any, Optional

from msprobe.backends import Store, open_store
from msprobe.errors import ConfigError, MsprobeError, StorageNotFoundError, StoragePermissionError, require
from msprobe.format.comm import COMM_PREFIXES
from msprobe.format.documents import CONSTRUCT_JSON, DEBUG_JSON, DUMP_JSON, STACK_JSON
from msprobe.format.layout import MAPPING_CSV, TENSOR_DIR, RankLocation, discover
from msprobe.format.protocols import ReadableStore
from msprobe.index import (
    COMPACT_FILE,
    CompactWriter,
    compact_files,
    doc_stat,
    mtime_of,
    partition_key,
    rank_index_table,
    read_index_metadata,
    table_bytes,
)
from msprobe.readers import Dump, RankSource, looks_like_dump

__all__ = ["discover_runs", "read_catalog", "LAKE_DIR", "INDEX_PREFIX", "MANIFEST_KEY", "CATALOG_JSON",
           "CATALOG_PARQUET", "MANIFEST_COLUMNS"]

#: the lake's own files, by default under the root (``ROOT/_lake``); the keys below are
#: relative to that directory, wherever it is (``lake_dir``)
LAKE_DIR = "_lake"
INDEX_PREFIX = "index"
MANIFEST_KEY = "manifest.parquet"
CATALOG_JSON = "catalog.json"
CATALOG_PARQUET = "catalog.parquet"
CONFIG_NAMES = ("config.json", "msprobe_config.json")

#: one row per indexed rank directory
MANIFEST_COLUMNS = ("run", "run_prefix", "split", "step", "rank", "rank_dir", "prefix", "index_key", "compact_key",
                    "doc", "doc_size", "mtime", "tensor_files", "tensor_bytes", "records", "rows", "nan_rows",
                    "framework", "task", "level", "dialect", "built_at", "comm_calls")


#: record-name prefixes of communication calls (counted per rank directory: a step without any has no graph)
_COMM_NAMES = tuple(prefix + "." for prefix in COMM_PREFIXES)

_STORES: dict = {}


def cached_store(root_url: str, storage_options: Optional[dict], *, write: bool = False) -> Any:
    """The store of ``root_url``, one per process and options (a Dask worker runs many tasks:
    making an S3 client costs more than most of them)."""
    try:
        cache_key = (root_url, json.dumps(storage_options, sort_keys=True, default=repr), write)
    except (TypeError, ValueError):
        cache_key = None
    hit = _STORES.get(cache_key) if cache_key is not None else None
    if hit is not None:
        return hit
    store = open_store(root_url, storage_options, read_only=not write, create=write)
    if cache_key is not None:
        if len(_STORES) > 32:
            _STORES.clear()
        _STORES[cache_key] = store
    return store


# -- where the lake's own files go ---------------------------------------------------------

def default_lake_url(root_url: str) -> str:
    return f"{root_url.rstrip('/')}/{LAKE_DIR}"


def cache_lake_dir(root_url: str) -> str:
    """The local directory that holds the lake files of a root that cannot hold them:
    ``$MSPROBE_LAKE_CACHE`` (else ``$XDG_CACHE_HOME/msprobe-lake``, else
    ``~/.cache/msprobe-lake``) / ``<root's last name>-<hash of the root URL>``."""
    import hashlib
    import re

    base = (os.environ.get("MSPROBE_LAKE_CACHE")
            or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                            "msprobe-lake"))
    tail = re.sub(r"[^A-Za-z0-9._-]+", "_", root_url.rstrip("/").rsplit("/", 1)[-1]).strip("._") or "root"
    return os.path.join(base, f"{tail[:40]}-{hashlib.sha256(root_url.encode('utf-8')).hexdigest()[:16]}")


def write_refused(root_url: str, storage_options: Optional[dict]) -> Optional[str]:
    """None when ``ROOT/_lake/`` can be written (one small object written and deleted), else
    why not (a read-only mount, a directory without write permission, a bucket that refuses
    PUTs...). Other storage errors propagate."""
    import uuid

    try:
        store = cached_store(root_url, storage_options, write=True)
        key = f"{LAKE_DIR}/.msprobe-probe-{uuid.uuid4().hex}"
        store.put(key, b"")
    except StoragePermissionError as exc:
        return str(exc)
    try:
        store.delete(key)
    except MsprobeError:
        pass
    return None


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


# -- discovery ---------------------------------------------------------------------------------

def discover_runs(store: ReadableStore, max_depth: int = 3) -> list:
    """[(run name, run prefix)]: every directory under the root that looks like a dump
    (step<N>/, rank<N>/, proc<pid>/, dump.json...), searched ``max_depth`` levels deep;
    the run name is its path below the root. Names starting with ``_`` or ``.`` are skipped.
    A root that is itself a dump is one run named after the root."""
    names = store.list_dir("")
    if looks_like_dump([name for name in names if not name.startswith(("_", "."))]):
        base = store.url.rstrip("/").rsplit("/", 1)[-1] or "run"
        return [(base, "")]
    out: list = []

    def walk(prefix: str, depth: int) -> None:
        for name in sorted(store.list_dir(prefix)):
            if name.startswith(("_", ".")):
                continue
            path = f"{prefix}/{name}" if prefix else name
            try:
                sub = store.list_dir(path)
            except MsprobeError:
                continue
            if not sub:
                continue
            if looks_like_dump(sub):
                out.append((path, path))
            elif depth > 1:
                walk(path, depth - 1)

    walk("", max_depth)
    return out


def discover_run(root_url: str, storage_options: Optional[dict], run: str, prefix: str) -> dict:
    """Task: the rank directories of one run (directory listings only) and its config file."""
    store = cached_store(root_url, storage_options)
    locs = discover(store, prefix)
    config = None
    names = set(store.list_dir(prefix))
    for config_name in CONFIG_NAMES:
        if config_name in names:
            try:
                obj = json.loads(store.get(f"{prefix}/{config_name}" if prefix else config_name))
                config = obj if isinstance(obj, dict) else None
            except (ValueError, MsprobeError):
                config = None
            break
    if prefix == "":  # the root is the run: the step names are its own
        locs = [loc for loc in locs if not loc.prefix.startswith(LAKE_DIR)]
    return {"run": run, "run_prefix": prefix, "config": config,
            "locs": [(loc.prefix, loc.step, loc.rank_dir, loc.rank, loc.split) for loc in locs]}


def index_key(run: str, step: Optional[int], rank: Optional[int], rank_dir: str, split: Optional[str]) -> str:
    return f"{INDEX_PREFIX}/{partition_key(run, step, rank, rank_dir, split)}"


def compact_key_of(key: str) -> str:
    """The step's compacted file for a rank's index key (``.../step=N/_compact.parquet``)."""
    step_dir = key.rsplit("/", 2)[0]
    return f"{step_dir}/{COMPACT_FILE}"


# -- building -------------------------------------------------------------------------------------

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


# -- manifest and catalog ----------------------------------------------------------------------

def manifest_table(rows: list) -> Any:
    pyarrow = require("pyarrow", "parquet")
    types = {"step": pyarrow.int64(), "rank": pyarrow.int64(), "doc_size": pyarrow.int64(), "mtime": pyarrow.float64(),
             "tensor_files": pyarrow.int64(), "tensor_bytes": pyarrow.int64(), "records": pyarrow.int64(),
             "rows": pyarrow.int64(), "nan_rows": pyarrow.int64(), "built_at": pyarrow.float64(),
             "comm_calls": pyarrow.int64()}
    schema = pyarrow.schema([(column, types.get(column, pyarrow.string())) for column in MANIFEST_COLUMNS])
    return pyarrow.Table.from_pydict({column: [row.get(column) for row in rows] for column in MANIFEST_COLUMNS},
                                     schema=schema)


def write_table(store: Store, key: str, table: Any) -> None:
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    store.put(key, buf.getvalue())


def read_manifest(store: ReadableStore) -> list:
    """The manifest rows ([] when there is none or it cannot be read)."""
    if not store.exists(MANIFEST_KEY):
        return []
    try:
        import pyarrow.parquet as pq

        return pq.read_table(io.BytesIO(store.get(MANIFEST_KEY))).to_pylist()
    except Exception:  # noqa: BLE001 - a damaged manifest is rebuilt from the index files
        return []


def _span(vals: list) -> tuple:
    vals = [value for value in vals if value is not None]
    return (min(vals), max(vals)) if vals else (None, None)


def _iso(seconds: Optional[float]) -> Optional[str]:
    if seconds is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _one(vals: list) -> Any:
    """The single value of a column, or ``"a,b"`` when the ranks disagree; None when unknown."""
    values = sorted({value for value in vals if value is not None}, key=str)
    return None if not values else (values[0] if len(values) == 1 else ",".join(map(str, values)))


def catalog_rows(manifest: list, runs: list, root_url: str) -> list:
    """One dict per run from the manifest rows (``runs``: the discovery results, for configs)."""
    by_run: dict = {}
    for row in manifest:
        by_run.setdefault(row["run"], []).append(row)
    out = []
    for info in runs:
        run = info["run"]
        rows = by_run.get(run, [])
        steps = sorted({row["step"] for row in rows if row["step"] is not None})
        ranks = {(row["rank"], row["rank_dir"]) for row in rows}
        first, last = _span([row.get("mtime") for row in rows])
        doc_bytes = sum(row.get("doc_size") or 0 for row in rows)
        tensor_bytes = sum(row.get("tensor_bytes") or 0 for row in rows)
        cfg = info.get("config")
        derived = {"task": _one([row["task"] for row in rows]), "level": _one([row["level"] for row in rows]),
                   "framework": _one([row["framework"] for row in rows])}
        out.append({
            "run": run, "url": f"{root_url.rstrip('/')}/{info['run_prefix']}" if info["run_prefix"] else root_url,
            "dialect": _one([row["dialect"] for row in rows]), "framework": derived["framework"],
            "task": derived["task"], "level": derived["level"],
            "config": json.dumps(cfg if cfg is not None else derived, sort_keys=True),
            "steps": len(steps), "step_min": steps[0] if steps else None, "step_max": steps[-1] if steps else None,
            "ranks": len(ranks), "rank_dirs": len(rows),
            "splits": _one([row["split"] for row in rows]),
            "records": sum(row.get("records") or 0 for row in rows), "rows": sum(row.get("rows") or 0 for row in rows),
            "nan_rows": sum(row.get("nan_rows") or 0 for row in rows),
            "doc_bytes": doc_bytes, "tensor_files": sum(row.get("tensor_files") or 0 for row in rows),
            "tensor_bytes": tensor_bytes, "bytes": doc_bytes + tensor_bytes,
            "time_start": _iso(first), "time_end": _iso(last),
            "indexed_at": _iso(max((row.get("built_at") or 0 for row in rows), default=0) or None),
        })
    return out


def write_catalog(store: Store, rows: list, root_url: str) -> None:
    pyarrow = require("pyarrow", "parquet")
    doc = {"root": root_url, "written_at": _iso(time.time()), "runs": rows}
    store.put(CATALOG_JSON, json.dumps(doc, indent=1, default=str).encode("utf-8"))
    if rows:
        write_table(store, CATALOG_PARQUET, pyarrow.Table.from_pylist(rows))


def read_catalog(root: Any, storage_options: Optional[dict] = None, lake_dir: Any = None,
                 lake_storage_options: Optional[dict] = None) -> Optional[list]:
    """The runs of the lake's ``catalog.json`` (one small GET), or None when there is none:
    in ``lake_dir``, else ``ROOT/_lake/``, else the cache directory of a read-only root."""
    if lake_dir is not None:
        places = [(os.fspath(lake_dir), lake_storage_options)]
    else:
        try:
            url = cached_store(root, storage_options).url
        except StorageNotFoundError:
            return None
        places = [(default_lake_url(url), storage_options), (cache_lake_dir(url), None)]
    raw = None
    for where, opts in places:
        try:
            raw = cached_store(where, opts).get(CATALOG_JSON)
            break
        except StorageNotFoundError:
            continue
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"{where}/{CATALOG_JSON} is not JSON: {exc}") from None
    runs = doc.get("runs") if isinstance(doc, dict) else None
    if not isinstance(runs, list):
        raise ConfigError(f"{where}/{CATALOG_JSON} has no 'runs' list")
    return runs


def stale_catalog(store: Optional[ReadableStore], rows: list) -> bool:
    """True when ROOT/_lake/catalog.json is missing or says something else about a run (a
    new config.json, a run renamed...): one small GET."""
    if store is None:
        return True
    try:
        doc = json.loads(store.get(CATALOG_JSON))
    except (MsprobeError, ValueError):
        return True

    def comparable(runs: Any) -> list:
        return [{key: value for key, value in run.items() if key != "indexed_at"}
                for run in json.loads(json.dumps(runs, default=str))]

    return comparable(doc.get("runs")) != comparable(rows)
