"""What the explorer shows, as small tables in DuckDB: one row per compared argument leaf.

The sources (:func:`open_view`):

- a dump pair (``PATH BENCH``): compared once with :func:`msprobe.compare.compare` (its Result
  rules and divergence threshold) into a work directory, then read as a compare output;
- a compare output (a directory holding ``summary.json`` and its CSVs);
- one dump or lake index (no bench): the readers' index rows (statistics, NaN/Inf), no bench columns.

Everything lands in one DuckDB database file in the work directory (``rows`` and ``cells``) with a
memory limit, so the server's working set stays bounded whatever the number of rows; every endpoint
is a query with ``LIMIT``/``OFFSET`` or an aggregate.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from typing import Any, Iterator, Optional, Sequence

from msprobe.errors import ConfigError, MissingDependencyError, MsprobeError, UnknownDialectError
from msprobe.format.stats import STAT_COLUMNS, STATISTICS
from msprobe.view._first import dump_first_look, lake_first_look, pair_first_look
from msprobe.view._load import SIDE_STAT_COLUMNS, Loader
from msprobe.view._ranks import RANK_COLUMNS

__all__ = ["ViewData", "open_view", "ROW_FIELDS", "FILTERS", "json_safe", "NotYet"]

#: the columns of ``rows`` the list and the record detail return, in order
ROW_FIELDS = ("i", "name", "record", "io", "dir", "kind", "result", "err", "norm_rel", "max_rel", "cosine",
              "npu_dtype", "bench_dtype", "npu_shape", "bench_shape", "bench_name",
              *SIDE_STAT_COLUMNS, "npu_md5", "bench_md5", "nan_inf", "masked", "score", "data_name", *RANK_COLUMNS)
#: the list's filters and their values
FILTERS = {
    "dir": ("all", "forward", "backward"),
    "kind": ("all", "api", "module"),
    "result": ("all", "divergent", "nan_inf", "masked", "unmatched"),
    "sort": ("order", "score", "norm_rel", "name"),
}
MEMORY_LIMIT = os.environ.get("MSPROBE_VIEW_MEMORY", "128MB")


class NotYet(ConfigError):
    """What a first look cannot answer yet (a view over every cell): asked again once the view is whole."""


def _duckdb() -> Any:
    try:
        import duckdb
    except ImportError as exc:
        raise MissingDependencyError("msprobe view needs duckdb: pip install 'msprobe-lake[view]'") from exc
    return duckdb


class ViewData(Loader):
    """The explorer's tables in one DuckDB file under ``work_dir``; thread-safe (one cursor per call)."""

    def __init__(self, work_dir: str, *, title: str, target: Optional[str], bench: Optional[str],
                 storage_options: Optional[dict] = None, owns_dir: bool = False):
        duckdb = _duckdb()
        self.work_dir = work_dir
        self.title = title
        self.target = target
        self.bench = bench
        self.storage_options = storage_options
        self.layouts: dict = {}  # side -> parallel layout text: that side's ranks merged (compare --layout)
        self.summary: dict = {}
        self._owns = owns_dir
        self._lock = threading.Lock()
        self._db = duckdb.connect(os.path.join(work_dir, "view.duckdb"))
        self._db.execute(f"SET memory_limit='{MEMORY_LIMIT}'")
        self._db.execute("SET threads=2")
        self._db.execute(f"SET temp_directory='{os.path.join(work_dir, 'spill')}'")
        self._dumps: dict = {}
        self._trees: dict = {}
        self._clusters: dict = {}
        self._lake: Any = None
        self._overview: Optional[dict] = None
        self.first_look: Optional[dict] = None  # a first look's note (msprobe.view._first); None: the whole view
        self.counted = False  # a lake's first look: its cells counted over the index, one cell's rows read
        self._runs: dict = {}  # a lake's first look: run -> URL (its catalog's), the lake itself not opened

    # -- queries ----------------------------------------------------------------------
    def query(self, sql: str, params: Any = ()) -> list:
        """Rows of ``sql`` as dicts (one cursor per call, so server threads do not share one)."""
        cur = self._db.cursor()
        try:
            res = cur.execute(sql, list(params))
            cols = [column[0] for column in res.description]
            return [dict(zip(cols, values)) for values in res.fetchall()]
        finally:
            cur.close()

    def cursor(self) -> Any:
        """A new DuckDB cursor of the tables (close it after use)."""
        return self._db.cursor()

    def close(self) -> None:
        self._db.close()
        if self._lake is not None:
            self._lake.close()
        if self._owns:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> "ViewData":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the views' answers ------------------------------------------------------------
    def meta(self) -> dict:
        cells = self.query("SELECT cell, run, step, rank, rank_dir, bench_rank_dir FROM cells ORDER BY cell")
        summary = self.summary
        return {"title": self.title, "target": self.target, "bench": self.bench, "mode": summary.get("mode"),
                "divergence": summary.get("divergence"), "first_divergence": summary.get("first_divergence"),
                "has_bench": self.bench is not None, "cells": cells,
                "layouts": {side: text for side, text in self.layouts.items() if text},
                "first_look": self.first_look,
                # the statistics the page offers (its lists and columns), in format.stats.STATISTICS' order
                "statistics": [{"key": stat.key, "column": stat.column} for stat in STATISTICS],
                "rows": int(self.query("SELECT coalesce(sum(rows), 0) AS n FROM cell_stats")[0]["n"])}

    def overview(self) -> dict:
        """Every cell's aggregates and the first divergent cell (computed once: the tables are loaded)."""
        if self._overview is None:
            self._overview = self._compute_overview()
        return self._overview

    def _compute_overview(self) -> dict:
        cells = self.query("""SELECT s.cell, s.run, s.step, s.rank, s.rank_dir, s.rows, s.errors, s.warnings,
            s.nan_inf, s.masked, s.unmatched, s.worst_norm_rel, s.worst_cosine, s.first_div, s.max_score,
            r.name AS first_div_name
            FROM cell_stats s LEFT JOIN rows r ON r.cell = s.cell AND r.i = s.first_div ORDER BY s.cell""")
        # the first divergent cell: compare's own pick (the earliest step, then the lowest record index
        # over its ranks) when a compare made the rows, else the same order over the cells' first rows
        first = self._summary_cell(self.summary.get("first_divergence"), cells)
        if first is None:
            firsts = [cell_row for cell_row in cells if cell_row["first_div"] is not None]
            first = min(firsts, key=lambda cell_row: (cell_row["step"] is None, cell_row["step"] or 0, cell_row["first_div"], cell_row["cell"]))["cell"] \
                if firsts else None
        origin = self.summary.get("origin")
        if isinstance(origin, dict):
            origin = {key: origin.get(key) for key in ("record", "row", "argument", "role", "note", "step", "rank_dir")}
            origin["cell"] = self._summary_cell(origin, cells)
        return {"cells": cells, "first_cell": first, "origin": origin if isinstance(origin, dict) else None}

    @staticmethod
    def _summary_cell(entry: Any, cells: list) -> Optional[int]:
        """The cell a summary entry (with its ``step`` and ``rank_dir``) names."""
        if not isinstance(entry, dict):
            return None
        return next((cell_row["cell"] for cell_row in cells if cell_row["step"] == entry.get("step")
                     and cell_row["rank_dir"] == entry.get("rank_dir")), None)

    def _where(self, cell: int, filters: dict) -> tuple:
        where: list = ["cell = ?"]
        params: list = [cell]
        if filters.get("dir", "all") != "all":
            where.append("dir = ?")
            params.append(filters["dir"])
        if filters.get("kind", "all") != "all":
            where.append("kind = ?")
            params.append(filters["kind"])
        res = filters.get("result", "all")
        if res == "divergent":
            where.append(self.divergent_sql)
        elif res in ("nan_inf", "masked"):
            where.append(res)
        elif res == "unmatched":
            where.append("(bench_name IS NULL OR bench_name = 'N/A')")
        text = filters.get("q")
        if text:
            where.append("contains(lower(name), lower(?))")
            params.append(str(text))
        return " AND ".join(where), params

    def rows(self, cell: int, begin: int, end: int, filters: dict) -> dict:
        """Rows ``begin``..``end`` of a cell under the filters ``f`` (and the count apart)."""
        for key, allowed in FILTERS.items():
            if filters.get(key, allowed[0]) not in allowed:
                raise ConfigError(f"{key} must be one of {', '.join(allowed)}, not {filters.get(key)!r}")
        begin, end = max(int(begin), 0), max(int(end), 0)
        end = min(end, begin + 1000)
        where, params = self._where(cell, filters)
        order = {"order": "i", "score": "score DESC, i", "norm_rel": "norm_rel DESC NULLS LAST, i",
                 "name": "name, i"}[filters.get("sort", "order")]
        # the first page of a cell binds no parameter (see msprobe.view._load.sql_literal)
        stats = self.query(f"SELECT rows, first_div FROM cell_stats WHERE cell = {int(cell)}")
        if where == "cell = ?":  # the count of every row is the cell's, pre-aggregated
            total = stats[0]["rows"] if stats else 0
        else:
            total = self.query(f"SELECT count(*) AS n FROM rows WHERE {where}", params)[0]["n"]
        if where == "cell = ?" and order == "i":  # every row in execution order: row k is the k-th, no sort
            rows = self.query(f"SELECT {', '.join(ROW_FIELDS)} FROM rows WHERE cell = {int(cell)} AND i >= {begin} "
                              f"AND i < {end} ORDER BY i")
        else:
            rows = self.query(f"SELECT {', '.join(ROW_FIELDS)} FROM rows WHERE {where} ORDER BY {order} "
                              f"LIMIT ? OFFSET ?", params + [end - begin, begin])
        return {"total": total, "begin": begin, "rows": rows, "first_div": stats[0]["first_div"] if stats else None}

    def iter_csv_rows(self, cell: int, filters: dict) -> Iterator[dict]:
        where, params = self._where(cell, filters)
        begin = 0
        while True:
            chunk = self.query(f"SELECT {', '.join(ROW_FIELDS)} FROM rows WHERE {where} ORDER BY i "
                               f"LIMIT 5000 OFFSET ?", params + [begin])
            if not chunk:
                return
            yield from chunk
            begin += len(chunk)

    def record(self, cell: int, record: str) -> dict:
        """Every argument of a record in a cell, the stack and the tensor files (where dumped)."""
        rows = self.query(f"SELECT {', '.join(ROW_FIELDS)}, stack FROM rows WHERE cell = ? AND record = ? "
                          f"ORDER BY i", [cell, record])
        if not rows:
            raise ConfigError(f"no record {record!r} in this cell")
        stack_text = next((arg_row["stack"] for arg_row in rows if arg_row.get("stack") not in (None, "", "N/A")), None)
        for arg_row in rows:
            arg_row.pop("stack", None)
        return {"record": record, "args": rows, "stack": self.record_stack(cell, record, stack_text)}

    def record_stack(self, cell: int, record: str, stack_text: Optional[str] = None) -> list:
        """The record's stack frames: stack.json of the target dump, else the compare CSV's column."""
        stack = self._stack(cell, record)
        if stack is None and stack_text and stack_text != "N/A":
            stack = [line for line in str(stack_text).splitlines() if line.strip()]
        return stack or []

    def _cell(self, cell: int) -> dict:
        found = self.query("SELECT * FROM cells WHERE cell = ?", [cell])
        if not found:
            raise ConfigError(f"no cell {cell}")
        return found[0]

    def dump(self, side: str) -> Any:
        """The target or bench dump (opened once), or None when it cannot be opened."""
        if side not in self._dumps:
            url = self.target if side == "target" else self.bench
            opened = None
            if url:
                import msprobe.readers

                try:
                    opened = msprobe.readers.open(url, storage_options=self.storage_options)
                    if opened is not None and self.layouts.get(side):
                        from msprobe.compare import merged_dump

                        other = self.dump("bench") if side == "target" else None
                        opened = merged_dump(opened, self.layouts[side], other)
                except (MsprobeError, OSError):
                    opened = None
            self._dumps[side] = opened
        return self._dumps[side]

    def source(self, side: str, cell: int) -> Any:
        """The rank directory (a readers source) of ``cell`` on ``side``, or None."""
        return self.located(side, cell)[1]

    def located(self, side: str, cell: int) -> tuple:
        """(the Dump, its source) holding ``cell`` on ``side``; (None, None) when it cannot be opened."""
        return self.located_row(side, self._cell(cell))

    def located_row(self, side: str, cell_row: dict) -> tuple:
        """:meth:`located` of a row of ``cells`` (every column) already read."""
        if self._lake is not None or self._runs:  # a lake: the cell's run, opened once
            if side != "target" or cell_row["run"] is None:
                return None, None
            key = ("run", cell_row["run"])
            if key not in self._dumps:
                import msprobe.readers

                try:
                    url = self._runs.get(cell_row["run"]) or self._lake.run_url(cell_row["run"])
                    self._dumps[key] = msprobe.readers.open(url, storage_options=self.storage_options)
                except (MsprobeError, OSError, AttributeError):
                    self._dumps[key] = None
            dump = self._dumps[key]
        else:
            dump = self.dump(side)
        if dump is None:
            return None, None
        step = cell_row["step"] if side == "target" else cell_row["bench_step"]
        rank_dir = cell_row["rank_dir"] if side == "target" else cell_row["bench_rank_dir"]
        for source in dump.sources:
            if source.step == step and source.rank_dir == rank_dir and (side != "target" or cell_row["run"] is None or source.run == cell_row["run"]):
                return dump, source
        return dump, None

    def _stack(self, cell: int, record: str) -> Optional[list]:
        src = self.source("target", cell)
        if src is None:
            return None
        try:
            frames = src.frames_of(record)
        except (MsprobeError, OSError, ValueError, KeyError):
            return None
        return [str(frame) for frame in frames] if frames else None

    def _whole(self, what: str) -> None:
        """A first look holds a few records of one cell: views over every cell wait for the whole view."""
        if self.first_look is not None:
            raise NotYet(f"{what} needs every cell's records: it is shown once the whole view is built "
                              f"(a first look is shown meanwhile)")

    def trend(self, name: str, stat: str) -> dict:
        """One row's statistic over steps, per rank, target and bench."""
        self._whole("the trend")
        if stat not in STAT_COLUMNS:
            raise ConfigError(f"stat must be {', '.join(STAT_COLUMNS[:-1])} or {STAT_COLUMNS[-1]}, not {stat!r}")
        rows = self.query(f"""SELECT c.run, c.step, c.rank, c.rank_dir, r.npu_{stat} AS target, r.bench_{stat} AS bench
            FROM rows r JOIN cells c USING (cell) WHERE r.name = ? ORDER BY c.run, c.rank_dir, c.step""", [name])
        series: dict = {}
        for point in rows:
            key = (point["run"] or "") + ("/" if point["run"] else "") + str(point["rank_dir"])
            series.setdefault(key, {"rank": key, "points": []})["points"].append(
                {"step": point["step"], "target": _finite(point["target"]), "bench": _finite(point["bench"])})
        steps = sorted({point["step"] for point in rows if point["step"] is not None})
        return {"name": name, "stat": stat, "steps": steps, "series": list(series.values())}

    def tree(self, cell: int, side: str = "target") -> Any:
        """The model tree of ``cell`` on ``side`` (``bench``: the bench dump's own hierarchy)."""
        from msprobe.view._tree import build_pair

        if side not in ("target", "bench"):
            raise ConfigError(f"side must be target or bench, not {side!r}")
        if cell not in self._trees:
            with self._lock:
                if cell not in self._trees:
                    if len(self._trees) >= 4:  # bounded: the trees of the last few cells
                        self._trees.pop(next(iter(self._trees)))
                    self._trees[cell] = build_pair(self, cell)
        target, bench = self._trees[cell]
        if side == "bench" and bench is None:
            raise ConfigError("this view has no bench: no bench tree")
        return target if side == "target" else bench

    def cluster(self, cell: int, lane_begin: int = 0, lane_end: Optional[int] = None) -> dict:
        """The cluster view of the (run, step) of ``cell``: a page of its ranks as lanes
        (:mod:`msprobe.view._cluster`; each step's model built once, the last few kept)."""
        from msprobe.view._cluster import LANES_PAGE, build_cluster

        self._whole("the cluster view")
        cell_row = self._cell(cell)
        key = (cell_row["run"], cell_row["step"])
        with self._lock:
            if key not in self._clusters:
                if len(self._clusters) >= 4:
                    self._clusters.pop(next(iter(self._clusters)))
                self._clusters[key] = build_cluster(self, cell_row)
            model = self._clusters[key]
        return model.page(lane_begin, LANES_PAGE if lane_end is None else lane_end)

    def search(self, cell: int, text: str, limit: int = 50) -> list:
        return self.query("""SELECT record, min(i) AS i, max(score) AS score FROM rows WHERE cell = ?
            AND contains(lower(record), lower(?)) GROUP BY record ORDER BY i LIMIT ?""", [cell, text, limit])



def json_safe(value: Any) -> Any:
    """JSON-safe: NaN and infinities as strings (JSON has none)."""
    if isinstance(value, float):
        if value != value:
            return "NaN"
        if value in (float("inf"), float("-inf")):
            return "Inf" if value > 0 else "-Inf"
        return value
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def _finite(value: Any) -> Any:
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    if number != number:
        return "NaN"
    if number in (float("inf"), float("-inf")):
        return "Inf" if number > 0 else "-Inf"
    return number



def _is_compare_output(path: str) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "summary.json"))


def _compare_apart(path: str, bench: str, out: str, storage_options: Optional[dict],
                   threshold: Optional[float], layouts: Optional[dict] = None, flags: Sequence[str] = (),
                   meanwhile: Any = None) -> None:
    """``msprobe compare`` in a child process: the parsed dumps' memory goes with it, so the server's
    peak stays that of its tables; the child's one-line error is raised here as a ConfigError.
    ``flags``: more of compare's options (the cross-framework mappings ``-am``/``-cm``/``-lm``).
    ``meanwhile``: called while the child compares (the first look)."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "msprobe", "compare", path, bench, "-o", out, "--no-plot", *flags]
    if threshold is not None:
        cmd += ["--divergence-threshold", repr(float(threshold))]
    for side, flag in (("target", "--layout"), ("bench", "--bench-layout")):
        if (layouts or {}).get(side):
            cmd += [flag, str((layouts or {})[side])]
    if storage_options:
        try:
            cmd += ["--storage-options", json.dumps(storage_options)]
        except TypeError:  # options that are objects (a session): they cannot cross; compare here
            from msprobe.compare import compare

            if flags:
                raise ConfigError("the cross-framework mappings need storage options that are JSON") from None
            compare(path, bench, out, plot=False, progress=False, storage_options=storage_options,
                    threshold=threshold, layout=(layouts or {}).get("target"),
                    bench_layout=(layouts or {}).get("bench"))
            return
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as errors:  # no pipe to fill
        child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errors)
        try:
            if meanwhile is not None:  # the first look first: the child yields the CPU to it meanwhile
                _nice(child.pid, 5)
                meanwhile()
                _nice(child.pid, 0)
            returncode = child.wait()
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        errors.seek(0)
        lines = [line for line in errors.read().splitlines() if line.strip()]
    if returncode != 0:
        raise ConfigError(lines[-1] if lines else f"msprobe compare exited with status {returncode}")


def _nice(pid: int, niceness: int) -> None:
    """Set a child's scheduling niceness where this process may (raising it back needs the right)."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, niceness)
    except (OSError, AttributeError):
        pass


def _nothing_to_show(path: str, exc: Exception) -> UnknownDialectError:
    """The error of a path that is neither a dump, nor a compare output, nor a lake of dumps."""
    csvs = os.path.isdir(path) and any(name.endswith(".csv") for name in os.listdir(path))
    extra = (" (it holds CSV files but no summary.json: a compare output needs the summary.json that "
             "msprobe compare writes next to its CSVs; compare the dumps again)") if csvs else ""
    return UnknownDialectError(f"{exc}; nor is it a compare output or a lake of dumps{extra}: nothing to show")


def open_view(path: str, bench: Optional[str] = None, *, storage_options: Optional[dict] = None,
              work_dir: Optional[str] = None, threshold: Optional[float] = None, title: Optional[str] = None,
              layout: Optional[str] = None, bench_layout: Optional[str] = None,
              compare_flags: Sequence[str] = (), stage: Any = None, first_look: Any = None) -> ViewData:
    """The explorer's data for ``path`` (a dump, lake index or compare output) and optional ``bench``.

    With ``bench``, the pair is compared once into ``work_dir`` (a new temporary directory by
    default, removed by :meth:`ViewData.close`). ``layout`` / ``bench_layout``: that side is a
    parallel run, compared and shown as its merged logical model (``compare --layout``).
    ``compare_flags``: ``-am``, ``-cm``, ``-lm`` (a MindSpore dump against a PyTorch one pairs
    through the built-in mappings without them). ``stage``: called with the name of each step of
    the set-up as it begins (``msprobe view``'s progress). ``first_look``: called with a first look
    (a ViewData: :mod:`msprobe.view._first`) while the rest is built, where one can be made."""
    say = stage or (lambda what: None)
    owns = work_dir is None
    work = work_dir or tempfile.mkdtemp(prefix="msprobe_view_")
    os.makedirs(work, exist_ok=True)
    data = ViewData(work, title=title or (f"{path} vs {bench}" if bench else path), target=None, bench=None,
                    storage_options=storage_options, owns_dir=owns)
    try:
        if bench is not None:
            out = os.path.join(work, "compare")
            data.layouts = {"target": layout, "bench": bench_layout}
            say("comparing the pair (msprobe compare, in a child process)")
            meanwhile = None
            if first_look is not None and not any(data.layouts.values()) and not compare_flags:
                def meanwhile() -> None:
                    _first_look(work, title or f"{path} vs {bench}", storage_options, first_look, say,
                                lambda view: pair_first_look(view, path, bench, storage_options, threshold))
            _compare_apart(path, bench, out, storage_options, threshold, data.layouts, compare_flags, meanwhile)
            data.target, data.bench = path, bench
            say("loading the compare output into the view's tables")
            data.load_compare_output(out)
        elif _is_compare_output(path):
            say("loading the compare output into the view's tables")
            data.load_compare_output(path)
        else:
            import msprobe.readers

            data.target = path
            try:
                dump = msprobe.readers.open(path, storage_options=storage_options)
            except UnknownDialectError as exc:  # not one dump: a lake of runs (indexed as msprobe.lake does)
                import msprobe.lake

                if not msprobe.lake.has_runs(path, storage_options):  # never an empty page (issue 41)
                    raise _nothing_to_show(path, exc) from exc
                if first_look is not None:  # from the index files as they are, before the lake is opened
                    _first_look(work, title or path, storage_options, first_look, say,
                                lambda view: lake_first_look(view, path, storage_options))
                say("opening the lake (its index) and loading its cells")
                data.load_lake(msprobe.lake.open(path, storage_options=storage_options, progress=False))
            else:
                if first_look is not None:
                    _first_look(work, title or path, storage_options, first_look, say,
                                lambda view: dump_first_look(view, path, dump, storage_options))
                say("reading the dump into the view's tables")
                data.load_dump(dump)
        say("the overview")
        data.finish()
    except BaseException:
        data.close()
        raise
    return data


def _first_look(work: str, title: str, storage_options: Optional[dict], publish: Any, say: Any, fill: Any) -> None:
    """Build a first look (``fill(view)`` -> whether it could) in its own tables under ``work`` and
    hand it to ``publish``; any failure leaves the page waiting for the whole view, as before."""
    os.makedirs(os.path.join(work, "first_look"), exist_ok=True)
    view = ViewData(os.path.join(work, "first_look"), title=title, target=None, bench=None,
                    storage_options=storage_options)
    try:
        say("a first look (the overview and one cell's rows)")
        if not fill(view):
            view.close()
            return
        view.finish()
    except Exception as exc:  # noqa: BLE001 - the first look is an extra: whatever breaks it, the whole view follows
        view.close()
        say(f"no first look ({type(exc).__name__}: {exc}); the whole view follows")
        return
    publish(view)
