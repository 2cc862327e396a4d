"""A tiny causal attention model dumped with our PyTorch dumper (issue 41, item 6): every step's
attention mask is ``masked_fill(triu, -inf)`` fed to ``scaled_dot_product_attention``, as in every
causal LM; the target's ``proj`` weight is scaled by ``SCALE`` from step ``FAULT_STEP`` on.

``python _make_causal.py OUT``: writes OUT/target and OUT/bench (``stepS/rank`` each, 3 steps).
"""
from __future__ import annotations

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from msprobe.pytorch import PrecisionDebugger, seed_all

FAULT_STEP, SCALE, STEPS = 2, 1.02, 3


class Causal(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        t = x.shape[1]
        mask = torch.zeros(t, t).masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.proj(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def dump(out: str, faulty: bool) -> None:
    PrecisionDebugger._reset()
    seed_all(0)
    dbg = PrecisionDebugger(dump_path=out, level="mix", task="statistics")
    model = Causal()
    gen = torch.Generator().manual_seed(1)
    for step in range(STEPS):
        if faulty and step == FAULT_STEP:
            with torch.no_grad():
                model.proj.weight.mul_(SCALE)
        x = torch.randn(2, 5, 8, generator=gen)
        dbg.start(model)
        model(x).sum().backward()
        dbg.stop()
        dbg.step()
        model.zero_grad()


if __name__ == "__main__":
    dump(f"{sys.argv[1]}/target", True)
    dump(f"{sys.argv[1]}/bench", False)
