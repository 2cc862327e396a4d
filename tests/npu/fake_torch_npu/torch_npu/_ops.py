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


# ------------------------------------------------------------- fusion attention
_LAYOUTS = ("BNSD", "BSND", "BSH", "SBH")


def _to_bnsd(t, layout, heads):
    if layout == "BNSD":
        return t
    if layout == "BSND":
        return aten.permute(t, [0, 2, 1, 3])
    if layout == "BSH":
        b, s, h = t.shape
        return aten.permute(aten.reshape(t, [b, s, heads, h // heads]), [0, 2, 1, 3])
    s, b, h = t.shape  # SBH
    return aten.permute(aten.reshape(t, [s, b, heads, h // heads]), [1, 2, 0, 3])


def _from_bnsd(t, layout):
    b, n, s, d = t.shape
    if layout == "BNSD":
        return aten.clone(t, memory_format=torch.contiguous_format)
    if layout == "BSND":
        return aten.clone(aten.permute(t, [0, 2, 1, 3]), memory_format=torch.contiguous_format)
    if layout == "BSH":
        return aten.reshape(aten.permute(t, [0, 2, 1, 3]), [b, s, n * d])
    return aten.reshape(aten.permute(t, [2, 0, 1, 3]), [s, b, n * d])


def _heads_of(t, layout, head_num, q_hidden):
    if layout in ("BNSD",):
        return t.shape[1]
    if layout == "BSND":
        return t.shape[2]
    return t.shape[2] * head_num // q_hidden  # BSH/SBH: hidden / head_dim


def _fa_inputs(query, key, value, head_num, input_layout):
    if input_layout not in _LAYOUTS:
        raise RuntimeError(f"fake npu_fusion_attention: input_layout {input_layout!r} not implemented")
    n_kv = _heads_of(key, input_layout, head_num, query.shape[-1])
    q = aten._to_copy(_to_bnsd(query, input_layout, head_num), dtype=torch.float32)
    k = aten._to_copy(_to_bnsd(key, input_layout, n_kv), dtype=torch.float32)
    v = aten._to_copy(_to_bnsd(value, input_layout, n_kv), dtype=torch.float32)
    rep = head_num // n_kv
    if rep > 1:  # grouped-query attention
        k, v = aten.repeat_interleave(k, rep, 1), aten.repeat_interleave(v, rep, 1)
    return q, k, v, n_kv, rep


def _fa_scores(q, k, atten_mask, scale):
    s = aten.mul(aten.matmul(q, aten.transpose(k, -1, -2)), scale)
    if atten_mask is not None:  # Ascend convention: True/1 = masked out
        s = aten.masked_fill(s, aten._to_copy(atten_mask, dtype=torch.bool), -1e30)
    return s


def fusion_attention(query, key, value, head_num, input_layout, pse=None, padding_mask=None, atten_mask=None,
                     scale=1.0, keep_prob=1.0, pre_tockens=2147483647, next_tockens=2147483647, inner_precise=0,
                     prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0,
                     gen_mask_parallel=True, sync=False, softmax_layout="", sink=None, dropout_mask=None,
                     seed=0, offset=0):
    if keep_prob != 1.0 or pse is not None or sparse_mode != 0 or sink is not None:
        raise RuntimeError("fake npu_fusion_attention: only keep_prob=1, no pse/sink, sparse_mode=0")
    q, k, v, _, _ = _fa_inputs(query, key, value, head_num, input_layout)
    s = _fa_scores(q, k, atten_mask, scale)
    mx = aten.amax(s, [-1], True)
    e = aten.exp(aten.sub(s, mx))
    sm = aten.sum(e, [-1], True)
    out = aten.matmul(aten.div(e, sm), v)
    b, n, sq, _ = q.shape
    softmax_max = aten.clone(aten.expand(mx, [b, n, sq, 8]), memory_format=torch.contiguous_format)
    softmax_sum = aten.clone(aten.expand(sm, [b, n, sq, 8]), memory_format=torch.contiguous_format)
    attention = aten._to_copy(_from_bnsd(out, input_layout), dtype=query.dtype)
    return attention, softmax_max, softmax_sum, aten.empty([0], dtype=query.dtype), seed, offset, 0


def fusion_attention_grad(query, key, value, dy, head_num, input_layout, *, pse=None, padding_mask=None,
                          atten_mask=None, softmax_max=None, softmax_sum=None, softmax_in=None, attention_in=None,
                          scale_value=1.0, keep_prob=1.0, pre_tockens=2147483647, next_tockens=2147483647,
                          inner_precise=0, seed=0, offset=0, numels=0, prefix=None, actual_seq_qlen=None,
                          actual_seq_kvlen=None, sparse_mode=0, gen_mask_parallel=True, sync=False,
                          softmax_layout="", sink=None):
    q, k, v, n_kv, rep = _fa_inputs(query, key, value, head_num, input_layout)
    s = _fa_scores(q, k, atten_mask, scale_value)
    mx = aten.slice(softmax_max, -1, 0, 1)
    sm = aten.slice(softmax_sum, -1, 0, 1)
    p = aten.div(aten.exp(aten.sub(s, mx)), sm)
    do = aten._to_copy(_to_bnsd(dy, input_layout, head_num), dtype=torch.float32)
    o = aten.matmul(p, v)
    dv = aten.matmul(aten.transpose(p, -1, -2), do)
    dp = aten.matmul(do, aten.transpose(v, -1, -2))
    ds = aten.mul(p, aten.sub(dp, aten.sum(aten.mul(do, o), [-1], True)))
    dq = aten.mul(aten.matmul(ds, k), scale_value)
    dk = aten.mul(aten.matmul(aten.transpose(ds, -1, -2), q), scale_value)
    if rep > 1:
        b, n, skv, d = dk.shape
        dk = aten.sum(aten.reshape(dk, [b, n_kv, rep, skv, d]), [2])
        dv = aten.sum(aten.reshape(dv, [b, n_kv, rep, skv, d]), [2])
    cast = [aten._to_copy(_from_bnsd(t, input_layout), dtype=ref.dtype)
            for t, ref in ((dq, query), (dk, key), (dv, value))]
    return cast[0], cast[1], cast[2], aten.empty([0], dtype=query.dtype), aten.empty([0], dtype=query.dtype)


KERNELS = {
    "npu_rms_norm": rms_norm, "npu_rms_norm_backward": rms_norm_backward,
    "npu_rotary_mul": rotary_mul, "npu_rotary_mul_backward": rotary_mul_backward,
    "npu_swiglu": swiglu, "npu_swiglu_backward": swiglu_backward,
    "npu_fusion_attention": fusion_attention, "npu_fusion_attention_grad": fusion_attention_grad,
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


_FA_ARGS = ("query", "key", "value", "head_num", "input_layout", "pse", "padding_mask", "atten_mask", "scale",
            "keep_prob", "pre_tockens", "next_tockens", "inner_precise", "prefix", "actual_seq_qlen",
            "actual_seq_kvlen", "sparse_mode", "gen_mask_parallel", "sync", "softmax_layout", "sink",
            "dropout_mask", "seed", "offset")


def _fa_setup(ctx, inputs, output):
    a = dict(zip(_FA_ARGS, inputs))
    ctx.save_for_backward(a["query"], a["key"], a["value"], a["atten_mask"] if a["atten_mask"] is not None
                          else None, output[1], output[2])
    ctx.args = {k: a[k] for k in ("head_num", "input_layout", "scale", "keep_prob")}


def _fa_backward(ctx, *grads):
    q, k, v, mask, smax, ssum = ctx.saved_tensors
    a = ctx.args
    dq, dk, dv, _, _ = torch.ops.npu.npu_fusion_attention_grad(
        q, k, v, grads[0], a["head_num"], a["input_layout"], atten_mask=mask, softmax_max=smax, softmax_sum=ssum,
        scale_value=a["scale"], keep_prob=a["keep_prob"])
    return (dq, dk, dv) + (None,) * (len(_FA_ARGS) - 3)


AUTOGRAD = {
    "npu_rms_norm": (_rms_setup, _rms_backward),
    "npu_rotary_mul": (_rot_setup, _rot_backward),
    "npu_swiglu": (_swiglu_setup, _swiglu_backward),
    "npu_fusion_attention": (_fa_setup, _fa_backward),
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
