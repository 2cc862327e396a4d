"""Discovery: the runs under a lake root and the rank directories of each run (directory
listings only)."""
from __future__ import annotations

import json
from typing import Optional

from msprobe.errors import MsprobeError
from msprobe.format.layout import discover
from msprobe.format.protocols import ReadableStore
from msprobe.lake._core import CONFIG_NAMES, LAKE_DIR, cached_store
from msprobe.readers import looks_like_dump

__all__ = ["discover_runs", "discover_run"]


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
