"""msprobe compare: CLI, planted NaN, multi-rank pool, missing optional dependencies."""
from __future__ import annotations

import csv
import json
import os
import shutil
import sys

import pytest

from msprobe.cli import main
from msprobe.compare import compare

HERE = os.path.dirname(os.path.abspath(__file__))
REAL = os.path.join(os.path.dirname(HERE), "fixtures", "real")
MS26 = os.path.join(REAL, "ms26")
MS8 = os.path.join(REAL, "ms8")
STATS = os.path.join(MS26, "L1_statistics", "step0")
PERT = os.path.join(MS26, "L1_statistics_perturbed", "step0")


def _plant_nan(tmp_path, record: str, arg: str = "output") -> str:
    dst = str(tmp_path / "planted")
    shutil.copytree(STATS, dst)
    (rank,) = os.listdir(dst)
    path = os.path.join(dst, rank, "dump.json")
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    doc["data"][record][arg][0]["Max"] = float("nan")
    doc["data"][record][arg][0]["Norm"] = float("nan")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
    return dst


def test_planted_nan_is_first_nan(tmp_path):
    planted = _plant_nan(tmp_path, "Torch.matmul.0.forward")
    s = compare(planted, STATS, str(tmp_path / "out"), plot=False)
    nf = s["first_nan_inf_target"]
    assert nf["row"] == "Torch.matmul.0.forward.output.0"
    assert s["first_nan_inf_bench"] is None
    # the NaN row is the first divergence of a dump compared with its own copy
    assert s["first_divergence"]["row"] == "Torch.matmul.0.forward.output.0"
    # the NaN also shows as the bench's first NaN the other way round
    s2 = compare(STATS, planted, str(tmp_path / "out2"), plot=False)
    assert s2["first_nan_inf_bench"]["row"] == "Torch.matmul.0.forward.output.0"


def test_cli_positional_and_tp_gp(tmp_path, capsys):
    out = str(tmp_path / "a")
    assert main(["compare", STATS, PERT, "-o", out, "--no-plot", "--divergence-threshold", "1e-3"]) == 0
    text = capsys.readouterr().out
    assert "error enters at: Functional.linear.0.forward" in text
    assert "first divergence: Functional.linear.0.forward.output.0 (step 0" in text
    assert "  (first row whose NormRelativeErr > 0.001)" in text
    assert "first NaN in target: none; first +/-Inf in target: none" in text
    assert os.path.exists(os.path.join(out, "summary.json"))
    out2 = str(tmp_path / "b")
    assert main(["compare", "-tp", STATS, "-gp", PERT, "-o", out2, "--no-plot"]) == 0
    files = sorted(os.listdir(out2))
    assert any(f.startswith("compare_result_proc11134_") and f.endswith(".csv") for f in files)
    # --fail-on-divergence follows the Result column: every row of this pair passes (as in the real tool)
    assert main(["compare", "-tp", STATS, "-gp", PERT, "-o", out2, "--no-plot", "--fail-on-divergence"]) == 0
    assert main(["compare", "-tp", STATS, "-gp", PERT, "-o", out2, "--no-plot", "--fail-on-divergence",
                 "--divergence-threshold", "1e-3"]) == 3
    assert main(["compare", STATS, STATS, "-o", out2, "--no-plot", "--fail-on-divergence"]) == 0
    planted = _plant_nan(tmp_path, "Torch.matmul.0.forward")  # NaN Max on the target only: an error row
    assert main(["compare", planted, STATS, "-o", out2, "--no-plot", "--fail-on-divergence"]) == 3


def test_cli_errors(tmp_path, capsys):
    assert main(["compare", STATS, "-o", str(tmp_path)]) == 2
    assert main(["compare", STATS, str(tmp_path / "missing"), "-o", str(tmp_path / "o")]) == 1
    assert main(["compare", STATS, PERT, "--step", "7", "-o", str(tmp_path / "o")]) == 1
    with pytest.raises(SystemExit) as e:
        main(["compare", STATS, PERT, "--mode", "bogus"])
    assert e.value.code == 2


def test_cli_json(tmp_path, capsys):
    assert main(["compare", STATS, STATS, "-o", str(tmp_path), "--json", "--no-plot"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["first_divergence"] is None and s["mode"] == "statistics"


def test_multi_rank_pool(tmp_path):
    s = compare(os.path.join(MS8, "distributed_2rank"), os.path.join(MS26, "distributed_2rank"), str(tmp_path),
                workers=2, plot=False)
    assert [p["rank"] for p in s["pairs"]] == [0, 1]
    names = sorted(os.path.basename(p["files"][0]).rsplit("_", 1)[0] for p in s["pairs"])
    assert names == ["compare_result_rank0", "compare_result_rank1"]
    for p in s["pairs"]:
        rows = list(csv.DictReader(open(p["files"][0], encoding="utf-8")))
        assert any(r["NPU Name"].startswith("Distributed.all_reduce.0.forward") for r in rows)
        assert p["matched_records"] >= p["records"] - 2
    one = compare(os.path.join(MS8, "distributed_2rank"), os.path.join(MS26, "distributed_2rank"),
                  str(tmp_path / "r1"), rank=1, plot=False)
    assert [p["rank"] for p in one["pairs"]] == [1]


def test_xlsx_needs_openpyxl(tmp_path, monkeypatch):
    from msprobe.errors import MissingDependencyError

    try:
        import openpyxl  # noqa: F401
    except ImportError:
        with pytest.raises(MissingDependencyError, match=r"pip install .msprobe-lake\[xlsx\]."):
            compare(STATS, PERT, str(tmp_path), xlsx=True, plot=False)
        assert main(["compare", STATS, PERT, "-o", str(tmp_path), "--xlsx"]) == 1
    else:
        s = compare(STATS, PERT, str(tmp_path), xlsx=True, plot=False)
        assert s["pairs"][0]["files"][1].endswith(".xlsx")
        monkeypatch.setitem(sys.modules, "openpyxl", None)
        with pytest.raises(MissingDependencyError, match=r"pip install .msprobe-lake\[xlsx\]."):
            compare(STATS, PERT, str(tmp_path / "x"), xlsx=True, plot=False)


def test_plot_or_note(tmp_path, monkeypatch):
    try:
        import matplotlib  # noqa: F401
        have = True
    except ImportError:
        have = False
    s = compare(STATS, PERT, str(tmp_path))
    if have:
        assert s["plot"] and os.path.exists(s["plot"])
    else:
        assert s["plot"] is None and "matplotlib" in s["plot_note"]
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    s = compare(STATS, PERT, str(tmp_path / "np"))
    assert s["plot"] is None and "pip install matplotlib" in s["plot_note"]


def test_chunked_equals_serial(tmp_path, monkeypatch):
    import msprobe.compare._core as core

    monkeypatch.setattr(core, "CHUNK_MIN_RECORDS", 0)
    planted = _plant_nan(tmp_path, "Tensor.__mul__.0.forward")
    a = compare(planted, PERT, str(tmp_path / "serial"), plot=False, timestamp="1")
    b = compare(planted, PERT, str(tmp_path / "chunked"), plot=False, timestamp="1", workers=3)
    (pa,), (pb,) = a["pairs"], b["pairs"]
    with open(pa["files"][0], "rb") as f1, open(pb["files"][0], "rb") as f2:
        assert f1.read() == f2.read()
    for k in ("first_divergence", "first_nan_inf_target", "results", "rows", "matched_records"):
        assert pa[k] == pb[k], k
