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
import re
import zlib
from typing import Any, Optional

from msprobe.format.model import is_tensor_entry

__all__ = ["COLUMNS", "record_leaves", "norm_record_name", "Side", "crc_text", "diff_cells", "tensor_metrics",
           "leaf_side", "as_float"]

_HEAD = ["NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape", "Bench Tensor Shape",
         "NPU Requires_grad", "Bench Requires_grad"]
_STATS_VALS = ["NPU max", "NPU min", "NPU mean", "NPU l2norm", "Bench max", "Bench min", "Bench mean",
               "Bench l2norm"]
#: CSV columns per mode, in the order the real tool (26.2.0) writes them
COLUMNS = {
    "statistics": _HEAD + ["Max diff", "Min diff", "Mean diff", "L2norm diff", "MaxRelativeErr", "MinRelativeErr",
                           "MeanRelativeErr", "NormRelativeErr"] + _STATS_VALS
                  + ["Requires_grad Consistent", "Result", "Err_message", "NPU_Stack_Info"],
    "md5": _HEAD + ["NPU MD5", "BENCH MD5", "Requires_grad Consistent", "Result", "Err_message", "NPU_Stack_Info"],
    "tensor": _HEAD + ["Cosine", "EucDist", "MaxAbsErr", "MaxRelativeErr", "One Thousandth Err Ratio",
                       "Five Thousandths Err Ratio"] + _STATS_VALS
              + ["Requires_grad Consistent", "Result", "Err_message", "NPU_Stack_Info", "Data_name"],
}

_SKIP_KEYS = {"is_recompute"}
_PG = re.compile(r"\.parameters_grad\.\d+$")
_NA = "N/A"


def norm_record_name(name: str) -> str:
    """The name with dialect differences removed (26.x ``parameters_grad.N`` -> ``parameters_grad``)."""
    return _PG.sub(".parameters_grad", name)


def _walk(value: Any, path: str, out: list, io: str) -> None:
    if value is None:
        out.append((path, None, io))
    elif isinstance(value, dict):
        if "type" in value:
            out.append((path, value, io))
        else:
            for k, v in value.items():
                _walk(v, f"{path}.{k}", out, io)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if v.__class__ is dict and "type" in v:
                out.append((f"{path}.{i}", v, io))
            else:
                _walk(v, f"{path}.{i}", out, io)


def record_leaves(name: str, raw: Any, tensor_task: bool = False) -> list:
    """[(suffix, leaf, io)]: every argument leaf of a record, in document order
    (a leaf is a typed JSON entry or None; an empty ``{}`` has no row, as in the real tool)."""
    out: list = []
    if not isinstance(raw, dict):
        _walk(raw, "", out, "debug")
        return [(p.lstrip("."), v, io) for p, v, io in out]
    if ".parameters_grad" in name:
        for k, v in raw.items():
            if isinstance(v, list) and len(v) == 1:
                v = v[0]
            _walk(v, f".{k}", out, "parameters_grad")
        return [(p[1:], v, io) for p, v, io in out]
    if name.endswith(".debug"):
        _walk(raw, "", out, "debug")
        return [(p.lstrip("."), v, io) for p, v, io in out]
    items: Any = raw.items()  # (key, value) pairs: the document's order or sorted below
    if "parameters" in raw and "output" in raw:  # rows: inputs, parameters, then outputs (as 26.2.0)
        items = sorted(items, key=lambda kv: 1 if kv[0] == "output" else 0)
    for key, value in items:
        if key in _SKIP_KEYS:
            continue
        if key == "input_args":
            _walk(value, "input", out, "input")
        elif key == "input_kwargs":
            if isinstance(value, dict):
                for k, v in value.items():
                    pre = "kwargs" if tensor_task and is_tensor_entry(v) and isinstance(v.get("data_name"), str) else "input"
                    _walk(v, f"{pre}.{k}", out, "input")
        elif key in ("input", "output"):
            _walk(value, key, out, key)
        elif key == "parameters":
            if isinstance(value, dict):
                for k, v in value.items():
                    _walk(v, f"parameters.{k}", out, "parameters")
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


def crc_text(v: Any) -> str:
    return f"{zlib.crc32(str(v).encode()):08x}"


def leaf_side(leaf: Any) -> Side:
    if leaf is None:
        return Side(_NA, _NA, _NA, (None, None, None, None), _NA, None, False, None)
    t = leaf.get("type")
    if is_tensor_entry(leaf):
        shape = leaf.get("shape")
        numel = None
        rg = leaf.get("requires_grad")
        md5 = leaf.get("md5")
        dn = leaf.get("data_name")
        return Side(str(leaf.get("dtype")), str(shape), _NA if rg is None else str(rg),
                    (leaf.get("Max"), leaf.get("Min"), leaf.get("Mean"), leaf.get("Norm")),
                    md5 if isinstance(md5, str) else (_NA if md5 is None else str(md5)),
                    dn if isinstance(dn, str) else None, True, numel)
    v = leaf.get("value")
    if t == "ellipsis":
        return Side("ellipsis", "[]", _NA, ("...",) * 4, crc_text("..."), None, False, None)
    if t == "slice":
        n = len(v) if isinstance(v, list) else 0
        return Side("slice", f"({n},)", _NA, (None,) * 4, crc_text(v), None, False, None)
    if t in ("int", "float", "bool", "str"):
        return Side(f"<class '{t}'>", "[]", _NA, (v,) * 4, crc_text(v), None, False, None)
    return Side("<class 'str'>", "[]", _NA, (str(v),) * 4, crc_text(v), None, False, None)


_INF = math.inf
_NUM = (int, float)


def as_float(v: Any) -> float:
    """``float(v)`` of an int or float; an int too large for a float is +-inf (a hostile dump's
    ``10**400`` is no crash)."""
    try:
        return float(v)
    except OverflowError:
        return _INF if v > 0 else -_INF


def diff_cells(a: Any, b: Any) -> tuple:
    """(diff, relative error in percent, rel as a float or None) the way 26.2.0's CSV prints them:
    numbers subtract (integers as floats), a zero bench gives an ``inf`` relative error, differing
    bools or strings print ``Diff``, a missing value ``N/A``."""
    ta, tb = type(a), type(b)
    if ta is float and tb is float:
        d = a - b
    elif (ta is float or ta is int) and (tb is float or tb is int):
        a, b = as_float(a), as_float(b)
        d = a - b
    elif a == b:
        return "0", "0", 0.0
    elif a is None or b is None:
        return _NA, _NA, None
    elif ta is bool or tb is bool or ta is str or tb is str:
        return "Diff", "Diff", None
    else:
        return _NA, _NA, None
    if d == 0:
        return "0", "0", 0.0
    if d != d:
        if a != a and b != b or a == b:  # NaN (or the same Inf) on both sides: the real tool prints 0
            return "0", "0", 0.0
        return "nan", "nan", math.nan
    if b == 0:
        return str(d), "inf", _INF
    if b == _INF or b == -_INF:
        return str(d), _NA, None
    rel = abs(d) / abs(b)
    return str(d), f"{rel * 100}%", rel


def _r12(v: float) -> float:
    return float(f"{v:.12f}") if math.isfinite(v) else v


def tensor_metrics(na: Any, ba: Any) -> list:
    """The 6 tensor metrics (Cosine, EucDist, MaxAbsErr, MaxRelativeErr, One Thousandth and Five
    Thousandths Err Ratio) of two numpy arrays: numbers, or the real tool's strings (``unsupported``
    where an array is missing, empty or 0-d, ``shape unmatched``, ``N/A`` for NaN/inf mismatches)."""
    import numpy as np

    uns = ["unsupported"] * 6
    if na is None or ba is None:
        return uns
    if na.shape != ba.shape:
        return ["shape unmatched"] + ["unsupported"] * 5
    if na.size == 0:
        return uns
    n = na.astype(np.float64, copy=False).ravel()
    b = ba.astype(np.float64, copy=False).ravel()
    if not (np.isfinite(n).all() and np.isfinite(b).all()):
        if np.array_equal(np.isnan(n), np.isnan(b)) and np.array_equal(n[np.isinf(n)], b[np.isinf(b)]) \
                and np.array_equal(np.isinf(n), np.isinf(b)):
            fin = np.isfinite(n)
            n, b = n[fin], b[fin]
            if n.size == 0:
                return ["N/A"] * 6
        else:
            return ["N/A"] * 6
    d = np.abs(n - b)
    maxabs = float(d.max()) if d.size else 0.0
    bb = b.copy()
    nn = n.copy()
    z = bb == 0
    eps = np.finfo(np.float64).eps
    bb[z] += eps
    nn[z] += eps
    rel = np.abs((nn - bb) / bb)
    maxrel = float(rel.max()) if rel.size else 0.0
    if na.ndim == 0:
        return ["unsupported", "unsupported", _r12(maxabs), _r12(maxrel), "unsupported", "unsupported"]
    nn_ = float(np.sqrt(np.dot(n, n)))
    bn_ = float(np.sqrt(np.dot(b, b)))
    if nn_ == 0 and bn_ == 0:
        cos = 1.0
    elif nn_ == 0 or bn_ == 0:
        cos = math.nan
    else:
        cos = min(float(np.dot(n, b) / (nn_ * bn_)), 1.0)
    euc = float(np.sqrt(np.sum((n - b) ** 2)))
    return [_r12(cos), euc, _r12(maxabs), _r12(maxrel), _r12(float(np.mean(rel < 0.001))),
            _r12(float(np.mean(rel < 0.005)))]
