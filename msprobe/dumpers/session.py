"""The framework-neutral dump session: step/rank, call counters, filters, naming,
the crash journal, tensor writes and the atomic publish of the documents.

A framework adapter (PyTorch, MindSpore) turns framework objects into record
entries; the session decides *whether* and *under which name* a call is
recorded, and *where* its bytes go. Statistics stay on the device as pending
values (``StatRef``) and are fetched in batches when records are journaled or
published, never one sync per value.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
import warnings
import weakref
from collections import defaultdict, deque
from typing import Any, Callable, Optional

from msprobe import __version__
from msprobe.backends import BackgroundWriter, LocalStore, append_log_line, claim_run_dir, open_store
from msprobe.backends._base import Store
from msprobe.backends._keys import TEMP_MARKER
from msprobe.backends._open import bound_store, bounded_storage_options
from msprobe.backends._retry import Breaker, RetryPolicy, StoreLike, is_disk_full, put_retrying
from msprobe.dumpers.config import DumpConfig
from msprobe.errors import StorageError, StoragePermissionError
from msprobe.format.documents import encode_documents
from msprobe.format.journal import NO_PARENT, encode_record, encode_stack
from msprobe.format.layout import (
    ERROR_LOG,
    JOURNAL_DIR,
    MAPPING_CSV,
    MARKER_FILE,
    STEP_DIR_RE,
    TENSOR_DIR,
    data_dir_url,
    encode_mapping,
    join_key,
    rank_dir_name,
    step_ranges,
)
from msprobe.format.marker import build_marker, decode_marker, encode_marker, mark_final
from msprobe.format.model import data_names
from msprobe.format.naming import converted_file_name, needs_mapping
from msprobe.tensor_store import ZarrTensorWriter

__all__ = ["DumpSession", "StackTable", "PendingStats"]

log = logging.getLogger("msprobe.dump")

#: disk reserved for the journal of a rank directory on local stores, so records are still
#: journaled when tensor files fill the disk (released when the journal closes)
JOURNAL_RESERVE = 256 << 10

#: most error lines kept in memory per rank directory (copied to the store at publish)
_MAX_LOG_LINES = 10_000


class StorageFailureWarning(UserWarning):
    """An object of the dump could not be written (emitted once per session, and once at the end)."""


class _Failures:
    """The storage failures of one session: the first one is said once (``logging`` and
    ``warnings``, on stderr), each is appended to an error log that lives on local disk (the
    rank directory of a local store; a temporary file for object stores, copied into the
    rank directory when the step's documents are published), and the objects not written are
    counted for the summary at the end."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0  # objects not written
        self.warned = False
        self.disk_full = False
        self.lines: dict = defaultdict(list)  # rank prefix -> error lines not yet copied to the store
        self.local_log: Optional[str] = None  # where the lines are kept on local disk
        self.first: Optional[str] = None

    def temp_log(self) -> str:
        import tempfile

        if self.local_log is None:
            self.local_log = os.path.join(tempfile.gettempdir(), f"msprobe_dump_error_info.{os.getpid()}.log")
        return self.local_log


def _probe_local_dir(path: str) -> None:
    """Raise the OSError that writing below ``path`` meets: a probe file in ``path`` when it
    exists, else a probe directory in its nearest existing ancestor (nothing is left behind)."""
    path = os.path.abspath(path)
    here = path
    while not os.path.isdir(here):
        if os.path.lexists(here):
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
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, b"msprobe write probe")
        finally:
            os.close(fd)
            os.unlink(probe)
    else:
        os.mkdir(probe)
        os.rmdir(probe)


def _append_local(path: str, line: str) -> bool:
    """One ``O_APPEND`` write of ``line`` to a local file (no retry); False when it failed."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o666)
        try:
            os.write(fd, line.encode("utf-8", "replace"))
        finally:
            os.close(fd)
        return True
    except OSError:
        return False


class StatsFetchError(Exception):
    """Raised by a ``fetch_stats`` whose batch met the failure of the computation behind a
    tensor (an asynchronous kernel error surfacing at the read): ``values`` holds the batch's
    statistics (None where unreadable) and ``error`` the framework's exception, which the
    session raises to the training script once the entries are filled: the dump never
    swallows an error the script would have seen without it."""

    def __init__(self, values: list, error: BaseException) -> None:
        super().__init__(str(error))
        self.values = values
        self.error = error


class PendingStats:
    """Tensor entries whose statistics are still on the device.

    ``add(entry, handle)`` remembers an entry (a dict with Max/Min/Mean/Norm keys already
    in place) and an adapter-specific handle; ``resolve(fn)`` fetches every handle in one
    batch via ``fn(handles) -> list[tuple]`` and fills the entries in place.
    """

    __slots__ = ("entries", "handles")

    def __init__(self) -> None:
        self.entries: list = []
        self.handles: list = []

    def add(self, entry: dict, handle: Any) -> None:
        self.entries.append(entry)
        self.handles.append(handle)

    def __len__(self) -> int:
        return len(self.entries)

    def resolve(self, fetch: Callable[[list], list]) -> None:
        if not self.entries:
            return
        error = None
        try:
            values = fetch(self.handles)
        except StatsFetchError as exc:
            values, error = exc.values, exc.error
        for entry, vals in zip(self.entries, values):
            if "md5" in vals:
                entry["md5"] = vals["md5"]
            for k in ("Max", "Min", "Mean", "Norm"):
                if k in entry:
                    entry[k] = vals.get(k)
        self.entries = []
        self.handles = []
        if error is not None:
            raise error


class StackTable:
    """stack.json: each distinct stack stored once, records refer to it by id."""

    def __init__(self) -> None:
        self.ids: dict = {}  # frames tuple -> id
        self.names: dict = defaultdict(list)  # id -> record names
        self.frames: dict = {}  # id -> frames tuple

    def add(self, name: str, frames: tuple) -> tuple:
        """Returns (stack id, True when this stack is new)."""
        sid = self.ids.get(frames)
        new = sid is None
        if new:
            sid = self.ids[frames] = len(self.ids)
            self.frames[sid] = frames
        self.names[sid].append(name)
        return sid, new

    def to_json(self, render: Callable[[tuple], list]) -> dict:
        return {str(sid): [self.names[sid], render(self.frames[sid])] for sid in sorted(self.names)}

    def clear(self) -> None:
        self.ids.clear()
        self.names.clear()
        self.frames.clear()


class _RetryingPut:
    """``put`` of a store with :func:`put_retrying` (the dumper's retry policy)."""

    def __init__(self, store: StoreLike, policy: Any) -> None:
        self.store, self.policy = store, policy

    def put(self, key: str, data: bytes) -> None:
        put_retrying(self.store, key, data, overwrite=True, policy=self.policy)


class DumpSession:
    """One process's dump: owns the storage, the step state and the documents being built."""

    def __init__(self, config: DumpConfig, framework: str, *, fetch_stats: Callable[[list], list],
                 render_stack: Callable[[tuple], list], get_rank: Callable[[], Optional[int]],
                 producer: str = "msprobe-lake"):
        self.config = config
        self.framework = framework
        self.fetch_stats = fetch_stats
        self.render_stack = render_stack
        self.get_rank = get_rank
        self.producer = f"{producer} {__version__}"
        self.lock = threading.RLock()
        #: guards the journal, the lines held back for tensors in flight and ``_inflight``;
        #: the writer's workers take it (never ``lock``: publish() holds ``lock`` while it
        #: waits for the writer)
        self._jlock = threading.Lock()
        self._held_here = threading.local()  # see journal_held()
        self.current_step = 0
        self.rank: Optional[int] = None
        self._rank_resolved = False
        self._store: Optional[Store] = None
        self._writer = None
        self._tstore = None
        self._journal = None
        self._reset_step_state()
        self.api_counts: dict = defaultdict(int)
        self.module_counts: dict = defaultdict(int)
        self.records_total = 0
        self.errors: list = []
        self._claimed: Optional[int] = None
        self._earlier_steps: Optional[set] = None  # steps of this rank dir in dump_path before the run (claim())
        self._steps_written: set = set()
        self._breaker = None
        self._jbatch: Optional[int] = None
        self._window_timer: Optional[threading.Timer] = None
        self.failures = _Failures()
        #: a full disk (ENOSPC/EDQUOT): no more tensor files this run; records are still journaled
        self.tensors_off = False
        self._summarized = False
        if getattr(config, "online", None) is None:  # online_run_ut sends packets, it writes no dump
            self.check_writable()

    # ------------------------------------------------------------------ state
    def _reset_step_state(self) -> None:
        self.data: dict = {}
        self.construct: dict = {}
        self.stacks = StackTable()
        self.pending = PendingStats()
        self._journal_queue: list = []
        #: data_name -> journal lines waiting for that tensor file (submitted, not yet published)
        self._inflight: dict = {}
        #: journal lines in execution order, each [bytes, tensor files still in flight, is a record]
        self._held: deque = deque()
        self._unflushed = 0  # records appended to the journal since its last flush
        self.records_journaled = 0
        self._dirty = False
        self._files: set = set()
        self._mapping: dict = {}
        self._same_memory: dict = {}  # tensor store: memory key -> (owner ref, version, first data name)
        self._locations: dict = {}
        self.overflow_found = 0
        self._skipped = 0  # tensor files of this step not written (the disk is full)

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
        if self._store is None:
            cfg = self.config
            options = bounded_storage_options(cfg.dump_path, cfg.storage_options, cfg.storage_timeout)
            self._store = bound_store(open_store(cfg.dump_path, storage_options=options), cfg.storage_timeout,
                                      self._get_breaker())
        return self._store

    def policy(self):
        """The retry policy of every storage operation of this session: one total deadline
        (``storage_timeout``) per operation, and one breaker: once the store has not answered
        for a whole deadline, the operations that follow fail at once (counted, logged) for a
        cool-down instead of each waiting out its own deadline."""
        return RetryPolicy(deadline=self.config.storage_timeout, breaker=self._get_breaker())

    def _get_breaker(self):
        if self._breaker is None:
            self._breaker = Breaker(cooldown=2 * self.config.storage_timeout)
        return self._breaker

    def check_writable(self) -> None:
        """At ``PrecisionDebugger()``: prove that ``dump_path`` can be written (a probe object
        created and deleted), or raise a typed :class:`StorageError` naming the path and the cause."""
        path = self.config.dump_path
        try:
            if "://" not in path.split("::", 1)[0] or path.startswith("file://"):
                _probe_local_dir(path.split("://", 1)[-1] if path.startswith("file://") else path)
                return
            store, key = self.store, f".probe{TEMP_MARKER}{os.getpid()}-{threading.get_ident()}"
            policy = self.policy()
            policy.call(lambda: store.put(key, b"msprobe write probe"))
            policy.call(lambda: store.delete(key))
        except Exception as exc:  # noqa: BLE001 - never crash training for the dump: the failure is counted and logged
            cls = StoragePermissionError if isinstance(exc, PermissionError) else StorageError
            cause = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise cls(f"dump_path {path} is not writable: {cause}") from None

    @property
    def writer(self):
        if self._writer is None:
            store = self.store
            if getattr(store, "is_local", False) and not self.config.fsync_tensors:
                # tensor files: still atomic (temp file + rename), not fsync'ed one by one
                store = LocalStore(store.local_path(""), fsync=False)
            self._writer = BackgroundWriter(
                store, max_bytes_in_flight=self.config.max_bytes_in_flight,
                workers=self.config.writer_workers, retry_policy=self.policy(), on_failure=self._tensor_failed,
                digests=True)
        return self._writer

    def _tensor_failed(self, key: str, exc: BaseException) -> None:
        """A tensor file could not be written (writer thread): a full disk stops tensor writes."""
        if is_disk_full(exc):
            self.tensors_off = True
        self.note_error("tensor", exc, key=key)

    @property
    def objects_not_written(self) -> int:
        """Objects (tensor files, documents, journal batches) this session could not write."""
        return self.failures.count

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
        """Before writing a step: with ``run_dir_policy: "refuse"``, a rank directory that already
        holds another run's dump is an error instead of being overwritten (msprobe overwrites).

        The directory is claimed atomically: by the exclusive creation of its claim marker
        (``O_EXCL``/``link`` locally, a conditional put ``If-None-Match: *`` on object stores),
        so of several runs starting together exactly one gets it.

        At the run's first claim, the steps that ``dump_path`` already holds for this rank
        directory are noted (``"clear"``: removed); at :meth:`close` those this run did not
        write are named in one warning (readers would mix them with this run)."""
        if self._claimed == self.current_step or getattr(self.config, "online", None) is not None:
            return  # (online_run_ut sends packets: dump_path, and its storage_options, are not written)
        if self._earlier_steps is None:
            self._earlier_steps = self._steps_held()
            if self.config.run_dir_policy == "clear" and self._earlier_steps:
                self._clear_steps(self._earlier_steps)
                self._earlier_steps = set()
        if self.config.run_dir_policy != "refuse":
            self._steps_written.add(self.current_step)
            self._claimed = self.current_step
            return

        prefix = self.rank_prefix
        try:
            claim_run_dir(self.store, prefix, "refuse", retry_policy=self.policy(),
                          info={"step": self.current_step, "rank": self.rank})
        except StoragePermissionError as exc:
            if "already holds another run" not in str(exc):
                raise
            raise StoragePermissionError(
                f"{self.store.url.rstrip('/')}/{prefix} already holds a dump of another run; "
                "choose another dump_path or set run_dir_policy to 'overwrite' (or 'clear')") from None
        self._steps_written.add(self.current_step)
        self._claimed = self.current_step

    def _steps_held(self) -> set:
        """The steps of ``dump_path`` that hold this process's rank directory (an earlier run's)."""
        store, rank_dir = self.store, self.rank_dir
        try:
            steps = [int(m.group("step")) for m in map(STEP_DIR_RE.match, (n.rstrip("/") for n in store.list_dir("")))
                     if m]
            return {n for n in steps if rank_dir in {x.rstrip("/") for x in store.list_dir(f"step{n}")}}
        except Exception as exc:  # noqa: BLE001 - never crash training for the dump: the failure is counted and logged
            self.note_error("listing", exc)
            return set()

    def _clear_steps(self, steps: set) -> None:
        """``run_dir_policy: "clear"``: remove this rank directory from each step of ``steps``."""
        store = self.store
        for n in sorted(steps):
            prefix = f"step{n}/{self.rank_dir}"
            try:
                local = store.local_path(prefix)
                if local is not None:
                    shutil.rmtree(local)
                    with contextlib.suppress(OSError):  # the step's folder, when no other rank is in it
                        os.rmdir(os.path.dirname(local))
                    continue
                for key in store.list_prefix(prefix):
                    store.delete(key)
            except Exception as exc:  # noqa: BLE001 - never crash training for the dump: the failure is counted and logged
                self.note_error("clearing", exc, key=prefix)
        log.info("msprobe: run_dir_policy 'clear': removed %s of step(s) %s of an earlier run from %s",
                 self.rank_dir, step_ranges(sorted(steps)), self.store.url)

    def stale_steps(self) -> list:
        """The steps ``dump_path`` held for this rank directory before this run and that this run
        has not written (an earlier, longer run's): readers mix them with this run's."""
        return sorted((self._earlier_steps or set()) - self._steps_written)

    def _warn_stale_steps(self) -> None:
        stale = self.stale_steps()
        if not stale or not self._steps_written:  # (a run that wrote nothing mixes nothing)
            return
        warnings.warn(
            f"msprobe: {self.store.url.rstrip('/')} still holds step(s) {step_ranges(stale)} of an earlier run in "
            f"{self.rank_dir}/ beside this run's step(s) {step_ranges(sorted(self._steps_written))}: readers mix the two "
            f"runs; remove them, or dump with run_dir_policy 'clear' (removes them at start) or 'refuse'",
            RuntimeWarning, stacklevel=2)

    def rank_enabled(self) -> bool:
        ranks = self.config.rank
        return ranks is None or (self.resolve_rank() or 0) in ranks

    def step_enabled(self) -> bool:
        steps = self.config.step
        return steps is None or self.current_step in steps

    # ----------------------------------------------------------------- naming
    def next_api_name(self, api_key: str) -> tuple[str, int]:
        """``api_key`` is ``Prefix.api``; returns (``Prefix.api.n``, n) and advances the counter."""
        n = self.api_counts[api_key]
        self.api_counts[api_key] = n + 1
        return f"{api_key}.{n}", n

    def next_module_index(self, module_key: str) -> int:
        n = self.module_counts[module_key]
        self.module_counts[module_key] = n + 1
        return n

    def data_file_name(self, data_name: str) -> str:
        """The file name for ``data_name`` (the 255-character rule, recorded in mapping.csv)."""
        if not needs_mapping(data_name):
            return data_name
        short = converted_file_name(data_name)
        self._mapping[data_name] = short
        return short

    # ---------------------------------------------------------------- records
    def add_structure(self, name: str, parent: Optional[str]) -> None:
        """A call outside the list/scope filters: no record, but it is part of the model's structure."""
        if self.config.level in ("L0", "mix"):
            with self.lock:
                self.construct[name] = parent
                self._dirty = True

    def add_record(self, name: str, raw: Any, *, stack: Optional[tuple] = None, parent: Optional[str] = None,
                   construct: bool = True) -> None:
        """Add (or replace) a record of the current step; journal it when its batch is full."""
        with self.lock:
            if self.config.task != "structure":  # structure: only stack.json and construct.json
                self.data[name] = raw
            sid = None
            if stack is not None and self.config.stack:
                sid, new = self.stacks.add(name, stack)
                if new:
                    self._journal_queue.append((None, sid, None, stack))
            if construct and self.config.level in ("L0", "mix"):
                self.construct[name] = parent
            self._dirty = True
            self.records_total += 1
            self._journal_queue.append((name, raw, parent, sid))
            if len(self._journal_queue) >= (self.config.journal_flush or 1) and \
                    not getattr(self._held_here, "on", False):
                self.flush_journal()

    def record(self, name: str) -> Any:
        """The record ``name`` of the current step so far (None when there is none)."""
        with self.lock:
            return self.data.get(name)

    def remove_record(self, name: str) -> None:
        """Drop the record ``name`` of the current step (it is added again at its new place)."""
        with self.lock:
            self.data.pop(name, None)

    def ensure_structure(self, name: str, parent: Optional[str] = None) -> None:
        """``name`` in construct.json (under ``parent``) unless it is there already."""
        with self.lock:
            self.construct.setdefault(name, parent)

    def rewrite_parents(self, fix: Callable[[Optional[str], Callable[[Optional[str]], bool]], Optional[str]]) -> None:
        """Each parent of construct.json replaced by ``fix(parent, known)``, where ``known(name)``
        says whether ``name`` is a record or in construct.json."""
        with self.lock:
            data, construct = self.data, self.construct

            def known(name: Optional[str]) -> bool:
                return name in data or name in construct

            for child, parent in list(construct.items()):
                construct[child] = fix(parent, known)

    def same_memory(self, key: tuple, owner: Any, version: int) -> Optional[str]:
        """Tensor store: the data name of the tensor saved earlier in this step from the memory
        ``key`` of ``owner`` at ``version`` (None when there is none)."""
        hit = self._same_memory.get(key)
        return hit[2] if hit is not None and hit[0]() is owner and hit[1] == version else None

    def remember_memory(self, key: tuple, owner: Any, version: int, data_name: str) -> None:
        """Tensor store: ``data_name`` was saved from the memory ``key`` of ``owner`` at ``version``."""
        try:
            self._same_memory[key] = (weakref.ref(owner), version, data_name)
        except TypeError:  # an owner without weak references: never aliased
            pass

    @contextlib.contextmanager
    def journal_held(self):
        """Records added by this thread inside the block are queued, not flushed: a callback
        run by a graph in execution cannot read tensors (each read waits for that graph: a
        deadlock). They are journaled by the next flush outside the block (stop, step)."""
        prev = getattr(self._held_here, "on", False)
        self._held_here.on = True
        try:
            yield
        finally:
            self._held_here.on = prev

    def save_tensor(self, data_name: str, produce: Callable[[], bytes], nbytes: int) -> None:
        """Queue a tensor file write under ``dump_tensor_data/`` (background, bounded, retried).

        The record referring to it is journaled only once the file is published (see
        :meth:`flush_journal`)."""
        fname = self.data_file_name(data_name)
        self._files.add(fname)
        if self.tensors_off:  # the disk is full: said once; each file not written is counted
            self._skip_tensor()
            return
        writer = self.writer
        with self._jlock:
            if self._journal is None:  # before the first tensor file: the journal's room on the disk
                try:
                    self._open_journal()
                except Exception as exc:  # noqa: BLE001 - the journal is a safety net
                    self.note_error("journal", exc)
            self._inflight[data_name] = []
        try:
            writer.submit(f"{self.rank_prefix}/{TENSOR_DIR}/{fname}", produce, nbytes=nbytes,
                          on_done=lambda error, dn=data_name: self._tensor_done(dn))
        except BaseException:
            self._tensor_done(data_name)
            raise

    def _skip_tensor(self) -> None:
        with self.failures.lock:
            self.failures.count += 1
        self._skipped += 1

    def _tensor_done(self, data_name: str) -> None:
        """A tensor file is published (or failed for good): release the journal lines that
        waited for it, in order. Runs in a writer thread."""
        with self._jlock:
            for held in self._inflight.pop(data_name, ()):
                held[1] -= 1
            if self._held:
                self._release_locked(force=False)

    @property
    def tensor_store(self):
        """The Zarr tensor store writer of the current step and rank (``tensor_store: "zarr"``)."""
        if self._tstore is None:
            cfg = self.config
            store = self.store
            if getattr(store, "is_local", False) and not cfg.fsync_tensors:
                # shards: still atomic (temp file + rename), not fsync'ed (as the classic tensor files)
                store = LocalStore(store.local_path(""), fsync=False)
            self._tstore = ZarrTensorWriter(
                store, self.rank_prefix, compression=cfg.tensor_compression,
                shard_bytes=cfg.tensor_shard_mb << 20, max_bytes_in_flight=cfg.max_bytes_in_flight,
                workers=max(1, min(cfg.writer_workers, 4)), journal_fsync=cfg.journal_fsync,
                flush_window=cfg.journal_window)  # a kill loses at most that window of payloads, not a shard
        return self._tstore

    def save_payload(self, data_name: str, logical_dtype: str, shape: tuple, produce: Callable[[], Any],
                     nbytes: int, same_as: Optional[str] = None) -> None:
        """Queue a tensor's raw little-endian bytes for the Zarr tensor store (deduplicated there)."""
        self._files.add(data_name)
        if self.tensors_off:
            self._skip_tensor()
            return
        self.tensor_store.add(data_name, logical_dtype, shape, produce, nbytes, same_as=same_as)

    def flush_journal(self) -> None:
        """Resolve pending statistics and append the queued records to the crash journal.

        A record whose tensor files are still being written is held back (with every record
        after it, so the journal stays in execution order) until the writer has published
        them: a journaled record always has its tensors (tensor mode loses nothing to a kill
        between the call and its file). The statistics path holds nothing back."""
        with self.lock:
            if not self._journal_queue:
                return
            self.pending.resolve(self.fetch_stats)
            queue, self._journal_queue = self._journal_queue, []
            lines = self._journal_lines(queue)
            with self._jlock:
                inflight, held = self._inflight, self._held
                for line, is_record, raw in lines:
                    item = [line, 0, is_record]
                    if is_record and inflight:  # tensor mode: wait for the record's files still in flight
                        for dn in data_names(raw, bounded=False):
                            waiting = inflight.get(dn)
                            if waiting is not None:
                                waiting.append(item)
                                item[1] += 1
                    held.append(item)
                self._release_locked(force=False)

    @property
    def journal_batch(self) -> int:
        """Records per journal flush: ``journal_flush``, or by default 1 on local and shared
        directories (each record is handed to the kernel with one ``os.write`` as it completes,
        so a SIGKILL loses none) and 64 on object stores (one new segment object per flush),
        where a record waits at most ``journal_window`` seconds for its flush."""
        if self._jbatch is None:
            n = self.config.journal_flush
            self._jbatch = n if n is not None else (1 if getattr(self.store, "is_local", False) else 64)
        return self._jbatch

    def _window_flush(self) -> None:
        """Timer thread (object stores): flush the records waiting longer than ``journal_window``."""
        with self._jlock:
            self._window_timer = None
            if self._unflushed:
                self._release_locked(force=True)

    def _journal_lines(self, queue: list) -> list:
        """[(line bytes, 1 for a record / 0 for a stack, record)] of the queued entries."""
        with_parent = self.config.level in ("L0", "mix")
        out = []
        for name, raw, parent, sid in queue:
            if name is None:  # a new stack: its frames once, records refer to its id
                out.append((encode_stack(raw, self.render_stack(sid)), 0, None))
                continue
            out.append((encode_record(name, raw, parent=parent if with_parent else NO_PARENT, stack_id=sid), 1, raw))
        return out

    def _release_locked(self, *, force: bool) -> None:
        """Append the held lines whose tensors are all published, up to the first one still
        waiting; flush the journal when ``force`` or ``journal_flush`` records are unflushed."""
        held = self._held
        try:
            j = None
            while held and held[0][1] <= 0:
                line = held.popleft()
                if j is None:
                    j = self._open_journal()
                j.append(line[0])
                self._unflushed += line[2]
                self.records_journaled += line[2]
            if self._unflushed and (force or self._unflushed >= self.journal_batch):
                self._unflushed = 0
                (j or self._open_journal()).flush()
            elif self._unflushed and self._window_timer is None:  # flushed within journal_window at the latest
                self._window_timer = threading.Timer(self.config.journal_window, self._window_flush)
                self._window_timer.daemon = True
                self._window_timer.start()
        except Exception as exc:  # noqa: BLE001 - the journal is a safety net: never crash training for it
            self._unflushed = 0
            self.note_error("journal", exc)

    def _open_journal(self):
        if self._journal is None:
            self._drop_final_marker()
            local = getattr(self.store, "is_local", False)
            self._journal = self.store.journal(f"{self.rank_prefix}/{JOURNAL_DIR}", fsync=self.config.journal_fsync,
                                               retry_policy=self.policy(), **({"reserve_bytes": JOURNAL_RESERVE}
                                                                              if local else {}))
            if local:
                self._journal.open_segment()  # its reserve is taken before the tensor files fill the disk
        return self._journal

    def _mark_final(self) -> None:
        """Published already (at stop()): say so in the marker before the journal is deleted."""
        key = f"{self.rank_prefix}/{MARKER_FILE}"
        try:
            policy = self.policy()  # the marker is read back with the same retries as every publish
            if self._journal is not None and policy.call(lambda: self.store.exists(key)):
                _RetryingPut(self.store, self.policy()).put(key, mark_final(policy.call(lambda: self.store.get(key))))
        except Exception as exc:  # noqa: BLE001 - never crash training for the dump: the failure is counted and logged
            self.note_error("marker", exc)

    def _drop_final_marker(self) -> None:
        """A new journal in a rank dir whose marker says ``final`` (an earlier run): remove that
        marker, so recovery does not mistake this run's journal for stale leftovers."""
        key = f"{self.rank_prefix}/{MARKER_FILE}"
        try:
            if self.store.exists(key) and decode_marker(self.store.get(key)).get("final"):
                self.store.delete(key)
        except Exception:  # noqa: BLE001 - never crash training for the dump: the failure is counted and logged
            pass

    def note_error(self, what: str, exc: BaseException, *, key: Optional[str] = None) -> None:
        """One object (or batch) not written: counted, said once on stderr, logged locally."""
        f = self.failures
        where = f"{self.store.url.rstrip('/')}/{key}" if key else f"{self.store.url} ({what})"
        message = " ".join(f"{type(exc).__name__}: {exc}".split())
        self.errors.append(f"{what}: {message}")
        disk_full = is_disk_full(exc)
        if disk_full:
            self.tensors_off = True
        prefix = key.rsplit(f"/{TENSOR_DIR}/", 1)[0] if key and f"/{TENSOR_DIR}/" in key else self.rank_prefix
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "+00:00"
        line = f"{stamp}\t{key or what}\t{type(exc).__name__}\t{' '.join(str(exc).split())}\n"
        with f.lock:
            f.count += 1
            first, f.warned = not f.warned, True
            said_full, f.disk_full = f.disk_full, f.disk_full or disk_full
            kept = self._keep_log_line(prefix, line)
        if first or (disk_full and not said_full):
            if disk_full:
                text = (f"msprobe: the disk is full writing {where} ({message}): tensor files are no longer "
                        "written in this run; records are still journaled while the journal fits")
            else:
                text = (f"msprobe: could not write {where} ({message}); training goes on, later failures are "
                        "counted and the total is reported when the dump ends")
            text += f"; error log: {kept}"
            f.first = f.first or text
            log.warning("%s", text)
            warnings.warn(StorageFailureWarning(text), stacklevel=2)

    def _keep_log_line(self, prefix: str, line: str) -> str:
        """Append an error line where it cannot be lost to the failing store (caller holds
        ``failures.lock``); returns where the log is."""
        f = self.failures
        store = self._store
        path = store.local_path(f"{prefix}/{ERROR_LOG}") if store is not None and getattr(store, "is_local", False) else None
        if path is not None:
            if _append_local(path, line):
                return path
        else:
            lines = f.lines[prefix]
            if len(lines) < _MAX_LOG_LINES:
                lines.append(line)
        path = f.temp_log()
        return path if _append_local(path, line) else "stderr only (no local file could be written)"

    def _copy_error_log(self, prefix: str) -> None:
        """Object stores: the step's error lines, kept locally, go into its rank directory once the
        documents are written (one attempt: the store has just answered)."""
        f = self.failures
        with f.lock:
            lines = f.lines.pop(prefix, None)
        if not lines or getattr(self.store, "is_local", False):
            return

        try:
            append_log_line(self.store, f"{prefix}/{ERROR_LOG}", "".join(lines).rstrip("\n"),
                            retry_policy=RetryPolicy(retries=0, deadline=self.config.storage_timeout))
        except Exception as exc:  # noqa: BLE001 - the lines stay in the local log
            log.debug("error log not copied to %s: %s", self.store.url, exc)

    def summary_warning(self) -> None:
        """At the end of the dump: the count of objects not written, if any."""
        f = self.failures
        if not f.count:
            return
        where = f.local_log
        root = self._store.local_path("") if self._store is not None and getattr(self._store, "is_local", False) else None
        if root is not None:
            where = os.path.join(root, "step*", "*", ERROR_LOG) + (f" and {where}" if where else "")
        text = (f"msprobe: {f.count} object(s) of the dump could not be written to {self.config.dump_path}; "
                f"error log: {where or 'stderr only'}")
        log.warning("%s", text)
        warnings.warn(StorageFailureWarning(text), stacklevel=2)

    # ---------------------------------------------------------------- publish
    def publish(self, *, final: bool = False) -> None:
        """Write dump.json/debug.json, stack.json, construct.json atomically (after every tensor
        file of the step is written), then drop the journal when ``final``."""
        with self.lock:
            if not self._dirty:
                if final:
                    self._mark_final()
                    self._close_journal(delete=True)
                return
            self.pending.resolve(self.fetch_stats)
            self.flush_journal()
            prefix = self.rank_prefix
            failed: Optional[Exception] = None
            docs_failed: Optional[Exception] = None
            if self._writer is not None:
                try:
                    self._writer.flush()
                except Exception as exc:  # noqa: BLE001 - never crash training for the dump
                    failed = exc
                    self.errors.append(str(exc))
            with self._jlock:  # every tensor is settled: the journal holds every record
                self._release_locked(force=True)
            if self._tstore is not None:
                try:
                    self._locations = self._tstore.checkpoint()
                except Exception as exc:  # noqa: BLE001 - never crash training for the dump
                    failed = exc
                    self._locations = self._tstore.locations()
                    self.note_error("tensor_store", exc)
            if self.tensors_off and self._journal is not None:  # the disk is full: the journal's room
                self._journal.release_reserve()  # goes to the documents (the journal is flushed)
            debug = self.config.level == "debug"
            doc = {"task": self.config.task, "level": self.config.level, "framework": self.framework,
                   "dump_data_dir": self._dump_data_dir(), "data": self.data}
            try:  # a storage error is recorded (error log, errors), never raised unless strict
                store = _RetryingPut(self.store, self.policy())  # each document: one atomic put, transient failures retried
                docs = encode_documents(doc, debug=debug, stack=None if debug else self.stacks.to_json(self.render_stack),
                                        construct=self.construct)
                for name, body in docs:
                    store.put(f"{prefix}/{name}", body)
                doc_bytes = docs[0][1]
                if self._mapping:
                    store.put(join_key(prefix, TENSOR_DIR, MAPPING_CSV), encode_mapping(self._mapping))
                marker = build_marker(producer=self.producer, framework=self.framework, task=self.config.task,
                                      level=self.config.level, step=self.current_step, rank=self.rank,
                                      records=len(self.data), complete=failed is None and not self._skipped,
                                      pid=os.getpid(), zarr=self._tstore is not None, final=final,
                                      doc_bytes=doc_bytes, files=self._digests(prefix))
                store.put(f"{prefix}/{MARKER_FILE}", encode_marker(marker))
                if self.config.index and not debug:
                    self._write_index(prefix, doc)
            except Exception as exc:  # noqa: BLE001 - never crash training for the dump
                docs_failed = failed = exc
                self.note_error("publish", exc)
            else:
                docs_failed = None
                self._copy_error_log(prefix)
            self._dirty = False
            if final:  # the journal stays when the documents could not be written (msprobe recover)
                self._close_journal(delete=docs_failed is None)
            if failed is not None and self.config.strict:
                raise failed

    def _digests(self, prefix: str) -> dict:
        """{tensor file name: [size, CRC32 hex]} of the step's files this process wrote."""
        digests = getattr(self._writer, "digests", None) or {}
        head = f"{prefix}/{TENSOR_DIR}/"
        return {k[len(head):]: [size, f"{crc:08x}"] for k, (size, crc) in sorted(digests.items()) if k.startswith(head)}

    def _write_index(self, prefix: str, doc: dict) -> None:
        try:
            from msprobe.index import write_rank_index
        except ImportError as exc:
            self.note_error("index", exc)
            return
        try:
            write_rank_index(self.store, prefix, doc, step=self.current_step, rank=self.rank,
                             stack=self.stacks.to_json(self.render_stack), construct=self.construct,
                             locations=self._locations or None)
        except Exception as exc:  # noqa: BLE001 - never crash training for the dump: the failure is counted and logged
            self.note_error("index", exc)

    def _dump_data_dir(self) -> Optional[str]:
        if self.config.task != "tensor" and not self._files:
            return None
        sub = TENSOR_DIR
        if self.config.tensor_store == "zarr":
            from msprobe.format.layout import STORE_DIR as sub
        return data_dir_url(self.store, f"{self.rank_prefix}/{sub}")

    def _close_journal(self, *, delete: bool) -> None:
        with self._jlock:
            if self._journal is not None:
                try:
                    self._journal.close()
                except Exception:  # noqa: BLE001 - never crash training for the dump: the failure is counted and logged
                    pass
                self._journal = None
        if delete:
            try:
                for key in self.store.list_prefix(f"{self.rank_prefix}/{JOURNAL_DIR}"):
                    self.store.delete(key)
                local = self.store.local_path(f"{self.rank_prefix}/{JOURNAL_DIR}")
                if local is not None and os.path.isdir(local):
                    os.rmdir(local)  # a final dump leaves no .journal/ behind (object stores have no directories)
            except Exception:  # noqa: BLE001 - never crash training for the dump: the failure is counted and logged
                pass

    def end_step(self) -> None:
        """Finish the current step (publish if anything was recorded) and move to the next."""
        with self.lock:
            self.publish(final=True)
            self.current_step += 1
            self._reset_step_state()
            if self._writer is not None:  # its error log names the finished step's directory
                self._writer.close()
                self._writer = None
            self._close_tensor_store()
            self.reset_counters()

    def close(self) -> None:
        """The process ends (atexit) or the debugger is torn down: the current step's dump is
        final, as after ``step()`` (also when ``stop()`` published it already and no step()
        follows, as in the docs' quick start)."""
        with self.lock:
            if self._dirty or self._journal is not None:
                self.publish(final=True)
            if self._writer is not None:
                try:
                    self._writer.close()
                except Exception as exc:  # noqa: BLE001 - never crash training for the dump
                    self.errors.append(str(exc))
                self._writer = None
            self._close_tensor_store()
            if not self._summarized:
                self._summarized = True
                self.summary_warning()
                self._warn_stale_steps()

    def _close_tensor_store(self) -> None:
        if self._tstore is not None:
            try:
                self._tstore.close()
            except Exception as exc:  # noqa: BLE001 - never crash training for the dump
                self.errors.append(str(exc))
            self._tstore = None

