"""Benchmark: find anomalous tensors in a large statistics dump and in a lake of dumps,
through the Parquet index versus by parsing every dump.json.

The question asked of the data: "every record argument whose statistics hold a NaN or
an Inf, or whose Norm exceeds a threshold". Two ways to answer it:

* index: ``msprobe.readers.open(lake).find_anomalies(norm_above=T)``: a pyarrow dataset
  scan over the Parquet index files with the filter pushed down;
* json: ``json.load`` of every dump.json (what the real tool's compare does with its
  inputs), then a walk over every tensor entry.

Dumps are synthesized with plain ``json`` (indent 1, the real tool's layout and key
order; no dumper involved): a single-process statistics dump of ``--records`` records,
and a lake of ``--runs`` dumps x ``--steps`` steps x ``--ranks`` ranks with
``--lake-records`` records in all. Every timed query runs in a fresh subprocess that
reports its wall time and its peak RSS. Generated data is deleted at the end unless
``--keep``.

    python bench/bench_readers.py                      # 100k dump + 1M-record lake
    python bench/bench_readers.py --lake-records 100000 --records 20000   # a quick run
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from multiprocessing import Pool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAN_RATE = 5e-5  # per tensor entry
INF_RATE = 5e-5
APIS = [("Functional", "linear"), ("Tensor", "__add__"), ("Torch", "matmul"), ("Functional", "gelu"),
        ("Tensor", "__mul__"), ("Functional", "layer_norm"), ("Torch", "softmax"), ("Tensor", "view")]


# -- synthesis ---------------------------------------------------------------------------------

def _tensor(rng: random.Random, shape: list, requires_grad: bool) -> dict:
    scale = rng.lognormvariate(0.0, 1.0)
    mx, mn = scale * rng.uniform(1.0, 3.0), -scale * rng.uniform(1.0, 3.0)
    mean = (mx + mn) * rng.uniform(0.0, 0.2)
    numel = 1
    for d in shape:
        numel *= d
    norm = scale * math.sqrt(numel) * rng.uniform(0.5, 1.0)
    u = rng.random()
    if u < NAN_RATE:
        mx = mean = norm = float("nan")
    elif u < NAN_RATE + INF_RATE:
        mx = norm = float("inf")
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": shape, "Max": mx, "Min": mn,
            "Mean": mean, "Norm": norm, "requires_grad": requires_grad}


def _rank_doc(n: int, seed: int) -> dict:
    rng = random.Random(seed)
    data: dict = {}
    counters: dict = {}
    for i in range(n):
        prefix, api = APIS[i % len(APIS)]
        k = counters.get(api, 0)
        counters[api] = k + 1
        if i % 4 == 3:  # one record in four is a backward one
            shape = [8, 128, 256]
            data[f"{prefix}.{api}.{k}.backward"] = {
                "input": [_tensor(rng, shape, False)],
                "output": [_tensor(rng, shape, False), _tensor(rng, [256, 256], False)]}
            continue
        shape = [8, 128, 256]
        data[f"{prefix}.{api}.{k}.forward"] = {
            "input_args": [_tensor(rng, shape, True), _tensor(rng, [256, 256], True)],
            "input_kwargs": {"alpha": {"type": "float", "value": 1.0}},
            "output": [_tensor(rng, shape, True)],
        }
    return {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "data": data}


def _write_rank(args: tuple) -> int:
    path, n, seed = args
    os.makedirs(path, exist_ok=True)
    doc = _rank_doc(n, seed)
    with open(os.path.join(path, "dump.json"), "w") as f:
        json.dump(doc, f, indent=1)
    with open(os.path.join(path, "stack.json"), "w") as f:
        f.write("{}")
    with open(os.path.join(path, "construct.json"), "w") as f:
        f.write("{}")
    return os.path.getsize(os.path.join(path, "dump.json"))


def synthesize(work: str, records: int, runs: int, steps: int, ranks: int, lake_records: int,
               procs: int) -> dict:
    jobs = []
    single = os.path.join(work, "single")
    jobs.append((os.path.join(single, "step0", "rank"), records, 1))
    per_rank = lake_records // (runs * steps * ranks)
    for r in range(runs):
        for s in range(steps):
            for k in range(ranks):
                jobs.append((os.path.join(work, "lake", f"run{r}", f"step{s}", f"rank{k}"), per_rank,
                             1000 + r * 100000 + s * 100 + k))
    t = time.perf_counter()
    with Pool(procs) as pool:
        sizes = pool.map(_write_rank, jobs, chunksize=4)
    return {"seconds": time.perf_counter() - t, "single_bytes": sizes[0], "lake_bytes": sum(sizes[1:]),
            "lake_rank_dirs": len(jobs) - 1, "per_rank": per_rank, "lake_records": per_rank * (len(jobs) - 1)}


# -- the queries (each run in a fresh subprocess) ------------------------------------------------

def _query_index(path: str, threshold: float, repeat: int) -> dict:
    t0 = time.perf_counter()
    import pyarrow.compute  # import cost reported apart
    import pyarrow.dataset
    import pyarrow.parquet  # noqa: F401

    import msprobe.readers as readers
    t_import = time.perf_counter() - t0
    times = []
    cpu = []
    n = recs = 0
    for _ in range(repeat):
        t = time.perf_counter()
        c = time.process_time()
        d = readers.open(path)
        hits = d.find_anomalies(norm_above=threshold, as_arrow=True, columns=["run", "step", "rank", "record",
                                                                               "arg_path"])
        n = hits.num_rows
        recs = len(set(zip(hits.column("run").to_pylist(), hits.column("step").to_pylist(),
                           hits.column("rank").to_pylist(), hits.column("record").to_pylist())))
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return {"first": times[0], "best": min(times), "cpu_first": cpu[0], "cpu_best": min(cpu), "rows": n,
            "records": recs, "import": t_import, "engine": d.engine}


def _walk_tensors(value, out: list) -> None:
    if isinstance(value, dict):
        if "Norm" in value or "Max" in value:
            out.append(value)
        else:
            for v in value.values():
                _walk_tensors(v, out)
    elif isinstance(value, list):
        for v in value:
            _walk_tensors(v, out)


def _query_json(path: str, threshold: float, repeat: int) -> dict:
    times = []
    cpu = []
    n = 0
    recs = set()
    for _ in range(repeat):
        t = time.perf_counter()
        c = time.process_time()
        n = 0
        recs = set()
        for dirpath, dirs, files in os.walk(path):
            dirs.sort()
            if "dump.json" not in files:
                continue
            with open(os.path.join(dirpath, "dump.json")) as f:
                doc = json.load(f)
            for name, rec in doc["data"].items():
                found: list = []
                _walk_tensors(rec, found)
                for e in found:
                    vals = [e.get(k) for k in ("Max", "Min", "Mean", "Norm")]
                    bad = any(isinstance(v, float) and (math.isnan(v) or math.isinf(v)) for v in vals)
                    norm = e.get("Norm")
                    if bad or (isinstance(norm, (int, float)) and norm > threshold):
                        n += 1
                        recs.add((dirpath, name))
            del doc
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return {"first": times[0], "best": min(times), "cpu_first": cpu[0], "rows": n, "records": len(recs)}


def _query_reader_json(path: str, threshold: float, repeat: int) -> dict:
    import msprobe.readers as readers

    times = []
    n = 0
    for _ in range(repeat):
        t = time.perf_counter()
        d = readers.open(path, engine="msprobe")
        n = len(d.find_anomalies(norm_above=threshold, as_arrow=True, columns=["record"]))
        times.append(time.perf_counter() - t)
    return {"first": times[0], "best": min(times), "rows": n}


def _peak_rss_mb() -> float:
    """VmHWM of this process (ru_maxrss would include the parent's high-water mark across exec)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _query_index_files(path: str, threshold: float, repeat: int) -> dict:
    """The index lake without its compacted files: one Parquet file per (step, rank)."""
    import msprobe.readers._tables as tables_mod

    orig = tables_mod._with_compactions
    tables_mod._with_compactions = lambda sources, compacts: orig(sources, {})
    return _query_index(path, threshold, repeat)


QUERIES = {"index": _query_index, "index-files": _query_index_files, "json": _query_json,
           "reader-json": _query_reader_json}


def _child(kind: str, path: str, threshold: float, repeat: int) -> None:
    res = QUERIES[kind](path, threshold, repeat)
    res["peak_rss_mb"] = _peak_rss_mb()
    print("RESULT " + json.dumps(res))


def run_query(kind: str, path: str, threshold: float, repeat: int) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", kind, path, str(threshold),
                          str(repeat)], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{kind} query failed:\n{out.stderr[-3000:]}")
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


# -- main ------------------------------------------------------------------------------------------

def _build_indexes(work: str, lake_index: str, runs: int) -> dict:
    sys.path.insert(0, ROOT)
    from msprobe.readers.index import build_index

    t = time.perf_counter()
    build_index(os.path.join(work, "single"))
    t_single = time.perf_counter() - t
    t = time.perf_counter()
    for r in range(runs):
        build_index(os.path.join(work, "lake", f"run{r}"), out=lake_index, run=f"run{r}")
    t_lake = time.perf_counter() - t
    return {"single_seconds": t_single, "lake_seconds": t_lake}


def _du(path: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(dirpath, f))
    return total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=100_000, help="records of the single dump")
    ap.add_argument("--lake-records", type=int, default=1_000_000, help="records of the whole lake")
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--threshold", type=float, default=20000.0, help="Norm threshold")
    ap.add_argument("--repeat", type=int, default=3, help="index queries per process (first is cold)")
    ap.add_argument("--procs", type=int, default=os.cpu_count() or 2, help="processes for synthesis")
    ap.add_argument("--workdir", default=None, help="where to generate (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the generated data")
    ap.add_argument("--reuse", action="store_true", help="query the data already in --workdir (from --keep)")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        kind, path, thr, rep = args.child
        _child(kind, path, float(thr), int(rep))
        return 0
    work = args.workdir or tempfile.mkdtemp(prefix="msprobe-bench-readers-")
    os.makedirs(work, exist_ok=True)
    report: dict = {"args": {k: v for k, v in vars(args).items() if k != "child"}}
    lake_index = os.path.join(work, "lake-index")
    try:
        if not args.reuse:
            print(f"synthesizing under {work} ...", flush=True)
            report["synth"] = syn = synthesize(work, args.records, args.runs, args.steps, args.ranks,
                                               args.lake_records, args.procs)
            print(f"  single dump: {args.records} records, {syn['single_bytes'] / 1e6:.0f} MB dump.json; lake: "
                  f"{syn['lake_records']} records in {syn['lake_rank_dirs']} rank dirs, "
                  f"{syn['lake_bytes'] / 1e6:.0f} MB of dump.json ({syn['seconds']:.0f} s)", flush=True)
            print("building indexes ...", flush=True)
            report["build"] = b = _build_indexes(work, lake_index, args.runs)
            b["single_index_bytes"] = _du(os.path.join(work, "single", "step0", "rank", "index"))
            b["lake_index_bytes"] = _du(lake_index)
            print(f"  single: {b['single_seconds']:.1f} s ({b['single_index_bytes'] / 1e6:.1f} MB); lake: "
                  f"{b['lake_seconds']:.1f} s ({b['lake_index_bytes'] / 1e6:.1f} MB, compacted files "
                  f"included)", flush=True)
        results = {}
        for label, kind, path, rep in (
            ("single/index", "index", os.path.join(work, "single"), args.repeat),
            ("single/json.load", "json", os.path.join(work, "single"), 1),
            ("single/reader-json", "reader-json", os.path.join(work, "single"), 1),
            ("lake/index", "index", lake_index, args.repeat),
            ("lake/index-files", "index-files", lake_index, args.repeat),
            ("lake/json.load", "json", os.path.join(work, "lake"), 1),
        ):
            print(f"query {label} ...", flush=True)
            results[label] = r = run_query(kind, path, args.threshold, rep)
            print(f"  {json.dumps(r)}", flush=True)
        report["results"] = results
        for scope in ("single", "lake"):
            ri, rj = results[f"{scope}/index"], results[f"{scope}/json.load"]
            assert ri["rows"] == rj["rows"] and ri["records"] == rj["records"], (scope, ri, rj)
            report[f"{scope}_speedup_first"] = rj["first"] / ri["first"]
            report[f"{scope}_speedup_best"] = rj["first"] / ri["best"]
        print(json.dumps(report, indent=1))
        print(f"lake: index {results['lake/index']['first']:.3f} s cold / {results['lake/index']['best']:.3f} s "
              f"warm vs json.load {results['lake/json.load']['first']:.1f} s -> "
              f"{report['lake_speedup_first']:.0f}x (cold), {report['lake_speedup_best']:.0f}x (warm)")
    finally:
        if not args.keep and not args.reuse:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
