"""A training run that the crash tests kill with SIGKILL (run as a script)."""
import json
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from msprobe.pytorch import PrecisionDebugger, seed_all


def main():
    dump_path, task, steps, storage_options = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
    extra = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}  # more config (e.g. the Zarr tensor store)
    seed_all(3)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16), nn.LayerNorm(16), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dbg = PrecisionDebugger(task=task, level="mix", dump_path=dump_path, storage_options=storage_options or None,
                            journal_flush=1, **extra)
    print("READY", flush=True)
    for step in range(steps):
        x = torch.randn(8, 16)
        dbg.start(model)
        for _ in range(5):
            y = model(x)
            loss = F.cross_entropy(y, torch.zeros(8, dtype=torch.long))
            loss.backward()
        opt.step()
        opt.zero_grad()
        dbg.stop()
        dbg.step()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
