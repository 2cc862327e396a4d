"""MindSpore values -> record entries.

Statistics are fetched in batches: an entry keeps a reference to its tensor (or, for a
Parameter or a value an API is about to modify, a copy) and the session's PendingStats
resolves a whole batch at once with ``fetch_stats``: the first ``asnumpy`` waits for
MindSpore's asynchronous pipeline once, the rest read finished buffers. The statistics
themselves are ``msprobe.format.stats.reference_stats(framework="mindspore")`` (numpy,
float64 accumulation): no ``mint.norm``/``linalg.vector_norm``, which have no CPU kernel.
"""
from __future__ import annotations

import io
from typing import Any, NamedTuple, Optional

import mindspore
import numpy as np
from mindspore import Parameter, Tensor

from msprobe.dumpers.encode import ValueEncoder
from msprobe.dumpers.ndarray import ndarray_entry
from msprobe.dumpers.session import StatsFetchError
from msprobe.format.stats import crc32_hex, null_stats, reference_stats, stats_dict, xor64

__all__ = ["Encoder", "StatHandle", "fetch_stats", "tensor_numpy", "tensor_raw"]

_BF16 = mindspore.bfloat16
# dtypes numpy lacks, widened for statistics and stored as their raw bytes
_NO_NUMPY = {_BF16: mindspore.int16}
for _name in ("float8_e4m3fn", "float8_e5m2", "hifloat8"):
    _dt = getattr(mindspore, _name, None)
    if _dt is not None:
        _NO_NUMPY[_dt] = mindspore.int8


def tensor_numpy(t: Tensor) -> np.ndarray:
    """Values as numpy; dtypes numpy lacks are widened to float32."""
    if t.dtype in _NO_NUMPY:
        return t.astype(mindspore.float32).asnumpy()
    return t.asnumpy()


def tensor_raw(t: Tensor) -> np.ndarray:
    """The tensor's bytes in its own dtype (bit-reinterpreted for dtypes numpy lacks)."""
    bits = _NO_NUMPY.get(t.dtype)
    if bits is not None:
        return t.view(bits).asnumpy()
    return t.asnumpy()


def _read_error(t: Tensor) -> Optional[RuntimeError]:
    """None when the tensor reads, else the error the read raised."""
    try:
        t.asnumpy()
        return None
    except RuntimeError as exc:
        return exc


class StatHandle(NamedTuple):
    """The statistics of one tensor, computed when ``fetch_stats`` resolves a batch: the tensor
    held (a copy for a Parameter or a value about to be modified) and whether its ``md5`` is wanted."""

    tensor: Tensor
    want_md5: bool


def fetch_stats(handles: list[StatHandle]) -> list[dict]:
    """One dict per handle (shared handles computed once)."""
    done: dict = {}
    out = []
    failure = None
    for h in handles:
        key = id(h)
        vals = done.get(key)
        if vals is None:
            t, want_md5 = h.tensor, h.want_md5
            exc = _read_error(t) if t.dtype not in _NO_NUMPY else None  # a dtype numpy has: a computation failed
            if exc is not None:
                failure = failure or exc
                if _read_error(t) is not None:  # (an asynchronous error surfaces at the first read, maybe not its own)
                    vals = done[key] = null_stats()
                    out.append(vals)
                    continue
            try:
                logical = "bfloat16" if t.dtype == _BF16 else None
                vals = stats_dict(reference_stats(tensor_numpy(t), framework="mindspore", logical_dtype=logical))
                if want_md5:
                    vals["md5"] = crc32_hex(np.ascontiguousarray(tensor_raw(t)))
            except (RuntimeError, TypeError, ValueError):  # a dtype without a CPU kernel: no statistics
                vals = null_stats()
            done[key] = vals
        out.append(vals)
    if failure is not None:  # the script sees the error it would have seen without the dump
        raise StatsFetchError(out, failure)
    return out


def _npy_bytes(t: Tensor) -> bytes:
    from msprobe.dumpers.mindspore._apis import GUARD

    GUARD.inside = True  # a writer thread: these calls are not the model's
    if t.dtype in _NO_NUMPY:  # raw bytes, decoded by the record's dtype and shape
        return np.ascontiguousarray(tensor_raw(t)).tobytes()
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(t.asnumpy()), allow_pickle=False)
    return buf.getvalue()


class Encoder(ValueEncoder):
    """Turns call arguments into JSON-ready entries; owns the per-call tensor decisions."""

    tensor_types = (Tensor,)

    def __init__(self, session, *, save_tensors: bool, summary_mode: str, tensor_list: list):
        super().__init__(session, save_tensors=save_tensors, summary_mode=summary_mode, tensor_list=tensor_list)

    def framework_value(self, value: Any) -> Any:
        if isinstance(value, mindspore.dtype.Type):
            return {"type": "mindspore.dtype", "value": str(value)}
        if isinstance(value, np.generic):
            return self.encode(value.item(), "", False)
        if isinstance(value, np.ndarray):
            return ndarray_entry(value)
        return NotImplemented

    def _plain(self, v: Any) -> Any:
        if isinstance(v, Tensor):
            return v.asnumpy().item() if v.size == 1 else None
        return super()._plain(v)

    def tensor(self, t: Tensor, data_name_prefix: str, save: bool, *, snapshot: bool = False) -> dict:
        """``snapshot``: copy the value now (the caller is about to modify it in place)."""
        entry: dict = {"type": "mindspore.Tensor", "dtype": str(t.dtype), "shape": list(t.shape)}
        held = t.copy() if (snapshot or isinstance(t, Parameter)) else t
        mode = self.summary_mode
        if mode == "xor":
            entry["md5"] = self._xor(held)
        else:
            entry.update(null_stats())
            self._stats.append((entry, StatHandle(held, mode == "md5")))
            if self.check_overflow and t.dtype in (mindspore.float16, mindspore.float32, mindspore.float64, _BF16):
                self._watch(data_name_prefix, held)
        if t.size or not getattr(self._tls, "in_output", False):
            name = f"{data_name_prefix}.npy"
            if save:
                entry["data_name"] = name
                self._write_tensor(entry, held, name)
            elif self.check_overflow:  # written when the record overflows (_keep)
                self._defer(data_name_prefix, entry, held, name)
        return entry

    def _write_tensor(self, entry: dict, t: Tensor, name: str) -> None:
        self.session.save_tensor(name, lambda c=t: _npy_bytes(c), int(t.nbytes))

    @staticmethod
    def _xor(t: Tensor) -> Optional[str]:
        if t.size == 0:
            return None
        if len(t.shape) == 0:  # (numpy<2's ascontiguousarray makes a 0-d array 1-d: test the tensor)
            v = tensor_numpy(t).item()
            return v if not isinstance(v, int) else f"0x{v & ((1 << 64) - 1):016x}"
        raw = np.ascontiguousarray(tensor_raw(t))
        return f"0x{xor64(raw) & ((1 << 64) - 1):016x}"

    @staticmethod
    def _any_inf_nan(hs: list) -> bool:
        for h in hs:
            a = tensor_numpy(h)
            if a.size and not np.isfinite(a).all():
                return True
        return False
