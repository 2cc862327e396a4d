"""Where a lake's own files go: ``lake_dir`` when given, else ``ROOT/_lake`` when the root can be
written and holds runs, else a local cache directory (:func:`cache_lake_dir`)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

from msprobe.backends import shares_options
from msprobe.errors import MsprobeError, StorageNotFoundError, StoragePermissionError
from msprobe.format.protocols import ReadableStore
from msprobe.lake import _core
from msprobe.readers import looks_like_dump

__all__ = ["Placement", "locate", "open_lake_store", "default_lake_url", "cache_lake_dir", "write_refused"]

_CHOOSE = "(choose with --lake-dir / lake_dir=)"


def default_lake_url(root_url: str) -> str:
    return f"{root_url.rstrip('/')}/{_core.LAKE_DIR}"


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
        store = _core.cached_store(root_url, storage_options, write=True)
        key = f"{_core.LAKE_DIR}/.msprobe-probe-{uuid.uuid4().hex}"
        store.put(key, b"")
    except StoragePermissionError as exc:
        return str(exc)
    try:
        store.delete(key)
    except MsprobeError:
        pass
    return None


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
    if looks_like_dump(names):
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
    url = default_lake_url(root_url)
    held = holds_manifest(url, storage_options)
    kept = None if held else not_a_root(root)
    if kept is not None:  # read-only means read-only: no _lake/ inside a dump or an empty folder
        cache = cache_lake_dir(root_url)
        return Placement(cache, None, f"{root_url} is only read ({kept}): the lake's own files go to {cache} {_CHOOSE}")
    why = write_refused(root_url, storage_options) if refresh != "none" or not held else None
    if why is None:
        return Placement(url, storage_options)
    cache = cache_lake_dir(root_url)
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
