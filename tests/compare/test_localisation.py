"""Where compare and the lake say precision breaks (issue 29): real training runs of a small
transformer with a known fault (bench/faults.py), compared with the healthy run through the CLI."""
from __future__ import annotations

import json
import os
import sys

import pytest

from msprobe.cli import main
from msprobe.compare._verdict import ROUNDOFF_RULE

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench"))

import faults  # noqa: E402


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for kind in ("none", "weight_scale", "nan"):
        faults.run("gpt", kind, str(root / kind))
    return root


def _json(capsys, argv: list) -> dict:
    capsys.readouterr()
    assert main(argv + ["--json", "--no-plot"]) == 0
    return json.loads(capsys.readouterr().out)


def test_first_divergence_is_the_earliest_step(runs, tmp_path, capsys):
    """The earliest step first, then the lowest record index: the NaN enters at step 1, the
    scaled weight at step 0 (today's code took the lowest record index over all steps)."""
    s = _json(capsys, ["compare", str(runs / "nan"), str(runs / "none"), "-o", str(tmp_path / "a")])
    assert s["first_divergence"]["step"] == 1
    assert s["first_nan_target"]["step"] == 1
    s = _json(capsys, ["compare", str(runs / "weight_scale"), str(runs / "none"), "-o", str(tmp_path / "b")])
    assert s["first_divergence"]["step"] == 0
    s = _json(capsys, ["compare", str(runs / "weight_scale"), str(runs / "none"), "-o", str(tmp_path / "c"),
                       "--divergence-threshold", "1e-4"])
    assert s["first_divergence"]["step"] == 0
    # the lake picks by the same rule
    assert main(["lake", "diverge", str(runs), "weight_scale", "none"]) == 0
    out = capsys.readouterr().out
    assert "first divergence: step 0 " in out and "error enters at: step 0 " in out


def test_first_divergence_names_where_the_error_is_introduced(runs, tmp_path, capsys):
    """The scaled weight's own linear (its input.1, 5 % off), not the downstream op that 26.2.0's
    Result rule flags; both are printed."""
    tgt, ref = str(runs / "weight_scale"), str(runs / "none")
    s = _json(capsys, ["compare", tgt, ref, "-o", str(tmp_path / "a")])
    o = s["origin"]
    assert (o["record"], o["argument"], o["role"], o["step"]) == ("Functional.linear.6.forward", "input.1",
                                                                 "parameter", 0)
    assert o["size"] == pytest.approx(0.05, rel=1e-3)
    # the Result column is 26.2.0's: the scaled weight's rows pass
    assert s["first_divergence"]["record"] != "Functional.linear.6.forward"
    assert main(["compare", tgt, ref, "-o", str(tmp_path / "b"), "--no-plot"]) == 0
    out = capsys.readouterr().out
    # each answer under its own name: where the error enters, then the Result column's first divergence
    lines = out.splitlines()
    at = lines.index("error enters at: Functional.linear.6.forward input.1 (parameter, 5% off the bench); step 0, "
                     "rank, record #61")
    assert lines[at + 1].startswith(f"first divergence: {s['first_divergence']['row']} (step 0"), lines
    assert lines[at + 2] == f"  ({ROUNDOFF_RULE})", lines
    s = _json(capsys, ["compare", str(runs / "nan"), ref, "-o", str(tmp_path / "c")])
    assert (s["origin"]["row"], s["origin"]["step"]) == ("Functional.linear.6.forward.input.1", 1)


@pytest.fixture(scope="module")
def full_mask_runs(tmp_path_factory):
    """The transformer whose causal mask is ``torch.full((t, t), -inf).triu(1)``: healthy, and with
    a NaN weight element before step 1."""
    root = tmp_path_factory.mktemp("full_mask")
    for kind in ("none", "nan"):
        faults.run("tfm", kind, str(root / kind))
    return root


def test_masks_minus_inf_is_no_nan_inf_in_compare_and_lake(full_mask_runs, tmp_path, capsys):
    """One rule for compare and lake nan: Torch.full's -inf and what it feeds are the mask's."""
    root = full_mask_runs
    s = _json(capsys, ["compare", str(root / "none"), str(root / "none"), "-o", str(tmp_path / "a")])
    assert s["first_inf_target"] is None and s["first_nan_target"] is None and s["masked_inf_target"] > 0
    assert main(["lake", "nan", str(root)]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith(("nan ", "none "))]
    assert len(lines) == 1 and "Functional.linear.6.forward" in lines[0] and " nan " in lines[0], out
    assert "note: none rank: -inf only in attention masks" in out
    capsys.readouterr()
    assert main(["lake", "nan", str(root), "--kind", "nan", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["run"], r["step"], r["record"], r["arg_path"], r["kind"]) for r in rows] == [
        ("nan", 1, "Functional.linear.6.forward", "input_args.1", "nan")]
    assert rows[0]["nan_rows"] > 0 and rows[0]["inf_rows"] == 0 and rows[0]["masked_rows"] > 0
    assert main(["lake", "nan", str(root), "--kind", "inf"]) == 0
    assert "no Inf in any statistic" in capsys.readouterr().out


def test_trend_of_a_glob_draws_each_record(runs, tmp_path, capsys):
    """lake trend: one column (and line) per matched record, the gradient's weight by default,
    integer steps, NaN drawn; too wide a glob is refused."""
    rec = "Module.blocks.*.fc.Linear.parameters_grad"
    png = str(tmp_path / "t.png")
    capsys.readouterr()
    assert main(["lake", "trend", str(runs), rec, "--run", "nan", "--plot", png]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{rec} weight.0 norm by step (3 records):"), out
    for i in range(3):
        assert f"Module.blocks.{i}.fc.Linear.parameters_grad" in out
    lines = out.splitlines()
    step_rows = [ln.split() for ln in lines if ln[:1].isdigit()]
    assert [r[0] for r in step_rows] == ["0", "1", "2"] and all(len(r) == 4 for r in step_rows)
    assert step_rows[1][1:] == ["NaN"] * 3  # the NaN weight's gradients at step 1
    assert os.path.getsize(png) > 0
    assert main(["lake", "trend", str(runs), "Module.blocks.1.fc.Linear.forward.0", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["arg"] == "output.0" and {r["step"] for r in doc["rows"]} == {0, 1, 2}
    assert main(["lake", "trend", str(runs), "Module.blocks.*"]) == 1
    assert "matches 48 records" in capsys.readouterr().err


def test_run_ut_passes_a_healthy_fp32_run(full_mask_runs, tmp_path, capsys):
    """A healthy fp32 CPU training step (Adam's addcdiv_/addcmul_, a torch.full(-inf) mask):
    every API passes; none is SKIPped for its -inf."""
    import csv
    import glob

    from msprobe.run_ut.standards import ABSOLUTE, BENCHMARK, algorithm_of

    assert [algorithm_of(a) for a in ("addcdiv_", "addcmul", "rsqrt", "lerp_", "__truediv__")] == [
        BENCHMARK, BENCHMARK, BENCHMARK, BENCHMARK, ABSOLUTE]
    dump = str(full_mask_runs / "none" / "step0" / "rank" / "dump.json")
    assert main(["run_ut", "-api_info", dump, "-o", str(tmp_path), "--no-progress"]) == 0
    (res,) = glob.glob(str(tmp_path / "accuracy_checking_result_*.csv"))
    with open(res, encoding="utf-8-sig") as f:
        rows = list(csv.DictReader(f))
    bad = [(r["API name"], r["Forward Test Success"], r["Message"][:80]) for r in rows
           if r["Forward Test Success"] != "pass"]
    assert len(rows) > 300 and bad == []
    assert any(r["API name"].startswith("Torch.full.") for r in rows)


def test_xlsx_holds_numbers_and_colours_flagged_rows(runs, tmp_path, capsys):
    """--xlsx: the metric and statistics cells are numbers (percentages as fractions), error rows
    red and warning rows yellow."""
    import openpyxl

    from msprobe.compare._core import XLSX_FILLS

    seen: dict = {}
    for kind in ("nan", "weight_scale"):  # error rows, warning rows
        out = tmp_path / kind
        assert main(["compare", str(runs / kind), str(runs / "none"), "-o", str(out), "--no-plot", "--xlsx",
                     "--step", "1" if kind == "nan" else "0"]) == 0
        (path,) = [p for p in out.iterdir() if p.suffix == ".xlsx"]
        ws = openpyxl.load_workbook(path).active
        head = [c.value for c in ws[1]]
        res, nre, mx = head.index("Result"), head.index("NormRelativeErr"), head.index("NPU max")
        for row in ws.iter_rows(min_row=2):
            seen.setdefault(row[res].value, row)
    assert {"pass", "warning", "error"} <= set(seen), set(seen)
    for result, row in seen.items():
        want = XLSX_FILLS.get(result)
        assert all((c.fill.fgColor.rgb[-6:] if c.fill.fill_type == "solid" else None) == want for c in row), result
    num = [r for r in ws.iter_rows(min_row=2) if isinstance(r[mx].value, float)]
    assert num and all(isinstance(r[head.index("Max diff")].value, (int, float)) for r in num[:50])
    pct = [r[nre] for r in ws.iter_rows(min_row=2) if isinstance(r[nre].value, float)]
    assert pct and pct[0].number_format.endswith("%")


def test_localisation_benchmark_small(tmp_path):
    """The small version of bench/bench_localisation.py: the MLP with each fault kind; compare,
    lake diverge, lake nan and run_ut name the injected place (record, step, rank) first, and a
    healthy run gives run_ut and lake nan nothing to report."""
    import bench_localisation as B

    scores = B.bench(str(tmp_path), ["mlp"], list(faults.KINDS), real=False)
    tools = ("compare", "compare_nan", "lake_diverge", "lake_nan", "run_ut")
    misses = {(k, t): (s.get(f"{t}_named") or s.get("run_ut_errors")) for k, s in scores.items() for t in tools
              if s.get(t) is False}
    assert not misses, misses
    assert sum(1 for s in scores.values() for t in tools if s.get(t)) == len(faults.KINDS) * 2 + 2 + 2 + 1
    assert scores["mlp/healthy"]["run_ut_clean"] and scores["mlp/healthy"]["lake_nan_clean"]


def _run_ut_errors(dump: str, out) -> list:
    """The APIs (less their call count) bench_localisation's run_ut lists as errors."""
    import csv
    import glob

    import bench_localisation as B

    errors = B._run_ut_errors(dump, str(out))
    (res,) = glob.glob(str(out / "accuracy_checking_result_*.csv"))
    with open(res, encoding="utf-8-sig") as f:
        assert sum(1 for _ in csv.DictReader(f)) > 100
    return sorted({e.rsplit(".", 1)[0] for e in errors})


@pytest.mark.parametrize("model,api", [("llama", "Functional.silu"), ("bert", "Functional.gelu")])
def test_run_ut_on_transformers_models(model, api, tmp_path):
    """Hugging Face models (bench/faults.py's llama and bert: transformers built from tiny configs):
    run_ut names the one API computed in bfloat16 and nothing else, and passes the healthy run.
    A fresh model's activations are below 0.3, so the docs' rule alone (max abs error < 0.001)
    passed the wrong silu; and BERT's key-projection bias gradient (zero in exact arithmetic, noise
    near 1e-14) failed the cosine rule in the healthy run."""
    for kind in ("none", "api_wrong"):
        faults.run(model, kind, str(tmp_path / kind), task="tensor")
    healthy = _run_ut_errors(str(tmp_path / "none" / "step0" / "rank" / "dump.json"), tmp_path / "ut_none")
    wrong = _run_ut_errors(str(tmp_path / "api_wrong" / "step0" / "rank" / "dump.json"), tmp_path / "ut_wrong")
    assert healthy == [] and wrong == [api]


def test_first_inf_and_first_nan_of_a_float16_overflow(tmp_path, capsys):
    """A transformers Llama whose layer-1 up_proj overflows float16 both ways: that linear's output
    has Max +inf, Min -inf and a NaN Mean (the sum inf + -inf), but no NaN element; the first NaN
    element is in the next linear (down_proj). Compare and the lake name the up_proj call as the
    first Inf and the down_proj call as the first NaN (they once called the up_proj output the
    first NaN, and found no Inf at all)."""
    import subprocess

    import msprobe.lake

    script = os.path.join(HERE, "overflow_llama.py")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(HERE)))
    for name, scale in (("bad", "1e6"), ("good", "1")):
        r = subprocess.run([sys.executable, script, str(tmp_path / "lake" / name), scale], env=env,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
    s = _json(capsys, ["compare", str(tmp_path / "lake" / "bad"), str(tmp_path / "lake" / "good"),
                       "-o", str(tmp_path / "cmp")])
    linears = ("Functional.linear.12.forward", "Functional.linear.13.forward")  # layer 1's up_proj, down_proj
    assert (s["first_inf_target"]["record"], s["first_inf_target"]["step"]) == (linears[0], 0)
    assert (s["first_nan_target"]["record"], s["first_nan_target"]["step"]) == (linears[1], 0)
    import bench_localisation as B

    flat = B._parents(str(tmp_path / "lake" / "bad" / "step0" / "rank"))
    assert flat[linears[0]].startswith("Module.model.layers.1.mlp.up_proj.")
    assert flat[linears[1]].startswith("Module.model.layers.1.mlp.down_proj.")
    with msprobe.lake.open(str(tmp_path / "lake")) as lake:
        for kind, want in (("nan", linears[1]), ("inf", linears[0])):
            df = lake.first_nan(run="bad", kind=kind).sort_values(["step", "seq"])
            assert (df.iloc[0]["record"], int(df.iloc[0]["step"])) == (want, 0), kind
