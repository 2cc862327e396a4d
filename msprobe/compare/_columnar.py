"""The compare engine: one rank pair's rows, summary and CSV, built a column at a time.

This module drives the blocks (steps 3 to 5); its four jobs below live in their own modules:
the plan in :mod:`msprobe.compare._plan`, the frame in :mod:`msprobe.compare._frame`, the metric
kernels in :mod:`msprobe.compare._kernels`, the cells as numbers and as float text in
:mod:`msprobe.compare._floattext`.

1. **Plan** (:func:`plan_rows`, one Python pass over the record pairs): every target leaf and
   every bench leaf it meets becomes an entry of flat leaf columns (:class:`Leaves`: names, dtype,
   shape, requires_grad, the four statistics as dumped, md5, data_name), and each output row is a
   pair of indices into them (``-1``: the other side has no leaf). Bench leaves are flattened
   once per bench record.
2. **Metrics** (over the block's :class:`~msprobe.compare._frame.Frame`, one kernel per mode, numpy over all matched rows at once): statistics' four diffs
   and relative errors (:func:`msprobe.compare._rows.diff_cells`' IEEE operations in the same
   order, so the printed ``repr`` of each value is the same; the few rows whose values are not
   numbers take the scalar function); md5's CRC-32 columns; tensor mode's six metrics
   (:func:`msprobe.compare._rows.tensor_metrics` of the two loaded tensors of each matched row)
   as one more column, beside the statistics.
3. **Verdict**: 26.2.0's rules, one table evaluated over the columns
   (:func:`msprobe.compare._verdict.judge`).
4. **NaN/Inf and marks**: only the leaves whose statistics are not finite go through
   :class:`msprobe.format.nonfinite.NonFiniteTracker`, replayed with the tracker state the
   row-by-row order would have given it.
5. **Write** (:mod:`msprobe.compare._write`): column by column, then joined in rows.

The rows go block by block (:data:`BLOCK_RECORDS` records): each block's columns are built,
written and folded into the pair's :class:`~msprobe.compare._summary.PairSummary` before the
next. ``tests/compare/row_oracle.py`` builds the same rows one at a time (the reference this
engine is held to, byte for byte, by ``tests/compare/test_compare_columnar.py``).
"""
from __future__ import annotations

import operator
from typing import Any, Optional

from msprobe.compare._floattext import FloatCells
from msprobe.compare._frame import Frame, _objects
from msprobe.compare._kernels import KERNELS, METRIC_COUNT
from msprobe.compare._origin import ORIGIN_THRESHOLD
from msprobe.compare._plan import _COMM, PairContext, Plan, bench_counterpart, load_side, plan_rows
from msprobe.compare._plot import TOP_N, PlotMarks
from msprobe.compare._quiet import departing_records
from msprobe.compare._rows import COLUMNS
from msprobe.compare._summary import NonFiniteFirsts, PairSummary, comes_before
from msprobe.compare._verdict import judge, roundoff_rows
from msprobe.compare._write import write_columns
from msprobe.format.comm import buffer_args, is_buffer_leaf
from msprobe.format.settled import settled_positions

__all__ = ["columnar_pair", "PairContext", "bench_counterpart", "load_side", "BLOCK_RECORDS", "METRIC_COUNT"]

_NA = "N/A"
#: records per block: a block's columns are built, written and dropped before the next one's
#: (bounds the memory of a 100,000-record pair)
BLOCK_RECORDS = 2000


# ---------------------------------------------------------------- 3-5. verdict, summary, write

def _counts(results: list) -> dict:
    """Rows per Result, keyed in the order the results first occur (a Counter keeps that order)."""
    from collections import Counter

    return dict(Counter(results))


def _marks(frame: Frame, results: Any) -> PlotMarks:
    """A block's plot marks: every error/warning row and the TOP_N worst rows by NormRelativeErr
    (only those go through PlotMarks.see: the others would not change it)."""
    import numpy as np

    marks = PlotMarks()
    flagged = np.flatnonzero((results == "error") | (results == "warning"))
    is_float = frame.matched & ~frame.norm_none
    with np.errstate(invalid="ignore"):
        candidates = np.flatnonzero(is_float & (frame.norm > 0) & (frame.norm < np.inf))
    if len(candidates) > TOP_N:
        candidates = np.sort(candidates[np.lexsort((-candidates, frame.norm[candidates]))[-TOP_N:]])
    for row in sorted(set(flagged.tolist()).union(candidates.tolist())):  # np.union1d imports numpy.ma
        marks.see(row, results[row], frame.name[row], float(frame.norm[row]) if is_float[row] else None)
    return marks


def _first_divergence(frame: Frame, results: Any, messages: Any, metric_columns: list, mode: str,
                      threshold: Optional[float], side: tuple = ({}, -1)) -> Optional[dict]:
    """The block's first matched target row whose Result is not pass, leaving out the rows that only
    the 10x rule flags at float round-off (:func:`msprobe.compare._verdict.roundoff_rows`); or
    the first whose NormRelativeErr exceeds ``threshold``."""
    import numpy as np

    plan = frame.plan
    in_target = (np.array([index is not None for index in plan.group_index], dtype=bool)[frame.groups]
                 if frame.row_count else frame.matched)
    candidates = frame.matched & in_target
    is_float = frame.matched & ~frame.norm_none
    if threshold is None:
        candidates &= (results != "pass") & ~roundoff_rows(frame, messages)
    else:
        with np.errstate(invalid="ignore"):
            candidates &= is_float & (frame.norm > threshold)
    hits = np.flatnonzero(candidates)
    row = _first_data_row(frame, hits, *side)
    if row is None:
        return None
    group = int(frame.groups[row])
    norm = float(frame.norm[row]) if is_float[row] else None
    names = COLUMNS[mode][8:8 + METRIC_COUNT[mode]]
    return {"record": plan.group_name[group], "row": frame.name[row], "record_index": plan.group_index[group],
            "row_index": row, "result": results[row], "err_message": messages[row],
            "norm_relative_err": norm if norm is not None and norm == norm else None,
            "metrics": dict(zip(names, [column[row] for column in metric_columns[:METRIC_COUNT[mode]]]))}


def _rank(source: Any) -> int:
    rank = getattr(source, "rank", None)
    return rank if isinstance(rank, int) else -1


def _first_data_row(frame: Frame, hits: Any, data: dict, rank: int) -> Optional[int]:
    """The first of the rows ``hits`` that is not a communication call's receive buffer (its
    content before the call is no data, never a divergence)."""
    plan = frame.plan
    for row in hits.tolist():
        record = plan.group_name[int(frame.groups[row])]
        if record.startswith(_COMM):
            suffix = frame.name[row][len(record) + 1:]
            if is_buffer_leaf(suffix, buffer_args(record, data.get(record), rank)):
                continue
        return int(row)
    return None


def _replay(firsts: NonFiniteFirsts, plan: Plan, key: str, state: dict, side: tuple = ({}, None)) -> Optional[dict]:
    """Feed the non-finite leaves to a side's NaN/Inf tracker with the state the row-by-row order
    gives it (``record()`` of the record last started before each; ``state[key]``: the epoch
    last replayed, carried across blocks); the first entry it reports. A communication call's
    receive buffers are left out (``side``: the side's records and rank): their content before
    the call is whatever the memory held, no data."""
    leaves = plan.target if key == "target" else plan.bench
    first = None
    epoch = state.get(key)
    data, rank = side
    for leaf_index, io, suffix, record, row, record_index, event_epoch, epoch_name in plan.seen(key, leaves.nonfinite()):
        if record.startswith(_COMM) and is_buffer_leaf(suffix, buffer_args(record, data.get(record), rank)):
            continue
        if event_epoch != epoch:
            epoch = event_epoch
            if epoch_name is not None:
                firsts.tracker.record(epoch_name)
        seen = firsts.see(io, suffix, leaves.side(leaf_index), record, row, record_index)
        if seen is not None and comes_before(seen, first):
            first = seen
    state[key] = epoch
    return first


def _requires_grad_consistent(frame: Frame) -> Any:
    import numpy as np

    cells = _objects(frame.row_count)
    rows = frame.matched_rows
    if len(rows):
        target = frame.text("target", "requires_grad")[rows].tolist()
        bench = frame.text("bench", "requires_grad")[rows].tolist()
        equal = np.fromiter(map(operator.eq, target, bench), dtype=bool, count=len(rows))
        cells[rows] = np.array(["False", "True"], dtype=object)[equal.view(np.int8)]
    return cells


def _block(context: PairContext, plan: Plan, path: str, keep: Optional[list], state: dict,
           firsts: tuple) -> PairSummary:
    """Build, write (and keep, for the xlsx) one block's rows; their summary."""
    mode = context.mode
    plan.target.finish(mode)
    plan.bench.finish(mode)
    frame = Frame(plan)
    frame.across_frameworks = context.across_frameworks
    # a merged parallel layout's float arguments come of sums in the layout's order: equal within the
    # format's tolerance (spec/FORMAT.md 26.5), not bit for bit
    frame.scalar_tolerance = any(getattr(source, "report", None) is not None
                                 for source in (context.target_source, context.bench_source))
    metric_columns = KERNELS[mode](frame, context)
    trailing = [metric_columns.pop()[1]] if metric_columns and isinstance(metric_columns[-1], tuple) else []
    results, messages = judge(frame, mode)
    if context.departing is not None:  # for find_origin: the records where a leaf may depart
        eligible = mode != "md5" and not context.mapping and not context.across_frameworks \
            and not frame.scalar_tolerance
        got = departing_records(frame, ORIGIN_THRESHOLD if context.threshold is None else context.threshold) \
            if eligible else None
        context.departing = None if got is None else context.departing | got
    head = [plan.row_name, plan.row_bench_name]
    head += [frame.text(side, kind) for kind in ("dtype", "shape", "requires_grad") for side in ("target", "bench")]
    columns: list = [column if column.__class__ is list or column.__class__ is FloatCells else column.tolist()
                     for column in head + metric_columns + [_requires_grad_consistent(frame), results, messages]]
    columns += [plan.row_stack] + trailing
    if context.stack is False:
        del columns[COLUMNS[mode].index("NPU_Stack_Info")]
    write_columns(path, columns)
    if keep is not None:
        keep.extend(zip(*[column.tolist() if column.__class__ is FloatCells else column for column in columns]))
    result_list = columns[COLUMNS[mode].index("Result")]
    summary = PairSummary(rows=frame.row_count, unmatched_rows=int(frame.row_count - len(frame.matched_rows)),
                          results=_counts(result_list), series=frame.series().tolist(), marks=_marks(frame, results),
                          first_divergence=_first_divergence(frame, results, messages, metric_columns, mode,
                                                             context.threshold,
                                                             (context.target_data, _rank(context.target_source))))
    summary.first_nan_inf_target = _replay(firsts[0], plan, "target", state,
                                           (context.target_data, _rank(context.target_source)))
    summary.first_nan_inf_bench = _replay(firsts[1], plan, "bench", state,
                                          (context.bench_data, _rank(context.bench_source)))
    return summary


def columnar_pair(context: PairContext, path: str, keep_rows: bool = False, *, start: int = 0,
                  stop: Optional[int] = None, with_rest: bool = True) -> tuple:
    """The rows of the record pairs ``start:stop`` of one rank pair (and of the bench-only
    records when ``with_rest``) appended to the CSV ``path``: (their :class:`PairSummary`, the
    rows as lists when ``keep_rows``, for the xlsx). A forked chunk of compare -n runs one range."""
    stop = len(context.pairs) if stop is None else stop
    # the records where a leaf may depart, gathered by the blocks for find_origin over a whole pair (a
    # forked chunk's stay in its process: the caller's context keeps None, the walk looks at every record)
    context.departing = set() if start == 0 and stop == len(context.pairs) else None
    # records whose content postdates their place are taken where it was settled (format.settled)
    firsts = (NonFiniteFirsts(settled_positions([name for name, _ in context.pairs])),
              NonFiniteFirsts(settled_positions([bench or "" for _, bench in context.pairs])))
    state: dict = {"bench_epoch": (-1, None)}
    keep: Optional[list] = [] if keep_rows else None
    total = PairSummary()
    block_start = start
    while True:
        block_stop = min(stop, block_start + BLOCK_RECORDS)
        plan = plan_rows(context, block_start, block_stop, with_rest and block_stop == stop, state)
        total.merge(_block(context, plan, path, keep, state, firsts))
        if block_stop == stop:
            break
        block_start = block_stop
    total.records = stop - start
    total.matched_records = sum(1 for _, bench in context.pairs[start:stop] if bench is not None)
    firsts[0].fill(total, "target")
    firsts[1].fill(total, "bench")
    return total, (keep if keep is not None else [])
