"""The store of a dump session: opened on first use, bounded by ``storage_timeout``, with the
one retry policy and breaker of every storage operation, and the write probe of ``dump_path``."""
from __future__ import annotations

import os
import threading
from typing import Any, Optional

from msprobe.backends import (
    TEMP_MARKER,
    Breaker,
    RetryPolicy,
    Store,
    StoreLike,
    bound_store,
    bounded_storage_options,
    local_path_of,
    open_store,
    put_retrying,
)
from msprobe.dumpers.config import DumpConfig
from msprobe.errors import StorageError, StoragePermissionError

__all__ = ["SessionStorage", "RetryingPut", "append_local"]


def _probe_local_dir(path: str) -> None:
    """Raise the OSError that writing below ``path`` meets: a probe file in ``path`` when it
    exists, else a probe directory in its nearest existing ancestor (nothing is left behind)."""
    path = os.path.abspath(path)
    here = path
    while not os.path.isdir(here):
        if os.path.lexists(here):
            if os.path.isdir(here):  # made since the test above, by a rank beside this one
                break
            raise NotADirectoryError(f"{here} exists and is not a directory")
        parent = os.path.dirname(here)
        if parent == here:
            break
        here = parent
    probe = os.path.join(here, f".probe{TEMP_MARKER}{os.getpid()}-{threading.get_ident()}")
    try:
        _probe(probe, file=here == path)
    except OSError as exc:
        what = "a file" if here == path else "a directory"
        raise type(exc)(exc.errno, f"cannot create {what} in {here}: {exc.strerror or exc}") from None


def _probe(probe: str, *, file: bool) -> None:
    if file:
        handle = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(handle, b"msprobe write probe")
        finally:
            os.close(handle)
            os.unlink(probe)
    else:
        os.mkdir(probe)
        os.rmdir(probe)


def append_local(path: str, line: str) -> bool:
    """One ``O_APPEND`` write of ``line`` to a local file (no retry); False when it failed."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o666)
        try:
            os.write(handle, line.encode("utf-8", "replace"))
        finally:
            os.close(handle)
        return True
    except OSError:
        return False


class RetryingPut:
    """``put`` of a store with :func:`put_retrying` (the dumper's retry policy)."""

    def __init__(self, store: StoreLike, policy: Any) -> None:
        self.store, self.policy = store, policy

    def put(self, key: str, data: bytes) -> None:
        put_retrying(self.store, key, data, overwrite=True, policy=self.policy)


class SessionStorage:
    """``dump_path``'s store for one session, opened on first use."""

    def __init__(self, config: DumpConfig) -> None:
        self.config = config
        self._store: Optional[Store] = None
        self._documents: Optional[Store] = None
        self._breaker: Optional[Breaker] = None

    @property
    def store(self) -> Store:
        if self._store is None:
            cfg = self.config
            options = bounded_storage_options(cfg.dump_path, cfg.storage_options, cfg.storage_timeout)
            self._store = bound_store(open_store(cfg.dump_path, storage_options=options), cfg.storage_timeout,
                                      self.breaker())
        return self._store

    @property
    def opened(self) -> Optional[Store]:
        """The store when it is open already, else None (nothing is opened)."""
        return self._store

    def local_root(self) -> Optional[str]:
        """The local directory of the open store (None when it is not open, or not local)."""
        store = self._store
        return store.append_dir("") if store is not None else None

    def policy(self) -> RetryPolicy:
        """The retry policy of every storage operation of this session: one total deadline
        (``storage_timeout``) per operation, and one breaker: once the store has not answered
        for a whole deadline, the operations that follow fail at once (counted, logged) for a
        cool-down instead of each waiting out its own deadline."""
        return RetryPolicy(deadline=self.config.storage_timeout, breaker=self.breaker())

    def breaker(self) -> Breaker:
        if self._breaker is None:
            self._breaker = Breaker(cooldown=2 * self.config.storage_timeout)
        return self._breaker

    def tensor_store(self) -> Store:
        """Where tensor files and shards go: the store, or on a local disk without
        ``fsync_tensors`` the same directory with writes still atomic (temp file + rename) but
        not fsync'ed one by one, and large tensor files written with O_DIRECT (LocalStore's
        ``direct``: no copy into the page cache)."""
        return self._unsynced(self.config.fsync_tensors, direct=True)

    def document_store(self) -> Store:
        """Where the step's documents and the marker go: the store, or on a local disk without
        ``journal_fsync`` the same directory, each document still atomic (temp file + rename) but
        not fsync'ed (as the journal: a SIGKILL loses nothing, power-loss safety is
        ``journal_fsync``'s; an fsync costs 3-9 ms of wall time per document here)."""
        if self._documents is None:
            self._documents = self._unsynced(self.config.journal_fsync)
        return self._documents

    def _unsynced(self, synced: bool, **options: Any) -> Store:
        """The store itself when ``synced``, else the store's view of the same place whose writes
        are atomic but not fsync'ed (Store.without_fsync: the store itself where that means
        nothing; ``options``: LocalStore's others)."""
        return self.store if synced else self.store.without_fsync(**options)

    def check_writable(self) -> None:
        """At ``PrecisionDebugger()``: prove that ``dump_path`` can be written (a probe object
        created and deleted), or raise a typed :class:`StorageError` naming the path and the cause."""
        path = self.config.dump_path
        try:
            local = local_path_of(path)
            if local is not None:
                _probe_local_dir(local)
                return
            store, key = self.store, f".probe{TEMP_MARKER}{os.getpid()}-{threading.get_ident()}"
            policy = self.policy()
            policy.call(lambda: store.put(key, b"msprobe write probe"))
            policy.call(lambda: store.delete(key))
        except Exception as exc:  # noqa: BLE001 - never crash training for the dump: the failure is counted and logged
            cls = StoragePermissionError if isinstance(exc, PermissionError) else StorageError
            cause = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise cls(f"dump_path {path} is not writable: {cause}") from None
