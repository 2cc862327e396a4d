"""The compare engine: one rank pair's rows, summary and CSV, built a column at a time.

1. **Plan** (:func:`plan_rows`, one Python pass over the record pairs): every target leaf and
   every bench leaf it meets becomes an entry of flat leaf columns (:class:`Leaves`: names, dtype,
   shape, requires_grad, the four statistics as dumped, md5, data_name), and each output row is a
   pair of indices into them (``-1``: the other side has no leaf). Bench leaves are flattened
   once per bench record.
2. **Metrics** (one kernel per mode, numpy over all matched rows at once): statistics' four diffs
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

import json
import operator
import re
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Optional

from msprobe.compare._plot import TOP_N, PlotMarks
from msprobe.compare._rows import COLUMNS, crc_text, diff_cells, leaf_side, record_leaves, tensor_metrics
from msprobe.compare._summary import NonFiniteFirsts, PairSummary
from msprobe.compare._verdict import ignore_class, judge
from msprobe.compare._write import write_columns
from msprobe.errors import TensorLoadError
from msprobe.format.comm import COMM_PREFIXES, buffer_args, is_buffer_leaf
from msprobe.format.stats import MAX, MIN, NORM, STAT_KEYS
from msprobe.readers._tensor import load_tensor_file

__all__ = ["columnar_pair", "PairContext", "bench_counterpart", "load_side", "BLOCK_RECORDS", "METRIC_COUNT"]

_NA = "N/A"
#: metric columns per mode (after the 8 head columns)
METRIC_COUNT = {"statistics": 2 * len(STAT_KEYS), "md5": 2, "tensor": 6}
#: records per block: a block's columns are built, written and dropped before the next one's
#: (bounds the memory of a 100,000-record pair)
BLOCK_RECORDS = 2000
#: the statistics of a leaf, as the dump names them
_STATISTICS = STAT_KEYS
#: scalar argument types and the dtype leaf_side shows for them
_SCALAR_TYPES = {kind: f"<class '{kind}'>" for kind in ("int", "float", "bool", "str")}


@dataclass
class PairContext:
    """Everything one rank pair's rows are built from: passed explicitly (and inherited by forked
    chunk processes), never kept at module level, so concurrent compares share nothing.
    ``pairs``: [(target record, matched bench record or None)]; ``rest``: bench-only records."""

    target_data: Any
    bench_data: Any
    pairs: list
    rest: list
    target_source: Any
    bench_source: Any
    mode: str
    stack: bool = True
    mapping: Optional[dict] = None
    threshold: Optional[float] = None
    progress: Any = None
    across_frameworks: bool = False


def load_side(source: Any, side: Any, record: str) -> Any:
    """The tensor of one leaf (:class:`msprobe.compare._rows.Side`) as a numpy array, or None."""
    if side.data_name is None or not side.tensor:
        return None
    try:
        shape = tuple(int(extent) for extent in json.loads(side.shape))
    except (ValueError, TypeError, OverflowError):
        shape = ()
    try:
        return load_tensor_file(source.store, source.tensor_key(side.data_name), record=record, dtype=side.dtype,
                                shape=shape, framework="numpy")
    except TensorLoadError:
        return None


def _mapped(row_name: str, mapping: dict) -> Optional[tuple]:
    """(bench record, leaf suffix) that a data-mapping file names for the target row ``row_name``."""
    to = mapping.get(row_name)
    if to is None:
        return None
    for separator in (".input.", ".output.", ".parameters.", ".kwargs.", ".parameters_grad."):
        at = to.rfind(separator)
        if at > 0:
            if separator == ".parameters_grad.":
                return to[: at + len(".parameters_grad")], to[at + len(".parameters_grad."):]
            return to[:at], to[at + 1:]
    return None


def bench_counterpart(row_name: str, suffix: str, mapping: dict, bench_data: dict, leaves_of: Any,
                      bench_record: Optional[str], left: dict) -> tuple:
    """(bench row name, what ``leaves_of(record)`` holds for its leaf) of the target row ``row_name``
    (leaf ``suffix``), or (None, None): the row a data-mapping file names, else the same leaf of the
    matched bench record ``bench_record``, taken from ``left`` (its leaves not yet paired)."""
    if mapping and row_name in mapping:
        got = _mapped(row_name, mapping)
        if got is not None and got[0] in bench_data and got[1] in leaves_of(got[0]):
            if got[0] == bench_record:
                left.pop(got[1], None)
            return mapping[row_name], leaves_of(got[0])[got[1]]
    elif bench_record is not None and suffix in left:
        return (f"{bench_record}.{suffix}" if suffix else bench_record), left.pop(suffix)
    return None, None


# ---------------------------------------------------------------- 1. the plan

#: what a shape's text may hold when it is a list of integers (orjson's compact text)
_INTEGER_LIST_BYTES = b"0123456789,[]-"


def _integer_lists_text(values: list) -> Optional[list]:
    """``str`` of each of ``values`` when every one is a flat list of integers (``[8, 128]``,
    ``[]``), from one orjson text of them all: ``", "`` between the items as str() writes them;
    None where one is anything else (a nested list, a float, a string...: str() decides)."""
    try:
        import orjson

        text = orjson.dumps(values)
    except (ImportError, TypeError, ValueError):  # orjson.JSONEncodeError is a TypeError
        return None
    if len(text) < 4 or text.translate(None, _INTEGER_LIST_BYTES):
        return None
    inner = text[2:-2].replace(b",", b", ").decode("ascii")  # the first list's "[" to the last one's "]"
    pieces = inner.split("], [")
    if len(pieces) != len(values) or any("[" in piece or "]" in piece for piece in pieces):
        return None  # not exactly one flat list per value
    return ["[" + piece + "]" for piece in pieces]


def _shape_texts(values: list) -> list:
    """``str`` of each shape of a leaf column: the lists of integers through one orjson text
    (:func:`_integer_lists_text`, 3x faster than str() one by one), anything else by str()."""
    if set(map(type, values)) == {list}:
        return _integer_lists_text(values) or list(map(str, values))
    lists = [position for position, value in enumerate(values) if value.__class__ is list]
    texts = _integer_lists_text([values[position] for position in lists]) if lists else None
    if texts is None:
        return list(map(str, values))
    for position, text in zip(lists, texts):
        values[position] = text
    return values if len(lists) == len(values) else list(map(str, values))  # str() of a str is itself


#: requires_grad's text by value (None: no requires_grad, ``N/A``)
_REQUIRES_GRAD_TEXTS = {True: "True", False: "False", None: _NA}
_BOOL_OR_NONE = {bool, type(None)}


def _requires_grad_texts(values: list) -> list:
    """``N/A`` for None, else ``str`` of each requires_grad of a leaf column (bools by lookup)."""
    if set(map(type, values)) <= _BOOL_OR_NONE:  # not 1 or 1.0, which equal True as keys
        return list(map(_REQUIRES_GRAD_TEXTS.__getitem__, values))
    return [_NA if value is None else str(value) for value in values]

#: what :meth:`Leaves.finish` reads of every leaf (then md5 or data_name by mode)
_LEAF_KEYS = ("dtype", "shape", "requires_grad") + _STATISTICS
#: leaves read per chunk by :meth:`Leaves.finish`
_GATHER = 1024


def _gather(chunk: list, keys: tuple, columns: list) -> None:
    """Append each of ``keys`` of the dicts ``chunk`` to its column of ``columns`` (None where a
    dict lacks it): one itemgetter pass when every dict has every key, else a pass per key."""
    try:
        rows = list(map(operator.itemgetter(*keys), chunk))
    except KeyError:
        get = dict.get
        for column, key in zip(columns, keys):
            column.extend(map(get, chunk, repeat(key)))
        return
    for position, column in enumerate(columns):
        column.extend(map(operator.itemgetter(position), rows))


def _view(leaf: Any, mode: str) -> tuple:
    """(what :meth:`Leaves.finish` reads of a leaf that is no tensor entry as :func:`leaf_side`
    shows it, whether it is a tensor after all): a scalar argument without its CRC where unused."""
    kind = leaf.get("type") if leaf.__class__ is dict else None
    if kind in _SCALAR_TYPES:
        value = leaf.get("value")
        return {"dtype": _SCALAR_TYPES[kind], "shape": [], "requires_grad": None, **dict.fromkeys(STAT_KEYS, value),
                "md5": crc_text(value) if mode == "md5" else None, "data_name": None}, False
    side = leaf_side(leaf)
    return {"dtype": side.dtype, "shape": side.shape, "requires_grad": None if side.rg == _NA else side.rg,
            **dict(zip(_STATISTICS, side.stats)), "md5": side.md5, "data_name": side.data_name}, side.tensor


_COMM = tuple(prefix + "." for prefix in COMM_PREFIXES)


class Leaves:
    """Flat columns of the leaves of one side: ``leaf`` is filled by the plan, the columns by
    :meth:`finish` (what :func:`leaf_side` reads, a whole column at a time)."""

    __slots__ = ("dtype", "shape", "requires_grad", "statistics", "md5", "data_name", "tensor", "leaf", "floats")

    def __init__(self) -> None:
        self.leaf: list = []
        self.floats: dict = {}  # statistic name -> its number_columns

    def finish(self, mode: str) -> None:
        keys = _LEAF_KEYS + (("md5",) if mode == "md5" else ()) + (("data_name",) if mode == "tensor" else ())
        columns: list = [[] for _ in keys]
        tensor: list = []
        leaves = self.leaf
        for start in range(0, len(leaves), _GATHER):  # a chunk at a time: its dicts stay in the cache
            chunk = leaves[start:start + _GATHER]
            flags = [leaf.__class__ is dict and "dtype" in leaf and "shape" in leaf for leaf in chunk]
            if not all(flags):
                for position in [position for position, is_tensor in enumerate(flags) if not is_tensor]:
                    chunk[position], flags[position] = _view(chunk[position], mode)
            tensor.extend(flags)
            _gather(chunk, keys, columns)
        self.tensor = tensor
        self.dtype = list(map(str, columns[0]))
        self.shape = _shape_texts(columns[1])
        self.requires_grad = _requires_grad_texts(columns[2])
        self.statistics = dict(zip(_STATISTICS, columns[3:7]))
        self.md5 = ([value if value.__class__ is str else (_NA if value is None else str(value))
                     for value in columns[7]] if mode == "md5" else [])
        self.data_name = ([value if value.__class__ is str and value else "-1"
                           for value in columns[7]] if mode == "tensor" else [])

    def numbers(self, statistic: str) -> tuple:
        """:func:`number_columns` of one statistic, computed once."""
        got = self.floats.get(statistic)
        if got is None:
            got = self.floats[statistic] = number_columns(self.statistics[statistic])
        return got

    def nonfinite(self) -> list:
        """Per leaf, whether one of its statistics is a float NaN/+-inf."""
        if not self.leaf:
            return []
        masks = [_nonfinite_float(self.numbers(name)) for name in _STATISTICS]
        return (masks[0] | masks[1] | masks[2] | masks[3]).tolist()


class Plan:
    """The output rows of some record pairs as index columns, built in one pass over the pairs."""

    def __init__(self) -> None:
        self.target = Leaves()
        self.bench = Leaves()
        self.row_target: list = []        # target leaf index per row, -1 for bench-only rows
        self.row_bench: list = []         # bench leaf index per row, -1 for unmatched target rows
        self.row_name: list = []          # NPU Name
        self.row_bench_name: list = []    # Bench Name
        self.row_stack: list = []         # NPU_Stack_Info
        self.row_group: list = []         # record group (one per judged record) per row
        self.group_ignore: list = []      # per group: its ignore class (0, 1, 2)
        self.group_index: list = []       # per group: target record index or None
        self.group_name: list = []        # per group: the record's name
        self.group_bench: list = []       # per group: its bench record or None
        # NaN/Inf replay: (leaf index, io, suffix, record, row name, record index, tracker epoch, epoch record)
        self.target_seen: list = []
        self.bench_seen: list = []


def _ignore(name: Optional[str]) -> int:
    parts = name.split(".") if name is not None else ()
    return ignore_class(parts[1]) if len(parts) >= 2 else 0


class _Planner:
    """Adds the rows of record pairs to a :class:`Plan` (one per block)."""

    def __init__(self, context: PairContext, plan: Plan) -> None:
        self.context = context
        self.plan = plan
        self.tensor_task = context.mode == "tensor"
        self.cache: dict = {}

    def bench_leaves_of(self, name: str) -> dict:
        got = self.cache.get(name)
        if got is None:
            got = {}
            leaves = self.plan.bench.leaf
            for suffix, leaf, _io in record_leaves(name, self.context.bench_data[name], self.tensor_task):
                if suffix not in got:
                    got[suffix] = len(leaves)
                    leaves.append(leaf)
            self.cache[name] = got
        return got

    def add_row(self, target_index: int, bench_index: int, name: str, bench_name: str, stack: str,
                group: int) -> None:
        plan = self.plan
        plan.row_target.append(target_index)
        plan.row_bench.append(bench_index)
        plan.row_name.append(name)
        plan.row_bench_name.append(bench_name)
        plan.row_stack.append(stack)
        plan.row_group.append(group)

    def add_group(self, ignore: int, record_index: Optional[int], name: str, bench: Optional[str]) -> None:
        plan = self.plan
        plan.group_ignore.append(ignore)
        plan.group_index.append(record_index)
        plan.group_name.append(name)
        plan.group_bench.append(bench)

    def add_pair(self, record_index: int, epoch: int) -> None:
        """The rows of one target record and its matched bench record."""
        context, plan = self.context, self.plan
        name, bench = context.pairs[record_index]
        group = len(plan.group_ignore)
        bench_left = dict(self.bench_leaves_of(bench)) if bench is not None else {}
        frames = context.target_source.frames_of(name) if not name.endswith(("backward", "debug")) else None
        stack = str(frames) if frames else _NA
        ignore_name = None
        target_leaves = plan.target.leaf
        mapping = context.mapping
        target_seen, bench_seen = plan.target_seen.append, plan.bench_seen.append
        row_target, row_bench, row_name_of = plan.row_target.append, plan.row_bench.append, plan.row_name.append
        row_bench_name, row_stack, row_group = plan.row_bench_name.append, plan.row_stack.append, plan.row_group.append
        for suffix, leaf, io in record_leaves(name, context.target_data[name], self.tensor_task):
            target_index = len(target_leaves)
            target_leaves.append(leaf)
            row_name = f"{name}.{suffix}" if suffix else name
            if ignore_name is None and ".output." not in row_name:
                ignore_name = row_name
            target_seen((target_index, io, suffix, name, row_name, record_index, record_index, name))
            if mapping:
                bench_name, bench_index = bench_counterpart(row_name, suffix, mapping, context.bench_data,
                                                            self.bench_leaves_of, bench, bench_left)
            elif bench is not None and suffix in bench_left:  # bench_counterpart without a mapping
                bench_name, bench_index = (f"{bench}.{suffix}" if suffix else bench), bench_left.pop(suffix)
            else:
                bench_name = None
            if bench_name is None:
                bench_name, bench_index = _NA, -1
            else:
                bench_seen((bench_index, io, suffix, bench, bench_name, record_index, epoch, bench))
            row_target(target_index)
            row_bench(bench_index)
            row_name_of(row_name)
            row_bench_name(bench_name)
            row_stack(stack)
            row_group(group)
            stack = _NA
        for suffix, bench_index in bench_left.items():
            ignore_name = _NA if ignore_name is None else ignore_name
            self.add_row(-1, bench_index, _NA, f"{bench}.{suffix}" if suffix else bench, _NA, group)
        self.add_group(_ignore(ignore_name), record_index, name, bench)

    def add_bench_only(self, bench: str, epoch: int) -> None:
        """The rows of a bench record no target record matched."""
        plan = self.plan
        group = len(plan.group_ignore)
        for suffix, leaf, io in record_leaves(bench, self.context.bench_data[bench], self.tensor_task):
            bench_index = len(plan.bench.leaf)
            plan.bench.leaf.append(leaf)
            bench_name = f"{bench}.{suffix}" if suffix else bench
            plan.bench_seen.append((bench_index, io, suffix, bench, bench_name, None, epoch, bench))
            self.add_row(-1, bench_index, _NA, bench_name, _NA, group)
        self.add_group(0, None, bench, bench)


def plan_rows(context: PairContext, start: int, stop: int, with_rest: bool, state: dict) -> Plan:
    """The rows of the record pairs ``start:stop`` (and of the bench-only records when
    ``with_rest``); ``state`` carries the bench tracker's epoch from block to block."""
    plan = Plan()
    planner = _Planner(context, plan)
    progress = context.progress
    epoch, epoch_name = state["bench_epoch"]
    for record_index in range(start, stop):
        if progress is not None and record_index % 1000 == 999:
            progress.update(1000)
        bench = context.pairs[record_index][1]
        if bench is not None:
            epoch, epoch_name = epoch + 1, bench
        planner.add_pair(record_index, epoch)
    for bench in (context.rest if with_rest else ()):
        epoch, epoch_name = epoch + 1, bench
        planner.add_bench_only(bench, epoch)
    if progress is not None and with_rest:
        progress.update(len(context.pairs) % 1000)
    state["bench_epoch"] = (epoch, epoch_name)
    return plan


# ---------------------------------------------------------------- 2. numbers and the frame

#: type codes of :func:`number_columns`: 0 float, 1 int, 3 str, 2 anything else (bool, None...)
_CODES = {float: 0, int: 1, str: 3}


def number_columns(values: list) -> tuple:
    """(float64 array with 0 where a value is not an int/float, mask of float-class values,
    mask of int/float-class values, mask of strings); bools and strings are not numbers here."""
    import numpy as np

    count = len(values)
    if count and set(map(type, values)) == {float}:  # the common column: floats only
        every = np.ones(count, dtype=bool)
        return np.array(values, dtype=np.float64), every, every.copy(), np.zeros(count, dtype=bool)
    codes = np.fromiter(map(_CODES.get, map(type, values), repeat(2)), np.int8, count)
    is_float = codes == 0
    is_number = codes < 2
    is_text = codes == 3
    numbers = values if is_number.all() else [v if code < 2 else 0.0 for v, code in zip(values, codes.tolist())]
    try:
        return np.array(numbers, dtype=np.float64), is_float, is_number, is_text
    except OverflowError:  # an int beyond a float's range: that one is no number here (the scalar diff reads it)
        pass
    out = np.zeros(count, dtype=np.float64)
    for position in np.flatnonzero(is_number).tolist():
        try:
            out[position] = float(values[position])
        except OverflowError:
            is_number[position] = False
    return out, is_float, is_number, is_text


def _nonfinite_float(numbers: tuple) -> Any:
    """Mask of the values that are float NaN/+-inf, from their :func:`number_columns`."""
    import numpy as np

    return numbers[1] & ~np.isfinite(numbers[0])


def _inf_or_nan(values: list, numbers: tuple) -> Any:
    """Float NaN/inf, or the strings ``inf``/``-inf``/``nan`` (any case, spaces around)."""
    import numpy as np

    out = _nonfinite_float(numbers)
    for position in np.flatnonzero(numbers[3]).tolist():
        if values[position].strip().lower() in ("inf", "-inf", "nan"):
            out[position] = True
    return out


def _objects(count: int, fill: Any = _NA) -> Any:
    """An object array of ``count`` times ``fill`` (np.full is 5x slower for objects)."""
    import numpy as np

    return np.array([fill] * count, dtype=object)


class Frame:
    """The index columns of one block's rows and what the kernels and the rules read of them."""

    def __init__(self, plan: Plan) -> None:
        import numpy as np

        self.plan = plan
        self.across_frameworks = False  # a MindSpore target against a PyTorch bench (-am/-cm/-lm)
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
        if len(rows):
            target_max = self.plan.target.statistics[MAX.key]
            bench_max = self.plan.bench.statistics[MAX.key]
            out[rows] = [("class" in target_dtype and "class" in bench_dtype and shape == "[]"
                          and target_max[target] != bench_max[bench])
                         for target_dtype, bench_dtype, shape, target, bench in
                         zip(self.text("target", "dtype")[rows].tolist(), self.text("bench", "dtype")[rows].tolist(),
                             self.text("target", "shape")[rows].tolist(), self.target_index[rows].tolist(),
                             self.bench_index[rows].tolist())]
        return out

    def bench_name_has(self, *parts: str) -> Any:
        import numpy as np

        out = np.zeros(self.row_count, dtype=bool)
        for part in parts:
            out |= np.fromiter(map(operator.contains, self.plan.row_bench_name, repeat(part)), bool, self.row_count)
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

    def statistic_columns(self) -> list:
        """The 8 statistics columns as the CSV prints them (target's four, then bench's)."""
        return [self.column_list(side, _texts(self.leaves(side).statistics[name], self.leaves(side).numbers(name)))
                for side in ("target", "bench") for name in _STATISTICS]

    def series(self) -> Any:
        """The NormRelativeErr per row for the plot: on matched rows whose target leaf is a tensor."""
        series = _objects(self.row_count, None)
        rows = self.matched_rows[self.mask("target", self.plan.target.tensor)[self.matched_rows]]
        if len(rows):
            series[rows] = [None if none else value
                            for value, none in zip(self.norm[rows].tolist(), self.norm_none[rows].tolist())]
        return series


# ---------------------------------------------------------------- the metric kernels

#: orjson's float writer (shortest round-trip digits, as repr) for float64 arrays, or False where
#: it is not installed or does not write :data:`_FLOAT_PROBES` as repr does; None: not looked up yet
_FLOAT_WRITER: Any = None
#: values whose text orjson must give as repr does for its writer to be used
_FLOAT_PROBES = (0.0, -0.0, 1.0, -1.5, 0.1, 1e-4, 0.00012345678901234567, 123456789.0, 1e15, 9999999999999998.0,
                 2.0 ** 53, 3.141592653589793, 1.7976931348623157e15, 5e-3, 1 / 3, 1e16, -2.5e+20, 1.7976931348623157e308,
                 9.99e-06, 1e-07, -1.2345e-10, 5e-324, 2.2250738585072014e-308)
#: a one-digit negative exponent in orjson's text (``1e-7``), which repr writes with two (``1e-07``)
_ONE_DIGIT_EXPONENT = re.compile(r"e-([1-9])(?=[,\]])")


def _float_writer() -> Any:
    global _FLOAT_WRITER
    if _FLOAT_WRITER is None:
        _FLOAT_WRITER = False
        try:
            import numpy as np
            import orjson
        except ImportError:
            return False

        def write(array: Any) -> list:
            text = orjson.dumps(array, option=orjson.OPT_SERIALIZE_NUMPY).decode("ascii")
            if "e-" not in text:
                return text[1:-1].split(",")
            texts = text[1:-1].split(",")
            with np.errstate(invalid="ignore"):
                small = np.flatnonzero(np.abs(array) < 1e-4).tolist()  # NaN is not: orjson writes null
            scientific = 0
            for position in small:  # the one-digit negative exponents, among the values below 1e-4
                cell = texts[position]
                if "e-" in cell:
                    scientific += 1
                    if cell[-2] == "-":
                        texts[position] = cell[:-1] + "0" + cell[-1]
            if scientific != text.count("e-"):  # a negative exponent elsewhere: the pattern decides
                return _ONE_DIGIT_EXPONENT.sub(r"e-0\1", text)[1:-1].split(",")
            return texts

        probes = np.array(_FLOAT_PROBES, dtype=np.float64)
        if write(probes) == list(map(repr, _FLOAT_PROBES)):
            _FLOAT_WRITER = write
    return _FLOAT_WRITER


def _reprs(array: Any) -> list:
    """``repr`` of each value of a float64 array (what str() of the Python float prints) through
    orjson's writer (the same shortest round-trip digits, about 5x faster): repr and orjson lay
    them out alike but for the one-digit negative exponents orjson writes (``1e-7``: put back to
    ``1e-07``) and 1e-5 <= |x| < 1e-4 (positional for orjson, scientific for repr); those and
    NaN/inf (orjson writes null) take repr."""
    import numpy as np

    write = _float_writer()
    if not write or len(array) == 0:
        return list(map(repr, array.tolist()))
    array = np.ascontiguousarray(array, dtype=np.float64)
    magnitude = np.abs(array)
    with np.errstate(invalid="ignore"):
        band = np.flatnonzero((magnitude >= 1e-5) & (magnitude < 1e-4))
    texts = write(array)
    for position in band.tolist():  # orjson's 0.0000ddd as repr's d.ddde-05: the same digits
        cell = texts[position]
        digits = cell[7:] if cell[0] == "-" else cell[6:]
        if cell[6 if cell[0] == "-" else 5] != "0" or not cell.startswith(("0.0000", "-0.0000")) or not digits:
            texts[position] = repr(float(array[position]))
            continue
        texts[position] = (("-" if cell[0] == "-" else "") + digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
                           + "e-05")
    nonfinite = np.flatnonzero(~np.isfinite(array))
    for position, value in zip(nonfinite.tolist(), array[nonfinite].tolist()):
        texts[position] = repr(value)
    return texts


def _percents(array: Any) -> list:
    """``f"{x}%"`` of each value of a float64 array."""
    if len(array) == 0:
        return []
    return ("%\n".join(_reprs(array)) + "%").split("\n")


def _texts(values: list, numbers: tuple) -> list:
    """``str`` of each value of a leaf column (its :func:`number_columns` ``numbers``): the float
    values through :func:`_reprs`, the others (ints, strings, None, bools) one at a time."""
    import numpy as np

    is_float = numbers[1]
    if not len(values) or not is_float.any():
        return list(map(str, values))
    texts = _reprs(numbers[0])
    for position in np.flatnonzero(~is_float).tolist():
        texts[position] = str(values[position])
    return texts


def _diffs(target_values: list, bench_values: list, target_rows: Any, bench_rows: Any, target_numbers: tuple,
           bench_numbers: tuple) -> tuple:
    """([diff strings], [relative error strings], float array of the relative errors with NaN
    where :func:`diff_cells` gives None, mask of None, mask of the ``"<x>%"`` relative errors):
    :func:`diff_cells` of
    ``target_values[target_rows]`` and ``bench_values[bench_rows]``."""
    import numpy as np

    count = len(target_rows)
    target, bench = target_numbers[0][target_rows], bench_numbers[0][bench_rows]
    numeric = target_numbers[2][target_rows] & bench_numbers[2][bench_rows]
    with np.errstate(all="ignore"):
        difference = target - bench
        relative = np.abs(difference) / np.abs(bench)
        percent = relative * 100
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
    is_percent = regular.copy()
    for position in np.flatnonzero(~numeric).tolist():
        text, rel_text, value = diff_cells(target_values[target_rows[position]], bench_values[bench_rows[position]])
        diff_text[position], relative_text[position] = text, rel_text
        is_percent[position] = rel_text.__class__ is str and rel_text.endswith("%")
        if value is None:
            none[position] = True
        else:
            relative_out[position] = value
    return diff_text, relative_text, relative_out, none, is_percent


def _norm_cells(frame: Frame, relative: Any, none: Any, relative_text: Any, is_percent: Any) -> None:
    """The NormRelativeErr of the matched rows on ``frame``: as a fraction, and as the rules read
    its printed cell (``"<x>%"`` as x/100; ``inf``; 0 for what reads as no number)."""
    import numpy as np

    rows = frame.matched_rows
    frame.norm[rows] = relative
    frame.norm_none[rows] = none
    with np.errstate(all="ignore"):
        back = (relative * 100) / 100  # float("<rel*100>") / 100, as the rules read the printed cell
    is_inf = relative_text == "inf"
    frame.norm_cell[rows] = np.where(is_percent, back, np.nan)
    frame.norm_percent[rows] = np.where(is_percent, back, np.where(is_inf, np.inf,
                                                                   np.where(relative_text == "nan", np.nan, 0.0)))


def _statistic_diffs(frame: Frame, statistic: str) -> tuple:
    target, bench = frame.plan.target, frame.plan.bench
    rows = frame.matched_rows
    return _diffs(target.statistics[statistic], bench.statistics[statistic], frame.target_index[rows],
                  frame.bench_index[rows], target.numbers(statistic), bench.numbers(statistic))


def statistics_kernel(frame: Frame, context: PairContext) -> list:
    """Statistics mode: the 4 diffs, then the 4 relative errors, then the 8 statistics."""
    every_row = len(frame.matched_rows) == frame.row_count  # the diffs are the columns themselves
    count = len(_STATISTICS)
    metrics: list = [None] * (2 * count) if every_row else [_objects(frame.row_count) for _ in range(2 * count)]
    for position, statistic in enumerate(_STATISTICS):
        diff_text, relative_text, relative, none, is_percent = _statistic_diffs(frame, statistic)
        if every_row:
            metrics[position], metrics[count + position] = diff_text, relative_text
        else:
            metrics[position][frame.matched_rows] = diff_text
            metrics[count + position][frame.matched_rows] = relative_text
        if statistic == NORM.key:
            _norm_cells(frame, relative, none, relative_text, is_percent)
    return metrics + frame.statistic_columns()


def md5_kernel(frame: Frame, context: PairContext) -> list:
    """md5 mode: NPU MD5 and BENCH MD5."""
    return [frame.text("target", "md5"), frame.text("bench", "md5")]


def _cell_number(value: Any) -> float:
    """A tensor metric as the rules read it: the number, NaN for strings and NaN."""
    return value if value.__class__ is float else float("nan")


def tensor_kernel(frame: Frame, context: PairContext) -> list:
    """Tensor mode: the 6 metrics of each matched row's two tensors (loaded one row at a time),
    then the 8 statistics; the NormRelativeErr of the statistics feeds the series and the marks."""
    _, relative_text, relative, none, is_percent = _statistic_diffs(frame, NORM.key)
    _norm_cells(frame, relative, none, relative_text, is_percent)
    metrics = [_objects(frame.row_count) for _ in range(6)]
    plan = frame.plan
    for row in frame.matched_rows.tolist():
        group = plan.row_group[row]
        target = leaf_side(plan.target.leaf[plan.row_target[row]])
        bench = leaf_side(plan.bench.leaf[plan.row_bench[row]])
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


# ---------------------------------------------------------------- 3-5. verdict, summary, write

def _counts(results: list) -> dict:
    """Rows per Result, keyed in the order the results first occur."""
    counts: dict = {}
    for result in results:
        counts[result] = counts.get(result, 0) + 1
    return counts


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
    for row in np.union1d(flagged, candidates).tolist():
        marks.see(row, results[row], frame.name[row], float(frame.norm[row]) if is_float[row] else None)
    return marks


def _first_divergence(frame: Frame, results: Any, messages: Any, metric_columns: list, mode: str,
                      threshold: Optional[float], side: tuple = ({}, -1)) -> Optional[dict]:
    """The block's first matched target row whose Result is not pass (or whose NormRelativeErr
    exceeds ``threshold``)."""
    import numpy as np

    plan = frame.plan
    in_target = (np.array([index is not None for index in plan.group_index], dtype=bool)[frame.groups]
                 if frame.row_count else frame.matched)
    candidates = frame.matched & in_target
    is_float = frame.matched & ~frame.norm_none
    if threshold is None:
        candidates &= results != "pass"
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


def _replay(firsts: NonFiniteFirsts, leaves: Leaves, events: list, state: dict, key: str,
            side: tuple = ({}, None)) -> Optional[dict]:
    """Feed the non-finite leaves to a side's NaN/Inf tracker with the state the row-by-row order
    gives it (``record()`` of the record last started before each; ``state[key]``: the epoch
    last replayed, carried across blocks); the first entry it reports. A communication call's
    receive buffers are left out (``side``: the side's records and rank): their content before
    the call is whatever the memory held, no data."""
    flagged = leaves.nonfinite()
    first = None
    epoch = state.get(key)
    data, rank = side
    for leaf_index, io, suffix, record, row, record_index, event_epoch, epoch_name in events:
        if not flagged[leaf_index]:
            continue
        if record.startswith(_COMM) and is_buffer_leaf(suffix, buffer_args(record, data.get(record), rank)):
            continue
        if event_epoch != epoch:
            epoch = event_epoch
            if epoch_name is not None:
                firsts.tracker.record(epoch_name)
        seen = firsts.see(io, suffix, leaf_side(leaves.leaf[leaf_index]), record, row, record_index)
        if first is None and seen is not None:
            first = seen
    state[key] = epoch
    return first


def _requires_grad_consistent(frame: Frame) -> Any:
    cells = _objects(frame.row_count)
    rows = frame.matched_rows
    if len(rows):
        target = frame.text("target", "requires_grad")[rows].tolist()
        bench = frame.text("bench", "requires_grad")[rows].tolist()
        cells[rows] = [str(left == right) for left, right in zip(target, bench)]
    return cells


def _block(context: PairContext, plan: Plan, path: str, keep: Optional[list], state: dict,
           firsts: tuple) -> PairSummary:
    """Build, write (and keep, for the xlsx) one block's rows; their summary."""
    mode = context.mode
    plan.target.finish(mode)
    plan.bench.finish(mode)
    frame = Frame(plan)
    frame.across_frameworks = context.across_frameworks
    metric_columns = KERNELS[mode](frame, context)
    trailing = [metric_columns.pop()[1]] if metric_columns and isinstance(metric_columns[-1], tuple) else []
    results, messages = judge(frame, mode)
    head = [plan.row_name, plan.row_bench_name]
    head += [frame.text(side, kind) for kind in ("dtype", "shape", "requires_grad") for side in ("target", "bench")]
    columns = [column if column.__class__ is list else column.tolist()
               for column in head + metric_columns + [_requires_grad_consistent(frame), results, messages]]
    columns += [plan.row_stack] + trailing
    if context.stack is False:
        del columns[COLUMNS[mode].index("NPU_Stack_Info")]
    write_columns(path, columns)
    if keep is not None:
        keep.extend(zip(*columns))
    result_list = columns[COLUMNS[mode].index("Result")]
    summary = PairSummary(rows=frame.row_count, unmatched_rows=int(frame.row_count - len(frame.matched_rows)),
                          results=_counts(result_list), series=frame.series().tolist(), marks=_marks(frame, results),
                          first_divergence=_first_divergence(frame, results, messages, metric_columns, mode,
                                                             context.threshold,
                                                             (context.target_data, _rank(context.target_source))))
    summary.first_nan_inf_target = _replay(firsts[0], plan.target, plan.target_seen, state, "target",
                                           (context.target_data, _rank(context.target_source)))
    summary.first_nan_inf_bench = _replay(firsts[1], plan.bench, plan.bench_seen, state, "bench",
                                          (context.bench_data, _rank(context.bench_source)))
    return summary


def columnar_pair(context: PairContext, path: str, keep_rows: bool = False, *, start: int = 0,
                  stop: Optional[int] = None, with_rest: bool = True) -> tuple:
    """The rows of the record pairs ``start:stop`` of one rank pair (and of the bench-only
    records when ``with_rest``) appended to the CSV ``path``: (their :class:`PairSummary`, the
    rows as lists when ``keep_rows``, for the xlsx). A forked chunk of compare -n runs one range."""
    stop = len(context.pairs) if stop is None else stop
    firsts = (NonFiniteFirsts(), NonFiniteFirsts())
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
