"""Statistics and checksum definitions (the reference implementation, numpy only).

What ``Max``/``Min``/``Mean``/``Norm``, ``md5`` (a CRC-32) and ``xor`` mean, per
dialect, matching the real tool (see spec/FORMAT.md, "Statistics"):

* empty tensor (numel 0): all four null.
* bool: ``Max`` = any, ``Min`` = all (JSON booleans); ``Mean``/``Norm`` null.
* 0-d tensor: all four equal the value itself (so ``Norm`` may be negative).
* complex: statistics of ``abs(x)``; ``Max``, ``Min``, ``Mean``; ``Norm`` null
  (PyTorch); MindSpore also gives ``Norm`` of ``abs(x)``.
* floating point:
  - msprobe-26 / msprobe-lake: ``Max``/``Min`` in the tensor's dtype; ``Mean`` and
    ``Norm`` (L2) computed in the tensor's dtype (accumulated wider, the result
    rounded to that dtype: float16/bfloat16 results are float16/bfloat16 values),
    except float64 whose ``Mean``/``Norm`` are null.
  - msprobe-8 and msprobe-1: float64 is cast to float32 first; all four computed.
* integer:
  - msprobe-26 / msprobe-lake: ``Max``/``Min`` as JSON integers; ``Mean``/``Norm`` null.
  - msprobe-8 and msprobe-1: cast to float32; all four as floats.
* NaN propagates (``Max`` of a tensor holding NaN is NaN, written ``NaN``); Inf likewise.
* MindSpore (``framework="mindspore"``, every dialect): integer and float64 tensors are cast
  to float32 and all four given (the msprobe-8 rule); complex also gives ``Norm``.

``md5`` is ``"%08x" % zlib.crc32(bytes)`` over the tensor's contiguous bytes in its own
dtype (msprobe-26, ours); msprobe-8 casts bfloat16 to float32 first. ``xor`` is the XOR
of all little-endian 64-bit words of those bytes, zero-padded to a multiple of 8,
written ``"0x%016x"``.
"""
from __future__ import annotations

import math
import zlib
from typing import Any, Callable, Iterable, NamedTuple, Optional, Sequence

import numpy as np

from msprobe.format.dialects import casts_stats

__all__ = ["crc32_hex", "xor64_hex", "xor64", "reference_stats", "stats_equal",
           "Statistic", "STATISTICS", "MAX", "MIN", "MEAN", "NORM", "STAT_KEYS", "STAT_COLUMNS", "STAT_BY_COLUMN",
           "CSV_TARGET", "CSV_BENCH", "CSV_DIFF", "CSV_RELATIVE", "null_stats", "stats_dict", "get_statistic"]


def _merge_max(found: Sequence[float], numels: Sequence[int]) -> float:
    """The Max of a concatenation: NaN when a shard's is (Python's ``max`` would keep whichever
    comes first), else the largest (+Inf when a shard holds +Inf)."""
    return math.nan if any(math.isnan(v) for v in found) else max(found)


def _merge_min(found: Sequence[float], numels: Sequence[int]) -> float:
    return math.nan if any(math.isnan(v) for v in found) else min(found)


def _merge_mean(found: Sequence[float], numels: Sequence[int]) -> float:
    total = sum(numels)
    return sum(n * m for n, m in zip(numels, found)) / total if total else found[0]


def _merge_norm(found: Sequence[float], numels: Sequence[int]) -> float:
    return math.sqrt(sum(v * v for v in found))


class Statistic(NamedTuple):
    """One statistic of a tensor, as every layer spells and treats it.

    ``key``: its dump.json key; ``column``: its name in the Parquet index, the lake's questions, the
    CLI (``--stat``) and the view; ``csv``: its name in compare's CSV after "NPU "/"Bench ";
    ``diff``/``relative``: compare's difference and relative-error columns; ``merge(found, numels)``:
    the statistic of the concatenation of shards whose statistics are ``found`` and sizes ``numels``;
    ``scale``: what compare's origin search divides a difference by, ``"range"`` (the bench's
    largest finite ``|Max|``/``|Min|``) or ``"own"`` (the bench's own ``|value|``).
    """
    key: str
    column: str
    csv: str
    diff: str
    relative: str
    merge: Callable[[Sequence[float], Sequence[int]], float]
    scale: str


#: the statistics in the order dump.json, the index and compare's CSV give them (the real tool's order)
STATISTICS: tuple = (
    Statistic("Max", "max", "max", "Max diff", "MaxRelativeErr", _merge_max, "range"),
    Statistic("Min", "min", "min", "Min diff", "MinRelativeErr", _merge_min, "range"),
    Statistic("Mean", "mean", "mean", "Mean diff", "MeanRelativeErr", _merge_mean, "range"),
    Statistic("Norm", "norm", "l2norm", "L2norm diff", "NormRelativeErr", _merge_norm, "own"),
)
MAX, MIN, MEAN, NORM = STATISTICS
#: dump.json keys ("Max", ...) and index/CLI/view names ("max", ...), in table order
STAT_KEYS: tuple = tuple(s.key for s in STATISTICS)
STAT_COLUMNS: tuple = tuple(s.column for s in STATISTICS)
STAT_BY_COLUMN: dict = {s.column: s for s in STATISTICS}
#: compare's CSV columns: the target's statistics, the bench's, the differences, the relative errors
CSV_TARGET: tuple = tuple(f"NPU {s.csv}" for s in STATISTICS)
CSV_BENCH: tuple = tuple(f"Bench {s.csv}" for s in STATISTICS)
CSV_DIFF: tuple = tuple(s.diff for s in STATISTICS)
CSV_RELATIVE: tuple = tuple(s.relative for s in STATISTICS)


def null_stats() -> dict:
    """A dump.json entry's statistics when there are none: every key, null."""
    return dict.fromkeys(STAT_KEYS)


def stats_dict(values: Iterable[Any]) -> dict:
    """The dump.json statistics of ``values`` given in table order."""
    return dict(zip(STAT_KEYS, values))


def get_statistic(column: str) -> Statistic:
    """The statistic an index/CLI/view name (``"norm"``) names; ValueError for another name."""
    try:
        return STAT_BY_COLUMN[column]
    except KeyError:
        raise ValueError(f"unknown statistic {column!r}; known: {', '.join(STAT_COLUMNS)}") from None


def _byte_view(buf: Any) -> Any:
    """The bytes of a buffer in C order, as a flat view when possible (empty and
    non-contiguous buffers, which memoryview cannot cast, included)."""
    mv = memoryview(buf)
    if mv.nbytes == 0:
        return b""
    return mv.cast("B") if mv.c_contiguous else mv.tobytes()


def crc32_hex(buf: Any) -> str:
    """CRC-32 of a bytes-like object, as the 8 lowercase hex digits the real tool writes."""
    return f"{zlib.crc32(_byte_view(buf)) & 0xFFFFFFFF:08x}"


def xor64(buf: Any) -> int:
    """XOR of the little-endian 64-bit words of ``buf`` (zero-padded)."""
    data = np.frombuffer(_byte_view(buf), dtype=np.uint8)
    pad = (-len(data)) % 8
    if pad:
        data = np.concatenate([data, np.zeros(pad, dtype=np.uint8)])
    if not len(data):
        return 0
    return int(np.bitwise_xor.reduce(data.view("<u8")))


def xor64_hex(buf: Any) -> str:
    return f"0x{xor64(buf) & ((1 << 64) - 1):016x}"


def _py(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def reference_stats(a: np.ndarray, *, dialect: str = "msprobe-26", logical_dtype: Optional[str] = None,
                    framework: str = "pytorch") -> tuple:
    """(Max, Min, Mean, Norm) of ``a`` as JSON-ready Python values.

    ``logical_dtype`` names a dtype numpy lacks (``"bfloat16"``): ``a`` then holds the values
    widened to float32, and Mean/Norm are rounded back to bfloat16 as the real tool's are.
    ``framework="mindspore"`` applies the MindSpore rules (see the module docstring).
    """
    mindspore = framework == "mindspore"
    if a.size == 0:
        return (None, None, None, None)
    if a.dtype == np.bool_:
        return (bool(a.any()), bool(a.all()), None, None)
    if a.ndim == 0:
        value = _py(a)
        return (value, value, value, value)
    if np.iscomplexobj(a):
        magnitude = np.abs(a)
        norm = _py(np.linalg.norm(magnitude)) if mindspore else None
        return (_py(magnitude.max()), _py(magnitude.min()), _py(magnitude.mean()), norm)
    legacy = casts_stats(dialect) or mindspore  # the dialect's statistics rule (format.dialects)
    if a.dtype.kind in "iu":
        if legacy:
            as_float32 = a.astype(np.float32)
            return _float_stats(as_float32, np.float32)
        return (int(a.max()), int(a.min()), None, None)
    if a.dtype == np.float64:
        if legacy:
            return _float_stats(a.astype(np.float32), np.float32)
        return (float(a.max()), float(a.min()), None, None)
    if logical_dtype in ("bfloat16", "torch.bfloat16"):
        mx, mn, mean, norm = _float_stats(a.astype(np.float32), np.float32)
        return (mx, mn, _round_bf16(mean), _round_bf16(norm))
    return _float_stats(a, a.dtype.type)


def _float_stats(values: np.ndarray, out_type) -> tuple:
    # accumulate in float64 (as torch does on CPU for float32), round the result to the dtype
    acc = values.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/Inf inputs are legitimate
        mean = out_type(np.mean(acc))
        norm = out_type(np.sqrt(np.sum(np.square(acc))))
    return (_py(values.max()), _py(values.min()), _py(mean), _py(norm))


def _round_bf16(value: Optional[float]) -> Optional[float]:
    if value is None:
        return None
    bits = np.array([value], dtype=np.float32).view(np.uint32)
    # round to nearest even on the upper 16 bits
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return float(rounded.view(np.float32)[0])


def stats_equal(a: Any, b: Any, rtol: float = 1e-5, atol: float = 1e-8) -> bool:
    """Compare two statistics values as JSON gives them (NaN equals NaN)."""
    if a is None or b is None:
        return a is b
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    fa, fb = float(a), float(b)
    if np.isnan(fa) or np.isnan(fb):
        return bool(np.isnan(fa) and np.isnan(fb))
    if np.isinf(fa) or np.isinf(fb):
        return fa == fb
    return abs(fa - fb) <= atol + rtol * abs(fb)
