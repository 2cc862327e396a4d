"""``msprobe multi_run_ut`` (8.x's multi-device run_ut) and run_ut on dumps it cannot check."""
from __future__ import annotations

import csv
import glob
import json
import os

import pytest

pytest.importorskip("torch")

from msprobe.cli import main

REAL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "real")


def _t(shape, mx=1.0):
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": list(shape), "Max": mx, "Min": -1.0,
            "Mean": 0.0, "Norm": 1.0, "requires_grad": False}


def _dump(root: str, level: str = "L1") -> str:
    data = {
        "Torch.matmul.0.forward": {"input_args": [_t([4, 4]), _t([4, 4])], "input_kwargs": {}, "output": [_t([4, 4])]},
        "Functional.relu.0.forward": {"input_args": [_t([3, 5])], "input_kwargs": {"inplace": False},
                                      "output": [_t([3, 5])]},
        "Tensor.add.0.forward": {"input_args": [_t([6]), _t([6], 2.0)], "input_kwargs": {}, "output": [_t([6])]},
    }
    d = os.path.join(root, "dump_path", "step0", "rank0")
    os.makedirs(d)
    with open(os.path.join(d, "dump.json"), "w") as f:
        json.dump({"task": "statistics", "level": level, "framework": "pytorch", "dump_data_dir": None,
                   "data": data}, f, indent=1)
    for name in ("stack.json", "construct.json"):
        with open(os.path.join(d, name), "w") as f:
            f.write("{}")
    return os.path.join(d, "dump.json")


def _results(out: str) -> list:
    (f,) = glob.glob(os.path.join(out, "accuracy_checking_result_*.csv"))
    with open(f, newline="", encoding="utf-8-sig") as fh:
        return [r[:3] for r in csv.reader(fh)]


def test_multi_run_ut_equals_run_ut(tmp_path, capsys):
    dump = _dump(str(tmp_path))
    assert main(["-f", "pytorch", "run_ut", "-api_info", dump, "-o", str(tmp_path / "one"), "-n", "0", "-q"]) == 0
    assert main(["-f", "pytorch", "multi_run_ut", "-api_info", dump, "-o", str(tmp_path / "multi"), "-n", "2",
                 "-d", "0", "1", "-q"]) == 0
    assert "3 APIs checked" in capsys.readouterr().out
    assert _results(str(tmp_path / "multi")) == _results(str(tmp_path / "one"))
    assert len(_results(str(tmp_path / "one"))) == 4  # header and 3 APIs
    assert main(["multi_run_ut", "-api_info", dump, "-n", "65"]) == 1
    assert "-n/--num_splits must be between 0 and 64" in capsys.readouterr().err


def test_run_ut_on_an_l0_dump_says_l1_is_needed(tmp_path, capsys):
    (step,) = [s for s in sorted(os.listdir(os.path.join(REAL, "ms26", "L0_statistics")))][:1]
    (rank,) = os.listdir(os.path.join(REAL, "ms26", "L0_statistics", step))
    dump = os.path.join(REAL, "ms26", "L0_statistics", step, rank, "dump.json")
    out = tmp_path / "o"
    assert main(["-f", "pytorch", "run_ut", "-api_info", dump, "-o", str(out), "-q"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "level L0 dump (module records only)" in err and "needs an L1 (or mix) dump" in err
    assert not out.exists()  # no empty result files
    empty = _dump(str(tmp_path / "e"))
    with open(empty) as f:
        doc = json.load(f)
    doc["data"] = {}
    with open(empty, "w") as f:
        json.dump(doc, f)
    assert main(["run_ut", "-api_info", empty, "-o", str(tmp_path / "o2"), "-q"]) == 1
    assert "no forward API record to check (level L1)" in capsys.readouterr().err
