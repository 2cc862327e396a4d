"""The crash journal of a dump session: the step's records in execution order, each appended
only once the tensor files it names are published, flushed by batch (or by a timer within
``journal_window`` on object stores)."""
from __future__ import annotations

import contextlib
import threading
from collections import deque
from typing import Any, Callable, Optional

from msprobe.dumpers.config import DumpConfig
from msprobe.dumpers.fastpath import journal_line_function, record_text_function
from msprobe.dumpers.session._documents import PendingStats
from msprobe.dumpers.session._failures import FailureLog
from msprobe.dumpers.session._storage import SessionStorage
from msprobe.format.journal import NO_PARENT, encode_record_text, encode_stack
from msprobe.format.layout import JOURNAL_DIR, MARKER_FILE
from msprobe.format.marker import decode_marker
from msprobe.format.model import data_names

__all__ = ["JOURNAL_RESERVE", "JournalPipeline"]

#: disk reserved for the journal of a rank directory on local stores, so records are still
#: journaled when tensor files fill the disk (released when the journal closes)
JOURNAL_RESERVE = 256 << 10


class JournalPipeline:
    """The records and stacks queued for the journal, the lines held back for tensor files in
    flight, and the journal of the current rank directory.

    ``lock`` guards the journal, the held lines and the files in flight; the writer's workers
    and the window timer take it (never the session's lock: a publish holds that one while it
    waits for the writer)."""

    def __init__(self, config: DumpConfig, storage: SessionStorage, failures: FailureLog,
                 render_stack: Callable[[tuple], list], rank_prefix: Callable[[], str]) -> None:
        self.config = config
        self.storage = storage
        self.failures = failures
        self.render_stack = render_stack
        self.rank_prefix = rank_prefix
        self.lock = threading.Lock()
        #: ``on`` while this thread is inside :meth:`held` (the session then queues without flushing)
        self.held_here = threading.local()
        self.journal: Any = None  # the store's journal of the rank directory, opened on first use
        self._batch: Optional[int] = None
        self._window_timer: Optional[threading.Timer] = None
        #: a record's JSON text, as format.journal.record_text makes it (the C fast path when there)
        self.record_text = record_text_function()
        #: a record's text and journal line in one C call (None: the two functions above)
        self.record_line = journal_line_function()
        self.reset()

    def reset(self) -> None:
        """A new step: nothing queued, held or in flight."""
        #: (name, raw, parent, stack id) of each record (the session appends them, then flushes a
        #: full batch), (None, stack id, None, frames) of each new stack
        self.queue: list = []
        #: data_name -> [its submissions not yet published, the journal lines waiting for them]
        self.inflight: dict = {}
        #: journal lines in execution order, each [bytes, tensor files still in flight, is a record]
        self.held_lines: deque = deque()
        self._unflushed = 0  # records appended to the journal since its last flush
        self.records_journaled = 0

    # ------------------------------------------------------------------ queue
    def add_stack(self, stack_id: int, frames: tuple) -> None:
        self.queue.append((None, stack_id, None, frames))

    @contextlib.contextmanager
    def held(self):
        """Records added by this thread inside the block are queued, not flushed: a callback
        run by a graph in execution cannot read tensors (each read waits for that graph: a
        deadlock). They are journaled by the next flush outside the block (stop, step)."""
        previous = getattr(self.held_here, "on", False)
        self.held_here.on = True
        try:
            yield
        finally:
            self.held_here.on = previous

    def flush(self, pending: PendingStats, fetch_stats: Callable[[list], list], encoded: Optional[dict] = None) -> None:
        """Resolve pending statistics and append the queued records to the crash journal (the
        caller holds the session's lock).

        A record whose tensor files are still being written is held back (with every record
        after it, so the journal stays in execution order) until the writer has published
        them: a journaled record always has its tensors (tensor mode loses nothing to a kill
        between the call and its file). The statistics path holds nothing back. ``encoded``
        (name -> (record, JSON text)) receives each record's text: publish writes the same."""
        if not self.queue:
            return
        if pending:
            pending.resolve(fetch_stats)
        queue, self.queue = self.queue, []
        lines: list = []  # (line bytes, 1 for a record / 0 for a stack, record)
        for name, raw, parent, stack in queue:
            if name is None:  # a new stack (raw: its id, stack: its frames): its frames once, records refer to its id
                lines.append((encode_stack(raw, self.render_stack(stack), self.record_text), 0, None))
                continue
            lines.append((self._record_line(name, raw, parent, stack, encoded), 1, raw))
        self._append_lines(lines)

    def _record_line(self, name: str, raw: Any, parent: Optional[str], stack: Any, encoded: Optional[dict]) -> bytes:
        """A record's journal line; its JSON text goes into ``encoded`` (made once: the line is built around
        it, dump.json reuses it)."""
        with_parent = self.config.level in ("L0", "mix")
        line_of = self.record_line
        made = line_of(raw, name, parent, with_parent, stack) if line_of is not None else None
        if made is not None:
            text, line = made
        else:
            text = self.record_text(raw)
            line = encode_record_text(name, text, parent=parent if with_parent else NO_PARENT, stack_id=stack)
        if encoded is not None:
            encoded[name] = (raw, text)
        return line

    def append_record(self, name: str, raw: Any, parent: Optional[str], stack: Any, encoded: Optional[dict]) -> None:
        """One record, with nothing queued before it and no statistics pending (the caller holds the
        session's lock): its line appended now, as :meth:`flush` appends a queue of one. The journal's
        default on local stores (one record per flush, nothing held back for tensor files in flight) copies
        it straight into the journal's mapped window."""
        line = self._record_line(name, raw, parent, stack, encoded)
        with self.lock:
            journal = self.journal
            if journal is not None and not self.held_lines and not self.inflight and self.batch == 1:
                self.records_journaled += 1
                try:
                    journal.extend([line], flush=True)
                except Exception as exc:  # noqa: BLE001 - the journal is a safety net: never crash training for it
                    self.failures.note("journal", exc)
                return
        self._append_lines([(line, 1, raw)])

    def _append_lines(self, lines: list) -> None:
        """Hold ``lines`` ((line, 1 for a record / 0 for a stack, record) each) for the tensor files their
        records name that are still in flight, then append those whose files are all published."""
        with self.lock:
            inflight, held = self.inflight, self.held_lines
            for line, is_record, record in lines:
                item = [line, 0, is_record]
                if is_record and inflight:  # tensor mode: wait for the record's files still in flight
                    for data_name in data_names(record, bounded=False):
                        waiting = inflight.get(data_name)
                        if waiting is not None:
                            waiting[1].append(item)
                            item[1] += 1
                held.append(item)
            self._release_locked(force=False)

    # ---------------------------------------------------------- tensors in flight
    def expect(self, data_name: str) -> None:
        """A tensor file is about to be submitted: the records naming it wait for it."""
        with self.lock:
            if self.journal is None:  # before the first tensor file: the journal's room on the disk
                try:
                    self.open()
                except Exception as exc:  # noqa: BLE001 - the journal is a safety net
                    self.failures.note("journal", exc)
            waiting = self.inflight.get(data_name)
            if waiting is None:
                self.inflight[data_name] = [1, []]
            else:  # written again (a gradient after a second backward): its lines wait for every write
                waiting[0] += 1

    def tensor_done(self, data_name: str) -> None:
        """A tensor file is published (or failed for good): release the journal lines that
        waited for it, in order. Runs in a writer thread."""
        with self.lock:
            waiting = self.inflight.get(data_name)
            if waiting is not None:
                waiting[0] -= 1
                if waiting[0] <= 0:
                    del self.inflight[data_name]
                    for held in waiting[1]:
                        held[1] -= 1
            if self.held_lines:
                self._release_locked(force=False)

    def release_all(self) -> None:
        """Every tensor is settled: append and flush every held line."""
        with self.lock:
            self._release_locked(force=True)

    # ---------------------------------------------------------------- journal
    @property
    def batch(self) -> int:
        """Records per journal flush: ``journal_flush``, or by default 1 on local and shared
        directories (each record is copied into the segment's mapped pages, the kernel's page
        cache, as it completes, so a SIGKILL loses none) and 64 on object stores (one new segment object per flush),
        where a record waits at most ``journal_window`` seconds for its flush."""
        if self._batch is None:
            configured = self.config.journal_flush
            self._batch = configured if configured is not None else (
                1 if getattr(self.storage.store, "cheap_requests", False) else 64)
        return self._batch

    def _window_flush(self) -> None:
        """Timer thread (object stores): flush the records waiting longer than ``journal_window``."""
        with self.lock:
            self._window_timer = None
            if self._unflushed:
                self._release_locked(force=True)

    def _release_locked(self, *, force: bool) -> None:
        """Append the held lines whose tensors are all published, up to the first one still
        waiting; flush the journal when ``force`` or ``journal_flush`` records are unflushed."""
        held = self.held_lines
        try:
            lines = []
            while held and held[0][1] <= 0:
                line = held.popleft()
                lines.append(line[0])
                self._unflushed += line[2]
                self.records_journaled += line[2]
            flush = bool(self._unflushed) and (force or self._unflushed >= self.batch)
            if lines or flush:  # the lines released now: one call, one write
                (self.journal if self.journal is not None else self.open()).extend(lines, flush=flush)
            if flush:
                self._unflushed = 0
            elif self._unflushed and self._window_timer is None:  # flushed within journal_window at the latest
                self._window_timer = threading.Timer(self.config.journal_window, self._window_flush)
                self._window_timer.daemon = True
                self._window_timer.start()
        except Exception as exc:  # noqa: BLE001 - the journal is a safety net: never crash training for it
            self._unflushed = 0
            self.failures.note("journal", exc)

    def open(self) -> Any:
        """The journal of the current rank directory (opened, after a final marker of an earlier
        run is dropped, on first use)."""
        if self.journal is None:
            self._drop_final_marker()
            store = self.storage.store
            # stores that append in place (Store.append_dir) reserve the journal's disk blocks when
            # its segment opens, before the tensor files fill the disk; the others ignore both
            # local stores copy each flush into a mapped window of the segment (MAP_SHARED: the pages
            # outlive a SIGKILL as the file's page cache) instead of one os.write per record
            self.journal = store.journal(f"{self.rank_prefix()}/{JOURNAL_DIR}", fsync=self.config.journal_fsync,
                                         retry_policy=self.storage.policy(), reserve_bytes=JOURNAL_RESERVE,
                                         mapped=True)
            self.journal.open_segment()
        return self.journal

    def _drop_final_marker(self) -> None:
        """A new journal in a rank dir whose marker says ``final`` (an earlier run): remove that
        marker, so recovery does not mistake this run's journal for stale leftovers."""
        store = self.storage.store
        key = f"{self.rank_prefix()}/{MARKER_FILE}"
        try:
            if store.exists(key) and decode_marker(store.get(key)).get("final"):
                store.delete(key)
        except Exception:  # noqa: BLE001 - never crash training for the dump: the failure is counted and logged
            pass

    def release_reserve(self) -> None:
        """The disk is full: the journal's reserved room goes to the documents (it is flushed)."""
        if self.journal is not None:
            self.journal.release_reserve()

    def close(self, *, delete: bool) -> None:
        """Close the journal; ``delete``: remove it from the rank directory (the dump is final)."""
        with self.lock:
            gone = False
            if self.journal is not None:
                try:
                    # a final dump's journal on a local disk: its segments removed as they are (not cut
                    # back to their lines first), with its directory; else closed, then deleted below
                    discard = getattr(self.journal, "discard", None) if delete else None
                    gone = discard is not None and discard()
                    if not gone:
                        self.journal.close()
                except Exception:  # noqa: BLE001 - never crash training for the dump: the failure is counted and logged
                    pass
                self.journal = None
        if delete and not gone:
            try:
                store, prefix = self.storage.store, self.rank_prefix()
                store.delete_prefix(f"{prefix}/{JOURNAL_DIR}")  # a final dump leaves no .journal/ behind
            except Exception:  # noqa: BLE001 - never crash training for the dump: the failure is counted and logged
                pass
