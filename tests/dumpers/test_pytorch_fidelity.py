"""Records that used to differ from what the real msprobe 26.2.0 writes for the same script (issue 18
items 11-15); each expectation below is what 26.2.0 wrote for it (checked live in tests/dumpers/
test_zoo.py), stated here from first principles so that it holds without the real tool."""
from __future__ import annotations

import json
import os
import sys
import zlib

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from msprobe.pytorch import PrecisionDebugger  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "real",
                                "scripts"))
from zoo import CkptNet  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_debugger")


def run(tmp_path, body, level="L1", summary_mode="statistics", model=None):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"task": "statistics", "dump_path": str(tmp_path), "level": level,
                               "statistics": {"summary_mode": summary_mode}}))
    dbg = PrecisionDebugger(config_path=str(cfg))
    dbg.start(model)
    body()
    dbg.stop()
    dbg.step()
    base = os.path.join(tmp_path, "step0", "rank")
    with open(os.path.join(base, "dump.json")) as f:
        data = json.load(f)["data"]
    with open(os.path.join(base, "construct.json")) as f:
        return data, json.load(f)


def test_dropout_p0_returning_its_input_has_no_backward(tmp_path):
    w = torch.randn(4, 4, requires_grad=True)

    def body():
        h = torch.randn(3, 4) @ w
        a = F.dropout(h, p=0.0)           # returns h itself: no node of its own
        b = F.dropout(a * 2, p=0.5)       # a real dropout: its own backward
        (a.sum() + b.sum()).backward()

    data, _ = run(tmp_path, body)
    assert "Functional.dropout.0.forward" in data and "Functional.dropout.0.backward" not in data
    assert "Functional.dropout.1.backward" in data
    assert "Tensor.__matmul__.0.backward" in data


def test_md5_of_a_transposed_view_is_its_own(tmp_path):
    def body():
        x = torch.randn(3, 4)
        c = x.chunk(2, dim=1)[0]          # (3, 2) view, strides (4, 1)
        c.t().exp()                       # (2, 3) view of the same elements, strides (1, 4)

    data, _ = run(tmp_path, body, summary_mode="md5")
    rec = data["Tensor.t.0.forward"]
    src, out = rec["input_args"][0], rec["output"][0]
    x_t = data["Tensor.exp.0.forward"]["input_args"][0]
    # the checksum is the CRC32 of the tensor's bytes in its own (logical) element order
    assert out["md5"] == x_t["md5"] != src["md5"]


def test_md5_values_are_crc32_of_the_logical_order(tmp_path):
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    v = x.chunk(2, dim=1)[0]
    data, _ = run(tmp_path, lambda: v.t().neg(), summary_mode="md5")
    out = data["Tensor.t.0.forward"]["output"][0]["md5"]
    assert out == f"{zlib.crc32(v.t().contiguous().numpy().tobytes()) & 0xFFFFFFFF:08x}"
    assert data["Tensor.t.0.forward"]["input_args"][0]["md5"] == \
        f"{zlib.crc32(v.contiguous().numpy().tobytes()) & 0xFFFFFFFF:08x}"


class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        return h * 2, h + 1


class UsesOne(nn.Module):
    def __init__(self):
        super().__init__()
        self.two = Two()
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        a, _unused = self.two(x)
        return self.out(a).sum()


def test_unused_module_output_gradient_is_null_and_no_pgrad_in_construct(tmp_path):
    torch.manual_seed(0)
    net = UsesOne()
    data, construct = run(tmp_path, lambda: net(torch.randn(3, 4)).backward(), level="mix", model=net)
    bwd = data["Module.two.Two.backward.0"]
    assert bwd["input"][0]["shape"] == [3, 4] and bwd["input"][1] is None
    assert "Module.two.fc.Linear.parameters_grad" in data
    assert not [k for k in construct if "parameters_grad" in k]  # FORMAT §12


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_checkpoint_recompute_cut_short_keeps_inputs(tmp_path, level):
    torch.manual_seed(0)
    net = CkptNet()  # head(checkpoint(block, x, use_reentrant=False)), block: fc2(tanh(fc(x))).sigmoid() * 2 + 1
    x = torch.randn(2, 4, 8, requires_grad=True)
    data, construct = run(tmp_path, lambda: net(x).sum().backward(), level=level, model=net)
    # the recompute stops inside sigmoid (the last saved tensor it needs): inputs only
    cut = data["Tensor.sigmoid.1.forward"]
    assert list(cut) == ["input_args", "input_kwargs"] and cut["input_args"][0]["shape"] == [2, 4, 8]
    assert "Torch.tanh.1.forward" in data and "Tensor.__mul__.1.forward" not in data
    assert "Torch.tanh.0.backward" in data and "Tensor.sigmoid.0.backward" in data
    if level == "mix":
        assert "Module.block.Block.forward.1" not in data and "Module.block.Block.forward.1" in construct
        assert construct["Module.block.fc.Linear.forward.1"] == "Module.block.Block.forward.1"
        # the module stack is left properly: later records have their true parents
        assert construct["Module.block.Block.backward.0"] is None
