"""Every command line of the real tool's 8.1.1 docs 07, 08, 10 and 11 (and 26.x's compare) runs
as written, on our dumps, in a directory laid out as the docs assume (``./compare.json``,
``./npu_dump/dump.json``, ``./dump_path/step0/rank0/dump.json``, ...).

The only edits are the docs' placeholders: ``{step_number}``/``{rank_number}`` -> 0,
``{timestamp}`` -> the run's timestamp, ``/home/xxx/`` -> the test directory. Every line exits 0
and writes what the docs say it writes, the MindSpore cross-framework mappings (``-am``, ``-cm``,
``-lm``) included (tests/compare/test_compare_xframe.py compares real MindSpore/PyTorch pairs).
"""
from __future__ import annotations

import glob
import json
import os
import shlex
import shutil

import pytest

pytest.importorskip("torch")

from msprobe.cli import main

REAL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "real")
MS26, MS8 = os.path.join(REAL, "ms26"), os.path.join(REAL, "ms8")

#: (doc, line): the command lines as the docs print them
COMPARE_LINES = [
    ("10", "msprobe -f pytorch compare -i ./compare.json -o ./output -s"),
    ("10", "msprobe -f pytorch compare -i ./compare.json -o ./output -s -dm data_mapping.yaml"),
    ("10", "msprobe -f pytorch compare -i ./compare.json -o ./output"),
    ("11", "msprobe -f mindspore compare -i ./compare.json -o ./output -s"),
    ("11", "msprobe -f mindspore compare -i ./compare.json -o ./output"),
    ("11", "msprobe -f mindspore compare -i ./compare.json -o ./output -s -dm data_mapping.yaml"),
    ("26", "msprobe compare -tp ./npu_dump/dump.json -gp ./bench_dump/dump.json -o ./output"),
]
XFRAME_LINES = [
    ("11", "msprobe -f mindspore compare -i ./compare.json -o ./output -s -am"),
    ("11", "msprobe -f mindspore compare -i ./compare.json -o ./output -s -am api_mapping.yaml"),
    ("11", "msprobe -f mindspore compare -i ./compare.json -o ./output -s -cm"),
    ("11", "msprobe -f mindspore compare -i ./compare.json -o ./output -s -cm cell_mapping.yaml"),
    ("11", "msprobe -f mindspore compare -i ./compare.json -o ./output -s -lm layer_mapping.yaml"),
]
RUN_UT_LINES = [
    ("07", "msprobe -f pytorch run_ut -api_info ./dump_path/step{step_number}/rank{rank_number}/dump.json"),
    ("07", "msprobe -f pytorch run_ut -api_info ./dump_path/step{step_number}/rank{rank_number}/dump.json "
           "-save_error_data"),
    ("07", "msprobe -f pytorch multi_run_ut -api_info ./dump_path/step{step_number}/rank{rank_number}/dump.json "
           "-n 32 -d 0 1 2 3"),
]
RESUME_LINE = ("07", "msprobe -f pytorch run_ut -api_info ./dump_path/step{step_number}/rank{rank_number}/dump.json "
                     "-csv_path /home/xxx/ut/accuracy_checking_result_{timestamp}.csv")
PRECISION_LINE = ("07", "msprobe -f pytorch api_precision_compare -npu /home/xxx/npu/accuracy_checking_details_"
                        "{timestamp}.csv -gpu /home/xxx/gpu/accuracy_checking_details_{timestamp}.csv -o /home/xxx/")
MERGE_LINES = [
    ("10", "msprobe -f pytorch merge_result -i ./input_dir -o ./output_dir -config ./config.yaml"),
    ("11", "msprobe -f mindspore merge_result -i ./input_dir -o ./output_dir -config ./config.yaml"),
]
ONLINE_LINE = ("08", "msprobe -f pytorch run_ut -config ./config.json")


def _argv(line: str, home: str = "", ts: str = "") -> list:
    line = line.replace("{step_number}", "0").replace("{rank_number}", "0").replace("{timestamp}", ts)
    argv = shlex.split(line.replace("/home/xxx/", home.rstrip("/") + "/"))
    assert argv[0] == "msprobe"
    return argv[1:]


def _rank(step: str) -> str:
    (d,) = os.listdir(step)
    return os.path.join(step, d)


@pytest.fixture()
def compare_dir(tmp_path, monkeypatch):
    """./npu_dump and ./bench_dump (single-card dumps), ./compare.json as the docs' single-card example."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(_rank(os.path.join(MS26, "L1_statistics", "step0")), "npu_dump")
    shutil.copytree(_rank(os.path.join(MS26, "L1_statistics_perturbed", "step0")), "bench_dump")
    with open("compare.json", "w") as f:
        f.write('{\n"npu_path": "./npu_dump/dump.json",\n"bench_path": "./bench_dump/dump.json",\n'
                '"stack_path": "./npu_dump/stack.json",\n"is_print_compare_log": true\n}\n')
    with open("data_mapping.yaml", "w") as f:  # the docs' format: API rows, then module rows
        f.write("# API\nFunctional.linear.0.forward.input.0: Functional.linear.0.forward.input.0\n")
    for name in ("api_mapping.yaml", "cell_mapping.yaml", "layer_mapping.yaml"):
        with open(name, "w") as f:
            f.write("{}\n")
    return tmp_path


@pytest.mark.parametrize("doc,line", COMPARE_LINES)
def test_compare_lines(compare_dir, doc, line):
    assert main(_argv(line)) == 0
    (csv_file,) = glob.glob("output/compare_result_*.csv")
    with open(csv_file, encoding="utf-8") as f:
        header = f.readline().strip().split(",")
    # doc 10 (5.1): with a stack_path, -s decides whether NPU_Stack_Info is shown
    assert ("NPU_Stack_Info" in header) == (" -s" in line or doc == "26")
    assert os.path.exists("output/summary.json")


@pytest.mark.parametrize("doc,line", XFRAME_LINES)
def test_cross_framework_mapping_lines(compare_dir, doc, line):
    assert main(_argv(line)) == 0
    (csv_file,) = glob.glob("output/compare_result_*.csv")
    with open(csv_file, encoding="utf-8") as f:
        assert f.readline().startswith("NPU Name,Bench Name,")
        assert len(f.readlines()) > 10
    assert os.path.exists("output/summary.json")


def _t(shape, mx=1.0):
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": list(shape), "Max": mx, "Min": -1.0,
            "Mean": 0.0, "Norm": 1.0, "requires_grad": False}


@pytest.fixture()
def run_ut_dir(tmp_path, monkeypatch):
    """./dump_path/step0/rank0/dump.json: a small L1 dump of three APIs."""
    monkeypatch.chdir(tmp_path)
    d = tmp_path / "dump_path" / "step0" / "rank0"
    d.mkdir(parents=True)
    data = {"Torch.matmul.0.forward": {"input_args": [_t([4, 4]), _t([4, 4])], "input_kwargs": {},
                                       "output": [_t([4, 4])]},
            "Functional.relu.0.forward": {"input_args": [_t([3, 5])], "input_kwargs": {}, "output": [_t([3, 5])]},
            "Tensor.add.0.forward": {"input_args": [_t([6]), _t([6], 2.0)], "input_kwargs": {}, "output": [_t([6])]}}
    (d / "dump.json").write_text(json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch",
                                             "dump_data_dir": None, "data": data}))
    for name in ("stack.json", "construct.json"):
        (d / name).write_text("{}")
    return tmp_path


def _one(pattern: str) -> str:
    (f,) = glob.glob(pattern)
    return f


def test_run_ut_lines(run_ut_dir, capsys):
    for i, (_, line) in enumerate(RUN_UT_LINES):
        os.makedirs(f"run{i}")
        os.chdir(f"run{i}")
        try:
            assert main(_argv(line.replace("./dump_path", "../dump_path"))) == 0, line
            assert "3 APIs checked" in capsys.readouterr().out
            _one("accuracy_checking_result_*.csv")
            _one("accuracy_checking_details_*.csv")
        finally:
            os.chdir("..")
    # resume (-csv_path) and api_precision_compare, with the docs' /home/xxx/ paths made real
    home = str(run_ut_dir / "home_xxx")
    for sub in ("ut", "npu", "gpu"):
        os.makedirs(os.path.join(home, sub))
    result = _one("run0/accuracy_checking_result_*.csv")
    ts = os.path.basename(result)[len("accuracy_checking_result_"):-len(".csv")]
    shutil.copy(result, os.path.join(home, "ut"))
    shutil.copy(result.replace("_result_", "_details_"), os.path.join(home, "ut"))
    assert main(_argv(RESUME_LINE[1], home, ts)) == 0
    assert "(3 resumed)" in capsys.readouterr().out
    for sub, run in (("npu", "run0"), ("gpu", "run1")):
        shutil.copy(_one(f"{run}/accuracy_checking_details_*.csv"),
                    os.path.join(home, sub, f"accuracy_checking_details_{ts}.csv"))
    assert main(_argv(PRECISION_LINE[1], home, ts)) == 0
    assert glob.glob(os.path.join(home, "api_precision_compare_result_*.csv"))


def test_merge_result_lines(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["compare", os.path.join(MS8, "distributed_2rank"), os.path.join(MS26, "distributed_2rank"),
                 "-o", "./input_dir", "--no-plot", "--no-progress"]) == 0
    with open("config.yaml", "w") as f:  # the docs' example
        f.write("api:\n- Distributed.all_reduce\n- Distributed.all_gather_into_tensor\ncompare_index:\n"
                "- Max diff\n- L2norm diff\n- MeanRelativeErr\n")
    import openpyxl

    for _, line in MERGE_LINES:
        shutil.rmtree("output_dir", ignore_errors=True)
        assert main(_argv(line)) == 0
        wb = openpyxl.load_workbook(_one("output_dir/multi_ranks_compare_merge_*.xlsx"))
        assert wb.sheetnames == ["Max diff", "L2norm diff", "MeanRelativeErr"]
        rows = list(wb["Max diff"].iter_rows(values_only=True))
        assert rows[0] == ("NPU Name", "rank0", "rank1")
        assert rows[1:] and all(r[0].startswith("Distributed.all_reduce.") for r in rows[1:])


def test_online_line(tmp_path, monkeypatch):
    """doc 08's GPU-side command, with the docs' shared-storage config: the training side (a real
    process) has already written its packets there."""
    from tests.online.conftest import run_training, training_config

    nfs = tmp_path / "nfs"
    nfs.mkdir()
    sent = run_training(training_config(tmp_path, nfs_path=str(nfs), host="", port=-1, tls_path=""), steps=1)
    assert sent["stats"]["dropped"] == 0
    monkeypatch.chdir(tmp_path)
    with open("config.json", "w") as f:
        json.dump({"task": "run_ut", "run_ut": {"white_list": [], "black_list": [], "error_data_path": "./",
                                                "is_online": True, "nfs_path": str(nfs), "host": "", "port": -1,
                                                "rank_list": [0], "tls_path": ""}}, f)
    assert main(_argv(ONLINE_LINE[1])) == 0
    assert glob.glob("accuracy_checking_result_*.csv") or glob.glob("*/accuracy_checking_result_*.csv")
