"""The readers' view of the backends: open a store, and hand pyarrow a file system."""
from __future__ import annotations

from typing import Any, Optional

from msprobe.backends import open_store as _open
from msprobe.format.protocols import ReadableStore

__all__ = ["open_store", "arrow_location"]


def open_store(url: Any, storage_options: Optional[dict] = None, *, read_only: bool = False,
               create: bool = False) -> Any:
    return _open(url, storage_options, read_only=read_only, create=create)


def arrow_location(store: ReadableStore, key: str) -> Optional[tuple]:
    """``(pyarrow FileSystem, path)`` for ``key`` of ``store`` when pyarrow can read it
    directly (local directories, fsspec file systems), else None."""
    local = store.local_path(key) if getattr(store, "is_local", False) else None
    if local:
        import pyarrow.fs as pafs

        return _local_fs(pafs), local
    fs = getattr(store, "fs", None)
    root = getattr(store, "root", None)
    if fs is None or root is None:
        return None
    import pyarrow.fs as pafs

    path = f"{root}/{key}" if root else key
    return _wrapped_fs(fs, pafs), path


_FS_CACHE: dict = {}


def _local_fs(pafs: Any) -> Any:
    fs = _FS_CACHE.get("local")
    if fs is None:
        fs = _FS_CACHE["local"] = pafs.LocalFileSystem()
    return fs


def _wrapped_fs(fs: Any, pafs: Any) -> Any:
    key = id(fs)
    hit = _FS_CACHE.get(key)
    if hit is not None and hit[0] is fs:
        return hit[1]
    wrapped = pafs.PyFileSystem(pafs.FSSpecHandler(fs))
    _FS_CACHE[key] = (fs, wrapped)
    return wrapped
