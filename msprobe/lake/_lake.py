"""``Lake``: the runs under a root as one partitioned pyarrow dataset, with DuckDB SQL on top."""
from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Optional

from msprobe.backends import Store
from msprobe.errors import (
    ConfigError,
    MissingDependencyError,
    StorageError,
    StorageNotFoundError,
    StoragePermissionError,
    require,
)
from msprobe.execution import Executor
from msprobe.format.protocols import ReadableStore
from msprobe.index.files import check_index_file
from msprobe.index.rows import COLUMNS, arrow_schema
from msprobe.lake import _catalog, _core, _graph
from msprobe.lake._diverge import diverge
from msprobe.lake._place import locate, open_lake_store
from msprobe.lake._questions import disagree, first_nan, trend
from msprobe.lake._refresh import Places, Refresher
from msprobe.readers import arrow_location, table_to_pandas

__all__ = ["Lake"]

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
        self.store = _core.cached_store(root, storage_options)
        self.url = self.store.url
        self._progress = progress
        self._report = report_progress  # msprobe.progress.Progress's enabled= for the index tasks
        self.lake_note: Optional[str] = None
        place = locate(self.store, storage_options, lake_dir, lake_storage_options, refresh)
        self._fallback = place.fallback
        if place.note is not None:
            self._note(place.note)
        self._use(place.url, place.options, refresh)
        self.runner = Executor(client, local_cluster=local, cluster_workers=workers)
        self.batch = batch
        self.duckdb_config = dict(duckdb_config or {})
        self._expr: Any = None
        self._con: Any = None
        self._dataset: Any = None
        self.timings: dict = {}
        self.stats: dict = {}
        try:
            try:
                self._open(refresh, max_depth)
            except _Relocate:  # the read-only root's own lake needs building: build it in the cache instead
                assert self._fallback is not None  # (_Relocate is raised only with a fallback)
                url, note = self._fallback
                self._fallback = None
                self._note(note)
                self._use(url, None, refresh)
                self._open(refresh, max_depth)
        except BaseException:
            self.runner.close()  # a client it connected to a scheduler, a LocalCluster it started
            raise

    # -- opening: msprobe.lake._place says where, msprobe.lake._refresh plans and applies ---------------------
    def _say(self, what: str) -> None:
        if callable(self._progress):
            self._progress(what)

    def _note(self, what: str) -> None:
        self.lake_note = what
        log.info("lake: %s", what)  # said on stderr by the CLI (lake_note), once
        self._say(what)

    def _use(self, url: str, lake_options: Optional[dict], refresh: str) -> None:
        self.lake_options = lake_options
        self.lake_store = open_lake_store(url, lake_options, refresh)
        self.lake_url = self.lake_store.url if self.lake_store is not None else url

    def _open(self, refresh: str, max_depth: int) -> None:
        places = Places(self.url, self.storage_options, self.lake_url, self.lake_options)
        refresher = Refresher(places, self.store, self.lake_store, self.runner, batch=self.batch,
                              writable=self._writable, say=self._say, report=self._report)
        result = refresher.run(refresh, max_depth)
        self.run_infos = result.run_infos
        self.manifest_rows = result.manifest_rows
        self.catalog_rows = result.catalog_rows
        self.stats = result.stats
        self.timings = result.timings
        self.graphs = result.graphs  # comm/ dir -> what the step's communication graph holds (lake._graph)

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
        return [row["run"] for row in self.catalog_rows]

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
        return _catalog.manifest_table(self.manifest_rows).to_pandas()

    def run_url(self, run: str) -> str:
        """The URL of one run's dump (a :class:`ConfigError` naming the runs when absent).

        Example: ``msprobe.readers.open(lake.run_url("run_npu"))``."""
        for row in self.catalog_rows:
            if row["run"] == run:
                return row["url"]
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
        for row in self.manifest_rows:
            compact_key = row.get("compact_key")
            if compact_key:
                if compact_key in done:
                    continue
                done.add(compact_key)
                out.append((compact_key, {"run": row["run"], "step": row["step"], "split": row["split"]}))
            else:
                out.append((row["index_key"], {"run": row["run"], "step": row["step"], "rank": row["rank"],
                                             "split": row["split"]}))
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
            filesystem = None
            for key, keys in self.files():
                loc = arrow_location(self._own(), key)
                if loc is None:
                    raise MissingDependencyError(f"{self.url}: pyarrow cannot read this store directly")
                filesystem = loc[0]
                paths.append(loc[1])
                expression = pc.field("run") == keys["run"]
                expression = expression & (pc.field("step") == keys["step"] if keys["step"] is not None
                                           else pc.field("step").is_null())
                if "rank" in keys:
                    expression = expression & (pc.field("rank") == keys["rank"] if keys["rank"] is not None
                                               else pc.field("rank").is_null())
                parts.append(expression)
            fmt = pads.ParquetFileFormat()
            if filesystem is None:
                self._dataset = pads.dataset(arrow_schema().empty_table())
            else:
                self._dataset = pads.FileSystemDataset.from_paths(paths, schema=arrow_schema(), format=fmt,
                                                                  filesystem=filesystem, partitions=parts)
        return self._dataset

    def filter(self, expr: Any = None, **equalities: Any) -> "Lake":
        """A view of the lake restricted by a ``pyarrow.compute`` expression and/or column
        equalities (``run="a"``, ``step=[1, 2]``, ``rank=0``, ``record="Torch.add.0.forward"``).

        Example: ``lake.filter(run="run_npu", step=[0, 1]).to_pandas(["record", "norm"])``."""
        import copy

        import pyarrow.compute as pc

        expression = self._expr
        for name, value in equalities.items():
            if name not in COLUMNS:
                raise ConfigError(f"filter: unknown column {name!r}; valid: {', '.join(COLUMNS)}")
            if value is None:
                term = pc.field(name).is_null()
            elif isinstance(value, (list, tuple, set, frozenset, range)):
                term = pc.field(name).isin(list(value))
            else:
                term = pc.field(name) == value
            expression = term if expression is None else expression & term
        if expr is not None:
            expression = expr if expression is None else expression & expr
        view: Lake = copy.copy(self)
        view._expr = expression
        view._con = None
        return view

    def to_arrow(self, columns: Optional[Iterable[str]] = None, *, records_only: bool = False) -> Any:
        """The rows (one per tensor-like argument; ``records_only=True`` keeps the index's
        placeholder rows of records without tensors too) as a pyarrow Table.

        Example: ``lake.to_arrow(["run", "record", "max"])``."""
        import pyarrow.compute as pc

        expression = self._expr
        if not records_only:
            base = pc.field("has_nan").is_valid()
            expression = base if expression is None else base & expression
        cols = list(columns) if columns is not None else None
        return self.dataset.to_table(columns=cols, filter=expression)

    def to_pandas(self, columns: Optional[Iterable[str]] = None, **options: Any) -> Any:
        """:meth:`to_arrow` as a pandas DataFrame. Example: ``lake.to_pandas(["run", "step", "record", "norm"])``."""
        return table_to_pandas(self.to_arrow(columns, **options))

    def count_rows(self) -> int:
        """How many tensor rows the (filtered) lake holds. Example: ``lake.filter(run="run_npu").count_rows()``."""
        import pyarrow.compute as pc

        expression = pc.field("has_nan").is_valid()
        return self.dataset.count_rows(filter=expression if self._expr is None else expression & self._expr)

    def scanner(self, columns: Optional[Iterable[str]] = None, batch_size: int = 1 << 16) -> Any:
        """A streaming ``pyarrow.dataset.Scanner`` over the (filtered) rows.

        Example: ``for batch in lake.scanner(["record", "norm"]).to_batches(): ...``."""
        import pyarrow.compute as pc

        expression = pc.field("has_nan").is_valid()
        return self.dataset.scanner(columns=list(columns) if columns else None, batch_size=batch_size,
                                    filter=expression if self._expr is None else expression & self._expr)

    # -- SQL ------------------------------------------------------------------------------------------------
    def duckdb(self) -> Any:
        """A DuckDB connection with views ``lake`` (one row per tensor), ``lake_records`` (every
        index row, records without tensors included), ``catalog``, ``manifest``, and the steps'
        communication graphs (:mod:`msprobe.lake._graph`): ``comm_calls`` (one row per
        communication call, with its level in the step's happens-before order) and ``comm_edges``
        (one row per matched data flow between two ranks).

        The lake's store says how DuckDB reads its files: local lakes by DuckDB's own Parquet
        reader (``Store.duckdb_path``); ``s3://`` lakes through its httpfs extension when it is
        installed, set up by the store with the endpoint, region and credentials that s3fs
        resolved through botocore (``Store.duckdb_setup``: ``storage_options``,
        ``AWS_ENDPOINT_URL``, ``AWS_*`` variables, profiles, instance roles); else (or when
        httpfs cannot read there) through the pyarrow dataset over the store.

        Example: ``lake.duckdb().sql("SELECT count(*) FROM lake_records").fetchall()``."""
        if self._con is not None:
            return self._con
        duckdb = require("duckdb", "duckdb")
        con = duckdb.connect(":memory:")
        cfg = {"threads": 2, "memory_limit": "2GB"}
        cfg.update(self.duckdb_config)
        for setting, value in cfg.items():
            con.execute(f"SET {setting} = '{value}'" if isinstance(value, str) else f"SET {setting} = {value}")
        try:
            self.sql_engine, remote_root = _register_views(con, [key for key, _ in self.files()], own=self._own,
                                                           lake_url=self.lake_url, expression=self._expr,
                                                           dataset=lambda: self.dataset)
        except Exception as exc:  # an index file that cannot be read: one typed line
            con.close()
            if not _is_duckdb_error(exc):
                raise
            raise StorageError(f"{self.lake_url}: cannot read the lake's index files ({_first_line(exc)}); "
                               "reopen the lake to rebuild them") from None
        _graph.register_views(con, self.graphs, own=self._own, remote_root=remote_root, engine=self.sql_engine)
        con.register("catalog_arrow", self.catalog_table())
        con.execute("CREATE VIEW catalog AS SELECT * FROM catalog_arrow")
        con.register("manifest_arrow", _catalog.manifest_table(self.manifest_rows))
        con.execute("CREATE VIEW manifest AS SELECT * FROM manifest_arrow")
        self._con = con
        return con

    def catalog_table(self) -> Any:
        """The catalog as a pyarrow Table (the ``catalog`` view of :meth:`duckdb`).

        Example: ``lake.catalog_table().column("run")``."""
        import pyarrow as pa

        return pa.Table.from_pylist(self.catalog_rows) if self.catalog_rows else pa.table({"run": pa.array([], pa.string())})

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
    def first_nan(self, **options: Any) -> Any:
        """The first NaN/Inf statistic of each (run, rank): :func:`msprobe.lake._questions.first_nan`.

        Example: ``lake.first_nan(run="run_npu")``."""
        return first_nan(self, **options)

    def diverge(self, run_a: str, run_b: str, **options: Any) -> dict:
        """The first record where ``run_b`` diverges from ``run_a`` (compare, as Dask tasks):
        :func:`msprobe.lake._diverge.diverge`; the answer's ``first_divergence`` is compare's.

        Example: ``lake.diverge("run_npu", "run_gpu", step=0)["first_divergence"]``."""
        return diverge(self, run_a, run_b, **options)

    def disagree(self, **options: Any) -> Any:
        """Ranks whose statistic differs from what most ranks agree on:
        :func:`msprobe.lake._questions.disagree`.

        Example: ``lake.disagree(kind="parameters_grad", stat="norm")``."""
        return disagree(self, **options)

    def trend(self, record: str, **options: Any) -> Any:
        """A record's statistic over steps, per run and rank: :func:`msprobe.lake._questions.trend`.

        Example: ``lake.trend("Module.head.Linear.parameters_grad", arg="weight.0", plot="norm.png")``."""
        return trend(self, record, **options)

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


def _register_views(con: Any, files: list, *, own: Callable[[], ReadableStore], lake_url: str, expression: Any,
                    dataset: Callable[[], Any]) -> tuple[str, Optional[str]]:
    """Create the views ``lake_records`` and ``lake`` over the index ``files`` of the lake at
    ``lake_url`` (``own()``: its store) in ``con``; returns the engine that reads them, as the
    store answers: DuckDB's Parquet reader (``duckdb_path``: local files), its httpfs
    (``duckdb_setup``: S3), else the pyarrow ``dataset()`` (also when filtered by
    ``expression``); and the location httpfs reads the files under (None for the others)."""
    for key in files:  # a Parquet bomb is refused from its footer, before DuckDB or pyarrow inflate it
        try:
            check_index_file(own(), key)
        except StorageError:  # a file gone or unreadable: said below, as DuckDB meets it
            break
    if expression is not None:
        # a filtered view: the pyarrow dataset applies the expression, DuckDB scans the result stream
        con.register("lake_ds", dataset().scanner(filter=expression).to_reader())
        con.execute("CREATE VIEW lake_records AS SELECT * FROM lake_ds")
        con.execute("CREATE VIEW lake AS SELECT * FROM lake_records WHERE has_nan IS NOT NULL")
        return "pyarrow-filtered", None
    engine = "pyarrow"
    source = remote_root = None
    if not files:
        source = None
    elif own().duckdb_path("") is not None:
        paths = [str(own().duckdb_path(key)) for key in files]
        source = "read_parquet([" + ", ".join(_quote(path) for path in paths) + "])"
        engine = "duckdb-parquet"
    else:
        remote_root = own().duckdb_setup(con)
        if remote_root is not None:
            root = remote_root.rstrip("/")
            source = "read_parquet([" + ", ".join(_quote(f"{root}/{key}") for key in files) + "])"
            engine = "duckdb-httpfs"
    if source is not None:
        try:
            con.execute(f"CREATE VIEW lake_records AS SELECT * FROM {source}")
        except Exception as exc:  # DuckDB cannot read where s3fs can: read through s3fs
            if engine != "duckdb-httpfs" or not _is_duckdb_error(exc):
                raise
            log.warning("lake: DuckDB's httpfs cannot read %s (%s); reading through pyarrow and s3fs",
                        lake_url, _first_line(exc))
            source = remote_root = None
    if source is None:
        con.register("lake_ds", dataset())
        con.execute("CREATE VIEW lake_records AS SELECT * FROM lake_ds")
        engine = "pyarrow"
    con.execute("CREATE VIEW lake AS SELECT * FROM lake_records WHERE has_nan IS NOT NULL")
    return engine, remote_root


def _is_duckdb_error(exc: BaseException) -> bool:
    return "duckdb" in type(exc).__module__


def _is_io_error(exc: BaseException) -> bool:
    """A DuckDB error that a read caused (its own readers', or an Arrow stream's IOError)."""
    return type(exc).__name__ in ("IOException", "HTTPException") or "IOError" in str(exc).split("\n", 1)[0]


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
