"""Benchmark: a statistics lake of --ranks ranks x --steps steps (1,024 x 10 ~ 10 M rows).

What is measured (wall and CPU time; the machine is shared, so CPU times are steadier):

* index build of a --build-steps subset of run ``big`` with a LocalCluster of 1 worker, then of
  2 workers (``refresh="all"``, the same rank directories, ratio reported);
* the full build (``msprobe.lake.open``: discovery, index, per-step compaction, manifest, catalog)
  with --workers workers;
* each question: ``sql`` (rows per run), ``first_nan``, ``disagree``, ``trend``, and ``diverge``
  (compare of every rank pair of step 0 as Dask tasks, run ``big`` vs run ``twin``);
* peak RSS of the driver process and of each Dask worker (VmHWM).

The lake (``bench_readers``' tensor synthesis with its random NaN/Inf switched off, plus
parameter gradients equal on every rank) holds planted answers, checked after each question:
a NaN in run ``big`` at (--nan-step, rank --nan-rank), a gradient Norm of rank
--dis-rank differing in step --dis-step, and run ``twin`` (step 0 only, hard links to
``big``'s files) diverging at rank --div-rank.

    python bench/bench_lake.py                                  # 1,024 ranks x 10 steps
    python bench/bench_lake.py --ranks 128 --steps 4            # a quick run
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from multiprocessing import Pool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_readers  # noqa: E402

bench_readers.NAN_RATE = bench_readers.INF_RATE = 0.0  # only the planted NaN
PG_LAYERS = 8  # parameters_grad records per rank (weight + bias: 2 rows each)


def _rank_doc(records: int, step: int, rank: int, plant: dict) -> dict:
    doc = bench_readers._rank_doc(records, 1000003 * step + rank)
    data = doc["data"]
    if plant.get("nan"):
        name = list(data)[plant["nan"]]
        data[name]["output"][0]["Norm"] = float("nan")
        data[name]["output"][0]["Max"] = float("nan")
    if plant.get("div"):
        name = list(data)[plant["div"]]
        data[name]["output"][0]["Norm"] *= 1.5
    rng = random.Random(7 * step + 1)  # the same on every rank of a step: all-reduced gradients
    for i in range(PG_LAYERS):
        w = bench_readers._tensor(rng, [256, 256], False)
        b = bench_readers._tensor(rng, [256], False)
        if plant.get("dis") and i == 3:
            w = dict(w, Norm=w["Norm"] * 1.01)
        data[f"Module.layers.{i}.Linear.parameters_grad.0"] = {"weight": [w], "bias": [b]}
    doc["task"], doc["level"] = "statistics", "mix"
    return doc


def _write(job: tuple) -> int:
    path, records, step, rank, plant = job
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "dump.json"), "w") as f:
        json.dump(_rank_doc(records, step, rank, plant), f, indent=1)
    return os.path.getsize(os.path.join(path, "dump.json"))


def synthesize(root: str, a: argparse.Namespace) -> dict:
    jobs = []
    for s in range(a.steps):
        for r in range(a.ranks):
            plant = {}
            if (s, r) == (a.nan_step, a.nan_rank):
                plant["nan"] = a.records // 2
            if (s, r) == (a.dis_step, a.dis_rank):
                plant["dis"] = True
            jobs.append((os.path.join(root, "big", f"step{s}", f"rank{r}"), a.records, s, r, plant))
    twin = [(os.path.join(root, "twin", "step0", f"rank{a.div_rank}"), a.records, 0, a.div_rank,
             {"div": a.records // 3, "dis": (0, a.div_rank) == (a.dis_step, a.dis_rank)})]
    t = time.perf_counter()
    with Pool(a.procs) as pool:
        sizes = pool.map(_write, jobs + twin, chunksize=16)
    for r in range(a.ranks):  # the twin run: step 0 of big, one rank changed
        if r == a.div_rank:
            continue
        d = os.path.join(root, "twin", "step0", f"rank{r}")
        os.makedirs(d, exist_ok=True)
        os.link(os.path.join(root, "big", "step0", f"rank{r}", "dump.json"), os.path.join(d, "dump.json"))
    return {"seconds": time.perf_counter() - t, "rank_dirs": len(jobs) + a.ranks, "dump_json_bytes": sum(sizes)}


def _vmhwm_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _timed(fn, *args, **kw):
    w, c = time.perf_counter(), time.process_time()
    out = fn(*args, **kw)
    return out, time.perf_counter() - w, time.process_time() - c


def _cluster(n: int):
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0",
                           silence_logs=40)
    return cluster, Client(cluster)


def _worker_cpu(client) -> dict:
    return client.run(time.process_time)


def build_subset(root: str, a: argparse.Namespace, workers: int) -> dict:
    """refresh="all" over a lake holding --build-steps steps of run big (hard links), timed."""
    import msprobe.lake

    sub = os.path.join(root, f"_subset_w{workers}")
    shutil.rmtree(sub, ignore_errors=True)
    for s in range(a.build_steps):
        for r in range(a.ranks):
            d = os.path.join(sub, "big", f"step{s}", f"rank{r}")
            os.makedirs(d)
            os.link(os.path.join(root, "big", f"step{s}", f"rank{r}", "dump.json"), os.path.join(d, "dump.json"))
    cluster, client = _cluster(workers)
    try:
        c0 = _worker_cpu(client)
        lake, wall, cpu = _timed(msprobe.lake.open, sub, client=client, batch=a.batch)
        c1 = _worker_cpu(client)
        per = sorted(c1[w] - c0.get(w, 0.0) for w in c1)
        rss = client.run(_vmhwm_mb)
    finally:
        client.close()
        cluster.close()
    shutil.rmtree(sub, ignore_errors=True)
    return {"workers": workers, "rank_dirs": lake.stats["rank_dirs"], "wall_s": wall, "driver_cpu_s": cpu,
            "worker_cpu_s": sum(per), "worker_cpu_each_s": per, "worker_peak_rss_mb": sorted(rss.values()),
            "timings": lake.timings}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--records", type=int, default=300, help="records per rank dir (~3 rows each, +16 grad rows)")
    ap.add_argument("--build-steps", type=int, default=1, help="steps of the 1-vs-2-worker build comparison")
    ap.add_argument("--workers", type=int, default=2, help="workers of the full build and the questions")
    ap.add_argument("--batch", type=int, default=64, help="rank dirs per index task")
    ap.add_argument("--nan-step", type=int, default=6)
    ap.add_argument("--nan-rank", type=int, default=123)
    ap.add_argument("--dis-step", type=int, default=3)
    ap.add_argument("--dis-rank", type=int, default=512)
    ap.add_argument("--div-rank", type=int, default=700)
    ap.add_argument("--procs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--reuse", action="store_true", help="reuse the dumps already in --workdir")
    ap.add_argument("--out", default=None, help="write the report JSON here")
    ap.add_argument("--skip-full", action="store_true", help="only the 1-vs-2-worker build comparison")
    a = ap.parse_args(argv)
    a.nan_step, a.dis_step = min(a.nan_step, a.steps - 1), min(a.dis_step, a.steps - 1)
    a.nan_rank, a.dis_rank, a.div_rank = a.nan_rank % a.ranks, a.dis_rank % a.ranks, a.div_rank % a.ranks
    work = a.workdir or tempfile.mkdtemp(prefix="msprobe-bench-lake-")
    os.makedirs(work, exist_ok=True)
    rep: dict = {"args": vars(a)}
    try:
        if not a.reuse:
            shutil.rmtree(os.path.join(work, "_lake"), ignore_errors=True)
            print(f"synthesizing {a.ranks} ranks x {a.steps} steps under {work} ...", flush=True)
            rep["synth"] = syn = synthesize(work, a)
            print(f"  {syn['rank_dirs']} rank dirs, {syn['dump_json_bytes'] / 1e9:.2f} GB dump.json, "
                  f"{syn['seconds']:.0f} s", flush=True)
        rep["build_subset"] = []
        for n in (1, 2):
            print(f"index build of {a.build_steps} step(s) x {a.ranks} ranks with {n} worker(s) ...", flush=True)
            r = build_subset(work, a, n)
            rep["build_subset"].append(r)
            print(f"  {json.dumps(r)}", flush=True)
        b1, b2 = rep["build_subset"]
        rep["build_speedup_wall"] = b1["wall_s"] / b2["wall_s"]
        # the CPU critical path: the busiest worker (steadier than wall time on a shared machine)
        rep["build_speedup_cpu_path"] = max(b1["worker_cpu_each_s"]) / max(b2["worker_cpu_each_s"])
        print(f"  1 -> 2 workers: {rep['build_speedup_wall']:.2f}x wall, "
              f"{rep['build_speedup_cpu_path']:.2f}x on the busiest worker's CPU time", flush=True)

        if a.skip_full:
            if a.out:
                with open(a.out, "w") as fh:
                    json.dump(rep, fh, indent=1, default=str)
            return 0
        import msprobe.lake

        cluster, client = _cluster(a.workers)
        try:
            print(f"full open (index everything) with {a.workers} workers ...", flush=True)
            shutil.rmtree(os.path.join(work, "_lake"), ignore_errors=True)
            lake, wall, cpu = _timed(msprobe.lake.open, work, client=client, batch=a.batch)
            rep["full_build"] = {"wall_s": wall, "driver_cpu_s": cpu, "stats": lake.stats, "timings": lake.timings,
                                 "index_bytes": sum(os.path.getsize(os.path.join(d, f))
                                                    for d, _, fs in os.walk(os.path.join(work, "_lake")) for f in fs)}
            print(f"  {json.dumps(rep['full_build'])}", flush=True)
            _, wall, _ = _timed(msprobe.lake.open, work, client=client)
            rep["reopen_s"] = wall
            q: dict = {}
            rows, w, c = _timed(lake.sql, "SELECT run, count(*) AS n FROM lake GROUP BY run ORDER BY run")
            q["sql_count"] = {"wall_s": w, "cpu_s": c, "rows": dict(zip(rows["run"], map(int, rows["n"])))}
            fn, w, c = _timed(lake.first_nan)
            got = [(r.run, r.step, r.rank) for r in fn.itertuples()]
            q["first_nan"] = {"wall_s": w, "cpu_s": c, "answer": got,
                              "ok": got == [("big", a.nan_step, a.nan_rank)]}
            dis, w, c = _timed(lake.disagree)
            got = sorted({(r.run, r.step, r.rank, r.record) for r in dis.itertuples()})
            q["disagree"] = {"wall_s": w, "cpu_s": c, "answer": got,
                             "ok": got == [("big", a.dis_step, a.dis_rank, "Module.layers.3.Linear.parameters_grad.0")]}
            tr, w, c = _timed(lake.trend, "Module.layers.0.Linear.parameters_grad.0", arg="weight.0", run="big")
            q["trend"] = {"wall_s": w, "cpu_s": c, "rows": len(tr), "ok": len(tr) == a.ranks * a.steps}
            d, w, c = _timed(lake.diverge, "big", "twin")
            f = d["first"] or {}
            q["diverge"] = {"wall_s": w, "cpu_s": c, "pairs": d["pairs_compared"],
                            "answer": [f.get("step"), f.get("rank"), f.get("record")],
                            "ok": (f.get("step"), f.get("rank")) == (0, a.div_rank)}
            rep["questions"] = q
            rep["worker_peak_rss_mb"] = sorted(client.run(_vmhwm_mb).values())
            for k, v in q.items():
                print(f"  {k}: {json.dumps(v, default=str)}", flush=True)
            lake.close()
        finally:
            client.close()
            cluster.close()
        rep["driver_peak_rss_mb"] = _vmhwm_mb()
        rep["rows"] = sum(rep["questions"]["sql_count"]["rows"].values())
        print(json.dumps({k: rep[k] for k in ("rows", "driver_peak_rss_mb", "worker_peak_rss_mb", "reopen_s")}),
              flush=True)
        if a.out:
            with open(a.out, "w") as fh:
                json.dump(rep, fh, indent=1, default=str)
        bad = [k for k, v in rep["questions"].items() if v.get("ok") is False]
        if bad:
            print(f"WRONG ANSWERS: {bad}", flush=True)
            return 1
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
