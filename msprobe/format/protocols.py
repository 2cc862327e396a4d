"""The contracts the format's readers hold their storage to, as types.

:class:`ReadableStore` is what reading a dump needs of a store: every
:class:`msprobe.backends.Store` is one (structurally: no inheritance needed), and so is any
object with these methods, e.g. a caching wrapper. It lives here, below ``backends`` in the
layer order, so that the format's own helpers (layout discovery, digests) can name it.
Writing needs the whole :class:`msprobe.backends.Store`.
"""
from __future__ import annotations

from typing import IO, Any, Optional, Protocol, runtime_checkable

__all__ = ["ReadableStore"]


@runtime_checkable
class ReadableStore(Protocol):
    """Keys are '/'-separated relative strings; a missing key raises ``StorageNotFoundError``."""

    is_local: bool
    #: an object's mtime is exact (a file system), not rounded (an object store)
    exact_mtimes: bool
    #: requests are cheap system calls, not network round trips: no point in parallel reads
    cheap_requests: bool

    @property
    def url(self) -> str: ...

    def get(self, key: str) -> bytes: ...

    def get_range(self, key: str, start: int, end: Optional[int] = None) -> bytes: ...

    def exists(self, key: str) -> bool: ...

    def size(self, key: str) -> int: ...

    def list_prefix(self, prefix: str = "") -> list[str]: ...

    def list_dir(self, prefix: str = "") -> list[str]: ...

    def open_read(self, key: str) -> IO[bytes]: ...

    def child(self, prefix: str) -> "ReadableStore": ...

    def local_path(self, key: str = "") -> Optional[str]: ...

    def location(self, key: str) -> str: ...

    def duckdb_path(self, key: str) -> Optional[str]: ...

    def list_dir_stats(self, prefix: str) -> Optional[dict[str, Optional[tuple[int, float]]]]: ...

    def stat(self, key: str) -> tuple[Optional[int], Optional[float]]: ...

    def arrow_location(self, key: str) -> Optional[tuple[Any, str]]: ...

    def fsspec_location(self, key: str = "") -> Optional[tuple[Any, str]]: ...

    def disk_usage(self, prefix: str = "") -> tuple[int, int]: ...
