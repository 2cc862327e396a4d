"""compare's metric kernels (step 2 of :mod:`msprobe.compare._columnar`): one per mode, numpy over
all matched rows of a block at once: the statistics' differences and relative errors, md5's CRC
columns, tensor mode's six metrics of the loaded tensors."""
from __future__ import annotations

import operator
from itertools import repeat
from typing import Any

from msprobe.compare._floattext import FloatCells, _percents, _reprs, lazy_cells
from msprobe.compare._frame import Frame, _objects
from msprobe.compare._plan import PairContext, load_side
from msprobe.compare._rows import diff_cells, leaf_side, tensor_metrics
from msprobe.format.stats import NORM, STAT_KEYS

__all__ = ["KERNELS", "METRIC_COUNT"]

_NA = "N/A"
#: metric columns per mode (after the 8 head columns)
METRIC_COUNT = {"statistics": 2 * len(STAT_KEYS), "md5": 2, "tensor": 6}
#: the statistics of a leaf, as the dump names them
_STATISTICS = STAT_KEYS


def _diffs(target_values: list, bench_values: list, target_rows: Any, bench_rows: Any, target_numbers: tuple,
           bench_numbers: tuple, lazy: bool = False) -> tuple:
    """([diff strings], [relative error strings], float array of the relative errors with NaN
    where :func:`diff_cells` gives None, mask of None, mask of the ``"<x>%"`` relative errors):
    :func:`diff_cells` of
    ``target_values[target_rows]`` and ``bench_values[bench_rows]``. ``lazy``: the two text columns
    as :class:`FloatCells` (the C writer writes their floats) where the extension is there."""
    import numpy as np

    target, bench = target_numbers[0][target_rows], bench_numbers[0][bench_rows]
    numeric = target_numbers[2][target_rows] & bench_numbers[2][bench_rows]
    with np.errstate(all="ignore"):
        difference = target - bench
        relative = np.abs(difference) / np.abs(bench)
        percent = relative * 100
    got = _native_diffs(target, bench, difference, relative, percent, numeric, lazy)
    if got is not None:
        diff_text, relative_text, relative_out, none, is_percent = got
    else:
        diff_text, relative_text, relative_out, none, is_percent = _numpy_diffs(target, bench, difference, relative,
                                                                                percent, numeric)
    for position in np.flatnonzero(~numeric).tolist():
        text, rel_text, value = diff_cells(target_values[target_rows[position]], bench_values[bench_rows[position]])
        diff_text[position], relative_text[position] = text, rel_text
        is_percent[position] = rel_text.__class__ is str and rel_text.endswith("%")
        if value is None:
            none[position] = True
        else:
            relative_out[position] = value
    if lazy and got is not None:
        diff_text, relative_text = FloatCells(difference, "", diff_text), FloatCells(percent, "%", relative_text)
    return diff_text, relative_text, relative_out, none, is_percent


def _native_diffs(target: Any, bench: Any, difference: Any, relative: Any, percent: Any, numeric: Any,
                  lazy: bool = False) -> Any:
    """:func:`_numpy_diffs` in one C pass (``_leafwalk.stat_diffs``; the texts as lists), or None;
    ``lazy``: the printed difference and percent cells None (for :class:`FloatCells`)."""
    import numpy as np

    from msprobe.compare._floattext import _float_writer
    from msprobe.format.native import leafwalk

    walker = leafwalk()
    if walker is None or not _float_writer():
        return None
    import orjson

    arrays = [np.ascontiguousarray(array, dtype=np.float64) for array in (target, bench, difference, relative, percent)]
    texts = (b"[]", b"[]") if lazy else (orjson.dumps(arrays[2], option=orjson.OPT_SERIALIZE_NUMPY),
                                         orjson.dumps(arrays[4], option=orjson.OPT_SERIALIZE_NUMPY))
    got = walker.stat_diffs(*arrays, np.ascontiguousarray(numeric, dtype=bool), *texts, lazy)
    if got is None:
        return None
    diff_text, relative_text, relative_out, none, is_percent = got
    return (diff_text, relative_text, np.frombuffer(relative_out, dtype=np.float64).copy(),
            np.frombuffer(none, dtype=bool).copy(), np.frombuffer(is_percent, dtype=bool).copy())


def _numpy_diffs(target: Any, bench: Any, difference: Any, relative: Any, percent: Any, numeric: Any) -> tuple:
    """The cells of :func:`_diffs` on its numeric rows (the others left for it to fill), in numpy."""
    import numpy as np

    count = len(target)
    diff_text = np.empty(count, dtype=object)
    relative_text = np.empty(count, dtype=object)
    relative_out = np.full(count, np.nan)
    none = np.zeros(count, dtype=bool)
    zero = numeric & ((difference == 0) | (np.isnan(difference) & ((np.isnan(target) & np.isnan(bench))
                                                                   | (target == bench))))
    nan = numeric & np.isnan(difference) & ~zero
    bench_zero = numeric & ~zero & ~nan & (bench == 0)
    bench_inf = numeric & ~zero & ~nan & ~bench_zero & np.isinf(bench)
    regular = numeric & ~zero & ~nan & ~bench_zero & ~bench_inf
    diff_text[zero] = "0"
    relative_text[zero] = "0"
    relative_out[zero] = 0.0
    diff_text[nan] = "nan"
    relative_text[nan] = "nan"
    printed = bench_zero | bench_inf | regular
    diff_text[printed] = _reprs(difference[printed])
    relative_text[bench_zero] = "inf"
    relative_out[bench_zero] = np.inf
    relative_text[bench_inf] = _NA
    none[bench_inf] = True
    relative_text[regular] = _percents(percent[regular])
    relative_out[regular] = relative[regular]
    return diff_text, relative_text, relative_out, none, regular.copy()


def _norm_cells(frame: Frame, relative: Any, none: Any, relative_text: Any, is_percent: Any) -> None:
    """The NormRelativeErr of the matched rows on ``frame``: as a fraction, and as the rules read
    its printed cell (``"<x>%"`` as x/100; ``inf``; 0 for what reads as no number)."""
    import numpy as np

    rows = frame.matched_rows
    frame.norm[rows] = relative
    frame.norm_none[rows] = none
    with np.errstate(all="ignore"):
        back = (relative * 100) / 100  # float("<rel*100>") / 100, as the rules read the printed cell
    if relative_text.__class__ is FloatCells:  # its texts "inf" and "nan" are among its overrides
        relative_text = relative_text.overrides
    count = len(relative_text)
    is_inf, is_nan = (np.zeros(count, dtype=bool) if relative_text.__class__ is list and not relative_text.count(text)
                      else np.fromiter(map(operator.eq, relative_text, repeat(text)), bool, count)
                      for text in ("inf", "nan"))  # (list.count: one C pass where no cell is that text)
    frame.norm_cell[rows] = np.where(is_percent, back, np.nan)
    frame.norm_percent[rows] = np.where(is_percent, back, np.where(is_inf, np.inf, np.where(is_nan, np.nan, 0.0)))


def _statistic_diffs(frame: Frame, statistic: str, lazy: bool = False) -> tuple:
    target, bench = frame.plan.target, frame.plan.bench
    rows = frame.matched_rows
    return _diffs(target.statistics[statistic], bench.statistics[statistic], frame.target_index[rows],
                  frame.bench_index[rows], target.numbers(statistic), bench.numbers(statistic), lazy)


def statistics_kernel(frame: Frame, context: PairContext) -> list:
    """Statistics mode: the 4 diffs, then the 4 relative errors, then the 8 statistics."""
    every_row = len(frame.matched_rows) == frame.row_count  # the diffs are the columns themselves
    lazy = lazy_cells()  # float cells written by the C writer from the values (FloatCells)
    count = len(_STATISTICS)
    metrics: list = [None] * (2 * count) if every_row else [_objects(frame.row_count) for _ in range(2 * count)]
    for position, statistic in enumerate(_STATISTICS):
        diff_text, relative_text, relative, none, is_percent = _statistic_diffs(frame, statistic, lazy and every_row)
        if every_row:
            metrics[position], metrics[count + position] = diff_text, relative_text
        else:
            metrics[position][frame.matched_rows] = diff_text
            metrics[count + position][frame.matched_rows] = relative_text
        if statistic == NORM.key:
            _norm_cells(frame, relative, none, relative_text, is_percent)
    return metrics + frame.statistic_columns(lazy)


def md5_kernel(frame: Frame, context: PairContext) -> list:
    """md5 mode: NPU MD5 and BENCH MD5."""
    return [frame.text("target", "md5"), frame.text("bench", "md5")]


def _cell_number(value: Any) -> float:
    """A tensor metric as the rules read it: the number, NaN for strings and NaN."""
    return value if value.__class__ is float else float("nan")


def tensor_kernel(frame: Frame, context: PairContext) -> list:
    """Tensor mode: the 6 metrics of each matched row's two tensors (loaded one row at a time; N/A
    where a merged side's tensor is not in the other side's order, spec/FORMAT.md 26.8),
    then the 8 statistics; the NormRelativeErr of the statistics feeds the series and the marks."""
    _, relative_text, relative, none, is_percent = _statistic_diffs(frame, NORM.key)
    _norm_cells(frame, relative, none, relative_text, is_percent)
    metrics = [_objects(frame.row_count) for _ in range(6)]
    plan = frame.plan
    unordered = [getattr(getattr(source, "store", None), "is_unordered", None)
                 for source in (context.target_source, context.bench_source)]
    for row in frame.matched_rows.tolist():
        group = plan.row_group[row]
        target = leaf_side(plan.target.leaf[plan.row_target[row]])
        bench = leaf_side(plan.bench.leaf[plan.row_bench[row]])
        if any(test is not None and test(side.data_name) for test, side in zip(unordered, (target, bench))):
            for position in range(6):  # a merged tensor not in the other side's order: no element-wise metric
                metrics[position][row] = _NA
            frame.cosine_number[row] = frame.ratio_number[row] = float("nan")
            continue
        target_array = load_side(context.target_source, target, plan.group_name[group]) if target.tensor else None
        bench_array = load_side(context.bench_source, bench, plan.group_bench[group]) if bench.tensor else None
        values = tensor_metrics(target_array, bench_array)
        for position, value in enumerate(values):
            metrics[position][row] = str(value)
        frame.cosine_number[row] = _cell_number(values[0])
        frame.ratio_number[row] = _cell_number(values[4])
    target_names = frame.column("target", plan.target.data_name, "-1").tolist()
    bench_names = frame.column("bench", plan.bench.data_name, "-1").tolist()
    data_names = [f"['{target}', '{bench}']" for target, bench in zip(target_names, bench_names)]
    return metrics + frame.statistic_columns() + [("Data_name", data_names)]


#: one metric kernel per mode: its metric (and statistics) columns; a ("Data_name", cells) pair
#: goes after NPU_Stack_Info
KERNELS = {"statistics": statistics_kernel, "md5": md5_kernel, "tensor": tensor_kernel}
