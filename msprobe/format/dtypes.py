"""dtype spellings of the dump documents (PyTorch, MindSpore, numpy) in one canonical form."""
from __future__ import annotations

import re
from typing import Any, Optional

import numpy as np

__all__ = ["canonical_dtype", "numpy_dtype", "itemsize", "torch_dtype", "is_float", "is_int", "is_bool"]

_PREFIX_RE = re.compile(r"^(?:torch|mindspore|ms|numpy|np|mindtorch)\.", re.IGNORECASE)
_ALIASES = {
    "float": "float32", "half": "float16", "double": "float64", "long": "int64", "int": "int32",
    "short": "int16", "bool_": "bool", "boolean": "bool", "cfloat": "complex64", "cdouble": "complex128",
    "chalf": "complex32", "float_": "float64", "int_": "int64", "bf16": "bfloat16", "fp16": "float16",
    "fp32": "float32", "fp64": "float64", "uint": "uint32",
}
#: dtypes numpy lacks (MindSpore dumps them as raw bytes); their item sizes.
_NON_NUMPY = {
    "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1, "hifloat8": 1, "complex32": 4, "int4": 1, "uint1": 1,
}


def canonical_dtype(dtype: Any) -> Optional[str]:
    """``torch.float32``, ``Float32``, ``mindspore.float32``, ``float32`` -> ``'float32'``; None if unknown."""
    if dtype is None:
        return None
    text = _PREFIX_RE.sub("", str(dtype).strip())
    text = text.lower()
    text = _ALIASES.get(text, text)
    if text in _NON_NUMPY:
        return text
    try:
        return np.dtype(text).name if text != "bool" else "bool"
    except TypeError:
        return text or None


def numpy_dtype(dtype: Any) -> Optional[np.dtype]:
    """The numpy dtype of a record dtype, or None when numpy has none (bfloat16, float8, ...)."""
    canonical = canonical_dtype(dtype)
    if canonical is None or canonical in _NON_NUMPY:
        return None
    try:
        return np.dtype(canonical)
    except TypeError:
        return None


def itemsize(dtype: Any) -> Optional[int]:
    canonical = canonical_dtype(dtype)
    if canonical in _NON_NUMPY:
        return _NON_NUMPY[canonical]
    nd = numpy_dtype(canonical)
    return None if nd is None else nd.itemsize


def torch_dtype(dtype: Any) -> Any:
    """The torch dtype (imports torch); None when torch has no such dtype."""
    import torch

    canonical = canonical_dtype(dtype)
    return getattr(torch, canonical, None) if canonical else None


def is_float(dtype: Any) -> bool:
    canonical = canonical_dtype(dtype) or ""
    return canonical.startswith(("float", "bfloat", "hifloat")) or canonical == "half"


def is_int(dtype: Any) -> bool:
    canonical = canonical_dtype(dtype) or ""
    return canonical.startswith(("int", "uint"))


def is_bool(dtype: Any) -> bool:
    return canonical_dtype(dtype) == "bool"
