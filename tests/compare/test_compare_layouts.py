"""Compare under a parallel layout (``--layout``): a Megatron-style TP=2 x PP=2 forward pass on 4
gloo ranks (tests/compare/_tp_pp_child.py) against the same model with the same weights on one
card lines up record by record, with equal statistics; a shard fault is found on its rank."""
from __future__ import annotations

import csv
import glob
import json
import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from msprobe.compare import compare
from msprobe.errors import ConfigError
from msprobe.format.parallel import LayoutError, merge_shard_stats, parse_layout, stage_renames
from msprobe.format.stats import stats_equal

REPO = str(Path(__file__).resolve().parents[2])
CHILD = str(Path(__file__).with_name("_tp_pp_child.py"))
STATS = (("NPU max", "Bench max"), ("NPU min", "Bench min"), ("NPU mean", "Bench mean"), ("NPU l2norm", "Bench l2norm"))


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(dump: Path, tp: int, pp: int, fault: int = -1, level: str = "mix", task: str = "statistics") -> None:
    world = tp * pp
    port = _port()
    procs = [subprocess.Popen([sys.executable, CHILD, str(dump), str(tp), str(pp), str(fault)],
                              env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), MASTER_PORT=str(port), LEVEL=level,
                                       TASK=task,
                                       MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1", PYTHONPATH=REPO),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in range(world)]
    outs = [p.communicate(timeout=240)[0].decode(errors="replace") for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(outs)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("layouts")
    for name, args in (("single", (1, 1)), ("tp2pp2", (2, 2)), ("fault", (2, 2, 3)),
                       ("single_L1", (1, 1, -1, "L1")), ("tp2pp2_L1", (2, 2, -1, "L1")),
                       ("single_T", (1, 1, -1, "mix", "tensor")), ("tp2pp2_T", (2, 2, -1, "mix", "tensor")),
                       ("fault_T", (2, 2, 3, "mix", "tensor"))):
        _run(root / name, *args)
    return root


def _rows(out: Path) -> list:
    (path,) = glob.glob(str(out / "compare_result_*.csv"))
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.parametrize("level", ["mix", "L1"])
def test_tp2_pp2_lines_up_with_the_single_card_run(runs, tmp_path, level):
    suffix = "" if level == "mix" else "_" + level
    summary = compare(str(runs / f"tp2pp2{suffix}"), str(runs / f"single{suffix}"), str(tmp_path),
                      layout="tp=2,pp=2", plot=False)
    (pair,) = summary["pairs"]
    single = json.loads((runs / f"single{suffix}" / "step0" / "rank" / "dump.json").read_text())["data"]
    assert pair["records"] == pair["bench_records"] == pair["matched_records"] == len(single)
    assert len(single) == (85 if level == "mix" else 50)  # L1: the API records only
    assert pair["unmatched"] == {"target": [], "bench": []}
    found = _rows(tmp_path)
    assert len(found) == pair["rows"] and {row["Result"] for row in found} == {"pass"}
    for row in found:
        assert row["NPU Name"] == row["Bench Name"] and row["NPU Tensor Shape"] == row["Bench Tensor Shape"]
        for target, bench in STATS:
            assert stats_equal(float(row[target]), float(row[bench])), (row["NPU Name"], target)
    model = summary["layout"]["models"][0]
    assert model["stages"] == [[0, 1], [2, 3]] and model["findings"] == [] and model["warnings"] == []
    # per rank: 2 all_reduce forward, 2 backward (the column-parallel input's gradient), a send and a recv
    assert model["communication_left_out"] == 24
    assert summary["first_divergence"] is None and summary["origin"] is None


def test_a_shard_fault_is_found_on_its_rank(runs, tmp_path):
    summary = compare(str(runs / "fault"), str(runs / "single"), str(tmp_path), layout="tp=2,pp=2", plot=False)
    assert summary["pairs"][0]["matched_records"] == 85
    origin = summary["origin"]
    assert origin["record"] == "Functional.linear.4.forward" and origin["argument"] == "input.1"  # layers.2's fc1 weight
    assert summary["layout"]["origin"]["ranks"] == [2, 3]
    assert summary["layout"]["origin"]["suspect_ranks"] == [3]
    findings = summary["layout"]["models"][0]["findings"]
    bias = [f for f in findings if f["record"] == "Module.head.Linear.forward.0" and f["leaf"] == "parameters.bias"]
    assert bias and bias[0]["finding"] == "replicas disagree" and bias[0]["differ_from_bench"] == [3]


def test_tensor_mode_compares_the_shards_concatenated(runs, tmp_path):
    """Tensor dumps of a parallel run: each merged leaf's tensor is made of the ranks' files (shards
    concatenated, a partial sum's all_reduce result, a replica's own file): against the single card's
    every row's tensors agree (Cosine 1, MaxAbsErr within float32 sums); a shard x1.5 on rank 3 is
    where the error enters, on rank [3]; the Data_name column says which ranks' files a row is made of."""
    summary = compare(str(runs / "tp2pp2_T"), str(runs / "single_T"), str(tmp_path / "ok"), layout="tp=2,pp=2",
                      plot=False)
    assert summary["mode"] == "tensor"
    (pair,) = summary["pairs"]
    assert pair["matched_records"] == 85 and summary["origin"] is None and summary["first_divergence"] is None
    found = _rows(tmp_path / "ok")
    assert {row["Result"] for row in found} == {"pass"}
    compared = [row for row in found if row["Cosine"] not in ("unsupported", "N/A")]
    assert len(compared) > 150
    for row in compared:
        assert float(row["Cosine"]) > 0.99999 and float(row["MaxAbsErr"]) < 1e-5, (row["NPU Name"], row["Cosine"])
    weight = next(row for row in found if row["NPU Name"] == "Functional.linear.0.forward.input.1")
    assert weight["NPU Tensor Shape"] == "[32, 8]" and float(weight["MaxAbsErr"]) == 0.0
    assert "cat(rank0/Functional.linear.0.forward.input.1.pt, rank1/Functional.linear.0.forward.input.1.pt)" \
        in weight["Data_name"]
    summary = compare(str(runs / "fault_T"), str(runs / "single_T"), str(tmp_path / "fault"), layout="tp=2,pp=2",
                      plot=False)
    origin = summary["origin"]
    assert origin["record"] == "Functional.linear.4.forward" and origin["argument"] == "input.1"
    assert summary["layout"]["origin"]["suspect_ranks"] == [3]
    row = next(row for row in _rows(tmp_path / "fault") if row["NPU Name"] == "Functional.linear.4.forward.input.1")
    assert float(row["MaxAbsErr"]) > 0.01  # the x1.5 shard, read from rank 3's file


def test_cli_layout_and_refusals(runs, tmp_path, capsys):
    from msprobe.cli import main

    assert main(["compare", str(runs / "fault"), str(runs / "single"), "-o", str(tmp_path), "--layout",
                 "tp=2,pp=2", "--no-plot"]) == 0
    out = capsys.readouterr().out
    assert "records 85/85 matched" in out and "its shard on rank [3]" in out
    with pytest.raises(ConfigError, match="md5"):
        compare(str(runs / "tp2pp2"), str(runs / "single"), str(tmp_path), layout="tp=2,pp=2", mode="md5", plot=False)
    with pytest.raises(ConfigError, match="needs 8 ranks"):
        compare(str(runs / "tp2pp2"), str(runs / "single"), str(tmp_path), layout="tp=2,pp=2,dp=2", plot=False)


def assert_printed(shown: list, printed: list) -> None:
    """Every line a transcript shows is one of the lines printed (``<ts>``: a timestamp, ``[...]``:
    any text; a ``...`` line stands for lines left out)."""
    for line in shown:
        if line.strip() == "...":
            continue
        pattern = re.escape(line).replace(re.escape("<ts>"), r"\S+").replace(re.escape("[...]"), ".*")
        assert any(re.fullmatch(pattern, each) for each in printed), (line, printed)


def _transcripts() -> list:
    """docs/compare.md's ``$ msprobe compare ...`` blocks: (arguments, the lines it shows)."""
    text = (Path(REPO) / "docs" / "compare.md").read_text(encoding="utf-8")
    found = []
    for body in re.findall(r"^```\n(\$ msprobe compare .*?)^```", text, re.S | re.M):
        first, *shown = body.splitlines()
        found.append((first.split()[2:], shown))
    return found


def test_doc_transcripts_are_what_it_prints(runs, tmp_path, capsys, monkeypatch):
    """Every line docs/compare.md shows of a layout compare is a line the command prints on these runs
    (``<ts>`` a timestamp, ``[...]`` any text, a ``...`` line the lines left out)."""
    from msprobe.cli import main

    monkeypatch.chdir(runs)
    transcripts = [(args, shown) for args, shown in _transcripts()  # vpp, ep: their own tests
                   if "./vpp/step0" not in args and "./ep_nan/step1" not in args]
    assert len(transcripts) == 2
    for args, shown in transcripts:
        out = str(tmp_path / args[1].strip("./"))
        assert main([out if a == "./out" else a for a in args] + ["--no-plot"]) == 0
        assert_printed(shown, capsys.readouterr().out.splitlines())


def test_parse_layout_and_megatron_rank_order():
    layout = parse_layout("tp=2,pp=2")
    assert layout.models([0, 1, 2, 3]) == [((0, 0, 0), [[0, 1], [2, 3]])]
    assert parse_layout("tp=2,pp=2").models(list(range(8)))[1] == ((1, 0, 0), [[2, 3], [6, 7]])
    assert parse_layout("tp=2,pp=2,order=pp-tp-cp-ep-dp").models([0, 1, 2, 3]) == [((0, 0, 0), [[0, 2], [1, 3]])]
    for bad in ("tp=0", "tp=2,xx=1", "order=tp-pp", "tp"):
        with pytest.raises(LayoutError):
            parse_layout(bad)


def test_merged_statistics_are_those_of_the_concatenation():
    rng = np.random.default_rng(0)
    shards = [rng.standard_normal((3, n)) for n in (4, 4, 2)]
    leaves = [{"type": "torch.Tensor", "dtype": "torch.float64", "shape": list(s.shape), "Max": float(s.max()),
               "Min": float(s.min()), "Mean": float(s.mean()), "Norm": float(np.linalg.norm(s)), "md5": "0"}
              for s in shards]
    whole = np.concatenate(shards, axis=1)
    merged = merge_shard_stats(leaves, 1)
    assert merged["shape"] == [3, 10] and "md5" not in merged
    assert merged["Max"] == whole.max() and merged["Min"] == whole.min()
    assert math.isclose(merged["Mean"], whole.mean(), rel_tol=1e-12)
    assert math.isclose(merged["Norm"], np.linalg.norm(whole), rel_tol=1e-12)


def test_stage_renames_follow_model_order():
    stage0 = ["Functional.linear.0.forward", "Module.layers.0.fc1.C.forward.0", "Module.layers.1.M.forward.0"]
    stage1 = ["Functional.linear.0.forward", "Module.layers.0.fc1.C.forward.0", "Module.head.Linear.forward.0"]
    first, second = stage_renames([stage0, stage1])
    assert first == {name: name for name in stage0}
    assert second == {"Functional.linear.0.forward": "Functional.linear.1.forward",
                      "Module.layers.0.fc1.C.forward.0": "Module.layers.2.fc1.C.forward.0",
                      "Module.head.Linear.forward.0": "Module.head.Linear.forward.0"}


def test_layout_read_from_the_dump_and_checked_against_it(runs, tmp_path):
    summary = compare(str(runs / "tp2pp2"), str(runs / "single"), str(tmp_path / "auto"), layout="auto", plot=False)
    model = summary["layout"]["models"][0]
    assert model["layout"] == "tp=2,pp=2 (read from the dump)" and model["stages"] == [[0, 1], [2, 3]]
    assert summary["pairs"][0]["matched_records"] == 85 and summary["first_divergence"] is None
    wrong = compare(str(runs / "tp2pp2"), str(runs / "single"), str(tmp_path / "wrong"),
                    layout="tp=2,pp=2,order=pp-tp-cp-ep-dp", plot=False)
    assert wrong["layout"]["models"][0]["stages"] == [[0, 2], [1, 3]]
    assert "rank 0: the layout's tensor-parallel group is [0, 2], its first all_reduce's group is [0, 1]" in \
        wrong["layout"]["models"][0]["warnings"]


def test_lake_diverge_under_a_layout(runs, tmp_path, capsys):
    for module in ("pyarrow", "duckdb", "distributed"):
        pytest.importorskip(module)
    import shutil

    from msprobe.cli import main

    lake = tmp_path / "lake"
    for run in ("fault", "single"):
        shutil.copytree(runs / run, lake / run)
    assert main(["lake", "diverge", str(lake), "fault", "single", "--layout", "tp=2,pp=2", "--no-cluster",
                 "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["pairs_compared"] == 1 and answer["origin"]["record"] == "Functional.linear.4.forward"
    assert answer["origin"]["layout"]["suspect_ranks"] == [3]
    assert answer["first_divergence"]["rank_dir"] == "merged"


def test_explorer_model_tree_of_the_merged_model(runs, tmp_path):
    pytest.importorskip("duckdb")
    from msprobe.view import open_view

    view = open_view(str(runs / "fault"), str(runs / "single"), layout="tp=2,pp=2", work_dir=str(tmp_path))
    try:
        tree = view.tree(0)
        top = [node["name"] for node in tree.kids(None)["nodes"] if node["name"].startswith("Module.layers.")]
        assert top[:4] == [f"Module.layers.{i}.MLP.forward.0" for i in range(4)]  # stage 1's layers.0 is layers.2
        assert tree.path("Functional.linear.4.forward") == ["Module.layers.2.MLP.forward.0",
                                                           "Module.layers.2.fc1.ColumnParallelLinear.forward.0",
                                                           "Functional.linear.4.forward"]
        assert view.summary["layout"]["origin"]["suspect_ranks"] == [3]
    finally:
        view.close()


class _Rank:
    """A rank directory stand-in for merge_model: its records and its construct tree."""

    def __init__(self, rank: int, data: dict, parents: dict):
        from msprobe.format.documents import DumpDocument

        self.rank, self.step, self.url = rank, 0, f"mem://rank{rank}"
        self._doc, self._parents = DumpDocument.new("statistics", "mix", "pytorch", data=data), parents

    def document(self):
        return self._doc

    def parents(self):
        return self._parents


def _leaf(value: float, shape=(2, 4)) -> dict:
    return {"type": "torch.Tensor", "dtype": "torch.float64", "shape": list(shape), "Max": value, "Min": -value,
            "Mean": 0.0, "Norm": value}


def test_a_module_on_every_stage_spans_them_and_partial_sums_take_the_reduced_result():
    from msprobe.readers._merged import merge_model

    root = "Module.model.GPT.forward.0"
    stage0 = [_Rank(r, {"Functional.matmul.0.forward": {"input_args": [_leaf(1.0)], "output": [_leaf(3.0 + r)]},
                        "Distributed.all_reduce.0.forward": {"input_args": [_leaf(3.0 + r)], "output": [_leaf(7.0)]},
                        root: {"input_args": [_leaf(1.0)], "output": [_leaf(5.0)]}},
                    {"Functional.matmul.0.forward": root, root: None}) for r in (0, 1)]
    stage1 = []
    for rank, value in ((2, 6.0), (3, 8.0)):  # a column-parallel output: shards of [2, 4]
        data = {"Functional.matmul.0.forward": {"input_args": [_leaf(5.0)], "output": [_leaf(value, (2, 2))]},
                root: {"input_args": [_leaf(5.0)], "output": [_leaf(9.0)]}}
        if rank == 3:
            data["Tensor.extra.0.forward"] = {"output": [_leaf(1.0)]}  # only on the second TP rank
        stage1.append(_Rank(rank, data, {"Functional.matmul.0.forward": root, root: None}))
    data, parents, _, report = merge_model([stage0, stage1], {})
    # a record of one tensor-parallel rank alone is kept in its place (a fault's masked_fill), a finding
    assert list(data) == ["Functional.matmul.0.forward", "Functional.matmul.1.forward", root, "Tensor.extra.0.forward"]
    assert report["records"]["Tensor.extra.0.forward"]["ranks"] == [3]
    assert data[root]["input_args"][0]["Max"] == 1.0 and data[root]["output"][0]["Max"] == 9.0  # first's in, last's out
    assert data["Functional.matmul.0.forward"]["output"][0]["Max"] == 7.0  # the partial sums' all_reduce result
    assert report["records"]["Functional.matmul.0.forward"]["leaves"]["output.0"] == "partial"
    merged = data["Functional.matmul.1.forward"]["output"][0]  # shards along the last dimension
    assert merged["shape"] == [2, 4] and merged["Max"] == 8.0 and merged["Norm"] == 10.0
    assert parents["Functional.matmul.1.forward"] == root and report["communication_left_out"] == 2
    assert [(f["record"], f["finding"]) for f in report["findings"]] == [
        ("Tensor.extra.0.forward", "record on rank 3 alone of its tensor-parallel group [2, 3]")]


def test_data_parallel_replicas_are_models_of_their_own(runs, tmp_path):
    # tp=2 alone on 4 ranks: dp=2, ranks [0, 1] and [2, 3] are two logical models, each paired with the bench
    summary = compare(str(runs / "tp2pp2"), str(runs / "single"), str(tmp_path), layout="tp=2", plot=False)
    models = {model["rank_dir"]: model["stages"] for model in summary["layout"]["models"]}
    assert models == {"merged0": [[0, 1]], "merged1": [[2, 3]]}
    assert [pair["rank_dir"] for pair in summary["pairs"]] == ["merged0", "merged1"]
    origin = summary["origin"]
    assert summary["layout"]["origin"]["ranks"] == models[origin["rank_dir"]][0]  # the origin's own replica


# --- issue 47: Megatron's habits (shapes decide shards, NaN carried, the step's order, ranks named) ---

def _t(shape, mx, mn=None, mean=0.0, norm=1.0) -> dict:
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": list(shape), "Max": mx,
            "Min": -mx if mn is None else mn, "Mean": mean, "Norm": norm}


def _int(value: int) -> dict:
    return {"type": "int", "value": value}


def test_equal_shards_are_shards_when_the_bench_holds_the_whole_tensor():
    """Megatron initialises biases to zero: two column-parallel bias shards with equal statistics
    against a [32] bench are a [32] shard pair, not one [16] replica; all-NaN gradient shards too."""
    from msprobe.readers._merged import merge_model, shapes_of

    zero = _t((16,), 0.0, 0.0, 0.0, 0.0)
    nan = _t((16,), math.nan, math.nan, math.nan, math.nan)
    ranks = [_Rank(r, {"Functional.linear.0.forward": {"input_args": [_t((2, 8), 1.0), _t((16, 8), 0.5 + r), zero],
                                                         "output": [_t((2, 16), 2.0 + r)]},
                       "Module.fc1.Linear.parameters_grad": {"bias": [nan]}}, {}) for r in (0, 1)]
    bench = {"Functional.linear.0.forward": {"input_args": [_t((2, 8), 1.0), _t((32, 8), 1.5),
                                                            _t((32,), 0.0, 0.0, 0.0, 0.0)],
                                             "output": [_t((2, 32), 3.0)]},
             "Module.fc1.Linear.parameters_grad": {"bias": [_t((32,), 1.0)]}}
    data, _, _, report = merge_model([ranks], bench, shapes_of(bench))
    bias = data["Functional.linear.0.forward"]["input_args"][2]
    assert bias["shape"] == [32] and bias["Max"] == 0.0 and bias["Norm"] == 0.0
    leaves = report["records"]["Functional.linear.0.forward"]["leaves"]
    assert leaves["input_args.2"] == "sharded" and leaves["input_args.0"] == "replicated"
    grad = data["Module.fc1.Linear.parameters_grad"]["bias"][0]
    assert grad["shape"] == [32] and math.isnan(grad["Max"]) and math.isnan(grad["Norm"])
    assert report["findings"] == []


def test_merged_statistics_carry_nan_and_inf():
    """Python's max/min skip a NaN that comes after a number: the merged Max/Min must carry it."""
    finite = _t((2, 2), 2.8, -0.17, 0.5, 1.0)
    for bad in (_t((2, 2), math.nan, math.nan, math.nan, math.nan), _t((2, 2), 1.0, math.nan, math.nan, math.nan)):
        merged = merge_shard_stats([finite, bad], 1)
        assert all(math.isnan(merged[stat]) for stat in ("Max", "Min", "Mean", "Norm")), merged
    merged = merge_shard_stats([finite, _t((2, 2), math.inf, 0.0, math.inf, math.inf)], 0)
    assert merged["Max"] == math.inf and merged["Min"] == pytest.approx(-0.17) and merged["Norm"] == math.inf


def _p2p(kind: str, peer: int, leaf: dict) -> dict:
    return {"input_args": [leaf, _int(peer)], "input_kwargs": {}, "output": [leaf]}


def test_the_merged_model_runs_in_the_steps_happens_before_order():
    """Stage 1's forward comes before stage 0's backward, and the optimizer's in-place updates (after
    each stage's last backward record) come after every stage's backward, numbered as one card
    numbers them: stage 0's parameters first."""
    from msprobe.readers._merged import merge_model

    x = _t((2, 4), 1.0)
    stage0 = {"Functional.linear.0.forward": {"input_args": [x], "output": [x]},
              "Distributed.send.0.forward": _p2p("send", 1, x),
              "Distributed.recv.0.forward": _p2p("recv", 1, x),
              "Functional.linear.0.backward": {"input": [x], "output": [x]},
              "Tensor.add_.0.forward": {"input_args": [x], "output": [x]}}
    stage1 = {"Distributed.recv.0.forward": _p2p("recv", 0, x),
              "Functional.linear.0.forward": {"input_args": [x], "output": [x]},
              "Functional.linear.0.backward": {"input": [x], "output": [x]},
              "Distributed.send.0.forward": _p2p("send", 0, x),
              "Tensor.add_.0.forward": {"input_args": [x], "output": [x]}}
    data, _, _, report = merge_model([[_Rank(0, stage0, {})], [_Rank(1, stage1, {})]], {})
    assert list(data) == ["Functional.linear.0.forward", "Functional.linear.1.forward",
                          "Functional.linear.1.backward", "Functional.linear.0.backward",
                          "Tensor.add_.0.forward", "Tensor.add_.1.forward"]
    assert report["records"]["Tensor.add_.1.forward"]["ranks"] == [1]
    assert report["communication_left_out"] == 4


def test_a_pipeline_of_model_chunks_needs_its_virtual_size():
    """Megatron's virtual pipeline (vpp): each rank holds several model chunks (``Module.0.``,
    ``Module.1.``). Given as a plain pipeline (vpp=1) the layers would be misplaced: refused with the
    reason; read from the dump (auto), the chunks give the virtual pipeline's size."""
    from msprobe.readers._merged import layout_models

    x = _t((2, 4), 1.0)
    chunked = {"Module.0.layers.0.L.forward.0": {"input_args": [x], "output": [x]},
               "Module.1.layers.0.L.forward.0": {"input_args": [x], "output": [x]}}
    ranks = [_Rank(0, dict(chunked, **{"Distributed.send.0.forward": _p2p("send", 1, x)}), {}),
             _Rank(1, dict({"Distributed.recv.0.forward": _p2p("recv", 0, x)}, **chunked), {})]
    with pytest.raises(ConfigError, match="model chunks .*virtual pipeline.*vpp=2"):
        layout_models(ranks, parse_layout("tp=1,pp=2"))
    text, _, _, vpp = layout_models(ranks, None)
    assert vpp == 2 and text.startswith("tp=1,pp=2,vpp=2")
    with pytest.raises(ConfigError, match="need a pipeline"):
        layout_models(ranks, parse_layout("tp=2,pp=1,vpp=2"))
    # one stage holding two models (start(model=[a, b])) is no pipeline: merged as it is
    assert layout_models(ranks, parse_layout("tp=2,pp=1"))[1] == [((0, 0, 0), [[0, 1]])]


def _vpp_run(pp: int = 2, vpp: int = 2, mbs: int = 2, batched: bool = True) -> tuple:
    """(rank sources, single card's records) of a virtual pipeline written as Megatron's interleaved
    schedule runs it: layer ``l`` (one linear) on virtual stage ``l``, i.e. chunk ``l // pp`` of
    pipeline rank ``l % pp``; each rank runs its forwards chunk by chunk over the micro-batches,
    then its backwards, then one optimizer update per parameter (no module: the tail). Every tensor
    has statistics of its own. ``batched``: a receive for the next forward is posted before the
    send of the current one (send_forward_recv_forward), as Megatron does."""
    layers = pp * vpp
    act = {(mb, l): _t((2, 4), 10.0 + 100 * mb + l) for mb in range(mbs) for l in range(layers + 1)}
    grad = {(mb, l): _t((2, 4), 20.0 + 100 * mb + l) for mb in range(mbs) for l in range(layers + 1)}
    weight = {l: _t((4, 4), 30.0 + l) for l in range(layers)}
    wgrad = {l: _t((4, 4), 40.0 + l) for l in range(layers)}
    updated = {l: _t((4, 4), 50.0 + l) for l in range(layers)}
    ranks = []
    for p in range(pp):
        data: dict = {}
        parents: dict = {}
        counts: dict = {}

        def add(api: str, record: dict, parent=None, backward_of=None) -> str:
            if backward_of is not None:
                name = backward_of.replace(".forward", ".backward")
            else:
                n = counts.get(api, 0)
                counts[api] = n + 1
                name = f"{api}.{n}.forward"
            data[name] = record
            parents[name] = parent
            return name

        order = [(k // pp % vpp, k // (pp * vpp) * pp + k % pp) for k in range(vpp * mbs)]
        fwd_names: dict = {}
        pending: list = []
        for c, mb in order:
            v = c * pp + p
            if v > 0 and not (batched and pending):
                add("Distributed.irecv", _p2p("recv", (p - 1) % pp, act[(mb, v)]))
            module = f"Module.{c}.layers.0.L.forward.{mb}"
            fwd_names[(c, mb)] = add("Functional.linear", {"input_args": [act[(mb, v)], weight[v]],
                                                           "output": [act[(mb, v + 1)]]}, module)
            data[module] = {"input_args": [act[(mb, v)]], "output": [act[(mb, v + 1)]]}
            parents[module] = None
            nxt = order.index((c, mb)) + 1
            if batched and nxt < len(order) and order[nxt][0] * pp + p > 0:  # the next forward's input first
                c2, mb2 = order[nxt]
                add("Distributed.irecv", _p2p("recv", (p - 1) % pp, act[(mb2, c2 * pp + p)]))
                pending = [True]
            else:
                pending = []
            if v < layers - 1:
                add("Distributed.isend", _p2p("send", (p + 1) % pp, act[(mb, v + 1)]))
        for c, mb in sorted(order, key=lambda cm: (-cm[0], cm[1])):
            v = c * pp + p
            if v < layers - 1:
                add("Distributed.irecv", _p2p("recv", (p + 1) % pp, grad[(mb, v + 1)]))
            module = f"Module.{c}.layers.0.L.backward.{mb}"
            data[module] = {"input": [grad[(mb, v + 1)]], "output": [grad[(mb, v)]]}
            parents[module] = None
            add("", {"input": [grad[(mb, v + 1)]], "output": [grad[(mb, v)]]}, None, fwd_names[(c, mb)])
            if v > 0:
                add("Distributed.isend", _p2p("send", (p - 1) % pp, grad[(mb, v)]))
        for c in range(vpp):
            v = c * pp + p
            data[f"Module.{c}.layers.0.L.parameters_grad"] = {"weight": [wgrad[v]]}
        for c in range(vpp):
            v = c * pp + p
            add("Tensor.add_", {"input_args": [weight[v], wgrad[v]], "output": [updated[v]]})
        ranks.append(_Rank(p, data, parents))
    single: dict = {}
    for mb in range(mbs):
        for l in range(layers):
            single[f"Functional.linear.{mb * layers + l}.forward"] = {"input_args": [act[(mb, l)], weight[l]],
                                                                       "output": [act[(mb, l + 1)]]}
            single[f"Module.layers.{l}.L.forward.{mb}"] = {"input_args": [act[(mb, l)]], "output": [act[(mb, l + 1)]]}
        for l in reversed(range(layers)):
            single[f"Module.layers.{l}.L.backward.{mb}"] = {"input": [grad[(mb, l + 1)]], "output": [grad[(mb, l)]]}
            single[f"Functional.linear.{mb * layers + l}.backward"] = {"input": [grad[(mb, l + 1)]],
                                                                        "output": [grad[(mb, l)]]}
    for l in range(layers):
        single[f"Module.layers.{l}.L.parameters_grad"] = {"weight": [wgrad[l]]}
    for l in range(layers):
        single[f"Tensor.add_.{l}.forward"] = {"input_args": [weight[l], wgrad[l]], "output": [updated[l]]}
    return ranks, single


@pytest.mark.parametrize("pp,vpp,batched", [(2, 2, True), (2, 2, False), (2, 3, True), (4, 2, True)])
def test_a_virtual_pipeline_merges_into_the_single_cards_records(pp, vpp, batched):
    """Chunk c of pipeline rank p is virtual stage c*pp+p: its layers, API call counts and optimizer
    updates (the tail, which carries no module) land where one card has them, every record equal."""
    from msprobe.readers._merged import merge_dump_step

    ranks, single = _vpp_run(pp, vpp, mbs=pp, batched=batched)  # Megatron: micro-batches a multiple of pp
    (merged,) = merge_dump_step(ranks, parse_layout(f"tp=1,pp={pp},vpp={vpp}"), single)
    data = merged.document().data
    assert sorted(data) == sorted(single)
    for name, record in single.items():
        assert data[name] == record, name
    assert merged.report["findings"] == []
    assert merged.report["records"]["Tensor.add_.0.forward"]["ranks"] == [0]
    assert merged.report["records"][f"Tensor.add_.{pp}.forward"]["ranks"] == [0]
    assert merged.report["records"]["Module.layers.1.L.forward.0"]["ranks"] == [1]
    (auto,) = merge_dump_step(ranks, None, single)
    assert auto.document().data == data and f"vpp={vpp}" in auto.report["layout"]


def test_a_module_spanning_stages_takes_its_backward_inputs_from_the_last_stage():
    """A module on two stages (a TransformerBlock each stage holds part of): forward, its inputs are
    the first stage's and its outputs the last's; backward, its inputs (the gradients of its outputs,
    under "input") the last stage's and its outputs the first's."""
    from msprobe.readers._merged import merge_model

    x0, x1, x2, g2, g1, g0 = (_t((2, 4), v) for v in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0))
    stage0 = {"Module.block.B.forward.0": {"input_args": [x0], "output": [x1]},
              "Distributed.send.0.forward": _p2p("send", 1, x1),
              "Distributed.recv.0.forward": _p2p("recv", 1, g1),
              "Module.block.B.backward.0": {"input": [g1], "output": [g0]}}
    stage1 = {"Distributed.recv.0.forward": _p2p("recv", 0, x1),
              "Module.block.B.forward.0": {"input_args": [x1], "output": [x2]},
              "Module.block.B.backward.0": {"input": [g2], "output": [g1]},
              "Distributed.send.0.forward": _p2p("send", 0, g1)}
    data, _, _, _ = merge_model([[_Rank(0, stage0, {})], [_Rank(1, stage1, {})]], {})
    assert data["Module.block.B.forward.0"] == {"input_args": [x0], "output": [x2]}
    assert data["Module.block.B.backward.0"] == {"input": [g2], "output": [g0]}


def test_sequence_parallel_partial_sums_join_their_reduce_scatter_pieces():
    """Megatron's sequence parallelism: a row-parallel linear's output is a partial sum on each tp rank,
    reduce_scattered along the sequence; the whole is the ranks' pieces joined (not a replica that
    disagrees). A bias added to a piece of the sequence has a gradient that sums that piece only: the
    whole's is the ranks' sum (Mean), not a finding."""
    from msprobe.readers._merged import merge_model

    pieces = [_t((2, 2, 8), 1.0 + r, -1.0 - r, 0.1 * (r + 1), 2.0 + r) for r in (0, 1)]
    partials = [_t((2, 4, 8), 3.0 + r, -3.0, 0.5 + r, 5.0 + r) for r in (0, 1)]
    bias_grads = [_t((8,), 0.5 + r, 0.1, 0.25 * (r + 1), 1.0) for r in (0, 1)]
    ranks = [_Rank(r, {"Functional.linear.0.forward": {"input_args": [_t((2, 4, 16), 1.0 + r)], "output": [partials[r]]},
                       "Distributed.reduce_scatter_tensor.0.forward": {"input_args": [None, partials[r]],
                                                                       "output": [pieces[r]]},
                       "Tensor.__add__.0.backward": {"input": [_t((2, 2, 8), 4.0 + r)],
                                                     "output": [_t((2, 2, 8), 4.0 + r), bias_grads[r]]}}, {})
             for r in (0, 1)]
    whole = merge_shard_stats(pieces, 1)
    bench = {"Functional.linear.0.forward": {"input_args": [_t((2, 4, 32), 2.0)], "output": [dict(whole)]},
             "Tensor.__add__.0.backward": {"input": [_t((2, 4, 8), 5.0)],
                                           "output": [_t((2, 4, 8), 5.0), _t((8,), 1.5, 0.1, 0.75, 1.0)]}}
    from msprobe.readers._merged import shapes_of

    data, _, _, report = merge_model([ranks], bench, shapes_of(bench))
    out = data["Functional.linear.0.forward"]["output"][0]
    assert out["shape"] == [2, 4, 8] and all(stats_equal(out[k], whole[k]) for k in ("Max", "Min", "Mean", "Norm"))
    assert report["records"]["Functional.linear.0.forward"]["leaves"]["output.0"] == "partial: its reduce_scatter's pieces"
    grad = data["Tensor.__add__.0.backward"]["output"][1]
    assert grad["Mean"] == pytest.approx(0.75) and grad["Max"] is None and grad["Norm"] is None
    assert report["findings"] == []


def test_a_record_one_side_alone_has_that_only_passes_its_input_on_is_no_origin(tmp_path):
    """``view_as`` of an autograd function that returns its input (Megatron's copy-to-region on one
    card) is the plumbing of a layout that the other side lacks: no error enters there."""
    from msprobe.compare._match import match_records
    from msprobe.compare._origin import find_origin

    x = _t((2, 4), 1.0)
    y = _t((2, 4), 2.0)
    bench = {"Tensor.view_as.0.forward": {"input_args": [x, x], "output": [x]},
             "Functional.gelu.0.forward": {"input_args": [x], "output": [y]}}
    target = {"Functional.gelu.0.forward": {"input_args": [x], "output": [y]}}
    pairs, rest, _ = match_records(target, bench, structural=False)
    assert find_origin(target, bench, pairs, rest, "statistics") is None
    bench["Tensor.mul.0.forward"] = {"input_args": [x], "output": [y]}  # a record that computes: an origin
    pairs, rest, _ = match_records(target, bench, structural=False)
    assert find_origin(target, bench, pairs, rest, "statistics")["role"] == "missing in target"


def test_adjacent_sends_and_receives_do_not_wait_for_each_other():
    """A receive posted before a send with no computation between (one batch of isend/irecv) does
    not hold the send back: the receiver's forward comes before the sender's next micro-batch."""
    from msprobe.readers._merge_order import model_order

    a0, a1, b0, b1, c0, c1 = (_t((2, 4), v) for v in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0))
    stage0 = {"Functional.linear.0.forward": {"input_args": [a0], "output": [b0]},
              "Distributed.isend.0.forward": _p2p("send", 1, b0),
              "Functional.linear.1.forward": {"input_args": [a1], "output": [b1]},
              "Distributed.isend.1.forward": _p2p("send", 1, b1)}
    stage1 = {"Distributed.irecv.0.forward": _p2p("recv", 0, b0),
              "Functional.gelu.0.forward": {"input_args": [b0], "output": [c0]},
              "Distributed.irecv.1.forward": _p2p("recv", 0, b1),  # posted with the send below
              "Distributed.isend.0.forward": _p2p("send", 2, c0),
              "Functional.gelu.1.forward": {"input_args": [b1], "output": [c1]},
              "Distributed.isend.1.forward": _p2p("send", 2, c1)}
    stage2 = {"Distributed.irecv.0.forward": _p2p("recv", 1, c0),
              "Functional.relu.0.forward": {"input_args": [c0], "output": [c0]},
              "Distributed.irecv.1.forward": _p2p("recv", 1, c1),
              "Functional.relu.1.forward": {"input_args": [c1], "output": [c1]}}
    order = model_order([[0], [1], [2]], [stage0, stage1, stage2])
    assert [name for _, name in order] == ["Functional.linear.0.forward", "Functional.gelu.0.forward",
                                           "Functional.relu.0.forward", "Functional.linear.1.forward",
                                           "Functional.gelu.1.forward", "Functional.relu.1.forward"]


# --- issue 47: expert parallel (experts on different ranks against one card holding all) ---

def _a2a(leaf: dict, group=(0, 1)) -> dict:
    grouped = {"type": "torch.ProcessGroup", "group_ranks": list(group), "group_id": "ep"}
    return {"input_args": [None, leaf], "input_kwargs": {"group": grouped}, "output": [leaf, leaf, grouped]}


def _ep_records(experts: list, tokens: list, share: tuple, nan_in: int = -1, group=(0, 1)) -> dict:
    """One rank (or, with every expert and the whole batch, the single card) of an MoE layer written
    as Megatron does: the router on its share of the batch, the tokens dispatched with
    all_to_all_single, its local experts (``local_experts.<i>``: fc1 and its module record), the
    experts' container, the combine, the residual; backward the same reversed (the experts last
    created first); the optimizer's unscale of each expert's gradient after the last backward."""
    rows, scale = share
    x = _t((rows, 8), 1.0 * scale, mean=0.1 * scale, norm=2.0 * scale)
    comm = len(experts) < 4
    data: dict = {"Functional.linear.0.forward": {"input_args": [x, _t((4, 8), 0.3)], "output": [_t((rows, 4), 2.0)]}}
    if comm:
        data["Distributed.all_to_all_single.0.forward"] = _a2a(_t((rows * 2, 8), 1.0), group)
    n = sum(tokens)
    for k, (g, count) in enumerate(zip(experts, tokens)):
        local = k  # the rank's own numbering of its experts
        bad = math.nan if g == nan_in else 1.0 + g
        data[f"Functional.linear.{k + 1}.forward"] = {"input_args": [_t((count, 8), 0.5 + g), _t((16, 8), 0.2 + g)],
                                                        "output": [_t((count, 16), bad, norm=bad)]}
        data[f"Module.layers.0.mlp.experts.local_experts.{local}.linear_fc1.Linear.forward.0"] = {
            "input_args": [_t((count, 8), 0.5 + g)], "output": [_t((count, 16), bad, norm=bad)]}
    counts = {"type": "torch.Tensor", "dtype": "torch.int64", "shape": [len(experts)], "Max": max(tokens),
              "Min": min(tokens), "Mean": None, "Norm": None}  # the tokens of each local expert
    data["Module.layers.0.mlp.experts.SequentialMLP.forward.0"] = {"input_args": [_t((n, 8), 4.0), counts],
                                                                    "output": [_t((n, 8), 5.0)]}
    if comm:
        data["Distributed.all_to_all_single.1.forward"] = _a2a(_t((n, 8), 5.0), group)
    data["Tensor.__add__.0.forward"] = {"input_args": [x, x], "output": [_t((rows, 8), 3.0 * scale)]}
    data["Tensor.__add__.0.backward"] = {"input": [_t((rows, 8), 6.0 / scale)], "output": [_t((rows, 8), 6.0 / scale)]}
    if comm:
        data["Distributed.all_to_all_single.2.forward"] = _a2a(_t((n, 8), 7.0), group)
    for k in reversed(range(len(experts))):
        g = experts[k]
        grad = _t((16, 8), 9.0 + g, norm=10.0 + g)
        data[f"Functional.linear.{k + 1}.backward"] = {"input": [_t((tokens[k], 16), 8.0 + g)],
                                                         "output": [_t((tokens[k], 8), 8.5 + g), grad]}
        data[f"Module.layers.0.mlp.experts.local_experts.{k}.linear_fc1.Linear.parameters_grad"] = {"weight": [grad]}
    data["Module.layers.0.mlp.experts.SequentialMLP.backward.0"] = {"input": [_t((n, 8), 7.0)],
                                                                     "output": [_t((n, 8), 7.5)]}
    if comm:
        data["Distributed.all_to_all_single.3.forward"] = _a2a(_t((n, 8), 7.5), group)
    data["Functional.linear.0.backward"] = {"input": [_t((rows, 4), 1.0)], "output": [_t((rows, 8), 1.0)]}
    for k, g in enumerate(experts):  # the expert optimizer's unscale of each gradient (1/1024)
        data[f"Tensor.mul_.{k}.forward"] = {"input_args": [_t((16, 8), 9.0 + g, norm=10.0 + g), {"type": "float",
                                                                                                   "value": 1 / 1024}],
                                            "output": [_t((16, 8), (9.0 + g) / 1024, norm=(10.0 + g) / 1024)]}
    return data


def test_expert_parallel_ranks_merge_into_the_card_holding_every_expert():
    """ep=2: each rank holds 2 of the 4 experts (``local_experts.0/1``, global 2 * rank + i) and half
    the batch. The merged model is the single card's record for record: the experts under their
    global index in the card's order (forward 0..3, backward 3..0), API calls renumbered, each
    expert's records on its rank alone, the experts' container joined from the ranks' tokens, the
    tail's unscale of an expert's gradient that expert's; a NaN in expert 3 names rank 1 alone;
    ``--layout auto`` reads ep=2 from the all_to_all group."""
    from msprobe.readers._merged import merge_dump_step, shapes_of

    tokens = [[5, 7], [4, 8]]
    single = _ep_records([0, 1, 2, 3], tokens[0] + tokens[1], (6, 1.0))
    for nan_in in (-1, 3):
        ranks = [_Rank(r, _ep_records([2 * r, 2 * r + 1], tokens[r], (3, 1.0), nan_in), {}) for r in (0, 1)]
        for layout in (parse_layout("ep=2"), None):
            (merged,) = merge_dump_step(ranks, layout, single, shapes_of(single))
            data, report = merged.document().data, merged.report
            assert list(data) == list(single), (layout, list(data))
            assert report["layout"] == ("tp=1,pp=1,ep=2" if layout else "tp=1,pp=1,ep=2 (read from the dump)")
            records = report["records"]
            for g in range(4):
                assert records[f"Functional.linear.{g + 1}.forward"]["ranks"] == [g // 2]
                assert records[f"Module.layers.0.mlp.experts.local_experts.{g}.linear_fc1.Linear.parameters_grad"][
                    "ranks"] == [g // 2]
                assert records[f"Tensor.mul_.{g}.forward"]["ranks"] == [g // 2]
                assert data[f"Functional.linear.{g + 1}.forward"]["input_args"][1]["Max"] == pytest.approx(0.2 + g)
                # a backward tensor of each rank's loss over its half of the batch: twice the card's, halved
                assert data[f"Functional.linear.{g + 1}.backward"]["input"][0]["Max"] == pytest.approx((8.0 + g) / 2)
            container = data["Module.layers.0.mlp.experts.SequentialMLP.forward.0"]["input_args"]
            assert container[0]["shape"] == [24, 8] and records["Module.layers.0.mlp.experts.SequentialMLP.forward.0"][
                "ranks"] == [0, 1]
            assert (container[1]["shape"], container[1]["Max"], container[1]["Min"]) == ([4], 8, 4)  # joined
            assert data["Tensor.__add__.0.forward"]["input_args"][0]["shape"] == [6, 8]
            nan_record = records["Functional.linear.4.forward"]
            assert nan_record["suspects"] == ([1] if nan_in == 3 else [])
            assert report["findings"] == []


def test_expert_parallel_without_ep_in_the_layout_is_warned_and_other_splits_refused():
    """A layout without ep on ranks whose all_to_all runs over 2 ranks says so; an ep whose groups are
    not the ranks' all_to_all groups is refused with the reason rather than merged wrongly."""
    from msprobe.readers._merged import merge_dump_step, shapes_of

    tokens = [[5, 7], [4, 8]]
    single = _ep_records([0, 1, 2, 3], tokens[0] + tokens[1], (6, 1.0))
    ranks = [_Rank(r, _ep_records([2 * r, 2 * r + 1], tokens[r], (3, 1.0)), {}) for r in (0, 1)]
    (merged,) = merge_dump_step(ranks, parse_layout("dp=2"), single, shapes_of(single))
    assert any("give ep=2" in warning for warning in merged.report["warnings"])
    four = [_Rank(r, _ep_records([2 * (r % 2), 2 * (r % 2) + 1], tokens[r % 2], (3, 1.0), group=(0, 1, 2, 3)), {})
            for r in range(4)]
    with pytest.raises(ConfigError, match=r"all_to_all groups \[\(0, 1, 2, 3\)\] are not groups of ep=2 ranks"):
        merge_dump_step(four, parse_layout("ep=2,dp=2"), single, shapes_of(single))


def test_an_experts_backward_tensor_is_divided_as_its_statistics_are():
    """Tensor mode: an expert's backward tensor (each rank's loss averages its own half of the batch:
    twice the card's) names a recipe of its rank's file divided by ep, as its statistics are; a
    partial expert norm of the tail names no tensor."""
    from msprobe.readers._merge_experts import _divided, _nulled
    from msprobe.readers._merge_leaf import _signature
    from msprobe.readers._merge_tensors import TensorRecipes

    recipes = TensorRecipes()
    leaf = dict(_t((3, 8), 4.0, -2.0, 1.0, 6.0), data_name=recipes.file(_Rank(1, {}, {}), "Functional.linear.1.backward"
                                                                        ".output.0.pt", _t((3, 8), 4.0)))
    halved = _divided({"output": [leaf]}, 2.0, recipes)["output"][0]
    assert (halved["Max"], halved["Min"], halved["Mean"], halved["Norm"]) == (2.0, -1.0, 0.5, 3.0)
    assert halved["data_name"].endswith("/2") and recipes.recipes[-1] == ("cat", (leaf["data_name"],), 0, 2.0, 1)
    assert "data_name" not in _divided({"output": [leaf]}, 2.0)["output"][0]  # no recipes: no tensor
    partial = _nulled({"output": [leaf]}, {_signature(leaf)})["output"][0]
    assert partial["Max"] is None and "data_name" not in partial


def test_expert_data_parallel_groups_join_as_replicas():
    """dp=4, ep=2: ranks [0, 1] and [2, 3] are two expert-parallel groups (their all_to_all groups),
    each holding experts 0-1 and 2-3 on its half of the batch. Each group merges into a model of all
    4 experts, then the groups join as data-parallel replicas: an expert's records are held by the
    two ranks holding it, its backward tensors a quarter of each rank's (each loss averages a
    quarter of the batch), the tokens per expert (integers over each group's share) not compared;
    the merged model is the single card's record for record."""
    from msprobe.readers._merged import merge_dump_step, shapes_of

    tokens = [[3, 4], [2, 3], [2, 4], [3, 2]]  # per rank: its experts' tokens from its group
    single = _ep_records([0, 1, 2, 3], [5, 8, 5, 5], (8, 1.0))
    ranks = [_Rank(r, _ep_records([2 * (r % 2), 2 * (r % 2) + 1], tokens[r], (2, 1.0),
                                  group=(0, 1) if r < 2 else (2, 3)), {}) for r in range(4)]
    for layout in (parse_layout("ep=2,dp=2"), None):
        (merged,) = merge_dump_step(ranks, layout, single, shapes_of(single))
        data, report = merged.document().data, merged.report
        assert list(data) == list(single), (layout, list(data))
        assert report["layout"] == ("tp=1,pp=1,dp=2,ep=2" if layout else "tp=1,pp=1,ep=2,dp=2 (read from the dump)")
        assert report["stages"] == [[0, 1], [2, 3]]
        for g in range(4):
            assert report["records"][f"Functional.linear.{g + 1}.forward"]["ranks"] == [g // 2, g // 2 + 2]
            grad = data[f"Functional.linear.{g + 1}.backward"]["input"][0]
            assert grad["Max"] == pytest.approx((8.0 + g) / 4) and grad["shape"][0] == [5, 8, 5, 5][g]
        container = data["Module.layers.0.mlp.experts.SequentialMLP.forward.0"]["input_args"]
        assert container[0]["shape"] == [23, 8] and container[1]["Max"] is None  # counts: summed, not compared


def test_context_parallel_pieces_are_put_in_sequence_order():
    """Megatron's load-balanced context parallelism: rank r of C holds chunks r and 2C-1-r of each
    sequence; the tensor of the whole is made of chunk k from rank k (k < C, its first) or rank
    2C-1-k (its second), sample by sample when samples are folded into the dimension."""
    from msprobe.readers._merge_tensors import balanced_order

    sequence = np.arange(8).reshape(1, 8)  # C = 2: 4 chunks of 2 tokens
    ranks = [sequence[:, [0, 1, 6, 7]], sequence[:, [2, 3, 4, 5]]]
    assert np.concatenate(balanced_order(ranks, 1, 1), axis=1).tolist() == sequence.tolist()
    folded = np.arange(12).reshape(12, 1)  # 2 samples of 6 tokens, C = 3 (chunks of 1), flattened
    pieces = [folded[[s * 6 + k for s in range(2) for k in (r, 5 - r)]] for r in range(3)]
    assert np.concatenate(balanced_order(pieces, 0, 2), axis=0).ravel().tolist() == list(range(12))
