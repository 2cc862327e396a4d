"""Benchmark: ``msprobe compare`` (ours) versus the real tool's compare on two statistics dumps.

Two single-process statistics dumps of ``--records`` records each (plain ``json``, indent 1,
the generator of ``bench_readers.py``): a target, and a bench whose statistics are perturbed
by a relative 1e-4 (a few records by 1e-2). Both tools run in fresh subprocesses, one after
the other on the same machine, and report wall time and peak RSS (``wait4``'s ru_maxrss):

* ours: ``python -m msprobe compare T B -o OUT --no-plot -n N`` for each ``--workers`` N (1 and 2)
  (every mode's rows built column-wise by the one engine, :mod:`msprobe.compare._columnar`;
  dump.json read through orjson when it is installed, :func:`msprobe.readers._source.loads_json_bytes`)
* baseline (``--baseline ENGINE``, off by default): the same compare through
  ``compare(engine=ENGINE)``, ``-n 1``, its CSV checked to be byte-identical to ours (the row
  builder is no longer in the product: it is the tests' oracle, tests/compare/row_oracle.py)
* ``--plot``: ours once more with the plot drawn (the other runs use ``--no-plot``)
* floor: a fresh interpreter parsing every dump.json of both sides one at a time, as compare parses
  them (``loads_json_bytes``: orjson with the NaN/Infinity restore); ``ours/floor`` is printed
* real: ``<venv>/bin/msprobe compare -tp T -gp B -o OUT`` (mindstudio-probe 26.2.0 in the venv
  that tests/_realtool.py caches under ~/.cache/msprobe-lake; skipped when absent, or with ``--real ''``); T and B are step directories, so with
  ``--ranks`` > 1 it compares every ``rank*`` pair in one command (its batch mode)

Generated data lives under a temporary directory and is deleted at the end unless ``--keep``.

    python bench/bench_compare.py                    # 100,000 records each
    python bench/bench_compare.py --records 10000    # a quick run
    python bench/bench_compare.py --ranks 64 --records 2000   # 64 rank pairs (the real tool: its step-level batch mode)
    python bench/bench_compare.py --records 2000 --ranks 2 --check   # also compare the CSVs cell by cell
    python bench/bench_compare.py --records 20000 --workers 1 --plot  # ours (with and without the plot), the real tool

Our modules are byte-compiled first (``compileall``, outside the timings), as an installed
package is and as the real tool's venv is.

Each tool's figures are wall seconds and process CPU seconds (``ru_utime + ru_stime`` of the
process and the children it waited for); the ratios printed at the end divide the baseline's
(and the real tool's) by ours, from the same run.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from bench_readers import _rank_doc  # noqa: E402


def _real_default() -> str:
    """The real tool's msprobe of the venv tests/_realtool.py caches (mindstudio-probe 26.2.0), or ''."""
    cache = os.environ.get("MSPROBE_LAKE_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "msprobe-lake"))
    found = sorted(glob.glob(os.path.join(cache, "venv-ms26.2.0-*", "bin", "msprobe")))
    return found[-1] if found else ""


REAL = _real_default()


def _perturb(doc: dict, seed: int) -> dict:
    rng = random.Random(seed)

    def walk(v):
        if isinstance(v, dict):
            if "Max" in v:
                big = rng.random() < 1e-4
                for k in ("Max", "Min", "Mean", "Norm"):
                    x = v.get(k)
                    if isinstance(x, float) and x == x and abs(x) != float("inf"):
                        v[k] = x * (1 + (1e-2 if big else 1e-4) * rng.uniform(-1, 1))
            else:
                for c in v.values():
                    walk(c)
        elif isinstance(v, list):
            for c in v:
                walk(c)

    walk(doc["data"])
    return doc


def _write(root: str, rank_dir: str, doc: dict) -> str:
    d = os.path.join(root, "step0", rank_dir)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "dump.json"), "w") as f:
        json.dump(doc, f, indent=1)
    for name in ("stack.json", "construct.json"):
        with open(os.path.join(d, name), "w") as f:
            f.write("{}")
    return os.path.join(root, "step0")


def synthesize(work: str, records: int, ranks: int = 1, distinct: int = 0) -> tuple:
    """(target step dir, bench step dir): one ``proc*`` dir, or ``rank0..rank{ranks-1}`` when ranks > 1.
    ``distinct`` > 0: only that many ranks' documents are generated, the others are byte copies of
    them (rank r copies rank r % distinct: 1,024 ranks in a minute instead of a quarter of an hour)."""
    if ranks == 1:
        doc = _rank_doc(records, 7)
        target = _write(os.path.join(work, "target"), "proc1001", doc)
        bench = _write(os.path.join(work, "bench"), "proc1002", _perturb(doc, 11))
        return target, bench
    for r in range(ranks):
        if distinct and r >= distinct:
            for side in ("target", "bench"):
                source = os.path.join(work, side, "step0", f"rank{r % distinct}")
                shutil.copytree(source, os.path.join(work, side, "step0", f"rank{r}"))
            continue
        doc = _rank_doc(records, 7 + r)
        target = _write(os.path.join(work, "target"), f"rank{r}", doc)
        bench = _write(os.path.join(work, "bench"), f"rank{r}", _perturb(doc, 11 + r))
    return os.path.join(work, "target", "step0"), os.path.join(work, "bench", "step0")


def _run(cmd: list, timeout: float, ours: bool = True, index: bool = False) -> dict:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the real tool is imported as ``msprobe`` too: never shadow it
    if ours:
        env["PYTHONPATH"] = ROOT
        env["MSPROBE_LAKE_COMPARE_INDEX"] = "1" if index else "0"  # ours from the documents unless asked
    log = tempfile.TemporaryFile()  # not a pipe: a chatty tool would block on a full pipe while we poll
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT if ours else None, env=env,
                         start_new_session=True)  # its own process group: a timeout ends its pool workers too
    deadline = t0 + timeout
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            os.killpg(p.pid, 9)
            pid, status, ru = os.wait4(p.pid, 0)
            return {"wall_s": None, "timeout_s": timeout, "peak_rss_mb": ru.ru_maxrss / 1024, "rc": None}
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    log.seek(0)
    out = log.read().decode(errors="replace")
    log.close()
    rc = os.waitstatus_to_exitcode(status)
    return {"wall_s": round(wall, 2), "cpu_s": round(ru.ru_utime + ru.ru_stime, 2),
            "peak_rss_mb": round(ru.ru_maxrss / 1024, 1), "rc": rc,
            "tail": out[-600:] if rc else ""}


def _compile_ours() -> None:
    """Our modules' bytecode written once, before any timing: an installed package has it (pip
    compiles what it installs, as the real tool's venv holds), while a checkout run under
    PYTHONDONTWRITEBYTECODE would compile every module from source in each timed run (about
    0.4 s CPU of a compare's start)."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(ROOT, "msprobe")], env=env,
                   stdout=subprocess.DEVNULL, check=False)


#: the parse floor: a fresh interpreter parsing every dump.json of both sides, one at a time, as
#: compare parses them (orjson with the NaN/Infinity restore: msprobe.format.fastjson.loads_json_bytes)
_FLOOR = ("import glob, os, sys; from msprobe.format.fastjson import loads_json_bytes\n"
          "for side in sys.argv[1:]:\n"
          "    for path in sorted(glob.glob(os.path.join(side, '*', 'dump.json'))):\n"
          "        with open(path, 'rb') as handle:\n"
          "            loads_json_bytes(handle.read())\n")

_BASELINE = ("import sys; from msprobe.compare import compare; "
             "compare(sys.argv[1], sys.argv[2], sys.argv[3], plot=False, progress=False, engine=sys.argv[4])")


def _same_csvs(a: str, b: str) -> bool:
    """Whether two compare outputs hold byte-identical CSVs (paired by rank directory)."""
    def by_rank(d: str) -> dict:
        return {os.path.basename(f).rsplit("_", 1)[0]: f
                for f in glob.glob(os.path.join(d, "**", "compare_result_*.csv"), recursive=True)}

    x, y = by_rank(a), by_rank(b)
    if sorted(x) != sorted(y) or not x:
        return False
    for k in x:
        with open(x[k], "rb") as f1, open(y[k], "rb") as f2:
            if f1.read() != f2.read():
                return False
    return True


def _ratio(base: dict, ours: dict, key: str) -> object:
    if base.get(key) and ours.get(key):
        return round(base[key] / ours[key], 1)
    return None


def _rows(out_dir: str) -> int:
    n = 0
    for f in glob.glob(os.path.join(out_dir, "**", "compare_result_*.csv"), recursive=True):
        with open(f, encoding="utf-8") as fh:
            n += sum(1 for _ in fh) - 1
    return n


def _close(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        x, y = float(a.rstrip("%")), float(b.rstrip("%"))
    except ValueError:
        return False
    if x == y or (x != x and y != y):  # the real tool writes " inf" with a space
        return True
    return abs(x - y) <= max(1e-12, 1e-6 * max(abs(x), abs(y)))


def check(ours_dir: str, real_dir: str) -> dict:
    """Rows, rows per real Result, and differing cells between our CSVs and the real tool's
    (paired by their ``compare_result_<rank dir>_`` prefix)."""
    import csv

    def by_rank(d: str) -> dict:
        return {os.path.basename(f).rsplit("_", 1)[0]: f for f in glob.glob(os.path.join(d, "compare_result_*.csv"))}

    ours, real = by_rank(ours_dir), by_rank(real_dir)
    out: dict = {"files": len(real), "missing": sorted(set(real) - set(ours)), "rows": 0, "results": {},
                 "differing_cells": 0, "examples": []}
    for key, rf in sorted(real.items()):
        if key not in ours:
            continue
        with open(ours[key], newline="", encoding="utf-8") as f1, open(rf, newline="", encoding="utf-8") as f2:
            for o, r in zip(csv.DictReader(f1), csv.DictReader(f2)):
                out["rows"] += 1
                out["results"][r["Result"]] = out["results"].get(r["Result"], 0) + 1
                for col, v in r.items():
                    if col != "NPU_Stack_Info" and not _close(o.get(col, ""), v):
                        out["differing_cells"] += 1
                        if len(out["examples"]) < 5:
                            out["examples"].append([key, r["NPU Name"], col, o.get(col), v])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--records", type=int, default=100_000, help="records per rank")
    ap.add_argument("--ranks", type=int, default=1, help="rank directories per dump (rank0..rankN-1)")
    ap.add_argument("--distinct", type=int, default=0,
                    help="with --ranks: generate this many ranks' documents, copy them to the others (0: all distinct)")
    ap.add_argument("--real", default=REAL, help="the real tool's msprobe executable ('' to skip)")
    ap.add_argument("--timeout", type=float, default=7200.0, help="seconds allowed to each tool")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2],
                    help="our -n values to time (1: one process; n: the rank split over n forked processes)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--check", action="store_true",
                    help="compare our CSVs with the real tool's, cell by cell (stack column aside)")
    ap.add_argument("--reuse", action="store_true", help="use the dumps already in --workdir (from --keep)")
    ap.add_argument("--baseline", default="", help="engine= of a baseline run of ours ('' to skip)")
    ap.add_argument("--plot", action="store_true", help="also time ours with the plot drawn")
    ap.add_argument("--from-index", action="store_true",
                    help="also index both dumps (msprobe index: records and compare's leaf tables) and time ours "
                         "reading the index (ours_index; its CSVs checked byte-identical to ours from the documents)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs of ours (each worker count); the median run by CPU time is reported, with every run's figures")
    args = ap.parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="msprobe_bench_compare_")
    try:
        t0 = time.perf_counter()
        if args.reuse and os.path.isdir(os.path.join(work, "target", "step0")):
            target, bench = os.path.join(work, "target", "step0"), os.path.join(work, "bench", "step0")
        else:
            target, bench = synthesize(work, args.records, args.ranks, args.distinct)
        first = "proc1001" if args.ranks == 1 else "rank0"
        size = os.path.getsize(os.path.join(target, first, "dump.json")) / 2**20
        print(f"synthesized 2 x {args.ranks} rank(s) x {args.records} records ({size:.1f} MiB dump.json each) in "
              f"{time.perf_counter() - t0:.1f}s under {work}")
        res = {"records": args.records, "ranks": args.ranks, "dump_json_mib": round(size, 1)}
        _compile_ours()
        floors = [_run([sys.executable, "-c", _FLOOR, target, bench], args.timeout) for _ in range(max(args.repeat, 1))]
        res["floor"] = _median_run(floors)
        print("floor (interpreter start + parsing every document):", json.dumps(res["floor"]))
        for n in args.workers:
            key = "ours" if n == 1 else f"ours_n{n}"
            out = os.path.join(work, key)
            runs = []
            for i in range(args.repeat):  # a shared machine's noise: the median of several runs
                if i:
                    shutil.rmtree(out, ignore_errors=True)
                runs.append(_run([sys.executable, "-m", "msprobe", "compare", target, bench, "-o", out, "--no-plot",
                                  "-n", str(n)], args.timeout))
            res[key] = _median_run(runs)
            res[key]["rows"] = _rows(out)
            print(f"{key}:", json.dumps(res[key]))
            if not ((args.check and n == args.workers[0]) or (args.baseline and n == 1) or (args.from_index and n == 1)):
                shutil.rmtree(out, ignore_errors=True)
        if args.from_index:
            _from_index(res, args, work, target, bench)
        if args.plot:
            out = os.path.join(work, "ours_plot")
            res["ours_plot"] = _run([sys.executable, "-m", "msprobe", "compare", target, bench, "-o", out,
                                     "-n", "1"], args.timeout)
            res["ours_plot"]["png"] = bool(glob.glob(os.path.join(out, "*.png")))
            print("ours_plot:", json.dumps(res["ours_plot"]))
            shutil.rmtree(out, ignore_errors=True)
        if args.baseline:
            out = os.path.join(work, "baseline")
            res["baseline"] = _run([sys.executable, "-c", _BASELINE, target, bench, out, args.baseline], args.timeout)
            res["baseline"]["engine"] = args.baseline
            res["baseline"]["rows"] = _rows(out)
            if "ours" in res:
                res["baseline"]["same_csv_bytes_as_ours"] = _same_csvs(out, os.path.join(work, "ours"))
                if not args.check:
                    shutil.rmtree(os.path.join(work, "ours"), ignore_errors=True)
            print("baseline:", json.dumps(res["baseline"]))
            shutil.rmtree(out, ignore_errors=True)
        if args.real and os.path.exists(args.real):
            out = os.path.join(work, "out_real")
            os.makedirs(out, exist_ok=True)
            res["real"] = _run([args.real, "compare", "-tp", target, "-gp", bench, "-o", out], args.timeout, ours=False)
            res["real"]["rows"] = _rows(out)
            print("real:", json.dumps(res["real"]))
            for key in [k for k in res if k.startswith("ours")]:
                if res["real"]["wall_s"] and res[key]["wall_s"]:
                    res[f"speedup_{key}"] = round(res["real"]["wall_s"] / res[key]["wall_s"], 1)
                elif res["real"]["wall_s"] is None and res[key]["wall_s"]:
                    res[f"speedup_{key}"] = f">{round(args.timeout / res[key]['wall_s'], 1)}"
                print(f"speedup ({key}): {res.get(f'speedup_{key}')}x")
        else:
            print("real tool not found: skipped")
        ratios = {}
        for base in ("baseline", "real"):
            for key in [k for k in res if k.startswith("ours")]:
                if base in res and res[base].get("wall_s"):
                    ratios[f"{base}/{key}"] = {"wall": _ratio(res[base], res[key], "wall_s"),
                                               "cpu": _ratio(res[base], res[key], "cpu_s")}
        for key in [k for k in res if k.startswith("ours")]:
            floor = res.get("index_floor") if key == "ours_index" else res["floor"]
            if floor and floor.get("wall_s") and res[key].get("wall_s"):
                ratios[f"{key}/floor"] = {"wall": _ratio(res[key], floor, "wall_s"),
                                          "cpu": _ratio(res[key], floor, "cpu_s")}
        res["ratios"] = ratios
        for k, v in ratios.items():
            print(f"ratio {k}: wall {v['wall']}x, cpu {v['cpu']}x")
        if args.check and "real" in res:
            res["check"] = check(os.path.join(work, "ours" if args.workers[0] == 1 else f"ours_n{args.workers[0]}"),
                                 os.path.join(work, "out_real"))
            print("check:", json.dumps(res["check"]))
        print(json.dumps(res))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


_INDEX_FLOOR = ("import glob, os, sys; import pyarrow.parquet as pq\n"
                "_READ = ['rec', 'record', 'io', 'rest', 'tensor', 'dtype', 'shape', 'requires_grad', 'max', 'min', 'mean',"
                " 'norm', 'stats_json']  # msprobe.compare._indexed._READ\n"
                "for side in sys.argv[1:]:\n"
                "    for path in sorted(glob.glob(os.path.join(side, '*', 'index', 'compare', 'leaves.parquet'))):\n"
                "        pq.ParquetFile(path).read(columns=_READ)\n")


def _from_index(res: dict, args: Any, work: str, target: str, bench: str) -> None:
    """Index both dumps (outside the timings of compare), then: the index's floor (a fresh
    interpreter reading the columns compare reads at once of every leaf table with pyarrow) and ours reading the index (``ours_index``),
    its CSVs checked byte-identical to ours from the documents (``ours``, kept by the caller)."""
    for side in (target, bench):
        for old in glob.glob(os.path.join(side, "*", "index")):
            shutil.rmtree(old)
    res["index_build"] = [_run([sys.executable, "-m", "msprobe", "index", side, "-q"], args.timeout)
                          for side in (target, bench)]
    print("index build (target, bench):", json.dumps(res["index_build"]))
    res["index_floor"] = _median_run([_run([sys.executable, "-c", _INDEX_FLOOR, target, bench], args.timeout)
                                      for _ in range(max(args.repeat, 1))])
    print("index floor (interpreter start + reading every leaf table):", json.dumps(res["index_floor"]))
    out = os.path.join(work, "ours_index")
    runs = []
    for i in range(args.repeat):
        shutil.rmtree(out, ignore_errors=True)
        runs.append(_run([sys.executable, "-m", "msprobe", "compare", target, bench, "-o", out, "--no-plot",
                          "-n", "1"], args.timeout, index=True))
    res["ours_index"] = _median_run(runs)
    res["ours_index"]["rows"] = _rows(out)
    res["ours_index"]["same_csv_bytes_as_ours"] = _same_csvs(out, os.path.join(work, "ours"))
    print("ours_index:", json.dumps(res["ours_index"]))
    shutil.rmtree(out, ignore_errors=True)
    if not (args.check or args.baseline):
        shutil.rmtree(os.path.join(work, "ours"), ignore_errors=True)


def _median_run(runs: list) -> dict:
    """The run of median CPU time (the lower middle one of an even count), with every run's wall/CPU."""
    done = [r for r in runs if r.get("cpu_s") is not None]
    if not done:
        return runs[-1]
    pick = dict(sorted(done, key=lambda r: r["cpu_s"])[(len(done) - 1) // 2])
    if len(runs) > 1:
        pick["runs_wall_s"] = [r.get("wall_s") for r in runs]
        pick["runs_cpu_s"] = [r.get("cpu_s") for r in runs]
    return pick


if __name__ == "__main__":
    sys.exit(main())
