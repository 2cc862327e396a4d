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
from msprobe.readers._api import looks_like_dump
from msprobe.readers._dump import Dump
from msprobe.readers._source import RankSource

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
                    "framework", "task", "level", "dialect", "built_at")


_STORES: dict = {}


def cached_store(root_url: str, storage_options: Optional[dict], *, write: bool = False) -> Any:
    """The store of ``root_url``, one per process and options (a Dask worker runs many tasks:
    making an S3 client costs more than most of them)."""
    try:
        ck = (root_url, json.dumps(storage_options, sort_keys=True, default=repr), write)
    except (TypeError, ValueError):
        ck = None
    hit = _STORES.get(ck) if ck is not None else None
    if hit is not None:
        return hit
    st = open_store(root_url, storage_options, read_only=not write, create=write)
    if ck is not None:
        if len(_STORES) > 32:
            _STORES.clear()
        _STORES[ck] = st
    return st


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
        st = cached_store(root_url, storage_options, write=True)
        key = f"{LAKE_DIR}/.msprobe-probe-{uuid.uuid4().hex}"
        st.put(key, b"")
    except StoragePermissionError as exc:
        return str(exc)
    try:
        st.delete(key)
    except MsprobeError:
        pass
    return None


def gather_listings(fs: Any, method: str, paths: list) -> list:
    """``fs.<method>(path, detail=True)`` of every path at once on an async fsspec file system
    (``"ls"`` or ``"find"``), its cache dropped first; a path that fails gives its exception.

    fsspec's async file systems offer each method as a coroutine named with a leading underscore
    (``_ls``, ``_find``: their documented async API); they are gathered on the file system's loop."""
    import asyncio

    from fsspec.asyn import sync

    coroutine = getattr(fs, f"_{method}")

    async def gather() -> list:
        return await asyncio.gather(*[coroutine(path, detail=True) for path in paths], return_exceptions=True)

    fs.invalidate_cache()
    return sync(fs.loop, gather)


# -- discovery ---------------------------------------------------------------------------------

def discover_runs(store: ReadableStore, max_depth: int = 3) -> list:
    """[(run name, run prefix)]: every directory under the root that looks like a dump
    (step<N>/, rank<N>/, proc<pid>/, dump.json...), searched ``max_depth`` levels deep;
    the run name is its path below the root. Names starting with ``_`` or ``.`` are skipped.
    A root that is itself a dump is one run named after the root."""
    names = store.list_dir("")
    if looks_like_dump([n for n in names if not n.startswith(("_", "."))]):
        base = store.url.rstrip("/").rsplit("/", 1)[-1] or "run"
        return [(base, "")]
    out: list = []

    def walk(prefix: str, depth: int) -> None:
        for n in sorted(store.list_dir(prefix)):
            if n.startswith(("_", ".")):
                continue
            p = f"{prefix}/{n}" if prefix else n
            try:
                sub = store.list_dir(p)
            except MsprobeError:
                continue
            if not sub:
                continue
            if looks_like_dump(sub):
                out.append((p, p))
            elif depth > 1:
                walk(p, depth - 1)

    walk("", max_depth)
    return out


def discover_run(root_url: str, storage_options: Optional[dict], run: str, prefix: str) -> dict:
    """Task: the rank directories of one run (directory listings only) and its config file."""
    store = cached_store(root_url, storage_options)
    locs = discover(store, prefix)
    config = None
    names = set(store.list_dir(prefix))
    for cn in CONFIG_NAMES:
        if cn in names:
            try:
                obj = json.loads(store.get(f"{prefix}/{cn}" if prefix else cn))
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
    fs, root = getattr(base, "fs", None), getattr(base, "root", None)
    if flat_steps and fs is not None and getattr(fs, "async_impl", False) and not getattr(base, "is_local", False):
        full = [(f"{root}/{st}" if root else st).rstrip("/") for st in flat_steps]
        wanted = set(prefixes)
        for step, f, found in zip(flat_steps, full, gather_listings(fs, "find", full)):
            if isinstance(found, BaseException):
                continue  # listed one by one below
            docs: dict = {}
            for path, info in found.items():
                parts = path[len(f) + 1:].split("/") if path.startswith(f + "/") else []
                if len(parts) == 2 and parts[1] in (DUMP_JSON, DEBUG_JSON):
                    docs.setdefault(f"{step}/{parts[0]}", {})[parts[1]] = (info.get("size"), mtime_of(info))
            for p in wanted:
                if p.rsplit("/", 1)[0] == step:
                    d = docs.get(p, {})
                    name = DUMP_JSON if DUMP_JSON in d else DEBUG_JSON if DEBUG_JSON in d else None
                    out[p] = (name, *d[name]) if name else (None, None, None)
    rest = [p for p in prefixes if p not in out]
    store = Prefetched(base)
    store.prefetch(rest, ())
    for p in rest:
        try:
            names = set(store.list_dir(p))
        except MsprobeError:
            continue
        name = DUMP_JSON if DUMP_JSON in names else DEBUG_JSON if DEBUG_JSON in names else None
        if name is None:
            out[p] = (None, None, None)
            continue
        key = f"{p}/{name}" if p else name
        size, mtime = store.info.get(key) or doc_stat(store, key)
        out[p] = (name, size, mtime)
    return out


def _tensor_bytes(store: ReadableStore, prefix: str) -> tuple:
    """(files, bytes) below the rank's dump_tensor_data/ (one recursive listing)."""
    key = f"{prefix}/{TENSOR_DIR}" if prefix else TENSOR_DIR
    local = store.local_path(key) if getattr(store, "is_local", False) else None
    n = total = 0
    try:
        if local:
            if not os.path.isdir(local):
                return 0, 0
            for dirpath, _, files in os.walk(local):
                for f in files:
                    try:
                        total += os.stat(os.path.join(dirpath, f)).st_size
                        n += 1
                    except OSError:
                        pass
            return n, total
        fs, root = getattr(store, "fs", None), getattr(store, "root", None)
        if fs is None:
            return 0, 0
        found = fs.find(f"{root}/{key}" if root else key, detail=True)
        return len(found), sum(int(v.get("size") or 0) for v in found.values())
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
        v = self._data.pop(key, None)
        return v if v is not None else self._s.get(key)

    def list_dir(self, prefix: str = "") -> list:
        v = self._dirs.get(prefix.strip("/"))
        return list(v) if v is not None else self._s.list_dir(prefix)

    def prefetch(self, prefixes: list, names: tuple) -> None:
        """List each rank directory (with sizes and times) and read its ``names`` that exist."""
        fs, root = getattr(self._s, "fs", None), getattr(self._s, "root", None)
        if getattr(self._s, "is_local", False) or fs is None or not getattr(fs, "async_impl", False):
            for p in prefixes:
                local = self._s.local_path(p) if getattr(self._s, "is_local", False) else None
                if local is None:
                    return
                try:
                    with os.scandir(local) as it:
                        entries = list(it)
                except OSError:
                    continue
                self._dirs[p] = sorted(e.name for e in entries if not e.name.startswith(".msprobe-tmp"))
                for e in entries:
                    try:
                        st = e.stat()
                        self.info[f"{p}/{e.name}" if p else e.name] = (st.st_size, st.st_mtime)
                    except OSError:
                        pass
            return
        full = {p: (f"{root}/{p}" if root else p).rstrip("/") for p in prefixes}
        listed = gather_listings(fs, "ls", [full[p] for p in prefixes])
        want = {}
        for p, entries in zip(prefixes, listed):
            if isinstance(entries, BaseException):
                continue
            kids = []
            for e in entries:
                name = e["name"].rstrip("/").rsplit("/", 1)[-1]
                kids.append(name)
                key = f"{p}/{name}" if p else name
                mt = e.get("LastModified") or e.get("mtime")
                mt = mt.timestamp() if hasattr(mt, "timestamp") else mt
                self.info[key] = (e.get("size"), float(mt) if isinstance(mt, (int, float)) else None)
                if name in names and e.get("type") == "file":
                    want[f"{full[p]}/{name}"] = key
            self._dirs[p] = sorted(set(kids))
        if want:
            got = fs.cat(list(want), on_error="omit")
            for path, data in got.items():
                k = want.get(path) or want.get(path.split("://", 1)[-1])
                if k is not None and isinstance(data, bytes):
                    self._data[k] = data


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
    cw = CompactWriter(out_store, compact_key) if compact_key else None
    rows = []
    from concurrent.futures import ThreadPoolExecutor

    # index files are written concurrently (object stores: latency-bound PUTs); at most 8 in flight
    pool = ThreadPoolExecutor(max_workers=1 if getattr(out_store, "is_local", False) else 8)
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
            hn, hi = table.column("has_nan"), table.column("has_inf")
            n_rows = table.num_rows - hn.null_count  # the record-only placeholder rows have no statistics
            nan_rows = pc.sum(pc.or_(hn, hi).cast("int64")).as_py() or 0
            if cw is not None:
                cw.add(key, table)
            del table
            files, tbytes = _tensor_bytes(store, prefix) if doc.task == "tensor" else (0, 0)
            rows.append({
                "run": run, "run_prefix": run_prefix, "split": split, "step": step, "rank": rank,
                "rank_dir": rank_dir, "prefix": prefix, "index_key": key, "compact_key": compact_key,
                "doc": doc_name, "doc_size": src.doc_size if src.doc_size is not None else size,
                "mtime": mtime, "tensor_files": files, "tensor_bytes": tbytes, "records": len(data),
                "rows": n_rows, "nan_rows": nan_rows, "framework": doc.framework, "task": doc.task,
                "level": doc.level, "dialect": dialect, "built_at": time.time(),
            })
            src.release()  # one document in memory at a time
        for f in puts:
            f.result()
        if cw is not None:
            cw.close()
            cw = None
    finally:
        pool.shutdown(wait=True)
        if cw is not None:
            cw.abort()
    return rows


def _manifest_row_from_index(lake_url: str, lake_options: Optional[dict], run: str, run_prefix: str,
                             loc: tuple) -> Optional[dict]:
    """A manifest row rebuilt from an existing index file's metadata (a lost or partial manifest)."""
    prefix, step, rank_dir, rank, split = loc
    store = cached_store(lake_url, lake_options)
    key = index_key(run, step, rank, rank_dir, split)
    try:
        m = read_index_metadata(store, key)
    except MsprobeError:
        return None
    return {"run": run, "run_prefix": run_prefix, "split": split, "step": step, "rank": rank, "rank_dir": rank_dir,
            "prefix": prefix, "index_key": key, "compact_key": None, "doc": m.get("doc"), "doc_size": m.get("doc_size"),
            "mtime": m.get("doc_mtime"), "tensor_files": None, "tensor_bytes": None, "records": m.get("records"),
            "rows": None, "nan_rows": None, "framework": m.get("framework"), "task": m.get("task"), "level": m.get("level"),
            "dialect": m.get("dialect"), "built_at": None}


def rebuild_rows(lake_url: str, lake_options: Optional[dict], items: list) -> list:
    """Task: manifest rows from the metadata of existing index files ([(run, run_prefix, loc)])."""
    out = []
    for run, run_prefix, loc in items:
        r = _manifest_row_from_index(lake_url, lake_options, run, run_prefix, loc)
        if r is not None:
            out.append(r)
    return out


def compact_group(job: CompactJob) -> str:
    """Task: stream the index files of one step of one run into its compacted file, with the
    readers' ``covers`` metadata; memory holds one input file and one output row group."""
    return compact_files(cached_store(job.lake_url, job.lake_options, write=True), job.ckey, job.keys)


# -- manifest and catalog ----------------------------------------------------------------------

def manifest_table(rows: list) -> Any:
    pa = require("pyarrow", "parquet")
    types = {"step": pa.int64(), "rank": pa.int64(), "doc_size": pa.int64(), "mtime": pa.float64(),
             "tensor_files": pa.int64(), "tensor_bytes": pa.int64(), "records": pa.int64(), "rows": pa.int64(),
             "nan_rows": pa.int64(), "built_at": pa.float64()}
    schema = pa.schema([(c, types.get(c, pa.string())) for c in MANIFEST_COLUMNS])
    return pa.Table.from_pydict({c: [r.get(c) for r in rows] for c in MANIFEST_COLUMNS}, schema=schema)


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
    vals = [v for v in vals if v is not None]
    return (min(vals), max(vals)) if vals else (None, None)


def _iso(t: Optional[float]) -> Optional[str]:
    if t is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _one(vals: list) -> Any:
    """The single value of a column, or ``"a,b"`` when the ranks disagree; None when unknown."""
    s = sorted({v for v in vals if v is not None}, key=str)
    return None if not s else (s[0] if len(s) == 1 else ",".join(map(str, s)))


def catalog_rows(manifest: list, runs: list, root_url: str) -> list:
    """One dict per run from the manifest rows (``runs``: the discovery results, for configs)."""
    by_run: dict = {}
    for r in manifest:
        by_run.setdefault(r["run"], []).append(r)
    out = []
    for info in runs:
        run = info["run"]
        rows = by_run.get(run, [])
        steps = sorted({r["step"] for r in rows if r["step"] is not None})
        ranks = {(r["rank"], r["rank_dir"]) for r in rows}
        t0, t1 = _span([r.get("mtime") for r in rows])
        doc_bytes = sum(r.get("doc_size") or 0 for r in rows)
        tensor_bytes = sum(r.get("tensor_bytes") or 0 for r in rows)
        cfg = info.get("config")
        derived = {"task": _one([r["task"] for r in rows]), "level": _one([r["level"] for r in rows]),
                   "framework": _one([r["framework"] for r in rows])}
        out.append({
            "run": run, "url": f"{root_url.rstrip('/')}/{info['run_prefix']}" if info["run_prefix"] else root_url,
            "dialect": _one([r["dialect"] for r in rows]), "framework": derived["framework"],
            "task": derived["task"], "level": derived["level"],
            "config": json.dumps(cfg if cfg is not None else derived, sort_keys=True),
            "steps": len(steps), "step_min": steps[0] if steps else None, "step_max": steps[-1] if steps else None,
            "ranks": len(ranks), "rank_dirs": len(rows),
            "splits": _one([r["split"] for r in rows]),
            "records": sum(r.get("records") or 0 for r in rows), "rows": sum(r.get("rows") or 0 for r in rows),
            "nan_rows": sum(r.get("nan_rows") or 0 for r in rows),
            "doc_bytes": doc_bytes, "tensor_files": sum(r.get("tensor_files") or 0 for r in rows),
            "tensor_bytes": tensor_bytes, "bytes": doc_bytes + tensor_bytes,
            "time_start": _iso(t0), "time_end": _iso(t1),
            "indexed_at": _iso(max((r.get("built_at") or 0 for r in rows), default=0) or None),
        })
    return out


def write_catalog(store: Store, rows: list, root_url: str) -> None:
    pa = require("pyarrow", "parquet")
    doc = {"root": root_url, "written_at": _iso(time.time()), "runs": rows}
    store.put(CATALOG_JSON, json.dumps(doc, indent=1, default=str).encode("utf-8"))
    if rows:
        write_table(store, CATALOG_PARQUET, pa.Table.from_pylist(rows))


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
