"""The model of ms_layouts_cluster.py written in PyTorch, on one process with the same full weights and
batches: the cross-framework bench of a MindSpore parallel run (issue 47 item 4; docs/compare.md "Across
frameworks"), started by test_mindspore_layouts.py in the main environment. Dumped by our PyTorch
PrecisionDebugger (statistics, level mix); forward, backward and SGD inside the window, 2 steps.

usage: pt_layouts_single.py OUT      (writes OUT/healthy and OUT/healthy.rank0.json: the losses)
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

H, FFN, OUT, SEQ, BATCH, LAYERS, STEPS, LR = 8, 16, 4, 3, 4, 2, 2, 0.1


def _full(shape: tuple, seed: int) -> torch.Tensor:
    return torch.from_numpy((np.random.default_rng(seed).standard_normal(shape) * 0.3).astype(np.float32))


class ColumnParallelLinear(nn.Module):
    def __init__(self, number: int):
        super().__init__()
        self.weight = nn.Parameter(_full((FFN, H), 10 * number))
        self.bias = nn.Parameter(torch.zeros(FFN))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    def __init__(self, number: int):
        super().__init__()
        self.weight = nn.Parameter(_full((H, FFN), 10 * number + 2))
        self.bias = nn.Parameter(torch.zeros(H))

    def forward(self, x):
        return torch.add(F.linear(x, self.weight), self.bias)


class Block(nn.Module):
    def __init__(self, number: int):
        super().__init__()
        self.linear_fc1 = ColumnParallelLinear(number)
        self.linear_fc2 = RowParallelLinear(number)

    def forward(self, x):
        h = self.linear_fc1(x).masked_fill(torch.zeros(BATCH, SEQ, FFN, dtype=torch.bool), 0.0)
        return torch.add(x, self.linear_fc2(F.gelu(h)))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Block(n) for n in range(LAYERS)])
        self.head = nn.Linear(H, OUT)
        with torch.no_grad():
            self.head.weight.copy_(_full((OUT, H), 1000))
            self.head.bias.zero_()

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def main(out: str) -> None:
    from msprobe.pytorch import PrecisionDebugger

    torch.set_num_threads(1)
    net = Model()
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    dbg = PrecisionDebugger(task="statistics", dump_path=os.path.join(out, "healthy"), level="mix")
    losses = []
    for step in range(STEPS):
        g = np.random.default_rng(100 + step)
        x = torch.from_numpy(g.standard_normal((BATCH, SEQ, H)).astype(np.float32))
        y = torch.from_numpy(g.standard_normal((BATCH, SEQ, OUT)).astype(np.float32))
        opt.zero_grad()
        dbg.start(net)
        loss = torch.mean(torch.square(torch.sub(net(x), y)))
        loss.backward()
        opt.step()
        dbg.stop()
        dbg.step()
        losses.append(float(loss.detach()))
    with open(os.path.join(out, "healthy.rank0.json"), "w", encoding="utf-8") as f:
        json.dump({"losses": losses}, f)


if __name__ == "__main__":
    main(sys.argv[1])
