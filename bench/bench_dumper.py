"""Dumper overhead: no tool vs msprobe-lake vs the real msprobe, side by side in one run.

    .venv/bin/python bench/bench_dumper.py [--size gpt2|opheavy] [--rounds 3] [--modes L1,mix,md5,tensor]
        [--real-python /path/to/venv-with-mindstudio-probe/bin/python]
    PYTHONPATH=$PWD .venv/bin/python bench/bench_dumper.py --table     # the performance issue's table
    PYTHONPATH=$PWD .venv/bin/python bench/bench_dumper.py --table --before ../old   # + ours of another checkout

``--table``: statistics L1 / mix / L1+md5, tensor L1 in both layouts (classic ``.pt`` and the Zarr
store) and the limits of the same run (``hooks``: our hooks and records, no tensor read, nothing
written; ``floor``: the same plus one ``sum`` per recorded tensor), forward+backward in the dump window
(the optimizer step outside it), measured twice: process CPU time with 1 torch thread and wall clock
with 2, each against the no-tool run of the same interpreter; the real tool in its own venv side by
side (tests/_realtool.py's cached venv unless ``--real-python``/``$MSPROBE_REAL_PYTHON`` says otherwise).

Each measurement is a fresh process (1 warm-up + 5 measured steps, median); tools and
modes run in alternating rounds; the ratio is against the no-tool run of the same
interpreter, so both tools are judged against their own baseline. With ``--table`` each ratio
is taken per round (that round's run over that round's no-tool run) and printed as the mean
over the rounds +- its standard error (default 8 rounds), with our overhead per record.
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


WINDOW = "step"
DEVICE = "cpu"
#: where the runs dump (each run removes its dump when it ends)
DUMP_ROOT = os.environ.get("MSPROBE_BENCH_DUMP_ROOT", "/tmp")


def measure(python, tool, mode, size, steps, dump_path, env_extra=None):
    env = dict(os.environ)
    if python != OURS:  # the real tool: keep our package off its path
        env.pop("PYTHONPATH", None)
    env.update(env_extra or {})
    cmd = [python, os.path.join(HERE, "run_step_bench.py"), "--tool", tool, "--mode", mode, "--size", size,
           "--steps", str(steps), "--dump-path", dump_path, "--threads", str(THREADS), "--window", WINDOW,
           "--device", DEVICE]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd="/tmp", timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"{cmd} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def default_real_python():
    """$MSPROBE_REAL_PYTHON, else tests/_realtool.py's cached venv of mindstudio-probe 26.2.0 (built when
    missing; None when it cannot be)."""
    if os.environ.get("MSPROBE_REAL_PYTHON"):
        return os.environ["MSPROBE_REAL_PYTHON"]
    sys.path.insert(0, os.path.dirname(HERE))
    try:
        from tests._realtool import RealToolUnavailable, real_tool_python
    except ImportError:
        return None
    try:
        return real_tool_python("26.2.0")
    except RealToolUnavailable as exc:
        print(f"real tool unavailable: {exc}", file=sys.stderr)
        return None


#: (label, ours' mode, the real tool's mode or None, target)
TABLE = [
    ("statistics L1", "L1", "L1", "overhead <= 1/8 of the real tool's"),
    ("statistics mix", "mix", "mix", "overhead <= 1/8 of the real tool's"),
    ("L1 + md5 (CRC-32)", "md5", "md5", "overhead <= 1/8 of the real tool's"),
    ("tensor L1, classic .pt", "tensor", "tensor", "overhead <= 0.5 of the real tool's"),
    ("tensor L1, Zarr store", "tensor_zarr", None, "overhead <= 0.5 of the real tool's"),
    ("floor: hooks + one sum per tensor, nothing written", "floor", None, ""),
    ("hooks and records only, nothing written", "hooks", None, ""),
]


def table(args):
    """Both metrics, ours and the real tool, in interleaved rounds; prints one markdown table."""
    global THREADS, WINDOW, DEVICE
    WINDOW, DEVICE = args.window, args.device
    real = args.real_python if args.real_python is not None else default_real_python()
    tools = [("ours", OURS)] + ([("before", OURS)] if args.before else []) + \
        ([("real", real)] if real and os.path.exists(real) else [])
    env_of = {"before": {"PYTHONPATH": os.path.abspath(args.before)}} if args.before else {}
    configs = [c for c in [("cpu", 1, "cpu_ms_median"), ("wall", 2, "ms_median")] if c[0] in args.table_metrics.split(",")]
    rows = [r for r in TABLE if not args.table_modes or r[1] in args.table_modes.split(",")]
    res: dict = {}
    for r in range(args.rounds):
        for metric, threads, key in configs:
            THREADS = threads
            for label, py in tools:
                mine = label != "real"
                modes = ["none"] + [m_ours if mine else m_real for _, m_ours, m_real, _ in rows
                                    if (m_ours if mine else m_real)]
                for mode in modes:
                    out = measure(py, "none" if mode == "none" else "msprobe", "L1" if mode == "none" else mode,
                                  args.size, args.steps, os.path.join(DUMP_ROOT, f"mb_{label}_{mode}"),
                                  env_of.get(label))
                    res.setdefault((metric, label, mode), []).append(out)
                    print(f"round {r} {metric}/{threads}t {label:4s} {mode:11s} {out[key]:9.1f} ms/step "
                          f"{out['records'] // out['steps_dumped']} records/step", file=sys.stderr)

    def med(metric, label, mode):
        key = dict((m, k) for m, _, k in configs)[metric]
        runs = res.get((metric, label, mode))
        return statistics.median(x[key] for x in runs) if runs else None

    def per_round(metric, label, mode):
        """The ratio of each round: the mode's step over the no-tool step of the same round and interpreter."""
        key = dict((m, k) for m, _, k in configs)[metric]
        runs, base_runs = res.get((metric, label, mode)), res.get((metric, label, "none"))
        if not runs or not base_runs:
            return []
        return [x[key] / b[key] for x, b in zip(runs, base_runs)]

    def mean_se(values):
        """(mean, standard error of the mean) of the per-round values."""
        if not values:
            return None, None
        m = statistics.fmean(values)
        return m, (statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else float("nan"))

    print(f"\nsize={args.size}, device={args.device}, window={args.window}, {args.rounds} interleaved rounds x {args.steps} "
          f"measured steps (each run: the median step; each ratio: the mean over the rounds of that round's run over "
          f"its no-tool run, +- the standard error of that mean); CPU = process CPU ms/step with 1 torch thread, "
          f"wall = wall ms/step with 2 torch threads")
    first = configs[0][0]
    recs = {m: res[(first, "ours", m)][0]["records"] // res[(first, "ours", m)][0]["steps_dumped"]
            for _, m, _, _ in rows}
    base = {(mt, lb): med(mt, lb, "none") for mt, _, _ in configs for lb, _ in tools}
    # the overhead ratio is read on the CPU metric when it ran, else on the wall clock (bench/gpu/run.sh)
    over_metric = "cpu" if any(c[0] == "cpu" for c in configs) else "wall"
    print(f"\n| mode | records/step | ours CPU | real CPU | ours wall | real wall | ours/real overhead ({over_metric}) "
          "| ours overhead per record | target |")
    print("|---|---|---|---|---|---|---|---|---|")

    def ms(metric, label):
        v = base.get((metric, label))
        return f"{v:.0f} ms" if v else "–"

    def cell(m, se):
        return "–" if m is None else f"{m:.3f}x ± {se:.3f}"

    print(f"| no tool | – | {ms('cpu', 'ours')} | {ms('cpu', 'real')} | {ms('wall', 'ours')} | {ms('wall', 'real')} "
          "| | | |")
    for name, m_ours, m_real, target in rows:
        cells = []
        for mt in ("cpu", "wall"):
            for lb in ("ours", "real"):
                mode = m_ours if lb == "ours" else m_real
                ok = mode and any(c[0] == mt for c in configs) and any(t[0] == lb for t in tools)
                cells.append(cell(*mean_se(per_round(mt, lb, mode))) if ok else "–")
        o_r = per_round(over_metric, "ours", m_ours)
        r_r = per_round(over_metric, "real", m_real if m_real else ("tensor" if m_ours == "tensor_zarr" else None)) \
            if any(t[0] == "real" for t in tools) else []
        over = "–"
        if o_r and r_r and all(r > 1 for r in r_r):
            om, ose = mean_se([(o - 1) / (r - 1) for o, r in zip(o_r, r_r)])
            over = f"{om:.3f} ± {ose:.3f}"
        b = base.get((over_metric, "ours"))
        per_rec = f"{(statistics.fmean(o_r) - 1) * b / recs[m_ours] * 1000:.0f} µs" if o_r and b and recs[m_ours] else "–"
        print(f"| {name} | {recs[m_ours]} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} | {over} | {per_rec} "
              f"| {target} |")
    if args.before:
        before_table(rows, recs, base, over_metric, per_round, mean_se, args.before)
    if any(r[1] == "floor" for r in rows) and any(r[1] == "L1" for r in rows):
        print("\nstatistics L1 - floor: " + "; ".join(
            f"{mt} {statistics.fmean(per_round(mt, 'ours', 'L1')) - statistics.fmean(per_round(mt, 'ours', 'floor')):+.3f}"
            for mt, _, _ in configs))


def before_table(rows, recs, base, metric, per_round, mean_se, tree):
    """``--before TREE``: our dumper of another checkout (before a change) in the same rounds, against ours."""
    print(f"\nours before ({tree}) and after (this checkout), the same rounds, {metric}:\n")
    print("| mode | before | after | before per record | after per record | overhead after/before |")
    print("|---|---|---|---|---|---|")
    for name, m_ours, _, _ in rows:
        b_r, a_r = per_round(metric, "before", m_ours), per_round(metric, "ours", m_ours)
        if not b_r or not a_r:
            continue
        (bm, bse), (am, ase) = mean_se(b_r), mean_se(a_r)
        b_base, a_base = base.get((metric, "before")), base.get((metric, "ours"))
        b_rec = (bm - 1) * b_base / recs[m_ours] * 1000 if b_base and recs[m_ours] else float("nan")
        a_rec = (am - 1) * a_base / recs[m_ours] * 1000 if a_base and recs[m_ours] else float("nan")
        print(f"| {name} | {bm:.3f}x ± {bse:.3f} | {am:.3f}x ± {ase:.3f} | {b_rec:.0f} µs | {a_rec:.0f} µs "
              f"| {(am - 1) / (bm - 1):.2f} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="gpt2")
    ap.add_argument("--rounds", type=int, default=None,
                    help="interleaved rounds (default 3; 8 with --table: the spread of each ratio is printed)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--modes", default="L1,mix,md5,tensor")
    ap.add_argument("--real-python", default=None,
                    help="python of a venv with mindstudio-probe (default: $MSPROBE_REAL_PYTHON, else "
                         "tests/_realtool.py's cached 26.2.0 venv); '' for ours only")
    ap.add_argument("--table", action="store_true", help="the performance issue's table (see the docstring)")
    ap.add_argument("--before", default=None, metavar="TREE",
                    help="--table: also our dumper of the checkout TREE (e.g. before a change) in the same rounds")
    ap.add_argument("--window", default=None, choices=["step", "fwd_bwd"],
                    help="dump window (default: fwd_bwd with --table, else step)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads per run (0: torch's default)")
    ap.add_argument("--device", default="cpu", help="where the model runs: cpu, or cuda (bench/gpu/run.sh)")
    ap.add_argument("--table-metrics", default="cpu,wall",
                    help="with --table: cpu (process CPU, 1 torch thread) and/or wall (wall clock, 2 threads)")
    ap.add_argument("--table-modes", default=None,
                    help="with --table: the comma-separated rows to run (ours' mode names; default all)")
    ap.add_argument("--metric", default="wall", choices=["wall", "cpu"],
                    help="wall-clock ms/step, or process CPU ms/step (steadier on a shared machine)")
    args = ap.parse_args()
    if args.rounds is None:
        args.rounds = 8 if args.table else 3
    if args.table:
        args.window = args.window or "fwd_bwd"
        return table(args)
    global THREADS, WINDOW, DEVICE
    THREADS = args.threads
    WINDOW = args.window or "step"
    DEVICE = args.device
    if args.real_python is None:
        args.real_python = default_real_python()
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
