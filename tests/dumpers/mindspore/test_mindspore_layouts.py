"""MindSpore runs through the layout merge (issue 47 item 4; spec/FORMAT.md section 26): a run written with
Megatron's habits (ms_layouts_cluster.py: column-parallel linear -> masked_fill -> gelu -> row-parallel
linear with ``all_reduce``, zero biases, a replicated head, ``value_and_grad`` and SGD inside the dump
window, 2 steps) on a 2-worker MindSpore CPU cluster (mccl, the real CPU wheel in the venv of ms_venv.py),
tensor parallel TP=2, its collectives from ``mint.distributed`` (``MintDistributed.*``) and from
``ops.communication`` (``Communication.*``), against the same model with the same weights on one process.

The runs compute the single card's model (losses, parameters after SGD); the healthy pair gets no answer
from compare (``--layout tp=2`` and ``--layout auto``) or ``lake diverge``; a NaN written by rank 1's
``Tensor.masked_fill`` at step 1 and rank 1's fc1 weight shard x1.05 from step 1 are named (record, step
1, rank 1) by compare's origin (and first NaN), ``lake diverge`` and ``lake nan``. ``--layout auto`` reads
``tp=2`` from the dump: MindSpore's collectives called without a group take the default group (every
rank), which no record names. One cluster launch and one single process (about 30 s to 90 s on the
2-core machine, most of it MindSpore's start)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "bench"))
from ms_common import run_cluster  # noqa: E402
from ms_venv import require_venv  # noqa: E402

pytest.importorskip("duckdb")
pytest.importorskip("pyarrow")

import bench_layouts as B  # noqa: E402

SCRIPT = os.path.join(HERE, "ms_layouts_cluster.py")
COMMS = {"mint": "MintDistributed", "ops": "Communication"}
RUNS = {comm: ("healthy", "nan", "scale") for comm in COMMS}
#: the injected records (the rank's own names, which are the single card's too)
WANT = {"nan": "Tensor.masked_fill.0.forward", "scale": "MintFunctional.linear.0.forward"}
FAULT = {"step": 1, "rank": 1}
LAYOUTS = ("tp=2", "auto")


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    py = require_venv()
    out = str(tmp_path_factory.mktemp("ms_layouts"))
    env = dict(os.environ, PYTHONPATH=ROOT, GLOG_v="3")
    single = subprocess.Popen([py, SCRIPT, os.path.join(out, "single"), "--single", "--runs", "healthy"], env=env,
                              cwd=out, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    torch_single = subprocess.Popen([sys.executable, os.path.join(HERE, "pt_layouts_single.py"), os.path.join(out, "pt")],
                                    env=env, cwd=out, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        run_cluster(py, SCRIPT, [os.path.join(out, "tp2"), "--tp", "2", "--comm", ",".join(COMMS),
                                 "--runs", ",".join(RUNS["mint"])], out, timeout=400)
        logs = [proc.communicate(timeout=400)[0] for proc in (single, torch_single)]
    finally:
        for proc in (single, torch_single):
            if proc.poll() is None:
                proc.kill()
    assert single.returncode == 0 and torch_single.returncode == 0, [log[-3000:] for log in logs]
    return out


def _side(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _target(dumps: str, comm: str, run: str) -> str:
    return os.path.join(dumps, "tp2", comm, run)


@pytest.mark.parametrize("comm", list(COMMS))
def test_the_runs_compute_the_single_card_model(dumps, comm):
    """The instrument: losses equal the single card's (before the fault's step), and the parameters SGD
    left after the last step: a sharded parameter's shards sum (of absolute values) to the single card's,
    a replicated one equals it on both ranks."""
    single = _side(os.path.join(dumps, "single", "healthy.rank0.json"))
    for run in RUNS[comm]:
        ranks = [_side(_target(dumps, comm, run) + f".rank{r}.json") for r in (0, 1)]
        upto = 2 if run == "healthy" else FAULT["step"]
        for side in ranks:
            for got, ref in zip(side["losses"][:upto], single["losses"][:upto]):
                assert abs(got - ref) <= 1e-5 * abs(ref), (run, side["rank"], side["losses"], single["losses"])
        if run != "healthy":
            continue
        for name, ref in single["params"].items():
            got = [side["params"][name] for side in ranks]
            whole = sum(got) if "fc1" in name or "fc2.weight" in name else got[0]
            assert abs(whole - ref) <= 1e-4 * ref, (name, got, ref)
            if not ("fc1" in name or "fc2.weight" in name):
                assert got[0] == got[1], (name, got)


@pytest.mark.parametrize("comm", list(COMMS))
def test_the_collectives_are_recorded_under_the_namespace(dumps, comm):
    with open(os.path.join(_target(dumps, comm, "healthy"), "step0", "rank1", "dump.json"), encoding="utf-8") as f:
        data = json.load(f)["data"]
    reduces = [n for n in data if ".all_reduce." in n]
    # two forward row-parallel reductions, one backward column-parallel one (layer 1's input gradient)
    assert reduces == [f"{COMMS[comm]}.all_reduce.{k}.forward" for k in range(3)], reduces
    for name in reduces:  # mint: the default group (no group given); ops: a group named, its members beside
        group = data[name]["input_kwargs"].get("group")
        if comm == "mint":
            assert group is None, group
        else:
            assert group["type"] == "str" and group["value"].startswith("mccl_2_") and group["group_ranks"] == [0, 1], \
                group


def _compare(dumps: str, comm: str, run: str, layout: str) -> tuple:
    from msprobe.compare import compare

    work = os.path.join(dumps, "work", comm, run, layout)
    summary = compare(_target(dumps, comm, run), os.path.join(dumps, "single", "healthy"), os.path.join(work, "cmp"),
                      layout=layout, plot=False, progress=False)
    return summary, B.compare_answers(summary, None if run == "healthy" else run)


def _lake(dumps: str, comm: str, run: str, layout: str) -> dict:
    import shutil

    lake = os.path.join(dumps, "work", comm, run, layout, "lake")
    shutil.rmtree(lake, ignore_errors=True)
    shutil.copytree(_target(dumps, comm, run), os.path.join(lake, "target"))
    shutil.copytree(os.path.join(dumps, "single", "healthy"), os.path.join(lake, "bench"))
    got = {"lake_diverge": B.lake_diverge_answer(B._cli(["lake", "diverge", lake, "target", "bench", "--layout", layout,
                                                          "--no-cluster", "--json"]))}
    if run == "nan":
        got["lake_nan"] = B.lake_nan_answer(B._cli(["lake", "nan", lake, "--run", "target", "--no-cluster", "--json"]),
                                            "target")
    return got


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("comm", list(COMMS))
def test_the_healthy_pair_gets_no_answer(dumps, comm, layout):
    summary, answers = _compare(dumps, comm, "healthy", layout)
    assert summary["layout"]["models"], summary.get("layout")
    said = {m["layout"] for m in summary["layout"]["models"] if m["side"] == "target"}
    assert said == ({"tp=2,pp=1 (read from the dump)"} if layout == "auto" else {"tp=2,pp=1"}), said
    answers.update(_lake(dumps, comm, "healthy", layout))
    assert answers == {"compare": None, "compare_origin": None, "lake_diverge": None}, answers


CASES = [(comm, run, layout) for comm, runs in RUNS.items() for run in runs if run != "healthy" for layout in LAYOUTS]


@pytest.mark.parametrize("comm,run,layout", CASES, ids=[f"{c}-{r}-{lay}" for c, r, lay in CASES])
def test_the_injected_record_step_and_rank_are_named(dumps, comm, run, layout):
    _, answers = _compare(dumps, comm, run, layout)
    answers.update(_lake(dumps, comm, run, layout))
    if run == "scale":
        answers.pop("compare")  # its first divergence: the first row past the thresholds (a later record)
    wrong = {tool: ans for tool, ans in answers.items()
             if not ans or ans["record"] != WANT[run] or ans["step"] != FAULT["step"] or ans["ranks"] != [FAULT["rank"]]}
    assert not wrong, (run, layout, wrong)
    assert set(answers) == {"compare_origin", "lake_diverge"} | ({"compare", "lake_nan"} if run == "nan" else set())


def test_cell_list_indices_are_offset_across_stages():
    """A MindSpore Cell's list index (``Cell.layers.0`` of stage 1) is offset by the earlier stages' as a
    PyTorch module's is (spec/FORMAT.md 26.3, 26.7); its API records renumbered in the step's order."""
    from msprobe.format.parallel import stage_renames

    stage = ["MintFunctional.linear.0.forward", "Cell.layers.0.linear_fc1.ColumnParallelLinear.forward.0",
             "Cell.layers.0.Block.forward.0", "Cell.layers.0.Block.backward.0",
             "Cell.layers.0.linear_fc1.ColumnParallelLinear.parameters_grad"]
    renamed = stage_renames([stage, stage])
    assert renamed[0] == {name: name for name in stage}
    assert renamed[1] == {
        "MintFunctional.linear.0.forward": "MintFunctional.linear.1.forward",
        "Cell.layers.0.linear_fc1.ColumnParallelLinear.forward.0": "Cell.layers.1.linear_fc1.ColumnParallelLinear.forward.0",
        "Cell.layers.0.Block.forward.0": "Cell.layers.1.Block.forward.0",
        "Cell.layers.0.Block.backward.0": "Cell.layers.1.Block.backward.0",
        "Cell.layers.0.linear_fc1.ColumnParallelLinear.parameters_grad":
            "Cell.layers.1.linear_fc1.ColumnParallelLinear.parameters_grad"}


def test_the_docs_transcript_is_what_it_prints(dumps, tmp_path, capsys, monkeypatch):
    """docs/compare.md's MindSpore transcript (a ```text block of ``$ msprobe compare ./ms_tp2 ...``): each
    line it shows is a line the command prints on the ``mint`` NaN run against the single card."""
    import re

    from msprobe.cli import main

    with open(os.path.join(ROOT, "docs", "compare.md"), encoding="utf-8") as f:
        (body,) = re.findall(r"^```text\n(\$ msprobe compare \./ms_tp2 .*?)^```", f.read(), re.S | re.M)
    first, *shown = body.splitlines()
    os.symlink(_target(dumps, "mint", "nan"), tmp_path / "ms_tp2")
    os.symlink(os.path.join(dumps, "single", "healthy"), tmp_path / "ms_single")
    monkeypatch.chdir(tmp_path)
    assert main(first.split()[2:] + ["--no-plot"]) == 0
    printed = capsys.readouterr().out.splitlines()
    for line in shown:
        assert line == "..." or line in printed, (line, printed)


def test_a_size_each_member_holds_a_piece_of_is_the_whole():
    """An int the data-parallel replicas (or TP ranks) hold whose sum is the other side's (a Shape's
    output of each replica's batch, a reshape's size) merges to the whole's, not to the first member's
    (MindSpore's Dense reshapes by its input's shape: a false answer on a healthy DP pair before)."""
    from msprobe.readers._merge_leaf import _Merger

    def shape_record(*values):
        return {"input_args": [], "input_kwargs": {}, "output": [{"type": "int", "value": v} for v in values]}

    name = "Primitive.shape_op.Shape.0.forward"
    merger = _Merger([[0, 1], [2, 3]], {name: shape_record(4, 3, 8)}, None, [])
    record, kinds, _ = merger.record(name, [shape_record(2, 3, 8), shape_record(2, 3, 8)])
    assert [entry["value"] for entry in record["output"]] == [4, 3, 8]
    assert kinds == {"output.0": "a piece's size"}
    other = _Merger([[0, 1], [2, 3]], {name: shape_record(5, 3, 8)}, None, [])  # not their sum: the first's
    record, kinds, _ = other.record(name, [shape_record(2, 3, 8), shape_record(2, 3, 8)])
    assert [entry["value"] for entry in record["output"]] == [2, 3, 8] and kinds == {}


def _departures(summary: dict, folder: str) -> list:
    """(step, row, Result) of every row whose Result is not pass, over the compare's CSVs."""
    import csv
    import glob

    out = []
    for path in sorted(glob.glob(os.path.join(folder, "compare_result_step*.csv"))):
        step = os.path.basename(path).split("_")[2]
        with open(path, encoding="utf-8", newline="") as f:
            out.extend((step, row["NPU Name"], row["Result"]) for row in csv.DictReader(f) if row["Result"] != "pass")
    return sorted(out)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_against_the_pytorch_single_card(dumps, layout, tmp_path):
    """The same model in PyTorch as the bench (cross-framework, as without a layout: -am -cm by default):
    the merged TP=2 run departs from it in exactly the rows the MindSpore single card does (the layout adds
    no answer: zero-initialised bias shards joined against the PyTorch names' shapes), ``lake diverge``
    answers as compare does on the single cards, and the NaN run's first NaN is rank 1's masked_fill at
    step 1. (Both pairs depart in the backward of a linear of a 3-D input: PyTorch's record holds the
    gradient flattened, ``[12, 8]``, MindSpore's ``[4, 3, 16]``: a difference of the frameworks' records,
    not of the layout.)"""
    from msprobe.compare import compare

    losses = [_side(os.path.join(dumps, where, "healthy.rank0.json"))["losses"] for where in ("pt", "single")]
    assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(*losses)), losses
    bench = os.path.join(dumps, "pt", "healthy")
    plain = compare(os.path.join(dumps, "single", "healthy"), bench, str(tmp_path / "single"), plot=False,
                    progress=False)
    merged = compare(_target(dumps, "mint", "healthy"), bench, str(tmp_path / "merged"), layout=layout, plot=False,
                     progress=False)
    assert _departures(merged, str(tmp_path / "merged")) == _departures(plain, str(tmp_path / "single"))
    import shutil

    lake = tmp_path / "lake"  # lake diverge pairs the merged model with the PyTorch card alike
    shutil.copytree(_target(dumps, "mint", "healthy"), lake / "target")
    shutil.copytree(bench, lake / "bench")
    said = B.lake_diverge_answer(B._cli(["lake", "diverge", str(lake), "target", "bench", "--layout", layout,
                                         "--no-cluster", "--json"]))
    origin = B.compare_answers(plain, None)["compare_origin"]
    assert (said["record"], said["step"]) == (origin["record"], origin["step"]), (said, origin)
    nan = compare(_target(dumps, "mint", "nan"), bench, str(tmp_path / "nan"), layout=layout, plot=False,
                  progress=False)
    first = B.compare_answers(nan, "nan")["compare"]
    assert (first["record"], first["step"], first["ranks"]) == (WANT["nan"], FAULT["step"], [FAULT["rank"]]), first
