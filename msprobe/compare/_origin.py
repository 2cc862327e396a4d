"""Where an error is introduced: the localisation compare and the lake report as the first divergence.

26.2.0's Result column flags a record when its output's error is large *relative to its inputs'*
(rule S7: 10 times), so a fault whose own record passes (a weight 5 % off feeds a linear whose
output is 5 % off: the ratio is 1) is reported downstream, where some op amplifies it. This
module answers the user's question instead: walking one rank pair's records in the target's
execution order, the first record where an error *enters*:

* an **output** departing from the bench beyond the threshold while every input stays within it
  (the record computes something wrong), or
* an **input** departing beyond the threshold that no earlier record produced (its statistics are
  those of no earlier output of the target): a parameter/weight, or data the dump does not show
  being computed (``role`` "parameter" for a ``parameters`` entry or a tensor that requires grad,
  else "input");
* a record only one side has (a layer skipped, an op added: ``role`` "missing in target" /
  "extra in target"), when it comes before the first error introduced.

A leaf departs by the largest of its statistics' differences, each relative to the bench
tensor's scale (``max(|Max|, |Min|)``; the Norm relative to the bench Norm): a mean near zero
does not blow the measure up. NaN or Inf on one side only, a different shape, or a different dtype
(``dtype`` noted) always depart; in md5 mode a different CRC-32 departs.
"""
from __future__ import annotations

import math
from typing import Any, Optional

from msprobe.compare._rows import leaf_side, record_leaves
from msprobe.compare._verdict import same_dtype
from msprobe.format.comm import COMM_PREFIXES, buffer_args, is_buffer_leaf
from msprobe.format.model import TENSOR_TYPES, is_tensor_entry
from msprobe.format.native import leafwalk
from msprobe.format.settled import settled_positions
from msprobe.format.stats import MAX, MIN, STAT_KEYS, STATISTICS

#: where Max and Min sit in a side's statistics (the range scale of the others)
_MAX_AT, _MIN_AT = STATISTICS.index(MAX), STATISTICS.index(MIN)

__all__ = ["ORIGIN_THRESHOLD", "find_origin", "departure", "describe", "earliest", "order_key"]

#: a leaf departs from the bench when its statistics differ by more than this fraction of its scale
ORIGIN_THRESHOLD = 1e-4
_OUT_IO = ("output", "parameters_grad")
_COMM = tuple(prefix + "." for prefix in COMM_PREFIXES)


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _relative(target: Optional[float], bench: Optional[float], scale: float) -> float:
    if target is None or bench is None or target == bench or (target != target and bench != bench):
        return 0.0
    if not (math.isfinite(target) and math.isfinite(bench)):
        return math.inf
    return abs(target - bench) / scale if scale > 0 else math.inf


def departure(target: Any, bench: Any, md5: bool = False, classes: bool = False, tolerant: bool = False) -> tuple:
    """(size, note) of a target leaf against its bench leaf (:class:`_rows.Side`): the largest
    relative difference of their statistics (inf where one side only is non-finite, or the shapes
    differ), and a note ("dtype X vs Y", "shape", "CRC-32") or None. ``classes``: a MindSpore and a
    torch dtype of the same class are the same dtype (a compare across frameworks); ``tolerant``: float
    arguments depart by their relative difference, not at any difference (a merged parallel layout's
    values come of sums in another order)."""
    if target.shape != bench.shape:
        return math.inf, "shape"
    if md5:
        return (math.inf, "CRC-32") if target.md5 != bench.md5 else (0.0, None)
    same = same_dtype(target.dtype, bench.dtype) if classes else target.dtype == bench.dtype
    note = None if same else f"dtype {target.dtype} vs {bench.dtype}"
    if not target.tensor or not bench.tensor:
        a, b = target.stats[0], bench.stats[0]
        if tolerant and isinstance(a, float) and isinstance(b, float) and math.isfinite(a) and math.isfinite(b):
            return abs(a - b) / max(abs(b), 1e-30), note
        return (0.0 if a == b else math.inf), note
    targets, benches = [_number(v) for v in target.stats], [_number(v) for v in bench.stats]
    ends = [abs(end) for end in (benches[_MAX_AT], benches[_MIN_AT]) if end is not None and math.isfinite(end)]
    range_scale = max(ends) if ends else 0.0
    size = max(_relative(value, base, range_scale if statistic.scale == "range" else
                         (abs(base) if base is not None and math.isfinite(base) else 0.0))
               for statistic, value, base in zip(STATISTICS, targets, benches))
    return size, note


def _signature(side: Any) -> tuple:
    return (side.dtype, tuple(repr(v) for v in side.stats))


def _has_tensor(leaves: list) -> bool:
    return any(leaf is not None and leaf_side(leaf).tensor for _, leaf, _ in leaves)


def _introduces(leaves: list) -> bool:
    """Whether a record one side alone has can be where an error enters: it holds a tensor and is
    no identity (:func:`_identity`)."""
    return _has_tensor(leaves) and not _identity(leaves)


def _identity(leaves: list) -> bool:
    """Whether every output tensor of a record is one of its input tensors (same dtype, shape and
    statistics): a view or an identity (``view_as`` of an autograd function that returns its input,
    the plumbing of a layout that one side has and the other not), which introduces nothing."""
    sides = [(suffix, leaf_side(leaf)) for suffix, leaf, _ in leaves if leaf is not None]
    inputs = {(side.shape, _signature(side)) for suffix, side in sides if side.tensor and not suffix.startswith("output")}
    outputs = [(side.shape, _signature(side)) for suffix, side in sides if side.tensor and suffix.startswith("output")]
    return bool(outputs) and all(out in inputs for out in outputs)


def _missing_positions(target_count: int, pairs: list, missing: list, bench_position: dict) -> list:
    """[(target record index, bench record)]: each bench-only record sits before the first matched
    target record that follows it in the bench, in order."""
    import bisect

    matched = sorted((bench_position[bench], i) for i, (_, bench) in enumerate(pairs) if bench is not None)
    keys = [position for position, _ in matched]
    at = []
    for name in missing:
        k = bisect.bisect_right(keys, bench_position[name])
        at.append((matched[k][1] if k < len(matched) else target_count, name))
    return sorted(at)


def _departures(leaves: list, bench_leaves: dict, md5: bool, buffers: frozenset = frozenset(),
                classes: bool = False, tolerant: bool = False) -> tuple:
    """(inputs, outputs): [(suffix, io, target Side, size, note)] of the leaves both sides hold
    (a communication call's receive buffers left out: their content before the call is no data)."""
    inputs: list = []
    outputs: list = []
    for suffix, leaf, io in leaves:
        if suffix not in bench_leaves or leaf is None or bench_leaves[suffix] is None:
            continue
        if buffers and is_buffer_leaf(suffix, buffers):
            continue
        side = leaf_side(leaf)
        size, note = departure(side, leaf_side(bench_leaves[suffix]), md5, classes, tolerant)
        (outputs if io in _OUT_IO else inputs).append((suffix, io, side, size, note))
    return inputs, outputs


def _introduced(inputs: list, outputs: list, threshold: float, produced: set) -> Optional[tuple]:
    """(suffix, role, size, note) of the leaf where an error enters this record, or None: an input
    no earlier output produced that departs, else (every input within) the worst departing output."""
    for suffix, io, side, size, note in inputs:
        if (size > threshold or note) and _signature(side) not in produced:
            role = "parameter" if io == "parameters" or side.rg == "True" else "input"
            return suffix, role, size, note
    if any(size > threshold or note for *_, size, note in inputs):
        return None
    bad = [(size, suffix, note) for suffix, _, _, size, note in outputs if size > threshold or note]
    if not bad:
        return None
    size, suffix, note = max(bad, key=lambda item: item[0])
    return suffix, "output", size, note


def find_origin(target_data: dict, bench_data: dict, pairs: list, rest: list, mode: str,
                threshold: Optional[float] = None, rank: Optional[int] = None, across_frameworks: bool = False,
                rows: Optional[dict] = None, tolerant: bool = False, departing: Optional[set] = None) -> Optional[dict]:
    """The first record of one rank pair where an error is introduced (see the module doc):
    ``{record, bench_record, row, argument, role, size, note, record_index}`` or None.
    ``pairs``/``rest``: :func:`msprobe.compare._match.match_records`' matching; ``rank``: the
    target's rank (a broadcast's tensor is data on its root, a receive buffer elsewhere);
    ``across_frameworks``: a record only one side has is no origin (each framework has its own), and
    dtypes compare by class; ``rows``: {target row: bench row} of a mapping (-dm, -am's argument indices);
    ``departing``: a superset of the matched records where a leaf may depart
    (:func:`msprobe.compare._quiet.departing_records`): the others are passed over, their outputs
    joining the produced statistics only when an input's question needs them."""
    limit = ORIGIN_THRESHOLD if threshold is None else threshold
    md5 = mode == "md5"
    tensor_task = mode == "tensor"
    missing = [name for name in rest if not across_frameworks and _introduces(record_leaves(
        name, bench_data[name], tensor_task))]
    missing_at = (_missing_positions(len(pairs), pairs, missing, {name: i for i, name in enumerate(bench_data)})
                  if missing else [])
    produced: set = set()
    passed: list = []  # records passed over (nothing departs) whose outputs are not in ``produced`` yet
    # a record whose content postdates its place is walked where it was settled (format.settled)
    moved = settled_positions([name for name, _ in pairs])
    for record_index in sorted(range(len(pairs)), key=lambda at: moved.get(at, at)) if moved else range(len(pairs)):
        name, bench = pairs[record_index]
        if missing_at and missing_at[0][0] <= record_index:
            return _missing(missing_at[0][1], missing_at[0][0])
        if departing is not None and bench is not None and record_index not in departing:
            passed.append(record_index)
            continue
        leaves = record_leaves(name, target_data[name], tensor_task)
        if bench is None:
            if across_frameworks or name.endswith(".debug") or not _has_tensor(leaves) or _identity(leaves):
                continue
            return {"record": name, "bench_record": None, "row": name, "argument": None, "role": "extra in target",
                    "size": None, "note": "the bench has no such record", "record_index": record_index}
        bench_leaves = {suffix: leaf for suffix, leaf, _ in record_leaves(bench, bench_data[bench], tensor_task)}
        if rows:
            bench_leaves = _remapped(name, bench, leaves, bench_leaves, rows)
        buffers = frozenset(buffer_args(name, target_data[name], -1 if rank is None else rank)) \
            if name.startswith(_COMM) else frozenset()
        inputs, outputs = _departures(leaves, bench_leaves, md5, buffers, across_frameworks, tolerant)
        if passed and any(size > limit or note for *_, size, note in inputs):  # the outputs passed over, now
            produced.update(produced_by_all(target_data, bench_data, [pairs[at] for at in passed], tensor_task, rank))
            passed.clear()
        found = _introduced(inputs, outputs, limit, produced)
        if found is not None:
            return _found_at(name, bench, record_index, found, moved)
        produced.update(_signature(side) for _, _, side, _, _ in outputs if side.tensor)
    if missing_at:
        return _missing(missing_at[0][1], missing_at[0][0])
    return None


def _found_at(name: str, bench: str, record_index: int, found: tuple, moved: dict) -> dict:
    """The origin entry of the leaf ``found`` (:func:`_introduced`'s) of record ``name``."""
    suffix, role, size, note = found
    if not math.isfinite(size):
        size, note = None, note or "NaN/Inf on the target side only"
    found_at = {"record": name, "bench_record": bench, "row": f"{name}.{suffix}" if suffix else name,
                "argument": suffix, "role": role, "size": size, "note": note, "record_index": record_index}
    if record_index in moved:
        found_at["settled_at"] = moved[record_index]
    return found_at


def _produced_by(target_data: dict, bench_data: dict, pair: tuple, tensor_task: bool, rank: Optional[int]) -> list:
    """The signatures of a matched record's tensor outputs the bench also holds (what the walk adds to
    ``produced`` after a record where nothing departs)."""
    name, bench = pair
    bench_leaves = {suffix: leaf for suffix, leaf, _ in record_leaves(bench, bench_data[bench], tensor_task)}
    buffers = frozenset(buffer_args(name, target_data[name], -1 if rank is None else rank)) \
        if name.startswith(_COMM) else frozenset()
    out = []
    for suffix, leaf, io in record_leaves(name, target_data[name], tensor_task):
        if io not in _OUT_IO or leaf is None or bench_leaves.get(suffix, None) is None:
            continue
        if buffers and is_buffer_leaf(suffix, buffers):
            continue
        side = leaf_side(leaf)
        if side.tensor:
            out.append(_signature(side))
    return out


def produced_by_all(target_data: dict, bench_data: dict, pairs: list, tensor_task: bool,
                    rank: Optional[int]) -> list:
    """:func:`_produced_by` of every pair of ``pairs`` (matched records), their signatures in one
    list: the records' leaves walked in C (``_leafwalk.leaves``), one call per side; the Python
    walk where the extension is not there or declines."""
    walker = leafwalk()
    got = None
    if walker is not None and len(pairs) > 1:
        targets = walker.leaves({name: target_data[name] for name, _ in pairs}, tensor_task, TENSOR_TYPES)
        benches = walker.leaves({bench: bench_data[bench] for _, bench in pairs}, tensor_task, TENSOR_TYPES)
        if targets is not None and benches is not None and len(targets[0]) == len(pairs):
            got = _produced_from_columns(target_data, pairs, targets, benches, rank)
    if got is None:
        got = [signature for pair in pairs for signature in _produced_by(target_data, bench_data, pair, tensor_task,
                                                                          rank)]
    return got


def _produced_from_columns(target_data: dict, pairs: list, targets: tuple, benches: tuple,
                           rank: Optional[int]) -> list:
    """:func:`produced_by_all` over the C walk's columns of both sides' records."""
    names, starts, suffixes, _, leaves = benches
    bench_leaves = {name: dict(zip(suffixes[starts[k]:starts[k + 1]], leaves[starts[k]:starts[k + 1]]))
                    for k, name in enumerate(names)}
    _, starts, suffixes, ios, leaves = targets
    out = []
    for k, (name, bench) in enumerate(pairs):
        have = bench_leaves[bench]
        buffers = frozenset(buffer_args(name, target_data[name], -1 if rank is None else rank)) \
            if name.startswith(_COMM) else frozenset()
        for at in range(starts[k], starts[k + 1]):
            leaf = leaves[at]
            if ios[at] not in _OUT_IO or leaf is None or have.get(suffixes[at], None) is None:
                continue
            if buffers and is_buffer_leaf(suffixes[at], buffers):
                continue
            if is_tensor_entry(leaf):  # leaf_side(leaf).tensor, and its signature
                out.append((str(leaf.get("dtype")), tuple(repr(leaf.get(key)) for key in STAT_KEYS)))
    return out


def _remapped(name: str, bench: str, leaves: list, bench_leaves: dict, rows: dict) -> dict:
    """``bench_leaves`` keyed by the target's suffixes where ``rows`` maps a target row to a bench row of ``bench``."""
    out = dict(bench_leaves)
    for suffix, _, _ in leaves:
        mapped = rows.get(f"{name}.{suffix}")
        if mapped and mapped.startswith(bench + ".") and mapped[len(bench) + 1:] in bench_leaves:
            out[suffix] = bench_leaves[mapped[len(bench) + 1:]]
    return out


def _step_key(step: Any) -> tuple:
    return (step is None, step if isinstance(step, int) else 0, str(step))


def order_key(result: dict, key: str, position: int = 0) -> tuple:
    """Sort key of a rank-pair result by its ``key`` entry (a first divergence, origin or first
    NaN, with a ``record_index``): the earliest step, then the entry's place in the step's
    happens-before order (``order``, from :func:`msprobe.compare._cluster.order_results`: the
    level of the communication before it, then its record index), then rank order
    (``position``: the result's position, the last tie-break). Without an ``order`` (no
    communication) the level is 0."""
    entry = result[key]
    record_index = entry.get("record_index")
    order = entry.get("order")
    if order:  # the step's happens-before order (compare._cluster): level, rank, record index
        level, rank, index = order
        return (_step_key(result.get("step")), str(result.get("split") or ""), level,
                math.inf if record_index is None else index, rank, position)
    return (_step_key(result.get("step")), str(result.get("split") or ""), 0,
            math.inf if record_index is None else record_index, result.get("rank") is None,
            result.get("rank") or 0, position)


def earliest(results: list, key: str) -> Optional[dict]:
    """The result whose ``key`` entry comes first in :func:`order_key`'s order (None when no
    result has one): the one rule compare and the lake's questions pick by."""
    got = [(order_key(result, key, i), i) for i, result in enumerate(results) if result.get(key)]
    return results[min(got)[1]] if got else None


def _missing(bench_name: str, at: int) -> dict:
    return {"record": bench_name, "bench_record": bench_name, "row": bench_name, "argument": None,
            "role": "missing in target", "size": None, "note": "the target has no such record", "record_index": at}


def describe(origin: dict) -> str:
    """One line: ``Functional.linear.6.forward input.1 (parameter, 5% off the bench)``."""
    if origin["role"] in ("missing in target", "extra in target"):
        return f"{origin['record']} ({origin['role']}: {origin['note']})"
    how = [f"{origin['size'] * 100:.3g}% off the bench"] if origin.get("size") is not None else []
    if origin.get("note"):
        how.append(origin["note"])
    return f"{origin['record']} {origin['argument']} ({origin['role']}, {', '.join(how)})"
