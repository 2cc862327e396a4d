"""A lake's names and stores: the directory and keys of its own files (``LAKE_DIR``, the index
keys, the manifest's columns) and the per-process store cache every task opens its stores through.

The lake's jobs live beside it, one per module: where its own files go (:mod:`._place`), discovery
(:mod:`._discover`), index building and compaction (:mod:`._build`), manifest and catalog
(:mod:`._catalog`), refreshing (:mod:`._refresh`), the SQL questions (:mod:`._questions`) and
:func:`diverge` (:mod:`._diverge`, compare over the Executor). Every function
that runs as a task of :class:`msprobe.execution.Executor` (``discover_run``, ``build_batch`` with a
``BuildJob``, ``compact_group`` with a ``CompactJob``...) takes the root URL and storage options,
opens its own store, and returns plain data: it can run in this process, in a LocalCluster worker
or on a remote cluster.
"""
from __future__ import annotations

import json
from typing import Any, Optional

from msprobe.backends import open_store
from msprobe.format.comm import COMM_PREFIXES
from msprobe.index import (
    COMPACT_FILE,
    partition_key,
)

__all__ = ["LAKE_DIR", "INDEX_PREFIX", "MANIFEST_KEY", "CATALOG_JSON", "CATALOG_PARQUET", "MANIFEST_COLUMNS",
           "cached_store", "index_key", "compact_key_of"]

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


def index_key(run: str, step: Optional[int], rank: Optional[int], rank_dir: str, split: Optional[str]) -> str:
    return f"{INDEX_PREFIX}/{partition_key(run, step, rank, rank_dir, split)}"


def compact_key_of(key: str) -> str:
    """The step's compacted file for a rank's index key (``.../step=N/_compact.parquet``)."""
    step_dir = key.rsplit("/", 2)[0]
    return f"{step_dir}/{COMPACT_FILE}"
