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
are cancelled.
"""
from __future__ import annotations

import os
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from typing import Any, Callable, Iterable, Optional

from msprobe.errors import ConfigError, require

__all__ = ["Executor", "LOCAL_CLUSTER_MIN_TASKS", "star"]

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
            weight: Optional[Callable[[Any], int]] = None, local_cluster: Any = None, pure: bool = False) -> list:
        """``[fn(job) for job in jobs]``, run where the executor says, in job order.

        ``progress``: a :class:`~msprobe.progress.Progress` updated by ``weight(job)`` (default 1)
        as each job finishes. ``local_cluster`` overrides the LocalCluster policy for this list
        (False for cheap jobs such as listings). ``pure``: Dask may reuse results of equal jobs."""
        jobs = list(jobs)
        if not jobs:
            return []
        step = weight or _one
        where = self.backend(len(jobs), local_cluster=local_cluster)
        if where == "dask":
            started = self.client() is None
            client = self._start_local_cluster() if started else self._client
            self.last = "local-cluster" if self._cluster is not None else "client"
            try:
                return _on_dask(client, fn, jobs, progress, step, pure)
            finally:
                if started:  # a LocalCluster lives for one job list
                    self.close()
        if where == "processes":
            self.last = "processes"
            return _on_pool(min(self.processes, len(jobs)), fn, jobs, progress, step)
        self.last = "in-process"
        out = []
        for job in jobs:
            out.append(fn(job))
            if progress is not None:
                progress.update(step(job))
        return out

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


def _on_dask(client: Any, func: Callable, jobs: list, progress: Any, step: Callable, pure: bool) -> list:
    from distributed import as_completed

    futures = client.map(func, jobs, pure=pure)
    index = {future.key: i for i, future in enumerate(futures)}
    try:
        if progress is not None:
            for future in as_completed(futures):
                future.result()  # a failed job raises here, before the others are waited for
                progress.update(step(jobs[index[future.key]]))
        return client.gather(futures)
    except BaseException:
        client.cancel(futures)
        raise
    finally:
        for future in futures:
            future.release()


def _on_pool(count: int, func: Callable, jobs: list, progress: Any, step: Callable) -> list:
    with ProcessPoolExecutor(max_workers=count) as ex:
        futures = [ex.submit(func, job) for job in jobs]
        index = {future: i for i, future in enumerate(futures)}
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_EXCEPTION)
                for future in done:
                    future.result()
                    if progress is not None:
                        progress.update(step(jobs[index[future]]))
        except BaseException:
            for future in pending:
                future.cancel()
            raise
        return [future.result() for future in futures]


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
