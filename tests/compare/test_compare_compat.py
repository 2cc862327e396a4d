"""The real tool's compare command lines (8.x ``-f pytorch ... -i compare.json`` with -s/-c/-f/-dm,
26.x ``-tp/-gp`` on dump.json files), refused modes, and the warning for mostly unmatched dumps."""
from __future__ import annotations

import csv
import glob
import json
import os
import shutil

import pytest

from msprobe.cli import main
from msprobe.compare import compare
from msprobe.errors import ConfigError

HERE = os.path.dirname(os.path.abspath(__file__))
REAL = os.path.join(os.path.dirname(HERE), "fixtures", "real")
MS26 = os.path.join(REAL, "ms26")
STATS = os.path.join(MS26, "L1_statistics", "step0")
PERT = os.path.join(MS26, "L1_statistics_perturbed", "step0")


def _rank(step: str) -> str:
    (d,) = os.listdir(step)
    return os.path.join(step, d)


def _csv(out: str) -> list:
    (f,) = glob.glob(os.path.join(out, "compare_result_*.csv"))
    with open(f, newline="", encoding="utf-8") as fh:
        return list(csv.reader(fh))


@pytest.mark.parametrize("fw", ["pytorch", "mindspore"])
def test_framework_flag_of_8x_is_accepted(tmp_path, fw):
    assert main(["-f", fw, "compare", STATS, PERT, "-o", str(tmp_path), "--no-plot", "--no-progress"]) == 0
    assert main(["--framework", fw, "validate", STATS, "--quiet"]) == 0
    with pytest.raises(SystemExit) as e:
        main(["-f", "tensorflow", "compare", STATS, PERT])
    assert e.value.code == 2


def test_tp_gp_take_dump_json_files(tmp_path):
    a, b = str(tmp_path / "dirs"), str(tmp_path / "files")
    assert main(["compare", "-tp", STATS, "-gp", PERT, "-o", a, "--no-plot", "--no-progress"]) == 0
    assert main(["compare", "-tp", os.path.join(_rank(STATS), "dump.json"), "-gp",
                 os.path.join(_rank(PERT), "dump.json"), "-o", b, "--no-plot", "--no-progress"]) == 0
    assert _csv(a) == _csv(b)
    assert main(["validate", os.path.join(_rank(STATS), "dump.json"), "--quiet"]) == 0


def _copy(src: str, dst: str) -> str:
    shutil.copytree(src, dst)
    return dst


def test_compare_json_stack_and_compare_only(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _copy(_rank(STATS), "npu_dump")
    _copy(_rank(PERT), "bench_dump")
    with_stack = {"npu_path": "./npu_dump/dump.json", "bench_path": "./bench_dump/dump.json",
                  "stack_path": "./npu_dump/stack.json", "is_print_compare_log": True}
    with open("compare.json", "w") as f:
        json.dump(with_stack, f)
    assert main(["-f", "pytorch", "compare", "-i", "./compare.json", "-o", "./with_s", "-s", "--no-plot"]) == 0
    assert _csv("with_s")[0][-1] == "NPU_Stack_Info"
    # a stack_path and no -s: no stack column (8.x)
    assert main(["-f", "pytorch", "compare", "-i", "./compare.json", "-o", "./no_s", "--no-plot"]) == 0
    rows = _csv("no_s")
    assert rows[0][-1] == "Err_message" and "NPU_Stack_Info" not in rows[0]
    assert [r[:-1] for r in _csv("with_s")] == rows
    # no stack_path: stacks shown when the dump has them, -s or not
    del with_stack["stack_path"]
    with open("compare.json", "w") as f:
        json.dump(with_stack, f)
    capsys.readouterr()
    assert main(["-f", "pytorch", "compare", "-i", "./compare.json", "-o", "./auto", "-c", "--no-plot"]) == 0
    assert _csv("auto")[0][-1] == "NPU_Stack_Info"
    assert "first divergence" not in capsys.readouterr().out  # -c: the table only, no analysis


def test_compare_json_with_comments_and_step_dirs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _copy(STATS, "npu_dump/step0")
    _copy(PERT, "bench_dump/step0")
    with open("compare.json", "w") as f:  # the docs' multi-card example, comments included
        f.write('{\n"npu_path": "./npu_dump/step0",  # to the step level\n'
                '"bench_path": "./bench_dump/step0",  # to the step level\n"is_print_compare_log": true\n}\n')
    assert main(["-f", "pytorch", "compare", "-i", "./compare.json", "-o", "./output", "-s", "--no-plot"]) == 0
    assert len(_csv("output")) == 225


def test_compare_json_errors(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open("bad.json", "w") as f:
        f.write('{"npu_path": "./x"}')
    assert main(["compare", "-i", "bad.json", "-o", "o"]) == 1
    assert "'bench_path' (a dump.json file or a step directory) is required" in capsys.readouterr().err
    with open("c.json", "w") as f:
        json.dump({"npu_path": STATS, "bench_path": PERT, "stack_path": "./nope/stack.json"}, f)
    assert main(["compare", "-i", "c.json", "-o", "o"]) == 1
    assert "stack_path ./nope/stack.json does not exist" in capsys.readouterr().err
    for flag in ("-am", "-cm"):  # the cross-framework mappings parse; the compare.json is still checked
        assert main(["-f", "mindspore", "compare", "-i", "c.json", "-o", "o", "-s", flag]) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "stack_path ./nope/stack.json does not exist" in err
    for flag in ("-am", "-cm", "-lm"):  # a mapping file that does not exist: one line
        assert main(["-f", "mindspore", "compare", "-i", "c.json", "-o", "o", "-s", flag, "nope.yaml"]) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "nope.yaml" in err


def _renamed(root: str, src: str, renames: dict) -> str:
    dst = _copy(src, root)
    path = os.path.join(_rank(dst), "dump.json")
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    doc["data"] = {renames.get(k, k): v for k, v in doc["data"].items()}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
    return dst


def test_fuzzy_match_and_data_mapping(tmp_path, capsys):
    # the target calls linear once more before: its counts are shifted by one
    renames = {"Functional.linear.0.forward": "Functional.linear.5.forward",
               "Functional.leaky_relu.0.forward": "Functional.leaky_relu.9.forward"}
    target = _renamed(str(tmp_path / "t"), STATS, renames)
    out = str(tmp_path / "plain")
    s = compare(target, PERT, out, plot=False, progress=False, structural=False)
    assert s["pairs"][0]["unmatched_records"] == 2
    s = compare(target, PERT, str(tmp_path / "fuzzy"), plot=False, progress=False, structural=False, fuzzy=True)
    p = s["pairs"][0]
    assert p["unmatched_records"] == 0 and p["matched_by"]["fuzzy"] == 2
    rows = {r[0]: r[1] for r in _csv(str(tmp_path / "fuzzy"))[1:]}
    assert rows["Functional.linear.5.forward.input.0"] == "Functional.linear.0.forward.input.0"
    # -dm: rows named one by one
    with open(tmp_path / "data_mapping.yaml", "w") as f:
        f.write("# rows\nFunctional.linear.5.forward.input.0: Functional.linear.0.forward.input.0\n"
                "Functional.linear.5.forward.output.0: Functional.linear.0.forward.output.0\n")
    out = str(tmp_path / "dm")
    assert main(["compare", "-tp", target, "-gp", PERT, "-o", out, "--no-plot", "--match", "names",
                 "-dm", str(tmp_path / "data_mapping.yaml")]) == 0
    rows = {r[0]: r for r in _csv(out)[1:]}
    assert rows["Functional.linear.5.forward.input.0"][1] == "Functional.linear.0.forward.input.0"
    assert rows["Functional.linear.5.forward.output.0"][1] == "Functional.linear.0.forward.output.0"
    assert rows["Functional.linear.5.forward.output.0"][8] != "N/A"  # compared: Max diff is a number
    assert rows["Functional.linear.5.forward.input.1"][1] == "N/A"  # not in the mapping
    with open(tmp_path / "bad.yaml", "w") as f:
        f.write("- a\n- b\n")
    capsys.readouterr()
    assert main(["compare", target, PERT, "-o", out, "-dm", str(tmp_path / "bad.yaml")]) == 1
    assert "expected 'target row name: bench row name' lines" in capsys.readouterr().err


def test_forced_mode_the_dumps_cannot_support_is_refused(tmp_path, capsys):
    md5 = os.path.join(MS26, "L1_md5", "step0")
    tensor = os.path.join(MS26, "L1_tensor", "step0")
    with pytest.raises(ConfigError, match="--mode md5: the target dump .* holds no md5"):
        compare(STATS, PERT, str(tmp_path / "a"), mode="md5", plot=False)
    with pytest.raises(ConfigError, match="--mode tensor: the target dump .* holds no tensor files"):
        compare(STATS, PERT, str(tmp_path / "b"), mode="tensor", plot=False)
    with pytest.raises(ConfigError, match="--mode tensor: the bench dump"):
        compare(tensor, STATS, str(tmp_path / "c"), mode="tensor", plot=False)
    assert main(["compare", STATS, PERT, "-o", str(tmp_path / "d"), "--mode", "md5"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("msprobe compare: error: --mode md5")
    # modes the dumps do support
    assert compare(md5, md5, str(tmp_path / "e"), mode="md5", plot=False)["mode"] == "md5"
    assert compare(tensor, tensor, str(tmp_path / "f"), mode="tensor", plot=False)["mode"] == "tensor"
    assert compare(md5, md5, str(tmp_path / "g"), mode="statistics", plot=False)["mode"] == "statistics"


def test_mostly_unmatched_dumps_warn(tmp_path, capsys):
    other = os.path.join(MS26, "list_models")
    steps = sorted(os.listdir(other))
    assert main(["compare", STATS, os.path.join(other, steps[0]), "-o", str(tmp_path / "a"), "--no-plot",
                 "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "msprobe compare: warning: step 0" in err and "target records matched a bench record" in err
    s = json.load(open(tmp_path / "a" / "summary.json"))
    assert s["warnings"] and s["pairs"][0]["matched_records"] < s["pairs"][0]["records"] / 2
    assert main(["compare", STATS, PERT, "-o", str(tmp_path / "b"), "--no-plot", "--no-progress"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_merge_result_errors_and_undefined_metrics(tmp_path, capsys):
    pytest.importorskip("openpyxl")
    import openpyxl

    from msprobe.compare.merge import merge_result

    ms8 = os.path.join(REAL, "ms8", "distributed_2rank")
    out = str(tmp_path / "in")
    compare(ms8, os.path.join(MS26, "distributed_2rank"), out, plot=False, progress=False)
    (r1,) = glob.glob(os.path.join(out, "compare_result_rank1_*.csv"))
    with open(r1, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    col = rows[0].index("NormRelativeErr")
    (hit,) = [r for r in rows if r[0] == "Distributed.all_reduce.0.forward.output.0"]
    hit[col] = "N/A"  # as for a metric that cannot be computed
    with open(r1, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("api:\n- Distributed.all_reduce.0.forward\n")
    s = merge_result(out, str(tmp_path / "o"), str(cfg), timestamp="T")
    assert s["mode"] == "statistics" and s["ranks"] == [0, 1] and s["metrics"][0] == "Max diff"
    ws = openpyxl.load_workbook(s["file"])["NormRelativeErr"]
    cells = {r[0]: r[1:] for r in ws.iter_rows(min_row=2, values_only=True)}
    assert cells and all(n.startswith("Distributed.all_reduce.0.forward.") for n in cells)
    # a metric that cannot be computed shows both sides' max instead
    got = cells["Distributed.all_reduce.0.forward.output.0"][1]
    assert got.startswith("NPU:'") and "Bench:'" in got
    assert not str(cells["Distributed.all_reduce.0.forward.output.0"][0]).startswith("NPU:")
    cfg.write_text("compare_index: [Max diff]\n")
    assert main(["merge_result", "-i", out, "-o", str(tmp_path / "o"), "-config", str(cfg)]) == 1
    assert "'api' (a list of API or module names) is required" in capsys.readouterr().err
    cfg.write_text("api: [Distributed]\ncompare_index: [Cosine]\n")
    assert main(["merge_result", "-i", out, "-o", str(tmp_path / "o"), "-config", str(cfg)]) == 1
    assert "compare_index ['Cosine'] are not statistics metrics" in capsys.readouterr().err
    assert main(["merge_result", "-i", str(tmp_path), "-o", str(tmp_path / "o"), "-config", str(cfg)]) == 1
    assert "no compare_result_rank<N>_<timestamp>.csv/.xlsx files" in capsys.readouterr().err


def test_default_output_directory_is_the_real_tools(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["compare", "-tp", STATS, "-gp", PERT, "--no-plot", "--no-progress"]) == 0
    assert len(glob.glob("output/compare_result_*.csv")) == 1  # 26.x and 8.x default: ./output
