"""Runs the NPU test modules (``cases_*.py``) each in a fresh pytest subprocess.

The fake torch_npu renames PyTorch's PrivateUse1 device to ``npu`` and registers it with the autograd
engine; both are process-wide and cannot be undone. In a process where autograd already ran, the engine
has no ready queue for the new device (an internal assert on the first NPU backward), and once the fake
is imported every later test in that process sees an NPU (run_ut would replay on it). So these modules
never share a process with the rest of the suite.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CASES = sorted(f for f in os.listdir(HERE) if f.startswith("cases_") and f.endswith(".py"))


@pytest.mark.parametrize("module", CASES)
def test_npu_cases_in_own_process(module):
    pytest.importorskip("torch")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
           os.path.join("tests", "npu", module)]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    print(out.stdout[-6000:])
    assert out.returncode == 0, (out.stdout[-6000:] + out.stderr[-3000:])
    assert " passed" in out.stdout
