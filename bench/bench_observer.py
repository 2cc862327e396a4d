"""Observe without changing (issue 40): does a dump change a single bit of the training it records?

    PYTHONPATH=$PWD .venv/bin/python bench/bench_observer.py [--models llama,bert,bnhook,resnet]
        [--configs L0,L1,mix,L1:md5,mix:tensor,...] [--real-python PATH | --no-real] [--markdown]

Each model of bench/observer_models.py trains 3 steps (one torch thread, deterministic algorithms, fixed
seeds) without a tool, then once per config under our dumper and under the real msprobe 26.2.0 (its own
venv: tests/_realtool.py's cached one unless ``--real-python``/``$MSPROBE_REAL_PYTHON``), each a fresh
process against the no-tool run of the same interpreter. A cell is ``same`` when the losses, every step's
gradients, every parameter's and buffer's bytes and the RNG state equal the no-tool run's bitwise, else
``differs (...)`` with the counts that differ. ``--markdown`` prints the table of docs/conformance.md.
"""
import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import observer_models as om  # noqa: E402
from bench_dumper import default_real_python  # noqa: E402

CONFIGS = ["L0", "L1", "mix", "L0:md5", "L1:md5", "mix:md5", "L0:tensor", "L1:tensor", "mix:tensor"]


def run(python: str, model: str, config: str, ours: bool, work: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", **({"PYTHONPATH": ROOT} if ours else {}))
    cmd = [python, os.path.join(HERE, "observer_models.py"), "--model", model]
    if config:
        level, _, task = config.partition(":")
        cmd += ["--level", level, "--task", task or "statistics",
                "--dump-path", os.path.join(work, f"{'ours' if ours else 'real'}_{model}_{level}_{task}")]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work, timeout=1200)
    if out.returncode != 0:
        raise RuntimeError(f"{cmd} failed:\n{out.stderr[-3000:]}")
    return om.fingerprint_of(out.stdout)


def cell(base: dict, fp: dict) -> str:
    if om.same(base, fp):
        return "same"
    d = om.differences(base, fp)
    return (f"differs ({d['losses']} losses, {d['gradients']} step gradients, {d['parameters']} parameters"
            f"{', buffers' if d['buffers'] else ''}{', RNG' if d['rng'] else ''})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(om.MODELS))
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--real-python", default=None)
    ap.add_argument("--no-real", action="store_true")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args(argv)
    models, configs = a.models.split(","), a.configs.split(",")
    real = None if a.no_real else (a.real_python or default_real_python())
    tools = [("ours", sys.executable, True)] + ([("26.2.0", real, False)] if real else [])
    rows = []
    counts = {name: [0, 0] for name, _, _ in tools}
    with tempfile.TemporaryDirectory(prefix="bench_observer_") as work:
        for model in models:
            row = [model]
            for name, python, ours in tools:
                base = run(python, model, "", ours, work)
                for config in configs:
                    fp = run(python, model, config, ours, work)
                    row.append(cell(base, fp))
                    counts[name][0] += row[-1] != "same"
                    counts[name][1] += 1
                    print(f"{model:8s} {name:7s} {config:12s} {row[-1]}", file=sys.stderr, flush=True)
            rows.append(row)
    head = ["model"] + [f"{name} {c}" for name, _, _ in tools for c in configs]
    if a.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        for row in rows:
            print("  ".join(f"{h}={v}" for h, v in zip(head, row)))
    for name, (changed, total) in counts.items():
        print(f"{name}: {changed} of {total} runs change the training", file=sys.stderr if a.markdown else sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
