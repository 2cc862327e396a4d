"""MindSpore runs through the layout merge, scored (issue 47 item 4; docs/benchmarks.md): the MindSpore
model written with Megatron's habits (tests/dumpers/mindspore/ms_layouts_cluster.py) on TP=2 (2 mccl
workers) and DP=2 x TP=2 (4 workers), the collectives of ``mint.distributed`` and ``ops.communication``,
each healthy, with a NaN written by rank 1's ``masked_fill`` at step 1 and with rank 1's fc1 weight shard
x1.05 from step 1, against the same model on one process. Columns: compare (first NaN; x1.05: first row
whose Result is not pass), compare origin, ``lake diverge``, ``lake nan``; a hit names the injected
record at step 1 with the ranks [1] exactly; on a healthy pair any answer is false. Every layout is
scored as given (``tp=2``, ``tp=2,dp=2``) and as ``auto``.

    PYTHONPATH=. python bench/bench_ms_layouts.py --out /tmp/msl [--layouts tp2,dp2tp2]

MindSpore runs in the venv of tests/dumpers/mindspore/ms_venv.py (built on first use). The runs are
dumped once into ``OUT`` (delete it to dump again); the scores are printed and written to
``OUT/scores.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MS_TESTS = os.path.join(ROOT, "tests", "dumpers", "mindspore")
sys.path.insert(0, MS_TESTS)

import bench_layouts as B  # noqa: E402

SCRIPT = os.path.join(MS_TESTS, "ms_layouts_cluster.py")
#: name -> (workers, script arguments, the layout to give)
LAYOUTS = {"tp2": (2, ["--tp", "2"], "tp=2"), "dp2tp2": (4, ["--tp", "2", "--dp", "2"], "tp=2,dp=2")}
COMMS = ("mint", "ops")
RUNS = ("healthy", "nan", "scale")
WANT = {"nan": "Tensor.masked_fill.0.forward", "scale": "MintFunctional.linear.0.forward"}
FAULT_STEP, FAULT_RANK = 1, 1


def dump(out: str, python: str, name: str) -> float:
    """The runs of one layout (and the single card's, once); seconds the launch took (0: dumped before)."""
    from ms_common import run_cluster

    single = os.path.join(out, "single")
    if not os.path.isdir(single):
        subprocess.run([python, SCRIPT, single, "--single", "--runs", "healthy"], check=True, cwd=out,
                       env=dict(os.environ, PYTHONPATH=ROOT, GLOG_v="3"))
    target = os.path.join(out, name)
    if os.path.isdir(target):
        return 0.0
    workers, args, _ = LAYOUTS[name]
    t0 = time.time()
    run_cluster(python, SCRIPT, [target + ".tmp", *args, "--comm", ",".join(COMMS), "--runs", ",".join(RUNS)], out,
                timeout=1800, workers=workers)
    os.rename(target + ".tmp", target)
    return time.time() - t0


def losses(out: str, name: str) -> dict:
    """The largest relative difference of each run's loss (before a fault's step) from the single card's:
    the mean of the replicas' losses (each the mean over its share of the batch; tp rank 0's)."""
    def side(*parts: str) -> dict:
        with open(os.path.join(out, *parts), encoding="utf-8") as f:
            return json.load(f)

    ref = side("single", "healthy.rank0.json")["losses"]
    gaps = {}
    for comm in COMMS:
        for run in RUNS:
            first = side(name, comm, f"{run}.rank0.json")
            mates = [side(name, comm, f"{run}.rank{d * first['tp']}.json")["losses"] for d in range(first["dp"])]
            upto = len(ref) if run == "healthy" else FAULT_STEP
            gaps[f"{comm}.{run}"] = max(abs(sum(m[step] for m in mates) / len(mates) - ref[step]) / abs(ref[step])
                                        for step in range(upto))
    return gaps


def score(out: str, name: str, comm: str, run: str, layout: str) -> dict:
    from msprobe.compare import compare

    target = os.path.join(out, name, comm, run)
    single = os.path.join(out, "single", "healthy")
    work = os.path.join(out, "work", name, comm, run, layout)
    shutil.rmtree(work, ignore_errors=True)
    summary = compare(target, single, os.path.join(work, "cmp"), layout=layout, plot=False, progress=False)
    got = B.compare_answers(summary, None if run == "healthy" else run)
    lake = os.path.join(work, "lake")
    shutil.copytree(target, os.path.join(lake, "target"))
    shutil.copytree(single, os.path.join(lake, "bench"))
    got["lake_diverge"] = B.lake_diverge_answer(B._cli(["lake", "diverge", lake, "target", "bench", "--layout", layout,
                                                        "--no-cluster", "--json"]))
    if run == "nan":
        got["lake_nan"] = B.lake_nan_answer(B._cli(["lake", "nan", lake, "--run", "target", "--no-cluster", "--json"]),
                                            "target")
    said = sorted({m["layout"] for m in summary["layout"]["models"] if m["side"] == "target"})
    cells = {tool: cell(run, ans) for tool, ans in got.items()}
    return {"layout_said": said, "cells": cells}


def cell(run: str, ans: dict) -> str:
    if ans is None:
        return "none"
    named = f"{ans['record']} s{ans['step']} r{ans['ranks']}"
    if run == "healthy":
        return f"**{named}**"
    hit = ans["record"] == WANT[run] and ans["step"] == FAULT_STEP and ans["ranks"] == [FAULT_RANK]
    return "hit" if hit else f"miss: {named}"


def main(argv: list = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--layouts", default=",".join(LAYOUTS))
    args = p.parse_args(argv)
    from ms_venv import ensure_venv

    python, why = ensure_venv()
    if python is None:
        raise SystemExit(why)
    os.makedirs(args.out, exist_ok=True)
    scores: dict = {}
    for name in args.layouts.split(","):
        took = dump(args.out, python, name)
        scores[name] = {"launch_s": round(took, 1), "loss_gaps": losses(args.out, name), "cases": {}}
        print(f"{name}: launch {took:.0f} s, worst loss gap {max(scores[name]['loss_gaps'].values()):.2g}", flush=True)
        for comm in COMMS:
            for run in RUNS:
                for layout in (LAYOUTS[name][2], "auto"):
                    found = score(args.out, name, comm, run, layout)
                    scores[name]["cases"][f"{comm}:{run}:{layout}"] = found
                    print(f"  {comm} {run} --layout {layout} ({', '.join(found['layout_said'])}): " +
                          ", ".join(f"{tool}={text}" for tool, text in found["cells"].items()), flush=True)
    with open(os.path.join(args.out, "scores.json"), "w", encoding="utf-8") as f:
        json.dump(scores, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
