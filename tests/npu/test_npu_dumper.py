"""torch_npu support of the PyTorch dumper, through the fake NPU backend (tests/npu/fake_torch_npu)."""
from __future__ import annotations

import json
import math
import os

import pytest

torch = pytest.importorskip("torch")

import msprobe.readers  # noqa: E402


def _dump_json(root, step=0):
    with open(os.path.join(root, f"step{step}", "rank", "dump.json")) as f:
        return json.load(f)


def _stats_close(entry, ref: "torch.Tensor", rel=1e-5):
    r = ref.detach().double()
    want = {"Max": r.max().item(), "Min": r.min().item(), "Mean": r.mean().item(), "Norm": r.norm().item()}
    for k, v in want.items():
        assert math.isclose(entry[k], v, rel_tol=rel, abs_tol=1e-6), (k, entry[k], v)
    assert entry["dtype"] == str(ref.dtype) and entry["shape"] == list(ref.shape)


def _rms_reference(x, g, eps):
    xf = x.detach().cpu().float().requires_grad_()
    gf = g.detach().cpu().float().requires_grad_()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = xf * rstd * gf
    return xf, gf, y, rstd


def test_fake_npu_is_a_privateuse1_device_with_the_real_schemas(torch_npu):
    x = torch.randn(2, 3).npu()
    assert x.device == torch.device("npu", 0) and x.is_npu and str(x.device) == "npu:0"
    assert torch._C._get_privateuse1_backend_name() == "npu" and torch.npu.is_available()
    assert (x * 2).cpu().equal(x.cpu() * 2)
    ops_file = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "data", "torch_npu_ops.txt")
    with open(ops_file) as f:
        rows = [ln.rstrip("\n").split("\t", 2) for ln in f if not ln.startswith("#")]
    assert len(rows) > 100
    schemas = {name: schema for name, _, schema in rows}
    for name in ("npu_rms_norm", "npu_rotary_mul", "npu_swiglu", "npu_fusion_attention"):
        assert torch.ops.npu.__getattr__(name).default._schema == torch._C.parse_schema("npu::" + schemas[name])
        assert getattr(torch_npu, name)._qualified_op_name == f"npu::{name}"


def test_npu_rms_norm_forward_and_backward_recorded(torch_npu, debugger, tmp_path):
    dbg = debugger(dump_path=str(tmp_path), task="statistics", level="L1")
    torch.manual_seed(0)
    x = torch.randn(2, 4, 16).to("npu").requires_grad_()
    g = (torch.rand(16) + 0.5).to("npu").requires_grad_()
    w = torch.randn(2, 4, 16)
    dbg.start()
    y, rstd = torch_npu.npu_rms_norm(x, g, epsilon=1e-5)
    (y * w.to("npu")).sum().backward()
    dbg.stop()
    dbg.step()

    data = _dump_json(tmp_path)["data"]
    fwd, bwd = data["NPU.npu_rms_norm.0.forward"], data["NPU.npu_rms_norm.0.backward"]
    xf, gf, yr, rstdr = _rms_reference(x, g, 1e-5)
    (yr * w).sum().backward()
    _stats_close(fwd["input_args"][0], xf)
    _stats_close(fwd["input_args"][1], gf)
    assert fwd["input_kwargs"] == {"epsilon": {"type": "float", "value": 1e-5}}
    _stats_close(fwd["output"][0], yr)
    _stats_close(fwd["output"][1], rstdr)
    assert fwd["output"][1]["shape"] == [2, 4, 1] and fwd["output"][0]["requires_grad"] is True
    # backward: input = gradients of (y, rstd) (rstd unused: None), output = of (x, gamma)
    assert len(bwd["input"]) == 2 and bwd["input"][1] is None
    _stats_close(bwd["input"][0], w)
    assert len(bwd["output"]) == 2
    _stats_close(bwd["output"][0], xf.grad, rel=1e-4)
    _stats_close(bwd["output"][1], gf.grad, rel=1e-4)
    # the device-moving calls carry the npu device as it is written on hardware
    to_recs = [r for k, r in data.items() if k.startswith("Tensor.to.")]
    assert any(a == {"type": "str", "value": "npu"} for r in to_recs for a in r["input_args"])
    # readers read it
    d = msprobe.readers.open(str(tmp_path))
    rec = d.record("NPU.npu_rms_norm.0.forward", step=0)
    assert tuple(rec.output[0].shape) == (2, 4, 16) and rec.output[0].dtype == "torch.float32"
    brec = d.record("NPU.npu_rms_norm.0.backward", step=0)
    assert math.isclose(brec.output[1].stats["norm"], gf.grad.double().norm().item(), rel_tol=1e-4)
