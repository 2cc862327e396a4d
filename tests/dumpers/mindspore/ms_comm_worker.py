"""One process of a 2-worker MindSpore CPU cluster (scheduler or worker, by ``MS_ROLE``) that
dumps real collectives at L1; started by ms_test_more.py. Usage: ``ms_comm_worker.py DUMP_ROOT``.

A worker writes ``DUMP_ROOT.result<rank>.json``: what each collective returned and the error
of the collectives the CPU wheel cannot run (``comm_func.all_reduce`` has no CPU kernel in
MindSpore 2.10.0)."""
from __future__ import annotations

import json
import os
import sys

import mindspore
import numpy as np
from mindspore import Tensor
from mindspore.communication import GlobalComm, get_group_size, get_rank, init

mindspore.set_context(mode=mindspore.PYNATIVE_MODE, device_target="CPU")
init()  # the scheduler serves the cluster from here until the workers finish
if os.environ.get("MS_ROLE") == "MS_SCHED":
    sys.exit(0)

import mindspore.mint.distributed as md  # noqa: E402
from mindspore.communication import comm_func  # noqa: E402

from msprobe.mindspore import PrecisionDebugger  # noqa: E402

root = sys.argv[1]
rank, world = get_rank(), get_group_size()
result: dict = {"rank": rank, "world": world}
dbg = PrecisionDebugger(task="statistics", dump_path=root, level="L1")
dbg.start()
x = Tensor(np.array([1.0, 2.0], np.float32) * (rank + 1))
md.all_reduce(x)  # in place: [3, 6] on both ranks
result["all_reduce"] = x.asnumpy().tolist()
y = Tensor(np.array([5.0, 7.0], np.float32) * (rank + 1))
md.broadcast(y, 0)  # in place: rank 0's [5, 7]
result["broadcast"] = y.asnumpy().tolist()
z = Tensor(np.array([1.0, 1.0], np.float32) * (rank + 1))
md.all_reduce(z, async_op=True).wait()  # the dumper waits for it before recording the output
result["all_reduce_async"] = z.asnumpy().tolist()
md.barrier()
gathered = [Tensor(np.zeros(2, np.float32)) for _ in range(world)]
md.all_gather(gathered, Tensor(np.array([1.0, -1.0], np.float32) * (rank + 1)))  # into the list, in place
result["all_gather"] = [t.asnumpy().tolist() for t in gathered]
out = comm_func.broadcast(Tensor(np.array([3.0], np.float32) * (rank + 1)), 0, group=GlobalComm.WORLD_COMM_GROUP)
result["comm_broadcast"] = (out[0] if isinstance(out, tuple) else out).asnumpy().tolist()
try:
    out = comm_func.all_reduce(Tensor(np.ones(2, np.float32)), group=GlobalComm.WORLD_COMM_GROUP)
    out = out[0] if isinstance(out, tuple) else out  # (tensor, handle)
    result["comm_all_reduce"] = out.asnumpy().tolist()  # the kernel error surfaces at the first read
except RuntimeError as exc:
    result["comm_all_reduce_error"] = str(exc).strip().splitlines()[0]
dbg.stop()
dbg.step()
with open(f"{root}.result{rank}.json", "w", encoding="utf-8") as f:
    json.dump(result, f)
