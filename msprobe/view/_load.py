"""Loading the explorer's tables: a compare output's CSVs, one dump's index rows, a lake's index.

Every source becomes the same two tables in the view's DuckDB (``rows``: one row per compared argument
leaf; ``cells``: one per run, step and rank), then :meth:`Loader.finish` derives each row's score and
the per-cell aggregates (``cell_stats``) every view reads instead of the raw rows.
"""
from __future__ import annotations

import json
import os
from typing import Any, Optional

from msprobe.errors import ConfigError, MsprobeError
from msprobe.format.comm import COMM_PREFIXES, buffer_args, is_buffer_leaf
from msprobe.format.nonfinite import NonFiniteTracker
from msprobe.format.stats import CSV_BENCH, CSV_TARGET, MAX, NORM, STAT_COLUMNS
from msprobe.readers import ANY, records_of
from msprobe.view._ranks import mark_ranks

__all__ = ["Loader"]

_SEVERITY = "CASE result WHEN 'error' THEN 3 WHEN 'warning' THEN 2 WHEN 'pass' THEN 1 ELSE 0 END"
#: what "worst" means, one number per row: severity first, then NaN/Inf, then the error
_SCORE = f"""(({_SEVERITY}) * 1e6 + CASE WHEN nan_inf THEN 1e5 ELSE 0 END
    + least(coalesce(CASE WHEN isnan(norm_rel) THEN 1e5 ELSE norm_rel END, 0), 1e5 - 1)
    + CASE WHEN cosine IS NOT NULL AND NOT isnan(cosine) THEN 1 - cosine ELSE 0 END)"""


def record_sql(column: str) -> str:
    """SQL: the record a compare row name (``column``) is of (its argument path cut off)."""
    return r"""CASE
  WHEN regexp_matches(COL, '\.parameters_grad') THEN regexp_extract(COL, '^(.*\.parameters_grad)', 1)
  WHEN regexp_matches(COL, '^.*?\.(forward|backward)(\.\d+)?\.(input|output|parameters|kwargs)(\.|$)')
    THEN regexp_extract(COL, '^(.*?\.(?:forward|backward)(?:\.\d+)?)\.(?:input|output|parameters|kwargs)(?:\.|$)', 1)
  ELSE COL END""".replace("COL", column)


_RECORD_SQL = record_sql("name")


#: the compare CSV columns the rows are made of
_CSV_COLUMNS = {"NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape", "Bench Tensor Shape",
                NORM.relative, MAX.relative, "Cosine", *CSV_TARGET, *CSV_BENCH, "NPU MD5", "BENCH MD5", "Result",
                "Err_message", "NPU_Stack_Info", "Data_name"}
#: the statistics' columns of ``rows``: the target's (npu_max...), then the bench's (format.stats' order)
SIDE_STAT_COLUMNS = tuple(f"{side}_{column}" for side in ("npu", "bench") for column in STAT_COLUMNS)
_N_STATS = len(STAT_COLUMNS)


def sql_literal(value: Any) -> str:
    """A SQL literal of a cell's value (None, a bool, a number, a text). The first look's path binds no
    parameter: DuckDB imports pandas at its first parameterised query (1-2 s on a loaded machine),
    which the page's first answers then do not wait for."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


def _num(col: str) -> str:
    """SQL: a compare CSV cell as a double ("12.5%" -> 0.125; "N/A", "" -> NULL)."""
    return (f"CASE WHEN {col} LIKE '%\\%' ESCAPE '\\' THEN try_cast(rtrim({col}, '%') AS DOUBLE) / 100 "
            f"ELSE try_cast({col} AS DOUBLE) END")



class Loader:
    """The loading half of :class:`~msprobe.view._data.ViewData` (which holds the connection)."""

    _db: Any
    _dumps: dict
    _lake: Any
    summary: dict
    layouts: dict
    target: Optional[str]
    bench: Optional[str]
    divergent_sql: str
    _overview: Optional[dict]
    located_row: Any  # ViewData's: a row of ``cells`` -> (dump, source)

    def _create(self) -> None:
        self._db.execute(f"""CREATE OR REPLACE TABLE rows (cell INTEGER, i INTEGER, name VARCHAR, record VARCHAR,
            io VARCHAR, dir VARCHAR, kind VARCHAR, result VARCHAR, err VARCHAR, norm_rel DOUBLE, max_rel DOUBLE,
            cosine DOUBLE, npu_dtype VARCHAR, bench_dtype VARCHAR, npu_shape VARCHAR, bench_shape VARCHAR,
            bench_name VARCHAR, {", ".join(f"{column} DOUBLE" for column in SIDE_STAT_COLUMNS)}, npu_md5 VARCHAR,
            bench_md5 VARCHAR, nan_inf BOOLEAN, score DOUBLE, data_name VARCHAR, stack VARCHAR)""")
        self._db.execute("""CREATE OR REPLACE TABLE cells (cell INTEGER, run VARCHAR, step INTEGER, rank INTEGER,
            rank_dir VARCHAR, bench_step INTEGER, bench_rank_dir VARCHAR)""")

    def load_compare_output(self, out_dir: str) -> None:
        """Read a compare output directory (summary.json and the CSVs it names)."""
        path = os.path.join(out_dir, "summary.json")
        try:
            with open(path, encoding="utf-8") as file_name:
                summary = json.load(file_name)
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
            self._db.execute("INSERT INTO cells VALUES (" + ", ".join(map(sql_literal, (
                cell, pair.get("run"), pair.get("step"), rank if isinstance(rank, int) else None, pair.get("rank_dir"),
                pair.get("bench_step"), pair.get("bench_rank_dir")))) + ")")
            offset = 0
            for file_name in pair.get("files") or []:
                csv = file_name if os.path.isabs(file_name) else os.path.join(out_dir, os.path.basename(file_name))
                if not os.path.exists(csv):
                    csv = os.path.join(out_dir, os.path.basename(file_name))
                offset += self._load_csv(cell, csv, offset, summary.get("mode", "statistics"))

    def _load_csv(self, cell: int, csv: str, offset: int, mode: str) -> int:
        cur = self._db.cursor()
        try:
            cols = {described[0] for described in cur.execute(
                f"DESCRIBE SELECT * FROM read_csv({sql_literal(csv)}, all_varchar=true, header=true)").fetchall()}

            def column(name: str) -> str:
                return f'"{name}"' if name in cols else "NULL"
            norm = _num(column(NORM.relative))
            cos = _num(column("Cosine"))
            stats = [_num(column(name)) for name in CSV_TARGET + CSV_BENCH]
            # staged as a table first: its rowid is the file's row order (the execution order)
            wanted = ", ".join(f'"{col}"' for col in sorted(cols & _CSV_COLUMNS))  # only what the rows hold
            cur.execute(f"CREATE OR REPLACE TABLE csv_in AS SELECT {wanted} FROM read_csv({sql_literal(csv)}, "
                        "all_varchar=true, header=true)")
            sql = f"""INSERT INTO rows SELECT * REPLACE ({_SCORE} AS score) FROM (SELECT {int(cell)} AS cell, {int(offset)} + row_number() OVER (ORDER BY pos) - 1 AS i, name,
                {_RECORD_SQL} AS record,
                CASE WHEN regexp_matches(name, '\\.parameters_grad') THEN 'parameters_grad'
                     ELSE coalesce(nullif(regexp_extract(name,
                         '\\.(?:forward|backward)(?:\\.\\d+)?\\.(input|output|parameters|kwargs)(?:\\.|$)', 1), ''),
                         'debug') END AS io,
                CASE WHEN regexp_matches(name, '\\.backward|\\.parameters_grad') THEN 'backward' ELSE 'forward' END,
                CASE WHEN starts_with(name, 'Module.') THEN 'module' ELSE 'api' END,
                result, err, norm_rel, max_rel, cosine, npu_dtype, bench_dtype, npu_shape, bench_shape, bench_name,
                {", ".join(f"s{k}" for k in range(2 * _N_STATS))}, npu_md5, bench_md5,
                coalesce({" OR ".join(f"isnan(s{k}) OR isinf(s{k})" for k in range(_N_STATS))}, false) AS nan_inf,
                0.0 AS score, data_name, stack
              FROM (SELECT "NPU Name" AS name, lower(coalesce("Result", '')) AS result, "Err_message" AS err,
                {norm} AS norm_rel, {_num(column(MAX.relative))} AS max_rel, {cos} AS cosine,
                "NPU Dtype" AS npu_dtype, "Bench Dtype" AS bench_dtype, "NPU Tensor Shape" AS npu_shape,
                "Bench Tensor Shape" AS bench_shape, "Bench Name" AS bench_name,
                {', '.join(f'{s} AS s{k}' for k, s in enumerate(stats))},
                {column('NPU MD5')} AS npu_md5, {column('BENCH MD5')} AS bench_md5,
                {column('Data_name')} AS data_name, {column('NPU_Stack_Info')} AS stack, rowid AS pos FROM csv_in))"""
            cur.execute(sql)
            count = cur.execute("SELECT count(*) FROM csv_in").fetchone()[0]
            cur.execute("DROP TABLE csv_in")
            return int(count)
        finally:
            cur.close()

    #: index rows (staged in ``t_in`` with their ``cell`` and ``pos``, the row order) -> ``rows``
    _INDEX_INSERT = f"""INSERT INTO rows SELECT * REPLACE ({_SCORE} AS score) FROM (SELECT cell, row_number() OVER (PARTITION BY cell ORDER BY seq, pos) - 1,
        name, record, io, dir, kind, CASE WHEN nan_inf THEN 'nan_inf' ELSE '' END AS result, NULL AS err,
        NULL::DOUBLE AS norm_rel, NULL::DOUBLE AS max_rel, NULL::DOUBLE AS cosine,
        dtype, NULL, shape, NULL, NULL, {", ".join(STAT_COLUMNS)}, {", ".join(["NULL"] * _N_STATS)}, md5, NULL,
        nan_inf, 0.0 AS score, data_name, NULL
      FROM (SELECT cell, record || CASE WHEN arg_path IS NULL OR arg_path = '' THEN '' ELSE '.' ||
          -- the compare's row names: input_args.N / input_kwargs.K -> input.N / input.K, a
          -- parameters_grad leaf without its position
          CASE WHEN kind = 'parameters_grad' THEN regexp_replace(arg_path, '\\.0$', '')
          ELSE regexp_replace(arg_path, '^input_(args|kwargs)\\.', 'input.') END END AS name,
          record, CASE WHEN starts_with(io, 'input') THEN 'input' ELSE io END AS io,
          CASE WHEN direction = 'backward' OR kind = 'parameters_grad' THEN 'backward' ELSE 'forward' END AS dir,
          CASE WHEN kind IN ('module', 'parameters_grad') THEN 'module' ELSE 'api' END AS kind,
          dtype, CAST(shape AS VARCHAR) AS shape,
          {", ".join(f"try_cast({column} AS DOUBLE) AS {column}" for column in STAT_COLUMNS)}, md5, coalesce(has_nan, false) OR coalesce(has_inf, false)
          AS nan_inf, data_name, seq, pos FROM t_in))"""

    def _insert_index_rows(self, cur: Any, table: Any, cell_sql: str, params: list, join: str = "") -> None:
        """Stage an Arrow table (or record batch reader) of index rows and insert it; ``cell_sql`` gives
        each row its cell (over ``t``, the staged rows, and what ``join`` joins them to)."""
        cur.register("t_arrow", table)
        # staged as a table first: its rowid is the row order
        cur.execute("CREATE OR REPLACE TABLE t_raw AS SELECT * FROM t_arrow")
        cur.unregister("t_arrow")
        cur.execute(f"CREATE OR REPLACE TABLE t_in AS SELECT {cell_sql} AS cell, t.*, t.rowid AS pos FROM "
                    f"t_raw t {join}", params)
        cur.execute(self._INDEX_INSERT)
        cur.execute("DROP TABLE t_in")
        cur.execute("DROP TABLE t_raw")

    def load_dump(self, dump: Any, keep: bool = True) -> None:
        """Rows of one dump without a bench: the readers' index rows, one rank directory at a time
        (``keep``: the records, stacks and trees read from ``dump``; else from :attr:`target`)."""
        if keep:
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

    #: the lake's columns the rows are made of (the rest of its index stays in the lake)
    _LAKE_COLUMNS = ("run, step, rank_dir, seq, record, kind, direction, io, arg_path, dtype, shape, "
                     + ", ".join(STAT_COLUMNS) + ", md5, has_nan, has_inf, data_name")

    def load_lake(self, lake: Any) -> None:
        """Rows of a lake (many runs x steps x ranks, no bench): its index through the lake's DuckDB in
        one streamed query (record batches, staged on disk under the view's memory limit), each row
        given its cell by a join (10,240 cells: 23 s where a query a step and an insert a cell took 70)."""
        self._lake = lake
        self._create()
        cells = _arrow(lake.sql("SELECT DISTINCT run, step, rank, rank_dir FROM lake", as_arrow=True))
        cur = self._db.cursor()
        try:
            cur.register("c_arrow", cells)
            cur.execute("INSERT INTO cells SELECT (row_number() OVER (ORDER BY run, step NULLS LAST, rank NULLS LAST, "
                        "rank_dir) - 1)::INTEGER, run, step, rank, rank_dir, NULL, NULL FROM c_arrow")
            cur.unregister("c_arrow")
            self._insert_index_rows(cur, lake.sql(f"SELECT {self._LAKE_COLUMNS} FROM lake", as_arrow=True), "c.cell",
                                    [], join="JOIN cells c ON c.run = t.run AND c.step IS NOT DISTINCT FROM t.step "
                                             "AND c.rank_dir = t.rank_dir")
        finally:
            cur.close()

    def add_cell(self, cell: int, target_source: Any, bench_source: Any = None) -> None:
        """A cell without rows yet (a first look lists the cells still being read or compared)."""
        rank = target_source.rank if isinstance(target_source.rank, int) else None
        self._db.execute("INSERT INTO cells VALUES (" + ", ".join(map(sql_literal, (
            cell, getattr(target_source, "run", None) or None, target_source.step, rank, target_source.rank_dir,
            getattr(bench_source, "step", None), getattr(bench_source, "rank_dir", None)))) + ")")

    def load_lake_overview(self, files: list, runs: dict) -> None:
        """A lake's first look from its index files (``files``: the Parquet files its manifest names;
        ``runs``: run -> URL, from its catalog), read here without opening the lake: every cell, its
        rows and NaN/Inf rows counted in one grouped query (:attr:`counted`: :meth:`finish` takes them),
        and the rows of one cell: the first NaN/Inf one (earliest step, then earliest record over its
        ranks), else the first cell."""
        self._runs = dict(runs)
        self._create()
        source = ("(SELECT * FROM read_parquet([" + ", ".join(sql_literal(path) for path in files)
                  + "], union_by_name=true) WHERE has_nan IS NOT NULL)")
        cur = self._db.cursor()
        try:
            cur.execute(f"""CREATE OR REPLACE TABLE lake_counts AS SELECT (row_number() OVER (ORDER BY run,
                step NULLS LAST, rank NULLS LAST, rank_dir) - 1)::INTEGER AS cell, * FROM (SELECT run, step, rank,
                rank_dir, count(*) AS rows,
                count(*) FILTER (WHERE coalesce(has_nan, false) OR coalesce(has_inf, false)) AS nan_inf,
                min(seq) FILTER (WHERE coalesce(has_nan, false) OR coalesce(has_inf, false)) AS first_seq
                FROM {source} GROUP BY run, step, rank, rank_dir)""")
            cur.execute("INSERT INTO cells SELECT cell, run, step, rank, rank_dir, NULL, NULL FROM lake_counts")
            first = cur.execute("""SELECT cell, run, step, rank_dir FROM lake_counts ORDER BY first_seq IS NULL,
                step NULLS LAST, first_seq, cell LIMIT 1""").fetchone()
            if first is not None:
                cell, run, step, rank_dir = first
                rows = cur.execute(f"SELECT {self._LAKE_COLUMNS} FROM {source} WHERE run = ? AND step IS NOT DISTINCT "
                                   "FROM ? AND rank_dir = ?", [run, step, rank_dir]).arrow()
                self._insert_index_rows(cur, _arrow(rows), "?::INTEGER", [cell])
        finally:
            cur.close()
        self.counted = True

    def finish(self) -> None:
        """The derived columns and aggregates: each row's score, each cell's worst and first divergence."""
        self._overview = None
        mark_buffers(self._db, self.located_row)
        mark_masks(self._db)
        mark_ranks(self._db, self.located_row, self.layouts, record_sql)
        threshold = None
        div = str(self.summary.get("divergence") or "")
        if "NormRelativeErr >" in div:
            try:
                threshold = float(div.rsplit(">", 1)[1])
            except ValueError:
                threshold = None
        from msprobe.compare import ONLY_10X, roundoff_floor_sql

        # compare's rule: a row only the 10x rule flags, where every matched output of its record is
        # within its dtype's round-off floor, is no divergence (msprobe.compare._verdict.roundoff_rows)
        self._db.execute(f"""CREATE OR REPLACE TABLE roundoff_records AS SELECT cell, record FROM rows
            WHERE record IS NOT NULL GROUP BY cell, record HAVING bool_and(io <> 'output' OR bench_name IS NULL
            OR bench_name = 'N/A' OR norm_rel IS NULL OR norm_rel <= {roundoff_floor_sql('npu_dtype')})""")
        roundoff = (f"(err = {sql_literal(ONLY_10X)} AND EXISTS (SELECT 1 FROM roundoff_records k "
                    "WHERE k.cell = rows.cell AND k.record = rows.record))")
        divergent = (f"(NOT buffer AND norm_rel > {threshold})" if threshold is not None
                     else f"(NOT buffer AND ((result NOT IN ('pass', '', 'n/a') AND NOT {roundoff}) OR nan_inf))")
        self._db.execute(f"""CREATE OR REPLACE TABLE cell_stats AS SELECT c.*,
            coalesce(a.rows, 0) AS rows, coalesce(a.errors, 0) AS errors, coalesce(a.warnings, 0) AS warnings,
            coalesce(a.nan_inf, 0) AS nan_inf, coalesce(a.masked, 0) AS masked, a.worst_norm_rel, a.worst_cosine,
            a.first_div,
            coalesce(a.unmatched, 0) AS unmatched, coalesce(a.max_score, 0) AS max_score
          FROM cells c LEFT JOIN (SELECT cell, count(*) AS rows,
            count(*) FILTER (WHERE result = 'error' AND NOT buffer) AS errors,
            count(*) FILTER (WHERE result = 'warning' AND NOT buffer) AS warnings,
            count(*) FILTER (WHERE nan_inf AND NOT buffer) AS nan_inf, count(*) FILTER (WHERE masked) AS masked,
            max(CASE WHEN buffer OR isnan(norm_rel) THEN NULL ELSE norm_rel END) AS worst_norm_rel,
            min(CASE WHEN buffer THEN NULL ELSE cosine END) AS worst_cosine, min(i) FILTER (WHERE {divergent}) AS first_div,
            count(*) FILTER (WHERE bench_name IS NULL OR bench_name = 'N/A') AS unmatched,
            max(score) FILTER (WHERE NOT buffer) AS max_score
            FROM rows GROUP BY cell) a USING (cell)""")
        if getattr(self, "counted", False):  # a lake's first look: the cells whose rows are not read, counted
            self._db.execute("""UPDATE cell_stats SET rows = k.rows, nan_inf = k.nan_inf,
                max_score = CASE WHEN k.nan_inf > 0 THEN 1e5 ELSE 0 END
                FROM lake_counts k WHERE cell_stats.cell = k.cell AND cell_stats.rows = 0""")
        self.divergent_sql = divergent


#: a communication record's argument rows (candidates for a receive buffer)
_COMM_INPUTS = ("io = 'input' AND (" + " OR ".join(f"starts_with(record, '{prefix}.')" for prefix in COMM_PREFIXES)
                + ")")


def mark_buffers(db: Any, located_row: Any) -> int:
    """Mark the rows of communication calls' receive buffers (:func:`msprobe.format.comm.buffer_args`:
    a ``recv``/``irecv`` tensor, ``all_gather``'s output list, a non-root's ``broadcast`` tensor, ...):
    their content before the call is whatever the memory held, no data. Such a row is ``buffer``:
    its own statistics stay as they are (a NaN there is listed as one), but it counts in no cell's
    NaN/Inf, errors, warnings, worst error, worst score or first divergence, and is never divergent
    (a step or rank is never NaN/Inf, nor divergent, from a receive buffer). Only rows
    that would count are looked at (NaN/Inf, not pass, a relative error): their rank's ``dump.json``
    is read (``located_row``: a row of ``cells`` -> (dump, source)) for the records' arguments.
    Returns the rows marked."""
    db.execute("ALTER TABLE rows ADD COLUMN IF NOT EXISTS buffer BOOLEAN DEFAULT false")
    found = db.execute(f"""SELECT r.cell, r.i, r.name, r.record FROM rows r WHERE {_COMM_INPUTS}
        AND (nan_inf OR result NOT IN ('pass', '', 'n/a') OR coalesce(norm_rel, 0) <> 0) ORDER BY r.cell, r.i""").fetchall()
    marked: list = []
    cell_rows: dict = {}
    for cell, i, name, record in found:
        cell_rows.setdefault(cell, []).append((i, name, record))
    for cell, rows in cell_rows.items():
        cur = db.execute(f"SELECT * FROM cells WHERE cell = {int(cell)}")
        cell_row = dict(zip([d[0] for d in cur.description], cur.fetchone()))
        records = _records(located_row, cell_row)
        if records is None:
            continue
        rank = cell_row["rank"] if isinstance(cell_row["rank"], int) else -1
        buffers: dict = {}
        for i, name, record in rows:
            if record not in buffers:
                buffers[record] = buffer_args(record, records.get(record), rank)
            if is_buffer_leaf(name[len(record) + 1:], buffers[record]):
                marked.append((cell, i))
    if marked:
        db.execute("CREATE OR REPLACE TEMP TABLE buffer_rows (cell INTEGER, i INTEGER)")
        db.executemany("INSERT INTO buffer_rows VALUES (?, ?)", marked)
        db.execute("""UPDATE rows SET buffer = true
            FROM buffer_rows b WHERE rows.cell = b.cell AND rows.i = b.i""")
        db.execute("DROP TABLE buffer_rows")
    return len(marked)


def _records(located_row: Any, cell_row: dict) -> Optional[dict]:
    """The records of a cell's rank directory (its ``dump.json``'s data); None when unreadable."""
    try:
        source = located_row("target", cell_row)[1]
        if source is None:
            return None
        try:
            return records_of(source)
        finally:
            source.release()
    except (MsprobeError, OSError, ValueError):
        return None


def _side_kind(tracker: NonFiniteTracker, record: str, name: str, io: Any, stats: tuple, dtype: Any,
               shape: Any) -> Optional[str]:
    path = name[len(record) + 1:] if name.startswith(record + ".") else name
    side_io = "input" if io in ("input", "kwargs") else io
    return tracker.see(side_io, path, stats, dtype, shape)


def mark_masks(db: Any) -> int:
    """compare's mask rule (:mod:`msprobe.format.nonfinite`) over the rows holding a NaN or an Inf, in
    each cell's execution order, one tracker per side: a row whose only non-finite values are a
    mask's intended ``-inf`` (``masked_fill(..., -inf)``, the masks it feeds) is ``masked`` and not
    ``nan_inf``: its own quiet category, never the colour of a NaN. Returns the rows marked."""
    db.execute("ALTER TABLE rows ADD COLUMN IF NOT EXISTS masked BOOLEAN DEFAULT false")
    target, bench = ", ".join(SIDE_STAT_COLUMNS[:_N_STATS]), ", ".join(SIDE_STAT_COLUMNS[_N_STATS:])
    cur = db.execute(f"""SELECT cell, i, name, record, io, {target}, npu_dtype, npu_shape,
        {bench}, bench_dtype, bench_shape FROM rows WHERE nan_inf ORDER BY cell, i""")
    trackers: dict = {}
    last: dict = {}
    marked: list = []
    while True:
        batch = cur.fetchmany(4096)
        if not batch:
            break
        for cell, i, name, record, io, *sides in batch:
            kinds = []
            for side, (*stats, dtype, shape) in enumerate((sides[:_N_STATS + 2], sides[_N_STATS + 2:])):
                tracker = trackers.setdefault((cell, side), NonFiniteTracker())
                if last.get((cell, side)) != record:
                    tracker.record(record or "")
                    last[(cell, side)] = record
                kinds.append(_side_kind(tracker, record or "", name or "", io, tuple(stats), dtype, shape))
            if "masked" in kinds and set(kinds) <= {"masked", None}:
                marked.append((cell, i))
    if marked:
        db.execute("CREATE OR REPLACE TEMP TABLE masked_rows (cell INTEGER, i INTEGER)")
        db.executemany("INSERT INTO masked_rows VALUES (?, ?)", marked)
        db.execute("""UPDATE rows SET masked = true, nan_inf = false, score = score - 1e5,
            result = CASE WHEN result = 'nan_inf' THEN 'masked' ELSE result END
            FROM masked_rows m WHERE rows.cell = m.cell AND rows.i = m.i""")
        db.execute("DROP TABLE masked_rows")
    return len(marked)


def _arrow(table: Any) -> Any:
    """An Arrow table (DuckDB's ``.arrow()`` is a batch reader in some versions)."""
    return table.read_all() if hasattr(table, "read_all") else table

