"""Where the lake's tasks run: a given ``dask.distributed.Client`` (or scheduler address),
a ``LocalCluster`` started for a big job, or in this process for a small one.

No scheduling of our own: tasks are plain functions mapped over batches by Dask.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Optional

from msprobe.errors import ConfigError, require

__all__ = ["Runner", "LOCAL_CLUSTER_MIN_TASKS"]

#: a job of at least this many tasks starts a LocalCluster when no client was given
LOCAL_CLUSTER_MIN_TASKS = 16


class Runner:
    """Maps task functions over argument lists.

    ``client``: a ``distributed.Client``, a scheduler address (``tcp://host:8786``), or None.
    ``workers``: the LocalCluster's worker processes (default: the CPU count, at most 8).
    ``local``: ``"auto"`` (a LocalCluster for jobs of ``LOCAL_CLUSTER_MIN_TASKS`` tasks or
    more), ``True`` (always one), ``False`` (never: small jobs run here, serially).
    """

    def __init__(self, client: Any = None, *, workers: Optional[int] = None, local: Any = "auto"):
        self._given = client
        self._client: Any = None
        self._cluster: Any = None
        self._own = False
        self.workers = workers
        if local not in ("auto", True, False):
            raise ConfigError(f"local={local!r}: 'auto', True or False")
        self.local = local
        self.last: str = "none"  # where the last job ran: client | local-cluster | in-process

    @property
    def distributed(self) -> bool:
        return self._given is not None

    def client(self) -> Any:
        if self._client is not None:
            return self._client
        if self._given is None:
            return None
        if isinstance(self._given, str):
            require("distributed", "dask")
            from distributed import Client

            self._client = Client(self._given)
            self._own = True
        else:
            self._client = self._given
        return self._client

    def _local_cluster(self) -> Any:
        require("distributed", "dask")
        from distributed import Client, LocalCluster

        n = self.workers or min(os.cpu_count() or 1, 8)
        self._cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0")
        self._client = Client(self._cluster)
        self._own = True
        return self._client

    def map(self, fn: Callable, args: Iterable, *, pure: bool = False, local: Any = None,
            on_done: Optional[Callable[[int], None]] = None) -> list:
        """``[fn(*a) for a in args]``, as Dask tasks where a client is (or is started).

        ``local``: overrides the runner's LocalCluster policy for this job (False for
        cheap jobs such as listings, that run here unless a client was given).
        ``on_done(i)``: called here as each task ``i`` finishes (in the order they finish)."""
        args = list(args)
        policy = self.local if local is None else local
        if not args:
            return []
        client = self.client()
        started = False
        if client is None and (policy is True or (policy == "auto" and len(args) >= LOCAL_CLUSTER_MIN_TASKS)):
            client = self._local_cluster()
            started = True
        if client is None:
            self.last = "in-process"
            out = []
            for i, a in enumerate(args):
                out.append(fn(*a))
                if on_done is not None:
                    on_done(i)
            return out
        self.last = "local-cluster" if self._cluster is not None else "client"
        futures = client.map(_star, [fn] * len(args), args, pure=pure)
        try:
            if on_done is not None:
                from distributed import as_completed

                index = {f.key: i for i, f in enumerate(futures)}
                for f in as_completed(futures):
                    on_done(index[f.key])
            return client.gather(futures)
        finally:
            for f in futures:
                f.release()
            if started:  # a LocalCluster lives for one job (its start costs seconds, not minutes)
                self.close()

    def close(self) -> None:
        if self._own:
            try:
                if self._client is not None:
                    self._client.close()
            finally:
                if self._cluster is not None:
                    self._cluster.close()
        self._client = self._cluster = None
        self._own = False

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _star(fn: Callable, a: Any) -> Any:
    return fn(*a)
