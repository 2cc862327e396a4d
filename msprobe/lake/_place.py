"""Where a lake's own files go: ``lake_dir`` when given, else ``ROOT/_lake`` when the root can be
written and holds runs, else a local cache directory (:func:`msprobe.lake._core.cache_lake_dir`)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

from msprobe.backends import shares_options
from msprobe.errors import MsprobeError, StorageNotFoundError, StoragePermissionError
from msprobe.format.protocols import ReadableStore
from msprobe.lake import _core

__all__ = ["Placement", "locate", "open_lake_store"]

_CHOOSE = "(choose with --lake-dir / lake_dir=)"


@dataclass(frozen=True)
class Placement:
    """The lake directory ``url`` (with its storage ``options``); ``note``: what to tell the user
    about it (None: nothing); ``fallback``: (cache url, note) to move to when the lake must be
    written, for a read-only root whose ``_lake/`` holds a manifest, read while nothing needs writing."""

    url: str
    options: Optional[dict]
    note: Optional[str] = None
    fallback: Optional[tuple] = None


def holds_manifest(url: str, options: Optional[dict]) -> bool:
    try:
        return _core.cached_store(url, options).exists(_core.MANIFEST_KEY)
    except MsprobeError:
        return False


def not_a_root(root: ReadableStore) -> Optional[str]:
    """Why the lake's own files must not go into the root although it can be written: it is
    one run's dump (``_lake/`` would sit inside the dump) or it holds nothing; else None."""
    try:
        names = [name for name in root.list_dir("") if not name.startswith(("_", "."))]
    except MsprobeError:
        return None
    if not names:
        return "it is empty"
    if _core.looks_like_dump(names):
        return "it is one run's dump, not a directory of runs"
    return None


def locate(root: ReadableStore, storage_options: Optional[dict], lake_dir: Any, lake_options: Optional[dict],
           refresh: str) -> Placement:
    """Where the lake's own files are: ``lake_dir`` when given (an URL of the root's store kind
    takes the root's options unless ``lake_options`` are given); else ``ROOT/_lake`` when the root
    can be written; else the cache, also when the root is one run's dump or empty (nothing is
    written into it). A read-only root whose ``_lake/`` holds a manifest (built by whoever could
    write) is read as it is while nothing needs writing; the cache takes over when something does."""
    root_url = root.url
    if lake_dir is not None:
        url = os.fspath(lake_dir)
        if lake_options is None and shares_options(url, root_url):
            lake_options = storage_options  # the same store kind: the root's options
        return Placement(url, lake_options)
    url = _core.default_lake_url(root_url)
    held = holds_manifest(url, storage_options)
    kept = None if held else not_a_root(root)
    if kept is not None:  # read-only means read-only: no _lake/ inside a dump or an empty folder
        cache = _core.cache_lake_dir(root_url)
        return Placement(cache, None, f"{root_url} is only read ({kept}): the lake's own files go to {cache} {_CHOOSE}")
    why = _core.write_refused(root_url, storage_options) if refresh != "none" or not held else None
    if why is None:
        return Placement(url, storage_options)
    cache = _core.cache_lake_dir(root_url)
    to_cache = f"{root_url} cannot be written ({why}): the lake's own files go to {cache} {_CHOOSE}"
    if held:  # a lake built there before (by whoever could write): read it while it holds
        return Placement(url, storage_options, f"{root_url} cannot be written ({why}): reading its lake {url} as it is",
                         (cache, to_cache))
    return Placement(cache, None, to_cache)


def open_lake_store(url: str, options: Optional[dict], refresh: str) -> Optional[ReadableStore]:
    """The store of the lake directory: writable when ``refresh`` allows and it can be written,
    else read-only; None when it does not exist yet (nothing indexed)."""
    if refresh != "none":
        try:
            return _core.cached_store(url, options, write=True)
        except StoragePermissionError:
            pass  # read what is there; building says why it cannot
    try:
        return _core.cached_store(url, options)
    except StorageNotFoundError:
        return None
