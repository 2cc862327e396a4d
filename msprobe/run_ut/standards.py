"""Precision standards of the offline pre-check (run_ut), as data.

Which comparison algorithm judges an API, the per-dtype thresholds, and the
rules the docs give for the single-side status (details CSV) and for the
NPU-vs-GPU comparison (``api_precision_compare``). Pure Python: no torch.

Algorithms (the docs' "new precision standard"):

- binary consistency: the API must be bit exact (data movement, comparisons,
  selections, rounding, sign manipulation); also every bool/int output.
- absolute threshold: single-rounding element-wise arithmetic (not addcmul/addcdiv,
  lerp or rsqrt: several roundings, or not correctly rounded); relative error
  of normal values and absolute error of small values against fixed thresholds,
  and inf/nan agreement.
- ULP error: the matrix-multiply family, error in units in the last place of
  the device dtype.
- thousandth: conv1d/conv2d, share of elements within 0.1% relative error.
- benchmark comparison: everything else; device-vs-CPU metrics (small-value
  error ratio, RMSE, max/mean relative error, error balance) that are judged by
  comparing the NPU's metrics with the GPU's.
"""
from __future__ import annotations

from typing import Optional

__all__ = [
    "BINARY", "ABSOLUTE", "ULP", "THOUSANDTH", "BENCHMARK", "ALGORITHM_LABELS",
    "algorithm_of", "base_api_name", "NEW_STANDARD_DTYPES", "SMALL_VALUE", "SMALL_VALUE_ATOL",
    "absolute_thresholds", "ULP_PARAMS", "ulp_threshold", "UNSUPPORTED_APIS", "NO_BACKWARD_APIS",
    "NOT_REPLAYED_TYPES", "REPLAYABLE_TYPES", "RANDOM_APIS", "KEEP_DTYPE_APIS", "benchmark_ratio_limits",
]

BINARY = "binary"
ABSOLUTE = "absolute"
ULP = "ulp"
THOUSANDTH = "thousandth"
BENCHMARK = "benchmark"

#: the value written in the 比对算法 column of api_precision_compare_details
ALGORITHM_LABELS = {
    BINARY: "二进制一致法",
    ABSOLUTE: "绝对阈值法",
    ULP: "ULP误差比对法",
    THOUSANDTH: "双千指标法",
    BENCHMARK: "标杆比对法",
}

# Our own grouping, by what the operation does.
_EXACT_OPS = """
abs absolute neg negative sign sgn ceil floor round trunc fix
relu relu6 hardtanh threshold
eq ne lt le gt ge equal greater greater_equal less less_equal not_equal isfinite isinf isnan isneginf isposinf
logical_and logical_or logical_not logical_xor bitwise_and bitwise_or bitwise_xor bitwise_not
maximum minimum fmax fmin max min argmax argmin amax amin sort argsort topk kthvalue msort unique
gather scatter index_select masked_fill masked_select masked_scatter take take_along_dim where nonzero
transpose permute reshape view flatten unflatten squeeze unsqueeze expand expand_as broadcast_to repeat tile
narrow select slice chunk contiguous clone detach flip roll rot90 t swapaxes swapdims movedim moveaxis
tril triu diag diagonal pad constant_pad_nd one_hot fill zero zeros_like ones_like full_like type_as
max_pool1d max_pool2d max_pool3d adaptive_max_pool1d adaptive_max_pool2d histc bincount
__getitem__ __eq__ __ne__ __lt__ __le__ __gt__ __ge__ __and__ __or__ __xor__ __invert__ __neg__ __abs__
"""
# one IEEE operation per element, correctly rounded (so a relative tolerance of a few ulps holds);
# addcmul/addcdiv (a product or quotient, a scaling, then a sum: three roundings, Adam's update),
# lerp and rsqrt (not correctly rounded) are no such operation: the benchmark comparison judges them
_ELEMENTWISE_ARITH = """
add sub subtract mul multiply div divide true_divide rsub reciprocal sqrt square
leaky_relu prelu
__add__ __radd__ __iadd__ __sub__ __rsub__ __isub__ __mul__ __rmul__ __imul__
__div__ __truediv__ __rtruediv__ __idiv__ __itruediv__
"""
_MATMUL = """
matmul mm bmm mv addmm addbmm baddbmm addmv linear bilinear chain_matmul __matmul__ __rmatmul__ einsum
"""


def _names(block: str) -> frozenset:
    out = set()
    for n in block.split():
        out.add(n)
        if not n.startswith("__") and not n.endswith("_"):
            out.add(n + "_")  # the in-place variant judges the same way
    return frozenset(out)


_ALGO_OF: dict = {}
for _n in _names(_EXACT_OPS):
    _ALGO_OF[_n] = BINARY
for _n in _names(_ELEMENTWISE_ARITH):
    _ALGO_OF[_n] = ABSOLUTE
for _n in _names(_MATMUL):
    _ALGO_OF[_n] = ULP
for _n in ("conv1d", "conv2d"):
    _ALGO_OF[_n] = THOUSANDTH

#: dtypes the new precision standard covers (the device side's dtype)
NEW_STANDARD_DTYPES = ("float16", "bfloat16", "float32")

#: |bench| below this is a "small value" (docs, section 4.2)
SMALL_VALUE = {"float32": 2.0 ** -20, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -10}
#: absolute error allowed on small values (docs, section 4.2)
SMALL_VALUE_ATOL = {"float32": 2.0 ** -30, "float16": 2.0 ** -16, "bfloat16": 2.0 ** -16}

# absolute-threshold algorithm: (relative tolerance, small-value bound, small-value absolute tolerance);
# one rounding of the device dtype stays well inside each.
_ABS_THRESH = {
    "float32": (1.0e-6, 1.0e-6, 1.0e-9),
    "float16": (1.0e-3, 1.0e-3, 1.0e-5),
    "bfloat16": (4.0e-3, 1.0e-3, 1.0e-5),
}

#: ULP: (mantissa bits, smallest normal exponent) of the device dtype
ULP_PARAMS = {"float32": (23, -126), "float16": (10, -14), "bfloat16": (7, -126)}

#: APIs run_ut never replays (they allocate uninitialised memory or move data between devices)
UNSUPPORTED_APIS = frozenset({"to", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                              "empty_with_format"})
#: APIs whose backward is not checked
NO_BACKWARD_APIS = frozenset({"repeat_interleave", "masked_select"})
#: API types that are recorded but never replayed
NOT_REPLAYED_TYPES = {
    "Distributed": "Distributed APIs are not replayed: a collective needs the original process group",
    "MindSpeed": "MindSpeed APIs are not replayed by run_ut",
}
#: API types run_ut replays (NPU only where torch_npu imports)
REPLAYABLE_TYPES = ("Tensor", "Torch", "Functional", "VF", "Aten", "NPU")
#: APIs whose result is random: the benchmark cannot reproduce the device's draws
RANDOM_APIS = frozenset({"dropout", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout",
                         "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm",
                         "bernoulli", "bernoulli_", "multinomial", "normal", "normal_", "uniform_",
                         "random_", "exponential_", "geometric_", "cauchy_", "log_normal_", "rrelu",
                         "native_dropout", "gumbel_softmax"})
#: APIs whose benchmark keeps the recorded dtype (no float64 upcast)
KEEP_DTYPE_APIS = frozenset({"conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                             "conv_transpose3d"})


def base_api_name(api_name: str) -> str:
    """``add.Tensor`` (an Aten overload) -> ``add``; other names unchanged."""
    return api_name.split(".", 1)[0] if api_name else api_name


def algorithm_of(api_name: str) -> str:
    """The algorithm that judges ``api_name`` (``linear``, ``__add__``, ``add.Tensor``...)."""
    return _ALGO_OF.get(base_api_name(api_name), BENCHMARK)


def absolute_thresholds(dtype: str) -> Optional[tuple]:
    """(rtol, small_value, small_value_atol) of the absolute-threshold algorithm for ``dtype``."""
    return _ABS_THRESH.get(dtype)


def ulp_threshold(dtype: str) -> float:
    """An element is counted as an ULP error above this many ULPs (docs: 1 for fp16/bf16, 32 for fp32)."""
    return 32.0 if dtype == "float32" else 1.0


def benchmark_ratio_limits() -> dict:
    """NPU/GPU metric ratio above which api_precision_compare marks error (docs, section 5)."""
    return {"small_value": 2.0, "rmse": 2.0, "max_rel": 10.0, "mean_rel": 2.0, "eb": 2.0}
