"""Benchmark: the lake's communication graph (``comm_calls``, ``comm_edges``) of a 3-D parallel
training run: --ranks ranks (tensor parallel --tp, pipeline parallel --pp, data parallel the rest)
x --steps steps, statistics dumps as the PyTorch dumper writes them.

Each rank's step: --micro micro-batches forward (receive the activation from the previous stage,
a column- and a row-parallel linear, the row-parallel partial sums all-reduced over the TP group,
send to the next stage; the last stage all-gathers its output over the TP group), the same
backward (receive the gradient from the next stage, two linear backward records, all-reduce over
the TP group, send to the previous stage), then two gradient buckets all-reduced over the DP group.
With 1,024 ranks (tp 8, pp 4, dp 32) a step has ~14 K calls and ~100 K edges.

A NaN is planted at --nan-step on --nan-rank (its row-parallel linear's output, so its TP
all-reduce's input) and in the all-reduce's result on the other members of its TP group: ``lake
nan`` must name --nan-rank's linear as the origin.

Phases, each in a fresh process (peak RSS = the process's VmHWM):

* ``full``: ``msprobe.lake.open`` of the new lake (index, compaction, graphs), in-process tasks;
* ``graph``: ``_lake/comm/`` removed, the lake opened again: only the graphs are built (the
  ``graph_s`` timing; peak RSS against the RSS before the open);
* ``step``: one step's graph task (:func:`msprobe.lake._graph.build_graph`) alone;
* ``query``: the lake opened (nothing built): the tables counted through SQL, ``first_nan``.

    python bench/bench_lake_graph.py --workdir W                       # 1,024 ranks x 10 steps
    python bench/bench_lake_graph.py --ranks 64 --steps 2 --workdir W  # a quick run
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from multiprocessing import Pool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

RUN = "run3d"


def _hwm_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _t(value: float) -> dict:
    return {"type": "torch.Tensor", "dtype": "torch.bfloat16", "shape": [4, 1024, 512], "Max": value,
            "Min": -value, "Mean": value / 100, "Norm": value * 40, "requires_grad": False}


def _int(value: int) -> dict:
    return {"type": "int", "value": value}


def _group(ranks: list) -> dict:
    return {"type": "torch.ProcessGroup", "group_ranks": ranks}


class _Rank:
    """One rank's records of one step, named with per-API call counters."""

    def __init__(self, rank: int, a: argparse.Namespace, step: int):
        self.rank, self.a, self.step = rank, a, step
        tp, pp = a.tp, a.pp
        self.t, self.s, self.d = rank % tp, (rank // tp) % pp, rank // (tp * pp)
        base = self.d * tp * pp + self.s * tp
        self.tp_group = list(range(base, base + tp))
        self.dp_group = [d * tp * pp + self.s * tp + self.t for d in range(a.ranks // (tp * pp))]
        self.data: dict = {}
        self.counts: dict = {}
        self.nan = step == a.nan_step and rank in self.tp_group and a.nan_rank in self.tp_group

    def add(self, api: str, raw: dict, direction: str = "forward") -> str:
        n = self.counts.get(api, 0)
        self.counts[api] = n + 1
        name = f"{api}.{n}.{direction}"
        self.data[name] = raw
        return name

    def peer(self, stage: int) -> int:
        return self.d * self.a.tp * self.a.pp + stage * self.a.tp + self.t

    def forward(self, mb: int) -> None:
        s, last = self.s, self.a.pp - 1
        if s > 0:
            self.add("Distributed.recv", {"input_args": [None], "input_kwargs": {"src": _int(self.peer(s - 1))},
                                          "output": [_t(1.0 + mb)]})
        self.add("Functional.linear", {"input_args": [_t(1.0), _t(0.02)], "input_kwargs": {}, "output": [_t(2.0)]})
        planted = self.nan and mb == 0 and self.rank == self.a.nan_rank
        partial = _t(float("nan")) if planted else _t(3.0)
        self.add("Functional.linear", {"input_args": [_t(2.0), _t(0.02)], "input_kwargs": {}, "output": [partial]})
        reduced = _t(float("nan")) if self.nan and mb == 0 else _t(3.5)
        self.add("Distributed.all_reduce", {"input_args": [partial], "input_kwargs": {"group": _group(self.tp_group)},
                                            "output": [reduced]})
        if s < last:
            self.add("Distributed.send", {"input_args": [reduced], "input_kwargs": {"dst": _int(self.peer(s + 1))},
                                          "output": [None]})
        else:
            self.add("Distributed.all_gather", {"input_args": [[None] * self.a.tp, reduced],
                                                "input_kwargs": {"group": _group(self.tp_group)},
                                                "output": [[_t(3.5)] * self.a.tp]})

    def backward(self, mb: int) -> None:
        s, last = self.s, self.a.pp - 1
        if s < last:
            self.add("Distributed.recv", {"input_args": [None], "input_kwargs": {"src": _int(self.peer(s + 1))},
                                          "output": [_t(0.1)]})
        for _ in range(2):
            self.add("Functional.linear", {"input": [_t(0.1)], "output": [_t(0.2), _t(0.01)]}, "backward")
        self.add("Distributed.all_reduce", {"input_args": [_t(0.2)], "input_kwargs": {"group": _group(self.tp_group)},
                                            "output": [_t(0.3)]})
        if s > 0:
            self.add("Distributed.send", {"input_args": [_t(0.3)], "input_kwargs": {"dst": _int(self.peer(s - 1))},
                                          "output": [None]})

    def doc(self) -> dict:
        for mb in range(self.a.micro):
            self.forward(mb)
        for mb in reversed(range(self.a.micro)):
            self.backward(mb)
        for _ in range(2):  # gradient buckets
            self.add("Distributed.all_reduce", {"input_args": [_t(0.05)],
                                                "input_kwargs": {"group": _group(self.dp_group)}, "output": [_t(0.05)]})
        return {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "data": self.data}


def _write(job: tuple) -> int:
    path, rank, step, a = job
    os.makedirs(path, exist_ok=True)
    target = os.path.join(path, "dump.json")
    with open(target, "w") as f:
        json.dump(_Rank(rank, a, step).doc(), f, indent=1)
    return os.path.getsize(target)


def synthesize(root: str, a: argparse.Namespace) -> dict:
    jobs = [(os.path.join(root, RUN, f"step{s}", f"rank{r}"), r, s, a) for s in range(a.steps) for r in range(a.ranks)]
    start = time.perf_counter()
    with Pool(a.procs) as pool:
        sizes = pool.map(_write, jobs, chunksize=64)
    return {"rank_dirs": len(jobs), "doc_bytes": sum(sizes), "seconds": round(time.perf_counter() - start, 1)}


def _open(root: str) -> object:
    import msprobe.lake

    return msprobe.lake.open(root, local=False)


def phase_full(root: str, a: argparse.Namespace) -> dict:
    start = time.perf_counter()
    lake = _open(root)
    out = {"seconds": round(time.perf_counter() - start, 1), "timings": {k: round(v, 1) for k, v in lake.timings.items()},
           "graphs": lake.stats["graphs"], "peak_rss_mb": round(_hwm_mb())}
    lake.close()
    return out


def phase_graph(root: str, a: argparse.Namespace) -> dict:
    import pyarrow.parquet  # noqa: F401

    import msprobe.lake  # noqa: F401 - imports before the baseline

    shutil.rmtree(os.path.join(root, "_lake", "comm"), ignore_errors=True)
    base = _rss_mb()
    start = time.perf_counter()
    lake = _open(root)
    out = {"seconds": round(time.perf_counter() - start, 1), "graph_s": round(lake.timings["graph_s"], 1),
           "graphs": lake.stats["graphs"], "rss_before_mb": round(base), "peak_rss_mb": round(_hwm_mb()),
           "rank_dirs": lake.stats["rank_dirs"]}
    cpu = os.times()
    out["cpu_s"] = round(cpu.user + cpu.system, 1)
    lake.close()
    return out


def phase_step(root: str, a: argparse.Namespace) -> dict:
    import msprobe.lake
    from msprobe.lake import _graph

    lake = msprobe.lake.open(root, local=False, refresh="none")
    rows = [row for row in lake.manifest_rows if row["step"] == a.nan_step]
    rows.sort(key=lambda row: row["rank"])
    job = _graph.GraphJob(lake.url, None, lake.lake_url, None, RUN, None, a.nan_step,
                          [(row["prefix"], row["rank_dir"], row["rank"]) for row in rows],
                          "comm/bench-one-step", "x")
    lake.close()
    base = _rss_mb()
    start = time.perf_counter()
    got = _graph.build_graph(job)
    elapsed = time.perf_counter() - start
    shutil.rmtree(os.path.join(root, "_lake", "comm", "bench-one-step"), ignore_errors=True)
    return {"seconds": round(elapsed, 1), "ranks": got["ranks"], "calls": got["calls"],
            "edges": got["edges"], "rss_before_mb": round(base), "peak_rss_mb": round(_hwm_mb())}


def phase_query(root: str, a: argparse.Namespace) -> dict:
    lake = _open(root)
    start = time.perf_counter()
    counts = lake.sql("SELECT (SELECT count(*) FROM comm_calls) AS calls, (SELECT count(*) FROM comm_edges) AS edges, "
                      "(SELECT max(level) FROM comm_calls) AS max_level").to_dict("records")[0]
    sql_s = time.perf_counter() - start
    start = time.perf_counter()
    fn = lake.first_nan()
    nan_s = time.perf_counter() - start
    origin = fn[fn["origin"]].to_dict("records")[0]
    lake.close()
    return {"calls": int(counts["calls"]), "edges": int(counts["edges"]), "max_level": int(counts["max_level"]),
            "sql_s": round(sql_s, 2), "first_nan_s": round(nan_s, 2), "nan_rows": len(fn),
            "origin": [origin["step"], origin["rank"], origin["record"]],
            "origin_ok": [origin["step"], origin["rank"], origin["record"]] == [a.nan_step, a.nan_rank,
                                                                                 "Functional.linear.1.forward"],
            "path_hops": len(fn.attrs["paths"][RUN]), "peak_rss_mb": round(_hwm_mb())}


PHASES = {"full": phase_full, "graph": phase_graph, "step": phase_step, "query": phase_query}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=1024)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--tp", type=int, default=8)
    p.add_argument("--pp", type=int, default=4)
    p.add_argument("--micro", type=int, default=2)
    p.add_argument("--nan-step", type=int, default=None, help="default: the middle step")
    p.add_argument("--nan-rank", type=int, default=None, help="default: a stage-1 rank of the middle DP replica")
    p.add_argument("--procs", type=int, default=2, help="processes writing the dumps")
    p.add_argument("--workdir", default=None, help="where the lake goes (default: a temporary directory)")
    p.add_argument("--reuse", action="store_true", help="keep the dumps already in --workdir (and their index)")
    p.add_argument("--phase", default=None, choices=sorted(PHASES), help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help="write the report (JSON) here too")
    a = p.parse_args()
    if a.ranks % (a.tp * a.pp):
        p.error("--ranks must be a multiple of --tp x --pp")
    a.nan_step = a.steps // 2 if a.nan_step is None else a.nan_step
    if a.nan_rank is None:
        a.nan_rank = (a.ranks // (a.tp * a.pp) // 2) * a.tp * a.pp + a.tp + 1 if a.pp > 1 else 1
    root = os.path.join(a.workdir or "/tmp/bench_lake_graph", "lake")
    if a.phase:
        print(json.dumps(PHASES[a.phase](root, a)))
        return 0
    report: dict = {"ranks": a.ranks, "steps": a.steps, "tp": a.tp, "pp": a.pp, "dp": a.ranks // (a.tp * a.pp),
                    "micro": a.micro, "nan": [a.nan_step, a.nan_rank]}
    if not (a.reuse and os.path.isdir(os.path.join(root, RUN))):
        shutil.rmtree(root, ignore_errors=True)
        report["synth"] = synthesize(root, a)
        print("synth", report["synth"], flush=True)
    forwarded = [f"--{k.replace('_', '-')}={v}" for k, v in vars(a).items()
                 if k in ("ranks", "steps", "tp", "pp", "micro", "nan_step", "nan_rank", "workdir") and v is not None]
    for phase in ("full", "graph", "step", "query"):
        if phase == "full" and a.reuse and os.path.isdir(os.path.join(root, "_lake")):
            continue
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--phase", phase] + forwarded,
                              capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
        if proc.returncode:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
        report[phase] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(phase, report[phase], flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)
    ok = report["query"]["origin_ok"]
    print("origin named:", ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
