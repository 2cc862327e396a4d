"""One rank of a Megatron-style tensor-parallel x pipeline-parallel forward pass in plain PyTorch
(gloo, 127.0.0.1), dumped by our PrecisionDebugger; with WORLD_SIZE=1 the same model on one card
(tp 1, pp 1: the same module classes, no communication).

Usage: python _tp_pp_child.py DUMP_PATH TP PP [FAULT_RANK] (RANK, WORLD_SIZE, MASTER_PORT, LEVEL (mix), TASK (statistics)
in the environment). A forward and backward pass (the loss: the mean square of the head's output);
the gradients travel back through the stages with send/recv and, as Megatron's copy-to-region
does, the column-parallel input's gradient is all_reduced over the tensor-parallel group. Ranks follow Megatron's order tp-dp-pp: rank = pp_rank * TP + tp_rank. The model:
4 layers of [ColumnParallelLinear -> gelu -> RowParallelLinear (all_reduce of the partial sums)
-> + bias -> residual], split into PP stages of consecutive layers that pass their activations
with send/recv, then a head (a plain Linear on the last stage, replicated over the TP ranks).
Weights are the slices of one full set drawn from a fixed seed, so every layout computes the same
model. FAULT_RANK: that rank scales its shard of layers.2's first weight by 1.5 (a shard fault) and,
on the last stage, shifts its replica of the head's bias (a replica that disagrees)."""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from msprobe.pytorch import PrecisionDebugger

H, LAYERS = 8, 4


def _full(shape: tuple, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 0.3


class _CopyToTP(torch.autograd.Function):
    """Megatron's copy to the tensor-parallel region: identity forward, all_reduce of the input's
    gradient (each rank's is a partial sum) backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        if ctx.group is None:  # one card: nothing to reduce (Megatron bypasses it the same way)
            return grad, None
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class ColumnParallelLinear(nn.Module):
    def __init__(self, full_w: torch.Tensor, full_b: torch.Tensor, tp: int, tp_rank: int, group):
        super().__init__()
        rows = full_w.shape[0] // tp
        self.weight = nn.Parameter(full_w[tp_rank * rows:(tp_rank + 1) * rows].clone())
        self.bias = nn.Parameter(full_b[tp_rank * rows:(tp_rank + 1) * rows].clone())

        self.tp, self.group = tp, group

    def forward(self, x):
        x = _CopyToTP.apply(x, self.group)  # on every layout, as Megatron's copy_to_tensor_model_parallel_region
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    def __init__(self, full_w: torch.Tensor, full_b: torch.Tensor, tp: int, tp_rank: int, group):
        super().__init__()
        cols = full_w.shape[1] // tp
        self.weight = nn.Parameter(full_w[:, tp_rank * cols:(tp_rank + 1) * cols].clone())
        self.bias = nn.Parameter(full_b.clone())
        self.tp, self.group = tp, group

    def forward(self, x):
        partial = F.linear(x, self.weight)
        if self.tp > 1:
            dist.all_reduce(partial, group=self.group)
        return partial + self.bias


class MLP(nn.Module):
    def __init__(self, index: int, tp: int, tp_rank: int, group):
        super().__init__()
        self.fc1 = ColumnParallelLinear(_full((4 * H, H), 10 * index), _full((4 * H,), 10 * index + 1), tp, tp_rank,
                                        group)
        self.fc2 = RowParallelLinear(_full((H, 4 * H), 10 * index + 2), _full((H,), 10 * index + 3), tp, tp_rank,
                                     group)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(x)))


class GPT(nn.Module):
    """The layers of one pipeline stage, named by their index in the stage (as Megatron does)."""

    def __init__(self, first: int, count: int, last_stage: bool, tp: int, tp_rank: int, group):
        super().__init__()
        self.layers = nn.ModuleList(MLP(first + i, tp, tp_rank, group) for i in range(count))
        self.head = None
        if last_stage:
            self.head = nn.Linear(H, 4)
            with torch.no_grad():
                self.head.weight.copy_(_full((4, H), 1000))
                self.head.bias.copy_(_full((4,), 1001))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x) if self.head is not None else x


def main(dump_path: str, tp: int, pp: int, fault_rank: int) -> None:
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    group = None
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
                                rank=rank, world_size=world)
        groups = [dist.new_group([stage * tp + t for t in range(tp)]) for stage in range(pp)]
        group = groups[rank // tp]
    tp_rank, stage = rank % tp, rank // tp
    per_stage = LAYERS // pp
    model = GPT(stage * per_stage, per_stage, stage == pp - 1, tp, tp_rank, group)
    if rank == fault_rank and stage * per_stage <= 2 < (stage + 1) * per_stage:
        with torch.no_grad():
            model.layers[2 - stage * per_stage].fc1.weight.mul_(1.5)
    if rank == fault_rank and model.head is not None:
        with torch.no_grad():
            model.head.bias.add_(0.25)  # a replica of a replicated parameter that disagrees
    dbg = PrecisionDebugger(task=os.environ.get("TASK", "statistics"), level=os.environ.get("LEVEL", "mix"),
                            dump_path=dump_path)
    x = _full((2, 3, H), 7)
    dbg.start(model)
    if stage > 0:
        dist.recv(x, src=rank - tp)
    x.requires_grad_(True)
    out = model(x)
    if stage < pp - 1:
        dist.send(out.detach(), dst=rank + tp)
        grad = torch.empty_like(out)
        dist.recv(grad, src=rank + tp)
        out.backward(grad)
    else:
        out.pow(2).mean().backward()
    if stage > 0:
        dist.send(x.grad, dst=rank - tp)
    dbg.stop()
    dbg.step()
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else -1)
