"""Megatron-habits training runs for the layouts benchmark (bench/bench_layouts.py) and its small
version in the tests: one rank of a model written in plain PyTorch the way Megatron writes it,
on gloo over 127.0.0.1, dumped by our PrecisionDebugger (statistics; level mix by default).

The model (``GPTModel``): ``decoder.layers.<i>`` blocks of ``mlp.linear_fc1``
(ColumnParallelLinear) -> masked_fill (the NaN fault's site) -> gelu -> ``mlp.linear_fc2``
(RowParallelLinear, ``all_reduce`` of the partial sums, then its bias) -> residual, and a
replicated ``output_layer`` (a plain linear on the last stage, the same on every tensor-parallel
rank). Megatron's habits:

* the column-parallel input goes through Megatron's copy-to-region (identity forward,
  ``all_reduce`` of the input gradient backward); the row-parallel output through its
  reduce-from-region (``all_reduce`` forward, identity backward);
* every bias initialised to **zero**; the weights are slices of one full set drawn from a fixed
  seed, so every layout computes the same model;
* 2 micro-batches with gradient accumulation, the loss of each ``mse / micro-batches``; pipeline
  stages exchange activations and gradients with isend/irecv (waited at once, as Megatron's
  p2p_communication does) in Megatron's 1F1B order, or, with ``vpp`` > 1, its interleaved order
  (each rank holds ``vpp`` model chunks of non-consecutive layers: chunk ``c`` of pipeline rank
  ``p`` holds the layers of virtual stage ``c * pp + p``);
* data parallel: each replica on its slice of the global batch (micro-batch ``m`` of the single
  card is the concatenation along the batch of every replica's micro-batch ``m``); gradients
  scaled by ``1/DP`` and ``all_reduce``d over the data-parallel group (Megatron's DDP);
* a static loss scaler (``loss * scale`` backward, the gradients unscaled), Megatron's
  ``clip_grad_norm`` (the squared norms of the rank's gradients, tensor-parallel duplicates
  counted on tp rank 0 only, ``all_reduce``d over the model-parallel group), and the optimizer
  (SGD, or Adam) step: all between ``dbg.start()`` and ``dbg.stop()``, ``dbg.step()`` per step.

MoE (``--experts E``, expert parallel ``--ep``): every layer's MLP is Megatron's MoE layer
(:func:`_moe_layer`: router, all-to-all token dispatcher, ``mlp.experts.local_experts.<i>``), the
expert-parallel groups being ep consecutive data-parallel ranks of a pipeline stage with the same tp
rank (dp divisible by ep; ep rank = dp rank mod ep; with tp > 1, Megatron's expert tensor parallelism
equal to tp and ``--sp``: each tp rank routes its piece of the sequence, the token counts gathered
over tp x ep, the tokens an expert-parallel rank receives gathered over its tp group (an uneven
``all_gather``, padded unseen for gloo), each expert's fc1 rows and fc2 columns on each tp rank, its
partial sums ``reduce_scatter``ed back (list form)): each rank holds E/ep experts (global expert ``ep_rank * E/ep + i``) and
its share of the batch; an expert's gradient is all_reduced over its expert data-parallel group
(the dp/ep ranks holding the same experts; one rank when ep == dp), never over the expert-parallel
one; the clip adds the
experts' squared norms all_reduced over the experts' model-parallel group (the expert-parallel ranks
of every stage: Megatron's tp-ep-pp); the optimizer steps the dense
parameters, then the experts' (Megatron's chained optimizer). Its faults (``--fault-expert`` G, a
global expert the fault's rank holds) are in that expert: its ``masked_fill`` (site
``L<layer>.E<G>.mb<m>.mask``) or its fc1 weight (``L<layer>.E<G>.mb0.fc1``).

Ranks follow Megatron's order ``tp-dp-pp`` (the first varies fastest: rank = (pp * DP + dp) * TP
+ tp) or any ``--order`` of tp, dp, pp. With WORLD_SIZE=1 (tp = pp = dp = vpp = 1) it is the
single-card baseline: the same model with the full weights on the whole global batch, equal to
every layout up to the reordering of float sums.

Faults (``--fault nan|scale`` at ``--fault-step`` on global ``--fault-rank``, in global layer
``--fault-layer``, which that rank must hold):

* ``nan``: every block calls ``h.masked_fill(mask, fill)`` on its column-parallel output at every
  step, ``mask`` all False and ``fill`` 0.0 (nothing changes) but at the fault's (step, rank,
  layer, micro-batch ``--fault-mb``), where one element of the mask is True and ``fill`` is NaN:
  the injected record is that rank's ``Tensor.masked_fill.<k>.forward``;
* ``scale``: that rank's shard of the layer's ``linear_fc1.weight`` is multiplied by 1.05 before
  the fault step (it stays so): the injected record is the first record consuming it on that
  rank, micro-batch 0's ``Functional.linear.<k>.forward`` of that layer's fc1 (its module record
  named beside it).

Each rank writes a sidecar ``TRUTH/rank<r>.json`` (see :func:`main`): its coordinates, the loss
of each step (last pipeline stage), the local record name of every site (``L<layer>.mb<m>.mask``:
the masked_fill, ``L<layer>.mb<m>.fc1``: fc1's linear, ``L<layer>.mb<m>.fc1.module``: its module
record) per step, and the injected fault (step, local record names, rank) or null. A site's
logical name is the single card's record name of the same site.

    RANK=r WORLD_SIZE=n MASTER_PORT=p python bench/megatron_layouts.py DUMP TRUTH --tp 2 --pp 2 [...]

or :func:`launch` (every rank, as subprocesses).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any, Optional

H, FFN, OUT, SEQ = 8, 32, 4, 3
SEQ_LEN = [SEQ]  # --seq
LAYERS = 4
GLOBAL_BATCH = 4
MICRO_BATCHES = 2
LOSS_SCALE = 1024.0
DIMS = ("tp", "dp", "pp")
HEADS = 2  # --attn: attention heads (split over tp)


# -- layout arithmetic (pure) -----------------------------------------------------------------------

def rank_of(coords: dict, sizes: dict, order: tuple) -> int:
    """Global rank of ``coords`` ({tp, dp, pp}) under ``order`` (the first dimension varies fastest)."""
    rank, stride = 0, 1
    for dim in order:
        rank += coords.get(dim, 0) * stride
        stride *= sizes.get(dim, 1)
    return rank


def coords_of(rank: int, sizes: dict, order: tuple) -> dict:
    out, rest = {}, rank
    for dim in order:
        out[dim] = rest % sizes.get(dim, 1)
        rest //= sizes.get(dim, 1)
    return out


def parse_order(text: str) -> tuple:
    """The rank order; context parallelism (cp), when the order leaves it out, right after tp
    (Megatron's tp-cp-ep-dp-pp)."""
    order = tuple(text.split("-"))
    if "cp" not in order and "tp" in order:
        order = order[:order.index("tp") + 1] + ("cp",) + order[order.index("tp") + 1:]
    if sorted(order) != sorted(DIMS + ("cp",)):
        raise SystemExit(f"--order must name each of tp, dp, pp (and cp) once, not {text!r}")
    return order


def cp_chunks(cp_rank: int, cp: int) -> tuple:
    """Megatron's load-balanced context parallelism: the sequence in 2 x cp chunks, rank r holding
    chunks r and 2 x cp - 1 - r (a causal mask's work evenly shared)."""
    return (cp_rank, 2 * cp - 1 - cp_rank) if cp > 1 else (0,)


def cp_positions(cp_rank: int, cp: int, seq: int) -> list:
    """The global sequence positions of context-parallel rank ``cp_rank``'s tokens, in its order."""
    if cp == 1:
        return list(range(seq))
    size = seq // (2 * cp)
    return [chunk * size + i for chunk in cp_chunks(cp_rank, cp) for i in range(size)]


def chunk_layers(pp_rank: int, chunk: int, pp: int, vpp: int) -> list:
    """Global layer indices of model chunk ``chunk`` of pipeline rank ``pp_rank`` (Megatron's
    interleaving: virtual stage ``chunk * pp + pp_rank``)."""
    per = LAYERS // (pp * vpp)
    first = (chunk * pp + pp_rank) * per
    return list(range(first, first + per))


def stage_ranks(sizes: dict, order: tuple, pp_rank: int, dp_rank: int, cp_rank: int = 0) -> list:
    """The ranks of pipeline stage ``pp_rank`` of data-parallel replica ``dp_rank`` and context-parallel
    rank ``cp_rank`` (its tp group)."""
    return [rank_of({"tp": t, "cp": cp_rank, "dp": dp_rank, "pp": pp_rank}, sizes, order) for t in range(sizes["tp"])]


def fault_rank(sizes: dict, order: tuple, stage: int, tp_rank: Optional[int] = None,
               dp_rank: Optional[int] = None) -> int:
    """The rank the benchmark faults on pipeline stage ``stage``: the last tp rank of the last
    replica by default (never rank 0 unless the layout has one rank per stage)."""
    return rank_of({"tp": sizes["tp"] - 1 if tp_rank is None else tp_rank, "cp": sizes.get("cp", 1) - 1,
                    "dp": sizes["dp"] - 1 if dp_rank is None else dp_rank, "pp": stage}, sizes, order)


# -- the model (torch imported inside) --------------------------------------------------------------

def _full(shape: tuple, seed: int) -> Any:
    import torch

    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 0.3


class _State:
    """One rank's run: coordinates, groups, counters of the recorded calls of the current step."""

    def __init__(self, args: Any, rank: int, world: int) -> None:
        self.args, self.rank, self.world = args, rank, world
        self.sizes = {"tp": args.tp, "cp": args.cp, "dp": args.dp, "pp": args.pp}
        self.order = parse_order(args.order)
        self.coords = coords_of(rank, self.sizes, self.order)
        self.tp_group = self.dp_group = self.mp_group = self.ep_group = self.expert_dp_group = self.cp_group = None
        self.expert_mp_group = self.tp_ep_group = None
        self.step = 0
        self.counts: dict = {}
        self.sites: dict = {}
        self.masks: dict = {}

    def count(self, api: str) -> int:
        n = self.counts.get(api, 0)
        self.counts[api] = n + 1
        return n

    def site(self, key: str, name: str) -> None:
        self.sites.setdefault(str(self.step), {})[key] = name

    def faulted(self, kind: str) -> bool:
        a = self.args
        return a.fault == kind and self.step == a.fault_step and self.rank == a.fault_rank


def _functions() -> tuple:
    """Megatron's tensor-parallel regions as autograd functions: (copy to the region: identity
    forward, all_reduce of the gradient backward; reduce from the region: all_reduce forward,
    identity backward). Without a group (one tp rank) both are the identity, as Megatron bypasses
    them."""
    import torch
    import torch.distributed as dist

    class CopyToRegion(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, group: Any) -> Any:
            ctx.group = group
            return x

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            if ctx.group is None:
                return grad, None
            dist.all_reduce(grad, group=ctx.group)
            return grad, None

    class ReduceFromRegion(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, group: Any) -> Any:
            if group is None:
                return x
            dist.all_reduce(x, group=group)
            return x

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            return grad, None

    return CopyToRegion, ReduceFromRegion


def _sequence_functions() -> tuple:
    """Megatron's sequence-parallel regions (``--sp``): (gather the sequence: all_gather along it
    forward, reduce_scatter of the gradient backward; reduce-scatter to the sequence: reduce_scatter
    along it forward, all_gather backward; gather for the replicated head: all_gather forward, the own
    part of the gradient backward). The sequence is dimension 1 ([batch, seq, hidden]); the moves
    of dimensions around the calls use torch's unwrapped functions, as Megatron's [seq, batch, hidden]
    layout needs none."""
    import torch
    import torch.distributed as dist

    raw = torch._C._VariableFunctions

    def gather(x: Any, group: Any) -> Any:
        world = dist.get_world_size(group)
        first = raw.transpose(x, 0, 1).contiguous()
        out = raw.empty((first.shape[0] * world,) + tuple(first.shape[1:]), dtype=x.dtype)
        dist.all_gather_into_tensor(out, first, group=group)
        return raw.transpose(out, 0, 1).contiguous()

    def scatter(x: Any, group: Any) -> Any:
        world = dist.get_world_size(group)
        first = raw.transpose(x, 0, 1).contiguous()
        out = raw.empty((first.shape[0] // world,) + tuple(first.shape[1:]), dtype=x.dtype)
        dist.reduce_scatter_tensor(out, first, group=group)
        return raw.transpose(out, 0, 1).contiguous()

    def own(x: Any, group: Any) -> Any:
        world, me = dist.get_world_size(group), dist.get_rank(group)
        size = x.shape[1] // world
        return raw.narrow(x, 1, me * size, size).contiguous()

    def region(name: str, forward: Any, backward: Any) -> Any:
        """An autograd function: ``forward(x, group)`` forward, ``backward(grad, group)`` backward."""

        def fwd(ctx: Any, x: Any, group: Any) -> Any:
            ctx.group = group
            return forward(x, group)

        def bwd(ctx: Any, grad: Any) -> Any:
            return backward(grad, ctx.group), None

        return type(name, (torch.autograd.Function,), {"forward": staticmethod(fwd), "backward": staticmethod(bwd)})

    GatherSequence = region("GatherSequence", gather, scatter)
    ScatterSequence = region("ScatterSequence", scatter, gather)
    GatherForHead = region("GatherForHead", gather, own)
    return GatherSequence, ScatterSequence, GatherForHead

FFN_EXPERT = 16


def _moe_layer(state: _State, linear: Any) -> Any:
    """Megatron's MoE layer (``--experts E``, ``--ep``): ``mlp.router`` (TopKRouter: a replicated gate
    linear, the top-k of its logits by a stable descending sort, ties to the lower expert index,
    softmax over the k), the all-to-all token dispatcher and ``mlp.experts`` (SequentialMLP) holding
    this rank's ``local_experts.<i>`` (global expert ``ep_rank * E/ep + i``; each fc1 -> masked_fill
    -> gelu -> fc2, no biases). The dispatcher's permutations run as Megatron's fused permute kernels
    do, unseen by the dumper (torch's unwrapped functions): the tokens sorted by expert, their counts
    all_gathered over the expert-parallel group, the tokens sent to the ranks holding their experts
    with ``all_to_all_single`` (Megatron's _AllToAll: the reverse all_to_all backward), the received
    chunks sorted from (source, local expert) to (local expert, source); the combine the same
    backward, the expert outputs weighted by their probabilities and added back per token. With one
    expert-parallel rank (the single card) the all-to-all is the identity, as Megatron bypasses it."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F

    raw = torch._C._VariableFunctions
    args = state.args
    experts, ep, topk = args.experts, args.ep, args.topk
    local = experts // ep
    ep_rank = state.coords["dp"] % ep
    group = state.ep_group
    tp, tp_rank, tp_group = state.sizes["tp"], state.coords["tp"], state.tp_group
    counts_group = state.tp_ep_group if tp > 1 else group  # the token counts gathered over tp x ep

    def exchange(x: Any, output_splits: list, input_splits: list, group: Any) -> Any:
        out = raw.empty((sum(output_splits), x.shape[1]), dtype=x.dtype)
        dist.all_to_all_single(out, raw.clone(x, memory_format=torch.contiguous_format), output_splits,
                               input_splits, group=group)
        return out

    class AllToAll(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, output_splits: list, input_splits: list, group: Any) -> Any:
            ctx.splits, ctx.group = (output_splits, input_splits), group
            return exchange(x, output_splits, input_splits, group)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            output_splits, input_splits = ctx.splits
            return exchange(grad, input_splits, output_splits, ctx.group), None, None, None

    def padded(x: Any, size: int) -> Any:
        return raw.cat([x, raw.zeros((size - x.shape[0], x.shape[1]), dtype=x.dtype)], 0) if size > x.shape[0] else x

    def gather_tp(x: Any, sizes: list) -> Any:
        """The tensor-parallel ranks' tokens joined (Megatron's gather_from_sequence_parallel_region with
        output_split_sizes: an all_gather of uneven pieces; gloo's needs equal ones: padded, unseen)."""
        most = max(sizes)
        pieces = [raw.empty((most, x.shape[1]), dtype=x.dtype) for _ in sizes]
        dist.all_gather(pieces, raw.clone(padded(x, most), memory_format=torch.contiguous_format), group=tp_group)
        return raw.cat([raw.narrow(piece, 0, 0, size) for piece, size in zip(pieces, sizes)], 0)

    def scatter_tp(x: Any, sizes: list) -> Any:
        """This rank's piece of the tensor-parallel ranks' sum (reduce_scatter with input_split_sizes)."""
        out = raw.empty((sizes[tp_rank], x.shape[1]), dtype=x.dtype)
        dist.reduce_scatter(out, [raw.clone(piece, memory_format=torch.contiguous_format)
                                  for piece in raw.split_with_sizes(x, sizes)], group=tp_group)
        return out

    class GatherTP(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, sizes: list) -> Any:
            ctx.sizes = sizes
            return gather_tp(x, sizes)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            return scatter_tp(grad, ctx.sizes), None

    class ScatterTP(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, sizes: list) -> Any:
            ctx.sizes = sizes
            return scatter_tp(x, sizes)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            return gather_tp(grad, ctx.sizes), None

    class TopKRouter(nn.Module):
        def __init__(self, number: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(_full((experts, H), 10 * number + 5))
            self.weight.sequence_parallel = tp > 1  # on this rank's piece of the sequence: its gradient is partial

        def forward(self, x: Any) -> Any:
            logits = linear(x, self.weight, None, None)
            ordered, index = torch.sort(logits, dim=-1, descending=True, stable=True)
            return torch.softmax(ordered[:, :topk], dim=-1), index[:, :topk]

    class ExpertLinear(nn.Module):
        def __init__(self, weight: Any, site: Optional[str], number: int, expert: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(weight)
            self.site, self.number, self.expert, self.calls, self.name = site, number, expert, 0, ""

        def forward(self, x: Any) -> Any:
            mb = self.calls
            self.calls += 1
            site = None
            if self.site:
                site = f"L{self.number}.E{self.expert}.mb{mb}.{self.site}"
                state.site(site + ".module", f"{self.name}.{type(self).__name__}.forward.{mb}")
            return linear(x, self.weight, None, site)

    ColumnParallelLinear = type("ColumnParallelLinear", (ExpertLinear,), {})
    RowParallelLinear = type("RowParallelLinear", (ExpertLinear,), {})

    class Expert(nn.Module):
        """Megatron's MLP of one expert (``local_experts.<i>``)."""

        def __init__(self, number: int, expert: int) -> None:
            super().__init__()
            seed, rows = 1000 * (number + 1) + 10 * expert, FFN_EXPERT // tp  # expert tensor parallel = tp
            self.linear_fc1 = ColumnParallelLinear(_full((FFN_EXPERT, H), seed)[tp_rank * rows:(tp_rank + 1) * rows]
                                                   .clone(), "fc1", number, expert)
            self.linear_fc2 = RowParallelLinear(_full((H, FFN_EXPERT), seed + 1)[:, tp_rank * rows:(tp_rank + 1) * rows]
                                                .clone(), None, number, expert)
            self.number, self.expert, self.calls = number, expert, 0
            for p in self.parameters():
                p.allreduce = False  # Megatron's mark of an expert parameter

        def forward(self, x: Any) -> Any:
            mb = self.calls
            self.calls += 1
            h = self.linear_fc1(x)
            k = state.count("Tensor.masked_fill")
            state.site(f"L{self.number}.E{self.expert}.mb{mb}.mask", f"Tensor.masked_fill.{k}.forward")
            hit = state.faulted("nan") and self.number == args.fault_layer and self.expert == args.fault_expert \
                and mb == args.fault_mb  # (the mask made unseen: it is no record of the model)
            mask = raw.reshape(raw.eq(raw.arange(h.numel()), 0 if hit else -1), tuple(h.shape))
            h = h.masked_fill(mask, float("nan") if hit else 0.0)
            return self.linear_fc2(F.gelu(h))

    class SequentialMLP(nn.Module):
        def __init__(self, number: int) -> None:
            super().__init__()
            self.local_experts = nn.ModuleList(Expert(number, ep_rank * local + i) for i in range(local))

        def forward(self, tokens: Any, tokens_per_expert: Any) -> Any:
            pieces = raw.split_with_sizes(tokens, tokens_per_expert.tolist())
            return raw.cat([expert(piece) for expert, piece in zip(self.local_experts, pieces)], 0)

    class MoELayer(nn.Module):
        def __init__(self, number: int) -> None:
            super().__init__()
            self.router = TopKRouter(number)
            self.experts = SequentialMLP(number)

        def forward(self, x: Any) -> Any:
            shape = tuple(x.shape)
            tokens = x.reshape(-1, H)
            probs, chosen = self.router(tokens)
            # dispatch (fused permutation): by expert, then by token
            flat = raw.reshape(chosen, (-1,))
            order = raw.argsort(flat, stable=True, dim=0)
            permuted = raw.index_select(tokens, 0, raw.floor_divide(order, topk))
            counts = raw.bincount(flat, minlength=experts)
            if counts_group is None:
                table = raw.reshape(counts, (1, 1, experts))
            else:  # [ep source, tp source, expert] (Megatron's tp-ep group: tp fastest)
                gathered = raw.empty((tp * ep * experts,), dtype=counts.dtype)
                dist.all_gather_into_tensor(gathered, counts, group=counts_group)
                table = raw.reshape(gathered, (ep, tp, experts))
            held = raw.narrow(table, 2, ep_rank * local, local)  # [ep source, tp source, local expert]
            mine = raw.select(held, 1, tp_rank)  # [ep source, local expert]: what this rank receives
            sources = tp * ep  # the (tp source, ep source) chunks this rank's experts take, tp outermost
            sizes = raw.reshape(raw.transpose(held, 0, 1), (-1,)).tolist()  # (tp, ep, local) order
            totals = raw.sum(raw.reshape(raw.transpose(held, 0, 1), (tp, -1)), 1).tolist()  # per tp source
            if group is not None:
                input_splits = raw.sum(raw.reshape(counts, (ep, local)), 1).tolist()
                output_splits = raw.sum(mine, 1).tolist()
                permuted = AllToAll.apply(permuted, output_splits, input_splits, group)
            if tp > 1:  # every tensor-parallel rank of the expert takes the tokens all of them received
                permuted = GatherTP.apply(permuted, totals)
            if sources > 1:  # from (tp source, ep source, local expert) to (local expert, ...)
                chunks = raw.split_with_sizes(permuted, sizes)
                permuted = raw.cat([chunks[s * local + i] for i in range(local) for s in range(sources)], 0)
            out = self.experts(permuted, raw.sum(raw.reshape(held, (-1, local)), 0))
            if sources > 1:  # combine: back to (source, local expert)
                chunks = raw.split_with_sizes(out, [sizes[s * local + i] for i in range(local) for s in range(sources)])
                out = raw.cat([chunks[i * sources + s] for s in range(sources) for i in range(local)], 0)
            if tp > 1:  # the experts' partial sums (row-parallel fc2) summed, this rank's tokens kept
                out = ScatterTP.apply(out, totals)
            if group is not None:  # then to the sources
                out = AllToAll.apply(out, input_splits, output_splits, group)
            weighted = raw.mul(out, raw.unsqueeze(raw.index_select(raw.reshape(probs, (-1,)), 0, order), 1))
            index = raw.broadcast_to(raw.unsqueeze(raw.floor_divide(order, topk), 1), tuple(weighted.shape))
            combined = raw.scatter_add(raw.zeros(tuple(tokens.shape), dtype=tokens.dtype), 0, index, weighted)
            return raw.reshape(combined, shape)

    return MoELayer


def _context_gather(state: _State) -> Any:
    """Transformer Engine's all-gather context parallelism for the keys and values (``--cp``): an
    autograd function gathering every cp rank's tokens (``all_gather_into_tensor``, then put in
    sequence order: the ranks hold load-balanced chunks) forward, and backward the other way
    (``reduce_scatter_tensor`` of the gradient: each cp rank's queries' part summed)."""
    import torch
    import torch.distributed as dist

    raw = torch._C._VariableFunctions
    cp, group = state.sizes["cp"], state.cp_group
    seq = SEQ_LEN[0]
    gathered = [pos for r in range(cp) for pos in cp_positions(r, cp, seq)]  # the gathered tokens' positions
    to_sequence = torch.tensor(sorted(range(seq), key=lambda i: gathered[i]))
    to_gathered = torch.tensor(gathered)

    def gather(x: Any) -> Any:
        first = raw.transpose(x, 0, 1).contiguous()
        out = raw.empty((first.shape[0] * cp,) + tuple(first.shape[1:]), dtype=x.dtype)
        dist.all_gather_into_tensor(out, first, group=group)
        return raw.transpose(raw.index_select(out, 0, to_sequence), 0, 1).contiguous()

    def scatter(grad: Any) -> Any:
        first = raw.index_select(raw.transpose(grad, 0, 1), 0, to_gathered).contiguous()
        out = raw.empty((first.shape[0] // cp,) + tuple(first.shape[1:]), dtype=grad.dtype)
        dist.reduce_scatter_tensor(out, first, group=group)
        return raw.transpose(out, 0, 1).contiguous()

    class GatherKV(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return gather(x)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            return scatter(grad)

    return GatherKV


def build_chunk(state: _State, layers: list, last: bool) -> Any:
    """One model chunk: ``decoder.layers`` (local indices, global ``layer_number``) and, on the
    last virtual stage, the replicated ``output_layer``."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    CopyToRegion, ReduceFromRegion = _functions()
    tp, tp_rank, group = state.sizes["tp"], state.coords["tp"], state.tp_group
    sp = bool(getattr(state.args, "sp", False)) and group is not None
    if sp:
        CopyToRegion, ReduceFromRegion, GatherForHead = _sequence_functions()
    random_bias = state.args.bias == "random"
    moe = getattr(state.args, "experts", 0) > 0
    attn = bool(getattr(state.args, "attn", False))
    cp = state.sizes["cp"]
    GatherKV = _context_gather(state) if attn and cp > 1 else None
    heads, head_dim = HEADS // tp, H // HEADS

    def bias(size: int, seed: int) -> Any:
        return _full((size,), seed) if random_bias else torch.zeros(size)

    def linear(x: Any, weight: Any, b: Any, site: Optional[str]) -> Any:
        k = state.count("Functional.linear")
        if site:
            state.site(site, f"Functional.linear.{k}.forward")
        return F.linear(x, weight, b)

    class ColumnParallelLinear(nn.Module):
        def __init__(self, full_w: Any, full_b: Any, number: int, site: str = "fc1") -> None:
            super().__init__()
            self.site = site
            rows = full_w.shape[0] // tp
            self.weight = nn.Parameter(full_w[tp_rank * rows:(tp_rank + 1) * rows].clone())
            self.bias = nn.Parameter(full_b[tp_rank * rows:(tp_rank + 1) * rows].clone())
            self.weight.tensor_model_parallel = self.bias.tensor_model_parallel = True
            self.number, self.calls, self.name = number, 0, ""

        def forward(self, x: Any) -> Any:
            mb = self.calls
            self.calls += 1
            state.site(f"L{self.number}.mb{mb}.{self.site}.module", f"{self.name}.ColumnParallelLinear.forward.{mb}")
            x = CopyToRegion.apply(x, group)
            return linear(x, self.weight, self.bias, f"L{self.number}.mb{mb}.{self.site}")

    class RowParallelLinear(nn.Module):
        def __init__(self, full_w: Any, full_b: Any, number: int) -> None:
            super().__init__()
            cols = full_w.shape[1] // tp
            self.weight = nn.Parameter(full_w[:, tp_rank * cols:(tp_rank + 1) * cols].clone())
            self.bias = nn.Parameter(full_b.clone())
            self.weight.tensor_model_parallel, self.bias.tensor_model_parallel = True, False
            self.bias.sequence_parallel = sp  # added to a piece of the sequence: its gradient is partial
            self.number = number

        def forward(self, x: Any) -> Any:
            partial = linear(x, self.weight, None, None)
            return ReduceFromRegion.apply(partial, group) + self.bias

    class MLP(nn.Module):
        def __init__(self, number: int) -> None:
            super().__init__()
            self.linear_fc1 = ColumnParallelLinear(_full((FFN, H), 10 * number), bias(FFN, 10 * number + 1), number)
            self.linear_fc2 = RowParallelLinear(_full((H, FFN), 10 * number + 2), bias(H, 10 * number + 3), number)
            self.number, self.calls = number, 0

        def forward(self, x: Any) -> Any:
            mb = self.calls
            self.calls += 1
            h = self.linear_fc1(x)
            k = state.count("Tensor.masked_fill")
            state.site(f"L{self.number}.mb{mb}.mask", f"Tensor.masked_fill.{k}.forward")
            mask, fill = state.masks.get((self.number, mb), (None, 0.0))
            h = h.masked_fill(mask, fill)
            return self.linear_fc2(F.gelu(h))

    if moe:
        MoELayer = _moe_layer(state, linear)

    class TEDotProductAttention(nn.Module):
        """The core attention as Megatron runs it with context parallelism (Transformer Engine's
        fused attention: its scores, causal mask and softmax are one kernel, no records of their
        own; with ``cp`` > 1 it gathers the keys and values of the other cp ranks): q, k, v
        [batch, this rank's tokens, heads, head_dim] -> [batch, tokens, heads x head_dim]."""

        def forward(self, q: Any, k: Any, v: Any) -> Any:
            raw = torch._C._VariableFunctions
            if GatherKV is not None:
                k, v = GatherKV.apply(k), GatherKV.apply(v)
            mine = cp_positions(state.coords["cp"], cp, SEQ_LEN[0])
            future = torch.tensor([[key > query for key in range(SEQ_LEN[0])] for query in mine])
            qt, kt, vt = (raw.transpose(t, 1, 2) for t in (q, k, v))
            scores = raw.mul(raw.matmul(qt, raw.transpose(kt, 2, 3)), head_dim ** -0.5)
            probs = raw.softmax(raw.masked_fill(scores, future, float("-inf")), -1)
            out = raw.transpose(raw.matmul(probs, vt), 1, 2)
            return raw.reshape(out, (out.shape[0], out.shape[1], heads * head_dim))

    class SelfAttention(nn.Module):
        def __init__(self, number: int) -> None:
            super().__init__()  # the fused qkv rows head by head (q, k, v of head 0, then head 1): tp splits heads
            self.linear_qkv = ColumnParallelLinear(_full((3 * H, H), 10 * number + 5), bias(3 * H, 10 * number + 6),
                                                   number, site="qkv")
            self.core_attention = TEDotProductAttention()
            self.linear_proj = RowParallelLinear(_full((H, H), 10 * number + 7), bias(H, 10 * number + 8), number)

        def forward(self, x: Any) -> Any:
            qkv = self.linear_qkv(x)
            qkv = qkv.view(qkv.shape[0], qkv.shape[1], heads, 3 * head_dim)
            q, k, v = torch.split(qkv, head_dim, dim=-1)
            return self.linear_proj(self.core_attention(q, k, v))

    class TransformerLayer(nn.Module):
        def __init__(self, number: int) -> None:
            super().__init__()
            self.layer_number = number
            self.self_attention = SelfAttention(number) if attn else None
            self.mlp = MoELayer(number) if moe else MLP(number)

        def forward(self, x: Any) -> Any:
            if self.self_attention is not None:
                x = x + self.self_attention(x)
            return x + self.mlp(x)

    class TransformerBlock(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(TransformerLayer(n) for n in layers)

        def forward(self, x: Any) -> Any:
            for layer in self.layers:
                x = layer(x)
            return x

    class OutputLayer(nn.Module):
        """The head, replicated over the tensor-parallel ranks."""

        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(_full((OUT, H), 1000))
            self.bias = nn.Parameter(bias(OUT, 1001))
            self.weight.tensor_model_parallel = self.bias.tensor_model_parallel = False

        def forward(self, x: Any) -> Any:
            if sp:
                x = GatherForHead.apply(x, group)
            return linear(x, self.weight, self.bias, None)

    class GPTModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.decoder = TransformerBlock()
            self.output_layer = OutputLayer() if last else None

        def forward(self, x: Any) -> Any:
            x = self.decoder(x)
            return self.output_layer(x) if self.output_layer is not None else x

    return GPTModel()


# -- pipeline schedules -----------------------------------------------------------------------------

class _Pipeline:
    """Megatron's schedules over this rank's chunks: forward/backward steps, p2p with isend/irecv
    (all of a call's operations posted, then waited, as p2p_communication does)."""

    def __init__(self, state: _State, chunks: list, data: list, targets: list) -> None:
        self.state, self.chunks, self.data, self.targets = state, chunks, data, targets
        s, o, c = state.sizes, state.order, state.coords
        self.pp, self.vpp, self.p = s["pp"], len(chunks), c["pp"]
        self.next = rank_of(dict(c, pp=(c["pp"] + 1) % s["pp"]), s, o)
        self.prev = rank_of(dict(c, pp=(c["pp"] - 1) % s["pp"]), s, o)
        self.losses: list = []
        self.mb_shape = tuple(data[0].shape[:2]) + (H,)

    # virtual stage helpers
    def first_virtual(self, chunk: int) -> bool:
        return self.p == 0 and chunk == 0

    def last_virtual(self, chunk: int) -> bool:
        return self.p == self.pp - 1 and chunk == self.vpp - 1

    def forward_step(self, chunk: int, mb: int, inp: Any) -> Any:
        x = self.data[mb] if self.first_virtual(chunk) else inp
        out = self.chunks[chunk](x)
        if self.last_virtual(chunk):
            loss = (out - self.targets[mb]).pow(2).mean() / MICRO_BATCHES
            self.losses.append(loss)
            return loss
        return out

    def backward_step(self, chunk: int, inp: Any, out: Any, grad: Any) -> Any:
        import torch

        if inp is not None:
            inp.retain_grad()
        if grad is None:  # the last virtual stage: the scaled loss (Megatron's grad_scale_func)
            out = out * LOSS_SCALE
        torch.autograd.backward(out, grad_tensors=grad)
        return inp.grad if inp is not None else None

    def p2p(self, send_next: Any = None, send_prev: Any = None, recv_prev: bool = False,
            recv_next: bool = False) -> tuple:
        import torch
        import torch.distributed as dist

        if self.pp == 1:
            return None, None
        got_prev = torch.empty(self.mb_shape, requires_grad=True) if recv_prev else None
        got_next = torch.empty(self.mb_shape) if recv_next else None
        works = []
        if send_prev is not None:
            works.append(dist.isend(send_prev.contiguous(), self.prev))
        if got_prev is not None:
            works.append(dist.irecv(got_prev, self.prev))
        if send_next is not None:
            works.append(dist.isend(send_next.contiguous(), self.next))
        if got_next is not None:
            works.append(dist.irecv(got_next, self.next))
        for work in works:
            work.wait()
        return got_prev, got_next

    # -- 1F1B (forward_backward_pipelining_without_interleaving; pp == 1: no pipelining) --
    def one_f_one_b(self) -> None:
        pp, p = self.pp, self.p
        first, last = p == 0, p == pp - 1
        warmup = min(pp - p - 1, MICRO_BATCHES)
        remaining = MICRO_BATCHES - warmup
        inputs: list = []
        outputs: list = []
        fwd = bwd = 0
        for _ in range(warmup):
            inp = None if first else self.p2p(recv_prev=True)[0]
            out = self.forward_step(0, fwd, inp)
            fwd += 1
            self.p2p(send_next=None if last else out.detach())
            inputs.append(inp)
            outputs.append(out)
        inp = None
        if remaining > 0 and not first:
            inp = self.p2p(recv_prev=True)[0]
        for i in range(remaining):
            out = self.forward_step(0, fwd, inp)
            fwd += 1
            grad = None if last else self.p2p(send_next=out.detach(), recv_next=True)[1]
            inputs.append(inp)
            outputs.append(out)
            inp_b, out_b = inputs.pop(0), outputs.pop(0)
            in_grad = self.backward_step(0, inp_b, out_b, grad)
            bwd += 1
            if i == remaining - 1:
                inp = None
                if not first:
                    self.p2p(send_prev=in_grad)
            else:
                inp = None if first else self.p2p(send_prev=in_grad, recv_prev=True)[0]
        for _ in range(warmup):
            inp_b, out_b = inputs.pop(0), outputs.pop(0)
            grad = None if last else self.p2p(recv_next=True)[1]
            in_grad = self.backward_step(0, inp_b, out_b, grad)
            bwd += 1
            if not first:
                self.p2p(send_prev=in_grad)

    # -- interleaved 1F1B (forward_backward_pipelining_with_interleaving) --
    def chunk_id(self, k: int, forward: bool) -> int:
        c = (k % (self.pp * self.vpp)) // self.pp
        return c if forward else self.vpp - c - 1

    def mb_id(self, k: int) -> int:
        return (k // (self.pp * self.vpp)) * self.pp + k % self.pp

    def interleaved(self) -> None:
        pp, vpp, p = self.pp, self.vpp, self.p
        total = MICRO_BATCHES * vpp
        warmup = (pp - p - 1) * 2 + (vpp - 1) * pp
        all_warmup = warmup >= total
        warmup = min(warmup, total)
        remaining = total - warmup
        inputs: list = [[] for _ in range(vpp)]
        outputs: list = [[] for _ in range(vpp)]
        out_grads: list = [[] for _ in range(vpp)]

        def fwd_helper(k: int) -> Any:
            c = self.chunk_id(k, True)
            if self.first_virtual(c) and len(inputs[c]) == len(outputs[c]):
                inputs[c].append(None)
            out = self.forward_step(c, self.mb_id(k), inputs[c][-1])
            outputs[c].append(out)
            return out

        def bwd_helper(k: int) -> Any:
            c = self.chunk_id(k, False)
            if self.last_virtual(c) and not out_grads[c]:
                out_grads[c].append(None)
            return self.backward_step(c, inputs[c].pop(0), outputs[c].pop(0), out_grads[c].pop(0))

        inputs[0].append(None if p == 0 else self.p2p(recv_prev=True)[0])
        for k in range(warmup):
            out = fwd_helper(k)
            nxt = self.chunk_id(k + 1, True)
            recv_prev = not (p == 0 and nxt == 0) and k != total - 1
            if self.last_virtual(self.chunk_id(k, True)):
                out = None
            send = None if out is None else out.detach()
            if k == warmup - 1 and not all_warmup:
                recv_next = p != pp - 1
                got_prev, got_next = self.p2p(send_next=send, recv_prev=recv_prev, recv_next=recv_next)
                out_grads[vpp - 1].append(got_next)
            else:
                got_prev = self.p2p(send_next=send, recv_prev=recv_prev)[0]
            inputs[nxt].append(got_prev)
        for k in range(remaining):
            fk = k + warmup
            out = fwd_helper(fk)
            in_grad = bwd_helper(k)
            if self.last_virtual(self.chunk_id(fk, True)):
                out = None
            if self.first_virtual(self.chunk_id(k, False)):
                in_grad = None
            recv_prev = True
            if p == 0:
                nxt_f = self.chunk_id(fk - (pp - 1), True)
                if nxt_f == vpp - 1:
                    recv_prev = False
                nxt_f += 1
            else:
                nxt_f = self.chunk_id(fk + 1, True)
            recv_next = True
            if p == pp - 1:
                nxt_b = self.chunk_id(k - (pp - 1), False)
                if nxt_b == 0:
                    recv_next = False
                nxt_b -= 1
            else:
                nxt_b = self.chunk_id(k + 1, False)
            if k == remaining - 1:
                recv_prev = False
            got_prev, got_next = self.p2p(send_next=None if out is None else out.detach(), send_prev=in_grad,
                                          recv_prev=recv_prev, recv_next=recv_next)
            if recv_prev:
                inputs[nxt_f].append(got_prev)
            if recv_next:
                out_grads[nxt_b].append(got_next)
        if all_warmup:
            out_grads[vpp - 1].append(None if p == pp - 1 else self.p2p(recv_next=True)[1])
        for k in range(remaining, total):
            in_grad = bwd_helper(k)
            nxt_b = self.chunk_id(k + 1, False)
            recv_next = not (p == pp - 1 and nxt_b == vpp - 1) and k != total - 1
            if self.first_virtual(self.chunk_id(k, False)):
                in_grad = None
            got_next = self.p2p(send_prev=in_grad, recv_next=recv_next)[1]
            out_grads[nxt_b].append(got_next)

    def run(self) -> None:
        if self.vpp > 1:
            self.interleaved()
        else:
            self.one_f_one_b()


# -- the training run -------------------------------------------------------------------------------

def _groups(state: _State) -> None:
    """Every rank creates every group in the same order; keeps its own (none of size 1)."""
    import torch.distributed as dist

    s, o = state.sizes, state.order

    def make(kind: str, members: list) -> None:
        if len(members) > 1:
            group = dist.new_group(sorted(members))
            if state.rank in members:
                setattr(state, kind, group)

    tps, cps, dps, pps = (range(s[dim]) for dim in ("tp", "cp", "dp", "pp"))
    for c in cps:
        for d in dps:
            for p in pps:
                make("tp_group", [rank_of({"tp": t, "cp": c, "dp": d, "pp": p}, s, o) for t in tps])
    for t in tps:
        for d in dps:
            for p in pps:
                make("cp_group", [rank_of({"tp": t, "cp": c, "dp": d, "pp": p}, s, o) for c in cps])
    for t in tps:  # Megatron's data-parallel group with context parallelism: the gradients' all_reduce
        for p in pps:
            make("dp_group", [rank_of({"tp": t, "cp": c, "dp": d, "pp": p}, s, o) for d in dps for c in cps])
    for c in cps:
        for d in dps:
            make("mp_group", [rank_of({"tp": t, "cp": c, "dp": d, "pp": p}, s, o) for t in tps for p in pps])
    if getattr(state.args, "experts", 0) and state.args.ep > 1:  # expert parallel within the data-parallel ranks
        ep, blocks = state.args.ep, s["dp"] // state.args.ep
        for t in range(s["tp"]):
            for p in range(s["pp"]):
                for block in range(blocks):  # the expert-parallel groups: ep consecutive data-parallel ranks
                    make("ep_group", [rank_of({"tp": t, "cp": 0, "dp": block * ep + e, "pp": p}, s, o)
                                      for e in range(ep)])
                for e in range(ep):  # the expert data-parallel groups: the ranks holding the same experts
                    members = [rank_of({"tp": t, "cp": 0, "dp": block * ep + e, "pp": p}, s, o) for block in range(blocks)]
                    group = dist.new_group(sorted(members))  # (one rank each when ep == dp: Megatron's buffers)
                    if state.rank in members:
                        state.expert_dp_group = group
        for block in range(blocks):  # the experts' model-parallel group (Megatron's tp-ep-pp): the clip's norm
            make("expert_mp_group", [rank_of({"tp": t, "cp": 0, "dp": block * ep + e, "pp": p}, s, o)
                                     for t in range(s["tp"]) for e in range(ep) for p in range(s["pp"])])
            for p in range(s["pp"]):  # the tokens per expert gathered over tp x ep (tp > 1)
                if s["tp"] > 1:
                    make("tp_ep_group", [rank_of({"tp": t, "cp": 0, "dp": block * ep + e, "pp": p}, s, o)
                                         for t in range(s["tp"]) for e in range(ep)])

def _batch(step: int) -> tuple:
    """The global batch of ``step``: inputs [micro-batches, batch, seq, H], targets [.., OUT]."""
    import torch

    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(MICRO_BATCHES, GLOBAL_BATCH, SEQ_LEN[0], H, generator=g)
    y = torch.randn(MICRO_BATCHES, GLOBAL_BATCH, SEQ_LEN[0], OUT, generator=g)
    return x, y


def clip_grad_norm_(params: list, max_norm: float, state: _State) -> float:
    """Megatron's clip_grad_norm (norm type 2): the squared norms of this rank's gradients (a
    tensor-parallel duplicate counted on tp rank 0 only), all_reduced over the model-parallel
    group, then every gradient scaled by ``max_norm / (norm + 1e-6)`` when that is below 1."""
    import torch
    import torch.distributed as dist

    counted = [p.grad for p in params if p.grad is not None and getattr(p, "allreduce", True) and
               (getattr(p, "tensor_model_parallel", False) or state.coords["tp"] == 0)]
    total = torch.zeros(1)
    for grad in counted:
        total = total + torch.norm(grad, 2) ** 2
    if state.mp_group is not None:
        dist.all_reduce(total, group=state.mp_group)
    experts = [p.grad for p in params if p.grad is not None and not getattr(p, "allreduce", True)]
    if experts:  # Megatron's chained optimizer: the experts' norm over their model-parallel group (the
        # expert-parallel ranks and the pipeline stages: tp-ep-pp), added
        part = torch.zeros(1)
        for grad in experts:
            part = part + torch.norm(grad, 2) ** 2
        if state.expert_mp_group is not None:
            dist.all_reduce(part, group=state.expert_mp_group)
        total = total + part
    norm = total.item() ** 0.5
    coef = max_norm / (norm + 1.0e-6)
    if coef < 1.0:
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef)
    return norm


def train(args: Any) -> dict:
    """One rank's run; returns its sidecar."""
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if args.tp * args.cp * args.pp * args.dp != world:
        raise SystemExit(f"tp {args.tp} x cp {args.cp} x pp {args.pp} x dp {args.dp} is not WORLD_SIZE {world}")
    if args.cp > 1 and not args.attn:
        raise SystemExit("context parallelism (--cp) splits the attention's sequence: give --attn")
    SEQ_LEN[0] = args.seq
    if LAYERS % (args.pp * args.vpp) or FFN % args.tp or H % args.tp or GLOBAL_BATCH % args.dp or \
            (args.sp and args.seq % args.tp) or args.seq % (2 * args.cp if args.cp > 1 else 1) or \
            (args.attn and HEADS % args.tp):
        raise SystemExit("the layout does not divide the model")
    if args.vpp > 1 and args.pp == 1:
        raise SystemExit("virtual pipeline stages need pp > 1")
    if args.experts and (args.experts % args.ep or args.dp % args.ep or args.vpp != 1 or FFN_EXPERT % args.tp or
                         (args.tp > 1 and not args.sp)):
        raise SystemExit("experts: expert parallel within the data-parallel ranks (dp divisible by ep, vpp = 1; "
                         "tp > 1 with --sp, as Megatron asks of MoE with tensor parallelism), experts divisible by ep")
    if args.ep > 1 and not args.experts:
        raise SystemExit("--ep needs --experts")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
                                rank=rank, world_size=world)
    state = _State(args, rank, world)
    if world > 1:
        _groups(state)
    from msprobe.pytorch import PrecisionDebugger

    c = state.coords
    chunks = [build_chunk(state, chunk_layers(c["pp"], v, args.pp, args.vpp),
                          c["pp"] == args.pp - 1 and v == args.vpp - 1) for v in range(args.vpp)]
    for v, chunk in enumerate(chunks):  # the module record names the dumper gives (a list: Module.<chunk>.)
        for name, module in chunk.named_modules():
            if name.endswith("linear_fc1"):
                module.name = f"Module.{v}.{name}" if args.vpp > 1 else f"Module.{name}"
    held = [n for v in range(args.vpp) for n in chunk_layers(c["pp"], v, args.pp, args.vpp)]
    if args.fault and rank == args.fault_rank and args.fault_layer not in held:
        raise SystemExit(f"rank {rank} holds layers {held}, not the fault's layer {args.fault_layer}")
    local, ep_rank = args.experts // args.ep, c["dp"] % args.ep
    if args.experts and args.fault and rank == args.fault_rank and \
            not ep_rank * local <= args.fault_expert < (ep_rank + 1) * local:
        raise SystemExit(f"rank {rank} holds experts {ep_rank * local}..{(ep_rank + 1) * local - 1}, not the "
                         f"fault's expert {args.fault_expert}")
    every = [p for chunk in chunks for p in chunk.parameters()]
    # Megatron's chained optimizer: the dense parameters, then the experts' (each its own optimizer)
    params = [p for p in every if getattr(p, "allreduce", True)] + [p for p in every if not getattr(p, "allreduce", True)]
    opt = torch.optim.Adam(params, lr=1e-3) if args.optimizer == "adam" else torch.optim.SGD(params, lr=args.lr)
    dbg = PrecisionDebugger(task=args.task, level=args.level, dump_path=args.dump)
    per = GLOBAL_BATCH // args.dp
    losses, norms = [], []
    injected = None
    for step in range(args.steps):
        state.step, state.counts = step, {}
        for chunk in chunks:
            for module in chunk.modules():
                if hasattr(module, "calls"):
                    module.calls = 0
        x, y = _batch(step)
        data = [x[m, c["dp"] * per:(c["dp"] + 1) * per].clone() for m in range(MICRO_BATCHES)]
        if args.sp and args.tp > 1:  # the first stage's input: this rank's piece of the sequence
            piece = SEQ_LEN[0] // args.tp
            data = [d[:, c["tp"] * piece:(c["tp"] + 1) * piece].clone() for d in data]
        targets = [y[m, c["dp"] * per:(c["dp"] + 1) * per].clone() for m in range(MICRO_BATCHES)]
        if args.cp > 1:  # context parallel: this rank's tokens (load-balanced chunks) of the sequence
            mine = torch.tensor(cp_positions(c["cp"], args.cp, SEQ_LEN[0]))
            data = [d.index_select(1, mine).contiguous() for d in data]
            targets = [t.index_select(1, mine).contiguous() for t in targets]
        state.masks = {}
        for layer in held:
            for mb in range(MICRO_BATCHES):
                mask = torch.zeros(per, SEQ_LEN[0] // args.cp, FFN // args.tp, dtype=torch.bool)
                fill = 0.0
                if state.faulted("nan") and layer == args.fault_layer and mb == args.fault_mb:
                    mask.view(-1)[1] = True
                    fill = float("nan")
                state.masks[(layer, mb)] = (mask, fill)
        if state.faulted("scale") and args.experts:
            for chunk in chunks:
                for module in chunk.modules():
                    if type(module).__name__ == "Expert" and module.number == args.fault_layer and \
                            module.expert == args.fault_expert:
                        with torch.no_grad():
                            module.linear_fc1.weight.mul_(1.05)
        elif state.faulted("scale"):
            for chunk in chunks:
                for layer in chunk.decoder.layers:
                    if layer.layer_number == args.fault_layer:
                        with torch.no_grad():
                            layer.mlp.linear_fc1.weight.mul_(1.05)
        opt.zero_grad(set_to_none=True)
        pipe = _Pipeline(state, chunks, data, targets)
        dbg.start(chunks if args.vpp > 1 else chunks[0])
        pipe.run()
        for p in params:  # sequence parallel: a parameter used on a piece of the sequence, summed over tp
            if p.grad is not None and getattr(p, "sequence_parallel", False):
                dist.all_reduce(p.grad, group=state.tp_group)
        for p in params:  # Megatron's DDP: gradients scaled by 1/(DP x CP), all_reduced over the replicas; an
            # expert's over its expert data-parallel group (one rank here: ep == dp), as Megatron's expert buffers
            group = state.dp_group if getattr(p, "allreduce", True) else state.expert_dp_group
            if p.grad is not None and group is not None:
                p.grad.mul_(1.0 / (args.dp * args.cp))
                dist.all_reduce(p.grad, group=group)
        for p in params:  # the static loss scaler: gradients unscaled
            if p.grad is not None:
                p.grad.mul_(1.0 / LOSS_SCALE)
        norm = clip_grad_norm_(params, args.max_norm, state) if args.max_norm > 0 else None
        opt.step()
        dbg.stop()
        dbg.step()
        norms.append(norm)
        losses.append(sum(float(loss) for loss in pipe.losses) if pipe.losses else None)
        expert = f".E{args.fault_expert}" if args.experts else ""
        if state.faulted("nan"):
            site = f"L{args.fault_layer}{expert}.mb{args.fault_mb}"
            injected = {"kind": "nan", "step": step, "rank": rank, "layer": args.fault_layer, "mb": args.fault_mb,
                        "site": f"{site}.mask", "record": state.sites[str(step)][f"{site}.mask"],
                        "also": []}
        elif state.faulted("scale"):
            site = f"L{args.fault_layer}{expert}.mb0"
            injected = {"kind": "scale", "step": step, "rank": rank, "layer": args.fault_layer, "mb": 0,
                        "site": f"{site}.fc1", "record": state.sites[str(step)][f"{site}.fc1"],
                        "also": [state.sites[str(step)][f"{site}.fc1.module"]]}
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return {"rank": rank, "world": world, "sizes": state.sizes, "vpp": args.vpp, "order": list(state.order),
            "coords": state.coords, "layers": held, "level": args.level, "optimizer": args.optimizer,
            "bias": args.bias, "steps": args.steps, "losses": losses, "grad_norms": norms,
            "last_stage": c["pp"] == args.pp - 1, "sites": state.sites, "injected": injected,
            "ep": args.ep, "experts": args.experts}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dump", help="dump_path of the PrecisionDebugger")
    ap.add_argument("truth", help="directory of the sidecars (rank<r>.json)")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--cp", type=int, default=1, help="context parallel size (with --attn)")
    ap.add_argument("--attn", action="store_true", help="a causal self-attention before each block's MLP")
    ap.add_argument("--vpp", type=int, default=1)
    ap.add_argument("--order", default="tp-dp-pp", help="rank order, the first dimension fastest (Megatron: tp-dp-pp)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--level", default="mix")
    ap.add_argument("--task", default="statistics", choices=["statistics", "tensor"])
    ap.add_argument("--seq", type=int, default=SEQ, help="sequence length")
    ap.add_argument("--sp", action="store_true", help="Megatron's sequence parallelism (with tp > 1)")
    ap.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"])
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--max-norm", dest="max_norm", type=float, default=1.0, help="clip_grad_norm's max (0: no clip)")
    ap.add_argument("--bias", default="zero", choices=["zero", "random"], help="bias init (Megatron: zero)")
    ap.add_argument("--experts", type=int, default=0, help="MoE: experts of every layer (0: dense MLPs)")
    ap.add_argument("--ep", type=int, default=1, help="expert parallel size (the data-parallel ranks: ep == dp)")
    ap.add_argument("--topk", type=int, default=2, help="MoE: experts each token is routed to")
    ap.add_argument("--fault", default=None, choices=["nan", "scale"])
    ap.add_argument("--fault-step", dest="fault_step", type=int, default=1)
    ap.add_argument("--fault-rank", dest="fault_rank", type=int, default=-1)
    ap.add_argument("--fault-layer", dest="fault_layer", type=int, default=0)
    ap.add_argument("--fault-mb", dest="fault_mb", type=int, default=0)
    ap.add_argument("--fault-expert", dest="fault_expert", type=int, default=0, help="MoE: the fault's global expert")
    return ap


def main(argv: Optional[list] = None) -> int:
    args = parser().parse_args(argv)
    sidecar = train(args)
    os.makedirs(args.truth, exist_ok=True)
    with open(os.path.join(args.truth, f"rank{sidecar['rank']}.json"), "w", encoding="utf-8") as f:
        json.dump(sidecar, f, indent=1)
    return 0


# -- the launcher -----------------------------------------------------------------------------------

def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def launch(dump: str, truth: str, *, tp: int = 1, pp: int = 1, dp: int = 1, vpp: int = 1, order: str = "tp-dp-pp",
           fault: Optional[str] = None, fault_step: int = 1, fault_rank: int = -1, fault_layer: int = 0,
           fault_mb: int = 0, steps: int = 2, level: str = "mix", optimizer: str = "sgd", max_norm: float = 1.0,
           bias: str = "zero", timeout: float = 600, python: str = sys.executable, task: str = "statistics",
           seq: int = SEQ, sp: bool = False, experts: int = 0, ep: int = 1, topk: int = 2,
           fault_expert: int = 0, cp: int = 1, attn: bool = False) -> list:
    """Run every rank (tp * pp * dp processes, OMP_NUM_THREADS=1) into ``dump``; returns the
    sidecars in rank order. RuntimeError with the ranks' output when one fails."""
    world = tp * pp * dp * cp
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    argv = [python, os.path.abspath(__file__), os.path.abspath(dump), os.path.abspath(truth), "--tp", str(tp),
            "--pp", str(pp), "--dp", str(dp), "--vpp", str(vpp), "--order", order, "--steps", str(steps),
            "--level", level, "--optimizer", optimizer, "--max-norm", str(max_norm), "--bias", bias, "--task", task,
            "--seq", str(seq), "--experts", str(experts), "--ep", str(ep), "--topk", str(topk), "--cp", str(cp)] + \
        (["--sp"] if sp else []) + (["--attn"] if attn else [])
    if fault:
        argv += ["--fault", fault, "--fault-step", str(fault_step), "--fault-rank", str(fault_rank),
                 "--fault-layer", str(fault_layer), "--fault-mb", str(fault_mb), "--fault-expert", str(fault_expert)]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME",)}
    env.update(WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1", PYTHONPATH=root)
    for attempt in range(PORT_TRIES):
        env["MASTER_PORT"] = free_port()
        procs, outs = _run_ranks(argv, env, world, dump, timeout)
        if not any(p.returncode for p in procs):
            return read_truth(truth)
        failed = [o for p, o in zip(procs, outs) if p.returncode]
        if attempt + 1 < PORT_TRIES and lost_the_port(failed) and not _has_files(dump) and not _has_files(truth):
            continue  # the rendezvous port was taken between free_port() and rank 0's listen: nothing ran yet
        raise RuntimeError(f"{dump} failed:\n" + "\n".join(f"-- rank {r}:\n{o[-3000:]}" for r, o in enumerate(outs)
                                                            if procs[r].returncode))
    raise AssertionError("unreachable")


#: launches tried when the rendezvous port was lost to another process (free_port() lets it go before rank 0's
#: TCPStore listens on it: on a machine running other multi-process tests another socket may take it meanwhile)
PORT_TRIES = 3


def lost_the_port(outs: list) -> bool:
    """Whether the ranks' output says the rendezvous port was in use (torch's TCPStore: EADDRINUSE)."""
    return any("EADDRINUSE" in o or "ddress already in use" in o for o in outs)


def _has_files(root: str) -> bool:
    return any(files for _, _, files in os.walk(root)) if os.path.isdir(root) else False


def _run_ranks(argv: list, env: dict, world: int, dump: str, timeout: float) -> tuple:
    """Every rank run to its end; once one has failed, the others are given FAILED_GRACE seconds and then
    killed (a rank whose peer is gone can wait on it for torch's 30-minute store timeout). Returns the
    processes and each one's output."""
    import tempfile

    logs = [tempfile.TemporaryFile() for _ in range(world)]
    try:
        procs = [subprocess.Popen(argv, env=dict(env, RANK=str(r)), stdout=logs[r], stderr=subprocess.STDOUT)
                 for r in range(world)]
        deadline = time.monotonic() + timeout
        failed_at = None
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            if failed_at is None and any(p.returncode for p in procs):
                failed_at = now
            if now > deadline or (failed_at is not None and now - failed_at > FAILED_GRACE):
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                for p in procs:
                    p.wait()
                if failed_at is None:
                    raise RuntimeError(f"{dump}: a rank ran past {timeout} s")
                break
            time.sleep(0.1)
        outs = []
        for log in logs:
            log.seek(0)
            outs.append(log.read().decode(errors="replace"))
        return procs, outs
    finally:
        for log in logs:
            log.close()


#: seconds the other ranks are given to end once one has failed
FAILED_GRACE = 30.0


def read_truth(truth: str) -> list:
    out = []
    for name in sorted(os.listdir(truth), key=lambda n: int(n[4:-5])):
        with open(os.path.join(truth, name), encoding="utf-8") as f:
            out.append(json.load(f))
    return out


if __name__ == "__main__":
    sys.exit(main())
