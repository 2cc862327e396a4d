"""Benchmark: the CPU of building the Parquet index, per rank directory.

``--ranks`` rank directories of ``--records`` records (the ``bench_readers`` generator, as the
lake benchmark's documents) are written once; then, ``--repeat`` times, each code tree given
(this checkout, and ``--baseline DIR``: another checkout, such as a ``git worktree`` of an older
commit) is timed, the trees alternated:

* ``msprobe index DIR -o OUT -q`` as a fresh process: its CPU (``wait4``), interpreter included;
* ``msprobe index DIR -q`` (in the dump: each rank's ``index/records.parquet`` and, where the code
  writes it, compare's leaf table ``index/compare/leaves.parquet``), likewise, the ``index``
  folders removed after each run;
* the lake's ``build_batch`` over all the rank directories in one task (one process, the CPU of
  the call alone): parse, rows, Arrow, the index files and the streamed compaction;
* the floor: the documents parsed one at a time as the index build parses them (orjson, with
  the NaN/Infinity restore: :func:`msprobe.format.fastjson.loads_json_bytes`).

Each figure is CPU milliseconds divided by the number of rank directories. Both trees are
byte-compiled first (``compileall``), as an install leaves them.

    python bench/bench_index_build.py --ranks 64 --records 300 --baseline /path/to/old/checkout
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from bench_readers import _rank_doc  # noqa: E402

_BATCH = r"""
import json, shutil, sys, tempfile, time
from msprobe.lake import _build as _core
root, ranks = sys.argv[1], int(sys.argv[2])
locs = [(f"run/step0/rank{r}", 0, f"rank{r}", r, None) for r in range(ranks)]
out = tempfile.mkdtemp()
job = _core.BuildJob(root, None, out, None, "run", "run", locs, "c/_compact.parquet")
started = time.process_time()
_core.build_batch(job)
print(json.dumps(time.process_time() - started))
shutil.rmtree(out)
"""
_FLOOR = r"""
import glob, json, sys, time
from msprobe.format.fastjson import loads_json_bytes
paths = sorted(glob.glob(sys.argv[1] + "/run/step0/rank*/dump.json"))
started = time.process_time()
for path in paths:
    with open(path, "rb") as handle:
        loads_json_bytes(handle.read())
print(json.dumps(time.process_time() - started))
"""


def _cpu_of(cmd: list, code_root: str, *, reported: bool = True) -> float:
    """CPU seconds: as the command prints them (``reported``), else the process's (``wait4``)."""
    proc = subprocess.Popen(cmd, env=dict(os.environ, PYTHONPATH=code_root), cwd=code_root,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = proc.stdout.read() if proc.stdout is not None else b""
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise RuntimeError(f"{cmd[:4]} failed")
    return float(out.decode().strip().splitlines()[-1]) if reported else usage.ru_utime + usage.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--records", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--baseline", default=None, help="another checkout's root, timed alternately with this one")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench_index_build_")
    try:
        for rank in range(args.ranks):
            folder = os.path.join(work, "run", "step0", f"rank{rank}")
            os.makedirs(folder)
            with open(os.path.join(folder, "dump.json"), "w", encoding="utf-8") as handle:
                json.dump(_rank_doc(args.records, rank), handle, indent=1)
            for name in ("stack.json", "construct.json"):
                with open(os.path.join(folder, name), "w", encoding="utf-8") as handle:
                    handle.write("{}")
        trees = {"this": ROOT, **({"baseline": args.baseline} if args.baseline else {})}
        for tree in trees.values():  # byte-compiled, as an install leaves it (PYTHONDONTWRITEBYTECODE may be set)
            subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(tree, "msprobe")], check=True,
                           stdout=subprocess.DEVNULL)
        got: dict = {name: {"index_cli": [], "index_in_dump": [], "lake_batch": []} for name in trees}
        floor = []
        for _ in range(args.repeat):
            floor.append(_cpu_of([sys.executable, "-c", _FLOOR, work], ROOT) / args.ranks * 1000)
            for name, tree in trees.items():
                out = tempfile.mkdtemp(prefix="index_", dir=work)
                cpu = _cpu_of([sys.executable, "-m", "msprobe", "index", os.path.join(work, "run"), "-o", out, "-q"],
                              tree, reported=False)
                shutil.rmtree(out)
                got[name]["index_cli"].append(cpu / args.ranks * 1000)
                cpu = _cpu_of([sys.executable, "-m", "msprobe", "index", os.path.join(work, "run"), "-q"], tree,
                              reported=False)
                for rank in range(args.ranks):
                    shutil.rmtree(os.path.join(work, "run", "step0", f"rank{rank}", "index"), ignore_errors=True)
                got[name]["index_in_dump"].append(cpu / args.ranks * 1000)
                got[name]["lake_batch"].append(_cpu_of([sys.executable, "-c", _BATCH, work, str(args.ranks)], tree)
                                               / args.ranks * 1000)
        print(f"{args.ranks} rank dirs x {args.records} records; CPU ms per rank dir; load average "
              f"{os.getloadavg()[0]:.1f}")
        print(f"floor (parsing the documents): {', '.join(f'{v:.1f}' for v in floor)}")
        for name, runs in got.items():
            for what, values in runs.items():
                print(f"{name:<9} {what:<13} {', '.join(f'{v:.1f}' for v in values)}")
        print(json.dumps({"floor": floor, **got}))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
