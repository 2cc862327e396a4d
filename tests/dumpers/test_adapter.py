"""The framework adapter suite (tests/dumpers/adapter_suite.py) on PyTorch's dumper."""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from adapter_suite import AdapterTests

from msprobe.dumpers.pytorch._dumper import TorchDumper


class TestTorchAdapter(AdapterTests):
    framework = "pytorch"
    collective_key = "Distributed.all_reduce"
    plain_key = "Torch.relu"

    def make_dumper(self, config):
        return TorchDumper(config)

    def tensor(self, values):
        return torch.tensor(values, dtype=torch.float32)

    def to_numpy(self, t):
        return t.detach().numpy()

    def relu(self, x):
        return torch.relu(x)

    def assign(self, t, value):
        t.fill_(value)

    def grad_of(self, fn, x):
        x = x.clone().requires_grad_(True)
        fn(x).sum().backward()
        return x.grad
