"""Journal: an append-only, crash-safe log of lines under a key prefix."""
from __future__ import annotations

import mmap
import os
import re
import threading
import warnings
from typing import Any, Callable, Iterator

from msprobe.backends._keys import validate_key
from msprobe.backends._retry import RetryPolicy, put_retrying, reraise
from msprobe.errors import MsprobeError, StoragePermissionError
from msprobe.format.protocols import ReadableStore

__all__ = ["Journal", "read_journal", "JournalTruncatedWarning"]

_SEGMENT_RE = re.compile(r"^(\d{6,})\.jsonl$")


class JournalTruncatedWarning(UserWarning):
    """A journal segment ends with an incomplete line (the writer was killed mid-write)."""


def _segment_name(n: int) -> str:
    return f"{n:06d}.jsonl"


def _segments(store: ReadableStore, prefix: str) -> list[tuple[int, str]]:
    found = (_SEGMENT_RE.match(name) for name in store.list_dir(prefix))
    return sorted((int(m.group(1)), m.group(0)) for m in found if m)


class Journal:
    """Append lines (bytes without newline) and make them durable with :meth:`flush`.

    Lines are buffered in memory until :meth:`flush` (or until
    ``max_buffer_bytes`` are buffered). Segments are ``<prefix>/NNNNNN.jsonl``:

    * local stores: each Journal opens one new segment file (exclusive
      create) and appends to it; each flush is write + fsync. A failed write
      is truncated back, so a later flush can retry without duplicating lines.
      With ``mapped=True`` a flush copies the lines into a memory-mapped
      (``MAP_SHARED``) window of the segment (64 KiB first, each next one twice
      the last, up to 1 MiB) instead of calling ``write``: the
      pages are the file's page cache, so they survive the process being
      killed, without a system call per flush. The window's blocks are
      allocated before it is mapped (``posix_fallocate``: a full disk is an
      ``OSError`` then, never a ``SIGBUS`` while copying), so a killed writer
      leaves the segment's unused rest as NUL bytes after its last line, which
      :func:`read_journal` ignores; :meth:`close` cuts the segment back to its
      lines. Where a window cannot be had the journal writes as above.
    * object stores: each flush writes a new segment object with an
      exclusive create, so nothing is ever rewritten and a crash loses at
      most the unflushed lines.

    A Journal never appends to a segment another Journal wrote, so a new
    session after a crash never glues its lines onto a torn one. Thread-safe.
    """

    def __init__(
        self,
        store: Any,  # a msprobe.backends.Store (not imported: _base imports this module)
        prefix: str,
        *,
        max_buffer_bytes: int = 8 << 20,
        retry_policy: RetryPolicy | None = None,
        fsync: bool = True,
        reserve_bytes: int = 0,
        mapped: bool = False,
    ) -> None:
        store.check_writable()
        #: local stores: disk blocks reserved beyond the end of the segment when it is created
        #: (``fallocate`` KEEP_SIZE, where supported), so the journal still fits when other
        #: writers fill the disk; released by :meth:`close`
        self._reserve = max(0, int(reserve_bytes))
        #: local stores: fsync each flush (survives power loss) or only write to the OS
        #: (survives the process being killed, far cheaper per flush)
        self._fsync = fsync
        self._store = store
        self._prefix = validate_key(prefix.rstrip("/"))
        self._max_buffer = max_buffer_bytes
        self._policy = retry_policy or RetryPolicy()
        self._lock = threading.Lock()
        self._buffer: list[bytes] = []
        self._buffered = 0
        self._closed = False
        self._local_dir = store.append_dir(self._prefix)
        self._fd: int | None = None
        self._offset = 0
        #: local stores: flushes copy into a mapped window of the segment (see the class docstring)
        self._mapped = bool(mapped) and self._local_dir is not None
        self._map: mmap.mmap | None = None
        self._map_base = 0  # the segment's offset of the window's first byte
        self._map_end = 0  # the segment's offset just past the window (its allocated size)
        self._window = self.MAP_FIRST  # the size of the next window (doubling up to MAP_WINDOW)
        existing = _segments(store, self._prefix)
        self._next = existing[-1][0] + 1 if existing else 1
        #: keys of the segments this journal created
        self.segments: list[str] = []

    @property
    def prefix(self) -> str:
        return self._prefix

    def append(self, line: bytes | str) -> None:
        """Buffer one line; it must not contain a newline (one is added)."""
        if isinstance(line, str):
            line = line.encode("utf-8")
        if b"\n" in line:
            raise MsprobeError("a journal line must not contain a newline")
        with self._lock:
            if self._closed:
                raise MsprobeError(f"journal {self._prefix} is closed")
            self._buffer.append(bytes(line) + b"\n")
            self._buffered += len(line) + 1
            if self._buffered >= self._max_buffer:
                self._flush_locked()

    def extend(self, lines: list, *, flush: bool) -> None:
        """``append`` each line, then ``flush`` when asked (one lock, one write for them all)."""
        with self._lock:
            if self._closed:
                raise MsprobeError(f"journal {self._prefix} is closed")
            for line in lines:
                if b"\n" in line:
                    raise MsprobeError("a journal line must not contain a newline")
            mapped = self._map
            if flush and mapped is not None and not self._buffer and not self._fsync and len(lines) == 1:
                # one line into the open window (the default per record): copied, no buffer, no join
                data = lines[0] + b"\n"
                start = self._offset - self._map_base
                if self._offset + len(data) <= self._map_end:
                    mapped[start:start + len(data)] = data
                    self._offset += len(data)
                    return
            for line in lines:
                self._buffer.append(line + b"\n")
                self._buffered += len(line) + 1
            if flush or self._buffered >= self._max_buffer:
                self._flush_locked()

    def open_segment(self) -> None:
        """Local stores: create the segment file now (and reserve its blocks), not at the first flush."""
        with self._lock:
            if self._local_dir is not None and self._fd is None and not self._closed:
                try:
                    self._fd = self._open_local_segment()
                except OSError as exc:
                    reraise(exc, f"journal {self._store.url}/{self._prefix}")

    def release_reserve(self) -> None:
        """Give the blocks reserved beyond the end of the segment back (the disk is full and
        other objects need them); later appends allocate as usual."""
        with self._lock:
            if self._map is not None or self._map_end:  # the window's allocated rest goes back too
                self._unmap()
                self._mapped = False
            if (self._reserve or self._map_end) and self._fd is not None:
                try:
                    os.ftruncate(self._fd, self._offset)
                except OSError:
                    pass
            self._reserve = 0
            self._map_end = 0

    def flush(self) -> None:
        """Make every appended line durable (fsync'ed file or committed object)."""
        with self._lock:
            self._flush_locked()

    def close(self) -> None:
        """Flush and release the segment file; safe to call twice."""
        with self._lock:
            if self._closed:
                return
            try:
                self._flush_locked()
            finally:
                self._closed = True
                self._unmap()
                if self._fd is not None:
                    if self._reserve or self._map_end:
                        try:  # give the reserved blocks (and a mapped window's unused rest) beyond the end back
                            os.ftruncate(self._fd, self._offset)
                        except OSError:
                            pass
                    os.close(self._fd)
                    self._fd = None

    def discard(self) -> bool:
        """Local stores: remove the segments this journal wrote and close it, without cutting them
        back first (their mapped window's and reserve's blocks go with the files), then its directory
        and the directory above when they are left empty. True when the directory is gone; False (the
        journal as it was, or closed with its directory still there: the caller closes it and deletes
        the prefix as on any store) when something else is in it, a segment cannot be removed, lines
        are still buffered, or the store is not local."""
        with self._lock:
            if self._closed or self._local_dir is None or self._buffer:
                return False
            try:  # the segments go first, while the journal is still open: a failure leaves it as it was
                for key in self.segments:
                    os.unlink(os.path.join(self._local_dir, key.rsplit("/", 1)[-1]))
            except OSError:
                return False
            self._closed = True
            self._unmap()
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            try:
                os.rmdir(self._local_dir)
            except OSError:  # something else is in it (another run's segment, a temp file)
                return False
            try:  # (as LocalStore.delete_prefix: the directory above goes too when nothing else is in it)
                os.rmdir(os.path.dirname(self._local_dir))
            except OSError:
                pass
            return True

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _flush_locked(self) -> None:
        if not self._buffer:
            return
        data = self._buffer[0] if len(self._buffer) == 1 else b"".join(self._buffer)
        if self._local_dir is not None:
            self._append_local(data)
        else:
            self._write_segment(data)
        self._buffer.clear()
        self._buffered = 0

    # -- local: one append-only file per journal ---------------------------
    def _open_local_segment(self) -> int:
        os.makedirs(self._local_dir, exist_ok=True)
        flags = ((os.O_RDWR if self._mapped else os.O_WRONLY)  # (a shared writable mapping needs read access)
                 | os.O_CREAT | os.O_EXCL | os.O_APPEND | getattr(os, "O_CLOEXEC", 0))
        while True:
            name = _segment_name(self._next)
            path = os.path.join(self._local_dir, name)
            self._next += 1
            try:
                fd = os.open(path, flags, 0o666)
            except FileExistsError:
                continue
            self.segments.append(f"{self._prefix}/{name}")
            self._offset = 0
            if self._reserve:
                _reserve_blocks(fd, self._reserve)
            return fd

    def _append_local(self, data: bytes) -> None:
        """One write (+ fsync) of ``data``; a transient failure (per the retry policy) is cut
        back and retried, so the lines are neither lost nor duplicated. The first attempt goes
        straight to the disk while the breaker is closed (the policy's bookkeeping costs more
        than the ``os.write`` of a record); a failure takes the policy's path as before."""
        if self._mapped and self._append_mapped(data):
            return
        policy = self._policy
        breaker = policy.breaker
        if breaker is None or not breaker.open:
            try:
                self._append_local_once(data)
                return
            except Exception as exc:
                if not policy.is_transient(exc):
                    if breaker is not None:
                        breaker.success()  # an answer (ENOSPC, EACCES ...): the store is there
                    raise
        policy.call(lambda: self._append_local_once(data))

    def _append_local_once(self, data: bytes) -> None:
        try:
            if self._fd is None:
                self._fd = self._open_local_segment()
            view, done = memoryview(data), 0
            try:
                while done < len(view):
                    done += os.write(self._fd, view[done:])
                if self._fsync:
                    os.fsync(self._fd)
            except OSError:
                self._rollback_local()
                raise
            self._offset += len(data)
        except OSError as exc:
            reraise(exc, f"journal {self._store.url}/{self._prefix}")

    #: bytes of the segment mapped at a time at most (a new window, allocated first, when it is full)
    MAP_WINDOW = 1 << 20
    #: the first window's size; each next one twice the last, up to MAP_WINDOW. A step's journal of a few
    #: hundred records (~350 B each) fits the first: a 1 MiB window cost ~0.3 ms more CPU per segment here
    #: (ext4: its first writes into the fallocated pages and the cut back at close), with the same lines
    MAP_FIRST = 64 << 10

    def _append_mapped(self, data: bytes) -> bool:
        """Copy ``data`` into the mapped window (a new window when it does not fit); False when no
        window can be had (the caller writes instead, and so does every later flush)."""
        n = len(data)
        if self._map is None or self._offset + n > self._map_end:
            try:
                self._map_window(n)
            except (OSError, ValueError, BufferError):
                self._unmap()
                self._mapped = False
                if self._fd is not None and self._map_end:
                    try:  # the allocated rest goes: the writes continue at the end of the lines
                        os.ftruncate(self._fd, self._offset)
                    except OSError:
                        self._abandon_segment()
                self._map_end = 0
                return False
        start = self._offset - self._map_base
        self._map[start:start + n] = data  # type: ignore[index]
        self._offset += n
        if self._fsync:
            try:
                os.fsync(self._fd)  # type: ignore[arg-type]  # (writes the file's dirty pages, the mapped ones too)
            except OSError as exc:
                reraise(exc, f"journal {self._store.url}/{self._prefix}")
        return True

    def _map_window(self, need: int) -> None:
        """Map a window of the segment from the page holding the end of the lines, at least ``need``
        bytes past it, its blocks allocated (and the file's size set) before it is mapped."""
        if self._fd is None:
            self._fd = self._open_local_segment()
        self._unmap()
        base = self._offset - self._offset % mmap.ALLOCATIONGRANULARITY
        window = min(self._window, self.MAP_WINDOW)
        self._window = window * 2
        size = max(window, self._offset - base + need)
        size += -size % mmap.ALLOCATIONGRANULARITY
        os.posix_fallocate(self._fd, base, size)  # ENOSPC here, not a SIGBUS in the copy
        self._map_end = base + size
        self._map = mmap.mmap(self._fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=base)
        self._map_base = base

    def _unmap(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except (BufferError, OSError):
                pass
            self._map = None

    def _abandon_segment(self) -> None:
        """The segment cannot be cut back to its lines: leave it (its NUL tail is ignored on read) and
        continue in a new one."""
        self._unmap()
        self._map_end = 0
        try:
            os.close(self._fd)  # type: ignore[arg-type]
        except OSError:
            pass
        self._fd = None

    def _rollback_local(self) -> None:
        """Cut a partly written flush off, so a retry does not duplicate lines."""
        try:
            os.ftruncate(self._fd, self._offset)  # type: ignore[arg-type]
        except OSError:  # cannot cut: abandon this segment, the torn tail is reported on read
            self._abandon_segment()

    # -- object stores: one new object per flush --------------------------
    def _write_segment(self, data: bytes) -> None:
        while True:
            key = f"{self._prefix}/{_segment_name(self._next)}"
            self._next += 1
            try:
                put_retrying(self._store, key, data, overwrite=False, policy=self._policy)
            except StoragePermissionError:
                if self._store.exists(key):
                    continue  # another writer took this number: use the next one
                raise
            self.segments.append(key)
            return


#: libc's fallocate, looked up once per process (``find_library`` runs ``ldconfig`` in a subprocess:
#: a fork of the training process at every step's journal); False once known to be missing
_FALLOCATE: Any = None


def _fallocate() -> Any:
    global _FALLOCATE
    if _FALLOCATE is None:
        try:
            import ctypes
            import ctypes.util

            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            fn = libc.fallocate
            fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
            _FALLOCATE = fn
        except (OSError, AttributeError):
            _FALLOCATE = False
    return _FALLOCATE


def _reserve_blocks(fd: int, nbytes: int) -> bool:
    """Reserve ``nbytes`` of disk beyond the end of ``fd`` without changing its size
    (Linux ``fallocate(FALLOC_FL_KEEP_SIZE)``); False where that is not possible."""
    fallocate = _fallocate()
    if not fallocate:
        return False
    try:
        return fallocate(fd, 1, 0, int(nbytes)) == 0  # 1: FALLOC_FL_KEEP_SIZE
    except (OSError, AttributeError):
        return False


def read_journal(
    store: ReadableStore,
    prefix: str,
    *,
    on_truncated: Callable[[str, bytes], None] | None = None,
) -> Iterator[bytes]:
    """Yield every complete line (without its newline) of the journal at ``prefix``.

    Segments are read in order. A segment whose last line has no newline (a
    writer killed mid-write, or one still writing) does not stop the read:
    the partial line is skipped and reported to ``on_truncated(segment_key,
    partial_bytes)``, or as a :class:`JournalTruncatedWarning` when no callback
    is given. NUL bytes after a segment's last line (the unused rest of a
    mapped segment whose writer was killed, see :class:`Journal`) are not a
    line; a line holding a NUL byte is a torn write too (a copy into the
    mapped window cut short, whose newline was stored before the bytes
    ahead of it). A missing journal yields nothing.
    """
    prefix = validate_key(prefix.rstrip("/"))
    for _, name in _segments(store, prefix):
        key = f"{prefix}/{name}"
        if store.cheap_requests:
            with store.open_read(key) as f:
                lines: Iterator[bytes] = iter(f)
                yield from _complete_lines(lines, key, on_truncated, store)
        else:
            parts = store.get(key).split(b"\n")
            complete = (p + b"\n" for p in parts[:-1])
            yield from _complete_lines(iter([*complete, parts[-1]]), key, on_truncated, store)


def _complete_lines(
    lines: Iterator[bytes], key: str, on_truncated: Callable[[str, bytes], None] | None, store: ReadableStore
) -> Iterator[bytes]:
    for line in lines:
        if line.endswith(b"\n") and b"\0" not in line:
            yield line[:-1]
            continue
        # NUL bytes: the unused rest of a mapped segment whose writer was killed; inside a line
        # (never in JSON text, which escapes them), a copy into the window that a kill (or a live
        # read) caught half done: its newline may land before the bytes that precede it
        line = line.rstrip(b"\0") if not line.endswith(b"\n") else line[:-1]
        if line:
            if on_truncated is not None:
                on_truncated(key, line)
            else:
                warnings.warn(
                    JournalTruncatedWarning(
                        f"journal segment {store.url}/{key}: incomplete last line ({len(line)} bytes) skipped"
                    ),
                    stacklevel=3,
                )
