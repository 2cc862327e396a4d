"""MindSpore dumper benchmark: step time under PrecisionDebugger vs no tool, ours vs the real
msprobe 26.2.0, on a small MindSpore CPU model (PyNative, value_and_grad + SGD).

Each (tool, level) runs in its own process: K steps without any tool (the baseline, same
process), then K steps between start()/stop()/step(); the ratio is tool/baseline CPU time
(``time.process_time``, less disturbed by other load than wall time; wall given too).

    python bench/bench_mindspore.py --ours-python VENV1/bin/python --real-python VENV2/bin/python

``--ours-python``: a venv with mindspore (numpy<2), our sources on PYTHONPATH (the test venv of
tests/dumpers/mindspore/ms_venv.py). ``--real-python``: a venv with mindspore and
mindstudio-probe 26.2.0 (its Norm needs ``mint.norm`` replaced by ``ops.norm`` on CPU, done here).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(tool: str, level: str, steps: int, warmup: int) -> dict:
    """``level`` "graph-L0": GRAPH_MODE, the debugger started with the model before the loop (the
    docs' static-graph use); the baseline and the dumped run then use two instances of the net,
    because the dump points are compiled into the second one's graph."""
    import mindspore
    import numpy as np
    from mindspore import Tensor, nn, ops

    graph = level.startswith("graph-")
    level = level[len("graph-"):] if graph else level
    mindspore.set_context(mode=mindspore.GRAPH_MODE if graph else mindspore.PYNATIVE_MODE, device_target="CPU")
    mindspore.set_seed(0)
    if tool == "real":
        mindspore.mint.norm = mindspore.ops.norm  # 26.2.0's Norm has no CPU kernel otherwise

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, pad_mode="same")
            self.conv2 = nn.Conv2d(8, 8, 3, pad_mode="same")
            self.act = nn.ReLU()
            self.fc1 = nn.Dense(8 * 8 * 8, 64)
            self.fc2 = nn.Dense(64, 64)
            self.norm = nn.LayerNorm((64,))
            self.fc3 = nn.Dense(64, 10)

        def construct(self, x):
            h = self.act(self.conv1(x))
            h = self.act(self.conv2(h))
            h = h.reshape(h.shape[0], -1)
            h = ops.gelu(self.fc1(h))
            h = self.norm(h + self.fc2(h))
            return ops.log_softmax(self.fc3(h), axis=-1)

    class WithLoss(nn.Cell):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def construct(self, x, y):
            return ops.nll_loss(self.net(x), y)

    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((16, 3, 8, 8)).astype(np.float32))
    y = Tensor(rng.integers(0, 10, 16).astype(np.int32))

    def make_step(net):
        opt = nn.SGD(net.trainable_params(), learning_rate=0.01)
        grad_fn = mindspore.value_and_grad(WithLoss(net), None, opt.parameters)

        def one_step():
            loss, grads = grad_fn(x, y)
            opt(grads)
            return float(loss.asnumpy())
        return one_step

    net = Net()
    one_step = make_step(net)

    def timed(fn, n):
        c, w = time.process_time(), time.perf_counter()
        for _ in range(n):
            fn()
        return (time.process_time() - c) / n, (time.perf_counter() - w) / n

    for _ in range(warmup):
        one_step()
    base_cpu, base_wall = timed(one_step, steps)
    if tool == "none":
        return {"base_cpu": base_cpu, "base_wall": base_wall}
    dump = tempfile.mkdtemp(prefix=f"bench_ms_{tool}_{level}_")
    cfg = os.path.join(dump, "config.json")
    with open(cfg, "w") as f:
        json.dump({"task": "statistics", "dump_path": os.path.join(dump, "out"), "level": level, "rank": [],
                   "step": [], "async_dump": False, "statistics": {"scope": [], "list": [],
                                                                   "data_mode": ["all"],
                                                                   "summary_mode": "statistics"}}, f)
    from msprobe.mindspore import PrecisionDebugger

    dbg = PrecisionDebugger(config_path=cfg)
    if graph:  # a fresh net, its construct compiled with the dump points
        mindspore.set_seed(0)
        net = Net()
        dbg.start(model=net)
        one_step = make_step(net)

    def dumped_step():
        dbg.start(model=net)
        one_step()
        dbg.stop()
        dbg.step()

    for _ in range(warmup):
        dumped_step()
    cpu, wall = timed(dumped_step, steps)
    records = 0
    for dirpath, _, files in os.walk(os.path.join(dump, "out")):
        if "dump.json" in files:
            with open(os.path.join(dirpath, "dump.json")) as f:
                records = len(json.load(f)["data"])
            break
    return {"base_cpu": base_cpu, "base_wall": base_wall, "cpu": cpu, "wall": wall, "records": records,
            "ratio_cpu": cpu / base_cpu, "ratio_wall": wall / base_wall}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs=2, metavar=("TOOL", "LEVEL"))
    ap.add_argument("--ours-python", default=sys.executable)
    ap.add_argument("--real-python")
    ap.add_argument("--levels", default="L1,mix", help="comma list; graph-L0 runs GRAPH_MODE L0")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child[0], args.child[1], args.steps, args.warmup)))
        return
    runs = [("ours", lvl, args.ours_python) for lvl in args.levels.split(",")]
    if args.real_python:
        runs += [("real", lvl, args.real_python) for lvl in args.levels.split(",")]
    print(f"{'tool':6} {'level':8} {'records':>7} {'base ms':>8} {'tool ms':>8} {'x cpu':>6} {'x wall':>6}")
    for tool, level, py in runs:
        env = dict(os.environ, GLOG_v="3")
        if tool == "ours":
            env["PYTHONPATH"] = ROOT
        else:
            env.pop("PYTHONPATH", None)
        out = subprocess.run([py, os.path.abspath(__file__), "--child", tool, level, "--steps", str(args.steps),
                              "--warmup", str(args.warmup)], env=env, cwd=tempfile.gettempdir(),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
        if not line:
            print(f"{tool} {level} failed:\n{out.stdout[-2000:]}")
            continue
        r = json.loads(line[0][7:])
        print(f"{tool:6} {level:8} {r['records']:7d} {r['base_cpu'] * 1e3:8.1f} {r['cpu'] * 1e3:8.1f} "
              f"{r['ratio_cpu']:6.1f} {r['ratio_wall']:6.1f}")


if __name__ == "__main__":
    main()
