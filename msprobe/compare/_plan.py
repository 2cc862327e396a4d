"""compare's plan (step 1 of :mod:`msprobe.compare._columnar`): one Python pass over a rank pair's
record pairs makes flat leaf columns of each side (:class:`Leaves`) and the rows as pairs of
indices into them (:class:`Plan`, :func:`plan_rows`); :class:`PairContext` is what a pair's
engine is given, :func:`bench_counterpart` and :func:`load_side` how a row finds its bench
leaf and loads a side's tensor."""
from __future__ import annotations

import json
import operator
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Optional

from msprobe.compare._floattext import _nonfinite_float, number_columns
from msprobe.compare._rows import crc_text, leaf_side, record_leaves
from msprobe.compare._verdict import ignore_class
from msprobe.errors import TensorLoadError
from msprobe.format.comm import COMM_PREFIXES
from msprobe.format.model import TENSOR_TYPES
from msprobe.format.native import leafwalk
from msprobe.format.stats import STAT_KEYS
from msprobe.readers import load_tensor_file

__all__ = ["PairContext", "Leaves", "Plan", "plan_rows", "bench_counterpart", "load_side"]

_NA = "N/A"
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
    #: a superset of the matched records where a leaf may depart (find_origin passes over the others),
    #: gathered block by block by columnar_pair (None: not gathered, or a block could not tell)
    departing: Optional[set] = None
    #: (target, bench), each a :class:`msprobe.compare._indexed.IndexedSide` where that side is read from
    #: its leaf table (statistics and md5 modes, no mapping; the planner walks its stand-ins) or None
    indexed: Optional[tuple] = None


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


def _view_of(mode: str) -> Any:
    """:func:`_view` for ``mode``, as the C ``leaf_fields`` calls it (the leaf alone)."""
    return lambda leaf: _view(leaf, mode)


_COMM = tuple(prefix + "." for prefix in COMM_PREFIXES)


def _leaf_number(leaf: Any) -> int:
    """The number of a leaf of a leaf table: itself (a walked side's) or its stand-in's ``type``."""
    return leaf if leaf.__class__ is int else leaf["type"]


class Leaves:
    """Flat columns of the leaves of one side: ``leaf`` is filled by the plan, the columns by
    :meth:`finish` (what :func:`leaf_side` reads, a whole column at a time)."""

    __slots__ = ("dtype", "shape", "requires_grad", "statistics", "md5", "data_name", "tensor", "leaf", "floats",
                 "source")

    def __init__(self) -> None:
        self.leaf: list = []
        self.floats: dict = {}  # statistic name -> its number_columns
        #: the columns of a leaf table (msprobe.compare._indexed.IndexedSide), where ``leaf`` holds stand-ins
        self.source: Optional[dict] = None

    def side(self, index: int) -> Any:
        """:func:`leaf_side` of leaf ``index`` (from the leaf table's columns where it holds a stand-in)."""
        if self.source is None:
            return leaf_side(self.leaf[index])
        from msprobe.compare._rows import Side

        columns, at = self.source, _leaf_number(self.leaf[index])
        one = getattr(columns, "one", None) or (lambda column, leaf: columns[column][leaf])  # the cell alone
        return Side(columns["dtype"][at], columns["shape"][at], columns["requires_grad"][at],
                    tuple(columns[key][at] for key in _STATISTICS), one("md5", at), one("data_name", at),
                    bool(columns["tensor"][at]), None)

    def _finish_from_source(self, mode: str) -> None:
        """:meth:`finish` from the leaf table's columns, gathered by the stand-ins' leaf numbers."""
        import numpy as np

        columns = self.source
        assert columns is not None
        take = getattr(columns, "take", None)
        if take is not None:  # a scanned document's columns (msprobe.compare._scanned): lists, their numbers
            take(self, mode)
            return
        leaves = self.leaf
        if leaves and leaves[0].__class__ is int:  # a walked side's leaves: their numbers
            at = np.fromiter(leaves, dtype=np.int64, count=len(leaves))
        else:  # stand-ins
            at = np.fromiter(map(operator.itemgetter("type"), leaves), dtype=np.int64, count=len(leaves))
        self.tensor = columns["tensor"][at].tolist()
        self.dtype, self.shape, self.requires_grad = (columns[key][at].tolist()
                                                      for key in ("dtype", "shape", "requires_grad"))
        self.statistics = {key: columns[key][at].tolist() for key in _STATISTICS}
        numbers = columns.get("#numbers")  # (the key of msprobe.compare._indexed.NUMBERS; dict.get reads no column)
        if numbers is not None:  # number_columns' answer, gathered from the table's float64 columns
            for key in _STATISTICS:
                self.floats[key] = tuple(column[at] for column in numbers[key])
        self.md5 = columns["md5"][at].tolist() if mode == "md5" else []
        self.data_name: list = []

    def finish(self, mode: str) -> None:
        if self.source is not None:
            self._finish_from_source(mode)
            return
        walker = leafwalk()
        if walker is not None:
            got = walker.leaf_fields(self.leaf, mode == "md5", mode == "tensor", _SCALAR_TYPES, _STATISTICS,
                                     _view_of(mode))
            self.tensor, self.dtype, self.shape, self.requires_grad = got[:4]
            self.statistics = dict(zip(_STATISTICS, got[4:8]))
            self.md5, self.data_name = got[8], got[9]
            return
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
        self.row_target: Any = []         # target leaf index per row, -1 for bench-only rows (list or int64 array)
        self.row_bench: Any = []          # bench leaf index per row, -1 for unmatched target rows
        self.row_name: list = []          # NPU Name
        self.row_bench_name: list = []    # Bench Name
        self.row_stack: list = []         # NPU_Stack_Info
        self.row_group: Any = []          # record group (one per judged record) per row
        self.group_ignore: list = []      # per group: its ignore class (0, 1, 2)
        self.group_index: list = []       # per group: target record index or None
        self.group_name: list = []        # per group: the record's name
        self.group_bench: list = []       # per group: its bench record or None
        # NaN/Inf replay: (leaf index, io, suffix, record, row name, record index, tracker epoch, epoch record)
        self.target_seen: list = []
        self.bench_seen: list = []
        self.native: Optional[_NativeRows] = None  # the C planner's columns, the events made from them

    def seen(self, side: str, flagged: list) -> list:
        """The NaN/Inf replay's events of ``side`` whose leaf is ``flagged``, in row order."""
        if self.native is not None:
            return self.native.seen(self, side, flagged)
        return [event for event in (self.target_seen if side == "target" else self.bench_seen) if flagged[event[0]]]


class _NativeRows:
    """What the C planner gives beyond the :class:`Plan`'s columns: each row's kind (0 a target
    leaf's, 1 a matched bench record's leaf no target leaf took, 2 a bench-only record's), each
    leaf's io and suffix, and each group's tracker epoch; the replay's events are made from them
    for the flagged leaves only."""

    def __init__(self, row_kind: Any, target_io: list, target_suffix: list, bench_io: list, bench_suffix: list,
                 group_epoch: list) -> None:
        self.row_kind = row_kind
        self.target_io, self.target_suffix = target_io, target_suffix
        self.bench_io, self.bench_suffix = bench_io, bench_suffix
        self.group_epoch = group_epoch
        self.group_dup: bytes = b""  # int64 per group: 1 where its bench record repeats a suffix

    def seen(self, plan: Plan, side: str, flagged: list) -> list:
        import numpy as np

        if not any(flagged):
            return []
        flags = np.append(np.asarray(flagged, dtype=bool), False)
        kind = self.row_kind
        events = []
        if side == "target":
            for row in np.flatnonzero(flags[plan.row_target]).tolist():
                leaf, group = int(plan.row_target[row]), int(plan.row_group[row])
                name, index = plan.group_name[group], plan.group_index[group]
                events.append((leaf, self.target_io[leaf], self.target_suffix[leaf], name, plan.row_name[row], index,
                               index, name))
            return events
        for row in np.flatnonzero(flags[plan.row_bench] & (kind != 1)).tolist():
            leaf, group = int(plan.row_bench[row]), int(plan.row_group[row])
            name = plan.group_bench[group]
            if kind[row] == 0:  # a matched row: the target leaf's io and suffix
                target = int(plan.row_target[row])
                io, suffix = self.target_io[target], self.target_suffix[target]
            else:
                io, suffix = self.bench_io[leaf], self.bench_suffix[leaf]
            events.append((leaf, io, suffix, name, plan.row_bench_name[row], plan.group_index[group],
                           self.group_epoch[group], name))
        return events


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
        stack = _stack_text(context.target_source, name)
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


def _progressed(progress: Any, context: PairContext, start: int, stop: int, with_rest: bool) -> None:
    """The progress bar moved as the row-by-row planner moves it (1,000 records at a time)."""
    if progress is not None:
        done = len(range(start + (-(start + 1)) % 1000, stop, 1000))  # the record indices ending in 999
        if done:
            progress.update(1000 * done)
        if with_rest:
            progress.update(len(context.pairs) % 1000)


def _stack_text(source: Any, name: str, texts: Optional[dict] = None) -> str:
    """The NPU_Stack_Info cell of record ``name``; ``texts``: each frames list's text by its id
    (the records of one call site share one list of stack.json: its text is made once)."""
    frames = source.frames_of(name) if not name.endswith(("backward", "debug")) else None
    if not frames:
        return _NA
    if texts is None:
        return str(frames)
    key = id(frames)  # the lists live in the source's stack document while the plan is made
    text = texts.get(key)
    if text is None:
        text = texts[key] = str(frames)
    return text


def _row_stacks(source: Any, row_count: int, group_first: list, group_name: list) -> list:
    """The NPU_Stack_Info column of a native plan's rows: each group's first row (``group_first``, -1
    where none) its record's :func:`_stack_text`, the other rows N/A. The source's frames index is read
    once where it has one (``frames_index``: a rank directory without a journal's stacks), so no call
    is made per record."""
    row_stack = [_NA] * row_count
    texts: dict = {}
    index_of = getattr(source, "frames_index", None)
    index = index_of() if index_of is not None else None
    if index is None:
        for first, name in zip(group_first, group_name):
            if first >= 0:
                row_stack[first] = _stack_text(source, name, texts)
        return row_stack
    get = index.get
    for first, name in zip(group_first, group_name):
        if first < 0 or name.endswith(("backward", "debug")):
            continue
        frames = get(name)
        if frames:  # the lists live in the source's stack document while the plan is made: one text per list
            key = id(frames)
            text = texts.get(key)
            if text is None:
                text = texts[key] = str(frames)
            row_stack[first] = text
    return row_stack


def _native_plan(context: PairContext, start: int, stop: int, with_rest: bool, state: dict) -> Optional[Plan]:
    """:func:`plan_rows` through the C planner (``msprobe.format._leafwalk.plan_block``): the same
    plan, without a Python step per leaf; None where it is not there, a data-mapping file pairs
    the rows, or the records hold what it does not take."""
    walker = leafwalk()
    indexed = context.indexed or (None, None)
    # an indexed side: its leaves as the table holds them walked (IndexedSide.walked), else its stand-in records
    target_data, bench_data = (data if side is None else getattr(side, "walked", None) or side.stand_ins
                               for side, data in zip(indexed, (context.target_data, context.bench_data)))
    if walker is None or context.mapping or not isinstance(target_data, (dict, tuple)) \
            or not isinstance(bench_data, (dict, tuple)) or not isinstance(context.pairs, list):
        return None
    got = walker.plan_block(target_data, bench_data, context.pairs, start, stop,
                            list(context.rest) if with_rest else None, context.mode == "tensor", TENSOR_TYPES)
    if got is None:
        return None
    import numpy as np

    plan = Plan()
    for leaves, side in zip((plan.target, plan.bench), indexed):
        if side is not None:  # the side's leaves are stand-ins: their columns come from its leaf table
            leaves.source = side.columns
    (plan.target.leaf, target_io, target_suffix, plan.bench.leaf, bench_io, bench_suffix, row_target,
     row_bench, row_group, row_kind, plan.row_name, plan.row_bench_name, plan.group_index,
     plan.group_name, plan.group_bench, group_first, group_dup) = got
    plan.row_target, plan.row_bench, plan.row_group, row_kind = (np.frombuffer(column, dtype=np.int64) for column in
                                                                 (row_target, row_bench, row_group, row_kind))
    _progressed(context.progress, context, start, stop, with_rest)
    epoch, epoch_name = state["bench_epoch"]
    group_epoch = []
    for bench in plan.group_bench:  # a matched or bench-only record starts the bench tracker's next epoch
        if bench is not None:
            epoch, epoch_name = epoch + 1, bench
        group_epoch.append(epoch)
    state["bench_epoch"] = (epoch, epoch_name)
    plan.native = _NativeRows(row_kind, target_io, target_suffix, bench_io, bench_suffix, group_epoch)
    plan.native.group_dup = group_dup
    plan.row_stack = _row_stacks(context.target_source, len(plan.row_name),
                                 np.frombuffer(group_first, dtype=np.int64).tolist(), plan.group_name)
    plan.group_ignore = _group_ignores(plan, row_kind)
    return plan


def _group_ignores(plan: Plan, row_kind: Any) -> list:
    """Each group's ignore class (``_ignore``), from its first target row that is no output."""
    import numpy as np

    ignores = [0] * len(plan.group_name)
    output = np.fromiter(map(operator.contains, plan.row_name, repeat(".output.")), bool, len(plan.row_name))
    rows = np.flatnonzero((row_kind == 0) & ~output)
    of_rows = plan.row_group[rows]
    if len(of_rows) < 2 or bool((of_rows[1:] >= of_rows[:-1]).all()):  # the planner's order: each group's first row
        first = np.flatnonzero(np.concatenate(([True], of_rows[1:] != of_rows[:-1]))) if len(of_rows) else rows
        groups = of_rows[first]
    else:
        groups, first = np.unique(of_rows, return_index=True)
    known: dict = {}
    for group, row in zip(groups.tolist(), rows[first].tolist()):
        name = plan.row_name[row]
        parts = name.split(".", 2)
        api = parts[1] if len(parts) >= 2 else None
        got = known.get(api)
        if got is None:
            got = known[api] = _ignore(name)
        ignores[group] = got
    return ignores


def plan_rows(context: PairContext, start: int, stop: int, with_rest: bool, state: dict) -> Plan:
    """The rows of the record pairs ``start:stop`` (and of the bench-only records when
    ``with_rest``); ``state`` carries the bench tracker's epoch from block to block."""
    native = _native_plan(context, start, stop, with_rest, state)
    if native is not None:
        return native
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
