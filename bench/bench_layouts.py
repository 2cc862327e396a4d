"""Layouts benchmark (issue 47): compare a parallel run with a baseline whose parallelism differs,
on Megatron's own habits; does each tool name the injected (step, record) with the right ranks?

The runs are bench/megatron_layouts.py's (plain PyTorch written the way Megatron writes it, gloo on
127.0.0.1, statistics level mix, 2 steps of 2 micro-batches, zero-initialised biases, loss
scaler, clip_grad_norm and SGD inside the dump window): TP2xPP2 on 4 ranks, DP2xTP2xPP2 on 8
(Megatron's rank order tp-dp-pp, and tp-pp-dp: ``dp_order``), TP2xPP2 with 2 virtual stages a
rank (vpp), TP2xPP2 with Megatron's sequence parallelism (sp: activations between the
tensor-parallel regions split along the sequence, all_gather and reduce_scatter around them,
against a single card of the same sequence length), expert parallel (ep: 4 experts of every
layer, 2 on each of 2 ranks that are also the data-parallel replicas, tokens dispatched and
combined with all_to_all_single, against the single card holding all 4 on the whole batch; its
faults on each expert-parallel rank in turn, in that rank's last local expert of layer 1; ep4: 4
ranks, one expert each; ep_dp: dp=4 with ep=2, two expert-parallel groups holding the same experts,
the faults on the last group's ranks; ep_pp: ep=2 on each of 2 pipeline stages, 4 ranks, the faults
in the last stage's first layer; ep_tp: ep=2 with expert tensor parallel = tp = 2 and sequence
parallelism, 4 ranks, against moe4, the card of sequence 4; ep_tp_pp: the same on 2 pipeline stages, 8
ranks), context parallel (cp: TP2xCP2xPP2; cp2: CP2 alone; dp_cp:
DP2xCP2, two cp groups of 2 ranks each on half of the batch, Megatron's rank order tp-cp-dp-pp;
dp_cp_tp: DP2xCP2xTP2 on 8 ranks;
against a single card with a causal self-attention in each layer, single4a), each against the single-card run (the same
model and weights, the whole global batch on one process), and layout against layout (TP2xPP2 against TP4, PP2 against PP4). Each case is scored healthy and with a fault at step 1 on each pipeline stage
in turn (on the stage's last tensor-parallel rank of the last data-parallel replica): a NaN
written by that rank's ``masked_fill`` and that rank's shard of the stage's first fc1 weight
x1.05.

Columns (each answer read by :func:`read_answer` or :func:`printed_answers`, the places that know
the fields):

* ``compare``: what ``msprobe compare TARGET BENCH -o OUT --layout L [--bench-layout B] --no-plot``
  (the command line, run through its entry point with stdout captured) prints as its answer, read
  from that stdout: the ``first NaN in target:`` line for the NaN faults, the ``error enters at:``
  line for the x1.05 faults (when issue 47 was filed, compare printed this answer as ``first
  divergence:``; issue 50 renamed it), any of those (or ``first +/-Inf in target:``) on a healthy
  pair; its ranks are the ones the line prints (``merged ranks [...]``, ``on rank [...]``: the
  latter when printed);
* ``compare origin``: the same compare's summary.json ``origin`` (and its ``layout`` part);
* ``lake diverge``: ``msprobe lake diverge LAKE target bench --layout L [--bench-layout B]
  --no-cluster --json``: its ``origin``;
* ``lake nan`` (NaN faults and healthy runs; per rank, no merge): ``msprobe lake nan LAKE --run
  target --no-cluster --json``: the row marked ``origin``;
* ``first divergence`` (informational, not a hit column): the ``first divergence:`` line the same
  compare prints, the first row of the Result column (26.2.0's rules, the CSV byte for byte) whose
  Result is not pass, rows that only the 10x rule flags at float round-off passed over. It is
  scored like the others and reported, but 26.2.0's rules flag where an error is amplified, not
  where it enters (a weight 5 % off gives its linear an output 5 % off: no rule fires there).

A **hit**: the injected step; the injected record (merged answers: the logical name of the
injected site, the single-card run's record name of the same site, read from the sidecars;
the x1.05 fault's fc1 module record counts too; ``lake nan``: the rank's own record name); and a
rank set that holds the injected rank and no rank outside its pipeline stage (the ranks an answer
names: ``suspect_ranks`` when there are, else ``ranks``, from the answer or the summary's
``layout`` section; a merged answer naming no rank is a miss). On a healthy pair any answer is a
false answer. A case that raises is scored ``error`` (a miss).

    python bench/bench_layouts.py --out /tmp/layouts [--cases tp2pp2,dp,dp_order,vpp,tp4,pp4,sp,ep,ep4,ep_dp,ep_pp,ep_tp,ep_tp_pp,cp,cp2,dp_cp,dp_cp_tp] [--table]

Dumps and sidecars are kept under ``--out`` and reused; scores go to ``--out/scores.json``.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import sys
import time
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

import megatron_layouts as ml  # noqa: E402

#: run name -> the layout of bench/megatron_layouts.py it is trained with
RUNS: dict = {
    "single": {},
    "tp2pp2": {"tp": 2, "pp": 2},
    "dp2tp2pp2": {"tp": 2, "pp": 2, "dp": 2},
    "dp2tp2pp2.pp-dp": {"tp": 2, "pp": 2, "dp": 2, "order": "tp-pp-dp"},
    "tp2pp2vpp2": {"tp": 2, "pp": 2, "vpp": 2},
    "tp4": {"tp": 4},
    "pp2": {"pp": 2},
    "pp4": {"pp": 4},
    "single4": {"seq": 4},  # a sequence that splits over 2 tensor-parallel ranks
    "tp2pp2sp": {"tp": 2, "pp": 2, "sp": True, "seq": 4},
    "moe": {"experts": 4},  # the single card holding all 4 experts of every (MoE) layer
    "ep2": {"dp": 2, "ep": 2, "experts": 4},  # 2 experts a rank, each rank its half of the batch
    "ep4": {"dp": 4, "ep": 4, "experts": 4},  # 1 expert a rank, each rank a quarter of the batch
    "dp4ep2": {"dp": 4, "ep": 2, "experts": 4},  # 2 groups of ep=2 (expert data parallel 2), a quarter each
    "ep2pp2": {"dp": 2, "ep": 2, "pp": 2, "experts": 4},  # expert parallel 2 on each of 2 pipeline stages
    "moe4": {"experts": 4, "seq": 4},  # the single card holding every expert, sequence 4 (splits over 2 tp ranks)
    "ep2tp2": {"dp": 2, "ep": 2, "tp": 2, "sp": True, "seq": 4, "experts": 4},  # expert tensor parallel 2 (= tp)
    "ep2tp2pp2": {"dp": 2, "ep": 2, "tp": 2, "pp": 2, "sp": True, "seq": 4, "experts": 4},  # and 2 stages, 8 ranks
    "single4a": {"seq": 4, "attn": True},  # with a causal self-attention in each layer
    "tp2cp2pp2": {"tp": 2, "cp": 2, "pp": 2, "seq": 4, "attn": True},  # context parallel (TE's all-gather CP)
    "cp2": {"cp": 2, "seq": 4, "attn": True},  # context parallel alone (the tests' small version)
    "dp2cp2": {"cp": 2, "dp": 2, "seq": 4, "attn": True},  # data-parallel replicas of context-parallel ranks
    "dp2cp2tp2": {"tp": 2, "cp": 2, "dp": 2, "seq": 4, "attn": True},  # the same with tensor parallel, 8 ranks
}

#: case group -> (target run, bench run, --layout, --bench-layout)
GROUPS: dict = {
    "tp2pp2": ("tp2pp2", "single", "tp=2,pp=2", None),
    "dp": ("dp2tp2pp2", "single", "tp=2,pp=2,dp=2", None),
    "dp_order": ("dp2tp2pp2.pp-dp", "single", "tp=2,pp=2,dp=2,order=tp-cp-ep-pp-dp", None),
    "vpp": ("tp2pp2vpp2", "single", "tp=2,pp=2,vpp=2", None),
    "tp4": ("tp2pp2", "tp4", "tp=2,pp=2", "tp=4,pp=1"),
    "pp4": ("pp2", "pp4", "tp=1,pp=2", "tp=1,pp=4"),
    "sp": ("tp2pp2sp", "single4", "tp=2,pp=2", None),
    "ep": ("ep2", "moe", "ep=2", None),
    "ep4": ("ep4", "moe", "ep=4", None),
    "ep_dp": ("dp4ep2", "moe", "ep=2,dp=2", None),
    "ep_pp": ("ep2pp2", "moe", "tp=1,pp=2,ep=2", None),
    "ep_tp": ("ep2tp2", "moe4", "tp=2,pp=1,ep=2", None),
    "ep_tp_pp": ("ep2tp2pp2", "moe4", "tp=2,pp=2,ep=2", None),
    "cp": ("tp2cp2pp2", "single4a", "tp=2,pp=2,cp=2", None),
    "cp2": ("cp2", "single4a", "tp=1,pp=1,cp=2", None),
    "dp_cp": ("dp2cp2", "single4a", "tp=1,pp=1,cp=2,dp=2", None),
    "dp_cp_tp": ("dp2cp2tp2", "single4a", "tp=2,pp=1,cp=2,dp=2", None),
}

#: the MoE layer a fault of an expert-parallel run is injected in
EP_FAULT_LAYER = 1


def single_of(group: str) -> str:
    """The single-card run a group's runs compute the model of (its bench when that is one card)."""
    bench_run = GROUPS[group][1]
    spec = RUNS[bench_run]
    return bench_run if spec.get("tp", 1) * spec.get("pp", 1) * spec.get("dp", 1) * spec.get("cp", 1) == 1 else "single"

TOOLS = [("compare", "compare, printed (first NaN; x1.05: error enters at)"),
         ("compare_origin", "compare origin (summary.json)"), ("lake_diverge", "lake diverge (origin)"),
         ("lake_nan", "lake nan"), ("first_divergence", "first divergence (Result column, 26.2.0 rules; informational)")]
#: columns reported but not counted in the hit rate
INFORMATIONAL = ("first_divergence",)
FAULT_STEP = 1
KINDS = ("nan", "scale")
#: options of every run (--level, --optimizer): bench/megatron_layouts.py's launch() keywords
OPTIONS: dict = {}


# -- the runs ---------------------------------------------------------------------------------------

def fault_of(run: str, kind: str, stage: int) -> dict:
    """The fault of ``kind`` on pipeline stage ``stage`` of ``run`` (an expert-parallel run: on
    expert-parallel rank ``stage``, in its last local expert): its rank and layer."""
    spec = RUNS[run]
    sizes = {"tp": spec.get("tp", 1), "cp": spec.get("cp", 1), "pp": spec.get("pp", 1), "dp": spec.get("dp", 1)}
    order = ml.parse_order(spec.get("order", "tp-dp-pp"))
    if spec.get("ep", 1) > 1:  # (on the last expert-parallel group of the data-parallel ranks; with a pipeline,
        # in the last stage's first layer; the last tensor-parallel rank)
        local, last = spec["experts"] // spec["ep"], sizes["pp"] - 1
        rank = ml.rank_of({"tp": sizes["tp"] - 1, "dp": spec["dp"] - spec["ep"] + stage, "pp": last}, sizes, order)
        layer = ml.chunk_layers(last, 0, sizes["pp"], 1)[0] if last else EP_FAULT_LAYER
        return {"fault": kind, "fault_step": FAULT_STEP, "fault_rank": rank, "fault_layer": layer, "fault_mb": 0,
                "fault_expert": stage * local + local - 1}
    return {"fault": kind, "fault_step": FAULT_STEP, "fault_rank": ml.fault_rank(sizes, order, stage),
            "fault_layer": ml.chunk_layers(stage, 0, sizes["pp"], spec.get("vpp", 1))[0], "fault_mb": 0}


def variants(run: str) -> list:
    """[(variant name, fault kwargs or None)]: healthy, then each kind on each stage."""
    out: list = [("healthy", None)]
    ep = RUNS[run].get("ep", 1)
    for kind in KINDS:
        for stage in range(ep if ep > 1 else RUNS[run].get("pp", 1)):
            out.append((f"{kind}_{'r' if ep > 1 else 's'}{stage}", fault_of(run, kind, stage)))
    return out


def dump_run(out: str, run: str, variant: str, fault: Optional[dict], log: Any = None) -> list:
    """Dump ``run``'s ``variant`` (kept when its sidecars are all there); returns the sidecars."""
    name = run if variant == "healthy" else f"{run}.{variant}"
    dump, truth = os.path.join(out, "runs", name), os.path.join(out, "truth", name)
    world = RUNS[run].get("tp", 1) * RUNS[run].get("pp", 1) * RUNS[run].get("dp", 1) * RUNS[run].get("cp", 1)
    if os.path.isdir(truth) and len(os.listdir(truth)) == world:
        return ml.read_truth(truth)
    for path in (dump, truth):
        shutil.rmtree(path, ignore_errors=True)
    t0 = time.time()
    sidecars = ml.launch(dump, truth, **RUNS[run], **OPTIONS, **(fault or {}))
    if log:
        log(f"dumped {name} ({world} ranks) in {time.time() - t0:.0f} s")
    return sidecars


def run_dir(out: str, run: str, variant: str) -> str:
    return os.path.join(out, "runs", run if variant == "healthy" else f"{run}.{variant}")


def losses(sidecars: list) -> list:
    """The loss of each step: the mean over the replicas of the last stage's (tp rank 0)."""
    per = [s["losses"] for s in sidecars if s["last_stage"] and s["coords"]["tp"] == 0]
    return [sum(p[i] for p in per) / len(per) for i in range(len(per[0]))]


def loss_gap(sidecars: list, single: list, upto: Optional[int] = None) -> float:
    """The largest relative difference of the losses from the single card's (steps before ``upto``)."""
    mine, ref = losses(sidecars), losses(single)
    steps = range(len(ref) if upto is None else upto)
    return max((abs(mine[i] - ref[i]) / abs(ref[i]) for i in steps), default=0.0)


# -- the truth --------------------------------------------------------------------------------------

def injected(sidecars: list) -> dict:
    (found,) = [s["injected"] for s in sidecars if s["injected"]]
    return found


def truth(sidecars: list, single: list, run_path: Optional[str] = None) -> dict:
    """What a hit names: {step, rank, stage ranks, logical names (the single card's names of the
    injected site and of its module record), local names (the rank's own)}."""
    inj = injected(sidecars)
    me = sidecars[inj["rank"]]
    sizes, order = me["sizes"], tuple(me["order"])
    stage = ml.stage_ranks(sizes, order, me["coords"]["pp"], me["coords"]["dp"], me["coords"].get("cp", 0))
    sites = single[0]["sites"][str(inj["step"])]
    logical = [sites[inj["site"]]] + ([sites[inj["site"] + ".module"]] if inj["kind"] == "scale" else [])
    return {"kind": inj["kind"], "step": inj["step"], "rank": inj["rank"], "stage_ranks": stage,
            "logical": logical, "local": [inj["record"]] + list(inj["also"]), "site": inj["site"],
            "stage_renamed": _stage_renamed(run_path, sidecars, inj) if run_path else None}


def _stage_renamed(run_path: str, sidecars: list, inj: dict) -> Optional[str]:
    """The name today's stage-by-stage renaming (msprobe.format.parallel.stage_renames over the
    first rank of each stage of the replica) gives the injected record: a diagnosis of misses whose
    record is that name and not the single card's (None with virtual stages)."""
    from msprobe.format.comm import comm_api
    from msprobe.format.parallel import stage_renames

    me = sidecars[inj["rank"]]
    if me["vpp"] != 1:
        return None
    sizes, order = me["sizes"], tuple(me["order"])
    names = []
    for p in range(sizes["pp"]):
        first = ml.stage_ranks(sizes, order, p, me["coords"]["dp"], me["coords"].get("cp", 0))[0]
        with open(os.path.join(run_path, f"step{inj['step']}", f"rank{first}", "dump.json"), encoding="utf-8") as f:
            names.append([name for name in json.load(f)["data"] if comm_api(name) is None])
    return stage_renames(names)[me["coords"]["pp"]].get(inj["record"])


def check_dump(run_path: str, sidecars: list) -> None:
    """The injected record the sidecar names is in the rank's dump (the instrument's own check)."""
    inj = injected(sidecars)
    me = sidecars[inj["rank"]]
    rank_dir = "rank" if me["world"] == 1 else f"rank{inj['rank']}"
    with open(os.path.join(run_path, f"step{inj['step']}", rank_dir, "dump.json"), encoding="utf-8") as f:
        data = json.load(f)["data"]
    missing = [name for name in [inj["record"]] if name not in data]  # (the module record: level mix only)
    if missing:
        raise RuntimeError(f"{run_path}: the sidecar's records {missing} are not in rank {inj['rank']}'s dump")


# -- reading the answers (the one place that knows the fields) ---------------------------------------

_ARG = re.compile(r"\.(input|output|parameters|parameters_grad|input_args|input_kwargs)(\.|$)")


def _record(name: Any) -> Optional[str]:
    if not name:
        return None
    name = str(name)
    found = _ARG.search(name)
    return name[:found.start()] if found else name


def _rank_dir_rank(rank_dir: Any) -> Optional[int]:
    text = str(rank_dir or "")
    digits = text[4:] if text.startswith("rank") else ""
    return int(digits) if digits.isdigit() else (0 if text == "rank" else None)


def read_answer(entry: Optional[dict], layout_part: Optional[dict] = None) -> Optional[dict]:
    """{record, step, ranks, rank_dir, why} of one answer: ``entry`` (compare's summary entry, lake
    diverge's origin, a lake nan row) and, for a merged answer, the summary's ``layout`` part of
    it. Ranks: ``suspect_ranks`` when any (the answer's own, else the layout part's), else
    ``ranks``; an unmerged rank directory (``rank3``) names its rank; a merged answer without
    them names none (its ``rank`` field, 0, is no rank of a merged model)."""
    if not entry:
        return None
    sources = [entry] + ([layout_part] if layout_part else []) + (
        [entry["layout"]] if isinstance(entry.get("layout"), dict) else [])
    ranks: list = []
    why = "no rank named"
    for key in ("suspect_ranks", "ranks"):
        for source in sources:
            if source.get(key):
                ranks, why = sorted(int(r) for r in source[key]), key
                break
        if ranks:
            break
    rank_dir = entry.get("rank_dir")
    if not ranks and _rank_dir_rank(rank_dir) is not None:
        ranks, why = [_rank_dir_rank(rank_dir)], "rank_dir"
    record = _record(entry.get("record") or entry.get("row"))
    step = entry.get("step")
    return {"record": record, "step": None if step is None else int(step), "ranks": ranks,
            "rank_dir": rank_dir, "why": why}


def compare_answers(summary: dict, kind: Optional[str] = None) -> dict:
    """{compare, compare_origin} from compare's summary (summary.json): ``compare`` the summary
    fields compare's printed answer for ``kind`` comes from (NaN: ``first_nan_target``; x1.05:
    ``origin``, printed ``error enters at:``; healthy: any of them), ``compare_origin`` its
    ``origin``. The benchmark reads ``compare`` from the printed lines (:func:`compare_printed`)."""
    layout = summary.get("layout") or {}
    origin = read_answer(summary.get("origin"), layout.get("origin"))
    nan = read_answer(summary.get("first_nan_target"), layout.get("first_nan_target"))
    inf = read_answer(summary.get("first_inf_target"), layout.get("first_inf_target"))
    if kind is None:
        main = next((a for a in (nan, inf, origin) if a), None)
    else:
        main = nan if kind == "nan" else origin
    return {"compare": main, "compare_origin": origin}


_RANKS = re.compile(r"(?<!on )ranks \[([\d, ]*)\]")
_SUSPECTS = re.compile(r"on rank \[([\d, ]*)\]")


def _printed_place(step: str, place: str, record: Optional[str]) -> dict:
    """An answer dict (as :func:`read_answer`'s) of one printed answer: its step, its place
    (``rank3``; ``merged ranks [2, 3], on rank [3]``; ``merged``) and its record."""
    ranks, why = [], "no rank named"
    for pattern, key in ((_SUSPECTS, "suspect_ranks"), (_RANKS, "ranks")):
        found = pattern.search(place)
        if found and found.group(1).strip():
            ranks, why = sorted(int(r) for r in found.group(1).split(",")), key
            break
    rank_dir = place.split(" ", 1)[0].rstrip(",")
    if not ranks and _rank_dir_rank(rank_dir) is not None:
        ranks, why = [_rank_dir_rank(rank_dir)], "rank_dir"
    return {"record": _record(record), "step": int(step) if step.isdigit() else None, "ranks": ranks,
            "rank_dir": rank_dir, "why": why}


_ENTERS = re.compile(r"^error enters at: (?P<what>.*); step (?P<step>\S+), (?P<place>.*), record #\d+$")
_NONFINITE = re.compile(r"^(?P<row>\S+) \(step (?P<step>\S+), (?P<place>.*)\)$")
_FIRST = re.compile(r"^first divergence: (?P<row>\S+) \(step (?P<step>\S+), (?P<place>.*), record #\d+, .*\)$")


def printed_answers(stdout: str) -> dict:
    """{error_enters, first_nan, first_inf, first_divergence} of compare's printed summary: each an
    answer dict or None (``none``, or the line not printed)."""
    got: dict = {"error_enters": None, "first_nan": None, "first_inf": None, "first_divergence": None}
    for line in stdout.splitlines():
        enters = _ENTERS.match(line)
        if enters:
            got["error_enters"] = _printed_place(enters["step"], enters["place"], enters["what"].split(" ", 1)[0])
        first = _FIRST.match(line)
        if first:
            got["first_divergence"] = _printed_place(first["step"], first["place"], first["row"])
        if line.startswith("first NaN in target: "):
            for part, key in zip(line.split("; "), ("first_nan", "first_inf")):
                text = part.split(": ", 1)[1] if ": " in part else ""
                found = _NONFINITE.match(text)
                if found:
                    got[key] = _printed_place(found["step"], found["place"], found["row"])
    return got


def compare_printed(stdout: str, kind: Optional[str]) -> dict:
    """{compare, first_divergence} from compare's stdout: the answer it prints for ``kind`` (NaN:
    the first NaN line; x1.05: where the error enters; healthy: any of them) and its
    ``first divergence:`` line."""
    printed = printed_answers(stdout)
    if kind is None:
        main = next((printed[key] for key in ("first_nan", "first_inf", "error_enters") if printed[key]), None)
    else:
        main = printed["first_nan"] if kind == "nan" else printed["error_enters"]
    return {"compare": main, "first_divergence": printed["first_divergence"]}


def lake_diverge_answer(answer: dict) -> Optional[dict]:
    origin = answer.get("origin")
    return read_answer(origin, origin.get("layout") if origin else None)


def lake_nan_answer(rows: list, run: str) -> Optional[dict]:
    mine = [row for row in rows if row.get("run") == run]
    first = next((row for row in mine if row.get("origin")), mine[0] if mine else None)
    return read_answer(first) if first else None


# -- the tools --------------------------------------------------------------------------------------

def _cli_text(args: list) -> str:
    """``msprobe ARGS`` through the command line's entry point in this process; its stdout."""
    from msprobe.cli import main

    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        code = main(args)
    if code not in (0, None):
        said = [line for line in err.getvalue().splitlines() if line.strip()]
        raise RuntimeError(f"msprobe {' '.join(args[:2])} exited {code}: {said[-1] if said else ''}")
    return buf.getvalue()


def _cli(args: list) -> Any:
    """``msprobe ARGS`` in this process; its stdout parsed as JSON."""
    return json.loads(_cli_text(args))


def score_case(out: str, group: str, variant: str, kind: Optional[str], tools: list) -> dict:
    """The answers of ``tools`` on one case; each an answer dict, None, or {"error": text}."""
    target_run, bench_run, layout, bench_layout = GROUPS[group]
    target = run_dir(out, target_run, variant)
    bench = run_dir(out, bench_run, "healthy")
    work = os.path.join(out, "work", group, variant)
    shutil.rmtree(work, ignore_errors=True)
    got: dict = {}
    if {"compare", "compare_origin", "first_divergence"} & set(tools):
        cmp_out = os.path.join(work, "cmp")
        args = ["compare", target, bench, "-o", cmp_out, "--layout", layout, "--no-plot", "--no-progress"]
        if bench_layout:
            args += ["--bench-layout", bench_layout]
        try:
            stdout = _cli_text(args)
            os.makedirs(work, exist_ok=True)
            with open(os.path.join(work, "compare.stdout"), "w", encoding="utf-8") as f:
                f.write(stdout)
            got["compare_origin"] = compare_answers(_load(os.path.join(cmp_out, "summary.json")), kind)["compare_origin"]
            got.update(compare_printed(stdout, kind))
        except Exception as exc:  # a refused layout is a miss, said
            got.update({tool: {"error": _short(exc)} for tool in ("compare", "compare_origin", "first_divergence")})
    lake = os.path.join(work, "lake")
    if "lake_diverge" in tools or "lake_nan" in tools:
        os.makedirs(lake, exist_ok=True)
        for name, path in (("target", target), ("bench", bench)):
            shutil.copytree(path, os.path.join(lake, name))
    if "lake_diverge" in tools:
        args = ["lake", "diverge", lake, "target", "bench", "--layout", layout, "--no-cluster", "--json"]
        if bench_layout:
            args += ["--bench-layout", bench_layout]
        try:
            got["lake_diverge"] = lake_diverge_answer(_cli(args))
        except Exception as exc:
            got["lake_diverge"] = {"error": _short(exc)}
    if "lake_nan" in tools and kind != "scale":
        try:
            got["lake_nan"] = lake_nan_answer(_cli(["lake", "nan", lake, "--run", "target", "--no-cluster",
                                                    "--json"]), "target")
        except Exception as exc:
            got["lake_nan"] = {"error": _short(exc)}
    return got


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"


def verdict(want: Optional[dict], ans: Optional[dict], tool: str) -> dict:
    """{named, hit, false_answer, why} of one answer against the truth (None: a healthy case)."""
    if ans is not None and "error" in ans:
        return {"named": ans, "hit": False, "false_answer": False, "why": "error"}
    if want is None:
        return {"named": ans, "hit": None, "false_answer": ans is not None,
                "why": "" if ans is None else "an answer on a healthy pair"}
    if ans is None:
        return {"named": None, "hit": False, "false_answer": False, "why": "no answer"}
    names = want["local"] if tool == "lake_nan" else want["logical"]
    problems = []
    if ans["step"] != want["step"]:
        problems.append(f"step {ans['step']}")
    if ans["record"] not in names:
        problems.append("record" + (" (today's stage-by-stage name)" if tool != "lake_nan" and
                                    ans["record"] == want.get("stage_renamed") else ""))
    if want["rank"] not in ans["ranks"]:
        problems.append("ranks " + (ans["why"] if not ans["ranks"] else f"{ans['ranks']} lack {want['rank']}"))
    elif not set(ans["ranks"]) <= set(want["stage_ranks"]):
        problems.append(f"ranks {ans['ranks']} outside stage {want['stage_ranks']}")
    return {"named": ans, "hit": not problems, "false_answer": ans["step"] != want["step"], "why": ", ".join(problems)}


# -- the benchmark ----------------------------------------------------------------------------------

def bench(out: str, groups: list, tools: list, log: Any = None) -> dict:
    path = os.path.join(out, "scores.json")
    scores: dict = _load(path) if os.path.exists(path) else {}
    kept = os.path.join(out, "options.json")
    if os.path.exists(kept) and _load(kept) != OPTIONS:
        raise SystemExit(f"{out} holds runs dumped with {_load(kept)}, not {OPTIONS}: give another --out")
    os.makedirs(out, exist_ok=True)
    _save(kept, OPTIONS)
    checks = scores.setdefault("_checks", {})
    for group in groups:
        target_run, bench_run, _, _ = GROUPS[group]
        single = dump_run(out, single_of(group), "healthy", None, log)
        bench_sidecars = dump_run(out, bench_run, "healthy", None, log)
        checks[f"loss gap {bench_run} vs single"] = loss_gap(bench_sidecars, single)
        for variant, fault in variants(target_run):
            sidecars = dump_run(out, target_run, variant, fault, log)
            checks[f"loss gap {target_run}.{variant} vs single"] = loss_gap(
                sidecars, single, None if fault is None else FAULT_STEP)
            want = None
            if fault is not None:
                check_dump(run_dir(out, target_run, variant), sidecars)
                want = truth(sidecars, single, run_dir(out, target_run, variant))
            t0 = time.time()
            got = score_case(out, group, variant, want and want["kind"], tools)
            entry = {"group": group, "variant": variant, "want": want}
            for tool, ans in got.items():
                entry[tool] = verdict(want, ans, tool)
            scores[f"{group}:{variant}"] = entry
            _save(path, scores)
            if log:
                log(f"{group}:{variant} ({time.time() - t0:.0f} s): " + ", ".join(
                    f"{t}={'hit' if v['hit'] else cell(v)}" for t, v in entry.items() if isinstance(v, dict) and
                    "named" in v))
    return scores


def _load(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _save(path: str, scores: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(scores, f, indent=1, default=str)


def _fmt(ans: Optional[dict]) -> str:
    if not ans:
        return "-"
    if "error" in ans:
        return f"error: {ans['error']}"
    return f"{ans['record']} s{ans['step']} r{ans['ranks'] or '?'}"


def cell(v: dict) -> str:
    if v["why"] == "error":
        return _fmt(v["named"])
    if v["hit"] is None:
        return "none" if v["named"] is None else f"**{_fmt(v['named'])}**"
    if v["hit"]:
        return "hit"
    return f"miss ({v['why']}): {_fmt(v['named'])}"


def table(scores: dict) -> str:
    cases = [s for k, s in scores.items() if not k.startswith("_")]
    cols = [(t, label) for t, label in TOOLS if any(t in s for s in cases)]
    lines = ["| case | expected | " + " | ".join(label for _, label in cols) + " |", "|---" * (len(cols) + 2) + "|"]
    for s in cases:
        want = s["want"]
        expected = "nothing" if want is None else \
            f"{want['logical'][0]} s{want['step']} r{want['rank']} (stage {want['stage_ranks']}; local {want['local'][0]})"
        cells = [cell(s[t]) if t in s else "n/a" for t, _ in cols]
        lines.append(f"| {s['group']}:{s['variant']} | {expected} | " + " | ".join(cells) + " |")
    hits, falses, elsewhere, errors = [], [], [], []
    for t, _ in cols:
        faulted = [s[t] for s in cases if t in s and s["want"] is not None]
        n = sum(bool(v["hit"]) for v in faulted)
        if not faulted:
            hits.append("n/a")
        elif t in INFORMATIONAL:
            hits.append(f"{n}/{len(faulted)} (not counted)")
        else:
            hits.append(f"**{n}/{len(faulted)} ({100 * n / len(faulted):.0f} %)**")
        healthy = [s[t] for s in cases if t in s and s["want"] is None]
        falses.append(f"{sum(bool(v['false_answer']) for v in healthy)}/{len(healthy)}")
        elsewhere.append(f"{sum(bool(v['false_answer']) for v in faulted)}/{len(faulted)}")
        errors.append(str(sum(v["why"] == "error" for v in (s[t] for s in cases if t in s))))
    lines.append("| **hits** | | " + " | ".join(hits) + " |")
    lines.append("| **healthy pairs with an answer** | | " + " | ".join(falses) + " |")
    lines.append("| **faulted runs answered at another step** | | " + " | ".join(elsewhere) + " |")
    lines.append("| **errors** | | " + " | ".join(errors) + " |")
    checks = scores.get("_checks") or {}
    if checks:
        worst = max(checks.values())
        lines.append("")
        lines.append(f"losses of every run against the single card's (healthy steps): largest relative gap {worst:.1e}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory for the dumps, sidecars and scores (reused)")
    ap.add_argument("--cases", default=",".join(GROUPS), help=f"case groups ({', '.join(GROUPS)})")
    ap.add_argument("--tools", default=",".join(t for t, _ in TOOLS), help="the tools to score")
    ap.add_argument("--level", default="mix", help="the dump level of every run (a new --out for another)")
    ap.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"], help="the runs' optimizer")
    ap.add_argument("--table", action="store_true", help="only print the table of --out/scores.json")
    a = ap.parse_args()
    OPTIONS.update(level=a.level, optimizer=a.optimizer)
    groups = a.cases.split(",")
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        raise SystemExit(f"unknown case groups {unknown}; known: {', '.join(GROUPS)}")
    if a.table:  # the scores kept, as they are
        print(table(_load(os.path.join(a.out, "scores.json"))))
        return 0
    scores = bench(a.out, groups, a.tools.split(","), log=lambda text: print(text, file=sys.stderr, flush=True))
    print(table(scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
