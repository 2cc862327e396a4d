"""Make the compare plot examples under docs/ (docs/compare_plot_cluster.png, docs/compare_plot_pair.png).

A tiny GPT is trained under PrecisionDebugger (``msprobe demo``'s), its statistics dump
copied into STEPS steps x RANKS rank directories (the target), and a bench made from it: every
statistic off by a float rounding (relative 1e-6, random), one rank drifting away from one
record on (a growing error), another with a few moderately off records. Then ``msprobe
compare`` over all rank pairs (the cluster plot) and over the drifting pair alone.

    PYTHONPATH=$PWD .venv/bin/python scripts/plot_examples.py [--out docs] [--steps 4] [--ranks 20]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile


def _perturb(doc: dict, rng: random.Random, scale) -> None:
    for i, raw in enumerate(doc["data"].values()):
        stack = [raw]
        while stack:
            v = stack.pop()
            if isinstance(v, dict):
                for k in ("Max", "Min", "Mean", "Norm"):
                    x = v.get(k)
                    if isinstance(x, float) and x == x and abs(x) != float("inf"):
                        v[k] = x * (1 + rng.gauss(0, scale(i)))
                stack.extend(v.values())
            elif isinstance(v, list):
                stack.extend(v)


def build(work: str, steps: int, ranks: int, drift: tuple, off: tuple) -> tuple:
    from msprobe.demo import run_demo

    src = os.path.join(work, "src")
    run_demo(src, steps=steps, quiet=True)
    target, bench = os.path.join(work, "npu"), os.path.join(work, "gpu")
    rng = random.Random(7)
    for s in range(steps):
        for r in range(ranks):
            for root in (target, bench):
                shutil.copytree(os.path.join(src, f"step{s}", "rank"), os.path.join(root, f"step{s}", f"rank{r}"))
            path = os.path.join(bench, f"step{s}", f"rank{r}", "dump.json")
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
            if (s, r) == drift:
                scale = (lambda i: 1e-6 if i < 120 else min(1e-6 * 1.08 ** (i - 120), 0.3))
            elif (s, r) == off:
                scale = (lambda i: 2e-3 if i % 37 == 5 else 1e-6)
            else:
                scale = (lambda i: 1e-6)
            _perturb(doc, rng, scale)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(doc, f)
    return target, bench


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--ranks", type=int, default=20)
    ap.add_argument("--work", default=None, help="keep the dumps here (reused when present)")
    a = ap.parse_args()
    from msprobe.compare import compare

    work = a.work or tempfile.mkdtemp(prefix="msprobe-plot-examples-")
    try:
        drift, off = (2, 13), (1, 5)
        if a.work and os.path.isdir(os.path.join(work, "gpu")):
            target, bench = os.path.join(work, "npu"), os.path.join(work, "gpu")
        else:
            target, bench = build(work, a.steps, a.ranks, drift, off)
        s = compare(target, bench, os.path.join(work, "cmp"), workers=2, timestamp="cluster", progress=False)
        shutil.copy(s["plot"], os.path.join(a.out, "compare_plot_cluster.png"))
        p = compare(target, bench, os.path.join(work, "cmp1"), step=drift[0], rank=drift[1], timestamp="pair",
                    progress=False)
        shutil.copy(p["plot"], os.path.join(a.out, "compare_plot_pair.png"))
        print(f"{len(s['pairs'])} rank pairs -> {a.out}/compare_plot_cluster.png; step {drift[0]} rank {drift[1]} "
              f"-> {a.out}/compare_plot_pair.png")
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
