"""Inputs for replaying an API from its record, the way the real tool's run_ut builds them.

Tensors are the dumped ones when they exist (``mode="auto"``/``"real"``), otherwise
generated from the record (``mode="random"``, or ``"auto"`` without a file): uniform
in ``[Min, Max]`` with ``Min`` and ``Max`` written at the first and last element,
integers via ``randint(Min, Max + 1)``, booleans ``randint(Min, Max + 1) > 0``, a NaN
``Max`` gives an all-NaN tensor, an infinite ``Max`` a tensor of that infinity ending
in ``Min``; dtype and shape from the record.
"""
from __future__ import annotations

import math
from typing import Any, Optional

from msprobe.errors import ConfigError, FormatError, MsprobeError, TensorLoadError, require
from msprobe.format.dtypes import canonical_dtype, is_bool, is_float, is_int, itemsize, numpy_dtype
from msprobe.format.model import (
    EllipsisArg,
    MappingArg,
    NoneArg,
    ScalarArg,
    SequenceArg,
    SliceArg,
    TensorArg,
    TypedValueArg,
)
from msprobe.format.stats import MAX, MIN

__all__ = ["replay_inputs", "generate_tensor", "decode_value", "REPLAY_MODES", "InputTooLargeError"]


class InputTooLargeError(MsprobeError):
    """The tensors to generate for a call would exceed the configured ceiling (nothing was generated
    past it)."""

REPLAY_MODES = ("auto", "real", "random")


def replay_inputs(record: Any, *, mode: str = "auto", framework: str = "torch", seed: Optional[int] = None,
                  need_grad: bool = False, max_generated_bytes: Optional[int] = None) -> tuple:
    if mode not in REPLAY_MODES:
        raise ConfigError(f"mode={mode!r}: valid values are {', '.join(REPLAY_MODES)}")
    if framework not in ("torch", "numpy"):
        raise ConfigError(f"framework={framework!r}: valid values are torch, numpy")
    if framework == "torch":
        require("torch", "torch")
    gen = _Gen(framework, seed)
    ctx = (mode, framework, gen, need_grad, record.name)
    raw = record.raw
    if record.direction == "backward" or not isinstance(raw, dict):
        args_src = record.input
        kwargs_src: dict = {}
    else:
        args_src = record.input_args
        kwargs_src = record.input_kwargs
    if max_generated_bytes is not None:  # every declared size is checked before anything is generated
        need = sum(_generated_bytes(arg, mode, record.name) for arg in list(args_src) + list(kwargs_src.values()))
        if need > max_generated_bytes:
            raise InputTooLargeError(
                f"record {record.name!r}: its generated inputs would take {need} bytes ({need / 2**20:.1f} MiB), "
                f"above the ceiling of {max_generated_bytes} bytes ({max_generated_bytes / 2**20:.1f} MiB; "
                "run_ut: --max-input-mb / config max_input_mb)")
    args = [decode_value(arg, ctx) for arg in args_src]
    kwargs = {key: decode_value(value, ctx) for key, value in kwargs_src.items()}
    return args, kwargs


def decode_value(arg: Any, ctx: tuple) -> Any:
    mode, framework, gen, need_grad, rec_name = ctx
    if isinstance(arg, TensorArg):
        return _tensor(arg, ctx)
    if isinstance(arg, NoneArg):
        return None
    if isinstance(arg, SliceArg):
        return arg.value
    if isinstance(arg, EllipsisArg):
        return Ellipsis
    if isinstance(arg, ScalarArg):
        return arg.value
    if isinstance(arg, TypedValueArg):
        return _typed(arg.type, arg.value, framework)
    if isinstance(arg, SequenceArg):
        return [decode_value(a, ctx) for a in arg.items]
    if isinstance(arg, MappingArg):
        return {key: decode_value(value, ctx) for key, value in arg.items.items()}
    return arg.raw


def declared_shape(entry: Any, record: str, path: str) -> tuple:
    """A tensor entry's shape as ints >= 0; a malformed one (NaN, Infinity, a string, 2**63) is a
    :class:`~msprobe.errors.FormatError` naming the record."""
    shape = entry.get("shape") if isinstance(entry, dict) else None
    shape = shape if shape is not None else ()
    if not isinstance(shape, (list, tuple)) or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d < (1 << 62) for d in shape):
        raise FormatError(f"record {record!r}: {path}: shape {str(shape)[:80]} is not a list of integers >= 0")
    return tuple(shape)


def _generated_bytes(arg: Any, mode: str, record: str) -> int:
    """The bytes of the tensors in ``arg`` that replay would generate (not load)."""
    if isinstance(arg, TensorArg):
        if mode != "random" and isinstance(arg.data_name, str) and hasattr(arg, "load"):
            return 0
        return math.prod(declared_shape(arg.raw, record, arg.path)) * (itemsize(arg.raw.get("dtype")) or 8)
    if isinstance(arg, SequenceArg):
        return sum(_generated_bytes(a, mode, record) for a in arg.items)
    if isinstance(arg, MappingArg):
        return sum(_generated_bytes(a, mode, record) for a in arg.items.values())
    return 0


def _typed(type_: str, value: Any, framework: str) -> Any:
    if framework != "torch":
        return value
    import torch

    if type_ == "torch.dtype" and isinstance(value, str):
        return getattr(torch, value.rsplit(".", 1)[-1], value)
    if type_ == "torch.device" and isinstance(value, str):
        if value.endswith(":None"):  # 26.2.0's (and our) spelling of a device without index: "cpu:None"
            value = value[:-len(":None")]
        try:
            return torch.device(value)
        except (RuntimeError, TypeError):
            return value
    if type_ == "torch.Size" and isinstance(value, list):
        return torch.Size(value)
    if type_ == "torch.memory_format" and isinstance(value, str):
        return getattr(torch, value.rsplit(".", 1)[-1], value)
    if type_.startswith("numpy.") and value is not None:
        import numpy as np

        ctor = getattr(np, type_.split(".", 1)[1], None)
        return ctor(value) if callable(ctor) else value
    if isinstance(value, str) and value.startswith("RedOpType."):
        try:
            import torch.distributed as dist

            return getattr(dist.ReduceOp, value.split(".", 1)[1])
        except (ImportError, AttributeError):
            return value
    return value


def _tensor(arg: TensorArg, ctx: tuple) -> Any:
    mode, framework, gen, need_grad, rec_name = ctx
    has_file = isinstance(arg.data_name, str) and hasattr(arg, "load")
    if mode == "real" and not has_file:
        raise TensorLoadError(f"record {rec_name!r}: {arg.path} has no dumped tensor (mode='real')")
    if mode in ("real", "auto") and has_file:
        value = arg.load(framework=framework)  # type: ignore[attr-defined]
    else:
        value = generate_tensor(arg.raw, framework=framework, gen=gen, record=rec_name, path=arg.path)
    if framework == "torch" and need_grad and arg.requires_grad and value.is_floating_point():
        value = value.detach().requires_grad_(True)
    return value


class _Gen:
    def __init__(self, framework: str, seed: Optional[int]):
        self.framework = framework
        if framework == "torch":
            import torch

            self.torch_gen = torch.Generator()
            if seed is not None:
                self.torch_gen.manual_seed(seed)
            else:
                self.torch_gen.seed()
        import numpy as np

        self.np_gen = np.random.default_rng(seed)


def _number(value: Any, what: str, record: str, path: str) -> float:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return value
    raise MsprobeError(f"record {record!r}: {path}: {what} is {value!r}; a number is needed to generate a tensor")


def generate_tensor(entry: dict, *, framework: str = "torch", gen: Optional[_Gen] = None, record: str = "?",
                    path: str = "") -> Any:
    """A tensor like the one ``entry`` (a tensor entry of dump.json) describes."""
    gen = gen or _Gen(framework, None)
    dtype = entry.get("dtype")
    shape = declared_shape(entry, record, path)
    canonical = canonical_dtype(dtype)
    if canonical is None:
        raise MsprobeError(f"record {record!r}: {path}: no dtype to generate a tensor from")
    numel = math.prod(shape)
    low_o, high_o = entry.get(MIN.key), entry.get(MAX.key)
    low = entry.get(f"{MIN.key}_except_inf_nan", low_o)
    high = entry.get(f"{MAX.key}_except_inf_nan", high_o)
    if numel == 0:
        low = high = low_o = high_o = 0
    low = _number(low, MIN.key, record, path)
    high = _number(high, MAX.key, record, path)
    if framework == "torch":
        return _torch_tensor(canonical, shape, low, high, low_o, high_o, gen, record, path)
    return _numpy_tensor(canonical, shape, low, high, low_o, high_o, gen, record, path)


def _torch_tensor(canonical: str, shape: tuple, low: float, high: float, low_o: Any, high_o: Any, gen: _Gen,
                  record: str, path: str) -> Any:
    import torch

    dtype = getattr(torch, canonical, None)
    if dtype is None:
        raise MsprobeError(f"record {record!r}: {path}: torch has no dtype {canonical!r}")
    if is_bool(canonical):
        low_int, high_int = sorted((int(low), int(high)))
        return torch.randint(low_int, high_int + 1, shape, generator=gen.torch_gen) > 0
    if is_float(canonical):
        if isinstance(high, float) and math.isnan(high):
            return torch.full(shape, float("nan"), dtype=dtype)
        if high_o is not None and isinstance(high, float) and math.isinf(high):
            tensor = torch.full(shape, high, dtype=dtype)
            if tensor.numel():
                tensor.view(-1)[-1] = low
            return tensor
        finfo = torch.finfo(dtype)
        lo_s = _clip_inf(low, finfo)
        hi_s = _clip_inf(high, finfo)
        gen_dtype = torch.float32 if "float8" in canonical else dtype
        tensor = torch.rand(shape, dtype=gen_dtype, generator=gen.torch_gen)
        tensor.mul_(hi_s - lo_s).add_(lo_s)  # in place: the same values as t * (hi - lo) + lo, one tensor alive
    elif is_int(canonical):
        tensor = torch.randint(int(low), int(high) + 1, shape, dtype=dtype, generator=gen.torch_gen)
    else:
        raise MsprobeError(f"record {record!r}: {path}: cannot generate a {canonical} tensor (as run_ut cannot)")
    if tensor.numel() == 0:
        return tensor
    flat = tensor.view(-1)
    if isinstance(high_o, float) and math.isnan(high_o):
        if flat.numel() <= 2:
            flat[0] = float("nan")
            flat[-1] = high
        else:
            flat[0], flat[1], flat[-1] = low, float("nan"), high
    else:
        flat[0] = low
        flat[-1] = high
        if isinstance(high_o, float) and math.isinf(high_o):
            flat[-1] = high_o
        if isinstance(low_o, float) and math.isinf(low_o):
            flat[0] = low_o
    return tensor.to(dtype) if tensor.dtype != dtype else tensor


def _clip_inf(value: float, finfo: Any) -> float:
    if value == math.inf:
        return float(finfo.max)
    if value == -math.inf:
        return float(finfo.min)
    return value


def _numpy_tensor(canonical: str, shape: tuple, low: float, high: float, low_o: Any, high_o: Any, gen: _Gen,
                  record: str, path: str) -> Any:
    import numpy as np

    nd = numpy_dtype(canonical) or (np.dtype("float32") if is_float(canonical) else None)
    if nd is None:
        raise MsprobeError(f"record {record!r}: {path}: numpy has no dtype {canonical!r}")
    rng = gen.np_gen
    if is_bool(canonical):
        low_int, high_int = sorted((int(low), int(high)))
        return rng.integers(low_int, high_int + 1, size=shape) > 0
    if is_float(canonical):
        if isinstance(high, float) and math.isnan(high):
            return np.full(shape, np.nan, dtype=nd)
        fi = np.finfo(nd)
        lo_s, hi_s = _clip_inf(low, fi), _clip_inf(high, fi)
        array = (rng.random(size=shape) * (hi_s - lo_s) + lo_s).astype(nd)
    elif is_int(canonical):
        array = rng.integers(int(low), int(high) + 1, size=shape, dtype=nd)
    else:
        raise MsprobeError(f"record {record!r}: {path}: cannot generate a {canonical} array")
    if array.size:
        flat = array.reshape(-1)
        flat[0], flat[-1] = low, high
    return array
