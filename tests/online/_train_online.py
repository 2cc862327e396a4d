"""A small seeded training run with online_run_ut on, driven by the online tests.

Usage: python _train_online.py CONFIG_JSON STEPS

Prints ``READY`` once the debugger exists and, after the debugger is closed (its
queue drained), one line ``RESULT {json}`` with the APIs whose forward packets were
queued (``forward_counts``) and the sender's counters (``stats``). With WORLD_SIZE, RANK
and MASTER_PORT in the environment it first joins a gloo group on 127.0.0.1 (the packets
then carry that rank).
"""
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from msprobe.pytorch import PrecisionDebugger, seed_all


class Block(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x):
        h = self.ln(x)
        att = torch.softmax(h @ h.transpose(-1, -2) / 4.0, dim=-1)
        h = att @ h
        return x + self.fc2(F.gelu(self.fc1(h)))


def main(argv):
    config, steps = argv[0], int(argv[1])
    if "WORLD_SIZE" in os.environ:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
                                rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    seed_all(7)
    model = nn.Sequential(Block(), nn.Linear(16, 4))
    dbg = PrecisionDebugger(config)
    print("READY", flush=True)
    for _ in range(steps):
        dbg.start()
        x = torch.randn(2, 8, 16)
        y = model(x)
        loss = F.cross_entropy(y.reshape(-1, 4), torch.zeros(16, dtype=torch.long))
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad
                p.grad = None
        dbg.stop()
        dbg.step()
    online = dbg.dumper.online
    PrecisionDebugger._reset()  # closes the dumper: the sender's queue drains, "close" is sent
    print("RESULT " + json.dumps({"forward_counts": online.forward_counts, "stats": online.stats.as_dict()}),
          flush=True)
    if "WORLD_SIZE" in os.environ:
        import torch.distributed as dist

        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
