"""APIs checked per second: our ``msprobe run_ut`` vs the real checker (26.2.0 ``acc_check``), same run.

1. dumps one training step of bench/gpt_model.py at L1, task tensor, with OUR dumper;
2. runs our checker (``-n 1`` and ``-n 2`` worker processes) and the real 26.2.0 checker on
   CPU (through tests/fixtures/real/scripts/acc_check_cpu.py, in the venv tests/_realtool.py
   caches) over the same dump.json;
3. prints, per tool, the APIs in its result CSV, wall and child CPU seconds
   (``resource.getrusage(RUSAGE_CHILDREN)``), and APIs per second of each.

usage: python bench/bench_run_ut.py [--size opheavy|gpt2] [--no-real] [--workdir DIR]
"""
from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

DRIVER = r"""
import sys, torch
sys.path.insert(0, {bench!r})
from gpt_model import GPT, SIZES
from msprobe.pytorch import PrecisionDebugger
cfg = dict(SIZES[{size!r}])
batch = cfg.pop("batch")
torch.manual_seed(0)
model = GPT(**cfg)
opt = torch.optim.SGD(model.parameters(), lr=0.01, foreach=False)
dbg = PrecisionDebugger(config_path={config!r})
ids = torch.randint(0, cfg["vocab"], (batch, cfg["seq"]))
dbg.start(model=model)
logits = model(ids)
loss = torch.nn.functional.cross_entropy(logits.view(-1, cfg["vocab"]), ids.view(-1))
loss.backward()
opt.step()
opt.zero_grad()
dbg.stop()
dbg.step()
"""


def _timed(cmd: list, env: dict, cwd: str, timeout: float) -> dict:
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return {"rc": p.returncode, "wall_s": wall, "cpu_s": cpu, "tail": (p.stdout + p.stderr)[-1500:]}


def _apis(out_dir: str) -> int:
    found = glob.glob(os.path.join(out_dir, "accuracy_checking_result_*.csv"))
    if not found:
        return 0
    with open(found[0], newline="", encoding="utf-8-sig") as fh:
        return max(0, len(list(csv.reader(fh))) - 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--size", default="opheavy", choices=["opheavy", "gpt2"])
    ap.add_argument("--no-real", action="store_true", help="skip the real checker")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="bench_run_ut_")
    os.makedirs(work, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    ours_env = dict(env, PYTHONPATH=ROOT)
    config = os.path.join(work, "config.json")
    with open(config, "w") as fh:
        json.dump({"task": "tensor", "dump_path": os.path.join(work, "dump"), "level": "L1", "step": [0],
                   "rank": [], "risk_level": "ALL", "tensor": {"scope": [], "list": [], "data_mode": ["all"]}}, fh)
    driver = DRIVER.format(bench=os.path.join(ROOT, "bench"), size=args.size, config=config)
    d = _timed([sys.executable, "-c", driver], ours_env, work, args.timeout)
    if d["rc"] != 0:
        print(d["tail"], file=sys.stderr)
        return 1
    dump = glob.glob(os.path.join(work, "dump", "step0", "*", "dump.json"))[0]
    with open(dump) as fh:
        n_fwd = sum(1 for k in json.load(fh)["data"] if k.endswith(".forward"))
    res = {"size": args.size, "dump": dump, "forward_records": n_fwd, "runs": {}}
    for n in args.workers:
        out = os.path.join(work, f"ours_n{n}")
        r = _timed([sys.executable, "-m", "msprobe", "run_ut", "-api_info", dump, "-o", out, "-n", str(n), "-q"],
                   ours_env, work, args.timeout)
        r["apis"] = _apis(out)
        res["runs"][f"ours -n {n}"] = r
    if not args.no_real:
        import _realtool

        py = _realtool.real_tool_python("26.2.0")
        out = os.path.join(work, "real26")
        os.makedirs(out, exist_ok=True)
        r = _timed([py, str(_realtool.CPU_WRAPPER), "-api_info", dump, "-o", out], env, out, args.timeout)
        r["apis"] = _apis(out)
        res["runs"]["real 26.2.0 acc_check"] = r
    for name, r in res["runs"].items():
        r["apis_per_wall_s"] = r["apis"] / r["wall_s"] if r["wall_s"] else 0.0
        r["apis_per_cpu_s"] = r["apis"] / r["cpu_s"] if r["cpu_s"] else 0.0
        if r["rc"] == 0:
            r.pop("tail")
    print(json.dumps(res, indent=1))
    base = res["runs"].get("real 26.2.0 acc_check")
    if base and base["rc"] == 0:
        for name, r in res["runs"].items():
            print(f"{name}: {r['apis']} APIs, {r['wall_s']:.1f} s wall ({r['apis_per_wall_s']:.2f} APIs/s), "
                  f"{r['cpu_s']:.1f} s CPU ({r['apis_per_cpu_s']:.2f} APIs/CPU-s); CPU-time speed-up vs real "
                  f"{(base['cpu_s'] / r['cpu_s']) * (r['apis'] / max(base['apis'], 1)) if r['cpu_s'] else 0:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
