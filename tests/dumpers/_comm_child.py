"""Every torch.distributed API with a receive buffer, blocking and asynchronous, on gloo ranks over
127.0.0.1 under PrecisionDebugger (statistics, L1): our dumper or the real tool, whichever
``msprobe`` imports. Receive buffers start full of 7777 (a stand-in for uninitialised memory).

usage: python _comm_child.py DUMP_PATH PORT WORLD
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

JUNK = 7777.0


def junk(*shape):
    return torch.full(shape, JUNK)


def blocking(rank, world, v):
    if rank == 0:
        dist.send(torch.full((4,), v), dst=1)
    elif rank == 1:
        b = junk(4)
        dist.recv(b, src=0)
    t = torch.full((4,), v)
    dist.all_reduce(t)
    dist.all_gather([junk(4) for _ in range(world)], torch.full((4,), v))
    dist.all_gather_into_tensor(junk(4 * world), torch.full((4,), v))
    dist._all_gather_base(junk(4 * world), torch.full((4,), v))
    dist.reduce_scatter_tensor(junk(4), torch.full((4 * world,), v))
    dist._reduce_scatter_base(junk(4), torch.full((4 * world,), v))
    dist.reduce_scatter(junk(4), [torch.full((4,), v) for _ in range(world)])
    dist.all_to_all_single(junk(4 * world), torch.full((4 * world,), v))
    b = torch.full((4,), v) if rank == 0 else junk(4)
    dist.broadcast(b, src=0)
    dist.scatter(junk(4), [torch.full((4,), 10.0 + i) for i in range(world)] if rank == 0 else None, src=0)
    dist.gather(torch.full((4,), v), [junk(4) for _ in range(world)] if rank == 0 else None, dst=0)
    dist.reduce(torch.full((4,), v), dst=0)


def asynchronous(rank, world, v):
    # the receive buffer is read before (maybe still junk) and after the wait (the data): the
    # statistics cache must not hand the first to the second (gloo bumps no _version)
    if rank == 0:
        dist.isend(torch.full((4,), v), dst=1).wait()
    elif rank == 1:
        b = torch.zeros(4)
        w = dist.irecv(b, src=0)
        b.mul(1)
        w.wait()
        b.add(0)
    t = torch.full((4,), v)
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    t.add(0)
    o = junk(4 * world)
    dist.all_gather_into_tensor(o, torch.full((4,), v), async_op=True).wait()
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    ops = [dist.P2POp(dist.isend, torch.full((4,), v), nxt), dist.P2POp(dist.irecv, junk(4), prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()


def singles(rank, world, v):
    """torch 2.13's names that its deprecation notices of the two calls above point to (not wrapped by
    26.2.0: run for ours only, ``COMM_SINGLE=1``)."""
    dist.all_gather_single(junk(4 * world), torch.full((4,), v))
    dist.reduce_scatter_single(junk(4), torch.full((4 * world,), v))


def body(rank, world, dump, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = port
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from msprobe.pytorch import PrecisionDebugger

    dbg = PrecisionDebugger(task="statistics", level="L1", dump_path=dump)
    sub = dist.new_group([0, world - 1])
    v = float(rank + 1)
    dbg.start()
    blocking(rank, world, v)
    asynchronous(rank, world, v)
    if os.environ.get("COMM_SINGLE") == "1":
        singles(rank, world, v)
    if rank in (0, world - 1):
        t = torch.full((4,), v)
        dist.all_reduce(t, group=sub)
        b = torch.full((4,), v) if rank == world - 1 else junk(4)
        dist.broadcast(b, src=world - 1, group=sub)
    dist.barrier()
    dbg.stop()
    dbg.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    world = int(sys.argv[3])
    mp.spawn(body, args=(world, sys.argv[1], sys.argv[2]), nprocs=world)
