"""Two gloo ranks (127.0.0.1) training a tiny MLP sharded with FSDP2 (``fully_shard``) under the dump.

usage: python _fsdp2_child.py CONFIG   (the debugger before the model, as msprobe's docs show)
"""
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank: int, port: int, config: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from msprobe.pytorch import PrecisionDebugger, seed_all

    seed_all(seed=1234, mode=False)
    debugger = PrecisionDebugger(config_path=config)
    mesh = init_device_mesh("cpu", (2,))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(rank)
    for step in range(2):
        debugger.start(model=model)
        loss = model(torch.randn(2, 8)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        debugger.stop()
        debugger.step()
        print(f"rank {rank} step {step} loss {loss.item():.5f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        free = sock.getsockname()[1]
    mp.spawn(worker, args=(free, os.path.abspath(sys.argv[1])), nprocs=2, join=True)
