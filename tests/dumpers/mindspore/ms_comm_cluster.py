"""One process of a 2-worker MindSpore CPU cluster (scheduler or worker, by ``MS_ROLE``; the mccl backend)
that trains nothing but moves activations between the ranks as a pipeline and a data-parallel run do,
under our dumper at L1 (statistics): started by test_mindspore_cluster.py.

usage: ms_comm_cluster.py OUT

Each worker dumps, for each namespace (``ops``: ``mindspore.ops.communication``, ``mint``:
``mindspore.mint.distributed``), two runs of 3 steps, ``OUT/NAMESPACE/none`` (healthy) and
``OUT/NAMESPACE/nan``: at step 1 of ``nan`` rank 1's ``mint.mul`` (``Mint.mul.0.forward``) scales its
activations by NaN. Per step, on each rank::

    h = mint.mul(mint.matmul(x, w), scale)   # the place of the fault (rank 1, step 1)
    broadcast(h, 1)                          # rank 1's activations reach rank 0 (a pipeline's hand-over)
    y = mint.tanh(h)
    all_reduce(y)                            # the ranks' results summed (data parallel)
    mint.sum(y)

(MindSpore 2.10.0's CPU wheel runs these two collectives of both namespaces; its point-to-point send and
recv fail on CPU: ``The group hccl_world_group does not exist``.) The NaN born on rank 1 reaches rank 0
through the broadcast: without communication records, rank 0's records would come first in the step.
"""
from __future__ import annotations

import os
import sys

import mindspore
import numpy as np
from mindspore import Tensor, mint
from mindspore.communication import get_rank, init

mindspore.set_context(mode=mindspore.PYNATIVE_MODE, device_target="CPU")
init()  # the scheduler serves the cluster from here until the workers finish
if os.environ.get("MS_ROLE") == "MS_SCHED":
    sys.exit(0)

import mindspore.mint.distributed as mint_distributed  # noqa: E402
import mindspore.ops.communication as ops_communication  # noqa: E402

from msprobe.mindspore import PrecisionDebugger  # noqa: E402

STEPS, FAULT_STEP, FAULT_RANK = 3, 1, 1

out = sys.argv[1]
rank = get_rank()
w = Tensor(np.linspace(-0.5, 0.5, 16).reshape(4, 4).astype(np.float32))
for namespace, run in [(ns, run) for ns in ("ops", "mint") for run in ("none", "nan")]:
    comm = ops_communication if namespace == "ops" else mint_distributed
    PrecisionDebugger._reset()
    dbg = PrecisionDebugger(task="statistics", dump_path=os.path.join(out, namespace, run), level="L1")
    for step in range(STEPS):
        x = Tensor((np.arange(8, dtype=np.float32).reshape(2, 4) - 3.0) * (0.25 + 0.1 * step + 0.05 * rank))
        bad = run == "nan" and step == FAULT_STEP and rank == FAULT_RANK
        scale = Tensor(np.full((1, 4), np.nan if bad else 1.0, np.float32))
        dbg.start()
        h = mint.mul(mint.matmul(x, w), scale)
        comm.broadcast(h, 1)
        y = mint.tanh(h)
        comm.all_reduce(y)
        mint.sum(y)
        dbg.stop()
        dbg.step()
PrecisionDebugger._reset()
