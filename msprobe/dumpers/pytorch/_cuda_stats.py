"""One fused reduction for the statistics of a contiguous float32/float16/bfloat16 CUDA tensor (Triton).

``raw(t)`` reads ``t`` once: a first kernel gives each of at most ``MAX_PROGRAMS`` programs the
Max, Min (in float32: exact for these dtypes), Sum and sum of squares (float64) of its strided share
of the blocks; a second kernel, one program, folds those partials into one float64 vector
``[Max, Min, Sum / n, sqrt(sum of squares)]`` (all NaN when an element is NaN, as the format says).
Nothing is synchronised: the vector stays on the device, and ``fetch_stats`` rounds Mean and Norm
to the tensor's dtype and fetches it with the other statistics of the same dtype in one transfer.

Used only when Triton imports (it ships with PyTorch's CUDA wheels) and ``MSPROBE_LAKE_NATIVE`` is
not ``0``; otherwise the torch reductions run. The kernels also run under Triton's CPU interpreter
(``TRITON_INTERPRET=1``), which is how tests/dumpers/test_fastpath.py checks them without a GPU.
"""
from __future__ import annotations

from typing import Any

from msprobe.dumpers.fastpath import disabled

__all__ = ["available", "raw", "MAX_PROGRAMS", "BLOCK"]

BLOCK = 1024
MAX_PROGRAMS = 1024
_state: dict = {}


def available() -> bool:
    if "ok" not in _state:
        ok = False
        if not disabled():
            try:
                _build()
                ok = True
            except Exception:  # noqa: BLE001 - no triton, or one that cannot build here: the torch path
                ok = False
        _state["ok"] = ok
    return _state["ok"]


def _build() -> None:
    if "kernels" in _state:
        return
    import triton
    import triton.language as tl

    @triton.jit
    def _partials(x_ptr, p_ptr, n, nprog, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        mx = tl.full([BLOCK], float("-inf"), tl.float32)
        mn = tl.full([BLOCK], float("inf"), tl.float32)
        s = tl.zeros([BLOCK], tl.float64)
        q = tl.zeros([BLOCK], tl.float64)
        for start in range(pid * BLOCK, n, nprog * BLOCK):
            offs = start + tl.arange(0, BLOCK)
            m = offs < n
            x = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32)
            mx = tl.where(m, tl.maximum(mx, x), mx)
            mn = tl.where(m, tl.minimum(mn, x), mn)
            xd = x.to(tl.float64)
            s += xd
            q += xd * xd
        base = p_ptr + pid * 4
        tl.store(base + 0, tl.max(mx, 0).to(tl.float64))
        tl.store(base + 1, tl.min(mn, 0).to(tl.float64))
        tl.store(base + 2, tl.sum(s, 0))
        tl.store(base + 3, tl.sum(q, 0))

    @triton.jit
    def _finish(p_ptr, o_ptr, nprog, n, PB: tl.constexpr):
        i = tl.arange(0, PB)
        m = i < nprog
        mx = tl.max(tl.load(p_ptr + i * 4 + 0, mask=m, other=float("-inf")), 0)
        mn = tl.min(tl.load(p_ptr + i * 4 + 1, mask=m, other=float("inf")), 0)
        s = tl.sum(tl.load(p_ptr + i * 4 + 2, mask=m, other=0.0), 0)
        q = tl.sum(tl.load(p_ptr + i * 4 + 3, mask=m, other=0.0), 0)
        nan = q != q  # x * x is NaN only for a NaN element (never Inf - Inf)
        tl.store(o_ptr + 0, tl.where(nan, q, mx))
        tl.store(o_ptr + 1, tl.where(nan, q, mn))
        tl.store(o_ptr + 2, s / n)
        tl.store(o_ptr + 3, tl.sqrt(q))

    _state["kernels"] = (triton, _partials, _finish)


def raw(t: Any) -> Any:
    """float64 ``[Max, Min, Mean, Norm]`` of contiguous ``t`` (n > 0), unrounded, on t's device."""
    import torch

    triton, partials, finish = _state["kernels"]
    n = t.numel()
    nprog = min(triton.cdiv(n, BLOCK), MAX_PROGRAMS)
    part = torch.empty((nprog, 4), dtype=torch.float64, device=t.device)
    out = torch.empty(4, dtype=torch.float64, device=t.device)
    partials[(nprog,)](t, part, n, nprog, BLOCK=BLOCK)
    finish[(1,)](part, out, nprog, n, PB=triton.next_power_of_2(nprog))
    return out
