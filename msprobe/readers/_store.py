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
    directly (local directories, fsspec file systems), else None: the store says."""
    return store.arrow_location(key)
