"""Fault-localisation benchmark: do the tools name the place where a known fault was injected?

For each model and fault kind of bench/faults.py, a training run with the fault (the target)
and the healthy run (the bench; a healthy 2-rank gloo run for ``rank_wrong``) are dumped, then:

* ``compare``: ``msprobe compare TARGET BENCH``'s first divergence (where the error is
  introduced, summary ``origin``), its first NaN / first Inf (NaN/Inf faults), and the Result
  column's first flagged row (``first_divergence``, 26.2.0's rules) for reference;
* ``lake diverge`` (its ``origin``) and ``lake nan`` (NaN/Inf faults: the target run's first row)
  over a lake holding every run of the model;
* ``run_ut`` (api_wrong: the error list holds the replaced API; healthy runs: no error);
* with ``--real``: 26.2.0's ``compare`` on the injected step (its first row whose Result is not
  pass) and 26.2.0's ``acc_check`` (CPU) on the first forward API records of step 0 of the
  api_wrong run and of a healthy run.

A named record *hits* when it is the injected module's record or one below it in construct.json
(api_wrong: a call of the replaced API), at the injected step and rank.

    python bench/bench_localisation.py --out /tmp/loc [--models gpt,tfm,mlp] [--kinds ...] [--real]

Dumps are kept under ``--out`` and reused; the scores go to ``--out``/scores.json and a table is
printed (docs/benchmarks.md, "Fault localisation").
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

import faults  # noqa: E402

#: API records of step 0 that the real acc_check replays (it takes ~1 s an API on a CPU)
REAL_ACC_RECORDS = 40


def dump_runs(out: str, model: str, kinds: list) -> None:
    """Dump the healthy runs and each fault run of ``model`` under ``out/model`` (kept if present)."""
    need = ["none"] + list(kinds) + (["ddp_none"] if "rank_wrong" in kinds else [])
    for kind in need:
        d = os.path.join(out, model, kind)
        if not os.path.isdir(d):
            world = 2 if kind in ("rank_wrong", "ddp_none") else 1
            faults.run(model, "none" if kind == "ddp_none" else kind, d, world=world)
        if kind in ("none", "api_wrong"):  # run_ut replays the dumped tensors (one step)
            d = os.path.join(out, "tensor", model, kind)
            if not os.path.isdir(d):
                faults.run(model, kind, d, task="tensor")


def _parents(rank_dir: str) -> dict:
    p = os.path.join(rank_dir, "construct.json")
    if not os.path.exists(p):
        return {}
    with open(p, encoding="utf-8") as f:
        doc = json.load(f)
    out: dict = {}
    for k, v in doc.items():  # construct.json may nest a level per kind (26.x) or be flat
        if isinstance(v, dict):
            out.update(v)
        else:
            out[k] = v
    return out


def _rank_dir(run: str, step: int, rank: Optional[int]) -> str:
    return os.path.join(run, f"step{step}", "rank" if rank is None else f"rank{rank}")


def hit(place: dict, record: Optional[str], step: Any, rank: Any, run: str) -> bool:
    """Whether ``record`` at (``step``, ``rank``) of ``run`` is the injected place."""
    if record is None or step != place["step"] or rank != place["rank"]:
        return False
    if place["api"]:
        return record.split(".")[1] == place["api"] if "." in record else False
    parents = _parents(_rank_dir(run, step, rank))
    want = (f"Module.{place['module']}.", f"Module.module.{place['module']}.")  # DDP wraps the model
    seen = 0
    cur: Optional[str] = record
    while cur and seen < 100:
        if cur.startswith(want):
            return True
        cur = parents.get(cur)
        seen += 1
    return False


def _rank_of(rank_dir: str) -> Optional[int]:
    return int(rank_dir[4:]) if rank_dir.startswith("rank") and rank_dir[4:].isdigit() else None


def score_compare(target: str, bench: str, place: dict, work: str) -> dict:
    from msprobe.compare import compare

    s = compare(target, bench, os.path.join(work, "cmp"), plot=False, progress=False)
    o, fd = s["origin"], s["first_divergence"]
    nan = s["first_nan_target"] if place["kind"] == "nan" else s["first_inf_target"]
    extra = {}
    if place["kind"] in ("nan", "inf"):
        extra = {"compare_nan": hit(place, nan and nan["record"], nan and nan["step"],
                                    nan and _rank_of(nan["rank_dir"]), target),
                 "compare_nan_named": nan and f"{nan['row']} step {nan['step']} {nan['rank_dir']}"}
    return {**extra, "compare": hit(place, o and o["record"], o and o["step"], o and _rank_of(o["rank_dir"]),
                           bench if o and o["role"] == "missing in target" else target),
            "compare_named": o and f"{o['record']} {o['argument'] or ''} step {o['step']} {o['rank_dir']}",
            "result_column": hit(place, fd and fd["record"], fd and fd["step"], fd and _rank_of(fd["rank_dir"]),
                                 target),
            "result_named": fd and f"{fd['row']} step {fd['step']} {fd['rank_dir']}"}


def score_lake(model_dir: str, kind: str, bench_run: str, place: dict) -> dict:
    import msprobe.lake

    out: dict = {}
    with msprobe.lake.open(model_dir) as lake:
        res = lake.diverge(kind, bench_run)
        o = res.get("origin")
        run = os.path.join(model_dir, bench_run if o and o["role"] == "missing in target" else kind)
        out["lake_diverge"] = hit(place, o and o["record"], o and o["step"], o and o["rank"], run)
        out["lake_diverge_named"] = o and f"{o['record']} step {o['step']} {o['rank_dir']}"
        if kind in ("nan", "inf"):
            df = lake.first_nan(run=kind)
            df = df.sort_values(["step", "seq"]) if len(df) else df
            r = df.iloc[0] if len(df) else None
            out["lake_nan"] = r is not None and hit(place, r["record"], int(r["step"]), _rank_of(r["rank_dir"]),
                                                    os.path.join(model_dir, kind))
            out["lake_nan_named"] = None if r is None else f"{r['record']} {r['arg_path']} step {r['step']}"
        if kind == "none":
            out["lake_nan_clean"] = lake.first_nan(run="none").empty
    return out


def _run_ut_errors(dump_json: str, work: str) -> list:
    from msprobe.cli import main

    os.makedirs(work, exist_ok=True)
    assert main(["run_ut", "-api_info", dump_json, "-o", work, "--no-progress"]) == 0
    return _checker_errors(work)


def _checker_errors(work: str) -> list:
    res = max(glob.glob(os.path.join(work, "accuracy_checking_result_*.csv")), key=os.path.getmtime)
    with open(res, encoding="utf-8-sig") as f:
        rows = list(csv.DictReader(f))
    return [r["API name"] for r in rows if r["Forward Test Success"] == "error"
            or r.get("Backward Test Success") == "error"]


def _trim(dump_json: str, n: int) -> str:
    """A rank directory beside ``dump_json``'s holding its first ``n`` forward API records (for
    the real acc_check; its tensor files linked): the new dump.json's path."""
    src = os.path.dirname(dump_json)
    dst = os.path.join(os.path.dirname(src), f"first{n}", "rank")
    os.makedirs(dst, exist_ok=True)
    with open(dump_json, encoding="utf-8") as f:
        doc = json.load(f)
    keep = [k for k in doc["data"] if not k.startswith("Module.") and k.endswith(".forward")][:n]
    doc["data"] = {k: doc["data"][k] for k in keep}
    data = os.path.join(dst, "dump_tensor_data")  # copies: the readers refuse links
    os.makedirs(data, exist_ok=True)
    for name in os.listdir(os.path.join(src, "dump_tensor_data")):
        if any(name.startswith(k + ".") for k in keep):
            shutil.copyfile(os.path.join(src, "dump_tensor_data", name), os.path.join(data, name))
    doc["dump_data_dir"] = data
    out = os.path.join(dst, "dump.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    return out


def _real_compare(target_step: str, bench_step: str, work: str, place: dict, run: str) -> dict:
    """26.2.0's compare of one step: its first row whose Result is not pass, by rank."""
    from _realtool import real_tool_python  # type: ignore[import-not-found]

    py = real_tool_python("26.2.0")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    best = None
    for rd in sorted(os.listdir(target_step)):
        o = os.path.join(work, "real_cmp", rd)
        os.makedirs(o, exist_ok=True)
        subprocess.run([py, "-m", "msprobe.msprobe", "compare", "-tp", os.path.join(target_step, rd, "dump.json"),
                        "-gp", os.path.join(bench_step, rd, "dump.json"), "-o", o], env=env, capture_output=True,
                       timeout=900, cwd=o)
        path = max(glob.glob(os.path.join(o, "compare_result_*.csv")), key=os.path.getmtime)
        with open(path, encoding="utf-8-sig") as f:
            for i, row in enumerate(csv.DictReader(f)):
                if row["Result"].lower() not in ("pass", ""):
                    if best is None or i < best[0]:
                        best = (i, row["NPU Name"], rd)
                    break
    if best is None:
        return {"real_compare": False, "real_compare_named": None}
    name = best[1]
    for sep in (".input.", ".output.", ".parameters.", ".parameters_grad"):
        if sep in name:
            name = name[:name.index(sep)]
            break
    return {"real_compare": hit(place, name, place["step"], _rank_of(best[2]), run),
            "real_compare_named": f"{best[1]} step {place['step']} {best[2]}"}


def bench(out: str, models: list, kinds: list, real: bool) -> dict:
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    scores: dict = {}
    path = os.path.join(out, "scores.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            scores = json.load(f)
    for model in models:
        t0 = time.time()
        dump_runs(out, model, kinds)
        mdir = os.path.join(out, model)
        print(f"{model}: dumped in {time.time() - t0:.0f} s", file=sys.stderr)
        for kind in kinds:
            world = 2 if kind == "rank_wrong" else 1
            place = faults.place(model, kind, world)
            bench_run = "ddp_none" if kind == "rank_wrong" else "none"
            target, ref = os.path.join(mdir, kind), os.path.join(mdir, bench_run)
            work = os.path.join(out, "work", model, kind)
            key = f"{model}/{kind}"
            if scores.get(key, {}).get("done") == real:  # scored by an earlier run (resumed)
                continue
            sc = dict(scores.get(key, {}), model=model, kind=kind, place=place)
            sc.update(score_compare(target, ref, place, work))
            sc.update(score_lake(mdir, kind, bench_run, place))
            if kind == "api_wrong":
                errs = _run_ut_errors(os.path.join(out, "tensor", model, kind, "step0", "rank", "dump.json"),
                                      os.path.join(work, "ut"))
                sc["run_ut"] = any(e.split(".")[1] == place["api"] for e in errs)
                sc["run_ut_errors"] = sorted({e.rsplit(".", 1)[0] for e in errs})
            if real:
                step = place["step"]
                sc.update(_real_compare(os.path.join(target, f"step{step}"), os.path.join(ref, f"step{step}"), work,
                                        place, target))
                if kind == "api_wrong":
                    from _realtool import run_real_checker  # type: ignore[import-not-found]

                    trimmed = _trim(os.path.join(out, "tensor", model, kind, "step0", "rank", "dump.json"),
                                    REAL_ACC_RECORDS)
                    run_real_checker("26.2.0", trimmed, os.path.join(work, "real_ut"))
                    errs = _checker_errors(os.path.join(work, "real_ut"))
                    sc["real_acc_check"] = any(e.split(".")[1] == place["api"] for e in errs)
                    sc["real_acc_check_errors"] = sorted({e.rsplit(".", 1)[0] for e in errs})
                    # ours on the same trimmed dump, side by side
                    errs = _run_ut_errors(trimmed, os.path.join(work, "ut_trim"))
                    sc["run_ut_trimmed_errors"] = sorted({e.rsplit(".", 1)[0] for e in errs})
            sc["done"] = real
            scores[key] = sc
            _save(path, scores)
            print(json.dumps({k: sc.get(k) for k in ("model", "kind", "compare", "compare_named", "result_column",
                                                     "lake_diverge", "lake_nan", "run_ut", "real_compare",
                                                     "real_acc_check")}), file=sys.stderr)
        # the healthy run: run_ut's error list and lake nan must be empty
        key = f"{model}/healthy"
        sc = dict(scores.get(key, {}), model=model, kind="healthy")
        errs = _run_ut_errors(os.path.join(out, "tensor", model, "none", "step0", "rank", "dump.json"),
                              os.path.join(out, "work", model, "healthy_ut"))
        sc["run_ut_clean"] = not errs
        sc["run_ut_errors"] = sorted(set(errs))
        import msprobe.lake

        with msprobe.lake.open(mdir) as lake:
            sc["lake_nan_clean"] = lake.first_nan(run="none").empty
        if real:
            from _realtool import run_real_checker  # type: ignore[import-not-found]

            w = os.path.join(out, "work", model, "healthy_real_ut")
            trimmed = _trim(os.path.join(out, "tensor", model, "none", "step0", "rank", "dump.json"),
                            REAL_ACC_RECORDS)
            run_real_checker("26.2.0", trimmed, w)
            sc["real_acc_check_clean_errors"] = sorted(set(_checker_errors(w)))
        scores[key] = sc
        _save(path, scores)
    return scores


def _save(path: str, scores: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(scores, f, indent=1, default=str)


TOOLS = [("compare", "compare (ours: where the error is introduced)"), ("compare_nan", "compare first NaN/Inf"),
         ("lake_diverge", "lake diverge"), ("lake_nan", "lake nan"), ("run_ut", "run_ut"),
         ("result_column", "Result column's first flagged row (26.2.0's rules, ours)"),
         ("real_compare", "26.2.0 compare"), ("real_acc_check", "26.2.0 acc_check")]


def table(scores: dict) -> str:
    """Markdown: hit rate per fault kind and tool."""
    kinds = [k for k in faults.KINDS if any(s.get("kind") == k for s in scores.values())]
    lines = ["| fault | " + " | ".join(t for _, t in TOOLS) + " |", "|---" * (len(TOOLS) + 1) + "|"]
    tot: dict = {}
    for kind in kinds:
        cells = []
        for key, _ in TOOLS:
            got = [s[key] for s in scores.values() if s.get("kind") == kind and s.get(key) is not None]
            if got:
                tot.setdefault(key, []).extend(got)
            cells.append(f"{sum(got)}/{len(got)}" if got else "n/a")
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    lines.append("| **all** | " + " | ".join(
        f"**{sum(tot[k])}/{len(tot[k])} ({100 * sum(tot[k]) / len(tot[k]):.0f} %)**" if tot.get(k) else "n/a"
        for k, _ in TOOLS) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory for the dumps and scores (reused)")
    ap.add_argument("--models", default=",".join(faults.MODELS))
    ap.add_argument("--kinds", default=",".join(faults.KINDS))
    ap.add_argument("--real", action="store_true", help="also 26.2.0's compare and acc_check")
    ap.add_argument("--table", action="store_true", help="only print the table of --out/scores.json")
    a = ap.parse_args()
    if a.table:
        with open(os.path.join(a.out, "scores.json"), encoding="utf-8") as f:
            print(table(json.load(f)))
        return 0
    scores = bench(a.out, a.models.split(","), a.kinds.split(","), a.real)
    print(table(scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
