"""Where a dump session's tensors go: the classic tensor files (``dump_tensor_data/``, one file
per tensor through a ``BackgroundWriter``) or the Zarr tensor store (``tensors.zarr``). One
sink of each kind per session, its writer opened on first use and closed at the end of each step.

The contract of a sink: ``settle()`` waits until everything submitted is written or has failed
for good (raising the first failure), ``close()`` ends the step's writer, and the same-memory
cache (``same_memory``/``remember_memory``) tells which tensor of the step already holds the
bytes of a memory region, so that it is stored once."""
from __future__ import annotations

import weakref
from typing import Any, Callable, Optional

from msprobe.backends import BackgroundWriter
from msprobe.dumpers.config import DumpConfig
from msprobe.dumpers.session._failures import FailureLog
from msprobe.dumpers.session._journal import JournalPipeline
from msprobe.dumpers.session._storage import SessionStorage
from msprobe.format.layout import TENSOR_DIR
from msprobe.tensor_store import ZarrTensorWriter

__all__ = ["TensorSink", "FileSink", "ZarrSink"]


class TensorSink:
    """What the session asks of a tensor sink (see the module docstring)."""

    def __init__(self, config: DumpConfig, storage: SessionStorage, failures: FailureLog) -> None:
        self.config = config
        self.storage = storage
        self.failures = failures
        self._same_memory: dict = {}  # memory key -> (owner ref, version, first data name)
        self._writer: Any = None  # the step's writer, started on first use

    def same_memory(self, key: tuple, owner: Any, version: int) -> Optional[str]:
        """The data name of the tensor saved earlier in this step from the memory ``key`` of
        ``owner`` at ``version`` (None when there is none)."""
        hit = self._same_memory.get(key)
        return hit[2] if hit is not None and hit[0]() is owner and hit[1] == version else None

    def remember_memory(self, key: tuple, owner: Any, version: int, data_name: str) -> None:
        """``data_name`` was saved from the memory ``key`` of ``owner`` at ``version``."""
        try:
            self._same_memory[key] = (weakref.ref(owner), version, data_name)
        except TypeError:  # an owner without weak references: never aliased
            pass

    def settle(self) -> None:
        raise NotImplementedError

    def new_step(self) -> None:
        """A new step: the same-memory cache is forgotten."""
        self._same_memory.clear()

    @property
    def open_writer(self) -> Any:
        """The step's writer when it was started, else None (nothing is started)."""
        return self._writer

    def close(self) -> None:
        """Close the step's writer (the next step starts its own: its error log names its directory)."""
        if self._writer is not None:
            try:
                self._writer.close()
            finally:
                self._writer = None


class FileSink(TensorSink):
    """One file per tensor under ``dump_tensor_data/``; each record waits in the journal until
    the files it names are published."""

    def __init__(self, config: DumpConfig, storage: SessionStorage, failures: FailureLog,
                 journal: JournalPipeline) -> None:
        super().__init__(config, storage, failures)
        self.journal = journal

    @property
    def writer(self) -> Any:
        if self._writer is None:
            cfg = self.config
            self._writer = BackgroundWriter(
                self.storage.tensor_store(), max_bytes_in_flight=cfg.max_bytes_in_flight,
                workers=cfg.writer_workers, retry_policy=self.storage.policy(), on_failure=self.failures.tensor_failed,
                digests=True)
        return self._writer

    def save(self, key: str, data_name: str, produce: Callable[[], bytes], nbytes: int,
             release: Optional[Callable[[], None]] = None) -> None:
        """Queue the file ``key`` of ``data_name`` (background, bounded, retried); the records
        naming it reach the journal once it is published. ``release()`` is called once the
        writer is done with it (written, failed for good, or replaced by a later submission)."""
        writer = self._writer if self._writer is not None else self.writer
        journal = self.journal
        journal.expect(data_name)

        def done(error: Optional[BaseException], name: str = data_name) -> None:
            try:
                if release is not None:
                    release()
            finally:
                journal.tensor_done(name)

        try:
            writer.submit(key, produce, nbytes=nbytes, on_done=done)
        except BaseException:
            journal.tensor_done(data_name)
            raise

    def settle(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def digests(self, prefix: str) -> dict:
        """{tensor file name: [size, CRC32 hex]} of the step's files this process wrote."""
        digests = getattr(self._writer, "digests", None) or {}
        head = f"{prefix}/{TENSOR_DIR}/"
        return {key[len(head):]: [size, f"{crc:08x}"] for key, (size, crc) in sorted(digests.items())
                if key.startswith(head)}


class ZarrSink(TensorSink):
    """The Zarr tensor store of the current step and rank (``tensor_store: "zarr"``): raw
    little-endian payloads, deduplicated by content there and by memory here."""

    def __init__(self, config: DumpConfig, storage: SessionStorage, failures: FailureLog,
                 rank_prefix: Callable[[], str]) -> None:
        super().__init__(config, storage, failures)
        self.rank_prefix = rank_prefix
        self.locations: dict = {}  # data name -> where its bytes are (at the last settle())

    @property
    def writer(self) -> Any:
        if self._writer is None:
            cfg = self.config
            self._writer = ZarrTensorWriter(
                self.storage.tensor_store(), self.rank_prefix(), compression=cfg.tensor_compression,
                shard_bytes=cfg.tensor_shard_mb << 20, max_bytes_in_flight=cfg.max_bytes_in_flight,
                workers=max(1, min(cfg.writer_workers, 4)), journal_fsync=cfg.journal_fsync,
                flush_window=cfg.journal_window)  # a kill loses at most that window of payloads, not a shard
        return self._writer

    def save(self, data_name: str, logical_dtype: str, shape: tuple, produce: Callable[[], Any],
             nbytes: int, same_as: Optional[str] = None) -> None:
        writer = self._writer if self._writer is not None else self.writer
        writer.add(data_name, logical_dtype, shape, produce, nbytes, same_as=same_as)

    def settle(self) -> None:
        """Checkpoint the store (every payload so far written, its manifest published); the
        locations are those written even when it fails."""
        if self._writer is None:
            return
        try:
            self.locations = self._writer.checkpoint()
        except Exception:
            self.locations = self._writer.locations()
            raise

    def new_step(self) -> None:
        super().new_step()
        self.locations = {}
