"""Peak memory of run_ut checking one large API, as a multiple of the API's declared input bytes.

Writes a statistics dump.json (a few hundred bytes) holding one forward record, ``--api``
(default ``Functional.gelu``) over one float32 input of ``--numel`` elements (default 2**25:
128 MiB), optionally with its backward record (``--backward``: the input requires grad and the
dump holds the output gradient, generated too). A fresh interpreter imports torch and
msprobe.run_ut, checks a tiny API once (warm-up), resets its peak RSS
(``/proc/self/clear_refs``), then runs ``run_ut(..., workers=0)`` over the dump (the checking
code a worker process runs) and reports:

- ``base``: the process's RSS just before the check (interpreter, torch, warm-up);
- ``peak``: its peak RSS during the check (``VmHWM`` after the reset);
- ``growth``: peak - base, and both as multiples of the declared input bytes.

usage: python bench/bench_run_ut_memory.py [--numel N] [--api Functional.gelu] [--backward]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, sys, time
import torch
from msprobe.run_ut import run_ut

def status(key):
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise SystemExit(key + " not in /proc/self/status")

rank, small, out, max_mb = sys.argv[1:5]
run_ut(small, out + "/warm", workers=0, progress=False)          # pay torch's lazy imports first
with open("/proc/self/clear_refs", "w") as fh:
    fh.write("5")                                                  # VmHWM := VmRSS
base = status("VmRSS")
t0 = time.perf_counter()
s = run_ut(rank, out + "/big", workers=0, progress=False, max_input_mb=float(max_mb) if max_mb != "-" else None)
secs = time.perf_counter() - t0
peak = status("VmHWM")
print("RESULT " + json.dumps({"base": base, "peak": peak, "seconds": secs, "counts": s["counts"],
                              "skipped": s.get("skipped")}))
"""


def _tensor(numel: int, grad: bool) -> dict:
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [numel], "Max": 2.0, "Min": -2.0,
            "Mean": 0.0, "Norm": 1.0, "requires_grad": grad}


def write_dump(root: str, api: str, numel: int, backward: bool) -> str:
    rank = os.path.join(root, "step0", "rank0")
    os.makedirs(rank, exist_ok=True)
    data = {f"{api}.0.forward": {"input_args": [_tensor(numel, backward)], "input_kwargs": {},
                                 "output": [_tensor(numel, backward)]}}
    if backward:
        data[f"{api}.0.backward"] = {"input": [_tensor(numel, False)], "output": [_tensor(numel, False)]}
    doc = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "data": data}
    with open(os.path.join(rank, "dump.json"), "w") as fh:
        json.dump(doc, fh)
    return rank


def measure(numel: int, api: str = "Functional.gelu", backward: bool = False, max_input_mb: str = "-",
            python: str = sys.executable) -> dict:
    """Check one ``api`` over a float32 [numel] input in a fresh interpreter; its memory figures."""
    work = tempfile.mkdtemp(prefix="bench_run_ut_mem_")
    rank = write_dump(os.path.join(work, "dump"), api, numel, backward)
    small = write_dump(os.path.join(work, "small"), api, 1000, backward)
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", MSPROBE_RUN_UT_THREADS="1")
    p = subprocess.run([python, "-c", CHILD, rank, small, work, max_input_mb], env=env, capture_output=True,
                       text=True)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if p.returncode != 0 or line is None:
        raise RuntimeError(f"the measuring child failed (rc {p.returncode}): {p.stdout[-2000:]} {p.stderr[-3000:]}")
    r = json.loads(line[len("RESULT "):])
    declared = numel * 4
    growth = r["peak"] - r["base"]
    r.update(api=api, numel=numel, backward=backward, declared_bytes=declared, growth=growth,
             peak_ratio=r["peak"] / declared, growth_ratio=growth / declared)
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--numel", type=int, default=1 << 25)
    ap.add_argument("--api", default="Functional.gelu")
    ap.add_argument("--backward", action="store_true", help="the input requires grad; the dump has the backward")
    ap.add_argument("--max-input-mb", default="-", help="run_ut's ceiling (default: run_ut's own default)")
    args = ap.parse_args()
    r = measure(args.numel, args.api, args.backward, args.max_input_mb)
    mib = 1 << 20
    print(json.dumps(r))
    print(f"{args.api} [{args.numel}] float32{' +backward' if args.backward else ''}: declared "
          f"{r['declared_bytes'] / mib:.0f} MiB; RSS base {r['base'] / mib:.0f} MiB, peak {r['peak'] / mib:.0f} MiB "
          f"({r['peak_ratio']:.2f}x), growth {r['growth'] / mib:.0f} MiB ({r['growth_ratio']:.2f}x); "
          f"{r['seconds']:.1f} s; {r['counts']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
