"""The first divergence passes over rows that only 26.2.0's 10x rule flags at float round-off.

26.2.0's rule "the norm relative error of output is 10 times that of input" has no floor: an output
7.2e-07 off over an input 6.4e-08 off (a fused attention's backward summed in another order, two
healthy context-parallel pairs of bench/bench_layouts.py) is a ``warning``. The CSV keeps it
(26.2.0's Result column, byte for byte); the first divergence (printed ``first divergence:``,
summary.json's ``first_divergence``, ``--fail-on-divergence``) passes over such a row when every
output of its record is within the dtype's round-off floor
(:data:`msprobe.compare._verdict.ROUNDOFF_FLOOR`), and still reports a real divergence."""
from __future__ import annotations

import csv
import json
import os

from msprobe.cli import main
from msprobe.compare import compare
from msprobe.compare._verdict import MSG_NORM_10X, ROUNDOFF_RULE, roundoff_floor

BENCH_NORM = 10.0


def _t(rel: float, dtype: str = "torch.float32") -> dict:
    """A tensor's statistics whose Norm is ``rel`` (relative) off the bench's; the rest equal."""
    return {"type": "torch.Tensor", "dtype": dtype, "shape": [4, 8], "Max": 1.0, "Min": -1.0, "Mean": 0.125,
            "Norm": BENCH_NORM * (1 + rel), "requires_grad": False}


def _write(root: str, records: dict) -> str:
    """An L1 statistics dump of ``records`` ({name: (input relative errors, output relative errors,
    dtype)}); returns its step directory."""
    data = {name: {"input_args": [_t(r, dtype) for r in ins], "input_kwargs": {},
                   "output": [_t(r, dtype) for r in outs]} for name, (ins, outs, dtype) in records.items()}
    rank = os.path.join(root, "step0", "rank0")
    os.makedirs(rank)
    with open(os.path.join(rank, "dump.json"), "w", encoding="utf-8") as f:
        json.dump({"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None,
                   "data": data}, f, indent=1)
    with open(os.path.join(rank, "stack.json"), "w", encoding="utf-8") as f:
        f.write("{}")
    return os.path.join(root, "step0")


def _pair(tmp_path, name: str, target: dict) -> tuple:
    """(target, bench) step directories: the bench has every statistic exact."""
    bench = {record: ([0.0] * len(ins), [0.0] * len(outs), dtype) for record, (ins, outs, dtype) in target.items()}
    return _write(str(tmp_path / name / "t"), target), _write(str(tmp_path / name / "b"), bench)


def _results(summary: dict) -> dict:
    with open(summary["pairs"][0]["files"][0], newline="", encoding="utf-8") as f:
        return {row["NPU Name"]: (row["Result"], row["Err_message"]) for row in csv.DictReader(f)}


#: float32 round-off: the cp pairs' figures (output 7.2e-07 off, input 6.4e-08: ratio 11)
ROUNDOFF = {"Functional.linear.0.forward": ([6.4e-08, 0.0], [7.2e-07], "torch.float32"),
            # float16 accumulation: 5e-3 off over 1e-4 (below the 1e-2 floor of the 16-bit floats)
            "Functional.linear.1.forward": ([1e-4, 0.0], [5e-3], "torch.float16")}


def test_roundoff_rows_keep_their_result_but_are_no_divergence(tmp_path, capsys):
    t, b = _pair(tmp_path, "roundoff", ROUNDOFF)
    s = compare(t, b, str(tmp_path / "out"), plot=False, progress=False)
    rows = _results(s)
    warned = json.dumps([MSG_NORM_10X])
    # the Result column is 26.2.0's: the 10x rule fires on both
    assert rows["Functional.linear.0.forward.output.0"] == ("warning", warned)
    assert rows["Functional.linear.1.forward.output.0"] == ("warning", warned)
    # ... the first divergence passes over them, and says so
    assert s["first_divergence"] is None
    assert s["divergence"] == ROUNDOFF_RULE
    with open(os.path.join(str(tmp_path / "out"), "summary.json"), encoding="utf-8") as f:
        assert json.load(f)["first_divergence"] is None
    # the command line: no answer printed, the rule under it, and --fail-on-divergence passes
    assert main(["compare", t, b, "-o", str(tmp_path / "cli"), "--no-plot", "--fail-on-divergence"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("first divergence: none")
    assert lines[at + 1] == f"  ({ROUNDOFF_RULE})"
    # the lake's diverge takes compare's answer
    assert main(["lake", "diverge", str(tmp_path / "roundoff"), "t", "b", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["first_divergence"] is None


def test_a_real_divergence_after_roundoff_is_still_reported(tmp_path, capsys):
    target = dict(ROUNDOFF)
    # 1e-3 off over an input 7.2e-07 off: above every floor of float32
    target["Functional.gelu.0.forward"] = ([7.2e-07], [1e-3], "torch.float32")
    t, b = _pair(tmp_path, "real", target)
    s = compare(t, b, str(tmp_path / "out"), plot=False, progress=False)
    fd = s["first_divergence"]
    assert (fd["row"], fd["result"]) == ("Functional.gelu.0.forward.output.0", "warning")
    assert main(["compare", t, b, "-o", str(tmp_path / "cli"), "--no-plot", "--fail-on-divergence"]) == 3
    assert "first divergence: Functional.gelu.0.forward.output.0 (step 0, " in capsys.readouterr().out


def test_a_record_with_one_output_beyond_roundoff_is_reported(tmp_path):
    """The 10x rule marks the record's first output row; its own Norm is round-off, the second
    output's is not: the record is a divergence."""
    t, b = _pair(tmp_path, "two", {"Functional.split.0.forward": ([1e-9], [2e-8, 1e-3], "torch.float32")})
    s = compare(t, b, str(tmp_path / "out"), plot=False, progress=False)
    assert s["first_divergence"]["row"] == "Functional.split.0.forward.output.0"


def test_integers_have_no_roundoff_and_a_threshold_ignores_the_floor(tmp_path):
    t, b = _pair(tmp_path, "int", {"Functional.cumsum.0.forward": ([1e-9], [1e-6], "torch.int64")})
    s = compare(t, b, str(tmp_path / "out"), plot=False, progress=False)
    assert s["first_divergence"]["row"] == "Functional.cumsum.0.forward.output.0"
    # --divergence-threshold is the user's own rule: the first row above it, whatever its Result
    t, b = _pair(tmp_path, "thr", ROUNDOFF)
    s = compare(t, b, str(tmp_path / "thr_out"), plot=False, progress=False, threshold=1e-3)
    assert s["first_divergence"]["row"] == "Functional.linear.1.forward.output.0"


def test_floors_by_dtype():
    assert roundoff_floor("torch.float32") == roundoff_floor("Float32") == 2.0 ** -16
    assert roundoff_floor("torch.bfloat16") == roundoff_floor("torch.float16") == roundoff_floor("BFloat16") == 1e-2
    assert roundoff_floor("torch.float64") == 2.0 ** -45
    assert roundoff_floor("torch.int64") == roundoff_floor("torch.bool") == roundoff_floor("N/A") == 0.0


def test_the_explorer_marks_the_same_first_divergence(tmp_path):
    """msprobe view's cell first divergence follows compare's rule: none on the round-off pair, the
    real divergence after it on the other."""
    from msprobe.view import open_view

    for name, target, want in (("roundoff", ROUNDOFF, None),
                               ("real", dict(ROUNDOFF, **{"Functional.gelu.0.forward": ([7.2e-07], [1e-3],
                                                                                       "torch.float32")}),
                                "Functional.gelu.0.forward.output.0")):
        t, b = _pair(tmp_path, name, target)
        with open_view(t, b) as view:
            cells = view.overview()["cells"]
            assert [cell["first_div_name"] for cell in cells] == [want], (name, cells)
