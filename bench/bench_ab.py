"""The statistics dumper of two checkouts side by side in one run (e.g. before and after a change).

``python bench/bench_ab.py OLD_TREE NEW_TREE [--size gpt2] [--rounds 3] [--modes L1,mix,md5]``

Each measurement is a fresh process of ``bench/run_step_bench.py`` from that checkout (its own
``msprobe`` on ``PYTHONPATH``), 1 torch thread, process CPU per step (median of 5 measured steps); each
round runs the no-tool baseline once, then every mode from both checkouts, the order of the two
alternating between rounds. Prints each mode's mean ratio over the no-tool run (± standard error over
the rounds) and the ratio of the two overheads (new / old: below 1 is faster).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def measure(tree: str, tool: str, mode: str, size: str) -> float:
    env = dict(os.environ, PYTHONPATH=tree)
    cmd = [sys.executable, os.path.join(tree, "bench", "run_step_bench.py"), "--tool", tool, "--mode", mode,
           "--size", size, "--steps", "5", "--dump-path", f"/tmp/bench_ab_{abs(hash(tree))}_{mode}",
           "--threads", "1", "--window", "step"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd="/tmp", timeout=900)
    if out.returncode:
        raise SystemExit(f"{cmd} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["cpu_ms_median"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--size", default="gpt2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="L1,mix,md5")
    args = ap.parse_args()
    modes = args.modes.split(",")
    baseline, ratios = [], {}
    for round_index in range(args.rounds):
        base = measure(args.new, "none", "L1", args.size)
        baseline.append(base)
        for mode in modes:
            order = ("old", "new") if round_index % 2 == 0 else ("new", "old")
            for side in order:
                tree = args.old if side == "old" else args.new
                ratios.setdefault((side, mode), []).append(measure(tree, "msprobe", mode, args.size) / base)
        print(f"round {round_index} done", flush=True)
    print(f"size={args.size} rounds={args.rounds} no tool: {statistics.median(baseline):.1f} ms CPU/step")
    for mode in modes:
        old, new = ratios[("old", mode)], ratios[("new", mode)]
        err = (lambda values: statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0)
        print(f"{mode:5s} old {statistics.mean(old):.3f}x (+-{err(old):.3f})  new {statistics.mean(new):.3f}x "
              f"(+-{err(new):.3f})  overhead new/old {(statistics.mean(new) - 1) / (statistics.mean(old) - 1):.2f}")


if __name__ == "__main__":
    main()
