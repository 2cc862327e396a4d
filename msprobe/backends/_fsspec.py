"""FsspecStore: any fsspec file system (s3, gcs, azure, memory, ...) as a Store."""
from __future__ import annotations

import io
from typing import IO, Any, BinaryIO, Iterable, NoReturn

from msprobe.backends._base import BytesLike, Store
from msprobe.backends._retry import MISSING_ERRORS, is_transient, remaining_time, reraise
from msprobe.errors import MsprobeError, StorageNotFoundError, StoragePermissionError

__all__ = ["FsspecStore", "mtime_of"]

_CHUNK = 1 << 20
_READ_ONLY_PROTOCOLS = {"http", "https", "github", "gist", "zip", "tar", "reference", "data"}


def _strip_protocol(fs: Any, path: str) -> str:
    """``path`` as ``fs`` names it (no protocol, no trailing slash): fsspec's own normaliser, which
    it keeps private (its public ``fsspec.core.strip_protocol`` picks the file system by the URL)."""
    return fs._strip_protocol(path).rstrip("/")  # noqa: SLF001 - the one place; see above


def _protocol(fs: Any) -> str:
    proto = fs.protocol
    return proto if isinstance(proto, str) else proto[0]


def _abort_upload(file: Any) -> None:
    """Throw away an unfinished upload so nothing partial is ever committed."""
    try:
        file.discard()  # S3File: abort the multipart upload
    except Exception:  # noqa: BLE001 - fsspec file systems raise any type: each becomes one typed StorageError
        pass
    try:
        file.buffer = None
        file.closed = True  # so close()/__del__ never commit it
    except Exception:  # noqa: BLE001 - fsspec file systems raise any type: each becomes one typed StorageError
        pass


class FsspecStore(Store):
    """A Store over an fsspec file system, rooted at ``path`` inside it.

    Object stores have no rename, so the commit point of a write is the single
    ``PUT`` (:meth:`put`) or the completion of the multipart upload
    (:meth:`put_stream`, and :meth:`put` for very large objects); a failed
    upload is aborted, never completed. ``overwrite=False`` checks existence
    first and then writes with ``If-None-Match: *`` where the file system
    supports conditional writes (s3fs, memory), so racing creators cannot both
    win. Listings bypass the file system's listing cache so objects written by
    other processes are seen.

    ``secrets`` are strings scrubbed from every error message this store raises.
    """

    def __init__(
        self,
        fs: Any,
        path: str = "",
        *,
        read_only: bool = False,
        url: str | None = None,
        secrets: Iterable[str] = (),
    ) -> None:
        super().__init__(read_only=read_only)
        self._fs = fs
        self._root = _strip_protocol(fs, path) if path else ""
        self._protocol = _protocol(fs)
        self._url = (url or fs.unstrip_protocol(self._root)).rstrip("/") or f"{self._protocol}://"
        self._secrets = tuple(sorted({s for s in secrets if isinstance(s, str) and len(s) >= 4}, key=len, reverse=True))
        self._in_memory = self._protocol == "memory"
        self._async = bool(getattr(fs, "async_impl", False)) and not getattr(fs, "asynchronous", False)
        if self._protocol in _READ_ONLY_PROTOCOLS:
            self.supports_writes = False
            self.supports_deletes = False

    # -- identity ---------------------------------------------------------
    @property
    def fs(self) -> Any:
        return self._fs

    @property
    def root(self) -> str:
        return self._root

    @property
    def url(self) -> str:
        return self._url

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, FsspecStore)
            and other._fs is self._fs
            and (other._root, other.read_only) == (self._root, self.read_only)
        )

    def __hash__(self) -> int:
        return hash((id(self._fs), self._root, self.read_only))

    #: set by a writer that bounds its storage operations (:func:`bound_store`): the limit of
    #: one call made outside a :meth:`RetryPolicy.call`, and the breaker such calls obey
    op_timeout: float | None = None
    breaker: Any = None

    def _limit(self) -> dict[str, Any]:
        """``timeout=`` for one call of an async file system (s3fs, ...): the time left of the
        deadline of the retrying operation in progress, so no request outlives it (outside
        one: ``op_timeout``, once the breaker lets the call through)."""
        left = remaining_time()
        if left is None:
            if self.breaker is not None:
                self.breaker.allow()
            left = self.op_timeout
        return {"timeout": left} if self._async and left is not None else {}

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _fail(self, exc: BaseException, operation: str, key: str) -> NoReturn:
        if self.breaker is not None and remaining_time() is None and is_transient(exc):
            self.breaker.trip(exc)  # no answer to a call outside a retrying operation
        reraise(exc, f"{operation} {self._where(key)}", scrub=self._scrub)

    def _full(self, key: str) -> str:
        if not key:
            return self._root
        return f"{self._root}/{key}" if self._root else key

    def _relative(self, path: str) -> str | None:
        path = _strip_protocol(self._fs, path)
        if not self._root:
            return path.lstrip("/")
        if path.startswith(self._root + "/"):
            return path[len(self._root) + 1 :]
        return None

    def _info(self, key: str) -> dict[str, Any] | None:
        path = self._full(key)
        self._fs.invalidate_cache(path)
        try:
            info = self._fs.info(path, **self._limit())
        except MISSING_ERRORS:
            return None
        except Exception as exc:  # noqa: BLE001 - fsspec raises anything: one StorageError
            self._fail(exc, "info", key)
        return info if info.get("type") == "file" else None

    # -- reads ------------------------------------------------------------
    def get(self, key: str) -> bytes:
        key = self._key(key)
        try:
            return bytes(self._fs.cat_file(self._full(key), **self._limit()))
        except Exception as exc:  # noqa: BLE001 - fsspec raises anything: one StorageError
            self._fail(exc, "get", key)

    def get_range(self, key: str, start: int, end: int | None = None) -> bytes:
        key = self._key(key)
        if start < 0 or (end is not None and end < 0):
            raise MsprobeError(f"get_range {self._where(key)}: negative offsets are not supported")
        if end is not None and end <= start:
            if not self.exists(key):
                raise StorageNotFoundError(f"get_range {self._where(key)}: no such object")
            return b""
        try:
            return bytes(self._fs.cat_file(self._full(key), start=start, end=end, **self._limit()))
        except Exception as exc:  # noqa: BLE001 - fsspec raises anything: one StorageError
            if classify_invalid_range(exc) and self.exists(key):
                return b""  # start beyond the end: an empty slice, like local files
            self._fail(exc, "get_range", key)

    def exists(self, key: str) -> bool:
        return self._info(self._key(key)) is not None

    def size(self, key: str) -> int:
        key = self._key(key)
        info = self._info(key)
        if info is None:
            raise StorageNotFoundError(f"size {self._where(key)}: no such object")
        return int(info["size"])

    def list_prefix(self, prefix: str = "") -> list[str]:
        prefix = self._prefix(prefix)
        base = self._full(prefix)
        self._fs.invalidate_cache(base)
        try:
            paths = self._fs.find(base or "/", withdirs=False, **self._limit())
        except MISSING_ERRORS:
            return []
        except Exception as exc:  # noqa: BLE001 - fsspec raises anything: one StorageError
            self._fail(exc, "list", prefix)
        keys = (self._relative(path) for path in paths)
        want = prefix + "/" if prefix else ""
        return sorted(k for k in keys if k and k.startswith(want))

    def list_dir(self, prefix: str = "") -> list[str]:
        prefix = self._prefix(prefix)
        base = self._full(prefix)
        self._fs.invalidate_cache(base)
        try:
            paths = self._fs.ls(base or "/", detail=False, **self._limit())
        except MISSING_ERRORS:
            return []
        except Exception as exc:  # noqa: BLE001 - fsspec raises anything: one StorageError
            self._fail(exc, "list_dir", prefix)
        want = prefix + "/" if prefix else ""
        names = set()
        for path in paths:
            rel = self._relative(path)
            if rel and rel.startswith(want) and rel != prefix:
                names.add(rel[len(want) :].split("/", 1)[0])
        return sorted(names)

    def open_read(self, key: str) -> IO[bytes]:
        key = self._key(key)
        if self._in_memory:  # memory files are shared objects: hand out a private copy
            return io.BytesIO(self.get(key))
        try:
            return self._fs.open(self._full(key), "rb")
        except Exception as exc:  # noqa: BLE001 - fsspec raises anything: one StorageError
            self._fail(exc, "open", key)

    # -- writes -----------------------------------------------------------
    def _refuse_existing(self, operation: str, key: str) -> NoReturn:
        raise StoragePermissionError(f"{operation} {self._where(key)}: already exists and overwrite=False")

    def put(self, key: str, data: BytesLike, *, overwrite: bool = True) -> None:
        self.check_writable()
        key = self._key(key)
        body = data if isinstance(data, bytes) else bytes(data)
        try:
            if overwrite:
                self._fs.pipe_file(self._full(key), body, **self._limit())
                return
            if self._info(key) is not None:
                self._refuse_existing("put", key)
            self._fs.pipe_file(self._full(key), body, mode="create", **self._limit())
        except FileExistsError:
            self._refuse_existing("put", key)
        except Exception as exc:  # noqa: BLE001 - fsspec raises anything: one StorageError
            self._fail(exc, "put", key)

    def put_stream(self, key: str, fileobj: BinaryIO, *, overwrite: bool = True) -> int:
        self.check_writable()
        key = self._key(key)
        if self._in_memory:
            try:
                data = fileobj.read()
            except Exception as exc:  # noqa: BLE001 - fsspec raises anything: one StorageError
                self._fail(exc, "put_stream", key)
            self.put(key, data, overwrite=overwrite)
            return len(data)
        if not overwrite and self._info(key) is not None:
            self._refuse_existing("put_stream", key)
        try:
            file = self._fs.open(self._full(key), "wb" if overwrite else "xb")
        except Exception as exc:  # noqa: BLE001 - fsspec raises anything: one StorageError
            self._fail(exc, "put_stream", key)
        total = 0
        try:
            while True:
                chunk = fileobj.read(_CHUNK)
                if not chunk:
                    break
                file.write(chunk)
                total += len(chunk)
        except BaseException as exc:
            _abort_upload(file)
            if not isinstance(exc, Exception):
                raise
            self._fail(exc, "put_stream", key)
        try:
            file.close()  # the commit point: completes the (multipart) upload
        except FileExistsError:
            _abort_upload(file)
            self._refuse_existing("put_stream", key)
        except Exception as exc:  # noqa: BLE001 - fsspec raises anything: one StorageError
            _abort_upload(file)
            self._fail(exc, "put_stream", key)
        return total

    def delete(self, key: str) -> None:
        self.check_writable()
        key = self._key(key)
        try:
            self._fs.rm_file(self._full(key), **self._limit())
        except MISSING_ERRORS:
            pass
        except Exception as exc:  # noqa: BLE001 - fsspec raises anything: one StorageError
            self._fail(exc, "delete", key)

    # -- capabilities -----------------------------------------------------
    def stat(self, key: str) -> tuple[int | None, float | None]:
        path = self._full(self._key(key))
        self._fs.invalidate_cache(path)
        info = self._fs.info(path)
        return info.get("size"), mtime_of(info)

    def disk_usage(self, prefix: str = "") -> tuple[int, int]:
        found = self._fs.find(self._full(self._prefix(prefix)), detail=True)
        return len(found), sum(int(value.get("size") or 0) for value in found.values())

    def arrow_location(self, key: str) -> tuple[Any, str]:
        return _arrow_wrapped(self._fs), self._full(self._prefix(key))

    def fsspec_location(self, key: str = "") -> tuple[Any, str]:
        return self._fs, self._full(self._prefix(key))

    def get_many(self, keys: list[str]) -> dict[str, bytes]:
        if not self._async:
            return super().get_many(keys)
        want = {self._full(self._key(key)): key for key in keys}
        if not want:
            return {}
        got = self._fs.cat(list(want), on_error="omit")
        asked = set(want.values())
        out = {}
        for path, data in got.items():
            key = want.get(path) or self._relative(path)  # (named with its protocol: stripped)
            if key in asked and isinstance(data, bytes):
                out[key] = data
        return out

    def duckdb_setup(self, con: Any) -> str | None:
        if not self._url.startswith("s3://"):
            return None
        from msprobe.backends._duckdb import httpfs_setup

        return self._url if httpfs_setup(con, self) else None

    # -- navigation -------------------------------------------------------
    def child(self, prefix: str) -> "FsspecStore":
        prefix = self._prefix(prefix)
        if not prefix:
            return self
        store = FsspecStore(
            self._fs,
            self._full(prefix),
            read_only=self.read_only,
            url=f"{self._url.rstrip('/')}/{prefix}",
        )
        store._secrets = self._secrets
        store.op_timeout, store.breaker = self.op_timeout, self.breaker
        return store


def mtime_of(info: dict) -> float | None:
    """The modification time in an fsspec ``info``/listing entry (seconds), or None."""
    stamp: Any = info.get("LastModified") or info.get("mtime") or info.get("created")
    if hasattr(stamp, "timestamp"):
        stamp = stamp.timestamp()
    return float(stamp) if isinstance(stamp, (int, float)) and not isinstance(stamp, bool) else None


_ARROW_WRAPPED: dict = {}


def _arrow_wrapped(fs: Any) -> Any:
    """pyarrow's view of an fsspec file system, one per file system (pyarrow imported on first use)."""
    hit = _ARROW_WRAPPED.get(id(fs))
    if hit is not None and hit[0] is fs:
        return hit[1]
    import pyarrow.fs as pafs

    wrapped = pafs.PyFileSystem(pafs.FSSpecHandler(fs))
    _ARROW_WRAPPED[id(fs)] = (fs, wrapped)
    return wrapped


def classify_invalid_range(exc: BaseException) -> bool:
    """True when ``exc`` is an HTTP 416 / InvalidRange (a start offset past the end)."""
    cur: BaseException | None = exc
    for _ in range(8):
        if cur is None:
            return False
        response = getattr(cur, "response", None)
        if isinstance(response, dict):
            code = (response.get("Error") or {}).get("Code")
            status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            if code == "InvalidRange" or status == 416:
                return True
        if "InvalidRange" in str(cur) or "416" in type(cur).__name__:
            return True
        cur = cur.__cause__ or cur.__context__
    return False
