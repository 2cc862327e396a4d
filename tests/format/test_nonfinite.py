"""NaN and +/-Inf told apart; the attention mask's intended -inf (masked_fill) is no anomaly —
in the classifier, in the demo's read-back and in compare's summary and output."""
from __future__ import annotations

import json
import math

import pytest

from msprobe.format.nonfinite import NonFiniteTracker, describe, stat_kinds

INF, NAN = math.inf, math.nan
MASK = (0.0, -INF, -INF, INF)  # what a causal mask built by masked_fill(-inf) dumps


def test_stat_kinds():
    assert stat_kinds((1.0, -1.0, 0.0, 2.0)) == frozenset()
    assert stat_kinds(MASK) == {"-inf"}  # the infinite Norm comes from the -inf
    assert stat_kinds((INF, 0.0, INF, INF)) == {"+inf"}
    assert stat_kinds((NAN, NAN, NAN, NAN)) == {"nan"}
    assert stat_kinds((1e4, -1e4, 0.0, INF)) == {"+inf"}  # finite tensor, its Norm overflowed
    assert stat_kinds(("3", None, None, None)) == frozenset()  # a str argument is no number
    # Max/Min carry a NaN element (NaN-propagating reductions): a NaN Mean under +inf/-inf ends is
    # the sum inf + -inf, no NaN element (a float16 matmul that overflowed both ways)
    assert stat_kinds((INF, -INF, NAN, INF)) == {"+inf", "-inf"}
    assert stat_kinds((NAN, NAN, NAN, NAN)) == {"nan"}
    assert stat_kinds((INF, 0.0, NAN, INF)) == {"+inf", "nan"}  # one infinite end cannot explain it
    assert stat_kinds((1.0, 0.0, NAN, 1.0)) == {"nan"}
    assert stat_kinds((None, None, NAN, None)) == {"nan"}


def test_tracker_tells_masks_from_anomalies():
    t = NonFiniteTracker()
    t.record("Tensor.masked_fill_.0.forward")
    assert t.see("input", "input.0", (0.0, 0.0, 0.0, 0.0), "torch.float32", [16, 16]) is None
    assert t.see("input", "input.2", (-INF,) * 4, "<class 'float'>", []) == "masked"  # the fill value
    assert t.see("output", "output.0", MASK, "torch.float32", [16, 16]) == "masked"
    # the same tensor passed on under another name is the mask still
    t.record("Torch.add.0.forward")
    assert t.see("input", "input.1", MASK, "torch.float32", [16, 16]) == "masked"
    assert t.see("output", "output.0", (3.0, -INF, -INF, INF), "torch.float32", [4, 16, 16]) == "masked"
    # an argument named *mask* holding -inf only
    t.record("Functional.scaled_dot_product_attention.0.forward")
    assert t.see("input_kwargs", "input_kwargs.attn_mask", (0.0, -INF, -INF, INF), "torch.float32", [8, 8]) == "masked"
    # -inf from a log(0) is an anomaly, so is +inf and NaN, even inside masked_fill
    t.record("Torch.log.0.forward")
    assert t.see("input", "input.0", (1.0, 0.0, 0.5, 3.0), "torch.float32", [9]) is None
    assert t.see("output", "output.0", (0.0, -INF, -INF, INF), "torch.float32", [9]) == "inf"
    t.record("Tensor.masked_fill.1.forward")
    assert t.see("output", "output.0", (INF, 0.0, INF, INF), "torch.float32", [9]) == "inf"
    assert t.see("output", "output.1", (NAN, NAN, NAN, NAN), "torch.float32", [9]) == "nan"
    assert t.counts == {"nan": 1, "inf": 2, "masked": 5}
    assert describe(t.counts) == ("NaN in 1 tensors, +/-Inf in 2 tensors (-inf only in masked_fill outputs and "
                                  "the masks they feed: 5 tensors, as intended)")
    assert describe({"nan": 0, "inf": 0, "masked": 0}) == "no NaN, no +/-Inf"


@pytest.fixture(scope="module")
def demo_dump(tmp_path_factory):
    pytest.importorskip("torch")
    from msprobe.demo import run_demo

    path = tmp_path_factory.mktemp("demo") / "dump"
    result = run_demo(str(path), steps=2, quiet=True)
    return str(path), result


def test_demo_reports_the_mask_as_intended(demo_dump, capsys):
    _, result = demo_dump
    assert result["ok"]
    assert result["nonfinite"]["nan"] == 0 and result["nonfinite"]["inf"] == 0
    # masked_fill's output and the attn_mask it feeds, in each of the 2 blocks, per step
    assert result["nonfinite"]["masked"] == 2 * 2 * 2


def test_compare_separates_nan_and_inf_and_leaves_the_mask_alone(demo_dump, tmp_path, capsys):
    from msprobe.cli import main

    path, _ = demo_dump
    assert main(["compare", path, path, "-o", str(tmp_path / "out"), "--no-plot"]) == 0
    text = capsys.readouterr().out
    assert "first NaN in target: none; first +/-Inf in target: none; -inf only in masked_fill outputs" in text
    with open(tmp_path / "out" / "summary.json", encoding="utf-8") as f:
        s = json.load(f)
    assert s["first_nan_inf_target"] is None and s["first_nan_target"] is None and s["first_inf_target"] is None
    assert s["masked_inf_target"] > 0 and s["masked_inf_bench"] == s["masked_inf_target"]


def test_compare_names_a_planted_inf_as_inf_not_nan(demo_dump, tmp_path):
    import shutil

    from msprobe.compare import compare

    path, _ = demo_dump
    planted = tmp_path / "planted"
    shutil.copytree(path, planted)
    doc_path = planted / "step0" / "rank" / "dump.json"
    doc = json.loads(doc_path.read_text())
    rec = "Functional.linear.0.forward"
    doc["data"][rec]["output"][0].update(Max=INF, Norm=INF)
    doc_path.write_text(json.dumps(doc))
    s = compare(str(planted), path, str(tmp_path / "out"), plot=False)
    assert s["first_nan_target"] is None
    assert s["first_inf_target"]["row"] == f"{rec}.output.0" and s["first_inf_target"]["kind"] == "inf"
    assert s["first_nan_inf_target"]["row"] == f"{rec}.output.0"
