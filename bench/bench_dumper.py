"""Dumper overhead: no tool vs msprobe-lake vs the real msprobe, side by side in one run.

    .venv/bin/python bench/bench_dumper.py [--size gpt2|opheavy] [--rounds 3] [--modes L1,mix,md5,tensor]
        [--real-python /path/to/venv-with-mindstudio-probe/bin/python]

Each measurement is a fresh process (1 warm-up + 5 measured steps, median); tools and
modes run in alternating rounds; the ratio is against the no-tool run of the same
interpreter, so both tools are judged against their own baseline.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OURS = sys.executable
THREADS = 0


def measure(python, tool, mode, size, steps, dump_path, env_extra=None):
    env = dict(os.environ)
    if python != OURS:  # the real tool: keep our package off its path
        env.pop("PYTHONPATH", None)
    env.update(env_extra or {})
    cmd = [python, os.path.join(HERE, "run_step_bench.py"), "--tool", tool, "--mode", mode, "--size", size,
           "--steps", str(steps), "--dump-path", dump_path, "--threads", str(THREADS)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd="/tmp", timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"{cmd} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="gpt2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--modes", default="L1,mix,md5,tensor")
    ap.add_argument("--real-python", default=os.environ.get("MSPROBE_REAL_PYTHON", "/work/venvs/ms26/bin/python"))
    ap.add_argument("--threads", type=int, default=0, help="torch threads per run (0: torch's default)")
    ap.add_argument("--metric", default="wall", choices=["wall", "cpu"],
                    help="wall-clock ms/step, or process CPU ms/step (steadier on a shared machine)")
    args = ap.parse_args()
    global THREADS
    THREADS = args.threads
    mkey = "ms_median" if args.metric == "wall" else "cpu_ms_median"
    modes = args.modes.split(",")
    tools = [("ours", OURS)]
    if args.real_python and os.path.exists(args.real_python):
        tools.append(("real", args.real_python))
    results: dict = {}
    for r in range(args.rounds):
        for label, py in tools:
            key = (label, "none")
            results.setdefault(key, []).append(measure(py, "none", "L1", args.size, args.steps, f"/tmp/mb_{label}_none"))
            for mode in modes:
                res = measure(py, "msprobe", mode, args.size, args.steps, f"/tmp/mb_{label}_{mode}")
                results.setdefault((label, mode), []).append(res)
                print(f"round {r} {label:4s} {mode:6s} {res[mkey]:8.1f} ms/step", file=sys.stderr)
    print(f"\nsize={args.size}, rounds={args.rounds}, {args.steps} measured steps each (median of medians), "
          f"metric={args.metric}, threads={args.threads or 'default'}")
    print(f"{'tool':5s} {'mode':7s} {'ms/step':>9s} {'ratio':>7s} {'records':>8s} {'MB/step':>8s} {'files/step':>10s}")
    summary = {}
    for label, _ in tools:
        base = statistics.median(x[mkey] for x in results[(label, "none")])
        print(f"{label:5s} {'none':7s} {base:9.1f} {1.0:7.2f}")
        for mode in modes:
            runs = results[(label, mode)]
            ms = statistics.median(x[mkey] for x in runs)
            steps = runs[0]["steps_dumped"]
            mb = runs[0]["bytes"] / steps / 1e6
            files = runs[0]["files"] / steps
            recs = runs[0]["records"] / steps
            summary[(label, mode)] = ms / base
            print(f"{label:5s} {mode:7s} {ms:9.1f} {ms / base:7.2f} {recs:8.0f} {mb:8.1f} {files:10.0f}")
    if len(tools) > 1:
        print("\noverhead of ours / overhead of the real tool (ratio-1):")
        for mode in modes:
            o, r = summary[("ours", mode)] - 1, summary[("real", mode)] - 1
            print(f"  {mode:7s} {o / r if r > 0 else float('nan'):.2f}")


if __name__ == "__main__":
    main()
