"""LocalStore: a directory of the local file system, or a shared (NFS-style) one."""
from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import stat
import uuid
from typing import IO, Any, BinaryIO, Callable, NoReturn

from msprobe.backends._base import BytesLike, Store
from msprobe.backends._keys import TEMP_MARKER, is_temp_name
from msprobe.backends._retry import reraise
from msprobe.errors import MsprobeError, StorageError, StorageNotFoundError, StoragePermissionError, UnsafePathError

__all__ = ["LocalStore"]

_CHUNK = 1 << 20
_NO_HARDLINKS = {
    getattr(errno, n) for n in ("EPERM", "ENOTSUP", "EOPNOTSUPP", "ENOSYS", "EMLINK", "EXDEV") if hasattr(errno, n)
}


#: ``direct=True``: objects of at least this many bytes whose buffer starts on a _DIRECT_ALIGN boundary
#: are written with O_DIRECT (all but the last partial block; that one through the page cache)
_DIRECT_MIN = 1 << 20
_DIRECT_ALIGN = 4096
_O_DIRECT = getattr(os, "O_DIRECT", 0)


def _address(view: memoryview) -> int:
    """The address of a writable buffer's first byte, or -1 (read-only: never written direct)."""
    if view.readonly:
        return -1
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    except (TypeError, ValueError):
        return -1


def _set_direct(fd: int, on: bool) -> None:
    import fcntl

    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, (flags | _O_DIRECT) if on else (flags & ~_O_DIRECT))


def _as_bytes_view(data: BytesLike) -> memoryview:
    view = memoryview(data)
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    return view


def _write_all(fd: int, view: memoryview) -> int:
    total = 0
    while total < len(view):
        total += os.write(fd, view[total:])
    return total


def _open_creating_dirs(path: str, flags: int, parent: str) -> int:
    """``os.open(path, flags)``, the directories above it made first when missing: the open is tried
    first (a document's directory is there already from the second put of a step on: no ``mkdir`` and
    ``stat`` per put)."""
    try:
        return os.open(path, flags, 0o666)
    except FileNotFoundError:
        os.makedirs(parent, exist_ok=True)
        return os.open(path, flags, 0o666)


def _unlink_quiet(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class LocalStore(Store):
    """Keys are files below ``root``. Safe for many processes sharing one root.

    Writes are atomic: data goes to a temporary file next to the target
    (``.<name>.msprobe-tmp-<hex>``, never listed), is flushed and fsync'ed, then
    ``os.replace``d onto the target and the directory is fsync'ed. Exclusive
    creation (``overwrite=False``) publishes with ``os.link``, which fails if the
    target exists; where hard links are unsupported it falls back to
    ``O_EXCL`` on the target (exclusive, but a reader may briefly see an empty
    file). Directory creation races between processes are harmless.

    ``fsync=False`` skips the fsyncs (faster, not durable across power loss).

    ``direct=True`` writes the bulk of a large ``put`` (at least 1 MiB, from a writable buffer
    that starts on a 4096-byte boundary: a tensor file's buffer) with ``O_DIRECT``: from the
    caller's memory to the disk, without the copy into the page cache (most of the process CPU of
    writing a tensor dump) and without filling the page cache with the dump. The last partial block
    goes through the page cache; the bytes, the temporary name and the rename are the same. A file
    system that refuses it (``EINVAL``) is written through the page cache from then on.
    """

    is_local = True
    exact_mtimes = True
    cheap_requests = True

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        read_only: bool = False,
        create: bool = True,
        fsync: bool = True,
        direct: bool = False,
        _below: bool = False,
    ) -> None:
        super().__init__(read_only=read_only)
        self._root = os.fspath(root) if _below else os.path.abspath(os.fspath(root))
        self._fsync = fsync
        self._direct = bool(direct and _O_DIRECT)
        if _below or os.path.isdir(self._root):  # a sub-store's root is neither checked nor created
            return
        if os.path.lexists(self._root) and not os.path.isdir(self._root):  # isdir again: another process may have
            # created the directory between the two checks
            raise StorageError(f"store root {self._root} exists and is not a directory")
        if read_only or not create:
            raise StorageNotFoundError(f"store root {self._root} does not exist")
        try:
            os.makedirs(self._root, exist_ok=True)
        except OSError as exc:
            reraise(exc, f"create {self._root}")

    # -- identity ---------------------------------------------------------
    @property
    def root(self) -> str:
        return self._root

    @property
    def url(self) -> str:
        return "file://" + self._root

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LocalStore) and (other._root, other.read_only) == (self._root, self.read_only)

    def __hash__(self) -> int:
        return hash((self._root, self.read_only))

    def _path(self, key: str) -> str:
        return os.path.join(self._root, *key.split("/")) if key else self._root

    def local_path(self, key: str = "") -> str:
        return self._path(self._prefix(key))

    def without_fsync(self, **options: Any) -> "LocalStore":
        return LocalStore(self.local_path(""), fsync=False, **options)

    def list_dir_stats(self, prefix: str) -> dict[str, tuple[int, float] | None]:
        with os.scandir(self.local_path(prefix)) as listing:
            entries = list(listing)
        out: dict[str, tuple[int, float] | None] = {}
        for entry in entries:
            try:
                stat = entry.stat()
                out[entry.name] = (stat.st_size, stat.st_mtime)
            except OSError:
                out[entry.name] = None
        return out

    def duckdb_path(self, key: str) -> str:
        return self.local_path(key)

    def location(self, key: str) -> str:
        return self.local_path(key)

    def append_dir(self, prefix: str) -> str:
        return self.local_path(prefix)

    def delete_prefix(self, prefix: str) -> None:
        """Also removes what interrupted writes left (temporary files), the emptied directories
        and the directory above ``prefix`` when nothing else is in it."""
        prefix = self._prefix(prefix)
        if not prefix:  # the root itself stays
            super().delete_prefix(prefix)
            return
        self.check_writable()
        top = self.local_path(prefix)
        if os.path.isdir(top):
            try:
                shutil.rmtree(top)
            except OSError as exc:
                reraise(exc, f"delete {top}")
        if "/" in prefix:
            with contextlib.suppress(OSError):  # not empty: other objects live beside it
                os.rmdir(os.path.dirname(top))

    def remove_temps(self, prefix: str) -> None:
        local = self.local_path(prefix)
        if not os.path.isdir(local):
            return
        for file_name in os.listdir(local):
            if is_temp_name(file_name):
                _unlink_quiet(os.path.join(local, file_name))

    def remove_empty_dirs(self, prefix: str) -> None:
        path = self.local_path(prefix)
        if path and not any(files for _, _, files in os.walk(path)):
            shutil.rmtree(path, ignore_errors=True)

    def stat(self, key: str) -> tuple[int | None, float | None]:
        result = os.stat(self.local_path(key))
        return result.st_size, result.st_mtime

    def disk_usage(self, prefix: str = "") -> tuple[int, int]:
        top = self.local_path(prefix)
        count = total = 0
        if not os.path.isdir(top):
            return 0, 0
        for dirpath, _, files in os.walk(top):
            for file_name in files:
                try:
                    total += os.stat(os.path.join(dirpath, file_name)).st_size
                    count += 1
                except OSError:
                    pass
        return count, total

    def arrow_location(self, key: str) -> tuple[Any, str]:
        return _arrow_local(), self.local_path(key)

    @staticmethod
    def _fail(exc: BaseException, operation: str, path: str) -> NoReturn:
        reraise(exc, f"{operation} {path}")

    # -- reads ------------------------------------------------------------
    def _read_path(self, key: str) -> str:
        """The path to read ``key`` from; a symlink that leads outside the store root is refused
        (a hostile dump must not make the readers read other files)."""
        path = self._path(self._key(key))
        if os.path.islink(path) or not os.path.realpath(path).startswith(os.path.realpath(self._root) + os.sep):
            real, root = os.path.realpath(path), os.path.realpath(self._root)
            if os.path.commonpath([real, root]) != root:
                raise UnsafePathError(f"{path} is a link to {real}, outside the store root {root}; refused")
        return path

    def get(self, key: str) -> bytes:
        path = self._read_path(key)
        try:
            with open(path, "rb") as file:
                return file.read()
        except OSError as exc:
            self._fail(exc, "get", path)

    def get_range(self, key: str, start: int, end: int | None = None) -> bytes:
        path = self._read_path(key)  # a symlink out of the store is refused here too
        if start < 0 or (end is not None and end < 0):
            raise MsprobeError(f"get_range {path}: negative offsets are not supported")
        try:
            with open(path, "rb") as file:
                file.seek(start)  # never ask for more than the file holds (a huge end would allocate it)
                if end is None:
                    return file.read()
                return file.read(max(0, min(end, os.fstat(file.fileno()).st_size) - start))
        except OSError as exc:
            self._fail(exc, "get_range", path)

    def _stat(self, path: str) -> os.stat_result | None:
        try:
            info = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            self._fail(exc, "stat", path)
        return info if stat.S_ISREG(info.st_mode) else None

    def exists(self, key: str) -> bool:
        return self._stat(self._path(self._key(key))) is not None

    def size(self, key: str) -> int:
        path = self._path(self._key(key))
        info = self._stat(path)
        if info is None:
            raise StorageNotFoundError(f"size {path}: no such object")
        return info.st_size

    def list_prefix(self, prefix: str = "") -> list[str]:
        prefix = self._prefix(prefix)
        base = self._path(prefix)

        def onerror(exc: OSError) -> None:
            if not isinstance(exc, (FileNotFoundError, NotADirectoryError)):
                self._fail(exc, "list", exc.filename or base)

        keys: list = []
        for dirpath, _dirs, files in os.walk(base, onerror=onerror):
            rel = os.path.relpath(dirpath, self._root)
            rel = "" if rel == "." else rel.replace(os.sep, "/") + "/"
            keys.extend(rel + name for name in files if not is_temp_name(name))
        return sorted(keys)

    def list_dir(self, prefix: str = "") -> list[str]:
        base = self._path(self._prefix(prefix))
        try:
            with os.scandir(base) as it:
                return sorted(e.name for e in it if not is_temp_name(e.name))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            self._fail(exc, "list_dir", base)

    def open_read(self, key: str) -> IO[bytes]:
        path = self._read_path(key)
        try:
            return open(path, "rb")
        except OSError as exc:
            self._fail(exc, "open", path)

    # -- writes -----------------------------------------------------------
    def put(self, key: str, data: BytesLike, *, overwrite: bool = True) -> None:
        self.check_writable()
        view = _as_bytes_view(data)
        if self._direct and len(view) >= _DIRECT_MIN and _address(view) % _DIRECT_ALIGN == 0:
            self._publish(self._key(key), lambda fd: self._write_direct(fd, view), overwrite, "put", direct=True)
            return
        self._publish(self._key(key), lambda fd: _write_all(fd, view), overwrite, "put")

    def _write_direct(self, fd: int, view: memoryview) -> int:
        """``view`` into ``fd`` (opened with O_DIRECT, at offset 0): its whole blocks direct, the rest
        through the page cache."""
        bulk = len(view) - len(view) % _DIRECT_ALIGN
        try:
            done = _write_all(fd, view[:bulk])
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            # refused (this file system wants another alignment, or a short write left the offset
            # unaligned): the whole object again through the page cache, and every later one
            self._direct = False
            _set_direct(fd, False)
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            return _write_all(fd, view)
        _set_direct(fd, False)
        return done + _write_all(fd, view[bulk:]) if bulk < len(view) else done

    def put_stream(self, key: str, fileobj: BinaryIO, *, overwrite: bool = True) -> int:
        self.check_writable()

        def copy(fd: int) -> int:
            buf = bytearray(_CHUNK)
            view = memoryview(buf)
            readinto = getattr(fileobj, "readinto", None)
            total = 0
            while True:
                if readinto is not None:
                    count = readinto(buf) or 0
                    chunk = view[:count]
                else:
                    chunk = _as_bytes_view(fileobj.read(_CHUNK))
                    count = len(chunk)
                if count == 0:
                    return total
                total += _write_all(fd, chunk)

        return self._publish(self._key(key), copy, overwrite, "put_stream")

    def _publish(self, key: str, write: Callable[[int], int], overwrite: bool, operation: str,
                 direct: bool = False) -> int:
        path = self._path(key)
        parent, name = os.path.split(path)
        tmp = os.path.join(parent, f".{name[:120]}{TEMP_MARKER}{uuid.uuid4().hex}")
        try:
            if not overwrite and self._stat(path) is not None:
                raise StoragePermissionError(f"{operation} {path}: already exists and overwrite=False")
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
            if direct:
                try:
                    fd = _open_creating_dirs(tmp, flags | _O_DIRECT, parent)
                except OSError as exc:
                    if exc.errno != errno.EINVAL:
                        raise
                    self._direct = False  # no O_DIRECT on this file system: the page cache, as any put
                    _unlink_quiet(tmp)
                    fd = os.open(tmp, flags, 0o666)
            else:
                fd = _open_creating_dirs(tmp, flags, parent)
            try:
                nbytes = write(fd)
                if self._fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            if overwrite:
                os.replace(tmp, path)
            else:
                self._link_exclusive(tmp, path, operation)
        except Exception as exc:  # noqa: BLE001 - removed, then re-raised typed
            _unlink_quiet(tmp)
            self._fail(exc, operation, path)
        except BaseException:
            _unlink_quiet(tmp)
            raise
        self._fsync_dir(parent)
        return nbytes

    def _link_exclusive(self, tmp: str, path: str, operation: str) -> None:
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise StoragePermissionError(f"{operation} {path}: already exists and overwrite=False") from None
        except OSError as exc:
            if exc.errno not in _NO_HARDLINKS:
                raise
            try:  # no hard links here: claim the name with O_EXCL, then replace it
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            except FileExistsError:
                raise StoragePermissionError(f"{operation} {path}: already exists and overwrite=False") from None
            os.replace(tmp, path)
            return
        _unlink_quiet(tmp)

    def _fsync_dir(self, path: str) -> None:
        if not self._fsync:
            return
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass  # some file systems refuse fsync on directories
        finally:
            os.close(fd)

    def delete(self, key: str) -> None:
        self.check_writable()
        path = self._path(self._key(key))
        try:
            os.unlink(path)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            pass
        except OSError as exc:
            if os.path.isdir(path):
                return  # a directory is not an object
            self._fail(exc, "delete", path)

    # -- navigation -------------------------------------------------------
    def child(self, prefix: str) -> "LocalStore":
        prefix = self._prefix(prefix)
        return LocalStore(self._path(prefix), read_only=self.read_only, fsync=self._fsync, direct=self._direct,
                          _below=True) if prefix else self


_ARROW_LOCAL: list = []


def _arrow_local() -> Any:
    """One pyarrow LocalFileSystem for every local store (pyarrow imported on first use)."""
    if not _ARROW_LOCAL:
        import pyarrow.fs as pafs

        _ARROW_LOCAL.append(pafs.LocalFileSystem())
    return _ARROW_LOCAL[0]
