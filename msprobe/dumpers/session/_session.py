"""``DumpSession``: the façade a framework dumper talks to, over the step's lifecycle.

A framework adapter (PyTorch, MindSpore) turns framework objects into record entries; the
session decides *whether* and *under which name* a call is recorded, and *where* its bytes go.
Statistics stay on the device as pending values and are fetched in batches when records are
journaled or published, never one sync per value. The parts it is made of:

- ``SessionStorage`` (``_storage.py``): the store, its retry policy and breaker, the write probe;
- ``StepDocuments`` (``_documents.py``): the step's records, parents, stacks, pending statistics;
- ``JournalPipeline`` (``_journal.py``): the crash journal, records gated on their tensors in flight;
- ``FileSink``/``ZarrSink`` (``_sinks.py``): where tensors go, each with its same-memory cache;
- ``FailureLog`` (``_failures.py``): what could not be written;
- ``RunDirClaims`` (``_claims.py``) and ``RankPublisher`` (``_publish.py``): the rank directory's
  claim and its documents' atomic publish.
"""
from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any, Callable, Optional

from msprobe.backends import Store
from msprobe.dumpers.config import DumpConfig
from msprobe.dumpers.fastpath import untrack_function
from msprobe.dumpers.session._claims import RunDirClaims
from msprobe.dumpers.session._documents import StepDocuments
from msprobe.dumpers.session._failures import FailureLog
from msprobe.dumpers.session._journal import JournalPipeline
from msprobe.dumpers.session._publish import RankPublisher
from msprobe.dumpers.session._sinks import FileSink, ZarrSink
from msprobe.dumpers.session._storage import SessionStorage
from msprobe.format.layout import TENSOR_DIR, rank_dir_name

__all__ = ["DumpSession"]


class DumpSession:
    """One process's dump: the current step and rank, the call counters, and the step's
    records on their way to the journal, the tensor sinks and the published documents."""

    def __init__(self, config: DumpConfig, framework: str, *, fetch_stats: Callable[[list], list],
                 render_stack: Callable[[tuple], list], get_rank: Callable[[], Optional[int]],
                 producer: str = "msprobe-lake"):
        self.config = config
        self.framework = framework
        self.fetch_stats = fetch_stats
        self.render_stack = render_stack
        self.get_rank = get_rank
        #: guards the step's documents and its lifecycle (the journal has its own lock)
        self.lock = threading.RLock()
        self.current_step = 0
        self.rank: Optional[int] = None
        self._rank_resolved = False
        self.api_counts: dict = defaultdict(int)
        self.module_counts: dict = defaultdict(int)
        self.records_total = 0
        self.storage = SessionStorage(config)
        self.failures = FailureLog(config, self.storage, lambda: self.rank_prefix)
        self.journal = JournalPipeline(config, self.storage, self.failures, render_stack, lambda: self.rank_prefix)
        #: the C path's ``untrack`` (None without it): a record out of the garbage collector's walks
        self._untrack = untrack_function()
        self.file_sink = FileSink(config, self.storage, self.failures, self.journal)
        self.zarr_sink = ZarrSink(config, self.storage, self.failures, lambda: self.rank_prefix)
        self.claims = RunDirClaims(config, self.storage, self.failures)
        self.publisher = RankPublisher(config, framework, producer, render_stack, self.storage, self.failures)
        self._new_step()
        self._summarized = False
        if getattr(config, "online", None) is None:  # online_run_ut sends packets, it writes no dump
            self.storage.check_writable()

    # ------------------------------------------------------------------ state
    def _new_step(self) -> None:
        self.docs = StepDocuments()
        self._dirty = False  # something to publish
        self.journal.reset()
        self.file_sink.new_step()
        self.zarr_sink.new_step()

    @property
    def data(self) -> dict:
        """The step's records so far (dump.json's ``data``)."""
        return self.docs.data

    @property
    def construct(self) -> dict:
        """The step's parents so far (construct.json)."""
        return self.docs.construct

    def reset_counters(self) -> None:
        self.api_counts.clear()
        self.module_counts.clear()

    def set_step(self, step: int) -> None:
        """Number the current step ``step`` (``set_init_step``, the sessions of a split dump)."""
        with self.lock:
            self.current_step = step

    # ---------------------------------------------------------------- storage
    @property
    def store(self) -> Store:
        return self.storage.store

    @property
    def writer(self) -> Any:
        """The step's ``BackgroundWriter`` of tensor files."""
        return self.file_sink.writer

    @property
    def tensor_store(self) -> Any:
        """The Zarr tensor store writer of the current step and rank (``tensor_store: "zarr"``)."""
        return self.zarr_sink.writer

    @property
    def errors(self) -> list:
        return self.failures.errors

    @property
    def tensors_off(self) -> bool:
        """A full disk (ENOSPC/EDQUOT): no more tensor files this run; records are still journaled."""
        return self.failures.tensors_off

    @property
    def objects_not_written(self) -> int:
        """Objects (tensor files, documents, journal batches) this session could not write."""
        return self.failures.count

    @property
    def records_journaled(self) -> int:
        return self.journal.records_journaled

    @property
    def journal_batch(self) -> int:
        return self.journal.batch

    # the parts' state as the session's own attributes once were (the white-box tests read them)
    @property
    def _journal(self) -> Any:
        """The rank directory's journal, None when closed (a test drops it to stand for a kill)."""
        return self.journal.journal

    @_journal.setter
    def _journal(self, journal: Any) -> None:
        self.journal.journal = journal

    @property
    def _held(self) -> Any:
        return self.journal.held_lines

    @property
    def _inflight(self) -> dict:
        return self.journal.inflight

    @property
    def _writer(self) -> Any:
        return self.file_sink.open_writer

    def note_error(self, what: str, exc: BaseException, *, key: Optional[str] = None) -> None:
        """One object (or batch) not written: counted, said once on stderr, logged locally."""
        self.failures.note(what, exc, key=key)

    # ------------------------------------------------------------------- rank
    def resolve_rank(self) -> Optional[int]:
        if not self._rank_resolved:
            self.rank = self.get_rank()
            self._rank_resolved = True
        return self.rank

    @property
    def rank_dir(self) -> str:
        return rank_dir_name(self.resolve_rank())

    @property
    def rank_prefix(self) -> str:
        return f"step{self.current_step}/{self.rank_dir}"

    def claim(self) -> None:
        """Before writing a step: claim its rank directory (see :meth:`RunDirClaims.claim`)."""
        self.claims.claim(self.current_step, self.resolve_rank, lambda: self.rank_dir)

    def stale_steps(self) -> list:
        return self.claims.stale_steps()

    def rank_enabled(self) -> bool:
        ranks = self.config.rank
        return ranks is None or (self.resolve_rank() or 0) in ranks

    def step_enabled(self) -> bool:
        steps = self.config.step
        return steps is None or self.current_step in steps

    # ----------------------------------------------------------------- naming
    def next_api_name(self, api_key: str) -> tuple[str, int]:
        """``api_key`` is ``Prefix.api``; returns (``Prefix.api.n``, n) and advances the counter."""
        index = self.api_counts[api_key]
        self.api_counts[api_key] = index + 1
        return f"{api_key}.{index}", index

    def next_module_index(self, module_key: str) -> int:
        index = self.module_counts[module_key]
        self.module_counts[module_key] = index + 1
        return index

    def data_file_name(self, data_name: str) -> str:
        """The file name for ``data_name`` (the 255-character rule, recorded in mapping.csv)."""
        return self.docs.file_name(data_name)

    # ---------------------------------------------------------------- records
    def add_structure(self, name: str, parent: Optional[str]) -> None:
        """A call outside the list/scope filters: no record, but it is part of the model's structure."""
        if self.config.level in ("L0", "mix"):
            with self.lock:
                self.docs.construct[name] = parent
                self._dirty = True

    def add_record(self, name: str, raw: Any, *, stack: Optional[tuple] = None, parent: Optional[str] = None,
                   construct: bool = True, stats: Optional[list] = None) -> None:
        """Add (or replace) a record of the current step; journal it when its batch is full. ``stats``:
        what the encoder made for it, ``(entry, handle)`` pairs of statistics still on the device (the
        session fills those entries of its record when it fetches them)."""
        with self.lock:
            docs = self.docs
            if stats:
                docs.pending.extend(stats)
            if self.config.task != "structure":  # structure: only stack.json and construct.json
                docs.data[name] = raw
                if self._untrack is not None:
                    # made of dicts and lists of atomic values, it lives until the step's end: the young
                    # collections no longer walk it and move it on (nor does each full collection)
                    self._untrack(raw)
            stack_id = None
            if stack is not None and self.config.stack:
                stack_id, new = docs.stacks.add(name, stack)
                if new:
                    self.journal.add_stack(stack_id, stack)
            if construct and self.config.level in ("L0", "mix"):
                docs.construct[name] = parent
            self._dirty = True
            self.records_total += 1
            journal = self.journal
            queue = journal.queue
            held = getattr(journal.held_here, "on", False)
            if not queue and not docs.pending and not held and (self.config.journal_flush or 1) == 1:
                journal.append_record(name, raw, parent, stack_id, docs.encoded)  # (what the flush of it would do)
                return
            queue.append((name, raw, parent, stack_id))
            if len(queue) >= (self.config.journal_flush or 1) and not held:
                self.flush_journal()

    def reserve(self, name: str, parent: Optional[str]) -> Any:
        """Hold the place of a record whose values come later (:meth:`add_record` fills it in place);
        returns the placeholder for :meth:`unreserve`."""
        placeholder: dict = {}
        with self.lock:
            docs = self.docs
            if self.config.task != "structure":
                docs.data.setdefault(name, placeholder)
            if self.config.level in ("L0", "mix"):
                docs.construct.setdefault(name, parent)
        return placeholder

    def unreserve(self, name: str, placeholder: Any) -> None:
        """Drop a held place that no record filled (a record the filters did not keep)."""
        with self.lock:
            docs = self.docs
            if docs.data.get(name) is placeholder:
                del docs.data[name]
                docs.construct.pop(name, None)

    def record(self, name: str) -> Any:
        """The record ``name`` of the current step so far (None when there is none)."""
        with self.lock:
            return self.docs.data.get(name)

    def remove_record(self, name: str) -> None:
        """Drop the record ``name`` of the current step (it is added again at its new place)."""
        with self.lock:
            self.docs.data.pop(name, None)

    def ensure_structure(self, name: str, parent: Optional[str] = None) -> None:
        """``name`` in construct.json (under ``parent``) unless it is there already."""
        with self.lock:
            self.docs.construct.setdefault(name, parent)

    def rewrite_parents(self, fix: Callable[[Optional[str], Callable[[Optional[str]], bool]], Optional[str]]) -> None:
        """Each parent of construct.json that is neither a record nor in construct.json replaced by
        ``fix(parent, known)``, where ``known(name)`` says whether ``name`` is one of them."""
        with self.lock:
            self.docs.rewrite_parents(fix)

    def journal_held(self):
        """Records added by this thread inside the block are queued, not flushed (see
        :meth:`JournalPipeline.held`)."""
        return self.journal.held()

    def flush_journal(self) -> None:
        """Resolve pending statistics and append the queued records to the crash journal (a
        record waits there for its tensor files in flight, see :meth:`JournalPipeline.flush`)."""
        with self.lock:
            self.journal.flush(self.docs.pending, self.fetch_stats, self.docs.encoded)

    # ---------------------------------------------------------------- tensors
    def save_tensor(self, data_name: str, produce: Callable[[], bytes], nbytes: int,
                    release: Optional[Callable[[], None]] = None) -> None:
        """Queue a tensor file write under ``dump_tensor_data/`` (background, bounded, retried);
        ``release()`` is called once the file is written or has failed for good (its buffer may
        then be reused), never when it was not queued.

        The record referring to it is journaled only once the file is published (see
        :meth:`flush_journal`)."""
        docs = self.docs
        file_name = docs.file_name(data_name)
        docs.files.add(file_name)
        if self.failures.tensors_off:  # the disk is full: said once; each file not written is counted
            self._skip_tensor()
            return
        self.file_sink.save(f"{self.rank_prefix}/{TENSOR_DIR}/{file_name}", data_name, produce, nbytes, release)

    def save_payload(self, data_name: str, logical_dtype: str, shape: tuple, produce: Callable[[], Any],
                     nbytes: int, same_as: Optional[str] = None) -> None:
        """Queue a tensor's raw little-endian bytes for the Zarr tensor store (deduplicated there)."""
        self.docs.files.add(data_name)
        if self.failures.tensors_off:
            self._skip_tensor()
            return
        self.zarr_sink.save(data_name, logical_dtype, shape, produce, nbytes, same_as=same_as)

    def _skip_tensor(self) -> None:
        self.failures.skipped()
        self.docs.skipped += 1

    # ---------------------------------------------------------------- publish
    def publish(self, *, final: bool = False) -> None:
        """Write dump.json/debug.json, stack.json, construct.json atomically (after every tensor
        file of the step is written), then drop the journal when ``final``."""
        with self.lock:
            if not self._dirty:
                if final:
                    if self.journal.journal is not None:
                        self.publisher.mark_final(self.rank_prefix)
                    self.journal.close(delete=True)
                return
            docs = self.docs
            docs.pending.resolve(self.fetch_stats)
            self.flush_journal()
            prefix = self.rank_prefix
            failed = self._settle_tensors()
            docs_failed = self.publisher.write(
                prefix, docs, step=self.current_step, rank=self.rank,
                complete=failed is None and not docs.skipped, final=final, zarr=self.zarr_sink.open_writer is not None,
                digests=self.file_sink.digests, locations=self.zarr_sink.locations)
            failed = docs_failed or failed
            self._dirty = False
            if final:  # the journal stays when the documents could not be written (msprobe recover)
                self.journal.close(delete=docs_failed is None)
            if failed is not None and self.config.strict:
                raise failed

    def _settle_tensors(self) -> Optional[Exception]:
        """Wait for every tensor of the step, then journal every record; the failure met."""
        failed: Optional[Exception] = None
        try:
            self.file_sink.settle()
        except Exception as exc:  # noqa: BLE001 - never crash training for the dump
            failed = exc
            self.failures.errors.append(str(exc))
        self.journal.release_all()  # every tensor is settled: the journal holds every record
        try:
            self.zarr_sink.settle()
        except Exception as exc:  # noqa: BLE001 - never crash training for the dump
            failed = exc
            self.failures.note("tensor_store", exc)
        if self.failures.tensors_off:  # the disk is full: the journal's room goes to the documents
            self.journal.release_reserve()
        return failed

    def end_step(self) -> None:
        """Finish the current step (publish if anything was recorded) and move to the next."""
        with self.lock:
            self.publish(final=True)
            self.current_step += 1
            self._new_step()
            self.file_sink.close()  # its error log names the finished step's directory
            self._close_zarr()
            self.reset_counters()

    def close(self) -> None:
        """The process ends (atexit) or the debugger is torn down: the current step's dump is
        final, as after ``step()`` (also when ``stop()`` published it already and no step()
        follows, as in the docs' quick start)."""
        with self.lock:
            if self._dirty or self.journal.journal is not None:
                self.publish(final=True)
            try:
                self.file_sink.close()
            except Exception as exc:  # noqa: BLE001 - never crash training for the dump
                self.failures.errors.append(str(exc))
            self._close_zarr()
            if not self._summarized:
                self._summarized = True
                self.failures.summary_warning()
                self.claims.warn_stale_steps(lambda: self.rank_dir)

    def _close_zarr(self) -> None:
        try:
            self.zarr_sink.close()
        except Exception as exc:  # noqa: BLE001 - never crash training for the dump
            self.failures.errors.append(str(exc))
