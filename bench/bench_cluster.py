"""Cluster-fault benchmark: across ranks, do the tools name the place where a known fault was injected?

Each fault of bench/cluster_faults.py (pipeline parallel with send/recv and with isend/irecv,
Megatron-style tensor parallel, data parallel, expert parallel, broadcast; 2 gloo ranks, 3 steps,
statistics mix, the fault at step 1) is dumped by ours and by the real 26.2.0, with two healthy
runs of each layout (``none``: the bench; ``none2``: a second healthy run, the healthy pair). Then,
on each tool's dumps:

* ``compare`` (ours): ``msprobe compare FAULT none``: for a NaN/Inf fault its first NaN / first Inf
  in the target (summary ``first_nan_target`` / ``first_inf_target``), for a x1.05 fault its first
  divergence where the error is introduced (summary ``origin``);
* ``compare origin`` (ours): the ``origin`` for every fault (NaN/Inf too);
* ``lake`` (ours, a lake per layout holding its runs): ``lake nan``'s first row in the lake's own
  order (NaN/Inf) or ``lake diverge FAULT none``'s origin (x1.05);
* ``overflow_check`` (ours): ``msprobe overflow_check -i RUN/stepN -o OUT`` for N = 0, 1, 2 until
  it names something (NaN/Inf faults); its first entry;
* ``26.2.0 compare``: ``msprobe compare -tp FAULT/stepN -gp none/stepN`` for N = 0, 1, 2 until a
  row's Result is not pass: the first such row of the ranks (lowest row, then lowest rank);
* ``26.2.0 overflow_check``: as ours, the real tool's command.

A named record *hits* when it is the injected (step, rank, record): the ``fmod`` (NaN) or ``div`` (Inf) of a
fault, or, for x1.05, a record at or below the scaled module in construct.json. An answer on another
step than the fault's, or any answer on the healthy pair (``none2`` against ``none``; ``lake nan``
and ``overflow_check`` on ``none``), is counted as an answer on a healthy step.

    python bench/bench_cluster.py --out /tmp/cluster [--faults pp/nan_s0_fwd,...] [--dumps ours,real]
                                  [--tools compare,lake,...] [--no-real]

Dumps are kept under ``--out`` and reused (``--out/{ours,real}/LAYOUT/RUN``); the scores go to
``--out/scores.json`` and a table is printed (docs/benchmarks.md, "Cluster faults").
"""
from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import cluster_faults as cf  # noqa: E402

HEALTHY = ("none", "none2")
TOOLS = [("compare", "compare (first NaN/Inf; x1.05: origin)"), ("compare_origin", "compare origin"),
         ("lake", "lake nan / diverge"), ("overflow_check", "overflow_check"),
         ("real_compare", "26.2.0 compare"), ("real_overflow_check", "26.2.0 overflow_check")]
OURS = ("compare", "compare_origin", "lake", "overflow_check")
NONFINITE_ONLY = ("overflow_check", "real_overflow_check")


def real_python() -> str:
    from _realtool import real_tool_python  # type: ignore[import-not-found]

    return real_tool_python("26.2.0")


def dump_all(out: str, faults: list, dumps: list) -> None:
    """Dump the healthy runs and each fault, by each tool of ``dumps`` (kept if present)."""
    layouts = sorted({cf.FAULTS[f][0] for f in faults})
    for tool in dumps:
        for layout in layouts:
            runs = list(HEALTHY) + [f.split("/")[1] for f in faults if cf.FAULTS[f][0] == layout]
            for run in runs:
                d = os.path.join(out, tool, layout, run)
                if os.path.isdir(os.path.join(d, f"step{cf.STEPS - 1}")):
                    continue
                shutil.rmtree(d, ignore_errors=True)
                t0 = time.time()
                if tool == "ours":
                    cf.run(layout, run, d)
                else:
                    cf.run(layout, run, d, python=real_python(), ours=False, cwd=out)
                print(f"dumped {tool} {layout}/{run} in {time.time() - t0:.0f} s", file=sys.stderr)


# -- what an answer names ---------------------------------------------------------------------------

def _parents(rank_dir: str) -> dict:
    p = os.path.join(rank_dir, "construct.json")
    if not os.path.exists(p):
        return {}
    with open(p, encoding="utf-8") as f:
        doc = json.load(f)
    out: dict = {}
    for k, v in doc.items():  # 26.x nests a level per kind, or flat
        if isinstance(v, dict):
            out.update(v)
        else:
            out[k] = v
    return out


def _rank_of(rank_dir: Any) -> Optional[int]:
    if isinstance(rank_dir, int):
        return rank_dir
    s = str(rank_dir or "")
    s = s[5:] if s.startswith("rank_") else s[4:] if s.startswith("rank") else s
    return int(s) if s.isdigit() else None


def _strip(name: str) -> str:
    for sep in (".input.", ".output.", ".parameters.", ".parameters_grad", ".input_args", ".input_kwargs"):
        if sep in name:
            return name[:name.index(sep)]
    return name


def answer(record: Optional[str], step: Any, rank: Any) -> Optional[dict]:
    if record is None:
        return None
    return {"record": _strip(str(record)), "step": None if step is None else int(step), "rank": _rank_of(rank)}


def hit(place: dict, ans: Optional[dict], run_dir: str) -> bool:
    """Whether ``ans`` names the injected (step, rank, record) of ``place`` in ``run_dir``."""
    if ans is None or ans["step"] != place["step"] or ans["rank"] != place["rank"]:
        return False
    if place["record"]:
        return ans["record"] == place["record"]
    parents = _parents(os.path.join(run_dir, f"step{ans['step']}", f"rank{ans['rank']}"))
    want = f"Module.{place['module']}."
    cur: Optional[str] = ans["record"]
    for _ in range(100):
        if not cur:
            break
        if cur.startswith(want):
            return True
        cur = parents.get(cur)
    return False


# -- the tools --------------------------------------------------------------------------------------

def ours_compare(target: str, bench: str, kind: Optional[str], work: str) -> dict:
    """{compare, compare_origin}: answers of our compare (kind None: the healthy pair, any answer)."""
    from msprobe.compare import compare

    s = compare(target, bench, os.path.join(work, "cmp"), plot=False, progress=False)

    def loc(entry: Any, key: str = "record") -> Optional[dict]:
        return entry and answer(entry[key], entry["step"], entry["rank_dir"])

    origin = loc(s["origin"])
    if kind is None:
        firsts = [loc(s[k]) for k in ("first_nan_target", "first_inf_target")]
        return {"compare": next((a for a in firsts if a), None), "compare_origin": origin}
    if kind == "scale":
        return {"compare": origin, "compare_origin": origin}
    return {"compare": loc(s["first_nan_target" if kind == "nan" else "first_inf_target"]), "compare_origin": origin}


def ours_lake(layout_dir: str, run: str, kind: Optional[str]) -> dict:
    """{lake}: ``lake nan``'s first row (NaN/Inf; the healthy run: any row) or ``lake diverge``'s
    origin (x1.05; the healthy pair: ``none2`` against ``none``)."""
    import msprobe.lake

    with msprobe.lake.open(layout_dir) as lake:
        if kind in ("scale", None):
            o = lake.diverge(run, "none").get("origin")
            if o or kind == "scale":
                return {"lake": o and answer(o["record"], o["step"], o["rank"])}
        df = lake.first_nan(run=run, kind="any")
        if not len(df):
            return {"lake": None}
        r = df.iloc[0]
        return {"lake": answer(r["record"], r["step"], r["rank_dir"])}


def _first_anomaly_file(out: str) -> Optional[dict]:
    files = sorted(glob.glob(os.path.join(out, "anomaly_analyze_*.json")), key=os.path.getmtime)
    if not files:
        return None
    with open(files[-1], encoding="utf-8") as f:
        doc = json.load(f)
    for rank, entries in doc.items():
        for e in entries:
            return {"record": e.get("op_name"), "rank": rank}
    return None


def overflow_check(run_dir: str, work: str, real: bool) -> Optional[dict]:
    """The first named record of ``overflow_check`` on step 0, 1, 2 (the first step that names one)."""
    for step in range(cf.STEPS):
        out = os.path.join(work, f"{'real_' if real else ''}oc_step{step}")
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        args = ["overflow_check", "-i", os.path.join(run_dir, f"step{step}"), "-o", out]
        if real:
            env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
            subprocess.run([real_python(), "-m", "msprobe.msprobe", *args], env=env, cwd=out, capture_output=True,
                           timeout=600)
        else:
            from msprobe.cli import main

            if main(args) not in (0, None):
                return {"record": "(overflow_check failed)", "step": step, "rank": None}
        got = _first_anomaly_file(out)
        if got:
            return answer(got["record"], step, got["rank"])
    return None


def real_compare(target: str, bench: str, work: str) -> Optional[dict]:
    """26.2.0's compare step by step: the first row whose Result is not pass (lowest row, then rank)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    for step in range(cf.STEPS):
        out = os.path.join(work, f"real_cmp_step{step}")
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        subprocess.run([real_python(), "-m", "msprobe.msprobe", "compare", "-tp", os.path.join(target, f"step{step}"),
                        "-gp", os.path.join(bench, f"step{step}"), "-o", out], env=env, cwd=out, capture_output=True,
                       timeout=900)
        best = None
        for path in sorted(glob.glob(os.path.join(out, "compare_result_rank*.csv"))):
            rank = os.path.basename(path).split("_")[2]
            with open(path, encoding="utf-8-sig") as f:
                for i, row in enumerate(csv.DictReader(f)):
                    if row.get("Result", "").lower() not in ("pass", ""):
                        if best is None or (i, _rank_of(rank)) < best[:2]:
                            best = (i, _rank_of(rank), row["NPU Name"])
                        break
        if best:
            return answer(best[2], step, best[1])
    return None


# -- the benchmark ----------------------------------------------------------------------------------

def score_run(base: str, layout: str, run: str, place: Optional[dict], tools: list) -> dict:
    """The answers of every tool of ``tools`` on one run (a fault, or ``none2``: the healthy pair)."""
    layout_dir = os.path.join(base, layout)
    target, bench = os.path.join(layout_dir, run), os.path.join(layout_dir, "none")
    work = os.path.join(base, "work", layout, run)
    kind = place["kind"] if place else None
    got: dict = {}
    if "compare" in tools or "compare_origin" in tools:
        got.update(ours_compare(target, bench, kind, work))
    if "lake" in tools:
        got.update(ours_lake(layout_dir, run, kind))
    for tool in ("overflow_check", "real_overflow_check"):
        if tool in tools and kind != "scale":  # NaN/Inf only; the healthy runs too
            got[tool] = overflow_check(target, work, tool.startswith("real"))
    if "real_compare" in tools:
        got["real_compare"] = real_compare(target, bench, work)
    return got


def _verdict(place: Optional[dict], ans: Optional[dict], run_dir: str) -> dict:
    if place is None:
        return {"named": ans, "hit": None, "healthy_step": ans is not None}
    return {"named": ans, "hit": hit(place, ans, run_dir),
            "healthy_step": ans is not None and ans["step"] != place["step"]}


def bench(out: str, faults: list, dumps: list, tools: list) -> dict:
    path = os.path.join(out, "scores.json")
    scores: dict = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            scores = json.load(f)
    dump_all(out, faults, dumps)
    layouts = sorted({cf.FAULTS[f][0] for f in faults})
    for dump in dumps:
        base = os.path.join(out, dump)
        todo = [(f, cf.FAULTS[f][0], f.split("/")[1], cf.place(f)) for f in faults]
        todo += [(f"{layout}/healthy", layout, "none2", None) for layout in layouts]
        for name, layout, run, place in todo:
            t0 = time.time()
            got = score_run(base, layout, run, place, tools)
            entry = scores.setdefault(f"{dump}:{name}", {"dumps": dump, "fault": name, "place": place})
            for tool, ans in got.items():
                entry[tool] = _verdict(place, ans, os.path.join(base, layout, run))
            _save(path, scores)
            print(f"{dump}:{name} ({time.time() - t0:.0f} s): " + ", ".join(
                f"{t}={'hit' if v['hit'] else _fmt(v['named'])}" for t, v in entry.items()
                if isinstance(v, dict) and "named" in v), file=sys.stderr)
    return scores


def _save(path: str, scores: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(scores, f, indent=1, default=str)


def _fmt(ans: Optional[dict]) -> str:
    return "-" if not ans else f"{ans['record']} s{ans['step']} r{ans['rank']}"


def table(scores: dict) -> str:
    """Markdown: per fault, each tool's answer on each tool's dumps; totals, ratios and the
    answers on healthy steps."""
    dumps = [d for d in ("ours", "real") if any(s["dumps"] == d for s in scores.values())]
    cols = [(d, t, label) for d in dumps for t, label in TOOLS
            if any(t in s for s in scores.values() if s["dumps"] == d)]
    head = "| fault | expected | " + " | ".join(f"{label} on {d}'s dumps" for d, _, label in cols) + " |"
    lines = [head, "|---" * (len(cols) + 2) + "|"]
    faults = sorted({s["fault"] for s in scores.values()}, key=lambda f: (f.split("/")[0], f.endswith("healthy"), f))
    for fault in faults:
        place = cf.place(fault) if fault in cf.FAULTS else None
        want = "nothing" if place is None else \
            f"{place['record'] or 'Module.' + place['module']} s{place['step']} r{place['rank']}"
        cells = []
        for d, t, _ in cols:
            v = scores.get(f"{d}:{fault}", {}).get(t)
            if v is None:
                cells.append("n/a")
            elif place is None:
                cells.append("none" if v["named"] is None else f"**{_fmt(v['named'])}**")
            else:
                cells.append("hit" if v["hit"] else f"miss: {_fmt(v['named'])}")
        lines.append(f"| {fault} | {want} | " + " | ".join(cells) + " |")
    hits, healthy = [], []
    for d, t, _ in cols:
        got = [s[t] for s in scores.values() if s["dumps"] == d and t in s and s["place"]]
        n = sum(bool(v["hit"]) for v in got)
        hits.append(f"**{n}/{len(got)} ({100 * n / len(got):.0f} %)**" if got else "n/a")
        hs = [s[t] for s in scores.values() if s["dumps"] == d and t in s]
        healthy.append(str(sum(bool(v["healthy_step"]) for v in hs)))
    lines.append("| **hits** | | " + " | ".join(hits) + " |")
    lines.append("| **answers on a healthy step** | | " + " | ".join(healthy) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory for the dumps and scores (reused)")
    ap.add_argument("--faults", default=",".join(cf.FAULTS), help="faults of bench/cluster_faults.py (default: all)")
    ap.add_argument("--dumps", default="ours,real", help="whose dumps to score: ours, real or both")
    ap.add_argument("--tools", default=",".join(t for t, _ in TOOLS), help="the tools to score")
    ap.add_argument("--no-real", action="store_true", help="neither the real tool's dumps nor its commands")
    ap.add_argument("--table", action="store_true", help="only print the table of --out/scores.json")
    a = ap.parse_args()
    path = os.path.join(a.out, "scores.json")
    if a.table:
        with open(path, encoding="utf-8") as f:
            print(table(json.load(f)))
        return 0
    dumps, tools = a.dumps.split(","), a.tools.split(",")
    from msprobe.cli import SUBCOMMAND_MODULES

    if "msprobe.cli.overflow_check" not in SUBCOMMAND_MODULES:  # not in this checkout yet
        tools = [t for t in tools if t != "overflow_check"]
    if a.no_real:
        dumps = [d for d in dumps if d != "real"]
        tools = [t for t in tools if not t.startswith("real")]
    scores = bench(a.out, a.faults.split(","), dumps, tools)
    print(table(scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
