"""One rank of a 4-process torch.distributed (gloo, 127.0.0.1) DistributedDataParallel run,
dumped by our PrecisionDebugger. Usage: python _ddp_child.py DUMP_PATH STEPS (RANK,
WORLD_SIZE and MASTER_PORT in the environment). Each rank trains on its own data; DDP
averages the gradients, so the parameters stay equal on every rank (printed at the end as
``PARAMS <sha256 of the parameters>``)."""
import hashlib
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from msprobe.pytorch import PrecisionDebugger, seed_all


def main(dump_path: str, steps: int) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
                            rank=rank, world_size=world)
    seed_all(7)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))
    dbg = PrecisionDebugger(task="statistics", level="mix", dump_path=dump_path)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own batch
    for _ in range(steps):
        x = torch.randn(6, 8, generator=gen)
        target = torch.randint(0, 4, (6,), generator=gen)
        dbg.start(model)
        loss = F.cross_entropy(model(x), target)
        loss.backward()
        dbg.stop()
        with torch.no_grad():  # plain SGD on the averaged gradients
            for p in model.parameters():
                p -= 0.1 * p.grad
                p.grad = None
        dbg.step()
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    print("PARAMS", digest, flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
