"""Make the explorer tests' dump pair with our PyTorch dumper: a tiny seeded model, 2 ranks x 3
steps, target and bench identical but for one fault in the target (rank 1, step 1).

``python _make_pair.py OUT [nan|scale] [hostile]``: writes OUT/target and OUT/bench
(``stepS/rankR`` each). ``hostile`` (or ``python _make_pair.py poison OUT`` on a made pair): HTML with
script tags goes into a record name, a dtype and a stack frame.
"""
from __future__ import annotations

import json
import os
import shutil
import sys

import torch
import torch.nn as nn

from msprobe.pytorch import PrecisionDebugger, seed_all

FAULT_STEP, FAULT_RANK = 1, 1
HOSTILE = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def dump(out: str, fault: str, faulty: bool, steps: int = 3) -> None:
    PrecisionDebugger._reset()
    seed_all(0)
    model = Net()
    dbg = PrecisionDebugger(dump_path=out, level="mix", task="statistics", model=model)
    g = torch.Generator().manual_seed(1)
    for s in range(steps):
        x = torch.randn(4, 8, generator=g)
        saved = model.fc2.weight.detach().clone()
        if faulty and s == FAULT_STEP:
            with torch.no_grad():
                if fault == "nan":
                    model.fc2.weight[0, 0] = float("nan")
                else:
                    model.fc2.weight.mul_(100.0)
        dbg.start()
        loss = model(x).pow(2).mean()
        loss.backward()
        dbg.stop()
        dbg.step()
        with torch.no_grad():
            model.fc2.weight.copy_(saved)
        model.zero_grad()
    PrecisionDebugger._reset()


def make(root: str, fault: str = "nan", hostile: bool = False) -> None:
    for side in ("target", "bench"):
        for r in (0, 1):
            tmp = os.path.join(root, "_tmp")
            dump(tmp, fault, side == "target" and r == FAULT_RANK)
            for s in range(3):
                os.makedirs(os.path.join(root, side, f"step{s}"), exist_ok=True)
                shutil.move(os.path.join(tmp, f"step{s}", "rank"), os.path.join(root, side, f"step{s}", f"rank{r}"))
            shutil.rmtree(tmp)
    if hostile:
        for side in ("target", "bench"):
            for s in range(3):
                for r in (0, 1):
                    _poison(os.path.join(root, side, f"step{s}", f"rank{r}"))


def _poison(rank_dir: str, old: str = "Functional.relu.0.forward", new: str = f"Functional.relu{HOSTILE}.0.forward",
            hostile: bool = True) -> None:
    """Rename one API record to hold HTML and put HTML into its stack and a dtype (``hostile=False``:
    only rename it, e.g. to give the bench a record the target does not have)."""
    with open(os.path.join(rank_dir, "dump.json"), encoding="utf-8") as f:
        doc = json.load(f)
    doc["data"] = {(new if k == old else k): v for k, v in doc["data"].items()}
    if hostile:
        doc["data"][new]["input_args"][0]["dtype"] = HOSTILE
    with open(os.path.join(rank_dir, "dump.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f)
    with open(os.path.join(rank_dir, "stack.json"), encoding="utf-8") as f:
        stack = json.load(f)
    for v in stack.values():
        if old in v[0]:
            v[0] = [new if n == old else n for n in v[0]]
            if hostile:
                v[1] = [f"File {HOSTILE}, line 1, in <module>"] + list(v[1])
    with open(os.path.join(rank_dir, "stack.json"), "w", encoding="utf-8") as f:
        json.dump(stack, f)
    cpath = os.path.join(rank_dir, "construct.json")
    with open(cpath, encoding="utf-8") as f:
        construct = json.load(f)
    construct = {(new if k == old else k): v for k, v in construct.items()}
    with open(cpath, "w", encoding="utf-8") as f:
        json.dump(construct, f)


if __name__ == "__main__":
    if sys.argv[1] == "rename":  # rename ROOT: the bench's relu record becomes gelu (each side has one unmatched)
        for s in range(3):
            for r in (0, 1):
                _poison(os.path.join(sys.argv[2], "bench", f"step{s}", f"rank{r}"), "Functional.relu.0.forward",
                        "Functional.gelu.0.forward", hostile=False)
    elif sys.argv[1] == "poison":  # poison ROOT: the hostile text into every rank directory under ROOT
        for side in ("target", "bench"):
            for s in range(3):
                for r in (0, 1):
                    _poison(os.path.join(sys.argv[2], side, f"step{s}", f"rank{r}"))
    else:
        make(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "nan", "hostile" in sys.argv[3:])
