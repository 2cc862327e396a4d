"""``open(path, engine=None)``: xarray-style dispatch to a reading engine.

Engines guess cheaply from one directory listing (marker files, directory names,
file suffixes). ``engine`` may be a name from :data:`ENGINES` or an
:class:`Engine` subclass or instance.
"""
from __future__ import annotations

import importlib.util
from typing import Any, Optional

from msprobe.backends import url_path
from msprobe.errors import ConfigError, MissingDependencyError, UnknownDialectError
from msprobe.format.documents import DEBUG_JSON, DUMP_JSON
from msprobe.format.layout import (
    GRAPH_SPLIT_DIRS,
    INDEX_DIR,
    MARKER_FILE,
    TENSOR_DIR,
    RankLocation,
    discover,
    parse_rank_dir,
    parse_step_dir,
)
from msprobe.format.protocols import ReadableStore
from msprobe.index.files import COMPACT_FILE, read_compactions
from msprobe.readers._dump import Dump
from msprobe.readers._kernel import has_kernel_dumps
from msprobe.readers._source import IndexSource, RankSource
from msprobe.readers._store import open_store

__all__ = ["open", "Engine", "MsprobeEngine", "IndexEngine", "ENGINES", "list_engines", "guess_engine", "looks_like_dump"]

_DUMP_MARKERS = {DUMP_JSON, DEBUG_JSON, TENSOR_DIR, MARKER_FILE}


class Engine:
    """A way of reading a dump. Subclasses set ``name`` and implement the two methods."""

    name = "?"
    description = ""
    #: the msprobe-lake extra that installs what the engine imports (None: nothing extra)
    extra: Optional[str] = None
    requires: tuple = ()

    def available(self) -> bool:
        return all(importlib.util.find_spec(m) is not None for m in self.requires)

    def guess_can_open(self, store: ReadableStore, names: list) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def open(self, store: ReadableStore, *, url: str, storage_options: Optional[dict], run: Optional[str]) -> Dump:
        raise NotImplementedError  # pragma: no cover - abstract


def looks_like_dump(names: list) -> bool:
    """Whether the names listed in a directory are those of a dump (a document, a step, rank or split dir)."""
    if _DUMP_MARKERS.intersection(names):
        return True
    if any(parse_step_dir(name) is not None or parse_rank_dir(name) is not None for name in names):
        return True
    return any(name in GRAPH_SPLIT_DIRS for name in names)


def _run_name(url: str) -> str:
    path = url_path(url)
    return path.rsplit("/", 1)[-1] or path or "run"


def _fix_root_location(loc: RankLocation, url: str) -> RankLocation:
    """discover() cannot see the names of the directories above the store root: take them from the URL."""
    parts = url_path(url).split("/")
    last = parts[-1] if parts else ""
    parent = parts[-2] if len(parts) > 1 else ""
    if loc.prefix == "":
        rd = parse_rank_dir(last)
        return RankLocation("", parse_step_dir(parent) if loc.step is None else loc.step,
                            last if rd else (loc.rank_dir if loc.rank_dir != "." else last or "."),
                            rd.rank if rd else loc.rank, loc.split)
    if "/" not in loc.prefix and loc.step is None:
        return RankLocation(loc.prefix, parse_step_dir(last), loc.rank_dir, loc.rank, loc.split)
    return loc


def _rank_sources(store: ReadableStore, url: str, run: Optional[str], prefer_index: bool) -> list:
    locs = [_fix_root_location(loc, url) for loc in discover(store, "")]
    return [RankSource(store, loc, run=run, prefer_index=prefer_index) for loc in locs]


class MsprobeEngine(Engine):
    """dump.json / debug.json layouts of every dialect (ours, msprobe 1.x/8.x/26.x, MindSpore)."""

    name = "msprobe"
    description = "dump.json layouts: stepN/rank|rank<N>|proc<pid>, graph/pynative splits, .pt/.npy/raw tensors"

    def guess_can_open(self, store: ReadableStore, names: list) -> bool:
        return looks_like_dump(names)

    def open(self, store: ReadableStore, *, url: str, storage_options: Optional[dict], run: Optional[str]) -> Dump:
        return _open_rank_dirs(store, url, storage_options, run, prefer_index=False, engine=self.name)


def _open_rank_dirs(store: ReadableStore, url: str, storage_options: Optional[dict], run: Optional[str], *,
                    prefer_index: bool, engine: str) -> Dump:
    sources = _rank_sources(store, url, run, prefer_index)
    if not sources:
        if not has_kernel_dumps(store):  # a level-L2 dump has step dirs but no rank dirs
            raise _unknown(url, store.list_dir(""))
    return Dump(store, sources, engine=engine, url=url, storage_options=storage_options, run=run,
                rediscover=lambda: _rank_sources(store, url, run, prefer_index))


def _parquet_keys(store: ReadableStore) -> list:
    return sorted(key for key in store.list_prefix("") if key.endswith(".parquet"))


def _first_rank_names(store: ReadableStore, names: list) -> list:
    """The listing of the first rank directory under the root (a few list_dir calls)."""
    prefix = ""
    for _ in range(4):
        if _DUMP_MARKERS.intersection(names) or INDEX_DIR in names:
            return names
        nxt = next((name for name in names if parse_step_dir(name) is not None or parse_rank_dir(name) is not None
                    or name in GRAPH_SPLIT_DIRS), None)
        if nxt is None:
            return []
        prefix = f"{prefix}/{nxt}" if prefix else nxt
        names = store.list_dir(prefix)
    return []


class IndexEngine(Engine):
    """The Parquet side index: a dump whose rank directories hold ``index/records.parquet``
    (rank directories without one are read from dump.json), or an index-only lake written
    by ``build_index(..., out=URL)`` (``run=/step=/rank=`` partitions)."""

    name = "index"
    description = "Parquet side index (index/records.parquet, or a run=/step=/rank= lake)"
    extra = "parquet"
    requires = ("pyarrow",)

    def guess_can_open(self, store: ReadableStore, names: list) -> bool:
        if any(name.endswith(".parquet") or name.startswith(("run=", "step=", "split=")) for name in names):
            return True
        if looks_like_dump(names):
            return INDEX_DIR in _first_rank_names(store, names)
        return False

    def open(self, store: ReadableStore, *, url: str, storage_options: Optional[dict], run: Optional[str]) -> Dump:
        names = store.list_dir("")
        if looks_like_dump(names) and not any(name.startswith(("run=", "step=")) for name in names):
            return _open_rank_dirs(store, url, storage_options, run, prefer_index=True, engine=self.name)
        state: dict = {}

        def sources() -> list:
            keys = _parquet_keys(store)
            state["compacts"] = read_compactions(store, keys)
            return [IndexSource(store, key, storage_options=storage_options) for key in keys
                    if key.rsplit("/", 1)[-1] != COMPACT_FILE]

        found = sources()
        if not found:
            raise _unknown(url, names)
        dump = Dump(store, found, engine=self.name, url=url, storage_options=storage_options, run=run,
                    rediscover=sources, refresh_compacts=lambda: state["compacts"])
        dump.compacts = state["compacts"]
        return dump


#: name -> engine, in guessing order
ENGINES: dict = {"index": IndexEngine(), "msprobe": MsprobeEngine()}


def list_engines() -> dict:
    """name -> (description, installed?)."""
    return {name: (engine.description, engine.available()) for name, engine in ENGINES.items()}


def _engine_help() -> str:
    parts = []
    for name, engine in ENGINES.items():
        state = "installed" if engine.available() else f"needs pip install 'msprobe-lake[{engine.extra}]'"
        parts.append(f"{name!r} ({engine.description}; {state})")
    return "; ".join(parts)


def _unknown(url: str, names: list) -> UnknownDialectError:
    shown = ", ".join(sorted(names)[:8]) + (", ..." if len(names) > 8 else "") if names else "nothing"
    return UnknownDialectError(
        f"{url}: no engine can open this (it holds {shown}); expected step<N>/, rank/, rank<N>/, proc<pid>/ "
        f"with dump.json, or a Parquet index. Engines: {_engine_help()}")


def guess_engine(store: ReadableStore, url: str = "") -> "Engine":
    names = store.list_dir("")
    would_match = []
    for engine in ENGINES.values():
        if not engine.available():
            try:
                if engine.guess_can_open(store, names):
                    would_match.append(engine)
            except Exception:  # noqa: BLE001 - a guess must not fail
                pass
            continue
        if engine.guess_can_open(store, names):
            return engine
    if would_match:
        engine = would_match[0]
        raise MissingDependencyError(
            f"{url or store.url}: the {engine.name!r} engine would open this: "
            f"pip install 'msprobe-lake[{engine.extra}]'")
    raise _unknown(url or store.url, names)


def _resolve_engine(engine: Any) -> Optional[Engine]:
    if engine is None:
        return None
    if isinstance(engine, Engine):
        return engine
    if isinstance(engine, type) and issubclass(engine, Engine):
        return engine()
    if isinstance(engine, str) and engine in ENGINES:
        e = ENGINES[engine]
        if not e.available():
            raise MissingDependencyError(f"engine {engine!r} needs pip install 'msprobe-lake[{e.extra}]'")
        return e
    raise ConfigError(f"engine={engine!r}: valid values are {', '.join(ENGINES)} (or an Engine class); "
                      f"engines: {_engine_help()}")


def open(path: Any, engine: Any = None, storage_options: Optional[dict] = None, *,  # noqa: A001 - like xarray's
         run: Optional[str] = None) -> Dump:
    """Open a dump: a dump root, a step directory or a rank directory; a local/NFS path,
    ``file://``, ``memory://``, ``s3://`` (with ``storage_options``) or any fsspec URL;
    or an index-only lake written by :func:`msprobe.readers.index.build_index`.

    ``engine``: None (guess), ``"msprobe"`` (dump.json, all dialects) or ``"index"``
    (answer rows and record digests from the Parquet index where it exists).
    ``run``: the name in the ``run`` column (default: the directory's name).
    Only directory listings happen here; documents and tensors are read on demand.
    """
    if isinstance(path, Dump):
        return path

    store = open_store(path, storage_options, read_only=True, create=False)
    url = store.url
    e = _resolve_engine(engine) or guess_engine(store, url)
    return e.open(store, url=url, storage_options=storage_options, run=run or _run_name(url))
