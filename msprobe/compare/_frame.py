"""compare's frame (step 2 of :mod:`msprobe.compare._columnar`): the rows of one block as
columns over the plan's leaf columns (:class:`Frame`): each side's values, texts and masks per
row, the per-record maxima and minima, the statistics' CSV columns and the plot's series."""
from __future__ import annotations

import operator
from itertools import repeat
from typing import Any, Optional

from msprobe.compare._floattext import FloatCells, _inf_or_nan, _texts
from msprobe.compare._plan import Leaves, Plan
from msprobe.format.stats import MAX, MIN, STAT_KEYS

__all__ = ["Frame"]

_NA = "N/A"
#: the statistics of a leaf, as the dump names them
_STATISTICS = STAT_KEYS


def _objects(count: int, fill: Any = _NA) -> Any:
    """An object array of ``count`` times ``fill`` (np.full is 5x slower for objects)."""
    import numpy as np

    return np.array([fill] * count, dtype=object)


def _differs_within_tolerance(a: Any, b: Any) -> bool:
    """Two scalar values that differ beyond the format's tolerance (floats), or at all (others)."""
    from msprobe.format.stats import stats_equal

    if isinstance(a, float) and isinstance(b, float):
        return not stats_equal(a, b)
    return bool(a != b)


class Frame:
    """The index columns of one block's rows and what the kernels and the rules read of them."""

    def __init__(self, plan: Plan) -> None:
        import numpy as np

        self.plan = plan
        self.across_frameworks = False  # a MindSpore target against a PyTorch bench (-am/-cm/-lm)
        self.scalar_tolerance = False  # float arguments equal within the format's tolerance (merged layouts)
        self.row_count = count = len(plan.row_target)
        self.target_index = np.array(plan.row_target, dtype=np.int64)
        self.bench_index = np.array(plan.row_bench, dtype=np.int64)
        self.groups = np.array(plan.row_group, dtype=np.int64)
        self.group_count = len(plan.group_ignore)
        self.has_target, self.has_bench = self.target_index >= 0, self.bench_index >= 0
        self.matched = self.has_target & self.has_bench
        self.matched_rows = np.flatnonzero(self.matched)
        self.name = np.array(plan.row_name, dtype=object)
        self.output_rows = np.fromiter(map(operator.contains, plan.row_name, repeat(".output.")), bool, count)
        self.group_ignore = np.array(plan.group_ignore, dtype=np.int8)
        row_ignore = self.group_ignore[self.groups] if count else np.zeros(0, dtype=np.int8)
        self.judged = (row_ignore == 0) | ((row_ignore == 1) & self.output_rows)
        self.fully_judged = row_ignore == 0  # the rows of the rules that skip input-ignored records
        self.norm = np.full(count, np.nan)  # NormRelativeErr as a fraction, NaN where None or unmatched
        self.norm_none = np.ones(count, dtype=bool)
        self.norm_cell = np.full(count, np.nan)  # what the rules read of the NormRelativeErr cell
        self.norm_percent = np.zeros(count)
        self.cosine_number = np.full(count, np.nan)
        self.ratio_number = np.full(count, np.nan)
        self._first_output: Any = None
        self._texts: dict = {}  # (side, kind) -> text(side, kind)
        self._index_lists: dict = {}  # side -> its leaf index per row, as a list

    def leaves(self, side: str) -> Leaves:
        return self.plan.target if side == "target" else self.plan.bench

    def _index(self, side: str) -> Any:
        return self.target_index if side == "target" else self.bench_index

    def column(self, side: str, values: list, fill: Any = _NA) -> Any:
        """A side's leaf column over the rows (``fill`` where the side has no leaf)."""
        import numpy as np

        return np.array(values + [fill], dtype=object)[self._index(side)]

    def mask(self, side: str, values: Any) -> Any:
        """A side's boolean leaf column over the rows (False where the side has no leaf)."""
        import numpy as np

        return np.append(np.asarray(values, dtype=bool), False)[self._index(side)]

    def column_list(self, side: str, values: list, fill: Any = _NA) -> list:
        """:meth:`column` as a list (what the CSV writer takes), gathered without an object array."""
        index = self._index_lists.get(side)
        if index is None:
            index = self._index_lists[side] = self._index(side).tolist()
        return list(map((values + [fill]).__getitem__, index))

    def text(self, side: str, kind: str) -> Any:
        """A side's dtype / shape / requires_grad / md5 column over the rows (``N/A`` where none),
        built once per block (the rules and the writer read it; nobody writes into it)."""
        got = self._texts.get((side, kind))
        if got is None:
            got = self._texts[(side, kind)] = self.column(side, getattr(self.leaves(side), kind))
        return got

    def nonfinite_max_min(self, side: str) -> Any:
        leaves = self.leaves(side)
        max_bad = _inf_or_nan(leaves.statistics[MAX.key], leaves.numbers(MAX.key))
        return self.mask(side, max_bad | _inf_or_nan(leaves.statistics[MIN.key], leaves.numbers(MIN.key)))

    def scalar_differs(self) -> Any:
        """Matched rows of scalar arguments (``<class ...>`` dtypes, shape ``[]``) whose values differ."""
        import numpy as np

        out = np.zeros(self.row_count, dtype=bool)
        rows = self.matched_rows
        rows = rows[self.text("target", "shape")[rows] == "[]"]  # a scalar's shape; most rows are tensors
        if len(rows):
            target_max = self.plan.target.statistics[MAX.key]
            bench_max = self.plan.bench.statistics[MAX.key]
            differs = _differs_within_tolerance if self.scalar_tolerance else operator.ne
            out[rows] = [("class" in target_dtype and "class" in bench_dtype and shape == "[]"
                          and differs(target_max[target], bench_max[bench]))
                         for target_dtype, bench_dtype, shape, target, bench in
                         zip(self.text("target", "dtype")[rows].tolist(), self.text("bench", "dtype")[rows].tolist(),
                             self.text("target", "shape")[rows].tolist(), self.target_index[rows].tolist(),
                             self.bench_index[rows].tolist())]
        return out

    def bench_name_has(self, *parts: str) -> Any:
        import numpy as np

        out = np.zeros(self.row_count, dtype=bool)
        names = self.plan.row_bench_name
        try:  # the names in one text: a part (without its separator) in none of them found by one search
            joined: Optional[str] = "\x00".join(names)
        except TypeError:  # a name that is no str
            joined = None
        for part in parts:
            if joined is not None and "\x00" not in part and part not in joined:
                continue
            out |= np.fromiter(map(operator.contains, names, repeat(part)), bool, self.row_count)
        return out

    def group_max(self, rows: Any, values: Any) -> Any:
        """Per record, the largest of ``values`` over ``rows`` (0 where none; NaN takes no part)."""
        import numpy as np

        out = np.zeros(self.group_count)
        counted = rows & ~np.isnan(values)
        np.maximum.at(out, self.groups[counted], values[counted])
        return out

    def group_min(self, rows: Any, values: Any) -> Any:
        """Per record, the smallest of ``values`` over ``rows``, at most 1 (1 where none; NaN takes no part)."""
        import numpy as np

        out = np.ones(self.group_count)
        counted = rows & ~np.isnan(values)
        np.minimum.at(out, self.groups[counted], values[counted])
        return out

    def first_output(self) -> Any:
        """Per record, the index of its first output row (-1 where none)."""
        import numpy as np

        if self._first_output is None:
            first = np.full(self.group_count, -1, dtype=np.int64)
            rows = np.flatnonzero(self.output_rows)
            distinct, position = np.unique(self.groups[rows], return_index=True)
            first[distinct] = rows[position]
            self._first_output = first
        return self._first_output

    def statistic_columns(self, lazy: bool = False) -> list:
        """The 8 statistics columns as the CSV prints them (target's four, then bench's); ``lazy``:
        as :class:`FloatCells` (the float values gathered over the rows, the other cells as text)."""
        if not lazy:
            return [self.column_list(side, _texts(self.leaves(side).statistics[name], self.leaves(side).numbers(name)))
                    for side in ("target", "bench") for name in _STATISTICS]
        return [self._float_cells(side, name) for side in ("target", "bench") for name in _STATISTICS]

    def _float_cells(self, side: str, name: str) -> FloatCells:
        """One statistic's column over the rows as :class:`FloatCells`: a float leaf value as repr
        prints it, any other (int, str, None, bool) as str() does, ``N/A`` where the side has no leaf."""
        import numpy as np

        values = self.leaves(side).statistics[name]
        numbers = self.leaves(side).numbers(name)
        index = self._index(side)
        has = index >= 0
        at = np.where(has, index, 0)
        if len(values):
            gathered, is_float = numbers[0][at], has & numbers[1][at]
        else:
            gathered, is_float = np.zeros(self.row_count), np.zeros(self.row_count, dtype=bool)
        overrides: list = [None] * self.row_count
        for row, leaf in zip(np.flatnonzero(~is_float).tolist(), index[~is_float].tolist()):
            overrides[row] = _NA if leaf < 0 else str(values[leaf])
        return FloatCells(gathered, "", overrides)

    def series(self) -> Any:
        """The NormRelativeErr per row for the plot: on matched rows whose target leaf is a tensor."""
        series = _objects(self.row_count, None)
        rows = self.matched_rows[self.mask("target", self.plan.target.tensor)[self.matched_rows]]
        if len(rows):
            series[rows] = [None if none else value
                            for value, none in zip(self.norm[rows].tolist(), self.norm_none[rows].tolist())]
        return series
