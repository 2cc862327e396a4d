"""The failure log of a dump session: what could not be written is said once, logged where
the failing store cannot lose it, counted, and summed up when the dump ends."""
from __future__ import annotations

import logging
import os
import threading
import time
import warnings
from collections import defaultdict
from typing import Callable, Optional

from msprobe.backends import RetryPolicy, append_log_line, is_disk_full
from msprobe.dumpers.config import DumpConfig
from msprobe.dumpers.session._storage import SessionStorage, append_local
from msprobe.format.layout import ERROR_LOG, TENSOR_DIR

__all__ = ["FailureLog", "StorageFailureWarning"]

log = logging.getLogger("msprobe.dump")

#: most error lines kept in memory per rank directory (copied to the store at publish)
MAX_LOG_LINES = 10_000


class StorageFailureWarning(UserWarning):
    """An object of the dump could not be written (emitted once per session, and once at the end)."""


class FailureLog:
    """The storage failures of one session: the first one is said once (``logging`` and
    ``warnings``, on stderr), each is appended to an error log that lives on local disk (the
    rank directory of a local store; a temporary file for object stores, copied into the
    rank directory when the step's documents are published), and the objects not written are
    counted for the summary at the end."""

    def __init__(self, config: DumpConfig, storage: SessionStorage, rank_prefix: Callable[[], str]) -> None:
        self.config = config
        self.storage = storage
        self.rank_prefix = rank_prefix
        self.lock = threading.Lock()
        self.count = 0  # objects not written
        self.warned = False
        self.disk_full = False
        self.lines: dict = defaultdict(list)  # rank prefix -> error lines not yet copied to the store
        self.local_log: Optional[str] = None  # where the lines are kept on local disk
        self.first: Optional[str] = None
        #: one line per failure (and per writer or store error at publish and close)
        self.errors: list = []
        #: a full disk (ENOSPC/EDQUOT): no more tensor files this run; records are still journaled
        self.tensors_off = False

    def temp_log(self) -> str:
        import tempfile

        if self.local_log is None:
            self.local_log = os.path.join(tempfile.gettempdir(), f"msprobe_dump_error_info.{os.getpid()}.log")
        return self.local_log

    def skipped(self) -> None:
        """A tensor file not written because the disk is full (counted, not logged)."""
        with self.lock:
            self.count += 1

    def tensor_failed(self, key: str, exc: BaseException) -> None:
        """A tensor file could not be written (writer thread): a full disk stops tensor writes."""
        if is_disk_full(exc):
            self.tensors_off = True
        self.note("tensor", exc, key=key)

    def note(self, what: str, exc: BaseException, *, key: Optional[str] = None) -> None:
        """One object (or batch) not written: counted, said once on stderr, logged locally."""
        store = self.storage.store
        where = f"{store.url.rstrip('/')}/{key}" if key else f"{store.url} ({what})"
        message = " ".join(f"{type(exc).__name__}: {exc}".split())
        self.errors.append(f"{what}: {message}")
        disk_full = is_disk_full(exc)
        if disk_full:
            self.tensors_off = True
        prefix = key.rsplit(f"/{TENSOR_DIR}/", 1)[0] if key and f"/{TENSOR_DIR}/" in key else self.rank_prefix()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "+00:00"
        line = f"{stamp}\t{key or what}\t{type(exc).__name__}\t{' '.join(str(exc).split())}\n"
        with self.lock:
            self.count += 1
            first, self.warned = not self.warned, True
            said_full, self.disk_full = self.disk_full, self.disk_full or disk_full
            kept = self._keep_line(prefix, line)
        if first or (disk_full and not said_full):
            if disk_full:
                text = (f"msprobe: the disk is full writing {where} ({message}): tensor files are no longer "
                        "written in this run; records are still journaled while the journal fits")
            else:
                text = (f"msprobe: could not write {where} ({message}); training goes on, later failures are "
                        "counted and the total is reported when the dump ends")
            text += f"; error log: {kept}"
            self.first = self.first or text
            log.warning("%s", text)
            warnings.warn(StorageFailureWarning(text), stacklevel=2)

    def _keep_line(self, prefix: str, line: str) -> str:
        """Append an error line where it cannot be lost to the failing store (caller holds
        ``lock``); returns where the log is."""
        store = self.storage.opened
        where = store.append_dir(prefix) if store is not None else None  # a file appended in place
        path = os.path.join(where, *ERROR_LOG.split("/")) if where is not None else None
        if path is not None:
            if append_local(path, line):
                return path
        else:
            lines = self.lines[prefix]
            if len(lines) < MAX_LOG_LINES:
                lines.append(line)
        path = self.temp_log()
        return path if append_local(path, line) else "stderr only (no local file could be written)"

    def copy_to_store(self, prefix: str) -> None:
        """Object stores: the step's error lines, kept locally, go into its rank directory once the
        documents are written (one attempt: the store has just answered)."""
        with self.lock:
            lines = self.lines.pop(prefix, None)
        store = self.storage.store
        if not lines or (store is not None and store.append_dir(prefix) is not None):  # already there
            return

        try:
            append_log_line(store, f"{prefix}/{ERROR_LOG}", "".join(lines).rstrip("\n"),
                            retry_policy=RetryPolicy(retries=0, deadline=self.config.storage_timeout))
        except Exception as exc:  # noqa: BLE001 - the lines stay in the local log
            log.debug("error log not copied to %s: %s", store.url, exc)

    def summary_warning(self) -> None:
        """At the end of the dump: the count of objects not written, if any."""
        if not self.count:
            return
        where = self.local_log
        root = self.storage.local_root()
        if root is not None:
            where = os.path.join(root, "step*", "*", ERROR_LOG) + (f" and {where}" if where else "")
        text = (f"msprobe: {self.count} object(s) of the dump could not be written to {self.config.dump_path}; "
                f"error log: {where or 'stderr only'}")
        log.warning("%s", text)
        warnings.warn(StorageFailureWarning(text), stacklevel=2)
