"""A fake ``torch_npu`` for tests on machines without Ascend hardware (never shipped in the package).

Importing it, like importing the real one: renames PyTorch's PrivateUse1 device to ``npu`` (tensors
report ``npu:0``), registers ``torch.npu`` (``torch_npu.npu``), and exposes every public ``npu_*``
operator as ``torch_npu.<name> = torch.ops.npu.<name>``, defined with the real torch-npu 2.13.0 schemas.
"""
from __future__ import annotations

import torch

from torch_npu import _backend, npu
from torch_npu._ops import define_all

__version__ = "2.13.0.fake"
IS_FAKE = True

_backend.setup(npu)
_PUBLIC = define_all()
for _name in _PUBLIC:
    globals()[_name] = getattr(torch.ops.npu, _name)
del _name
