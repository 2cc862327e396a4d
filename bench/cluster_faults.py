"""Cluster faults for the cluster-fault benchmark (bench/bench_cluster.py) and its small version in
the tests (tests/compare/test_cluster.py): tiny plain-PyTorch training runs over real
torch.distributed (gloo on 127.0.0.1, 2 ranks spawned here), 3 steps under PrecisionDebugger
(statistics, level mix), with one known fault injected at step 1.

Layouts (:data:`LAYOUTS`):

* ``pp``: a 2-stage pipeline, blocking ``send``/``recv`` (received into ``torch.empty``): stage 0
  sends its activations, stage 1 sends the input gradient back;
* ``pp_async``: the same pipeline over 2 micro-batches with ``isend``/``irecv`` and ``wait()``;
* ``tp``: Megatron-style tensor parallel: a column-parallel linear, a row-parallel linear whose
  partial sums are ``all_reduce``d, a column-parallel head whose outputs are ``all_gather``ed
  (autograd functions as Megatron writes them: the backward's ``all_reduce`` too);
* ``dp``: data parallel, each rank's gradients ``all_reduce``d and averaged by hand;
* ``ep``: expert parallel, one expert per rank, tokens dispatched and combined by
  ``all_to_all_single`` (and its backward);
* ``bcast``: rank 0 makes a scale vector and ``broadcast``s it (the others receive into
  ``torch.empty``); every rank multiplies its activations by it.

A NaN/Inf fault is written at one *site* of one rank: every site calls ``t.fmod(a).div(b)`` at
every step, ``t`` unchanged (``a`` 1e15, ``b`` 1) but at the fault's (step, rank, site), where one
element of ``a`` (NaN) or ``b`` (Inf) is 0; so a run's records are the same with and without the
fault, no argument is ever non-finite, and the injected record is known:
``Tensor.fmod.<k>.forward`` (NaN) or ``Tensor.div.<k>.forward`` (Inf), ``k`` the site's place
among the rank's sites of the step. (A ``masked_fill(mask, nan)`` would carry its NaN fill value
into every step's record.) A ``scale`` fault multiplies one rank's weight (shard) by 1.05 before step 1
(it stays off from then on): the expected origin is the record consuming it, the module given.

Run as a script (``python bench/cluster_faults.py LAYOUT FAULT DUMP_PATH PORT``) it trains one run
under whichever ``msprobe`` imports (ours with PYTHONPATH at the checkout, the real tool from its
venv with the working directory outside the checkout): see :func:`run`.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Any, Optional

STEPS = 3
FAULT_STEP = 1
WORLD = 2
H = 8

#: the layouts and, per rank, their fault sites in call order within a step
LAYOUTS: dict = {
    "pp": {0: ["s0f", "s0b"], 1: ["s1f", "s1b"]},
    "pp_async": {0: ["s0f0", "s0f1", "s0b0", "s0b1"], 1: ["s1f0", "s1f1", "s1b0", "s1b1"]},
    "tp": {0: ["col"], 1: ["col"]},
    "dp": {0: ["grad"], 1: ["grad"]},
    "ep": {0: ["expert"], 1: ["expert"]},
    "bcast": {0: ["root"], 1: []},
}

#: the faults: name -> (layout, kind, rank, site or module scaled by 1.05, what it is)
FAULTS: dict = {
    "pp/nan_s0_fwd": ("pp", "nan", 0, "s0f", "NaN in stage 0's forward: reaches stage 1 by send/recv"),
    "pp/nan_s1_fwd": ("pp", "nan", 1, "s1f", "NaN in stage 1's forward: comes back to stage 0 with the gradient"),
    "pp/nan_s1_bwd": ("pp", "nan", 1, "s1b", "NaN in the input gradient stage 1 sends back"),
    "pp/inf_s0_bwd": ("pp", "inf", 0, "s0b", "Inf in the gradient stage 0 received, before its backward"),
    "pp/scale_s0": ("pp", "scale", 0, "l1", "stage 0's first weight x1.05"),
    "pp_async/nan_s0_fwd": ("pp_async", "nan", 0, "s0f1", "NaN in stage 0's forward of micro-batch 1 (isend)"),
    "pp_async/nan_s1_fwd": ("pp_async", "nan", 1, "s1f1", "NaN in stage 1's forward of micro-batch 1"),
    "pp_async/nan_s1_bwd": ("pp_async", "nan", 1, "s1b0", "NaN in micro-batch 0's gradient stage 1 isends back"),
    "pp_async/nan_s0_bwd": ("pp_async", "nan", 0, "s0b1", "NaN in micro-batch 1's gradient stage 0 irecv'd"),
    "tp/nan_shard": ("tp", "nan", 1, "col", "NaN in rank 1's column-parallel shard (all_reduce spreads it)"),
    "tp/scale_shard": ("tp", "scale", 1, "row", "rank 1's row-parallel weight shard x1.05"),
    "dp/inf_grad": ("dp", "inf", 1, "grad", "Inf in rank 1's gradient before the gradient all_reduce"),
    "ep/nan_expert": ("ep", "nan", 1, "expert", "NaN out of rank 1's expert (all_to_all_single back)"),
    "ep/scale_expert": ("ep", "scale", 1, "expert", "rank 1's expert weight x1.05"),
    "bcast/nan_root": ("bcast", "nan", 0, "root", "NaN in the tensor the root broadcasts"),
}


def place(fault: str) -> dict:
    """Where ``fault`` is injected: {kind, step, rank, record (NaN/Inf) or module (scale)}."""
    layout, kind, rank, site, _ = FAULTS[fault]
    out = {"fault": fault, "layout": layout, "kind": kind, "step": FAULT_STEP, "rank": rank, "record": None,
           "module": None}
    if kind == "scale":
        out["module"] = site
    else:
        api = "fmod" if kind == "nan" else "div"
        out["record"] = f"Tensor.{api}.{LAYOUTS[layout][rank].index(site)}.forward"
    return out


# -- the training run (torch imported inside) ------------------------------------------------------

class _Run:
    """One rank's run: its step, the fault, the masks."""

    def __init__(self, layout: str, fault: str, rank: int) -> None:
        self.layout, self.rank, self.step = layout, rank, 0
        spec = FAULTS.get(fault)
        self.kind, self.frank, self.site = (spec[1], spec[2], spec[3]) if spec else (None, None, None)

    def inject(self, t: Any, site: str) -> Any:
        """``t.fmod(a).div(b)``: ``a`` 1e15 and ``b`` 1 (``t`` unchanged, bit for bit) but at one
        element at the fault's (step, rank, site), where ``a`` is 0 (fmod: NaN) or ``b`` is 0 (div:
        Inf), the only non-finite values born of finite inputs in the run. (``a`` 1e30 gave 26.2.0's
        float32 ``Norm`` of ``a`` an overflow, ``inf``, at every step: an infinite statistic of a
        finite argument, which our ``lake nan`` and ``overflow_check`` name as an Inf at step 0.)"""
        import torch

        hit = self.step == FAULT_STEP and self.rank == self.frank and site == self.site
        a = torch.tensor(_nested([0.0 if hit and self.kind == "nan" and i == 1 else 1e15 for i in range(t.numel())],
                                 t.shape))
        b = torch.tensor(_nested([0.0 if hit and self.kind == "inf" and i == 1 else 1.0 for i in range(t.numel())],
                                 t.shape))
        return t.fmod(a).div(b)

    def scaled(self, module: str) -> bool:
        """Whether ``module`` of this rank is scaled now (before step 1, once)."""
        return self.kind == "scale" and self.step == FAULT_STEP and self.rank == self.frank and module == self.site


def _nested(cells: list, shape: Any) -> list:
    """``cells`` as nested lists of ``shape`` (torch.tensor makes them a tensor: no recorded API)."""
    for size in reversed(tuple(shape)[1:]):
        cells = [cells[i:i + size] for i in range(0, len(cells), size)]
    return cells


def _data(step: int, rank: int, *shape: int) -> Any:
    import torch

    g = torch.Generator().manual_seed(1000 * step + rank + 7)
    return torch.randn(*shape, generator=g)


def _stage(run: _Run) -> Any:
    import torch
    import torch.nn as nn

    class Stage(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l1 = nn.Linear(H, H)
            self.l2 = nn.Linear(H, H)
            self.site = ""

        def forward(self, x: Any) -> Any:
            return self.l2(torch.tanh(run.inject(self.l1(x), self.site)))

    return Stage()


def _pp(run: _Run, model: Any) -> None:
    import torch
    import torch.distributed as dist

    if run.rank == 0:
        model.site = "s0f"
        act = model(_data(run.step, 0, 4, H))
        dist.send(act.detach(), dst=1)
        grad = torch.empty(4, H)
        dist.recv(grad, src=1)
        act.backward(run.inject(grad, "s0b"))
    else:
        model.site = "s1f"
        buf = torch.empty(4, H)
        dist.recv(buf, src=0)
        buf.requires_grad_()
        loss = (model(buf) - _data(run.step, 1, 4, H)).pow(2).mean()
        loss.backward()
        dist.send(run.inject(buf.grad, "s1b"), dst=0)


def _pp_async(run: _Run, model: Any) -> None:
    import torch
    import torch.distributed as dist

    if run.rank == 0:
        acts = []
        for mb in range(2):
            model.site = f"s0f{mb}"
            acts.append(model(_data(run.step, mb, 2, H)))
        for w in [dist.isend(a.detach(), dst=1) for a in acts]:
            w.wait()
        grads = [torch.empty(2, H) for _ in range(2)]
        for w in [dist.irecv(g, src=1) for g in grads]:
            w.wait()
        for mb in range(2):
            acts[mb].backward(run.inject(grads[mb], f"s0b{mb}"))
    else:
        bufs = [torch.empty(2, H) for _ in range(2)]
        for w in [dist.irecv(b, src=0) for b in bufs]:
            w.wait()
        loss = 0
        for mb in range(2):
            bufs[mb].requires_grad_()
            model.site = f"s1f{mb}"
            loss = loss + (model(bufs[mb]) - _data(run.step, 10 + mb, 2, H)).pow(2).mean()
        loss.backward()  # type: ignore[union-attr]
        back = [run.inject(bufs[mb].grad, f"s1b{mb}") for mb in range(2)]
        for w in [dist.isend(g, dst=0) for g in back]:
            w.wait()


def _functions() -> tuple:
    """Megatron's communication as autograd functions: (copy to the group: backward all_reduce,
    reduce from the group: forward all_reduce, gather from the group: forward all_gather,
    all-to-all: all_to_all_single both ways)."""
    import torch
    import torch.distributed as dist

    class Copy(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return x.view_as(x)

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            g = g.clone()
            dist.all_reduce(g)
            return g

    class Reduce(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            x = x.clone()
            dist.all_reduce(x)
            return x

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            return g

    class Gather(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
            dist.all_gather(parts, x.contiguous())
            ctx.width = x.shape[-1]
            return torch.cat(parts, dim=-1)

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            r = dist.get_rank()
            return g[..., r * ctx.width:(r + 1) * ctx.width].contiguous()

    class AllToAll(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            out = torch.empty_like(x)
            dist.all_to_all_single(out, x.contiguous())
            return out

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            out = torch.empty_like(g)
            dist.all_to_all_single(out, g.contiguous())
            return out

    return Copy, Reduce, Gather, AllToAll


def _tp_model(run: _Run) -> Any:
    import torch
    import torch.nn as nn

    Copy, Reduce, Gather, _ = _functions()
    full1, full2, full3 = nn.Linear(H, 2 * H), nn.Linear(2 * H, H), nn.Linear(H, H)  # seeded: the same on all ranks
    r = run.rank

    class TP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.col = nn.Linear(H, H)
            self.row = nn.Linear(H, H, bias=False)
            self.head = nn.Linear(H, H // 2)
            with torch.no_grad():
                self.col.weight.copy_(full1.weight[r * H:(r + 1) * H])
                self.col.bias.copy_(full1.bias[r * H:(r + 1) * H])
                self.row.weight.copy_(full2.weight[:, r * H:(r + 1) * H])
                self.head.weight.copy_(full3.weight[r * H // 2:(r + 1) * H // 2])
                self.head.bias.copy_(full3.bias[r * H // 2:(r + 1) * H // 2])

        def forward(self, x: Any) -> Any:
            h = torch.tanh(run.inject(self.col(Copy.apply(x)), "col"))
            z = torch.tanh(Reduce.apply(self.row(h)))
            return Gather.apply(self.head(Copy.apply(z)))

    return TP()


def _tp(run: _Run, model: Any) -> None:
    x = _data(run.step, 0, 4, H)  # the same batch on every rank of the group
    loss = (model(x) - _data(run.step, 50, 4, H)).pow(2).mean()
    loss.backward()


def _dp(run: _Run, model: Any) -> None:
    import torch.distributed as dist

    loss = (model(_data(run.step, run.rank, 4, H)) - _data(run.step, 20 + run.rank, 4, H)).pow(2).mean()
    loss.backward()
    for name, p in model.named_parameters():
        g = run.inject(p.grad, "grad") if name == "l1.weight" else p.grad
        dist.all_reduce(g)
        p.grad = g / WORLD


def _ep_model(run: _Run) -> Any:
    import torch
    import torch.nn as nn

    _, _, _, AllToAll = _functions()
    experts = [nn.Linear(H, H) for _ in range(WORLD)]  # seeded: rank r keeps expert r

    class EP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate = nn.Linear(H, H)
            self.expert = experts[run.rank]

        def forward(self, x: Any) -> Any:
            h = torch.tanh(self.gate(x))
            mine = AllToAll.apply(h)  # rows [2r, 2r+2) of every rank's tokens go to expert r
            out = run.inject(torch.tanh(self.expert(mine)), "expert")
            return AllToAll.apply(out) + h

    return EP()


def _ep(run: _Run, model: Any) -> None:
    loss = (model(_data(run.step, run.rank, 4, H)) - _data(run.step, 30 + run.rank, 4, H)).pow(2).mean()
    loss.backward()


def _bcast(run: _Run, model: Any) -> None:
    import torch
    import torch.distributed as dist

    if run.rank == 0:
        scale = run.inject(1 + 0.1 * _data(run.step, 40, H), "root")
    else:
        scale = torch.empty(H)
    dist.broadcast(scale, src=0)
    loss = (model(_data(run.step, run.rank, 4, H)) * scale).pow(2).mean()
    loss.backward()


def _model(run: _Run) -> Any:
    import torch.nn as nn

    if run.layout == "tp":
        return _tp_model(run)
    if run.layout == "ep":
        return _ep_model(run)
    if run.layout in ("pp", "pp_async"):
        models = [_stage(run) for _ in range(WORLD)]
        return models[run.rank]

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l1 = nn.Linear(H, H)
            self.l2 = nn.Linear(H, H)

        def forward(self, x: Any) -> Any:
            import torch

            return self.l2(torch.tanh(self.l1(x)))

    return Net()


BODIES = {"pp": _pp, "pp_async": _pp_async, "tp": _tp, "dp": _dp, "ep": _ep, "bcast": _bcast}


def train(rank: int, layout: str, fault: str, dump: str, port: str) -> None:
    """One rank of a run (``fault`` "none": the healthy run), spawned by :func:`main`."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = port
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    from msprobe.pytorch import PrecisionDebugger

    debugger = PrecisionDebugger(task="statistics", level="mix", dump_path=dump)
    torch.manual_seed(1234)
    run = _Run(layout, fault, rank)
    model = _model(run)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        run.step = step
        for name, module in model.named_modules():
            if name and run.scaled(name):
                with torch.no_grad():
                    module.weight.mul_(1.05)
        debugger.start(model)
        BODIES[layout](run, model)
        debugger.stop()
        opt.step()
        opt.zero_grad()
        debugger.step()
    dist.barrier()
    dist.destroy_process_group()


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def run(layout: str, fault: str, dump: str, *, python: str = sys.executable, ours: bool = True,
        cwd: Optional[str] = None, timeout: float = 600) -> None:
    """Dump one run (both ranks) into ``dump``: ours (PYTHONPATH at this checkout) or, with
    ``ours=False`` and the real tool's ``python``, the real tool (PYTHONPATH cleared, the working
    directory ``cwd`` outside the checkout)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["OMP_NUM_THREADS"] = "1"
    if ours:
        env["PYTHONPATH"] = root
    os.makedirs(dump, exist_ok=True)
    out = subprocess.run([python, os.path.abspath(__file__), layout, fault, os.path.abspath(dump), free_port()],
                         env=env, cwd=cwd or os.path.dirname(os.path.abspath(dump)), capture_output=True, text=True,
                         timeout=timeout)
    if out.returncode:
        raise RuntimeError(f"{layout}/{fault} ({'ours' if ours else python}) failed: {out.stderr[-3000:]}")


def main() -> None:
    import torch.multiprocessing as mp

    layout, fault, dump, port = sys.argv[1:5]
    healthy = fault.startswith("none")  # none, none2: healthy runs
    if not healthy and f"{layout}/{fault}" not in FAULTS:
        raise SystemExit(f"{fault} is no fault of {layout}")
    mp.spawn(train, args=(layout, "none" if healthy else f"{layout}/{fault}", dump, port), nprocs=WORLD)


if __name__ == "__main__":
    main()
