"""``python -m msprobe validate PATH`` on good and broken dumps."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "spec" / "golden"
REAL = ROOT / "tests" / "fixtures" / "real"


def run_validate(path, *extra):
    return subprocess.run([sys.executable, "-m", "msprobe", "validate", str(path), *extra], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


def _real_scenarios():
    """One scenario per dialect that is known to be a data dump (the others are tested in tests/format)."""
    out = []
    for tool in ("ms26", "ms8"):
        for name in ("L1_statistics", "L1_tensor"):
            if (REAL / tool / name).is_dir():
                out.append(REAL / tool / name)
    return out


def _assert_clean(proc):
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("name", ["statistics-pytorch", "tensor-mindspore", "debug-md5-pytorch"])
def test_golden_dump_is_valid(name):
    proc = run_validate(GOLDEN / name)
    _assert_clean(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("valid: ")
    assert "dialect msprobe-lake" in lines[0]


def test_quiet_prints_only_the_summary():
    proc = run_validate(GOLDEN / "tensor-mindspore", "--quiet")
    assert proc.returncode == 0 and proc.stderr == ""
    assert len(proc.stdout.strip().splitlines()) == 1


@pytest.mark.parametrize("path", _real_scenarios(), ids=lambda p: f"{p.parent.name}-{p.name}")
def test_real_dump_is_valid(path):
    proc = run_validate(path)
    _assert_clean(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = proc.stdout.strip().splitlines()[-1]
    assert summary.startswith("valid: ")
    assert ("msprobe-26" if path.parent.name == "ms26" else "msprobe-8") in summary


@pytest.fixture
def broken(tmp_path):
    dst = tmp_path / "dump"
    shutil.copytree(GOLDEN / "tensor-mindspore", dst)
    return dst / "step0" / "rank0"


def _assert_fails(proc, *needles):
    _assert_clean(proc)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    for needle in needles:
        assert needle in out, out
    assert proc.stdout.strip().splitlines()[-1].startswith("INVALID")


def test_truncated_dump_json(broken):
    p = broken / "dump.json"
    p.write_bytes(p.read_bytes()[:300])
    _assert_fails(run_validate(broken.parent.parent), "step0/rank0/dump.json", "truncated JSON")


def test_missing_tensor_file(broken):
    (broken / "dump_tensor_data" / "Tensor.__add__.0.forward.input.1.npy").unlink()
    _assert_fails(run_validate(broken.parent.parent), "step0/rank0/dump.json",
                  '$.data["Tensor.__add__.0.forward"].input_args.1',
                  "'Tensor.__add__.0.forward.input.1.npy' has no file")


def test_data_name_with_dotdot(broken):
    p = broken / "dump.json"
    doc = json.loads(p.read_text())
    doc["data"]["Mint.greater.0.forward"]["output"][0]["data_name"] = "../../outside.npy"
    p.write_text(json.dumps(doc, indent=1))
    _assert_fails(run_validate(broken.parent.parent), "step0/rank0/dump.json",
                  '$.data["Mint.greater.0.forward"].output.0', "unsafe file name")


def test_every_problem_is_printed(broken):
    p = broken / "dump.json"
    doc = json.loads(p.read_text())
    doc["data"]["Mint.greater.0.forward"]["output"][0]["shape"] = [-1]
    doc["data"]["Functional.relu.0.forward"]["input_args"][0]["dtype"] = 32
    p.write_text(json.dumps(doc, indent=1))
    (broken / "stack.json").write_text('{"0": [["x"], [1]]}')
    proc = run_validate(broken.parent.parent)
    _assert_fails(proc, '$.data["Mint.greater.0.forward"].output.0', '$.data["Functional.relu.0.forward"].input_args.0',
                  'step0/rank0/stack.json:$["0"].1')
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 3, proc.stderr


def test_not_a_dump(tmp_path):
    proc = run_validate(tmp_path)
    _assert_fails(proc, "no dump found")


def test_missing_path(tmp_path):
    proc = run_validate(tmp_path / "absent")
    _assert_clean(proc)
    assert proc.returncode != 0 and "does not exist" in proc.stderr
