"""The Store ABC: a small core of key/value operations plus capability flags."""
from __future__ import annotations

import abc
from typing import IO, TYPE_CHECKING, Any, BinaryIO, Optional, Union

from msprobe.backends._keys import validate_key, validate_prefix
from msprobe.errors import MsprobeError, StoragePermissionError

if TYPE_CHECKING:
    from msprobe.backends._journal import Journal

__all__ = ["Store", "BytesLike"]

BytesLike = Union[bytes, bytearray, memoryview]


class Store(abc.ABC):
    """A place to put and get objects by key.

    Keys are '/'-separated relative strings (see :func:`validate_key`); every
    public method validates its key and raises :class:`UnsafePathError` for
    traversal, absolute keys, backslashes, empty segments or NUL.

    Errors are mapped onto :mod:`msprobe.errors`: a missing key is
    :class:`StorageNotFoundError`, a refusal :class:`StoragePermissionError`, a
    failure worth retrying :class:`StorageTransientError`, anything else
    :class:`StorageError`.

    ``put`` and ``put_stream`` publish atomically: a reader sees either the old
    object, no object, or the complete new one, never a partial one.
    """

    supports_writes: bool = True
    supports_deletes: bool = True
    supports_listing: bool = True
    #: True when keys are files of the local (or NFS-mounted) file system.
    is_local: bool = False
    #: True when an object's modification time is exact (a file system's stat), False
    #: when it may be rounded (an object store's Last-Modified: whole seconds).
    exact_mtimes: bool = False
    #: True when each request is a cheap system call rather than a network round trip:
    #: callers then read and write one object at a time instead of in parallel.
    cheap_requests: bool = False

    def __init__(self, *, read_only: bool = False) -> None:
        self._read_only = bool(read_only)

    # -- identity ---------------------------------------------------------
    @property
    def read_only(self) -> bool:
        return self._read_only

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """Where this store lives, as a URL or path; never carries secrets."""

    def __repr__(self) -> str:
        ro = ", read_only=True" if self.read_only else ""
        return f"{type(self).__name__}({self.url!r}{ro})"

    def check_writable(self) -> None:
        """The one guard every mutating method calls first."""
        if self.read_only or not self.supports_writes:
            raise StoragePermissionError(f"store {self.url} is read-only")

    def _where(self, key: str) -> str:
        return f"{self.url.rstrip('/')}/{key}" if key else self.url

    # -- reads ------------------------------------------------------------
    @abc.abstractmethod
    def get(self, key: str) -> bytes:
        """The whole object; :class:`StorageNotFoundError` if missing."""

    @abc.abstractmethod
    def get_range(self, key: str, start: int, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of the object (``end=None``: to the end), clipped like a slice."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool:
        """True if an object (not a mere prefix) exists at ``key``."""

    @abc.abstractmethod
    def size(self, key: str) -> int:
        """Size in bytes of the object at ``key``."""

    @abc.abstractmethod
    def list_prefix(self, prefix: str = "") -> list[str]:
        """Every object key below ``prefix`` (a directory-like prefix), recursively.

        Keys are relative to the store root (so they can be passed back to
        :meth:`get`), sorted; in-progress temporary files are never listed. A
        missing prefix lists as ``[]``.
        """

    @abc.abstractmethod
    def list_dir(self, prefix: str = "") -> list[str]:
        """Names (not keys) of the immediate children of ``prefix``, objects and
        sub-prefixes alike, sorted; ``[]`` when there are none."""

    @abc.abstractmethod
    def open_read(self, key: str) -> IO[bytes]:
        """A seekable binary file object for lazy reads; close it when done."""

    # -- writes -----------------------------------------------------------
    @abc.abstractmethod
    def put(self, key: str, data: BytesLike, *, overwrite: bool = True) -> None:
        """Publish ``data`` at ``key`` atomically.

        ``overwrite=False`` is an exclusive create: if the key exists,
        :class:`StoragePermissionError` is raised and nothing is changed.
        """

    @abc.abstractmethod
    def put_stream(self, key: str, fileobj: BinaryIO, *, overwrite: bool = True) -> int:
        """Publish everything read from ``fileobj`` at ``key`` atomically; returns the size.

        Large objects are streamed (multipart uploads on object stores); the
        object becomes visible only when the upload completes.
        """

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object at ``key``; deleting a missing key is not an error."""

    # -- navigation -------------------------------------------------------
    @abc.abstractmethod
    def child(self, prefix: str) -> "Store":
        """A store of the same kind rooted at ``prefix`` below this one."""

    def local_path(self, key: str = "") -> str | None:
        """The file-system path of ``key`` for local stores, else ``None``."""
        validate_prefix(key)
        return None

    def without_fsync(self, **options: Any) -> "Store":
        """The same place with writes still atomic but not flushed to disk one by one (a local
        file system's ``fsync``); stores where that means nothing return themselves.
        ``options``: the backend's own (LocalStore: ``direct``)."""
        return self

    def location(self, key: str) -> str:
        """Where a person finds ``key``: its file-system path for local stores, else its URL."""
        validate_prefix(key)
        return f"{self.url.rstrip('/')}/{key}"

    def append_dir(self, prefix: str) -> Optional[str]:
        """A directory where append-only files for ``prefix`` may be written in place (with
        ``fsync`` and block reservation), else ``None``: the journal then publishes one
        object per flush instead."""
        validate_prefix(prefix)
        return None

    def delete_prefix(self, prefix: str) -> None:
        """Remove every object below ``prefix`` (and, on a file system, the directories left
        empty); a missing prefix is not an error."""
        self.check_writable()
        for key in self.list_prefix(prefix):
            self.delete(key)

    def remove_temps(self, prefix: str) -> None:
        """Remove the temporary files that interrupted writes left directly below ``prefix``
        (never listed, never visible under a final name); stores whose writes leave none (an
        object store's upload is invisible until complete) have nothing to do."""
        validate_prefix(prefix)

    def remove_empty_dirs(self, prefix: str) -> None:
        """Remove the directory tree of ``prefix`` when it holds no file any more (a file
        system's leftovers after its objects were deleted); stores without directories have
        nothing to do."""
        validate_prefix(prefix)

    def stat(self, key: str) -> tuple[Optional[int], Optional[float]]:
        """``(size, mtime)`` of the object at ``key``, read fresh (no cache); ``mtime`` is
        seconds since the epoch, ``None`` where the store cannot tell."""
        return self.size(key), None

    def disk_usage(self, prefix: str = "") -> tuple[int, int]:
        """``(objects, bytes)`` below ``prefix``, recursively; ``(0, 0)`` for a missing prefix."""
        keys = self.list_prefix(prefix)
        return len(keys), sum(self.size(key) for key in keys)

    def arrow_location(self, key: str) -> Optional[tuple[Any, str]]:
        """``(pyarrow FileSystem, path)`` through which pyarrow (and so DuckDB's Arrow
        scans) can read ``key``. The default is pyarrow's read-only view of this store through
        its own methods (:meth:`get`, :meth:`size`, :meth:`list_prefix`); a store with a file
        system of its own names that instead (faster: ranged reads)."""
        from msprobe.backends._arrow import store_filesystem

        cached = self.__dict__.get("_arrow_fs")
        if cached is None:
            cached = self.__dict__["_arrow_fs"] = store_filesystem(self)
        return cached, validate_prefix(key)

    def duckdb_path(self, key: str) -> Optional[str]:
        """A path DuckDB's own readers (``read_parquet``) open directly, or ``None``: the lake
        then reads through :meth:`duckdb_setup` or :meth:`arrow_location`."""
        validate_prefix(key)
        return None

    def duckdb_setup(self, con: Any) -> Optional[str]:
        """Set the DuckDB connection ``con`` up to read this store's objects with DuckDB's own
        readers over the network, and return the location they are read under (object ``key``
        at ``<location>/<key>``); ``None`` where DuckDB cannot read this store itself (the
        default; then :meth:`duckdb_path` or :meth:`arrow_location`). An S3 store loads DuckDB's
        httpfs extension (installed beforehand: nothing is downloaded) and gives it the endpoint,
        region and credentials its own client resolved."""
        return None

    def get_many(self, keys: list[str]) -> dict[str, bytes]:
        """The objects at ``keys`` that can be read, read at once where the store can (an
        asynchronous file system: one round of concurrent requests); a key that is missing or
        cannot be read is left out (callers read it again one by one to learn why)."""
        out: dict[str, bytes] = {}
        for key in keys:
            try:
                out[key] = self.get(key)
            except MsprobeError:
                continue
        return out

    def list_dir_stats(self, prefix: str) -> Optional[dict[str, Optional[tuple[int, float]]]]:
        """Every entry directly below ``prefix`` (temporary files included) with its ``(size,
        mtime)`` (``None`` where it cannot be told) from one cheap listing, or ``None`` where the
        store has no such listing (callers then list and stat one by one)."""
        validate_prefix(prefix)
        return None

    def fsspec_location(self, key: str = "") -> Optional[tuple[Any, str]]:
        """``(fsspec file system, path)`` of ``key`` where the store is one, else ``None``."""
        validate_prefix(key)
        return None

    def journal(self, prefix: str, **kwargs: object) -> "Journal":
        """An append-only, crash-safe :class:`Journal` under ``prefix``."""
        from msprobe.backends._journal import Journal

        return Journal(self, prefix, **kwargs)  # type: ignore[arg-type]

    # helpers for subclasses
    @staticmethod
    def _key(key: str) -> str:
        return validate_key(key)

    @staticmethod
    def _prefix(prefix: str) -> str:
        return validate_prefix(prefix)
