"""``Lake``: the runs under a root as one partitioned pyarrow dataset, with DuckDB SQL on top."""
from __future__ import annotations

import logging
import os
import re
import time
from typing import Any, Iterable, Optional

from msprobe.backends import FsspecStore, Store
from msprobe.errors import (
    ConfigError,
    MissingDependencyError,
    MsprobeError,
    StorageError,
    StorageNotFoundError,
    StoragePermissionError,
    require,
)
from msprobe.execution import Executor, star
from msprobe.format.protocols import ReadableStore
from msprobe.index import stale_reason, warn_stale
from msprobe.index.files import check_index_file
from msprobe.index.rows import COLUMNS, arrow_schema
from msprobe.lake import _core
from msprobe.lake._questions import disagree, diverge, first_nan, trend
from msprobe.progress import Progress
from msprobe.readers._dump import table_to_pandas
from msprobe.readers._store import arrow_location

__all__ = ["Lake", "s3_settings"]

log = logging.getLogger("msprobe.lake")

_REFRESH = ("missing", "check", "all", "none")


class Lake:
    """A lake root: discovered runs, their Parquet indexes, a catalog, and queries.

    Opening discovers runs (directories below ``root`` that hold step<N>/rank<R> dumps of
    any dialect), their steps and rank directories (listings only; no tensor is read),
    builds the index of every rank directory that has none yet as Dask tasks, merges each
    step's rank indexes into one ``_compact.parquet`` and writes the manifest and the run
    catalog under ``ROOT/_lake/``.

    ``client``: a ``dask.distributed.Client`` or a scheduler address; without one, jobs of
    :data:`msprobe.execution.LOCAL_CLUSTER_MIN_TASKS` tasks or more start a
    ``LocalCluster`` of ``workers`` processes (``local=False``: never; ``True``: always).
    ``refresh``: ``"missing"`` (index rank directories without an index, and re-index those
    whose document changed since: another size or modification time than the index covers,
    as after a re-dump into the same path; one listing per rank directory), ``"check"`` (the
    same; kept for older scripts), ``"all"`` (re-index everything), ``"none"`` (build
    nothing: read what is indexed, leaving out with a warning what is stale).
    ``batch``: rank directories per task.
    ``progress``: a callable given each step's note (runs found, tasks started).
    ``report_progress``: the rank directories indexed so far, as the tasks finish, on stderr
    through :class:`msprobe.progress.Progress` (True; None: only on a terminal; False: never).
    ``duckdb_config``: settings for DuckDB connections (default ``threads``/``memory_limit``).
    ``lake_dir`` (and ``lake_storage_options``): where the lake's own files go (default
    ``ROOT/_lake`` when the root can be written and holds runs, else a local cache directory,
    said in :attr:`lake_note`, which the CLI prints on stderr); the root itself is then only read.
    """

    _fallback: Optional[tuple]  # (cache url, note): where to build when the root's own lake cannot be written
    lake_store: Optional[ReadableStore]  # the lake's own files (writable when refresh allows)


    def __init__(self, root: Any, storage_options: Optional[dict] = None, client: Any = None, *,
                 refresh: str = "missing", workers: Optional[int] = None, local: Any = "auto", batch: int = 64,
                 max_depth: int = 3, duckdb_config: Optional[dict] = None, progress: Any = None,
                 lake_dir: Any = None, lake_storage_options: Optional[dict] = None,
                 report_progress: Optional[bool] = False):
        if refresh not in _REFRESH:
            raise ConfigError(f"refresh={refresh!r}: valid values are {', '.join(_REFRESH)}")
        if batch < 1:
            raise ConfigError(f"batch={batch!r}: must be >= 1")
        self.storage_options = storage_options
        self.store = _core._store(root, storage_options)  # noqa: SLF001
        self.url = self.store.url
        self._progress = progress
        self._report = report_progress  # msprobe.progress.Progress's enabled= for the index tasks
        self.lake_note: Optional[str] = None
        self._locate(lake_dir, lake_storage_options, refresh)
        self.runner = Executor(client, local_cluster=local, cluster_workers=workers)
        self.batch = batch
        self.duckdb_config = dict(duckdb_config or {})
        self._expr: Any = None
        self._con: Any = None
        self._dataset: Any = None
        self.timings: dict = {}
        self.stats: dict = {}
        try:
            self._open(refresh, max_depth)
        except _Relocate:  # the read-only root's own lake needs building: build it in the cache instead
            assert self._fallback is not None  # (_Relocate is raised only with a fallback)
            url, note = self._fallback
            self._fallback = None
            self._note(note)
            self._use(url, None, refresh)
            self._open(refresh, max_depth)

    # -- opening ----------------------------------------------------------------------------------
    def _say(self, what: str) -> None:
        if callable(self._progress):
            self._progress(what)

    def _locate(self, lake_dir: Any, lake_options: Optional[dict], refresh: str) -> None:
        """Where the lake's own files are (``self.lake_url``, ``self.lake_store``): ``lake_dir``
        when given; else ``ROOT/_lake`` when the root can be written; else a local cache
        directory (:func:`msprobe.lake._core.cache_lake_dir`), said in :attr:`lake_note`; also
        when the root is one run's dump or empty (nothing is written into it). A read-only
        root whose ``_lake/`` holds a manifest (built by whoever could write) is read as it is
        while nothing needs writing; the cache takes over when something does."""
        self._fallback = None
        if lake_dir is not None:
            url = os.fspath(lake_dir)
            if lake_options is None and "://" in url and url.split("://", 1)[0] == self.url.split("://", 1)[0]:
                lake_options = self.storage_options  # the same store kind: the root's options
        else:
            url, lake_options = _core.default_lake_url(self.url), self.storage_options
            held = self._holds_manifest(url, lake_options)
            kept = None if held else self._not_a_root()
            why = None if kept is not None else \
                _core.write_refused(self.url, self.storage_options) if refresh != "none" or not held else None
            if kept is not None:  # read-only means read-only: no _lake/ inside a dump or an empty folder
                url, lake_options = _core.cache_lake_dir(self.url), None
                self._note(f"{self.url} is only read ({kept}): the lake's own files go to {url} "
                           "(choose with --lake-dir / lake_dir=)")
            elif why is not None:
                cache = _core.cache_lake_dir(self.url)
                to_cache = (f"{self.url} cannot be written ({why}): the lake's own files go to {cache} "
                            "(choose with --lake-dir / lake_dir=)")
                if held:  # a lake built there before (by whoever could write): read it while it holds
                    self._fallback = (cache, to_cache)
                    self._note(f"{self.url} cannot be written ({why}): reading its lake {url} as it is")
                else:
                    url, lake_options = cache, None
                    self._note(to_cache)
        self._use(url, lake_options, refresh)

    def _not_a_root(self) -> Optional[str]:
        """Why the lake's own files must not go into the root although it can be written: it is
        one run's dump (``_lake/`` would sit inside the dump) or it holds nothing; else None."""
        try:
            names = [n for n in self.store.list_dir("") if not n.startswith(("_", "."))]
        except MsprobeError:
            return None
        if not names:
            return "it is empty"
        if _core.looks_like_dump(names):
            return "it is one run's dump, not a directory of runs"
        return None

    def _note(self, what: str) -> None:
        self.lake_note = what
        log.info("lake: %s", what)  # said on stderr by the CLI (lake_note), once
        self._say(what)

    def _use(self, url: str, lake_options: Optional[dict], refresh: str) -> None:
        self.lake_options = lake_options
        self.lake_store = None
        if refresh != "none":
            try:
                self.lake_store = _core._store(url, lake_options, write=True)  # noqa: SLF001
            except StoragePermissionError:
                pass  # read what is there; building says why it cannot
        if self.lake_store is None:
            try:
                self.lake_store = _core._store(url, lake_options)  # noqa: SLF001
            except StorageNotFoundError:
                self.lake_store = None  # nothing indexed yet
        self.lake_url = self.lake_store.url if self.lake_store is not None else url

    @staticmethod
    def _holds_manifest(url: str, options: Optional[dict]) -> bool:
        try:
            return _core._store(url, options).exists(_core.MANIFEST_KEY)  # noqa: SLF001
        except MsprobeError:
            return False

    def _open(self, refresh: str, max_depth: int) -> None:
        t0 = time.perf_counter()
        found = _core.discover_runs(self.store, max_depth)
        self._say(f"{len(found)} run(s)")
        infos = self.runner.map(star(_core._discover_run),  # noqa: SLF001
                                [(self.url, self.storage_options, r, p) for r, p in found], local_cluster=False)
        self.run_infos = infos
        t1 = time.perf_counter()
        lake = self.lake_store
        existing = set(lake.list_prefix(_core.INDEX_PREFIX)) if lake is not None else set()
        old = {r["index_key"]: r for r in _core.read_manifest(lake)} if lake is not None else {}
        t2 = time.perf_counter()
        rows: dict = {}
        todo: dict = {}  # compact key (one step of one run) -> [(run, loc)]
        members: dict = {}  # compact key -> how many rank dirs the step has
        recover: list = []
        prefix_of = {i["run"]: i["run_prefix"] for i in infos}
        loc_of: dict = {}
        for info in infos:
            run = info["run"]
            for loc in info["locs"]:
                prefix, step, rank_dir, rank, split = loc
                key = _core.index_key(run, step, rank, rank_dir, split)
                ckey = _core.compact_key_of(key)
                members[ckey] = members.get(ckey, 0) + 1
                loc_of[key] = (run, tuple(loc))
                if refresh == "all" or (key not in existing and refresh != "none"):
                    todo.setdefault(ckey, []).append((run, tuple(loc)))
                elif key in old:
                    rows[key] = old[key]
                elif key in existing:
                    recover.append((run, info["run_prefix"], tuple(loc)))
        changed_groups: set = set()
        if recover:
            rec_jobs = [(self.lake_url, self.lake_options, recover[i:i + 256]) for i in range(0, len(recover), 256)]
            for batch_rows in self.runner.map(star(_core._rebuild_rows), rec_jobs, local_cluster=False):  # noqa: SLF001
                for r in batch_rows:
                    rows[r["index_key"]] = r
                    changed_groups.add(_core.compact_key_of(r["index_key"]))
        # what each index covers (document size and time) against the documents now: a re-dump
        # into the same path makes an index stale; it is rebuilt (or, refresh="none", left out)
        stale = self._stale(rows)
        for key in stale:
            del rows[key]
            ckey = _core.compact_key_of(key)
            changed_groups.add(ckey)
            if refresh != "none":
                todo.setdefault(ckey, []).append(loc_of[key])
        if stale:
            k0 = sorted(stale)[0]

            warn_stale(f"of {self.url} ({len(stale)} rank dir(s) changed since they were indexed; first: "
                       f"{loc_of[k0][1][0]})", stale[k0],
                       "left out (refresh='none')" if refresh == "none" else "re-indexing them")
        jobs = []
        direct: set = set()  # steps whose build task writes the compacted file too
        for ckey, items in sorted(todo.items()):
            run = items[0][0]
            whole = len(items) == members[ckey] and 2 <= len(items) <= self.batch
            if whole:
                direct.add(ckey)
            for i in range(0, len(items), self.batch):
                chunk = items[i:i + self.batch]
                jobs.append(_core.BuildJob(self.url, self.storage_options, self.lake_url, self.lake_options, run,
                                           prefix_of[run], [loc for _, loc in chunk], ckey if whole else None))
        n_built = 0
        executor = "none"
        if jobs:
            self._writable()
            n_dirs = sum(len(j.locs) for j in jobs)
            self._say(f"indexing {n_dirs} rank dir(s) in {len(jobs)} task(s)")
            with Progress(n_dirs, "lake index", "rank dirs", enabled=self._report) as bar:
                built_rows = self.runner.map(_core._build_batch, jobs, progress=bar,  # noqa: SLF001
                                             weight=lambda job: len(job.locs))
            executor = self.runner.last
            for batch_rows in built_rows:
                for r in batch_rows:
                    rows[r["index_key"]] = r
                    n_built += 1
                    changed_groups.add(_core.compact_key_of(r["index_key"]))
        t3 = time.perf_counter()
        # index files of rank directories that went away
        gone = [k for k in old if k not in rows] if refresh != "none" else []
        for k in gone:
            changed_groups.add(_core.compact_key_of(k))
        # one compacted file per (run, step) of two or more ranks
        groups: dict = {}
        for key in rows:
            groups.setdefault(_core.compact_key_of(key), []).append(key)
        compact_jobs = []
        for ckey, keys in sorted(groups.items()):
            if ckey in direct and all(rows[k].get("compact_key") == ckey for k in keys):
                continue  # written by its build task
            keys.sort(key=lambda k: (rows[k]["rank"] is None, rows[k]["rank"] or 0, rows[k]["rank_dir"]))
            if len(keys) < 2:
                for k in keys:
                    rows[k]["compact_key"] = None
                continue
            fresh = ckey not in changed_groups and ckey in existing and all(rows[k].get("compact_key") == ckey
                                                                              for k in keys)
            if not fresh and refresh != "none":
                compact_jobs.append(_core.CompactJob(self.lake_url, self.lake_options, ckey, keys))
            usable = fresh or refresh != "none"
            for k in keys:
                rows[k]["compact_key"] = ckey if usable else None
        if compact_jobs:
            self._writable()
            self._say(f"compacting {len(compact_jobs)} step(s)")
            self.runner.map(_core._compact_group, compact_jobs)  # noqa: SLF001
        # and the compacted files of steps that no rank directory is left in
        n_removed = len(gone)
        gone += [ck for ck in sorted(changed_groups) if ck not in groups and ck in existing]
        if gone:
            lake_store = self._writable()
            for k in gone:
                try:
                    lake_store.delete(k)
                except MsprobeError:
                    pass
        t4 = time.perf_counter()
        self.manifest_rows = sorted(rows.values(), key=lambda r: (r["run"], r["split"] or "", _n(r["step"]),
                                                                  _n(r["rank"]), r["rank_dir"]))
        self.catalog_rows = _core.catalog_rows(self.manifest_rows, infos, self.url)
        changed = bool(jobs or recover or gone or compact_jobs or len(old) != len(rows))
        if refresh != "none" and changed:
            _core.write_table(self._writable(), _core.MANIFEST_KEY, _core.manifest_table(self.manifest_rows))
        if refresh != "none" and (changed or self.lake_store is None
                                   or _stale_catalog(self.lake_store, self.catalog_rows)):
            _core.write_catalog(self._writable(), self.catalog_rows, self.url)
        t5 = time.perf_counter()
        self.stats = {"runs": len(infos), "rank_dirs": len(rows), "indexed": n_built, "recovered": len(recover),
                      "removed": n_removed, "compacted": len(compact_jobs) + len(direct), "stale": len(stale),
                      "executor": executor}
        self.timings = {"discover_s": t1 - t0, "list_s": t2 - t1, "index_s": t3 - t2, "compact_s": t4 - t3,
                        "catalog_s": t5 - t4, "total_s": t5 - t0}

    def _stale(self, rows: dict) -> dict:
        """{index key: why} of the indexed rank directories whose document no longer has the
        size and modification time recorded when it was indexed (listings only, as tasks)."""
        if not rows:
            return {}
        steps: dict = {}  # step prefix -> [rank prefixes]; few files per rank dir: one listing of the step
        few: dict = {}
        for r in rows.values():
            sp = r["prefix"].rsplit("/", 1)[0] if "/" in r["prefix"] else None
            steps.setdefault(sp, []).append(r["prefix"])
            few[sp] = few.get(sp, True) and r.get("task") == "statistics" and not r.get("tensor_files")
        jobs, chunk, flat = [], [], []
        for sp, ps in sorted(steps.items(), key=lambda kv: kv[0] or ""):
            chunk += ps
            if sp is not None and few[sp] and len(ps) > 1:
                flat.append(sp)
            if len(chunk) >= 1024:
                jobs.append((self.url, self.storage_options, chunk, tuple(flat)))
                chunk, flat = [], []
        if chunk:
            jobs.append((self.url, self.storage_options, chunk, tuple(flat)))
        now: dict = {}
        for part in self.runner.map(star(_core.doc_stats), jobs, local_cluster=False):
            now.update(part)
        local = bool(getattr(self.store, "is_local", False))
        out = {}
        for key, r in rows.items():
            if r["prefix"] not in now:
                continue  # gone: removed below
            name, size, mtime = now[r["prefix"]]
            if r.get("doc") and name and name != r["doc"]:
                out[key] = f"{name} replaced {r['doc']}"
                continue
            covered = {"doc_size": r.get("doc_size"), "doc_mtime": r.get("mtime")}
            reason = stale_reason(covered, size, mtime, local=local)
            if reason is not None:
                out[key] = reason
        return out

    def _own(self) -> ReadableStore:
        """The store of the lake's own files (there is one whenever it lists files)."""
        if self.lake_store is None:
            raise StorageNotFoundError(f"{self.lake_url}: the lake has no files there yet")
        return self.lake_store

    def _writable(self) -> Store:
        """The lake's store, writable (raises when it is not)."""
        if self._fallback is not None:
            raise _Relocate()
        store = self.lake_store
        if isinstance(store, Store) and not store.read_only:
            return store
        raise StoragePermissionError(f"{self.lake_url}: the lake needs to write its files there, and cannot; "
                                     "give another lake_dir (--lake-dir), or open with refresh='none' to read "
                                     "what is indexed")

    # -- shape -------------------------------------------------------------------------------------------
    @property
    def runs(self) -> list:
        """The run names, as the catalog lists them. Example: ``lake.runs`` -> ``["run_gpu", "run_npu"]``."""
        return [r["run"] for r in self.catalog_rows]

    @property
    def catalog(self) -> Any:
        """One row per run (pandas): framework, task, level, config, steps, ranks, bytes, time span...

        Example: ``lake.catalog[["run", "steps", "ranks"]]`` (``msprobe lake ls ROOT``)."""
        import pandas as pd

        return pd.DataFrame(self.catalog_rows)

    @property
    def manifest(self) -> Any:
        """One row per rank directory (pandas): what was indexed, from which document.

        Example: ``lake.manifest.groupby("run").size()``."""
        return _core.manifest_table(self.manifest_rows).to_pandas()

    def run_url(self, run: str) -> str:
        """The URL of one run's dump (a :class:`ConfigError` naming the runs when absent).

        Example: ``msprobe.readers.open(lake.run_url("run_npu"))``."""
        for r in self.catalog_rows:
            if r["run"] == run:
                return r["url"]
        raise ConfigError(f"no run {run!r} in {self.url}; runs: {', '.join(self.runs) or 'none'}")

    def __repr__(self) -> str:
        return (f"Lake({self.url!r}, runs={len(self.catalog_rows)}, rank_dirs={len(self.manifest_rows)}"
                + (f", filter={self._expr}" if self._expr is not None else "") + ")")

    # -- the dataset -------------------------------------------------------------------------------------
    def files(self) -> list:
        """[(key, {run, step, rank?, split})]: what a scan reads (compacted steps as one file).

        Example: ``len(lake.files())``."""
        out = []
        done: set = set()
        for r in self.manifest_rows:
            ck = r.get("compact_key")
            if ck:
                if ck in done:
                    continue
                done.add(ck)
                out.append((ck, {"run": r["run"], "step": r["step"], "split": r["split"]}))
            else:
                out.append((r["index_key"], {"run": r["run"], "step": r["step"], "rank": r["rank"],
                                             "split": r["split"]}))
        return out

    @property
    def dataset(self) -> Any:
        """The union of the indexes as one ``pyarrow.dataset.FileSystemDataset`` whose fragments
        carry their partition keys (run, step, rank) as expressions, so filters on them skip
        files without opening them. Rows are those of :data:`msprobe.readers.COLUMNS`.

        Example: ``lake.dataset.count_rows()``."""
        if self._dataset is None:
            require("pyarrow", "parquet")
            import pyarrow.compute as pc
            import pyarrow.dataset as pads

            paths, parts = [], []
            fs = None
            for key, keys in self.files():
                loc = arrow_location(self._own(), key)
                if loc is None:
                    raise MissingDependencyError(f"{self.url}: pyarrow cannot read this store directly")
                fs = loc[0]
                paths.append(loc[1])
                e = pc.field("run") == keys["run"]
                e = e & (pc.field("step") == keys["step"] if keys["step"] is not None else pc.field("step").is_null())
                if "rank" in keys:
                    e = e & (pc.field("rank") == keys["rank"] if keys["rank"] is not None
                             else pc.field("rank").is_null())
                parts.append(e)
            fmt = pads.ParquetFileFormat()
            if fs is None:
                self._dataset = pads.dataset(arrow_schema().empty_table())
            else:
                self._dataset = pads.FileSystemDataset.from_paths(paths, schema=arrow_schema(), format=fmt,
                                                                  filesystem=fs, partitions=parts)
        return self._dataset

    def filter(self, expr: Any = None, **eq: Any) -> "Lake":
        """A view of the lake restricted by a ``pyarrow.compute`` expression and/or column
        equalities (``run="a"``, ``step=[1, 2]``, ``rank=0``, ``record="Torch.add.0.forward"``).

        Example: ``lake.filter(run="run_npu", step=[0, 1]).to_pandas(["record", "norm"])``."""
        import copy

        import pyarrow.compute as pc

        e = self._expr
        for name, value in eq.items():
            if name not in COLUMNS:
                raise ConfigError(f"filter: unknown column {name!r}; valid: {', '.join(COLUMNS)}")
            if value is None:
                term = pc.field(name).is_null()
            elif isinstance(value, (list, tuple, set, frozenset, range)):
                term = pc.field(name).isin(list(value))
            else:
                term = pc.field(name) == value
            e = term if e is None else e & term
        if expr is not None:
            e = expr if e is None else e & expr
        view = copy.copy(self)
        view._expr = e  # noqa: SLF001 - a copy of this class
        view._con = None  # noqa: SLF001 - a copy of this class
        return view

    def to_arrow(self, columns: Optional[Iterable[str]] = None, *, records_only: bool = False) -> Any:
        """The rows (one per tensor-like argument; ``records_only=True`` keeps the index's
        placeholder rows of records without tensors too) as a pyarrow Table.

        Example: ``lake.to_arrow(["run", "record", "max"])``."""
        import pyarrow.compute as pc

        e = self._expr
        if not records_only:
            base = pc.field("has_nan").is_valid()
            e = base if e is None else base & e
        cols = list(columns) if columns is not None else None
        return self.dataset.to_table(columns=cols, filter=e)

    def to_pandas(self, columns: Optional[Iterable[str]] = None, **kw: Any) -> Any:
        """:meth:`to_arrow` as a pandas DataFrame. Example: ``lake.to_pandas(["run", "step", "record", "norm"])``."""
        return table_to_pandas(self.to_arrow(columns, **kw))

    def count_rows(self) -> int:
        """How many tensor rows the (filtered) lake holds. Example: ``lake.filter(run="run_npu").count_rows()``."""
        import pyarrow.compute as pc

        e = pc.field("has_nan").is_valid()
        return self.dataset.count_rows(filter=e if self._expr is None else e & self._expr)

    def scanner(self, columns: Optional[Iterable[str]] = None, batch_size: int = 1 << 16) -> Any:
        """A streaming ``pyarrow.dataset.Scanner`` over the (filtered) rows.

        Example: ``for batch in lake.scanner(["record", "norm"]).to_batches(): ...``."""
        import pyarrow.compute as pc

        e = pc.field("has_nan").is_valid()
        return self.dataset.scanner(columns=list(columns) if columns else None, batch_size=batch_size,
                                    filter=e if self._expr is None else e & self._expr)

    # -- SQL ------------------------------------------------------------------------------------------------
    def duckdb(self) -> Any:
        """A DuckDB connection with views ``lake`` (one row per tensor), ``lake_records`` (every
        index row, records without tensors included), ``catalog`` and ``manifest``.

        Local lakes are read by DuckDB's own Parquet reader; ``s3://`` lakes through its
        httpfs extension when it is installed, given the endpoint, region and credentials
        that s3fs resolved through botocore (``storage_options``, ``AWS_ENDPOINT_URL``,
        ``AWS_*`` variables, profiles, instance roles: see :func:`s3_settings`), else (or when
        httpfs cannot read there) through the pyarrow dataset over the fsspec file system.

        Example: ``lake.duckdb().sql("SELECT count(*) FROM lake_records").fetchall()``."""
        if self._con is not None:
            return self._con
        duckdb = require("duckdb", "duckdb")
        con = duckdb.connect(":memory:")
        cfg = {"threads": 2, "memory_limit": "2GB"}
        cfg.update(self.duckdb_config)
        for k, v in cfg.items():
            con.execute(f"SET {k} = '{v}'" if isinstance(v, str) else f"SET {k} = {v}")
        try:
            self.sql_engine = self._register_lake(con)
        except Exception as exc:  # an index file that cannot be read: one typed line
            con.close()
            if not _is_duckdb_error(exc):
                raise
            raise StorageError(f"{self.lake_url}: cannot read the lake's index files ({_first_line(exc)}); "
                               "reopen the lake to rebuild them") from None
        con.register("catalog_arrow", self.catalog_table())
        con.execute("CREATE VIEW catalog AS SELECT * FROM catalog_arrow")
        con.register("manifest_arrow", _core.manifest_table(self.manifest_rows))
        con.execute("CREATE VIEW manifest AS SELECT * FROM manifest_arrow")
        self._con = con
        return con

    def catalog_table(self) -> Any:
        """The catalog as a pyarrow Table (the ``catalog`` view of :meth:`duckdb`).

        Example: ``lake.catalog_table().column("run")``."""
        import pyarrow as pa

        return pa.Table.from_pylist(self.catalog_rows) if self.catalog_rows else pa.table({"run": pa.array([], pa.string())})

    def _register_lake(self, con: Any) -> str:
        files = [k for k, _ in self.files()]

        for k in files:  # a Parquet bomb is refused from its footer, before DuckDB or pyarrow inflate it
            try:
                check_index_file(self._own(), k)
            except StorageError:  # a file gone or unreadable: said below, as DuckDB meets it
                break
        if self._expr is not None:
            # a filtered view: the pyarrow dataset applies the expression, DuckDB scans the result stream
            con.register("lake_ds", self.dataset.scanner(filter=self._expr).to_reader())
            con.execute("CREATE VIEW lake_records AS SELECT * FROM lake_ds")
            con.execute("CREATE VIEW lake AS SELECT * FROM lake_records WHERE has_nan IS NOT NULL")
            return "pyarrow-filtered"
        engine = "pyarrow"
        src = None
        if not files:
            src = None
        elif getattr(self.lake_store, "is_local", False):
            paths = [str(self._own().local_path(k)) for k in files]
            src = "read_parquet([" + ", ".join(_q(p) for p in paths) + "])"
            engine = "duckdb-parquet"
        elif self.lake_url.startswith("s3://") and _httpfs(con, self._own()):
            root = self.lake_url.rstrip("/")
            src = "read_parquet([" + ", ".join(_q(f"{root}/{k}") for k in files) + "])"
            engine = "duckdb-httpfs"
        if src is not None:
            try:
                con.execute(f"CREATE VIEW lake_records AS SELECT * FROM {src}")
            except Exception as exc:  # DuckDB cannot read where s3fs can: read through s3fs
                if engine != "duckdb-httpfs" or not _is_duckdb_error(exc):
                    raise
                log.warning("lake: DuckDB's httpfs cannot read %s (%s); reading through pyarrow and s3fs",
                            self.lake_url, _first_line(exc))
                src = None
        if src is None:
            con.register("lake_ds", self.dataset)
            con.execute("CREATE VIEW lake_records AS SELECT * FROM lake_ds")
            engine = "pyarrow"
        con.execute("CREATE VIEW lake AS SELECT * FROM lake_records WHERE has_nan IS NOT NULL")
        return engine

    def sql(self, query: str, *, as_arrow: bool = False) -> Any:
        """Run a DuckDB query over the views of :meth:`duckdb` (``lake``: one row per tensor
        argument; ``lake_records``, ``catalog``, ``manifest``); a pandas DataFrame (or Arrow table).

        Example: ``lake.sql("SELECT run, count(*) FROM lake GROUP BY run")``."""
        con = self.duckdb()
        try:
            rel = con.sql(query)
            if rel is None:
                return None
            return rel.arrow() if as_arrow else rel.df()
        except Exception as exc:  # duckdb's errors: one typed one-line error
            if not _is_duckdb_error(exc):
                raise
            if _is_io_error(exc):
                raise StorageError(f"SQL over {self.lake_url}: {_first_line(exc)}") from None
            raise ConfigError(f"SQL error: {exc}") from None

    # -- questions (msprobe.lake._questions) ------------------------------------------------------------
    def first_nan(self, **kw: Any) -> Any:
        """The first NaN/Inf statistic of each (run, rank): :func:`msprobe.lake._questions.first_nan`.

        Example: ``lake.first_nan(run="run_npu")``."""
        return first_nan(self, **kw)

    def diverge(self, run_a: str, run_b: str, **kw: Any) -> dict:
        """The first record where ``run_b`` diverges from ``run_a`` (compare, as Dask tasks):
        :func:`msprobe.lake._questions.diverge`; the answer's ``first_divergence`` is compare's.

        Example: ``lake.diverge("run_npu", "run_gpu", step=0)["first_divergence"]``."""
        return diverge(self, run_a, run_b, **kw)

    def disagree(self, **kw: Any) -> Any:
        """Ranks whose statistic differs from what most ranks agree on:
        :func:`msprobe.lake._questions.disagree`.

        Example: ``lake.disagree(kind="parameters_grad", stat="norm")``."""
        return disagree(self, **kw)

    def trend(self, record: str, **kw: Any) -> Any:
        """A record's statistic over steps, per run and rank: :func:`msprobe.lake._questions.trend`.

        Example: ``lake.trend("Module.head.Linear.parameters_grad", arg="weight.0", plot="norm.png")``."""
        return trend(self, record, **kw)

    # -- lifetime -------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the DuckDB connection and the executor (a LocalCluster it started).

        Example: ``with msprobe.lake.open("./lake") as lake: ...`` closes it at the end."""
        if self._con is not None:
            self._con.close()
            self._con = None
        self.runner.close()

    def __enter__(self) -> "Lake":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Relocate(Exception):
    """The lake must write, and its directory is a read-only root's: use the cache instead."""


def _stale_catalog(store: ReadableStore, rows: list) -> bool:
    """True when ROOT/_lake/catalog.json is missing or says something else about a run (a
    new config.json, a run renamed...): one small GET."""
    import json

    if store is None:
        return True
    try:
        doc = json.loads(store.get(_core.CATALOG_JSON))
    except (MsprobeError, ValueError):
        return True
    keep = ("indexed_at",)
    strip = lambda rs: [{k: v for k, v in r.items() if k not in keep} for r in rs]  # noqa: E731
    return strip(json.loads(json.dumps(doc.get("runs"), default=str))) != strip(json.loads(json.dumps(rows, default=str)))


def _is_duckdb_error(exc: BaseException) -> bool:
    return "duckdb" in type(exc).__module__


def _is_io_error(exc: BaseException) -> bool:
    """A DuckDB error that a read caused (its own readers', or an Arrow stream's IOError)."""
    return type(exc).__name__ in ("IOException", "HTTPException") or "IOError" in str(exc).split("\n", 1)[0]


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _n(v: Optional[int]) -> int:
    return -1 if v is None else v


def _q(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _httpfs_file(con: Any) -> Optional[str]:
    """The httpfs binary of the ``duckdb-extension-httpfs`` package built for this DuckDB
    (``extensions/<version>/httpfs.duckdb_extension``), or None: the package is not installed
    or was built for another DuckDB version (an extension loads only into its own version)."""
    try:
        import duckdb_extension_httpfs as pkg
    except ImportError:
        return None
    version = con.sql("PRAGMA version").fetchone()[0]
    path = os.path.join(os.path.dirname(pkg.__file__), "extensions", version, "httpfs.duckdb_extension")
    return path if os.path.isfile(path) else None


def _load_httpfs(con: Any) -> bool:
    """Load httpfs without downloading anything: the one installed in DuckDB's extension
    directory, else the binary of the ``duckdb-extension-httpfs`` package (loaded from where
    it lies, nothing is copied into the user's home)."""
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    try:
        con.execute("LOAD httpfs")
        return True
    except Exception:  # noqa: BLE001 - not in the extension directory
        pass
    path = _httpfs_file(con)
    if path is None:
        return False
    try:
        con.execute(f"LOAD {_q(path)}")
    except Exception:  # noqa: BLE001 - unsigned or incompatible: the caller falls back to pyarrow
        return False
    return True


def s3_settings(store: FsspecStore) -> dict:
    """What the S3 file system of ``store`` (s3fs) resolved through botocore: ``endpoint``
    (``AWS_ENDPOINT_URL``, ``endpoint_url`` options, the config file...), ``region``, and the
    credentials of its chain (options, environment, profile, instance role...), as the
    :class:`dict` ``{key, secret, token, endpoint, region, anon}``. The same settings the
    lake's listings and reads use, so DuckDB reads what s3fs reads."""
    import inspect

    from fsspec.asyn import sync

    fs = store.fs
    bucket = (store.root or "").split("/", 1)[0] or None

    async def resolve() -> dict:
        client = await fs.get_s3(bucket) if hasattr(fs, "get_s3") else await fs.set_session()
        out = {"endpoint": client.meta.endpoint_url, "region": client.meta.region_name,
               "anon": bool(getattr(fs, "anon", False)), "key": None, "secret": None, "token": None}
        creds = None if out["anon"] else getattr(client._request_signer, "_credentials", None)  # noqa: SLF001
        if creds is not None:
            frozen = creds.get_frozen_credentials()
            if inspect.isawaitable(frozen):
                frozen = await frozen
            out.update(key=frozen.access_key, secret=frozen.secret_key, token=frozen.token)
        return out

    return sync(fs.loop, resolve)


def _secret_sql(settings: dict) -> str:
    """``CREATE SECRET`` for DuckDB's httpfs from :func:`s3_settings`."""
    parts = ["TYPE s3"]
    if settings.get("key") and not settings.get("anon"):
        parts.append(f"KEY_ID {_q(settings['key'])}")
        parts.append(f"SECRET {_q(settings.get('secret') or '')}")
        if settings.get("token"):
            parts.append(f"SESSION_TOKEN {_q(settings['token'])}")
    if settings.get("region"):
        parts.append(f"REGION {_q(settings['region'])}")
    endpoint = settings.get("endpoint") or ""
    scheme, _, host = endpoint.partition("://")
    host = host.rstrip("/")
    if host and not re.fullmatch(r"s3[.-]([a-z0-9-]+[.])?amazonaws[.]com(\.cn)?", host.split("/", 1)[0]):
        # any endpoint but AWS's own: path-style URLs (MinIO, Ceph, moto... have no bucket hostnames)
        parts.append(f"ENDPOINT {_q(host)}")
        parts.append("URL_STYLE 'path'")
        parts.append(f"USE_SSL {'true' if scheme == 'https' else 'false'}")
    return f"CREATE OR REPLACE SECRET msprobe_lake_s3 ({', '.join(parts)})"


def _httpfs(con: Any, store: ReadableStore) -> bool:
    """Load DuckDB's httpfs extension (installed beforehand; nothing is downloaded here) and
    give it the endpoint and credentials the store's s3fs resolved; False when it is not there
    or the settings cannot be resolved (the caller reads through pyarrow then)."""
    if not isinstance(store, FsspecStore) or not _load_httpfs(con):
        return False
    try:
        settings = s3_settings(store)
    except Exception as exc:  # noqa: BLE001 - no client: the pyarrow route reports the cause
        log.debug("lake: S3 settings not resolved (%s); reading through pyarrow", exc)
        return False
    try:
        con.execute(_secret_sql(settings))
    except Exception as exc:  # noqa: BLE001
        log.debug("lake: DuckDB refused the S3 secret (%s); reading through pyarrow", exc)
        return False
    return True
