"""Result and Err_message equal to the real compare (26.2.0) on every committed real-tool pair.

The crafted dumps of ``tests/fixtures/real/compare_outputs/verdict_rules/make_dumps.py`` (rebuilt
here from that file) probe each of the real tool's per-record rules in statistics and tensor
mode; the CSVs beside the script are what ``msprobe compare`` 26.2.0 wrote for them. The other
pairs are the real tool's compare of the fixture dumps (tests/fixtures/real/README.md)."""
from __future__ import annotations

import csv
import glob
import importlib.util
import os

import pytest

from msprobe.compare import compare

HERE = os.path.dirname(os.path.abspath(__file__))
REAL = os.path.join(os.path.dirname(HERE), "fixtures", "real")
OUTS = os.path.join(REAL, "compare_outputs")
VERDICTS = os.path.join(OUTS, "verdict_rules")


def _rows(path: str) -> list:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _same_verdicts(ours_path: str, real_path: str) -> None:
    """Every row the real tool wrote has our Result and Err_message (bench-only records, which
    26.2.0 does not list, are the only rows of ours it lacks)."""
    real = _rows(real_path)
    ours = [r for r in _rows(ours_path) if r["NPU Name"] != "N/A"]
    assert [r["NPU Name"] for r in ours] == [r["NPU Name"] for r in real]
    bad = [(r["NPU Name"], o["Result"], r["Result"], o["Err_message"], r["Err_message"])
           for o, r in zip(ours, real) if (o["Result"], o["Err_message"]) != (r["Result"], r["Err_message"])]
    assert not bad, f"{len(bad)} of {len(real)} rows differ, first: {bad[:5]}"


def _make(root: str, mode: str) -> None:
    spec = importlib.util.spec_from_file_location("make_verdict_dumps", os.path.join(VERDICTS, "make_dumps.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(root, mode)


@pytest.mark.parametrize("mode", ["statistics", "tensor", "md5"])
def test_crafted_verdicts_equal_real_tool(tmp_path, mode):
    _make(str(tmp_path), mode)
    s = compare(str(tmp_path / "target" / "step0"), str(tmp_path / "bench" / "step0"), str(tmp_path / "out"),
                plot=False, progress=False)
    assert s["mode"] == mode
    (real,) = glob.glob(os.path.join(VERDICTS, mode, "compare_result_*.csv"))
    _same_verdicts(s["pairs"][0]["files"][0], real)
    rows = {r["NPU Name"]: r for r in _rows(real)}
    if mode == "statistics":  # the rules this fixture pins down
        assert rows["Functional.out_06_in_0099.0.forward.output.0"]["Result"] == "error"
        assert rows["Functional.out_06_in_01.0.forward.output.0"]["Result"] == "pass"
        assert rows["Functional.out_inf.0.forward.output.0"]["Result"] == "error"
        assert rows["Tensor.to.0.forward.output.0"]["Result"] == "pass"
        assert rows["Functional.only_target.0.forward.output.0"]["Result"] == "pass"
    elif mode == "md5":  # a CRC-32 on one side only (unmatched) is a warning
        assert rows["Functional.only_target.0.forward.output.0"]["Result"] == "warning"
        assert rows["Tensor.to.0.forward.output.0"]["Result"] == "pass"
    else:
        # judged per record: a large MaxAbsErr with Cosine ~1 is no error by itself ...
        assert rows["Functional.out_ratio_mid.0.forward.output.0"]["Result"] == "pass"
        # ... the One Thousandth Err Ratio falling from the inputs to the outputs is
        assert rows["Functional.out_abs_big.0.forward.output.0"]["Result"] == "error"
        assert rows["Functional.in_off_out_far.0.forward.output.0"]["Result"] == "warning"


def _pairs() -> list:
    ms26, ms8 = os.path.join(REAL, "ms26"), os.path.join(REAL, "ms8")
    out = [(os.path.join(ms26, sc, "step0"), os.path.join(ms26, sc + "_perturbed", "step0"),
            os.path.join(OUTS, f"26.2.0_{sc}"), None) for sc in ("L1_statistics", "L1_md5", "L1_tensor")]
    out += [(os.path.join(ms8, sc), os.path.join(ms26, sc), os.path.join(OUTS, "cross_dialect", sc), 0)
            for sc in ("L0_statistics", "L1_statistics", "mix_statistics")]
    return out


@pytest.mark.parametrize("target,bench,real_dir,step", _pairs(), ids=lambda v: os.path.basename(str(v)))
def test_fixture_pairs_verdicts_equal_real_tool(tmp_path, target, bench, real_dir, step):
    s = compare(target, bench, str(tmp_path), step=step, plot=False, progress=False)
    (real,) = glob.glob(os.path.join(real_dir, "compare_result_*.csv"))
    _same_verdicts(s["pairs"][0]["files"][0], real)


def test_result_rule_pair_verdicts_equal_real_tool(tmp_path):
    rule = os.path.join(OUTS, "result_rule")
    spec = importlib.util.spec_from_file_location("make_rule_dumps", os.path.join(rule, "make_dumps.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(str(tmp_path))
    s = compare(str(tmp_path / "target" / "step0"), str(tmp_path / "bench" / "step0"), str(tmp_path / "out"),
                plot=False, progress=False)
    (real,) = glob.glob(os.path.join(rule, "compare_result_*.csv"))
    _same_verdicts(s["pairs"][0]["files"][0], real)


@pytest.mark.parametrize("mode,seed", [(m, s) for m in ("statistics", "tensor") for s in (1, 2, 3)])
def test_fuzzed_pairs_verdicts_equal_real_tool(tmp_path, mode, seed):
    """Randomly perturbed copies of the real L1 dumps (verdict_rules/fuzz_pairs.py, rebuilt here)
    against the originals: the rows nobody crafted get the real tool's verdicts too."""
    if mode == "tensor":
        pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("fuzz_pairs", os.path.join(VERDICTS, "fuzz_pairs.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    bench = os.path.join(REAL, "ms26", f"L1_{mode}", "step0")
    target = mod.main(bench, str(tmp_path / "t"), seed, mode)
    s = compare(target, bench, str(tmp_path / "out"), plot=False, progress=False)
    (real,) = glob.glob(os.path.join(VERDICTS, "fuzz", f"{mode}_{seed}", "compare_result_*.csv"))
    _same_verdicts(s["pairs"][0]["files"][0], real)
    assert set(s["pairs"][0]["results"]) != {"pass"}  # the perturbations do make warnings/errors
