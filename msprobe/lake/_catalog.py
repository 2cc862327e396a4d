"""The manifest (one row per indexed rank directory) and the run catalog (one row per run):
built, written and read."""
from __future__ import annotations

import io
import json
import os
import time
from typing import Any, Optional

from msprobe.backends import Store
from msprobe.errors import ConfigError, MsprobeError, StorageNotFoundError, require
from msprobe.format.protocols import ReadableStore
from msprobe.lake._core import CATALOG_JSON, CATALOG_PARQUET, MANIFEST_COLUMNS, MANIFEST_KEY, cached_store
from msprobe.lake._place import cache_lake_dir, default_lake_url

__all__ = ["manifest_table", "write_table", "read_manifest", "catalog_rows", "write_catalog", "read_catalog",
           "stale_catalog"]


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
