"""The framework adapter suite (msprobe.testing.AdapterTests) on MindSpore's dumper (PyNative, CPU),
run in the MindSpore venv by test_mindspore.py."""
from __future__ import annotations

import os
import sys

import mindspore
import numpy as np
import pytest
from mindspore import Tensor, ops

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ms_common import pynative  # noqa: F401

from msprobe.dumpers.mindspore._dumper import MindSporeDumper
from msprobe.testing import AdapterTests


@pytest.mark.usefixtures("pynative")
class TestMindSporeAdapter(AdapterTests):
    framework = "mindspore"
    collective_key = "MintDistributed.all_reduce"
    plain_key = "Functional.relu"

    def make_dumper(self, config):
        return MindSporeDumper(config)

    def tensor(self, values):
        return Tensor(np.asarray(values, dtype=np.float32))

    def to_numpy(self, t):
        return t.asnumpy()

    def relu(self, x):
        return ops.relu(x)

    def assign(self, t, value):
        ops.assign(t, Tensor(np.full(t.shape, value, dtype=np.float32)))

    def grad_of(self, fn, x):
        return mindspore.grad(lambda v: fn(v).sum())(x)
