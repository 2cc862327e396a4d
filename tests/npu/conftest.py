"""The fake torch_npu (tests/npu/fake_torch_npu) for the NPU tests: imported on first use, once per process
(PyTorch's PrivateUse1 device can be renamed only once)."""
from __future__ import annotations

import os
import sys

import pytest

FAKE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_torch_npu")


@pytest.fixture(scope="session")
def torch_npu():
    pytest.importorskip("torch")
    if FAKE_DIR not in sys.path:
        sys.path.insert(0, FAKE_DIR)
    import torch_npu as mod

    assert getattr(mod, "IS_FAKE", False), f"a real torch_npu shadows the fake: {mod.__file__}"
    return mod


@pytest.fixture()
def debugger(fresh_debugger):
    return fresh_debugger
