"""PyTorch's PrivateUse1 device, renamed ``npu``, implemented in Python over CPU memory (test-only).

Tensors are true PrivateUse1 tensors: ``torch._C._acc.create_empty_tensor`` makes a storage-less
TensorImpl whose dispatch key set is PrivateUse1/AutogradPrivateUse1 and whose ``.device`` is ``npu:0``;
the storage's Python object carries the CPU tensor holding the values (``.raw``). One boxed Python fallback
registered for the PrivateUse1 key runs every ATen operator on the CPU values and wraps the results,
so autograd, views, in-place version counters and ``x.to("npu")`` / ``.cpu()`` work as on a device.
The ATen view operators that have a CompositeExplicitAutograd kernel (detach, alias, expand, t, ...)
would otherwise build a new TensorImpl in C++ without our values, so they get explicit PrivateUse1
kernels that go through the same fallback.

Known differences from hardware: the TensorImpl always reports contiguous strides (the CPU values
keep the real ones); copies are synchronous. ``stats`` counts device-to-host transfers so tests can
check that the dumper does not sync per statistic, and ``KERNELS`` (when not None) records every
operator run on the device, for the fake kernel dump.
"""
from __future__ import annotations

import threading

import torch
from torch.utils._pytree import tree_map
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

_CPU = torch.device("cpu")
stats = {"d2h": 0}
KERNELS: dict = {"active": None}  # a list while a kernel dump is on
_lock = threading.Lock()


class NpuTensor(torch.Tensor):
    """A PrivateUse1 ("npu") tensor whose values live in the CPU tensor ``raw``."""

    @staticmethod
    def __new__(cls, raw: torch.Tensor):
        res = torch._C._acc.create_empty_tensor(raw.shape, raw.dtype)
        res.__class__ = cls
        return res

    def __init__(self, raw: torch.Tensor):
        # on the storage, not the tensor: autograd's saved tensors and ``.data`` are shallow copies
        # made in C++ (a new TensorImpl, the same storage, whose Python object torch preserves)
        self.untyped_storage().raw = raw

    @property
    def raw(self) -> torch.Tensor:
        return self.untyped_storage().raw

    def __repr__(self) -> str:
        return f"tensor({self.raw.tolist()}, device='npu:0', dtype={self.dtype})"

    __str__ = __repr__
    __torch_function__ = torch._C._disabled_torch_function_impl


def _is_npu(x) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "npu"


def _unwrap(x):
    if _is_npu(x):
        raw = getattr(x.untyped_storage(), "raw", None)
        if raw is None:
            raise RuntimeError("fake npu: an npu tensor without values (built outside the fake backend)")
        return raw
    if isinstance(x, torch.device) and x.type == "npu":
        return _CPU
    if isinstance(x, str) and x.startswith("npu"):
        return "cpu"
    return x


def _wrap(x):
    if isinstance(x, torch.Tensor) and x.device.type == "cpu":
        return NpuTensor(x)
    return x


def _written_arg(op, args, kwargs):
    """The argument an in-place / out= operator returns (its single ``Tensor(a!)`` return)."""
    rets = op._schema.returns
    if len(rets) != 1 or rets[0].alias_info is None or not rets[0].alias_info.is_write:
        return None
    for i, a in enumerate(op._schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            return args[i] if i < len(args) else kwargs.get(a.name)
    return None


def fallback(op, *args, **kwargs):
    name = op.__name__
    rec = KERNELS["active"]
    if name.startswith("_copy_from"):  # copy_ across devices: (src, dst)
        src, dst = args[0], args[1]
        d = _unwrap(dst)
        if name.startswith("_copy_from_and_resize"):
            d.resize_(src.shape)
        if _is_npu(src) and not _is_npu(dst):
            stats["d2h"] += 1
        d.copy_(_unwrap(src))
        return dst
    to_host = False
    dev = kwargs.get("device")
    if dev is not None and torch.device(dev).type == "cpu":
        to_host = True
        stats["d2h"] += 1
    if name.startswith("_local_scalar_dense"):
        stats["d2h"] += 1
    if rec is not None:
        rec.append((op, args, kwargs))
    out = op(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))
    written = _written_arg(op, args, kwargs)
    if written is not None:
        if not _is_npu(written) and any(_is_npu(a) for a in args):
            stats["d2h"] += 1  # copy_(cpu_dst, npu_src)
        return written
    if to_host:
        return out
    return tree_map(_wrap, out)


def _view_ops():
    """ATen operators returning an alias that have a CompositeExplicitAutograd kernel."""
    out = []
    for full in torch._C._dispatch_get_registrations_for_dispatch_key("CompositeExplicitAutograd"):
        ns, _, rest = full.partition("::")
        if ns != "aten":
            continue
        base, _, overload = rest.partition(".")
        try:
            op = getattr(getattr(torch.ops.aten, base), overload or "default")
        except (AttributeError, RuntimeError):
            continue
        rets = op._schema.returns
        if rets and any(r.alias_info is not None and not r.alias_info.is_write for r in rets):
            out.append((rest, op))
    return out


_LIBS: list = []


def setup(device_module) -> None:
    _setup_privateuseone_for_python_backend("npu", backend_module=device_module)
    lib = torch.library.Library("_", "IMPL")
    lib.fallback(fallback, "PrivateUse1")
    views = torch.library.Library("aten", "IMPL")
    for rest, op in _view_ops():
        views.impl(rest, (lambda o: lambda *a, **k: fallback(o, *a, **k))(op), "PrivateUse1")
    _LIBS.extend([lib, views])
