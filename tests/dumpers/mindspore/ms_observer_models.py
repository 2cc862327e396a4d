"""Small MindSpore models trained 3 steps in PyNative mode on CPU, with or without our dumper (issue 40,
spec/PRODUCER.md §20 item 43): run as a script in the MindSpore venv, it prints one JSON line, the
run's fingerprint (each step's loss and gradients, every parameter's bytes after the last step, as
hex digests of the raw bytes). ms_test_observer.py compares the fingerprints bitwise.

usage: python ms_observer_models.py --model rmsnorm|dropout|batchnorm [--level L0|L1|mix
       --task statistics|md5|tensor --dump-path DIR [--data-mode all|forward|backward]] [--seed-all]
       [--cell-hooks]

* ``rmsnorm``: pre-norm residual blocks whose RMSNorm-like Cell takes a tensor that also feeds the
  residual (used inside and outside a Cell: its gradient is a sum of two paths), Adam;
* ``dropout``: a residual MLP with ``nn.Dropout(p=0.25)`` in training mode (random masks), Momentum;
* ``batchnorm``: Dense, ``nn.BatchNorm1d`` in training mode (its moving statistics are parameters
  too), ReLU, Dense, SGD.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

import numpy as np

MODELS = ("rmsnorm", "dropout", "batchnorm")
STEPS = 3


def _digest(array) -> str:
    a = np.ascontiguousarray(array)
    return hashlib.sha256(str(a.dtype).encode() + str(a.shape).encode() + a.tobytes()).hexdigest()[:24]


def build(name: str):
    import mindspore
    from mindspore import Parameter, Tensor, mint, nn, ops

    class RMSNorm(nn.Cell):
        def __init__(self, dim: int):
            super().__init__()
            self.weight = Parameter(Tensor(np.linspace(0.5, 1.5, dim).astype(np.float32)), name="weight")

        def construct(self, x):
            var = mint.mean(x * x, -1, keepdim=True)
            return x * ops.rsqrt(var + 1e-6) * self.weight

    class Block(nn.Cell):
        def __init__(self, dim: int):
            super().__init__()
            self.norm = RMSNorm(dim)
            self.up = nn.Dense(dim, 2 * dim)
            self.act = nn.SiLU()
            self.down = nn.Dense(2 * dim, dim)

        def construct(self, h):  # h feeds the norm (inside the block's Cells) and the residual
            return h + self.down(self.act(self.up(self.norm(h))))

    class RmsNet(nn.Cell):
        def __init__(self):
            super().__init__()
            self.inp = nn.Dense(8, 16)
            self.blocks = nn.CellList([Block(16), Block(16)])
            self.norm = RMSNorm(16)
            self.head = nn.Dense(16, 4)

        def construct(self, x):
            h = self.inp(x)
            for block in self.blocks:
                h = block(h)
            return self.head(self.norm(h))

    class DropNet(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Dense(8, 16)
            self.act = nn.ReLU()
            self.drop = nn.Dropout(p=0.25)
            self.fc2 = nn.Dense(16, 16)
            self.head = nn.Dense(16, 4)

        def construct(self, x):
            h = self.act(self.fc1(x))
            h = h + self.fc2(self.drop(h))
            return self.head(self.drop(h))

    class BnNet(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Dense(8, 16)
            self.bn = nn.BatchNorm1d(16)
            self.act = nn.ReLU()
            self.fc2 = nn.Dense(16, 4)

        def construct(self, x):
            return self.fc2(self.act(self.bn(self.fc1(x))))

    net = {"rmsnorm": RmsNet, "dropout": DropNet, "batchnorm": BnNet}[name]()
    net.set_train(True)
    params = net.trainable_params()
    if name == "rmsnorm":
        opt = nn.Adam(params, learning_rate=0.01)
    elif name == "dropout":
        opt = nn.Momentum(params, learning_rate=0.05, momentum=0.9)
    else:
        opt = nn.SGD(params, learning_rate=0.1)
    del mindspore
    return net, opt


def batch(step: int):
    from mindspore import Tensor

    rng = np.random.default_rng(100 + step)
    x = rng.standard_normal((6, 8)).astype(np.float32)
    y = rng.integers(0, 4, size=6).astype(np.int32)
    return Tensor(x), Tensor(y)


def run(name: str, level=None, task: str = "statistics", dump_path=None, seeded: bool = False,
        data_mode: str = "all", cell_hooks: bool = False) -> dict:
    import mindspore
    from mindspore import ops

    mindspore.set_context(mode=mindspore.PYNATIVE_MODE, device_target="CPU")
    # one CPU kernel thread: with the default pool a no-tool run of ``dropout`` differed from another
    # at step 2 about once in six runs (a kernel splitting its work over threads)
    mindspore.device_context.cpu.op_tuning.threads_num(1)
    mindspore.set_seed(1234)
    np.random.seed(1234)
    if seeded:
        from msprobe.mindspore import seed_all

        seed_all(1234)
    debugger = None
    if level is not None:
        from msprobe.mindspore import PrecisionDebugger

        if cell_hooks:  # the dumper as on a MindSpore without the autograd graph in Python: its Cell hooks
            from msprobe.dumpers.mindspore import _observer

            _observer.SUPPORTED = False
        kind = "statistics" if task == "md5" else task  # md5: statistics with summary_mode md5
        cfg = {"task": kind, "dump_path": dump_path, "rank": [], "step": [], "level": level,
               kind: {"scope": [], "list": [], "data_mode": [data_mode], **({"summary_mode": "md5"} if task == "md5" else {})}}
        parent = os.path.dirname(os.path.abspath(dump_path))
        os.makedirs(parent, exist_ok=True)
        path = os.path.join(parent, f"observer_{name}_{level}_{task}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(cfg, f)
        debugger = PrecisionDebugger(config_path=path)  # before the model, as the docs show
    net, opt = build(name)

    def forward(x, y):
        return ops.cross_entropy(net(x), y, reduction="mean")

    grad_fn = mindspore.value_and_grad(forward, None, opt.parameters)
    losses, grads = [], []
    for step in range(STEPS):
        x, y = batch(step)
        if debugger is not None:
            debugger.start(model=net)
        loss, step_grads = grad_fn(x, y)
        if debugger is not None:
            debugger.stop()
            debugger.step()
        opt(step_grads)
        losses.append(_digest(loss.asnumpy()))
        grads.append({p.name: _digest(g.asnumpy()) for p, g in zip(opt.parameters, step_grads)})
    params = {p.name: _digest(p.asnumpy()) for p in net.get_parameters()}
    return {"losses": losses, "grads": grads, "params": params}


def differences(base: dict, run_: dict) -> str:
    """What differs between two fingerprints, in words."""
    out = []
    if base["losses"] != run_["losses"]:
        out.append(f"losses of steps {[i for i, (a, b) in enumerate(zip(base['losses'], run_['losses'])) if a != b]}")
    grads = [(i, k) for i, (a, b) in enumerate(zip(base["grads"], run_["grads"])) for k in a if a[k] != b.get(k)]
    if grads:
        out.append(f"{len(grads)} step gradients, first {grads[:3]}")
    params = [k for k in base["params"] if base["params"][k] != run_["params"].get(k)]
    if params:
        out.append(f"{len(params)} of {len(base['params'])} parameters ({params[:4]})")
    if set(base["params"]) != set(run_["params"]):
        out.append("parameter names")
    return "; ".join(out) or "same"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, choices=MODELS)
    ap.add_argument("--level", choices=["L0", "L1", "mix"])
    ap.add_argument("--task", default="statistics")
    ap.add_argument("--dump-path")
    ap.add_argument("--seed-all", action="store_true")
    ap.add_argument("--data-mode", default="all", choices=["all", "forward", "backward"])
    ap.add_argument("--cell-hooks", action="store_true",
                    help="record the Cells' backward through MindSpore's Cell backward hooks (identity nodes)")
    args = ap.parse_args(argv)
    print(json.dumps(run(args.model, args.level, args.task, args.dump_path, args.seed_all, args.data_mode,
                         args.cell_hooks)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
