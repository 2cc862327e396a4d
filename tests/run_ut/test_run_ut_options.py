"""run_ut options on a small hand-written statistics dump: lists, -f, resume, timeouts, crashes,
-save_error_data, and api_precision_compare."""
from __future__ import annotations

import csv
import json
import os
import sys

import pytest

torch = pytest.importorskip("torch")

from msprobe.cli import main  # noqa: E402
from msprobe.errors import ConfigError  # noqa: E402
from msprobe.run_ut import ApiPacket, CheckOptions, check_api, run_ut  # noqa: E402
from msprobe.run_ut.precision_compare import api_precision_compare  # noqa: E402


def t(shape, mx=1.0, mn=-1.0, dtype="torch.float32", grad=True):
    return {"type": "torch.Tensor", "dtype": dtype, "shape": list(shape), "Max": mx, "Min": mn, "Mean": 0.0,
            "Norm": 1.0, "requires_grad": grad}


def write_dump(root) -> str:
    data = {
        "Torch.matmul.0.forward": {"input_args": [t([4, 4]), t([4, 4])], "input_kwargs": {}, "output": [t([4, 4])]},
        "Torch.matmul.0.backward": {"input": [t([4, 4], grad=False)], "output": [t([4, 4]), t([4, 4])]},
        "Torch.matmul.1.forward": {"input_args": [t([4, 4], 2.0), t([4, 4], 3.0)], "input_kwargs": {},
                                   "output": [t([4, 4])]},
        "Functional.relu.0.forward": {"input_args": [t([3, 5])], "input_kwargs": {"inplace": False},
                                      "output": [t([3, 5])]},
        "Torch.lake_crash.0.forward": {"input_args": [t([2])], "input_kwargs": {}, "output": [t([2])]},
        "Torch.lake_slow.0.forward": {"input_args": [t([2])], "input_kwargs": {}, "output": [t([2])]},
        "Distributed.all_reduce.0.forward": {"input_args": [t([2])], "input_kwargs": {}, "output": [None]},
        "NPU.npu_rms_norm.0.forward": {"input_args": [t([2, 4]), t([4])], "input_kwargs": {}, "output": [t([2, 4])]},
        "Tensor.add.0.forward": {"input_args": [t([6], dtype="torch.float16"), t([6], dtype="torch.float16")],
                                 "input_kwargs": {}, "output": [t([6], dtype="torch.float16")]},
    }
    d = root / "dump"
    d.mkdir()
    (d / "dump.json").write_text(json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch",
                                             "dump_data_dir": None, "data": data}, indent=1))
    (d / "stack.json").write_text("{}")
    (d / "construct.json").write_text("{}")
    return str(d / "dump.json")


PRELOAD = '''
import os, time, torch
def lake_crash(x):
    os._exit(3)
def lake_slow(x):
    time.sleep(600)
    return x
torch.lake_crash = lake_crash
torch.lake_slow = lake_slow
'''


def rows(path):
    with open(path, newline="", encoding="utf-8-sig") as fh:
        return list(csv.reader(fh))


@pytest.fixture()
def dump(tmp_path, monkeypatch):
    (tmp_path / "lake_preload_mod.py").write_text(PRELOAD)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return write_dump(tmp_path)


def test_workers_survive_crash_and_timeout(dump, tmp_path):
    s = run_ut(dump, str(tmp_path / "out"), workers=2, timeout=45, progress=False, preload=("lake_preload_mod",))
    res = {r[0]: r for r in rows(s["result_csv"])[1:]}
    assert list(res) == ["Torch.matmul.0", "Torch.matmul.1", "Functional.relu.0", "Torch.lake_crash.0",
                         "Torch.lake_slow.0", "Distributed.all_reduce.0", "NPU.npu_rms_norm.0", "Tensor.add.0"]
    assert res["Torch.matmul.0"][1:3] == ["pass", "pass"], res
    assert res["Torch.lake_crash.0"][1] == "SKIP" and "died" in res["Torch.lake_crash.0"][3]
    assert res["Torch.lake_slow.0"][1] == "SKIP" and "Timed out" in res["Torch.lake_slow.0"][3]
    assert res["Distributed.all_reduce.0"][1] == "SKIP" and "Distributed" in res["Distributed.all_reduce.0"][3]
    if "torch_npu" not in sys.modules:  # (tests/npu may have put a fake torch_npu on the path)
        assert res["NPU.npu_rms_norm.0"][1] == "SKIP" and "torch_npu" in res["NPU.npu_rms_norm.0"][3]
    assert res["Tensor.add.0"][1] == "pass" and res["Functional.relu.0"][1] == "pass"
    det = {r[0]: r for r in rows(s["details_csv"])[1:]}
    assert det["Tensor.add.0.forward.output.0"][2] == "torch.float16"  # device side in the recorded dtype
    assert det["Tensor.add.0.forward.output.0"][1] == "torch.float64"


def test_lists_filter_and_resume(dump, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"task": "run_ut", "run_ut": {"white_list": ["matmul", "relu", "add"],
                                                            "black_list": ["relu"]}}))
    out = tmp_path / "o1"
    s = run_ut(dump, str(out), workers=0, config=str(cfg), filter_api=True, progress=False)
    res = {r[0]: r for r in rows(s["result_csv"])[1:]}
    assert "Torch.matmul.1" not in res  # same structure as matmul.0 but for Max/Min: filtered by -f
    assert res["Functional.relu.0"][1] == "SKIP" and "black list" in res["Functional.relu.0"][3]
    assert res["Torch.lake_crash.0"][1] == "SKIP" and "white list" in res["Torch.lake_crash.0"][3]
    assert res["Torch.matmul.0"][1] == "pass"
    # resume: cut the result file after 2 APIs (and leave a stray details row behind), then continue
    all_rows = rows(s["result_csv"])
    with open(s["result_csv"], "w", newline="", encoding="utf-8-sig") as fh:
        csv.writer(fh).writerows(all_rows[:3])
    s2 = run_ut(dump, str(tmp_path / "ignored"), workers=0, config=str(cfg), filter_api=True, progress=False,
                result_csv=s["result_csv"])
    assert s2["resumed"] == 2 and s2["result_csv"] == s["result_csv"]
    again = rows(s["result_csv"])
    assert [r[0] for r in again] == [r[0] for r in all_rows]
    names = [r[0] for r in rows(s["details_csv"])[1:]]
    assert len(names) == len(set(names))


def test_bad_config_and_resume_file(dump, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"run_ut": {"white_list": "matmul"}}))
    with pytest.raises(ConfigError):
        run_ut(dump, str(tmp_path / "o"), workers=0, config=str(bad), progress=False)
    with pytest.raises(ConfigError):
        run_ut(dump, str(tmp_path / "o"), workers=0, result_csv=str(tmp_path / "nope.csv"), progress=False)


def test_save_error_data_and_precision_compare(dump, tmp_path):
    # a packet whose device side is wrong: the API is error and its tensors are saved
    x = torch.randn(4, 4)
    pkt = ApiPacket("Torch.matmul.0", [x, x.clone()], {}, recorded_output=[torch.zeros(4, 4)])
    r = check_api(pkt, CheckOptions())
    assert r.forward == "error"
    s = run_ut(dump, str(tmp_path / "o"), workers=0, progress=False)
    det = s["details_csv"]
    # NPU == GPU: everything that ran passes
    c = api_precision_compare(det, det, str(tmp_path / "apc"))
    assert c["counts"].get("error", 0) == 0 and c["counts"].get("pass", 0) > 0
    # an NPU file whose matmul ULP share and relu RMSE blow up: error
    body = rows(det)
    h = body[0]
    for r in body[1:]:
        if r[0].startswith("Functional.relu.0.forward"):
            r[h.index("均方根误差")] = "1.0"
        if r[0].startswith("Torch.matmul.0.forward"):
            r[h.index("ULP误差大于阈值占比")] = "0.9"
            r[h.index("ULP误差平均值")] = "500"
    npu = tmp_path / "npu_details.csv"
    with open(npu, "w", newline="", encoding="utf-8-sig") as fh:
        csv.writer(fh).writerows(body)
    rc = main(["api_precision_compare", "-npu", str(npu), "-gpu", det, "-o", str(tmp_path / "apc2")])
    assert rc == 0
    out = [f for f in os.listdir(tmp_path / "apc2") if f.startswith("api_precision_compare_result_")]
    res = {r[0]: r for r in rows(str(tmp_path / "apc2" / out[0]))[1:]}
    assert res["Torch.matmul.0"][1] == "error"
    assert res["Tensor.add.0"][1] == "pass"


def test_cli_run_ut_and_alias(dump, tmp_path, capsys):
    assert main(["acc_check", "-api_info", dump, "-o", str(tmp_path / "c"), "-n", "0", "-q"]) == 0
    out = capsys.readouterr().out
    assert "APIs checked" in out and "result csv" in out


def test_injected_error_on_packet_saves_error_data(tmp_path):
    from msprobe.run_ut.runner import save_error_data

    x = torch.randn(3, 3)
    r = check_api(ApiPacket("Torch.matmul.0", [x, x], {}, recorded_output=[x]), CheckOptions(keep_tensors=True))
    assert r.forward == "error"
    keys = save_error_data(str(tmp_path / "err"), r)
    assert "Torch.matmul.0.forward.input.0.pt" in keys
    loaded = torch.load(tmp_path / "err" / "Torch.matmul.0.forward.output.bench.pt", weights_only=True)
    assert loaded.dtype == torch.float64
    assert sys.modules.get("msprobe.run_ut") is not None
