"""Questions that span runs, steps and ranks.

* :func:`first_nan` — the first NaN/Inf statistic of each (run, rank) that is no attention
  mask's intended ``-inf``: one DuckDB query, then compare's rule over the non-finite rows.
* :func:`~msprobe.lake._diverge.diverge` (in its own module: compare over the Executor) — the first
  record where two runs diverge, over all their ranks.
* :func:`disagree` — ranks whose statistic of the same record differs from what a majority
  of the ranks agree on in the same step: one DuckDB query (median across ranks); records
  where no majority agrees (the local, pre-all-reduce gradients of a DDP run) are counted,
  not blamed on a rank.
* :func:`trend` — a record's statistic over steps, per run and rank, with a PNG plot.
"""
from __future__ import annotations

import bisect
import math
import os
from typing import Any, Optional

from msprobe.errors import ConfigError, MissingDependencyError
from msprobe.format.comm import CommCall, comm_api, describe_path, graph_from_calls, propagation
from msprobe.format.settled import settled_positions
from msprobe.format.stats import NORM, STAT_COLUMNS
from msprobe.lake._graph import is_buffer_row

__all__ = ["first_nan", "disagree", "trend", "STATS", "NAN_KINDS", "TREND_MAX_RECORDS"]

STATS = STAT_COLUMNS
#: document order of a record's argument groups (rows of one record sort by it, then arg_path)
_IO_ORDER = ("CASE io WHEN 'input_args' THEN 0 WHEN 'input_kwargs' THEN 1 WHEN 'input' THEN 2 "
             "WHEN 'parameters' THEN 3 WHEN 'output' THEN 4 ELSE 5 END")


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, (int, float)):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


def _among(col: str, values: Any) -> str:
    if values is None:
        return ""
    if isinstance(values, (str, int)):
        values = [values]
    values = list(values)
    if not values:
        return " AND FALSE"
    return f" AND {col} IN ({', '.join(_literal(value) for value in values)})"


def _record_where(record: Any) -> str:
    if record is None:
        return ""
    if isinstance(record, str) and any(char in record for char in "*?["):
        return f" AND record GLOB {_literal(record)}"
    return _among("record", record)


# -- first NaN/Inf ----------------------------------------------------------------------------------

#: what :func:`first_nan` looks for
NAN_KINDS = ("any", "nan", "inf")


def first_nan(lake: Any, *, run: Any = None, step: Any = None, rank: Any = None, kind: str = "any") -> Any:
    """One row per (run, rank) that has a NaN or an Inf in a statistic: the first such row in
    execution order (step, then the record's position in dump.json, then its arguments), the rows
    sorted by (run, step, their place in the step's happens-before order): each rank's first takes
    the ``level`` of its rank's last communication call at or before it (the ``comm_calls``
    table, :mod:`msprobe.lake._graph`), ``order`` = [level, rank, record index], and each run's
    first row is its ``origin`` (True) with its propagation path over the ranks (``path``, as
    text; the hops in ``attrs["paths"][run]``): a NaN born on one pipeline stage and received by
    another is named where it was born. A communication call's receive buffers (their content
    before the call: leftover memory) are no data and never an answer, as in compare and
    :func:`msprobe.format.cluster.first_anomaly`.

    An attention mask's intended ``-inf`` (``masked_fill(..., -inf)``, ``torch.full(..., -inf)``
    and the tensors such a mask feeds) is no anomaly: the rows are classed by the rule compare
    uses (:class:`msprobe.format.nonfinite.NonFiniteTracker`, each rank's records of a step in
    order) and the masks' ``-inf`` counted apart. ``kind``: ``"any"`` (a NaN or a non-mask
    Inf), ``"nan"`` (NaN only) or ``"inf"`` (non-mask Inf only).

    Columns: run, rank, rank_dir, split, step, seq, record, io, arg_path, max, min, mean, norm,
    has_nan, has_inf, kind ("nan" or "inf"), and the rank's counts over the rows asked about:
    nan_rows, inf_rows (Inf that is no mask's), masked_rows (a mask's -inf); level, order, origin,
    path. The frame's
    ``attrs["masked_only"]`` lists the (run, rank_dir) whose only non-finite values are masks'.
    ``run``, ``step``, ``rank``: a value or a list of values to keep.

    Example: ``msprobe.lake.open("./lake").first_nan(run="run_npu")`` -> a DataFrame, empty
    when no statistic holds a NaN or a non-mask Inf (``msprobe lake nan ./lake``)."""
    import pandas as pd

    from msprobe.format.nonfinite import NonFiniteTracker

    if kind not in NAN_KINDS:
        raise ConfigError(f"kind={kind!r}: one of {', '.join(NAN_KINDS)}")
    where = "(has_nan OR has_inf)" + _among("run", run) + _among("step", step) + _among("rank", rank)
    cols = ["run", "rank", "rank_dir", "split", "step", "seq", "record", "io", "arg_path", *STAT_COLUMNS,
            "has_nan", "has_inf"]
    # a communication call's receive buffers (their content before the call) are no data: left out
    frame = lake.sql(f"""
    WITH l AS (SELECT {", ".join(cols)}, dtype, shape FROM lake WHERE {where})
    SELECT l.*, c.buffers AS comm_buffers FROM l LEFT JOIN comm_calls c
      ON l.run = c.run AND l.step IS NOT DISTINCT FROM c.step AND l.split IS NOT DISTINCT FROM c.split
         AND l.rank = c.rank AND l.seq = c."index"
    ORDER BY run, rank NULLS FIRST, rank_dir, step NULLS FIRST, split NULLS FIRST, seq, {_IO_ORDER}, arg_path
    """)
    frame = _settled(lake, frame)
    firsts: dict = {}
    counts: dict = {}
    tracker, part, rec = NonFiniteTracker(), None, None
    for row in frame.itertuples(index=False):
        key = (row.run, row.rank_dir)
        if (key, row.split, row.step) != part:  # compare classes one rank's records of one step
            tracker, part, rec = NonFiniteTracker(), (key, row.split, row.step), None
        if (row.seq, row.record) != rec:
            rec = (row.seq, row.record)
            tracker.record(row.record)
        if is_buffer_row(row.arg_path, row.comm_buffers):
            continue
        stats = tuple(None if value is None or pd.isna(value) and not isinstance(value, float) else float(value)
                      for value in (row.max, row.min, row.mean, row.norm))
        got = tracker.see(row.io, row.arg_path, stats, row.dtype, row.shape)
        counted = counts.setdefault(key, {"nan": 0, "inf": 0, "masked": 0})
        if got is None:
            continue
        counted[got] += 1
        if got != "masked" and kind in ("any", got) and key not in firsts:
            firsts[key] = dict(zip(cols, row[:len(cols)]), kind=got)
            if row.settled_at != row.seq:
                firsts[key]["settled_at"] = row.settled_at
    out = [dict(found, nan_rows=counts[rank_key]["nan"], inf_rows=counts[rank_key]["inf"],
                masked_rows=counts[rank_key]["masked"])
           for rank_key, found in firsts.items()]
    paths = _in_order(lake, out)
    res = pd.DataFrame(out, columns=cols + ["kind", "nan_rows", "inf_rows", "masked_rows", "level", "order", "origin",
                                            "path"])
    res.attrs["paths"] = paths
    res.attrs["masked_only"] = [{"run": rank_key[0], "rank_dir": rank_key[1], "masked_rows": counted["masked"]}
                                for rank_key, counted in counts.items()
                                if counted["masked"] and not counted["nan"] and not counted["inf"]]
    return res


def _settled(lake: Any, frame: Any) -> Any:
    """``frame`` (first_nan's rows, in execution order) with ``settled_at``: each row's position
    where its record's content was settled (:mod:`msprobe.format.settled`: a module's
    ``parameters_grad`` record accumulated over several backward passes, after its last one),
    else its ``seq``; rows re-sorted by it when one moves."""
    frame["settled_at"] = frame["seq"].astype(float)
    pgrad = frame["record"].str.contains(".parameters_grad", regex=False)
    if not pgrad.any():
        return frame
    keys = frame.loc[pgrad, ["run", "rank_dir", "step", "split"]].drop_duplicates().to_dict("records")
    names = lake.sql(f"""SELECT DISTINCT run, rank_dir, step, split, seq, record FROM lake
        WHERE (starts_with(record, 'Module.') OR starts_with(record, 'Cell.'))
          AND (contains(record, '.parameters_grad') OR regexp_matches(record, '\\.backward\\.\\d+$'))
          {_among("run", sorted({k["run"] for k in keys}))} ORDER BY seq""")
    wanted = {tuple(_plain(k[col]) for col in ("run", "rank_dir", "step", "split")) for k in keys}
    moved: dict = {}
    for key, part in names.groupby(["run", "rank_dir", "step", "split"], dropna=False, sort=False):
        key = tuple(_plain(v) for v in key)
        if key not in wanted:
            continue
        seqs = part["seq"].tolist()
        for index, at in settled_positions(part["record"].tolist()).items():
            moved[key + (seqs[index],)] = seqs[int(at)] + 0.5
    if not moved:
        return frame
    frame["settled_at"] = [moved.get(tuple(_plain(v) for v in row), float(row[-1]))
                           for row in frame[["run", "rank_dir", "step", "split", "seq"]].itertuples(index=False)]
    return frame.sort_values(["run", "rank", "rank_dir", "step", "split", "settled_at"], kind="stable",
                             na_position="first").reset_index(drop=True)


def _plain(value: Any) -> Any:
    """A frame's cell as a key: a missing value (None, NaN) as None."""
    return None if value is None or isinstance(value, float) and value != value else value


def _step_of(row: dict) -> tuple:
    return (row["run"], row["split"], row["step"])


def _in_order(lake: Any, rows: list) -> dict:
    """Give each rank's first anomaly its place in its step's happens-before order (``level``: of
    the rank's last communication call at or before it, from ``comm_calls``; ``order``: [level,
    rank, record index]), sort ``rows`` by (run, step, split, order) and flag each run's first
    as its ``origin``, with its propagation path (``path``, as text); returns {run: [hops]}."""
    steps = {_step_of(row) for row in rows}
    calls: dict = {}
    if steps:
        found = lake.sql(f"""SELECT * FROM comm_calls WHERE TRUE{_among("run", sorted({s[0] for s in steps}))}
                         {_among("step", sorted({s[2] for s in steps if s[2] is not None}))} ORDER BY rank, "index" """)
        for call in found.to_dict("records"):
            key = (call["run"], call["split"], call["step"])
            if key in steps:
                calls.setdefault(key, []).append(call)
    levels: dict = {}  # (run, split, step, rank) -> ([call indexes], [their levels]), in record order
    for key, items in calls.items():
        for call in items:
            got = levels.setdefault((*key, call["rank"]), ([], []))
            got[0].append(call["index"])
            got[1].append(call["level"])
    for row in rows:
        indexes, found = levels.get((*_step_of(row), row["rank"]), ([], []))
        at = bisect.bisect_right(indexes, row.pop("settled_at", row["seq"])) - 1
        level = int(found[at]) if at >= 0 else 0
        row["level"] = level
        row["order"] = [level, row["rank"], row["seq"]] if row["rank"] is not None else None
        row["origin"] = False
        row["path"] = None

    def sort_key(row: dict) -> tuple:
        order = row["order"] or [math.inf, math.inf, row["seq"]]
        return (row["run"], row["step"] is None, row["step"] or 0, row["split"] or "", *order)

    rows.sort(key=sort_key)
    paths: dict = {}
    for row in rows:
        if row["run"] in paths:
            continue
        row["origin"] = True
        if row["rank"] is None:  # a rank directory without a rank number: no place among the ranks
            continue
        hops = _path(lake, calls.get(_step_of(row), []), row)
        paths[row["run"]] = [{"from_rank": e.src_rank, "from_record": e.src_record, "to_rank": e.dst_rank,
                              "to_record": e.dst_record, "via": e.kind} for e in hops]
        row["path"] = describe_path((row["rank"], row["record"]), hops)
    return paths


def _path(lake: Any, rows: list, origin: dict) -> list:
    """The communication hops that carried ``origin``'s anomaly to other ranks (the step's graph
    rebuilt from its ``comm_calls`` rows, :func:`msprobe.format.comm.propagation`)."""
    if not rows or origin["rank"] is None:
        return []
    calls: dict = {}
    flags: dict = {}
    for row in rows:
        found = comm_api(row["record"])
        if found is None:
            continue
        group = row["group"]
        call = CommCall(int(row["rank"]), int(row["index"]), row["record"], found[0], found[1].kind,
                        tuple(int(member) for member in group) if group is not None else None,
                        None if row["peer"] is None or row["peer"] != row["peer"] else int(row["peer"]),
                        int(row["tag"] or 0), bool(row["is_root"]))
        calls.setdefault(call.rank, []).append(call)
        flags[(call.rank, call.index)] = (bool(row["data_nonfinite"]), bool(row["result_nonfinite"]))
    world = tuple(sorted({m["rank"] for m in lake.manifest_rows
                          if (m["run"], m["split"], m["step"]) == _step_of(origin) and m["rank"] is not None}
                         | set(calls)))
    graph = graph_from_calls(calls, world)

    def carries(rank: int, index: int, what: str) -> bool:
        flag = flags.get((rank, index))
        return bool(flag and flag[0 if what == "data" else 1])

    return propagation(graph, int(origin["rank"]), int(origin["seq"]), carries)


# -- divergence between two runs ---------------------------------------------------------------------

def disagree(lake: Any, *, run: Any = None, step: Any = None, kind: Optional[str] = "parameters_grad",
             record: Any = None, stat: str = NORM.column, rtol: float = 1e-6, atol: float = 0.0,
             no_consensus: bool = False) -> Any:
    """Rows whose ``stat`` differs from what the other ranks agree on, for the same (run,
    step, record, argument).

    What it compares: the ranks' rows of one record, against their median. A rank is
    reported only where a majority of the ranks agree (the *consensus*) and it does not: in
    data-parallel training, a value every rank should hold (a reduced gradient, the
    parameters) that one rank holds differently. Where no majority of ranks agree, nothing
    can be blamed on one rank: that is what ``parameters_grad`` records of a data-parallel
    (DDP) run are, because msprobe, like the real tool, records each parameter's gradient
    when it is accumulated on its rank, *before* the all-reduce averages it; every rank's
    local gradient differs and they are not disagreements. Those rows are left out (with
    ``no_consensus=True`` they are returned too, ``consensus`` false) and counted in the
    frame's ``attrs``: ``no_consensus_groups``, ``no_consensus_rows``, and ``note`` (a sentence
    saying what was left out and why; None when nothing was). When no row differs,
    ``attrs["compared"]`` counts the rows that two or more ranks hold (0: every run and step
    has one rank, so there was nothing to compare).

    Example: ``lake.disagree(run="run_npu", stat="max")`` -> a DataFrame, empty when every
    rank agrees.

    ``kind``: the records compared (default ``parameters_grad``; None: every record);
    ``record``: names or a glob. A value differs when ``|v - median| > atol + rtol*|median|``
    or exactly one of them is NaN. Columns: run, step, record, io, arg_path, rank, rank_dir,
    value, median, rel_diff, ranks (how many ranks hold the row), disagreeing (how many
    differ), consensus (a majority of the ranks agree)."""
    if stat not in STATS:
        raise ConfigError(f"stat={stat!r}: one of {', '.join(STATS)}")
    where = ("TRUE" + _among("run", run) + _among("step", step) + (_among("kind", kind) if kind else "")
             + _record_where(record))
    part = "run, split, step, record, io, arg_path"
    groups = f"""
    WITH v AS (
        SELECT run, split, step, record, io, arg_path, rank, rank_dir, {stat} AS value
        FROM lake WHERE {where} AND {stat} IS NOT NULL
    ), m AS (
        SELECT *, median(value) FILTER (WHERE NOT isnan(value)) OVER (PARTITION BY {part}) AS median,
                  count(*) OVER (PARTITION BY {part}) AS ranks
        FROM v
    ), d AS (
        SELECT *, CASE WHEN median IS NULL OR isnan(value) THEN NULL
                       WHEN median = 0 THEN abs(value) ELSE abs(value - median) / abs(median) END AS rel_diff,
               coalesce((isnan(value) != (median IS NULL))
                        OR (NOT isnan(value) AND median IS NOT NULL
                            AND abs(value - median) > {float(atol)!r} + {float(rtol)!r} * abs(median)),
                        FALSE) AS differs
        FROM m WHERE ranks > 1
    ), g AS (
        SELECT *, count(*) FILTER (WHERE differs) OVER (PARTITION BY {part}) AS disagreeing,
               2 * count(*) FILTER (WHERE NOT differs) OVER (PARTITION BY {part}) > ranks AS consensus
        FROM d
    )"""
    # one scan: the differing rows (a small share of the gradient rows) into a temporary table
    tmp = "msprobe_disagree"
    lake.sql(f"CREATE OR REPLACE TEMP TABLE {tmp} AS {groups} SELECT * FROM g WHERE differs")
    try:
        frame = lake.sql(f"""
        SELECT run, split, step, record, io, arg_path, rank, rank_dir, value, median, rel_diff, ranks, disagreeing,
               consensus
        FROM {tmp} {"" if no_consensus else "WHERE consensus"}
        ORDER BY run, step NULLS FIRST, split NULLS FIRST, record, io, arg_path, rank NULLS FIRST
        """)
        left = lake.sql(f"""
        SELECT count(DISTINCT ({part})) AS n_groups, count(*) AS n_rows, count(DISTINCT (run, step)) AS n_steps,
               count(DISTINCT run) AS n_runs
        FROM {tmp} WHERE NOT consensus
        """).iloc[0]
    finally:
        lake.sql(f"DROP TABLE IF EXISTS {tmp}")
    n_groups, n_rows = int(left["n_groups"]), int(left["n_rows"])
    frame.attrs["no_consensus_groups"], frame.attrs["no_consensus_rows"] = n_groups, n_rows
    frame.attrs["note"] = None
    frame.attrs["compared"] = None  # rows held by 2+ ranks: counted when nothing differs (one rank: nothing to compare)
    if frame.empty and not n_groups:
        frame.attrs["compared"] = int(lake.sql(f"""
        SELECT count(*) AS n FROM (SELECT {part} FROM lake WHERE {where} AND {stat} IS NOT NULL
                                   GROUP BY {part} HAVING count(*) > 1)""").iloc[0]["n"])
    if n_groups:
        what = "parameter gradients" if kind == "parameters_grad" else "rows"
        frame.attrs["note"] = (
            f"{n_groups} {what} ({n_rows} rank rows, {int(left['n_steps'])} step(s) of {int(left['n_runs'])} run(s)) "
            f"have no majority of ranks agreeing, so no rank is blamed: "
            + ("parameters_grad records are each rank's local gradient, recorded before the data-parallel "
               "all-reduce averages it (as the real msprobe records them), so ranks differ by design; "
               if kind == "parameters_grad" else "")
            + ("returned with consensus=False" if no_consensus else "left out (no_consensus=True / "
               "--no-consensus lists them)"))
    return frame


# -- trend -------------------------------------------------------------------------------------------------

#: records one trend draws at most (a glob matching more is refused: narrow it)
TREND_MAX_RECORDS = 12


def _main_arg(args: Any) -> Optional[str]:
    """The argument a trend shows by default: the record's main output (``output.0``), else a
    parameter gradient's weight, else its first argument in document order."""
    names = [path for path in args["arg_path"].tolist() if isinstance(path, str)]
    if not names:
        return None
    for want in ("output.0", "output"):
        if want in names:
            return want
    weights = [path for path in names if path.split(".")[0] == "weight"]
    return weights[0] if weights else names[0]


def trend(lake: Any, record: str, *, stat: str = NORM.column, arg: Optional[str] = None, run: Any = None,
          rank: Any = None, plot: Optional[str] = None) -> Any:
    """``stat`` of one record's argument over steps: a DataFrame (run, rank, rank_dir, step,
    record, arg_path, value) sorted by run, rank, record, step. ``record``: a name or a glob
    (``Module.layers.*.linear1.Linear.parameters_grad``): each matched record keeps its own rows
    and its own line (a glob matching more than :data:`TREND_MAX_RECORDS` records is refused);
    ``arg``: the argument (``output.0``, ``weight``...; default: the record's main output,
    ``output.0``, else a gradient's ``weight``, else its first argument). ``plot``: a PNG path:
    one line per run and record (the mean over ranks) with the band between the ranks' min and
    max, integer steps, NaN and Inf values drawn as markers at the plot's edge; needs
    matplotlib. The frame's ``attrs`` hold ``arg``, ``records`` (the matched names), ``plot``
    (the file) and ``plot_note`` (why there is none).

    Example: ``lake.trend("Module.head.Linear.parameters_grad", arg="weight.0", plot="norm.png")``
    (``msprobe lake trend ./lake "Module.head.Linear.parameters_grad" --arg weight.0 --plot norm.png``)."""
    if stat not in STATS:
        raise ConfigError(f"stat={stat!r}: one of {', '.join(STATS)}")
    where = "TRUE" + _record_where(record) + _among("run", run) + _among("rank", rank)
    if arg is None:
        args = lake.sql(f"SELECT arg_path, min({_IO_ORDER}) AS o, min(seq) AS s FROM lake WHERE {where} "
                        f"GROUP BY arg_path ORDER BY o, arg_path")
        if args.empty:
            raise ConfigError(f"trend: no record {record!r} in the lake" + (f" (run {run})" if run else ""))
        arg = _main_arg(args)
    query = f"""
    SELECT run, rank, rank_dir, step, record, arg_path, {stat} AS value
    FROM lake WHERE {where} AND arg_path = {_literal(arg)}
    ORDER BY run, rank NULLS FIRST, rank_dir, record, step NULLS FIRST
    """
    frame = lake.sql(query)
    if frame.empty:
        have = lake.sql(f"SELECT DISTINCT arg_path FROM lake WHERE {where} ORDER BY 1")["arg_path"].tolist()
        if not have:
            raise ConfigError(f"trend: no record {record!r} in the lake" + (f" (run {run})" if run else ""))
        raise ConfigError(f"trend: record {record!r} has no argument {arg!r}; its arguments: {', '.join(have)}")
    records = sorted(frame["record"].unique().tolist())
    if len(records) > TREND_MAX_RECORDS:
        raise ConfigError(f"trend: {record!r} matches {len(records)} records ({', '.join(records[:3])}, ...); "
                          f"at most {TREND_MAX_RECORDS} are drawn, one line each: narrow the glob")
    frame.attrs["arg"] = arg
    frame.attrs["stat"] = stat
    frame.attrs["records"] = records
    frame.attrs["plot"] = None
    frame.attrs["plot_note"] = None
    if plot:
        try:
            frame.attrs["plot"] = _plot(frame, plot, record, arg, stat)
        except MissingDependencyError as exc:
            frame.attrs["plot_note"] = str(exc)
    return frame


def _plot(frame: Any, path: str, record: str, arg: Optional[str], stat: str) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise MissingDependencyError("the trend plot needs matplotlib: pip install matplotlib "
                                     "(the values are in the returned table)") from None
    import numpy as np

    fig, axes = plt.subplots(figsize=(9, 4))
    many = frame["record"].nunique() > 1
    vals = [value for value in frame["value"].tolist()
            if value is not None and isinstance(value, float) and math.isfinite(value)]
    top = max(vals) if vals else 1.0
    bottom = min(vals) if vals else 0.0
    bad_x: dict = {"NaN": [], "+Inf": [], "-Inf": []}
    bad_y: dict = {"NaN": [], "+Inf": [], "-Inf": []}
    for (run, rec), group in frame.groupby(["run", "record"], sort=True):
        series = group["value"].astype(float)
        for label, sel in (("NaN", series.isna()), ("+Inf", series == np.inf), ("-Inf", series == -np.inf)):
            steps = group.loc[sel, "step"].tolist()
            bad_x[label] += steps
            bad_y[label] += [bottom if label == "-Inf" else top] * len(steps)
        fin = group[np.isfinite(series)]
        by_step, steps_of = fin.groupby("step")["value"], sorted(group["step"].dropna().unique())
        mean = by_step.mean().reindex(steps_of)
        x_steps = mean.index.tolist()
        n_ranks = group["rank_dir"].nunique()
        label = f"{run} {rec}" if many else f"{run}"
        axes.plot(x_steps, mean.tolist(), marker="o", lw=1.2,
                label=label + (f" (mean over {n_ranks} ranks)" if n_ranks > 1 else ""))
        if n_ranks > 1:
            axes.fill_between(x_steps, by_step.min().reindex(steps_of).tolist(),
                              by_step.max().reindex(steps_of).tolist(), alpha=0.2)
    for label, marker, color in (("NaN", "X", "red"), ("+Inf", "^", "purple"), ("-Inf", "v", "purple")):
        if bad_x[label]:
            axes.scatter(bad_x[label], bad_y[label], marker=marker, s=80, color=color, zorder=5, label=label)
    pos = [value for value in vals if value > 0]
    if pos and len(pos) == len(vals) and max(pos) / min(pos) > 1e3:
        axes.set_yscale("log")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("step")
    axes.set_ylabel(stat)
    axes.set_title(f"{record} {arg}", fontsize=9)
    axes.legend(fontsize=7)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
