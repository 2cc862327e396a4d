"""One process of a MindSpore run written with Megatron's habits, tensor (and data) parallel on a MindSpore
CPU cluster (the mccl backend; a scheduler and the workers, by ``MS_ROLE``), or, with ``--single``, the same
model on one process: the layouts of spec/FORMAT.md section 26 with MindSpore's own records (issue 47 item 4).
Started by test_mindspore_layouts.py (and bench/bench_ms_layouts.py).

usage: ms_layouts_cluster.py OUT [--tp T] [--dp D] [--single] [--runs healthy,nan,scale] [--comm mint,ops]

The model: ``layers.<i>`` blocks of ColumnParallelLinear (Megatron's copy-to-region: identity forward,
``all_reduce`` of the input's gradient backward; a weight shard ``[FFN/T, H]``, a bias shard initialised to
zero) -> ``Tensor.masked_fill`` (the NaN fault's site) -> gelu -> RowParallelLinear (a weight shard
``[H, FFN/T]``, reduce-from-region: ``all_reduce`` of the partial sums forward, identity backward, then a
zero bias) -> residual, and a replicated head (a ``Dense`` on every tensor-parallel rank). The weights are
slices of one full set drawn from a fixed seed; the single card holds the full set and runs the region
Cells as the identity (Megatron's tp=1). Each data-parallel replica trains on its slice of the batch, its
loss the mean over that slice; its gradients are scaled by 1/D and ``all_reduce``d over the replica group
(Megatron's DDP). ``mindspore.value_and_grad`` and an SGD step run between ``dbg.start()`` and
``dbg.stop()`` (statistics, level mix), 2 steps.

The collectives are ``mindspore.mint.distributed``'s (``--comm mint``: records ``MintDistributed.*``) or
``mindspore.ops.communication``'s (``--comm ops``: ``Communication.*``), both in place. With data
parallelism each rank makes its TP and DP groups (``new_group``, mccl); with TP alone the ``mint`` runs
call their collectives without a group (the default group) and the ``ops`` runs name one of every rank
(``new_group``): the two ways a user writes it. Ranks follow
Megatron's ``tp-dp`` order (rank = dp * T + tp). Each run goes to ``OUT/<comm>/<run>`` (the single card's,
which calls no collective, to ``OUT/<run>``):

* ``healthy``;
* ``nan``: at step 1, rank 1 (tp rank 1 of replica 0) writes a NaN into one element of layer 0's
  column-parallel output: ``Tensor.masked_fill.0.forward`` (every rank calls it every step, the mask all
  False elsewhere);
* ``scale``: before step 1, rank 1's shard of layer 0's ``linear_fc1`` weight is multiplied by 1.05: the
  first record consuming it is its ``MintFunctional.linear.0.forward``.

Each process writes ``<its run's folder>.rank<r>.json``: its rank, coordinates, the loss of each step and the
parameters' checksums (sum of absolute values) after the last step.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import mindspore
import numpy as np
from mindspore import Parameter, Tensor, mint, nn, ops

H, FFN, OUT, SEQ, BATCH, LAYERS, STEPS, LR = 8, 16, 4, 3, 4, 2, 2, 0.1
FAULT_STEP, FAULT_RANK, FAULT_LAYER = 1, 1, 0

mindspore.set_context(mode=mindspore.PYNATIVE_MODE, device_target="CPU")


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--single", action="store_true", help="one process, the full model (tp = dp = 1)")
    p.add_argument("--runs", default="healthy,nan,scale")
    p.add_argument("--comm", default="mint", help="the collectives' namespaces, in turn: mint, ops")
    return p.parse_args()


args = _args()
if args.single:
    rank, world, tp, dp = 0, 1, 1, 1
else:
    from mindspore.communication import get_group_size, get_rank, init

    init()  # the scheduler serves the cluster from here until the workers finish
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        sys.exit(0)
    rank, world, tp, dp = get_rank(), get_group_size(), args.tp, args.dp
    if tp * dp != world:
        raise SystemExit(f"tp {tp} x dp {dp} is not the cluster's {world} workers")

import mindspore.mint.distributed as dist  # noqa: E402
import mindspore.ops.communication as ops_comm  # noqa: E402

from msprobe.mindspore import PrecisionDebugger  # noqa: E402

tp_rank, dp_rank = rank % tp, rank // tp
GROUPS: dict = {"tp": None, "dp": None}  # None: the default group, every rank
if tp > 1 and dp > 1:  # a rank makes the groups it is in (mccl on CPU)
    GROUPS["tp"] = dist.new_group([dp_rank * tp + t for t in range(tp)], backend="mccl")
    GROUPS["dp"] = dist.new_group([d * tp + tp_rank for d in range(dp)], backend="mccl")
#: TP alone: the ops runs name their group (every rank, made by new_group), the mint runs take the default
WORLD_GROUP = dist.new_group(list(range(world)), backend="mccl") if tp > 1 and dp == 1 else None
USE_TP, USE_DP = tp > 1, dp > 1
COMM = [dist]  # the namespace of the run in progress


def _all_reduce(x: Tensor, group) -> None:
    """``x`` summed over ``group`` in place (None: the default group, every rank)."""
    if group is None:
        COMM[0].all_reduce(x)
    else:
        COMM[0].all_reduce(x, group=group)


def _full(shape: tuple, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * 0.3).astype(np.float32)


class CopyToRegion(nn.Cell):
    """Megatron's copy to the tensor-parallel region: identity forward, the gradient all_reduced backward."""

    def construct(self, x):
        return x

    def bprop(self, x, out, dout):
        if USE_TP:
            _all_reduce(dout, GROUPS["tp"])
        return (dout,)


class ReduceFromRegion(nn.Cell):
    """Megatron's reduce from the region: the partial sums all_reduced forward, identity backward."""

    def construct(self, x):
        if USE_TP:
            _all_reduce(x, GROUPS["tp"])
        return x

    def bprop(self, x, out, dout):
        return (dout,)


class ColumnParallelLinear(nn.Cell):
    def __init__(self, number: int):
        super().__init__()
        rows = FFN // tp
        full = _full((FFN, H), 10 * number)
        self.weight = Parameter(Tensor(full[tp_rank * rows:(tp_rank + 1) * rows].copy()), name=f"fc1_w{number}")
        self.bias = Parameter(Tensor(np.zeros(rows, np.float32)), name=f"fc1_b{number}")
        self.copy = CopyToRegion()

    def construct(self, x):
        return mint.nn.functional.linear(self.copy(x), self.weight, self.bias)


class RowParallelLinear(nn.Cell):
    def __init__(self, number: int):
        super().__init__()
        cols = FFN // tp
        full = _full((H, FFN), 10 * number + 2)
        self.weight = Parameter(Tensor(full[:, tp_rank * cols:(tp_rank + 1) * cols].copy()), name=f"fc2_w{number}")
        self.bias = Parameter(Tensor(np.zeros(H, np.float32)), name=f"fc2_b{number}")
        self.reduce = ReduceFromRegion()

    def construct(self, x):
        return mint.add(self.reduce(mint.nn.functional.linear(x, self.weight)), self.bias)


MASKS: dict = {}


class Block(nn.Cell):
    def __init__(self, number: int):
        super().__init__()
        self.number = number
        self.linear_fc1 = ColumnParallelLinear(number)
        self.linear_fc2 = RowParallelLinear(number)

    def construct(self, x):
        mask, fill = MASKS[self.number]
        h = self.linear_fc1(x).masked_fill(mask, fill)
        return mint.add(x, self.linear_fc2(ops.gelu(h)))


class Model(nn.Cell):
    def __init__(self):
        super().__init__()
        self.layers = nn.CellList([Block(n) for n in range(LAYERS)])
        head = nn.Dense(H, OUT, has_bias=True)  # replicated over the tensor-parallel ranks
        head.weight.set_data(Tensor(_full((OUT, H), 1000)))
        head.bias.set_data(Tensor(np.zeros(OUT, np.float32)))
        self.head = head

    def construct(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _batch(step: int) -> tuple:
    g = np.random.default_rng(100 + step)
    x = g.standard_normal((BATCH, SEQ, H)).astype(np.float32)
    y = g.standard_normal((BATCH, SEQ, OUT)).astype(np.float32)
    per = BATCH // dp
    return Tensor(x[dp_rank * per:(dp_rank + 1) * per].copy()), Tensor(y[dp_rank * per:(dp_rank + 1) * per].copy())


def train(out: str, run: str) -> dict:
    net = Model()
    params = net.trainable_params()
    opt = nn.SGD(params, learning_rate=LR)

    def forward(x, y):
        return mint.mean(mint.square(mint.sub(net(x), y)))

    grad_fn = mindspore.value_and_grad(forward, None, opt.parameters)
    PrecisionDebugger._reset()
    dbg = PrecisionDebugger(task="statistics", dump_path=os.path.join(out, run), level="mix")
    losses = []
    per = BATCH // dp
    for step in range(STEPS):
        faulted = run != "healthy" and step == FAULT_STEP and rank == FAULT_RANK
        for n in range(LAYERS):
            mask = np.zeros((per, SEQ, FFN // tp), bool)
            fill = 0.0
            if faulted and run == "nan" and n == FAULT_LAYER:
                mask.reshape(-1)[1] = True
                fill = float("nan")
            MASKS[n] = (Tensor(mask), fill)
        if faulted and run == "scale":
            w = net.layers[FAULT_LAYER].linear_fc1.weight
            w.set_data(Tensor(w.asnumpy() * np.float32(1.05)))
        x, y = _batch(step)
        dbg.start(net)
        loss, grads = grad_fn(x, y)
        if USE_DP:  # Megatron's DDP: each replica's gradients scaled by 1/D, summed over the replicas
            grads = tuple(mint.mul(g, 1.0 / dp) for g in grads)
            for g in grads:
                _all_reduce(g, GROUPS["dp"])
        opt(grads)
        dbg.stop()
        dbg.step()
        losses.append(float(loss.asnumpy()))
    PrecisionDebugger._reset()
    return {"rank": rank, "world": world, "tp": tp, "dp": dp, "coords": {"tp": tp_rank, "dp": dp_rank},
            "losses": losses, "params": {p.name: float(np.abs(p.asnumpy()).sum()) for p in params}}


for comm_name in ["-"] if args.single else args.comm.split(","):
    COMM[0] = ops_comm if comm_name == "ops" else dist
    if WORLD_GROUP is not None:
        GROUPS["tp"] = WORLD_GROUP if comm_name == "ops" else None
    root = args.out if args.single else os.path.join(args.out, comm_name)
    for run_name in args.runs.split(","):
        side = train(root, run_name)
        with open(os.path.join(root, f"{run_name}.rank{rank}.json"), "w", encoding="utf-8") as f:
            json.dump(side, f)
