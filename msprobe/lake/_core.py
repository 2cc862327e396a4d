"""Discovery, index building, compaction, manifest and catalog of a lake root.

Every function that runs as a Dask task (``_discover_run``, ``_build_batch``,
``_compact_group``) takes the root URL and storage options, opens its own store, and
returns plain data: it can run in this process, in a LocalCluster worker or on a
remote cluster.
"""
from __future__ import annotations

import io
import json
import os
import tempfile
import time
from typing import Any, Optional

from msprobe.errors import ConfigError, MsprobeError, StorageNotFoundError, require

__all__ = ["discover_runs", "read_catalog", "LAKE_DIR", "INDEX_PREFIX", "MANIFEST_KEY", "CATALOG_JSON",
           "CATALOG_PARQUET", "MANIFEST_COLUMNS"]

LAKE_DIR = "_lake"
INDEX_PREFIX = f"{LAKE_DIR}/index"
MANIFEST_KEY = f"{LAKE_DIR}/manifest.parquet"
CATALOG_JSON = f"{LAKE_DIR}/catalog.json"
CATALOG_PARQUET = f"{LAKE_DIR}/catalog.parquet"
CONFIG_NAMES = ("config.json", "msprobe_config.json")

#: one row per indexed rank directory
MANIFEST_COLUMNS = ("run", "run_prefix", "split", "step", "rank", "rank_dir", "prefix", "index_key", "compact_key",
                    "doc", "doc_size", "mtime", "tensor_files", "tensor_bytes", "records", "rows", "nan_rows",
                    "framework", "task", "level", "dialect", "built_at")


def _store(root_url: str, storage_options: Optional[dict], *, write: bool = False) -> Any:
    from msprobe.backends import open_store

    return open_store(root_url, storage_options, read_only=not write, create=write)


# -- discovery ---------------------------------------------------------------------------------

def discover_runs(store: Any, max_depth: int = 3) -> list:
    """[(run name, run prefix)]: every directory under the root that looks like a dump
    (step<N>/, rank<N>/, proc<pid>/, dump.json...), searched ``max_depth`` levels deep;
    the run name is its path below the root. Names starting with ``_`` or ``.`` are skipped.
    A root that is itself a dump is one run named after the root."""
    from msprobe.readers._api import _looks_like_dump

    names = store.list_dir("")
    if _looks_like_dump([n for n in names if not n.startswith(("_", "."))]):
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
            if _looks_like_dump(sub):
                out.append((p, p))
            elif depth > 1:
                walk(p, depth - 1)

    walk("", max_depth)
    return out


def _discover_run(root_url: str, storage_options: Optional[dict], run: str, prefix: str) -> dict:
    """Task: the rank directories of one run (directory listings only) and its config file."""
    from msprobe.format.validate import discover

    store = _store(root_url, storage_options)
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
    from msprobe.readers.index import partition_key

    return f"{INDEX_PREFIX}/{partition_key(run, step, rank, rank_dir, split)}"


def compact_key_of(key: str) -> str:
    """The step's compacted file for a rank's index key (``.../step=N/_compact.parquet``)."""
    from msprobe.readers.index import COMPACT_FILE

    step_dir = key.rsplit("/", 2)[0]
    return f"{step_dir}/{COMPACT_FILE}"


# -- building -------------------------------------------------------------------------------------

def _stat(store: Any, key: str) -> tuple:
    """(size, mtime) of a key, (None, None) when unknown."""
    local = store.local_path(key) if getattr(store, "is_local", False) else None
    try:
        if local:
            st = os.stat(local)
            return st.st_size, st.st_mtime
        fs, root = getattr(store, "fs", None), getattr(store, "root", None)
        if fs is None:
            return store.size(key), None
        info = fs.info(f"{root}/{key}" if root else key)
        mt = info.get("LastModified") or info.get("mtime") or info.get("created")
        if hasattr(mt, "timestamp"):
            mt = mt.timestamp()
        return info.get("size"), (float(mt) if isinstance(mt, (int, float)) else None)
    except (OSError, MsprobeError, KeyError):
        return None, None


def _tensor_bytes(store: Any, prefix: str) -> tuple:
    """(files, bytes) below the rank's dump_tensor_data/ (one recursive listing)."""
    from msprobe.format.layout import TENSOR_DIR

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


def _build_batch(root_url: str, storage_options: Optional[dict], run: str, run_prefix: str, locs: list,
                 known_sizes: Optional[dict] = None) -> list:
    """Task: write the index of each rank directory in ``locs`` (prefix, step, rank_dir, rank,
    split) to ``_lake/index/...``; returns one manifest row per rank directory.

    ``known_sizes``: {prefix: doc size} of ranks already indexed; a rank whose document still
    has that size is not rebuilt (its row comes back with ``unchanged=True``)."""
    from msprobe.format.validate import RankLocation
    from msprobe.readers._dump import Dump
    from msprobe.readers._source import RankSource
    import pyarrow.compute as pc

    from msprobe.readers.index import _table_bytes, rank_index_table

    store = _store(root_url, storage_options)
    out_store = _store(root_url, storage_options, write=True)
    rows = []
    for prefix, step, rank_dir, rank, split in locs:
        src = RankSource(store, RankLocation(prefix, step, rank_dir, rank, split), run=run)
        dump = Dump(store, [src], engine="msprobe", url=root_url, storage_options=storage_options, run=run)
        key = index_key(run, step, rank, rank_dir, split)
        doc_name = src.doc_name
        size, mtime = _stat(store, src.doc_key) if doc_name else (None, None)
        if known_sizes is not None and prefix in known_sizes and known_sizes[prefix] == size:
            rows.append({"prefix": prefix, "unchanged": True})
            continue
        try:
            doc = src.document()
        except StorageNotFoundError:
            continue  # the rank directory went away
        try:
            dialect = dump.dialect_of(src)
        except MsprobeError:
            dialect = None
        table = rank_index_table(doc, step=step, rank=rank, rank_dir=rank_dir, split=split, run=run,
                                 stack=src.stack(), construct=src.construct(),
                                 mapping=src.mapping() if src._has_mapping() else None,  # noqa: SLF001
                                 source=src.url, dialect=dialect, doc_name=doc_name or "dump.json",
                                 doc_size=src._doc_size)  # noqa: SLF001
        out_store.put(key, _table_bytes(table))
        data = doc.data
        hn, hi = table.column("has_nan"), table.column("has_inf")
        n_rows = table.num_rows - hn.null_count  # the record-only placeholder rows have no statistics
        nan_rows = pc.sum(pc.or_(hn, hi).cast("int64")).as_py() or 0
        del table
        files, tbytes = _tensor_bytes(store, prefix) if doc.task == "tensor" else (0, 0)
        rows.append({
            "run": run, "run_prefix": run_prefix, "split": split, "step": step, "rank": rank, "rank_dir": rank_dir,
            "prefix": prefix, "index_key": key, "compact_key": None, "doc": doc_name,
            "doc_size": src._doc_size if src._doc_size is not None else size,  # noqa: SLF001
            "mtime": mtime, "tensor_files": files, "tensor_bytes": tbytes, "records": len(data), "rows": n_rows,
            "nan_rows": nan_rows, "framework": doc.framework, "task": doc.task, "level": doc.level,
            "dialect": dialect, "built_at": time.time(),
        })
        src._reset()  # noqa: SLF001 - one document in memory at a time
    return rows


def _manifest_row_from_index(root_url: str, storage_options: Optional[dict], run: str, run_prefix: str,
                             loc: tuple) -> Optional[dict]:
    """A manifest row rebuilt from an existing index file's metadata (a lost or partial manifest)."""
    from msprobe.readers.index import read_index_metadata

    prefix, step, rank_dir, rank, split = loc
    store = _store(root_url, storage_options)
    key = index_key(run, step, rank, rank_dir, split)
    try:
        m = read_index_metadata(store, key)
    except MsprobeError:
        return None
    return {"run": run, "run_prefix": run_prefix, "split": split, "step": step, "rank": rank, "rank_dir": rank_dir,
            "prefix": prefix, "index_key": key, "compact_key": None, "doc": m.get("doc"), "doc_size": m.get("doc_size"),
            "mtime": None, "tensor_files": None, "tensor_bytes": None, "records": m.get("records"), "rows": None,
            "nan_rows": None, "framework": m.get("framework"), "task": m.get("task"), "level": m.get("level"),
            "dialect": m.get("dialect"), "built_at": None}


def _rebuild_rows(root_url: str, storage_options: Optional[dict], items: list) -> list:
    """Task: manifest rows from the metadata of existing index files ([(run, run_prefix, loc)])."""
    out = []
    for run, run_prefix, loc in items:
        r = _manifest_row_from_index(root_url, storage_options, run, run_prefix, loc)
        if r is not None:
            out.append(r)
    return out


def _compact_group(root_url: str, storage_options: Optional[dict], ckey: str, keys: list, records: int) -> str:
    """Task: stream the index files ``keys`` (one step of one run) into ``ckey``, with the
    readers' ``covers`` metadata; memory holds one input file and one output row group."""
    pa = require("pyarrow", "parquet")
    import pyarrow.parquet as pq

    from msprobe.readers._rows import arrow_schema
    from msprobe.readers.index import COMPACT_FILE, INDEX_VERSION, META_PREFIX

    from msprobe import FORMAT_VERSION

    store = _store(root_url, storage_options, write=True)
    base = ckey[: -len(COMPACT_FILE)]
    meta = {META_PREFIX + "index_version": INDEX_VERSION, META_PREFIX + "format_version": FORMAT_VERSION,
            META_PREFIX + "covers": json.dumps([k[len(base):] for k in keys]),
            META_PREFIX + "records": str(records)}
    schema = arrow_schema().with_metadata(meta)
    fd, tmp = tempfile.mkstemp(suffix=".parquet", prefix=".msprobe-compact-")
    os.close(fd)
    try:
        pending: list = []
        n = 0
        with pq.ParquetWriter(tmp, schema, compression="zstd", write_statistics=True) as w:
            for k in keys:
                t = pq.read_table(io.BytesIO(store.get(k))).replace_schema_metadata(None).cast(arrow_schema())
                pending.append(t)
                n += t.num_rows
                if n >= 1 << 16:
                    w.write_table(pa.concat_tables(pending).replace_schema_metadata(meta), row_group_size=1 << 17)
                    pending, n = [], 0
            if pending:
                w.write_table(pa.concat_tables(pending).replace_schema_metadata(meta), row_group_size=1 << 17)
        with open(tmp, "rb") as f:
            store.put_stream(ckey, f)
    finally:
        try:
            os.remove(tmp)
        except OSError:
            pass
    return ckey


# -- manifest and catalog ----------------------------------------------------------------------

def manifest_table(rows: list) -> Any:
    pa = require("pyarrow", "parquet")
    types = {"step": pa.int64(), "rank": pa.int64(), "doc_size": pa.int64(), "mtime": pa.float64(),
             "tensor_files": pa.int64(), "tensor_bytes": pa.int64(), "records": pa.int64(), "rows": pa.int64(),
             "nan_rows": pa.int64(), "built_at": pa.float64()}
    schema = pa.schema([(c, types.get(c, pa.string())) for c in MANIFEST_COLUMNS])
    return pa.Table.from_pydict({c: [r.get(c) for r in rows] for c in MANIFEST_COLUMNS}, schema=schema)


def write_table(store: Any, key: str, table: Any) -> None:
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    store.put(key, buf.getvalue())


def read_manifest(store: Any) -> list:
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


def write_catalog(store: Any, rows: list, root_url: str) -> None:
    pa = require("pyarrow", "parquet")
    doc = {"root": root_url, "written_at": _iso(time.time()), "runs": rows}
    store.put(CATALOG_JSON, json.dumps(doc, indent=1, default=str).encode("utf-8"))
    if rows:
        write_table(store, CATALOG_PARQUET, pa.Table.from_pylist(rows))


def read_catalog(root: Any, storage_options: Optional[dict] = None) -> Optional[list]:
    """The runs of ``ROOT/_lake/catalog.json`` (one small GET), or None when there is none."""
    try:
        store = _store(root, storage_options)
        raw = store.get(CATALOG_JSON)
    except StorageNotFoundError:
        return None
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"{CATALOG_JSON} under {root} is not JSON: {exc}") from None
    runs = doc.get("runs") if isinstance(doc, dict) else None
    if not isinstance(runs, list):
        raise ConfigError(f"{CATALOG_JSON} under {root} has no 'runs' list")
    return runs
