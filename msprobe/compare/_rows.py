"""Flatten records into compare rows (one per argument leaf) and compute their metrics.

Row names follow the real tool's CSV: ``<record>.input.<i>[.<j>...]`` for positional
args, ``<record>.input.<kwarg>`` for keyword args (``.kwargs.<kwarg>`` for a dumped
kwarg tensor in tensor mode, as its data_name says), ``<record>.output.<i>``,
``<record>.parameters.<name>``; backward records use ``input``/``output`` as dumped;
a parameters_grad record gives ``<record>.<param>``.

Works on the raw JSON of dump.json (no Arg objects) so 100,000 records take a second.
"""
from __future__ import annotations

import math
import zlib
from typing import Any, Optional

from msprobe.format.dialects import normalise_record_name
from msprobe.format.model import is_tensor_entry
from msprobe.format.stats import CSV_BENCH, CSV_DIFF, CSV_RELATIVE, CSV_TARGET, MAX, STAT_KEYS

__all__ = ["COLUMNS", "record_leaves", "norm_record_name", "Side", "crc_text", "diff_cells", "tensor_metrics",
           "leaf_side", "as_float"]

_HEAD = ["NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape", "Bench Tensor Shape",
         "NPU Requires_grad", "Bench Requires_grad"]
_STATS_VALS = [*CSV_TARGET, *CSV_BENCH]
#: CSV columns per mode, in the order the real tool (26.2.0) writes them
COLUMNS = {
    "statistics": _HEAD + [*CSV_DIFF, *CSV_RELATIVE] + _STATS_VALS
                  + ["Requires_grad Consistent", "Result", "Err_message", "NPU_Stack_Info"],
    "md5": _HEAD + ["NPU MD5", "BENCH MD5", "Requires_grad Consistent", "Result", "Err_message", "NPU_Stack_Info"],
    "tensor": _HEAD + ["Cosine", "EucDist", "MaxAbsErr", "MaxRelativeErr", "One Thousandth Err Ratio",
                       "Five Thousandths Err Ratio"] + _STATS_VALS
              + ["Requires_grad Consistent", "Result", "Err_message", "NPU_Stack_Info", "Data_name"],
}

_SKIP_KEYS = {"is_recompute"}
_NA = "N/A"


def norm_record_name(name: str) -> str:
    """The name with dialect differences removed (26.x ``parameters_grad.N`` -> ``parameters_grad``)."""
    return normalise_record_name(name)


def _walk(value: Any, path: str, out: list, io: str) -> None:
    if value is None:
        out.append((path, None, io))
    elif isinstance(value, dict):
        if "type" in value:
            out.append((path, value, io))
        else:
            for key, item in value.items():
                _walk(item, f"{path}.{key}", out, io)
    elif isinstance(value, list):
        for position, item in enumerate(value):
            if item.__class__ is dict and "type" in item:
                out.append((f"{path}.{position}", item, io))
            else:
                _walk(item, f"{path}.{position}", out, io)


def _kwarg_prefix(value: Any, tensor_task: bool) -> str:
    """``kwargs`` for a dumped kwarg tensor in tensor mode (as its data_name says), else ``input``."""
    return "kwargs" if tensor_task and is_tensor_entry(value) and isinstance(value.get("data_name"), str) else "input"


def record_leaves(name: str, raw: Any, tensor_task: bool = False) -> list:
    """[(suffix, leaf, io)]: every argument leaf of a record, in document order
    (a leaf is a typed JSON entry or None; an empty ``{}`` has no row, as in the real tool)."""
    out: list = []
    if not isinstance(raw, dict):
        _walk(raw, "", out, "debug")
        return [(path.lstrip("."), leaf, io) for path, leaf, io in out]
    if ".parameters_grad" in name:
        for key, value in raw.items():
            if isinstance(value, list) and len(value) == 1:
                value = value[0]
            _walk(value, f".{key}", out, "parameters_grad")
        return [(path[1:], leaf, io) for path, leaf, io in out]
    if name.endswith(".debug"):
        _walk(raw, "", out, "debug")
        return [(path.lstrip("."), leaf, io) for path, leaf, io in out]
    items: Any = raw.items()  # (key, value) pairs: the document's order or sorted below
    if "parameters" in raw and "output" in raw:  # rows: inputs, parameters, then outputs (as 26.2.0)
        items = sorted(items, key=lambda item: 1 if item[0] == "output" else 0)
    for key, value in items:
        if key in _SKIP_KEYS:
            continue
        if key == "input_args":
            _walk(value, "input", out, "input")
        elif key == "input_kwargs":
            if isinstance(value, dict):
                for kwarg, item in value.items():
                    _walk(item, f"{_kwarg_prefix(item, tensor_task)}.{kwarg}", out, "input")
        elif key in ("input", "output"):
            _walk(value, key, out, key)
        elif key == "parameters":
            if isinstance(value, dict):
                for parameter, item in value.items():
                    _walk(item, f"parameters.{parameter}", out, "parameters")
        else:
            _walk(value, key, out, key)
    return out


class Side:
    """What the CSV shows of one leaf: dtype, shape, requires_grad, 4 statistics, md5, data_name."""

    __slots__ = ("dtype", "shape", "rg", "stats", "md5", "data_name", "tensor", "numel")

    def __init__(self, dtype: str, shape: str, rg: str, stats: tuple, md5: str, data_name: Optional[str],
                 tensor: bool, numel: Optional[int]):
        self.dtype, self.shape, self.rg, self.stats = dtype, shape, rg, stats
        self.md5, self.data_name, self.tensor, self.numel = md5, data_name, tensor, numel


def crc_text(value: Any) -> str:
    return f"{zlib.crc32(str(value).encode()):08x}"


def leaf_side(leaf: Any) -> Side:
    if leaf is None:
        return Side(_NA, _NA, _NA, (None, None, None, None), _NA, None, False, None)
    kind = leaf.get("type")
    if is_tensor_entry(leaf):
        requires_grad = leaf.get("requires_grad")
        md5 = leaf.get("md5")
        data_name = leaf.get("data_name")
        return Side(str(leaf.get("dtype")), str(leaf.get("shape")),
                    _NA if requires_grad is None else str(requires_grad),
                    tuple(leaf.get(key) for key in STAT_KEYS),
                    md5 if isinstance(md5, str) else (_NA if md5 is None else str(md5)),
                    data_name if isinstance(data_name, str) else None, True, None)
    value = leaf.get("value")
    if kind == "ellipsis":
        return Side("ellipsis", "[]", _NA, ("...",) * 4, crc_text("..."), None, False, None)
    if kind == "slice":
        length = len(value) if isinstance(value, list) else 0
        return Side("slice", f"({length},)", _NA, (None,) * 4, crc_text(value), None, False, None)
    if kind in ("int", "float", "bool", "str"):
        return Side(f"<class '{kind}'>", "[]", _NA, (value,) * 4, crc_text(value), None, False, None)
    return Side("<class 'str'>", "[]", _NA, (str(value),) * 4, crc_text(value), None, False, None)


_INF = math.inf
_NUM = (int, float)


def as_float(value: Any) -> float:
    """``float(value)`` of an int or float; an int too large for a float is +-inf (a hostile dump's
    ``10**400`` is no crash)."""
    try:
        return float(value)
    except OverflowError:
        return _INF if value > 0 else -_INF


def diff_cells(target: Any, bench: Any) -> tuple:
    """(diff, relative error in percent, rel as a float or None) the way 26.2.0's CSV prints them:
    numbers subtract (integers as floats), a zero bench gives an ``inf`` relative error, differing
    bools or strings print ``Diff``, a missing value ``N/A``."""
    target_type, bench_type = type(target), type(bench)
    if target_type is float and bench_type is float:
        difference = target - bench
    elif (target_type is float or target_type is int) and (bench_type is float or bench_type is int):
        target, bench = as_float(target), as_float(bench)
        difference = target - bench
    elif target == bench:
        return "0", "0", 0.0
    elif target is None or bench is None:
        return _NA, _NA, None
    elif target_type is bool or bench_type is bool or target_type is str or bench_type is str:
        return "Diff", "Diff", None
    else:
        return _NA, _NA, None
    if difference == 0:
        return "0", "0", 0.0
    if difference != difference:
        if target != target and bench != bench or target == bench:  # NaN (or the same Inf) on both sides: 0
            return "0", "0", 0.0
        return "nan", "nan", math.nan
    if bench == 0:
        return str(difference), "inf", _INF
    if bench == _INF or bench == -_INF:
        return str(difference), _NA, None
    relative = abs(difference) / abs(bench)
    return str(difference), f"{relative * 100}%", relative


def _r12(value: float) -> float:
    return float(f"{value:.12f}") if math.isfinite(value) else value


def tensor_metrics(target_array: Any, bench_array: Any) -> list:
    """The 6 tensor metrics (Cosine, EucDist, MaxAbsErr, MaxRelativeErr, One Thousandth and Five
    Thousandths Err Ratio) of two numpy arrays: numbers, or the real tool's strings (``unsupported``
    where an array is missing, empty or 0-d, ``shape unmatched``, ``N/A`` for NaN/inf mismatches)."""
    import numpy as np

    unsupported = ["unsupported"] * 6
    if target_array is None or bench_array is None:
        return unsupported
    if target_array.shape != bench_array.shape:
        return ["shape unmatched"] + ["unsupported"] * 5
    if target_array.size == 0:
        return unsupported
    target = target_array.astype(np.float64, copy=False).ravel()
    bench = bench_array.astype(np.float64, copy=False).ravel()
    if not (np.isfinite(target).all() and np.isfinite(bench).all()):
        if np.array_equal(np.isnan(target), np.isnan(bench)) \
                and np.array_equal(target[np.isinf(target)], bench[np.isinf(bench)]) \
                and np.array_equal(np.isinf(target), np.isinf(bench)):
            finite = np.isfinite(target)
            target, bench = target[finite], bench[finite]
            if target.size == 0:
                return ["N/A"] * 6
        else:
            return ["N/A"] * 6
    difference = np.abs(target - bench)
    max_abs = float(difference.max()) if difference.size else 0.0
    bench_shifted = bench.copy()
    target_shifted = target.copy()
    zero = bench_shifted == 0
    eps = np.finfo(np.float64).eps
    bench_shifted[zero] += eps
    target_shifted[zero] += eps
    relative = np.abs((target_shifted - bench_shifted) / bench_shifted)
    max_relative = float(relative.max()) if relative.size else 0.0
    if target_array.ndim == 0:
        return ["unsupported", "unsupported", _r12(max_abs), _r12(max_relative), "unsupported", "unsupported"]
    target_norm = float(np.sqrt(np.dot(target, target)))
    bench_norm = float(np.sqrt(np.dot(bench, bench)))
    if target_norm == 0 and bench_norm == 0:
        cosine = 1.0
    elif target_norm == 0 or bench_norm == 0:
        cosine = math.nan
    else:
        cosine = min(float(np.dot(target, bench) / (target_norm * bench_norm)), 1.0)
    euclidean = float(np.sqrt(np.sum((target - bench) ** 2)))
    return [_r12(cosine), euclidean, _r12(max_abs), _r12(max_relative), _r12(float(np.mean(relative < 0.001))),
            _r12(float(np.mean(relative < 0.005)))]


def _first_tensor_leaves(data: dict, limit: int) -> Any:
    """The tensor leaves (dicts with dtype and shape) of the first ``limit`` records, record by record."""
    for position, (name, raw) in enumerate(data.items()):
        if position >= limit:
            return
        yield [leaf for _, leaf, _ in record_leaves(name, raw)
               if isinstance(leaf, dict) and "dtype" in leaf and "shape" in leaf]


def _has_md5(data: dict) -> bool:
    """Whether the first tensor leaf (of the first 51 records) holds a CRC-32 beside its statistics
    (a leaf table's records know it: :class:`msprobe.compare._indexed.IndexedRecords`)."""
    known = getattr(data, "has_md5", None)
    if known is not None:
        return bool(known)
    for leaves in _first_tensor_leaves(data, 51):
        if leaves:
            return isinstance(leaves[0].get("md5"), str) and MAX.key in leaves[0]
    return False
