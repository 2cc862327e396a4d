"""The ``npu`` operator namespace of the fake: every public torch_npu operator is defined with the
real wheel's schema (scripts/data/torch_npu_ops.txt); a few get CPU kernels and autograd formulas.

Kernels use ``torch.ops.aten`` only, as compiled kernels would: they never go through the Python
``torch.*`` functions a dumper wraps. They are registered for the CPU key; the PrivateUse1 fallback
moves npu tensors to their CPU values and back.
"""
from __future__ import annotations

import os

import torch

aten = torch.ops.aten
_HERE = os.path.dirname(os.path.abspath(__file__))
OPS_FILE = os.path.join(_HERE, "..", "..", "..", "..", "scripts", "data", "torch_npu_ops.txt")


def read_ops(path: str = OPS_FILE) -> list:
    """(name, kind, schema) lines of the committed schema list."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            name, kind, schema = line.rstrip("\n").split("\t", 2)
            out.append((name, kind, schema))
    return out


# --------------------------------------------------------------------- kernels
def rms_norm(x, gamma, epsilon=1e-6):
    dims = list(range(x.dim() - gamma.dim(), x.dim()))
    xf = aten._to_copy(x, dtype=torch.float32)
    rstd = aten.rsqrt(aten.add(aten.mean(aten.mul(xf, xf), dims, True), epsilon))
    y = aten.mul(aten._to_copy(aten.mul(xf, rstd), dtype=x.dtype), gamma)
    return y, rstd


def rms_norm_backward(dy, x, gamma, rstd):
    dims = list(range(x.dim() - gamma.dim(), x.dim()))
    lead = list(range(0, x.dim() - gamma.dim()))
    xf, dyf, gf = (aten._to_copy(t, dtype=torch.float32) for t in (x, dy, gamma))
    xhat = aten.mul(xf, rstd)
    dgamma = aten.sum(aten.mul(dyf, xhat), lead) if lead else aten.mul(dyf, xhat)
    dxhat = aten.mul(dyf, gf)
    proj = aten.mean(aten.mul(dxhat, xhat), dims, True)
    dx = aten.mul(rstd, aten.sub(dxhat, aten.mul(xhat, proj)))
    return aten._to_copy(dx, dtype=x.dtype), aten._to_copy(dgamma, dtype=gamma.dtype)


def _rotate_half(x):
    a, b = aten.chunk(x, 2, -1)
    return aten.cat([aten.neg(b), a], -1)


def _unrotate_half(g):
    a, b = aten.chunk(g, 2, -1)
    return aten.cat([b, aten.neg(a)], -1)


def rotary_mul(x, r1, r2, rotary_mode="half", rotate=None):
    if rotary_mode != "half":
        raise RuntimeError(f"fake npu_rotary_mul: rotary_mode {rotary_mode!r} not implemented")
    return aten.add(aten.mul(x, r1), aten.mul(_rotate_half(x), r2))


def _reduce_to(g, shape):
    dims = [i for i, (a, b) in enumerate(zip(g.shape, shape)) if b == 1 and a != 1]
    return aten.sum(g, dims, True) if dims else g


def rotary_mul_backward(grad, x, r1, r2, rotary_mode="half"):
    dx = aten.add(aten.mul(grad, r1), _unrotate_half(aten.mul(grad, r2)))
    dr1 = _reduce_to(aten.mul(grad, x), r1.shape)
    dr2 = _reduce_to(aten.mul(grad, _rotate_half(x)), r2.shape)
    return dx, dr1, dr2


def swiglu(x, dim=-1):
    a, b = aten.chunk(x, 2, dim)
    return aten.mul(aten.silu(a), b)


def swiglu_backward(grad_output, x, dim=-1):
    a, b = aten.chunk(x, 2, dim)
    s = aten.sigmoid(a)
    silu = aten.mul(a, s)
    dsilu = aten.mul(s, aten.add(aten.mul(a, aten.rsub(s, 1)), 1))
    return aten.cat([aten.mul(aten.mul(grad_output, b), dsilu), aten.mul(grad_output, silu)], dim)


KERNELS = {
    "npu_rms_norm": rms_norm, "npu_rms_norm_backward": rms_norm_backward,
    "npu_rotary_mul": rotary_mul, "npu_rotary_mul_backward": rotary_mul_backward,
    "npu_swiglu": swiglu, "npu_swiglu_backward": swiglu_backward,
}


# -------------------------------------------------------------------- autograd
def _zeros_if_none(g, like):
    return g if g is not None else aten.zeros_like(like)


def _rms_setup(ctx, inputs, output):
    x, gamma = inputs[0], inputs[1]
    ctx.save_for_backward(x, gamma, output[1])


def _rms_backward(ctx, dy, drstd):
    x, gamma, rstd = ctx.saved_tensors
    dx, dgamma = torch.ops.npu.npu_rms_norm_backward(_zeros_if_none(dy, x), x, gamma, rstd)
    return dx, dgamma, None


def _rot_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:3])
    ctx.mode = inputs[3] if len(inputs) > 3 else "half"


def _rot_backward(ctx, grad):
    x, r1, r2 = ctx.saved_tensors
    dx, dr1, dr2 = torch.ops.npu.npu_rotary_mul_backward(grad, x, r1, r2, ctx.mode)
    return dx, dr1, dr2, None, None


def _swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.dim = inputs[1] if len(inputs) > 1 else -1


def _swiglu_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return torch.ops.npu.npu_swiglu_backward(grad, x, ctx.dim), None


AUTOGRAD = {
    "npu_rms_norm": (_rms_setup, _rms_backward),
    "npu_rotary_mul": (_rot_setup, _rot_backward),
    "npu_swiglu": (_swiglu_setup, _swiglu_backward),
}

_LIBS: list = []


def define_all() -> list:
    """Define every operator of the list in the ``npu`` namespace; returns the public names."""
    lib = torch.library.Library("npu", "DEF")
    _LIBS.append(lib)
    public = []
    for name, kind, schema in read_ops():
        if not schema:
            continue
        lib.define(schema)
        if kind == "public":
            public.append(name)
    for name, fn in KERNELS.items():
        lib.impl(name, fn, "CPU")
    for name, (setup, backward) in AUTOGRAD.items():
        torch.library.register_autograd(f"npu::{name}", backward, setup_context=setup, lib=lib)
    return public
