"""msprobe compare against the real tool's outputs on the committed fixtures."""
from __future__ import annotations

import csv
import glob
import json
import math
import os

import pytest

from msprobe.compare import COLUMNS, compare

HERE = os.path.dirname(os.path.abspath(__file__))
REAL = os.path.join(os.path.dirname(HERE), "fixtures", "real")
MS26 = os.path.join(REAL, "ms26")
MS8 = os.path.join(REAL, "ms8")
OUTS = os.path.join(REAL, "compare_outputs")


def _read(path: str) -> list:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _num(s: str):
    t = s[:-1] if s.endswith("%") else s
    try:
        return float(t)
    except ValueError:
        return None


def _close(ours: str, real: str, col: str) -> bool:
    if ours == real:
        return True
    a, b = _num(ours), _num(real)
    if a is None or b is None:
        return False
    if math.isnan(a) and math.isnan(b):
        return True
    # the real tool prints Cosine with 6 significant decimals for values near 1
    tol = 1e-6 if col == "Cosine" else 0.0
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=max(tol, 1e-12))


def _check(ours_path: str, real_path: str, mode: str, skip: tuple = ()) -> None:
    ours, real = _read(ours_path), _read(real_path)
    with open(ours_path, encoding="utf-8") as f:
        header = next(csv.reader(f))
    with open(real_path, encoding="utf-8") as f:
        real_header = next(csv.reader(f))
    assert header == real_header == COLUMNS[mode]
    assert [r["NPU Name"] for r in ours] == [r["NPU Name"] for r in real]
    bad = []
    for o, r in zip(ours, real):
        for col in real_header:
            if col in skip:
                continue
            if not _close(o[col], r[col], col):
                bad.append((r["NPU Name"], col, o[col], r[col]))
    assert not bad, f"{len(bad)} cells differ, first: {bad[:8]}"


def _run(tmp_path, scen: str, **kw) -> dict:
    return compare(os.path.join(MS26, scen, "step0"), os.path.join(MS26, scen + "_perturbed", "step0"),
                   str(tmp_path), plot=False, **kw)


@pytest.mark.parametrize("scen,mode", [("L1_statistics", "statistics"), ("L1_md5", "md5"), ("L1_tensor", "tensor")])
def test_matches_real_tool(tmp_path, scen, mode):
    s = _run(tmp_path, scen)
    assert s["mode"] == mode
    (pair,) = s["pairs"]
    real = glob.glob(os.path.join(OUTS, f"26.2.0_{scen}", "*.csv"))[0]
    ours = pair["files"][0]
    # same file name pattern: compare_result_<rank dir>_<timestamp>.csv
    assert os.path.basename(ours).rsplit("_", 1)[0] == os.path.basename(real).rsplit("_", 1)[0]
    _check(ours, real, mode)
    assert pair["unmatched_rows"] == 0


def test_first_divergence_in_summary(tmp_path):
    # the real tool passes every row of this pair: by default no divergence (the Result column) ...
    s = _run(tmp_path / "a", "L1_statistics")
    assert s["first_divergence"] is None and set(s["pairs"][0]["results"]) == {"pass"}
    # ... and with a NormRelativeErr threshold, the first row above it
    s = _run(tmp_path / "b", "L1_statistics", threshold=1e-3)
    with open(os.path.join(str(tmp_path / "b"), "summary.json"), encoding="utf-8") as f:
        saved = json.load(f)
    fd = saved["first_divergence"]
    assert fd is not None and fd["record"].startswith("Functional.linear.0.forward")
    assert fd["norm_relative_err"] > 1e-3 and fd["result"] == "pass"
    assert saved["divergence"] == "first row whose NormRelativeErr > 0.001"
    assert saved["first_nan_inf_target"] is None


def test_same_dump_all_pass(tmp_path):
    for scen in ("L1_statistics", "L1_md5", "L1_tensor"):
        p = os.path.join(MS26, scen, "step0")
        s = compare(p, p, str(tmp_path / scen), plot=False)
        (pair,) = s["pairs"]
        assert set(pair["results"]) == {"pass"}, (scen, pair["results"])
        assert s["first_divergence"] is None


def _unmatched(rows: list) -> set:
    return {r["NPU Name"] if r["NPU Name"] != "N/A" else "bench:" + r["Bench Name"]
            for r in rows if "N/A" in (r["NPU Name"], r["Bench Name"])}


def test_cross_dialect_8_vs_26(tmp_path):
    s = compare(os.path.join(MS8, "L1_statistics"), os.path.join(MS26, "L1_statistics"), str(tmp_path), plot=False)
    assert [p["step"] for p in s["pairs"]] == [0, 1]
    assert [p["rank_dir"] for p in s["pairs"]] == ["rank", "rank"]
    assert [p["bench_rank_dir"] for p in s["pairs"]] == ["proc11134", "proc11134"]
    assert s["target_dialect"] == "msprobe-8" and s["bench_dialect"] == "msprobe-26"
    for p in s["pairs"]:
        assert os.path.basename(p["files"][0]).startswith(f"compare_result_step{p['step']}_rank_")
        rows = _read(p["files"][0])
        # only 8.x's backward seed (Torch.ones_like) has no counterpart; it is listed, not dropped
        assert {n.rsplit(".forward", 1)[0] for n in _unmatched(rows)} == {"Torch.ones_like.0"}
        assert p["unmatched_records"] == 1 and p["unmatched_bench_records"] == 0
        assert all(r["Max diff"] != "N/A" for r in rows if "N/A" not in (r["NPU Name"], r["Bench Name"])
                   and r["NPU Dtype"].startswith("torch.float"))


def test_cross_dialect_parameters_grad(tmp_path):
    s = compare(os.path.join(MS8, "L0_statistics"), os.path.join(MS26, "L0_statistics"), str(tmp_path),
                step=0, plot=False)
    (p,) = s["pairs"]
    rows = _read(p["files"][0])
    assert not _unmatched(rows)
    pg = [r for r in rows if ".parameters_grad" in r["NPU Name"]]
    assert pg and all(".parameters_grad.0." in r["Bench Name"] for r in pg)
    assert {r["NPU Name"].rsplit(".", 1)[1] for r in pg} >= {"weight", "bias"}
