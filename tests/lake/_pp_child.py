"""A 2-stage pipeline over 2 gloo ranks under our dumper (test_lake_comm): rank 0 runs stage 0 and
sends its activation to rank 1, which receives it into an empty buffer, runs stage 1 and sends
the input gradient back. At step 1 a NaN is born in the middle of rank 1's stage (a
``masked_fill``), and comes back to rank 0 with the gradient. Usage: _pp_child.py OUT_DIR"""
import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank: int, world: int, port: int, out: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    from msprobe.pytorch import PrecisionDebugger

    os.makedirs(out, exist_ok=True)
    cfg = os.path.join(os.path.dirname(out), f"cfg{rank}.json")
    with open(cfg, "w") as f:
        json.dump({"task": "statistics", "dump_path": out, "level": "L1", "rank": [], "step": []}, f)
    dbg = PrecisionDebugger(config_path=cfg)
    first, second = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
    params = list(first.parameters()) + list(second.parameters())
    for step in range(3):
        dbg.start()
        x = torch.randn(4, 8)
        if rank == 0:
            h = second(torch.relu(first(x)))
            dist.send(h.detach(), dst=1)
            g = torch.empty(4, 8)
            dist.recv(g, src=1)
            h.backward(g)
        else:
            a = torch.empty(4, 8)
            dist.recv(a, src=0)
            a.requires_grad_(True)
            h = first(a)
            if step == 1:
                h = h.masked_fill(h > 0.1, float("nan"))
            loss = second(h).pow(2).mean()
            loss.backward()
            dist.send(a.grad, dst=0)
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    p.grad = None
        dbg.stop()
        dbg.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    free = sock.getsockname()[1]
    sock.close()
    mp.spawn(run, args=(2, free, sys.argv[1]), nprocs=2)
