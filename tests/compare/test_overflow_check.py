"""``msprobe overflow_check -i STEP_DIR -o OUT`` (26.2.0's command line and file): the first NaN/Inf of
a step over its ranks in the order their communication implies, on a 2-stage pipeline over 2 ranks
(tests/lake/pipeline_synth.py: a NaN born on rank 1 that reaches rank 0 with the gradient, a NaN of
leftover memory in a receive buffer at healthy step 0)."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from msprobe.cli import main

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lake"))
import pipeline_synth as P

ENTRY_KEYS = ["op_name", "data_info", "construct_info", "stack_info"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return P.make_run(str(tmp_path_factory.mktemp("pp")), "nan", "nan", seed=2)


def _files(out) -> list:
    return sorted(glob.glob(os.path.join(str(out), "anomaly_analyze_*.json")))


def test_names_the_birth_not_the_receive(run_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["overflow_check", "-i", os.path.join(run_dir, f"step{P.FAULT_STEP}"), "-o", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"rank 1 {P.FAULT_RECORD}" in said
    assert f"rank 1 {P.SEND_RECORD} -> rank 0 {P.RECV_RECORD}" in said  # the propagation path
    (path,) = _files(out)
    assert os.path.basename(path)[len("anomaly_analyze_"):-len(".json")].isdigit()
    doc = json.load(open(path))
    assert list(doc) == ["rank_1"] and len(doc["rank_1"]) == 1
    entry = doc["rank_1"][0]
    assert list(entry) == ENTRY_KEYS
    assert entry["op_name"] == P.FAULT_RECORD and entry["construct_info"] == [P.FAULT_RECORD]
    data = json.load(open(os.path.join(run_dir, f"step{P.FAULT_STEP}", "rank1", "dump.json")))["data"]
    assert json.dumps(entry["data_info"]) == json.dumps(data[P.FAULT_RECORD])  # NaN written as dump.json writes it
    assert entry["stack_info"] == []


def test_receive_buffer_leftovers_are_no_anomaly(run_dir, tmp_path, capsys):
    """Step 0's NaN is in rank 1's receive buffer before the receive: nothing found, no file."""
    out = tmp_path / "out"
    assert main(["overflow_check", "-i", os.path.join(run_dir, "step0"), "-o", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"anomaly": None, "file": None}
    assert _files(out) == []


def test_json_and_a_module_chain(run_dir, tmp_path, capsys):
    step = tmp_path / "step"
    import shutil

    shutil.copytree(os.path.join(run_dir, f"step{P.FAULT_STEP}"), step)
    with open(step / "rank1" / "construct.json", "w") as f:
        json.dump({P.FAULT_RECORD: "Module.head.Linear.forward.0", "Module.head.Linear.forward.0":
                   "Module.stage.Stage.forward.0"}, f)
    assert main(["overflow_check", "--input_path", str(step), "--output_path", str(tmp_path / "o"), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["anomaly"]["rank"] == 1 and got["anomaly"]["record"] == P.FAULT_RECORD
    assert got["anomaly"]["path"] == [{"from_rank": 1, "from_record": P.SEND_RECORD, "to_rank": 0,
                                       "to_record": P.RECV_RECORD, "via": "p2p"}]
    entry = json.load(open(got["file"]))["rank_1"][0]
    assert entry["construct_info"] == ["Module.stage.Stage.forward.0", "Module.head.Linear.forward.0", P.FAULT_RECORD]


def test_several_steps_are_refused(run_dir, capsys):
    assert main(["overflow_check", "-i", run_dir, "-o", "unused"]) != 0
    assert "give one step directory" in capsys.readouterr().err


@pytest.mark.real_tool
def test_the_real_tools_file_has_the_same_shape(run_dir, tmp_path, real_tool):
    """26.2.0 writes the same shape on the same step; it names rank 0's receive, where the NaN
    arrived with the gradient (issue 38), ours rank 1's record where it was born."""
    step = os.path.join(run_dir, f"step{P.FAULT_STEP}")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    out = tmp_path / "real"
    out.mkdir()
    r = subprocess.run([real_tool, "-m", "msprobe.msprobe", "overflow_check", "-i", step, "-o", str(out)],
                       cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    (real_path,) = _files(out)
    real = json.load(open(real_path))
    assert main(["overflow_check", "-i", step, "-o", str(tmp_path / "ours")]) == 0
    (ours_path,) = _files(tmp_path / "ours")
    ours = json.load(open(ours_path))
    assert [list(e) for v in real.values() for e in v] == [ENTRY_KEYS] == [list(e) for v in ours.values() for e in v]
    assert list(real) == ["rank_0"] and real["rank_0"][0]["op_name"] == P.RECV_RECORD
    assert list(ours) == ["rank_1"] and ours["rank_1"][0]["op_name"] == P.FAULT_RECORD
    assert list(real["rank_0"][0]["data_info"]) == list(ours["rank_1"][0]["data_info"])
