"""The one way work is spread: in this process, over a local process pool, or as Dask tasks.

:class:`Executor` maps a module-level function over a list of jobs (one picklable argument
each, typically a dataclass: :class:`msprobe.compare` sends a pair's URLs, :mod:`msprobe.lake`
its batches) and returns the results in job order, reporting each finished job to one
:class:`msprobe.progress.Progress`. Where the jobs run:

* ``client``: a ``distributed.Client``, or a scheduler address (``tcp://host:8786``: a client
  is connected for the executor's life and closed by :meth:`Executor.close`);
* else ``local_cluster``: ``True`` starts a Dask ``LocalCluster`` of ``cluster_workers``
  processes (default: the CPU count, at most 8) for each job list, ``"auto"`` only for lists of
  :data:`LOCAL_CLUSTER_MIN_TASKS` jobs or more (starting one costs seconds);
* else ``processes`` > 1 and more than one job: a ``ProcessPoolExecutor`` of that many;
* else here, one job after the other.

Jobs share nothing with the caller but their argument: each opens what it reads from URLs.
The executor holds no module-level state; a failed job raises in the caller once the others
are cancelled. A ``sink`` given to :meth:`Executor.map` sees each result in the caller as its
job finishes (Dask: in the order they finish, each fetched alone), before the next is fetched.

Files for the caller's disk: a Dask worker may run on a machine that does not share it. An
:class:`Outbox` is a folder of the caller's that jobs write into: a job whose machine sees it
(the outbox's marker file, written by the caller, holds its token) writes there; any other job
writes into a temporary folder and its files travel back with its result (:func:`ship`), to be
written by the caller (:meth:`Outbox.receive`, as the results stream back).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional

from msprobe.errors import ConfigError, require

__all__ = ["Executor", "LOCAL_CLUSTER_MIN_TASKS", "star", "Outbox", "Shipment", "ship"]

#: a job list of at least this many jobs starts a LocalCluster under ``local_cluster="auto"``
LOCAL_CLUSTER_MIN_TASKS = 16


class Executor:
    """Runs job lists where the constructor says (see the module doc).

    ``last``: where the last job list ran: ``client``, ``local-cluster``, ``processes`` or
    ``in-process``. Use as a context manager, or call :meth:`close`."""

    def __init__(self, client: Any = None, *, processes: int = 1, local_cluster: Any = False,
                 cluster_workers: Optional[int] = None):
        if local_cluster not in ("auto", True, False):
            raise ConfigError(f"local={local_cluster!r}: 'auto', True or False")
        if not isinstance(processes, int) or isinstance(processes, bool) or processes < 1:
            raise ConfigError(f"workers={processes!r}: an integer >= 1")
        self._given = client
        self._client: Any = None
        self._cluster: Any = None
        self._own = False
        self.processes = processes
        self.local_cluster = local_cluster
        self.cluster_workers = cluster_workers
        self.last = "none"

    @property
    def distributed(self) -> bool:
        """True when a Dask client (or scheduler address) was given."""
        return self._given is not None

    def backend(self, n_jobs: int, *, local_cluster: Any = None) -> str:
        """Where a list of ``n_jobs`` jobs would run: ``dask``, ``processes`` or ``in-process``."""
        policy = self.local_cluster if local_cluster is None else local_cluster
        if self._given is not None or policy is True or (policy == "auto" and n_jobs >= LOCAL_CLUSTER_MIN_TASKS):
            return "dask"
        return "processes" if self.processes > 1 and n_jobs > 1 else "in-process"

    def client(self) -> Any:
        """The given Dask client (connected on first use when an address was given), or None."""
        if self._client is None and self._given is not None:
            if isinstance(self._given, str):
                distributed = require("distributed", "dask")
                self._client = distributed.Client(self._given)
                self._own = True
            else:
                self._client = self._given
        return self._client

    def _start_local_cluster(self) -> Any:
        distributed = require("distributed", "dask")
        count = self.cluster_workers or min(os.cpu_count() or 1, 8)
        self._cluster = distributed.LocalCluster(n_workers=count, threads_per_worker=1, processes=True,
                                                 dashboard_address=":0")
        self._client = distributed.Client(self._cluster)
        self._own = True
        return self._client

    def map(self, fn: Callable[[Any], Any], jobs: Iterable, *, progress: Any = None,
            weight: Optional[Callable[[Any], int]] = None, local_cluster: Any = None, pure: bool = False,
            sink: Optional[Callable[[Any], Any]] = None) -> list:
        """``[fn(job) for job in jobs]``, run where the executor says, in job order.

        ``progress``: a :class:`~msprobe.progress.Progress` updated by ``weight(job)`` (default 1)
        as each job finishes. ``local_cluster`` overrides the LocalCluster policy for this list
        (False for cheap jobs such as listings). ``pure``: Dask may reuse results of equal jobs.
        ``sink``: called here with each result as its job finishes (Dask: the results fetched one
        at a time, in the order they finish); what it returns is kept in the result's place (so a
        result's bulk, such as the files of a :class:`Shipment`, is dropped once written)."""
        jobs = list(jobs)
        if not jobs:
            return []
        step = weight or _one
        keep = sink or _same
        where = self.backend(len(jobs), local_cluster=local_cluster)
        if where == "dask":
            started = self.client() is None
            client = self._start_local_cluster() if started else self._client
            self.last = "local-cluster" if self._cluster is not None else "client"
            try:
                return _on_dask(client, fn, jobs, progress, step, pure, sink)
            finally:
                if started:  # a LocalCluster lives for one job list
                    self.close()
        if where == "processes":
            self.last = "processes"
            return _on_pool(min(self.processes, len(jobs)), fn, jobs, progress, step, keep)
        self.last = "in-process"
        out = []
        for job in jobs:
            out.append(keep(fn(job)))
            if progress is not None:
                progress.update(step(job))
        return out

    def check_sees(self, path: str, what: str) -> None:
        """Refuse (ConfigError) a folder ``path`` of this machine that a job of a given Dask
        cluster must write and that one of its workers cannot see (another machine's disk)."""
        if self._given is None:
            return
        with Outbox.opened(path) as box:
            seen = self.client().run(_sees, box)
        _refuse([worker for worker, sees in seen.items() if not sees], path, what)

    def check_reads(self, path: str, what: str) -> None:
        """Refuse (ConfigError) a folder ``path`` of this machine that the jobs of a given Dask
        cluster read and that one of its workers does not see as this machine does (the names and
        file sizes of its listing differ: another machine's disk)."""
        if self._given is None:
            return
        here = _listing(path)
        _refuse([worker for worker, got in self.client().run(_listing, path).items() if got != here], path, what)

    def close(self) -> None:
        """Close what the executor started (a client it connected, a LocalCluster)."""
        if self._own:
            try:
                if self._client is not None:
                    self._client.close()
            finally:
                if self._cluster is not None:
                    self._cluster.close()
        self._client = self._cluster = None
        self._own = False

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _one(job: Any) -> int:
    return 1


def _same(result: Any) -> Any:
    return result


def _on_dask(client: Any, func: Callable, jobs: list, progress: Any, step: Callable, pure: bool,
             sink: Optional[Callable[[Any], Any]]) -> list:
    from distributed import as_completed

    futures = client.map(func, jobs, pure=pure)
    index = {future.key: i for i, future in enumerate(futures)}
    try:
        if progress is None and sink is None:
            return client.gather(futures)
        out: list = [None] * len(jobs)
        for future in as_completed(futures):
            at = index[future.key]
            result = future.result()  # a failed job raises here, before the others are waited for
            future.release()  # the worker may forget it: results stream, none is held twice
            out[at] = sink(result) if sink is not None else result
            del result
            if progress is not None:
                progress.update(step(jobs[at]))
        return out
    except BaseException:
        client.cancel(futures)
        raise
    finally:
        for future in futures:
            future.release()


def _on_pool(count: int, func: Callable, jobs: list, progress: Any, step: Callable, keep: Callable) -> list:
    from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait  # multiprocessing: only here

    with ProcessPoolExecutor(max_workers=count) as ex:
        futures = [ex.submit(func, job) for job in jobs]
        index = {future: i for i, future in enumerate(futures)}
        pending = set(futures)
        out: list = [None] * len(jobs)
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_EXCEPTION)
                for future in done:
                    out[index[future]] = keep(future.result())
                    if progress is not None:
                        progress.update(step(jobs[index[future]]))
        except BaseException:
            for future in pending:
                future.cancel()
            raise
        return out


@dataclass(frozen=True)
class Outbox:
    """A folder of the caller's machine that jobs write files into (see the module doc).

    ``path``: as the caller names it (the names its files are given); ``where``: its absolute
    path; ``token``: held by the marker file the caller writes there while jobs run."""

    path: str
    where: str
    token: str

    @classmethod
    @contextlib.contextmanager
    def opened(cls, path: str) -> Iterator["Outbox"]:
        """The folder ``path`` (created) with its marker written, removed at the end."""
        box = cls(path, os.path.abspath(path), uuid.uuid4().hex)
        os.makedirs(box.where, exist_ok=True)
        with open(box.marker, "w", encoding="ascii") as handle:
            handle.write(box.token)
        try:
            yield box
        finally:
            with contextlib.suppress(OSError):
                os.remove(box.marker)

    @property
    def marker(self) -> str:
        return os.path.join(self.where, f".msprobe-outbox-{self.token}")

    def visible(self) -> bool:
        """Whether this machine sees the caller's folder (its marker, with this token)."""
        try:
            with open(self.marker, encoding="ascii") as handle:
                return handle.read() == self.token
        except OSError:
            return False

    def name(self, path: str) -> str:
        """The caller's name of a file written into the outbox (or into a job's stand-in folder)."""
        return os.path.join(self.path, os.path.basename(path))

    def receive(self, shipment: "Shipment") -> Any:
        """Caller side: write a job's shipped files into the folder (each complete before it takes
        its name); the job's own result."""
        for name, data in shipment.files.items():
            if os.path.basename(name) != name or name.startswith("."):
                raise ConfigError(f"a job shipped the file {name!r}: only plain file names go into an outbox")
            target = os.path.join(self.where, name)
            part = f"{target}.part-{self.token}"
            with open(part, "wb") as handle:
                handle.write(data)
            os.replace(part, target)
        return shipment.value


@dataclass
class Shipment:
    """A job's result and the files it wrote for the caller ({file name: bytes}; empty when
    the job wrote them into the caller's folder itself)."""

    value: Any
    files: dict = field(default_factory=dict)


def ship(outbox: Outbox, run: Callable[[str], Any], written: Callable[[Any], list]) -> Shipment:
    """Job side: ``run(folder)`` writes its files into ``folder`` (the outbox itself where this
    machine sees it, else a temporary folder) and returns its result, whose files are
    ``written(result)``; those files are shipped back when the folder was a stand-in."""
    if outbox.visible():
        return Shipment(run(outbox.where))
    stand_in = tempfile.mkdtemp(prefix="msprobe-outbox-")
    try:
        value = run(stand_in)
        files = {}
        for path in written(value):
            with open(path, "rb") as handle:
                files[os.path.basename(path)] = handle.read()
        return Shipment(value, files)
    finally:
        shutil.rmtree(stand_in, ignore_errors=True)


def _sees(outbox: Outbox) -> bool:
    return outbox.visible()


def _listing(path: str) -> Optional[list]:
    """[(name, size of a file or -1)] of the folder ``path``, None where there is none."""
    try:
        with os.scandir(path) as entries:
            return sorted((entry.name, entry.stat().st_size if entry.is_file() else -1) for entry in entries)
    except OSError:
        return None


def _refuse(blind: list, path: str, what: str) -> None:
    if blind:
        raise ConfigError(f"{what} {path} is on this machine's disk, and the Dask worker(s) {', '.join(sorted(blind))} "
                          f"cannot see it (another machine, no shared file system): give a place they share (an "
                          f"object store URL such as s3://..., or a shared file system), or run without a scheduler")


class star:
    """``fn`` called with a job tuple's items as its arguments (picklable when ``fn`` is a
    module-level function): for tasks whose parameters are listed, not bundled in one object."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable):
        self.fn = fn

    def __call__(self, args: tuple) -> Any:
        return self.fn(*args)

    def __reduce__(self) -> tuple:
        return (star, (self.fn,))
