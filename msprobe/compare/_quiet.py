"""Which records of a block may introduce an error, found over the block's columns at once.

:func:`msprobe.compare._origin.find_origin` walks a rank pair's records one at a time and looks
at every leaf of each (:func:`~msprobe.compare._origin.departure`); over a healthy pair it walks
them all. :func:`departing_records` answers, from the frame the engine built anyway (numpy over
all the block's matched rows), a *superset* of the records where a leaf may depart: every record
left out has none (its statistics within the threshold of the bench's, the same dtype and shape
texts, every target leaf matched, no bench leaf of a repeated suffix), so the walk passes over it
untouched and comes to the same answer. Anything the columns cannot settle (a statistic that is no
number on one side, a leaf that is no tensor) is put in the superset, never guessed.
"""
from __future__ import annotations

from typing import Any, Optional

from msprobe.compare._frame import Frame
from msprobe.format.stats import MAX, MIN, STAT_KEYS, STATISTICS

__all__ = ["departing_records"]


def _flag_differing(bad: Any, rows: Any, target: list, bench: list, target_index: Any, bench_index: Any) -> None:
    """``bad[rows]`` set where the raw values differ (Python's ``==``, as the walk compares them)."""
    for row in rows.tolist():
        if not target[target_index[row]] == bench[bench_index[row]]:
            bad[row] = True


def _tensor_departs(frame: Frame, rows: Any, limit: float) -> Any:
    """Per matched row (both leaves tensors), whether a statistic may depart beyond ``limit``."""
    import numpy as np

    plan = frame.plan
    target_index, bench_index = frame.target_index[rows], frame.bench_index[rows]
    bad = np.zeros(len(rows), dtype=bool)
    scales = []
    for statistic in (MAX, MIN):  # the bench's range: the largest finite |Max| or |Min|
        values, _, numbers, _ = plan.bench.numbers(statistic.key)
        value, ok = values[bench_index], numbers[bench_index]
        with np.errstate(invalid="ignore"):
            scales.append(np.where(ok & np.isfinite(value), np.abs(value), 0.0))
    range_scale = np.maximum(*scales)
    for statistic in STATISTICS:
        t_values, _, t_numbers, _ = plan.target.numbers(statistic.key)
        b_values, _, b_numbers, _ = plan.bench.numbers(statistic.key)
        target, bench = t_values[target_index], b_values[bench_index]
        both = t_numbers[target_index] & b_numbers[bench_index]
        _flag_differing(bad, np.flatnonzero(~both), plan.target.statistics[statistic.key],
                        plan.bench.statistics[statistic.key], target_index, bench_index)
        with np.errstate(all="ignore"):
            finite = np.isfinite(target) & np.isfinite(bench)
            same = (target == bench) | (np.isnan(target) & np.isnan(bench))
            scale = range_scale if statistic.scale == "range" else np.where(np.isfinite(bench), np.abs(bench), 0.0)
            relative = np.where(scale > 0, np.abs(target - bench) / np.where(scale > 0, scale, 1.0), np.inf)
            bad |= both & ~same & (~finite | (relative > limit))
    return bad


def departing_records(frame: Frame, limit: float) -> Optional[set]:
    """The target record indices of the block where a leaf may depart from the bench by more than
    ``limit`` (or by dtype or shape): a superset of find_origin's departing records, in statistics
    and tensor modes without a mapping; None where the block's plan cannot tell (the Python planner's)."""
    import numpy as np

    plan = frame.plan
    native = plan.native
    if native is None:
        return None
    flagged = np.frombuffer(native.group_dup, dtype=np.int64) != 0
    with_bench = np.array([bench is not None for bench in plan.group_bench], dtype=bool)
    unmatched = (native.row_kind == 0) & (frame.bench_index < 0)
    flagged[frame.groups[unmatched & with_bench[frame.groups]]] = True  # a repeated target suffix
    rows = frame.matched_rows
    if len(rows):
        bad = ((frame.text("target", "dtype")[rows] != frame.text("bench", "dtype")[rows])
               | (frame.text("target", "shape")[rows] != frame.text("bench", "shape")[rows]))
        tensors = (np.asarray(plan.target.tensor, dtype=bool)[frame.target_index[rows]]
                   & np.asarray(plan.bench.tensor, dtype=bool)[frame.bench_index[rows]])
        others = np.flatnonzero(~tensors)  # a scalar or other leaf departs at any difference of its value
        _flag_differing(bad, others, plan.target.statistics[STAT_KEYS[0]], plan.bench.statistics[STAT_KEYS[0]],
                        frame.target_index[rows], frame.bench_index[rows])
        at = np.flatnonzero(tensors)
        bad[at] |= _tensor_departs(frame, rows[at], limit)
        flagged[frame.groups[rows[bad]]] = True
    return {plan.group_index[group] for group in np.flatnonzero(flagged).tolist()
            if plan.group_index[group] is not None}
