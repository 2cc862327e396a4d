"""``python -m msprobe validate PATH`` on good and broken dumps.

Every command runs as its own subprocess, a few at a time (module fixture); each test
checks one result.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "spec" / "golden"
REAL = ROOT / "tests" / "fixtures" / "real"
GOLDENS = ["statistics-pytorch", "tensor-mindspore", "debug-md5-pytorch"]


def _real_scenarios():
    """Two data dumps per real-tool release (every scenario is validated in tests/format)."""
    return [REAL / tool / name for tool in ("ms26", "ms8") for name in ("L1_statistics", "L1_tensor")
            if (REAL / tool / name).is_dir()]


REAL_SCENARIOS = _real_scenarios()


def _break_truncate(rank):
    p = rank / "dump.json"
    p.write_bytes(p.read_bytes()[:300])


def _break_missing_file(rank):
    (rank / "dump_tensor_data" / "Tensor.__add__.0.forward.input.1.npy").unlink()


def _break_dotdot(rank):
    p = rank / "dump.json"
    doc = json.loads(p.read_text())
    doc["data"]["Mint.greater.0.forward"]["output"][0]["data_name"] = "../../outside.npy"
    p.write_text(json.dumps(doc, indent=1))


def _break_three_ways(rank):
    p = rank / "dump.json"
    doc = json.loads(p.read_text())
    doc["data"]["Mint.greater.0.forward"]["output"][0]["shape"] = [-1]
    doc["data"]["Functional.relu.0.forward"]["input_args"][0]["dtype"] = 32
    p.write_text(json.dumps(doc, indent=1))
    (rank / "stack.json").write_text('{"0": [["x"], [1]]}')


BROKEN = {"truncated": _break_truncate, "missing-file": _break_missing_file, "dotdot": _break_dotdot,
          "three-problems": _break_three_ways}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """case -> (returncode, stdout, stderr), every command run concurrently."""
    tmp = tmp_path_factory.mktemp("cli")
    cases = {f"golden-{g}": [GOLDEN / g] for g in GOLDENS}
    cases["quiet"] = [GOLDEN / "tensor-mindspore", "--quiet"]
    for p in REAL_SCENARIOS:
        cases[f"real-{p.parent.name}-{p.name}"] = [p]
    for name, mutate in BROKEN.items():
        dst = tmp / name
        shutil.copytree(GOLDEN / "tensor-mindspore", dst)
        mutate(dst / "step0" / "rank0")
        cases[f"broken-{name}"] = [dst]
    (tmp / "empty").mkdir()
    cases["not-a-dump"] = [tmp / "empty"]
    cases["missing-path"] = [tmp / "absent"]

    def run(args):
        proc = subprocess.run([sys.executable, "-m", "msprobe", "validate", *map(str, args)], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        return proc.returncode, proc.stdout, proc.stderr

    with ThreadPoolExecutor(max_workers=3) as pool:  # a few at a time: CI machines have few cores
        futures = {k: pool.submit(run, args) for k, args in cases.items()}
        return {k: f.result() for k, f in futures.items()}


def _assert_clean(result):
    assert "Traceback" not in result[1] + result[2]


@pytest.mark.parametrize("name", GOLDENS)
def test_golden_dump_is_valid(results, name):
    rc, stdout, stderr = result = results[f"golden-{name}"]
    _assert_clean(result)
    assert rc == 0, stdout + stderr
    lines = stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("valid: ")
    assert "dialect msprobe-lake" in lines[0]


def test_quiet_prints_only_the_summary(results):
    rc, stdout, stderr = results["quiet"]
    assert rc == 0 and stderr == ""
    assert len(stdout.strip().splitlines()) == 1


@pytest.mark.parametrize("path", REAL_SCENARIOS, ids=lambda p: f"{p.parent.name}-{p.name}")
def test_real_dump_is_valid(results, path):
    rc, stdout, stderr = result = results[f"real-{path.parent.name}-{path.name}"]
    _assert_clean(result)
    assert rc == 0, stdout + stderr
    summary = stdout.strip().splitlines()[-1]
    assert summary.startswith("valid: ")
    assert ("msprobe-26" if path.parent.name == "ms26" else "msprobe-8") in summary


def _assert_fails(result, *needles):
    rc, stdout, stderr = result
    _assert_clean(result)
    assert rc != 0
    for needle in needles:
        assert needle in stdout + stderr, stdout + stderr
    assert stdout.strip().splitlines()[-1].startswith("INVALID")


def test_truncated_dump_json(results):
    _assert_fails(results["broken-truncated"], "step0/rank0/dump.json", "truncated JSON")


def test_missing_tensor_file(results):
    _assert_fails(results["broken-missing-file"], "step0/rank0/dump.json",
                  '$.data["Tensor.__add__.0.forward"].input_args.1',
                  "'Tensor.__add__.0.forward.input.1.npy' has no file")


def test_data_name_with_dotdot(results):
    _assert_fails(results["broken-dotdot"], "step0/rank0/dump.json",
                  '$.data["Mint.greater.0.forward"].output.0', "unsafe file name")


def test_every_problem_is_printed(results):
    result = results["broken-three-problems"]
    _assert_fails(result, '$.data["Mint.greater.0.forward"].output.0',
                  '$.data["Functional.relu.0.forward"].input_args.0', 'step0/rank0/stack.json:$["0"].1')
    errors = [line for line in result[2].splitlines() if line.startswith("error: ")]
    assert len(errors) == 3, result[2]


def test_not_a_dump(results):
    _assert_fails(results["not-a-dump"], "no dump found")


def test_missing_path(results):
    rc, stdout, stderr = result = results["missing-path"]
    _assert_clean(result)
    assert rc != 0 and "does not exist" in stderr
