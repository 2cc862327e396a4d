"""pyarrow's view of any :class:`Store` through its own methods (read-only): the generic
default of :meth:`Store.arrow_location`, so pyarrow datasets and DuckDB's Arrow scans read a
backend that has no file system of its own. pyarrow is imported by the caller, never here at
import time."""
from __future__ import annotations

from typing import Any

from msprobe.errors import StorageNotFoundError


def store_filesystem(store: Any) -> Any:
    """A ``pyarrow.fs.PyFileSystem`` whose paths are ``store``'s keys."""
    import pyarrow.fs as pafs

    class StoreHandler(pafs.FileSystemHandler):
        def __init__(self) -> None:
            self.store = store

        def __eq__(self, other: object) -> bool:
            return isinstance(other, StoreHandler) and other.store is self.store

        def __ne__(self, other: object) -> bool:
            return not self == other

        def get_type_name(self) -> str:
            return f"msprobe-store:{type(store).__name__}"

        def normalize_path(self, path: str) -> str:
            return path.strip("/")

        def _info(self, path: str) -> Any:
            key = path.strip("/")
            if key and store.exists(key):
                return pafs.FileInfo(key, pafs.FileType.File, size=store.size(key))
            if not key or store.list_dir(key):
                return pafs.FileInfo(key, pafs.FileType.Directory)
            return pafs.FileInfo(key, pafs.FileType.NotFound)

        def get_file_info(self, paths: list) -> list:
            return [self._info(path) for path in paths]

        def get_file_info_selector(self, selector: Any) -> list:
            base = selector.base_dir.strip("/")
            if selector.recursive:
                return [pafs.FileInfo(key, pafs.FileType.File, size=store.size(key)) for key in store.list_prefix(base)]
            return [self._info(f"{base}/{name}" if base else name) for name in store.list_dir(base)]

        def open_input_file(self, path: str) -> Any:
            import pyarrow as pa

            return pa.BufferReader(store.get(path.strip("/")))

        def open_input_stream(self, path: str) -> Any:
            return self.open_input_file(path)

        def _refuse(self, *args: Any, **kwargs: Any) -> Any:
            raise StorageNotFoundError(f"{store.url}: pyarrow's view of the store is read-only")

        create_dir = delete_dir = delete_dir_contents = delete_root_dir_contents = delete_file = _refuse
        move = copy_file = open_output_stream = open_append_stream = _refuse

    return pafs.PyFileSystem(StoreHandler())
