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
from typing import Any, Iterator, Optional

from msprobe.errors import ConfigError, MissingDependencyError, MsprobeError
from msprobe.readers import ANY

__all__ = ["ViewData", "open_view", "ROW_FIELDS", "FILTERS", "json_safe"]

#: the columns of ``rows`` the list and the record detail return, in order
ROW_FIELDS = ("i", "name", "record", "io", "dir", "kind", "result", "err", "norm_rel", "max_rel", "cosine",
              "npu_dtype", "bench_dtype", "npu_shape", "bench_shape", "bench_name",
              "npu_max", "npu_min", "npu_mean", "npu_norm", "bench_max", "bench_min", "bench_mean", "bench_norm",
              "npu_md5", "bench_md5", "nan_inf", "score", "data_name")
#: the list's filters and their values
FILTERS = {
    "dir": ("all", "forward", "backward"),
    "kind": ("all", "api", "module"),
    "result": ("all", "divergent", "nan_inf", "unmatched"),
    "sort": ("order", "score", "norm_rel", "name"),
}
_SEVERITY = "CASE result WHEN 'error' THEN 3 WHEN 'warning' THEN 2 WHEN 'pass' THEN 1 ELSE 0 END"
MEMORY_LIMIT = os.environ.get("MSPROBE_VIEW_MEMORY", "128MB")
#: what "worst" means, one number per row: severity first, then NaN/Inf, then the error
_SCORE = f"""(({_SEVERITY}) * 1e6 + CASE WHEN nan_inf THEN 1e5 ELSE 0 END
    + least(coalesce(CASE WHEN isnan(norm_rel) THEN 1e5 ELSE norm_rel END, 0), 1e5 - 1)
    + CASE WHEN cosine IS NOT NULL AND NOT isnan(cosine) THEN 1 - cosine ELSE 0 END)"""
_RECORD_SQL = r"""CASE
  WHEN regexp_matches(name, '\.parameters_grad') THEN regexp_extract(name, '^(.*\.parameters_grad)', 1)
  WHEN regexp_matches(name, '^.*?\.(forward|backward)(\.\d+)?\.(input|output|parameters|kwargs)(\.|$)')
    THEN regexp_extract(name, '^(.*?\.(?:forward|backward)(?:\.\d+)?)\.(?:input|output|parameters|kwargs)(?:\.|$)', 1)
  ELSE name END"""


#: the compare CSV columns the rows are made of
_CSV_COLUMNS = {"NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape", "Bench Tensor Shape",
                "NormRelativeErr", "MaxRelativeErr", "Cosine", "NPU max", "NPU min", "NPU mean", "NPU l2norm",
                "Bench max", "Bench min", "Bench mean", "Bench l2norm", "NPU MD5", "BENCH MD5", "Result",
                "Err_message", "NPU_Stack_Info", "Data_name"}


def _num(col: str) -> str:
    """SQL: a compare CSV cell as a double ("12.5%" -> 0.125; "N/A", "" -> NULL)."""
    return (f"CASE WHEN {col} LIKE '%\\%' ESCAPE '\\' THEN try_cast(rtrim({col}, '%') AS DOUBLE) / 100 "
            f"ELSE try_cast({col} AS DOUBLE) END")


def _duckdb() -> Any:
    try:
        import duckdb
    except ImportError as exc:
        raise MissingDependencyError("msprobe view needs duckdb: pip install 'msprobe-lake[view]'") from exc
    return duckdb


class ViewData:
    """The explorer's tables in one DuckDB file under ``work_dir``; thread-safe (one cursor per call)."""

    def __init__(self, work_dir: str, *, title: str, target: Optional[str], bench: Optional[str],
                 storage_options: Optional[dict] = None, owns_dir: bool = False):
        duckdb = _duckdb()
        self.work_dir = work_dir
        self.title = title
        self.target = target
        self.bench = bench
        self.storage_options = storage_options
        self.summary: dict = {}
        self._owns = owns_dir
        self._lock = threading.Lock()
        self._db = duckdb.connect(os.path.join(work_dir, "view.duckdb"))
        self._db.execute(f"SET memory_limit='{MEMORY_LIMIT}'")
        self._db.execute("SET threads=2")
        self._db.execute(f"SET temp_directory='{os.path.join(work_dir, 'spill')}'")
        self._dumps: dict = {}
        self._trees: dict = {}
        self._lake: Any = None

    # -- queries ----------------------------------------------------------------------
    def query(self, sql: str, params: Any = ()) -> list:
        """Rows of ``sql`` as dicts (one cursor per call, so server threads do not share one)."""
        cur = self._db.cursor()
        try:
            res = cur.execute(sql, list(params))
            cols = [d[0] for d in res.description]
            return [dict(zip(cols, r)) for r in res.fetchall()]
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

    # -- loading ---------------------------------------------------------------------
    def _create(self) -> None:
        self._db.execute("""CREATE OR REPLACE TABLE rows (cell INTEGER, i INTEGER, name VARCHAR, record VARCHAR,
            io VARCHAR, dir VARCHAR, kind VARCHAR, result VARCHAR, err VARCHAR, norm_rel DOUBLE, max_rel DOUBLE,
            cosine DOUBLE, npu_dtype VARCHAR, bench_dtype VARCHAR, npu_shape VARCHAR, bench_shape VARCHAR,
            bench_name VARCHAR, npu_max DOUBLE, npu_min DOUBLE, npu_mean DOUBLE, npu_norm DOUBLE,
            bench_max DOUBLE, bench_min DOUBLE, bench_mean DOUBLE, bench_norm DOUBLE, npu_md5 VARCHAR,
            bench_md5 VARCHAR, nan_inf BOOLEAN, score DOUBLE, data_name VARCHAR, stack VARCHAR)""")
        self._db.execute("""CREATE OR REPLACE TABLE cells (cell INTEGER, run VARCHAR, step INTEGER, rank INTEGER,
            rank_dir VARCHAR, bench_step INTEGER, bench_rank_dir VARCHAR)""")

    def load_compare_output(self, out_dir: str) -> None:
        """Read a compare output directory (summary.json and the CSVs it names)."""
        path = os.path.join(out_dir, "summary.json")
        try:
            with open(path, encoding="utf-8") as f:
                summary = json.load(f)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{out_dir}: not a compare output (summary.json unreadable: {exc})") from exc
        if not isinstance(summary, dict) or not isinstance(summary.get("pairs"), list):
            raise ConfigError(f"{out_dir}: summary.json has no 'pairs' list: not a compare output")
        self.summary = summary
        self.target = self.target or summary.get("target")
        self.bench = self.bench or summary.get("bench")
        self._create()
        for cell, pair in enumerate(summary["pairs"]):
            rank = pair.get("rank")
            self._db.execute("INSERT INTO cells VALUES (?, ?, ?, ?, ?, ?, ?)",
                             [cell, pair.get("run"), pair.get("step"), rank if isinstance(rank, int) else None,
                              pair.get("rank_dir"), pair.get("bench_step"), pair.get("bench_rank_dir")])
            offset = 0
            for f in pair.get("files") or []:
                csv = f if os.path.isabs(f) else os.path.join(out_dir, os.path.basename(f))
                if not os.path.exists(csv):
                    csv = os.path.join(out_dir, os.path.basename(f))
                offset += self._load_csv(cell, csv, offset, summary.get("mode", "statistics"))

    def _load_csv(self, cell: int, csv: str, offset: int, mode: str) -> int:
        cur = self._db.cursor()
        try:
            cols = {r[0] for r in cur.execute("DESCRIBE SELECT * FROM read_csv(?, all_varchar=true, header=true)",
                                              [csv]).fetchall()}

            def c(name: str) -> str:
                return f'"{name}"' if name in cols else "NULL"
            norm = _num(c("NormRelativeErr"))
            cos = _num(c("Cosine"))
            stats = [_num(c(f"{side} {k}")) for side in ("NPU", "Bench") for k in ("max", "min", "mean", "l2norm")]
            # staged as a table first: its rowid is the file's row order (the execution order)
            wanted = ", ".join(f'"{n}"' for n in sorted(cols & _CSV_COLUMNS))  # only what the rows hold
            cur.execute(f"CREATE OR REPLACE TABLE csv_in AS SELECT {wanted} FROM read_csv(?, all_varchar=true, "
                        "header=true)", [csv])
            sql = f"""INSERT INTO rows SELECT * REPLACE ({_SCORE} AS score) FROM (SELECT ? AS cell, ? + row_number() OVER (ORDER BY pos) - 1 AS i, name,
                {_RECORD_SQL} AS record,
                CASE WHEN regexp_matches(name, '\\.parameters_grad') THEN 'parameters_grad'
                     ELSE coalesce(nullif(regexp_extract(name,
                         '\\.(?:forward|backward)(?:\\.\\d+)?\\.(input|output|parameters|kwargs)(?:\\.|$)', 1), ''),
                         'debug') END AS io,
                CASE WHEN regexp_matches(name, '\\.backward|\\.parameters_grad') THEN 'backward' ELSE 'forward' END,
                CASE WHEN starts_with(name, 'Module.') THEN 'module' ELSE 'api' END,
                result, err, norm_rel, max_rel, cosine, npu_dtype, bench_dtype, npu_shape, bench_shape, bench_name,
                s0, s1, s2, s3, s4, s5, s6, s7, npu_md5, bench_md5,
                coalesce({" OR ".join(f"isnan(s{k}) OR isinf(s{k})" for k in range(4))}, false) AS nan_inf,
                0.0 AS score, data_name, stack
              FROM (SELECT "NPU Name" AS name, lower(coalesce("Result", '')) AS result, "Err_message" AS err,
                {norm} AS norm_rel, {_num(c('MaxRelativeErr'))} AS max_rel, {cos} AS cosine,
                "NPU Dtype" AS npu_dtype, "Bench Dtype" AS bench_dtype, "NPU Tensor Shape" AS npu_shape,
                "Bench Tensor Shape" AS bench_shape, "Bench Name" AS bench_name,
                {', '.join(f'{s} AS s{k}' for k, s in enumerate(stats))},
                {c('NPU MD5')} AS npu_md5, {c('BENCH MD5')} AS bench_md5,
                {c('Data_name')} AS data_name, {c('NPU_Stack_Info')} AS stack, rowid AS pos FROM csv_in))"""
            cur.execute(sql, [cell, offset])
            n = cur.execute("SELECT count(*) FROM csv_in").fetchone()[0]
            cur.execute("DROP TABLE csv_in")
            return int(n)
        finally:
            cur.close()

    #: index rows (staged in ``t_in`` with their ``cell`` and ``pos``, the row order) -> ``rows``
    _INDEX_INSERT = f"""INSERT INTO rows SELECT * REPLACE ({_SCORE} AS score) FROM (SELECT cell, row_number() OVER (PARTITION BY cell ORDER BY seq, pos) - 1,
        name, record, io, dir, kind, CASE WHEN nan_inf THEN 'nan_inf' ELSE '' END AS result, NULL AS err,
        NULL::DOUBLE AS norm_rel, NULL::DOUBLE AS max_rel, NULL::DOUBLE AS cosine,
        dtype, NULL, shape, NULL, NULL, max, min, mean, norm, NULL, NULL, NULL, NULL, md5, NULL,
        nan_inf, 0.0 AS score, data_name, NULL
      FROM (SELECT cell, record || CASE WHEN arg_path IS NULL OR arg_path = '' THEN '' ELSE '.' ||
          -- the compare's row names: input_args.N / input_kwargs.K -> input.N / input.K, a
          -- parameters_grad leaf without its position
          CASE WHEN kind = 'parameters_grad' THEN regexp_replace(arg_path, '\\.0$', '')
          ELSE regexp_replace(arg_path, '^input_(args|kwargs)\\.', 'input.') END END AS name,
          record, CASE WHEN starts_with(io, 'input') THEN 'input' ELSE io END AS io,
          CASE WHEN direction = 'backward' OR kind = 'parameters_grad' THEN 'backward' ELSE 'forward' END AS dir,
          CASE WHEN kind IN ('module', 'parameters_grad') THEN 'module' ELSE 'api' END AS kind,
          dtype, CAST(shape AS VARCHAR) AS shape, try_cast(max AS DOUBLE) AS max,
          try_cast(min AS DOUBLE) AS min, try_cast(mean AS DOUBLE) AS mean,
          try_cast(norm AS DOUBLE) AS norm, md5, coalesce(has_nan, false) OR coalesce(has_inf, false)
          AS nan_inf, data_name, seq, pos FROM t_in))"""

    def _insert_index_rows(self, cur: Any, table: Any, cell_sql: str, params: list) -> None:
        """Stage an Arrow table of index rows and insert it; ``cell_sql`` gives each row its cell."""
        cur.register("t_arrow", table)
        # staged as a table first: its rowid is the row order
        cur.execute("CREATE OR REPLACE TABLE t_raw AS SELECT * FROM t_arrow")
        cur.unregister("t_arrow")
        cur.execute(f"CREATE OR REPLACE TABLE t_in AS SELECT {cell_sql} AS cell, t.*, t.rowid AS pos FROM "
                    f"t_raw t", params)
        cur.execute(self._INDEX_INSERT)
        cur.execute("DROP TABLE t_in")
        cur.execute("DROP TABLE t_raw")

    def load_dump(self, dump: Any) -> None:
        """Rows of one dump without a bench: the readers' index rows, one rank directory at a time."""
        self._dumps["target"] = dump
        self._create()
        cur = self._db.cursor()
        try:
            for cell, src in enumerate(dump.sources):
                rank = src.rank if isinstance(src.rank, int) else None
                cur.execute("INSERT INTO cells VALUES (?, ?, ?, ?, ?, NULL, NULL)",
                            [cell, src.run, src.step, rank, src.rank_dir])
                table = dump.to_arrow(step=src.step, rank=src.rank, run=src.run if src.run else ANY)
                self._insert_index_rows(cur, table, "?::INTEGER", [cell])
        finally:
            cur.close()

    def load_lake(self, lake: Any) -> None:
        """Rows of a lake (many runs x steps x ranks, no bench): its index through the lake's DuckDB,
        one (run, step) at a time, so a step of every rank is the most held at once."""
        self._lake = lake
        self._create()
        cells = _arrow(lake.sql("SELECT DISTINCT run, step, rank, rank_dir FROM lake ORDER BY run, step, rank, "
                                "rank_dir", as_arrow=True)).to_pylist()
        cur = self._db.cursor()
        try:
            for cell, c in enumerate(cells):
                cur.execute("INSERT INTO cells VALUES (?, ?, ?, ?, ?, NULL, NULL)",
                            [cell, c["run"], c["step"], c["rank"], c["rank_dir"]])
            for run, step in sorted({(c["run"], c["step"]) for c in cells}, key=lambda t: (t[0], t[1] is None,
                                                                                            t[1] or 0)):
                where = f"run = {_sql_text(run)} AND " + ("step IS NULL" if step is None else f"step = {int(step)}")
                table = _arrow(lake.sql(f"SELECT * FROM lake WHERE {where}", as_arrow=True))
                self._insert_index_rows(cur, table, "(SELECT cell FROM cells c WHERE c.run = t.run AND "
                                                    "c.step IS NOT DISTINCT FROM t.step AND c.rank_dir = t.rank_dir)",
                                        [])
        finally:
            cur.close()

    def finish(self) -> None:
        """The derived columns and aggregates: each row's score, each cell's worst and first divergence."""
        threshold = None
        div = str(self.summary.get("divergence") or "")
        if "NormRelativeErr >" in div:
            try:
                threshold = float(div.rsplit(">", 1)[1])
            except ValueError:
                threshold = None
        divergent = (f"(norm_rel > {threshold})" if threshold is not None
                     else "(result NOT IN ('pass', '', 'n/a') OR nan_inf)")
        self._db.execute(f"""CREATE OR REPLACE TABLE cell_stats AS SELECT c.*,
            coalesce(a.rows, 0) AS rows, coalesce(a.errors, 0) AS errors, coalesce(a.warnings, 0) AS warnings,
            coalesce(a.nan_inf, 0) AS nan_inf, a.worst_norm_rel, a.worst_cosine, a.first_div,
            coalesce(a.unmatched, 0) AS unmatched, coalesce(a.max_score, 0) AS max_score
          FROM cells c LEFT JOIN (SELECT cell, count(*) AS rows, count(*) FILTER (WHERE result = 'error') AS errors,
            count(*) FILTER (WHERE result = 'warning') AS warnings, count(*) FILTER (WHERE nan_inf) AS nan_inf,
            max(CASE WHEN isnan(norm_rel) THEN NULL ELSE norm_rel END) AS worst_norm_rel,
            min(cosine) AS worst_cosine, min(i) FILTER (WHERE {divergent}) AS first_div,
            count(*) FILTER (WHERE bench_name IS NULL OR bench_name = 'N/A') AS unmatched, max(score) AS max_score
            FROM rows GROUP BY cell) a USING (cell)""")
        self.divergent_sql = divergent

    # -- the views' answers ------------------------------------------------------------
    def meta(self) -> dict:
        cells = self.query("SELECT cell, run, step, rank, rank_dir, bench_rank_dir FROM cells ORDER BY cell")
        s = self.summary
        return {"title": self.title, "target": self.target, "bench": self.bench, "mode": s.get("mode"),
                "divergence": s.get("divergence"), "first_divergence": s.get("first_divergence"),
                "has_bench": self.bench is not None, "cells": cells,
                "rows": self.query("SELECT count(*) AS n FROM rows")[0]["n"]}

    def overview(self) -> dict:
        cells = self.query("""SELECT s.cell, s.run, s.step, s.rank, s.rank_dir, s.rows, s.errors, s.warnings,
            s.nan_inf, s.unmatched, s.worst_norm_rel, s.worst_cosine, s.first_div, s.max_score,
            r.name AS first_div_name
            FROM cell_stats s LEFT JOIN rows r ON r.cell = s.cell AND r.i = s.first_div ORDER BY s.cell""")
        # the first divergent cell: compare's own pick (the earliest step, then the lowest record index
        # over its ranks) when a compare made the rows, else the same order over the cells' first rows
        first = self._summary_cell(self.summary.get("first_divergence"), cells)
        if first is None:
            firsts = [c for c in cells if c["first_div"] is not None]
            first = min(firsts, key=lambda c: (c["step"] is None, c["step"] or 0, c["first_div"], c["cell"]))["cell"] \
                if firsts else None
        origin = self.summary.get("origin")
        if isinstance(origin, dict):
            origin = {k: origin.get(k) for k in ("record", "row", "argument", "role", "note", "step", "rank_dir")}
            origin["cell"] = self._summary_cell(origin, cells)
        return {"cells": cells, "first_cell": first, "origin": origin if isinstance(origin, dict) else None}

    @staticmethod
    def _summary_cell(entry: Any, cells: list) -> Optional[int]:
        """The cell a summary entry (with its ``step`` and ``rank_dir``) names."""
        if not isinstance(entry, dict):
            return None
        return next((c["cell"] for c in cells if c["step"] == entry.get("step")
                     and c["rank_dir"] == entry.get("rank_dir")), None)

    def _where(self, cell: int, f: dict) -> tuple:
        where: list = ["cell = ?"]
        params: list = [cell]
        if f.get("dir", "all") != "all":
            where.append("dir = ?")
            params.append(f["dir"])
        if f.get("kind", "all") != "all":
            where.append("kind = ?")
            params.append(f["kind"])
        res = f.get("result", "all")
        if res == "divergent":
            where.append(self.divergent_sql)
        elif res == "nan_inf":
            where.append("nan_inf")
        elif res == "unmatched":
            where.append("(bench_name IS NULL OR bench_name = 'N/A')")
        q = f.get("q")
        if q:
            where.append("contains(lower(name), lower(?))")
            params.append(str(q))
        return " AND ".join(where), params

    def rows(self, cell: int, begin: int, end: int, f: dict) -> dict:
        """Rows ``begin``..``end`` of a cell under the filters ``f`` (and the count apart)."""
        for key, allowed in FILTERS.items():
            if f.get(key, allowed[0]) not in allowed:
                raise ConfigError(f"{key} must be one of {', '.join(allowed)}, not {f.get(key)!r}")
        begin, end = max(int(begin), 0), max(int(end), 0)
        end = min(end, begin + 1000)
        where, params = self._where(cell, f)
        order = {"order": "i", "score": "score DESC, i", "norm_rel": "norm_rel DESC NULLS LAST, i",
                 "name": "name, i"}[f.get("sort", "order")]
        total = self.query(f"SELECT count(*) AS n FROM rows WHERE {where}", params)[0]["n"]
        if where == "cell = ?" and order == "i":  # every row in execution order: row k is the k-th, no sort
            rows = self.query(f"SELECT {', '.join(ROW_FIELDS)} FROM rows WHERE cell = ? AND i >= ? AND i < ? "
                              f"ORDER BY i", params + [begin, end])
        else:
            rows = self.query(f"SELECT {', '.join(ROW_FIELDS)} FROM rows WHERE {where} ORDER BY {order} "
                              f"LIMIT ? OFFSET ?", params + [end - begin, begin])
        first = self.query(f"SELECT min(i) AS i FROM rows WHERE cell = ? AND {self.divergent_sql}", [cell])[0]["i"]
        return {"total": total, "begin": begin, "rows": rows, "first_div": first}

    def iter_csv_rows(self, cell: int, f: dict) -> Iterator[dict]:
        where, params = self._where(cell, f)
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
        stack_text = next((r["stack"] for r in rows if r.get("stack") not in (None, "", "N/A")), None)
        for r in rows:
            r.pop("stack", None)
        return {"record": record, "args": rows, "stack": self.record_stack(cell, record, stack_text)}

    def record_stack(self, cell: int, record: str, stack_text: Optional[str] = None) -> list:
        """The record's stack frames: stack.json of the target dump, else the compare CSV's column."""
        stack = self._stack(cell, record)
        if stack is None and stack_text and stack_text != "N/A":
            stack = [line for line in str(stack_text).splitlines() if line.strip()]
        return stack or []

    def _cell(self, cell: int) -> dict:
        r = self.query("SELECT * FROM cells WHERE cell = ?", [cell])
        if not r:
            raise ConfigError(f"no cell {cell}")
        return r[0]

    def dump(self, side: str) -> Any:
        """The target or bench dump (opened once), or None when it cannot be opened."""
        if side not in self._dumps:
            url = self.target if side == "target" else self.bench
            d = None
            if url:
                import msprobe.readers

                try:
                    d = msprobe.readers.open(url, storage_options=self.storage_options)
                except (MsprobeError, OSError):
                    d = None
            self._dumps[side] = d
        return self._dumps[side]

    def source(self, side: str, cell: int) -> Any:
        """The rank directory (a readers source) of ``cell`` on ``side``, or None."""
        return self.located(side, cell)[1]

    def located(self, side: str, cell: int) -> tuple:
        """(the Dump, its source) holding ``cell`` on ``side``; (None, None) when it cannot be opened."""
        c = self._cell(cell)
        if self._lake is not None:  # a lake: the cell's run, opened once
            if side != "target" or c["run"] is None:
                return None, None
            key = ("run", c["run"])
            if key not in self._dumps:
                import msprobe.readers

                try:
                    self._dumps[key] = msprobe.readers.open(self._lake.run_url(c["run"]),
                                                            storage_options=self.storage_options)
                except (MsprobeError, OSError):
                    self._dumps[key] = None
            d = self._dumps[key]
        else:
            d = self.dump(side)
        if d is None:
            return None, None
        step = c["step"] if side == "target" else c["bench_step"]
        rd = c["rank_dir"] if side == "target" else c["bench_rank_dir"]
        for s in d.sources:
            if s.step == step and s.rank_dir == rd and (side != "target" or c["run"] is None or s.run == c["run"]):
                return d, s
        return d, None

    def _stack(self, cell: int, record: str) -> Optional[list]:
        src = self.source("target", cell)
        if src is None:
            return None
        try:
            frames = src.frames_of(record)
        except (MsprobeError, OSError, ValueError, KeyError):
            return None
        return [str(x) for x in frames] if frames else None

    def trend(self, name: str, stat: str) -> dict:
        """One row's statistic over steps, per rank, target and bench."""
        if stat not in ("max", "min", "mean", "norm"):
            raise ConfigError(f"stat must be max, min, mean or norm, not {stat!r}")
        rows = self.query(f"""SELECT c.run, c.step, c.rank, c.rank_dir, r.npu_{stat} AS target, r.bench_{stat} AS bench
            FROM rows r JOIN cells c USING (cell) WHERE r.name = ? ORDER BY c.run, c.rank_dir, c.step""", [name])
        series: dict = {}
        for r in rows:
            key = (r["run"] or "") + ("/" if r["run"] else "") + str(r["rank_dir"])
            series.setdefault(key, {"rank": key, "points": []})["points"].append(
                {"step": r["step"], "target": _finite(r["target"]), "bench": _finite(r["bench"])})
        steps = sorted({r["step"] for r in rows if r["step"] is not None})
        return {"name": name, "stat": stat, "steps": steps, "series": list(series.values())}

    def tree(self, cell: int) -> Any:
        from msprobe.view._tree import Tree

        if cell not in self._trees:
            with self._lock:
                if cell not in self._trees:
                    if len(self._trees) >= 4:  # bounded: the trees of the last few cells
                        self._trees.pop(next(iter(self._trees)))
                    self._trees[cell] = Tree.build(self, cell)
        return self._trees[cell]

    def search(self, cell: int, q: str, limit: int = 50) -> list:
        return self.query("""SELECT record, min(i) AS i, max(score) AS score FROM rows WHERE cell = ?
            AND contains(lower(record), lower(?)) GROUP BY record ORDER BY i LIMIT ?""", [cell, q, limit])



def json_safe(v: Any) -> Any:
    """JSON-safe: NaN and infinities as strings (JSON has none)."""
    if isinstance(v, float):
        if v != v:
            return "NaN"
        if v in (float("inf"), float("-inf")):
            return "Inf" if v > 0 else "-Inf"
        return v
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    return v


def _finite(v: Any) -> Any:
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    if f != f:
        return "NaN"
    if f in (float("inf"), float("-inf")):
        return "Inf" if f > 0 else "-Inf"
    return f


def _arrow(t: Any) -> Any:
    """An Arrow table (DuckDB's ``.arrow()`` is a batch reader in some versions)."""
    return t.read_all() if hasattr(t, "read_all") else t


def _sql_text(v: Any) -> str:
    """A SQL string literal (quotes doubled)."""
    return "'" + str(v).replace("'", "''") + "'"


def _is_compare_output(path: str) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "summary.json"))


def _compare_apart(path: str, bench: str, out: str, storage_options: Optional[dict],
                   threshold: Optional[float]) -> None:
    """``msprobe compare`` in a child process: the parsed dumps' memory goes with it, so the server's
    peak stays that of its tables; the child's one-line error is raised here as a ConfigError."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "msprobe", "compare", path, bench, "-o", out, "--no-plot"]
    if threshold is not None:
        cmd += ["--divergence-threshold", repr(float(threshold))]
    if storage_options:
        try:
            cmd += ["--storage-options", json.dumps(storage_options)]
        except TypeError:  # options that are objects (a session): they cannot cross; compare here
            from msprobe.compare import compare

            compare(path, bench, out, plot=False, progress=False, storage_options=storage_options,
                    threshold=threshold)
            return
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
        raise ConfigError(lines[-1] if lines else f"msprobe compare exited with status {done.returncode}")


def open_view(path: str, bench: Optional[str] = None, *, storage_options: Optional[dict] = None,
              work_dir: Optional[str] = None, threshold: Optional[float] = None, title: Optional[str] = None) -> ViewData:
    """The explorer's data for ``path`` (a dump, lake index or compare output) and optional ``bench``.

    With ``bench``, the pair is compared once into ``work_dir`` (a new temporary directory by
    default, removed by :meth:`ViewData.close`)."""
    owns = work_dir is None
    wd = work_dir or tempfile.mkdtemp(prefix="msprobe_view_")
    os.makedirs(wd, exist_ok=True)
    data = ViewData(wd, title=title or (f"{path} vs {bench}" if bench else path), target=None, bench=None,
                    storage_options=storage_options, owns_dir=owns)
    try:
        if bench is not None:
            out = os.path.join(wd, "compare")
            _compare_apart(path, bench, out, storage_options, threshold)
            data.target, data.bench = path, bench
            data.load_compare_output(out)
        elif _is_compare_output(path):
            data.load_compare_output(path)
        else:
            import msprobe.readers
            from msprobe.errors import UnknownDialectError

            data.target = path
            try:
                d = msprobe.readers.open(path, storage_options=storage_options)
            except UnknownDialectError:  # not one dump: a lake of runs (indexed as msprobe.lake does)
                import msprobe.lake

                data.load_lake(msprobe.lake.open(path, storage_options=storage_options, progress=False))
            else:
                data.load_dump(d)
        data.finish()
    except BaseException:
        data.close()
        raise
    return data
