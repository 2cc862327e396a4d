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
    assert x.type() == "torch.npu.FloatTensor" and x.double().type() == "torch.npu.DoubleTensor"
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


def _run_recorded(debugger, tmp_path, fn, task="statistics"):
    dbg = debugger(dump_path=str(tmp_path), task=task, level="L1")
    dbg.start()
    fn()
    dbg.stop()
    dbg.step()
    return _dump_json(tmp_path)["data"]


def test_rotary_mul_and_swiglu_forward_backward(torch_npu, debugger, tmp_path):
    torch.manual_seed(1)
    x = torch.randn(2, 3, 4, 8).npu().requires_grad_()
    r1 = torch.randn(1, 3, 1, 8).npu().requires_grad_()
    r2 = torch.randn(1, 3, 1, 8).npu().requires_grad_()
    h = torch.randn(5, 12).npu().requires_grad_()

    def body():
        torch_npu.npu_rotary_mul(x, r1, r2).sum().backward()
        torch_npu.npu_swiglu(h, dim=-1).pow(2).sum().backward()

    data = _run_recorded(debugger, tmp_path, body)
    xc, r1c, r2c, hc = (t.detach().cpu().requires_grad_() for t in (x, r1, r2, h))
    x1, x2 = xc.chunk(2, -1)
    rot = xc * r1c + torch.cat([-x2, x1], -1) * r2c
    rot.sum().backward()
    a, b = hc.chunk(2, -1)
    sw = torch.nn.functional.silu(a) * b
    sw.pow(2).sum().backward()
    _stats_close(data["NPU.npu_rotary_mul.0.forward"]["output"][0], rot)
    bw = data["NPU.npu_rotary_mul.0.backward"]["output"]
    for entry, ref in zip(bw, (xc.grad, r1c.grad, r2c.grad)):
        _stats_close(entry, ref, rel=1e-4)
    fwd = data["NPU.npu_swiglu.0.forward"]
    assert fwd["input_kwargs"] == {"dim": {"type": "int", "value": -1}}
    _stats_close(fwd["output"][0], sw)
    _stats_close(data["NPU.npu_swiglu.0.backward"]["output"][0], hc.grad, rel=1e-4)


def test_tensor_task_saves_npu_tensors_readable_on_the_host(torch_npu, debugger, tmp_path):
    x = torch.randn(3, 8).npu()
    g = torch.rand(8).npu()
    out = {}
    data = _run_recorded(debugger, tmp_path, lambda: out.update(y=torch_npu.npu_rms_norm(x, g)[0]), task="tensor")
    entry = data["NPU.npu_rms_norm.0.forward"]["output"][0]
    assert entry["data_name"] == "NPU.npu_rms_norm.0.forward.output.0.pt"
    rec = msprobe.readers.open(str(tmp_path)).record("NPU.npu_rms_norm.0.forward", step=0)
    loaded = rec.output[0].load(framework="torch")
    assert loaded.device.type == "cpu" and torch.equal(loaded, out["y"].cpu())
    assert torch.equal(rec.input_args[0].load(framework="torch"), x.cpu())


def test_statistics_of_npu_tensors_are_fetched_in_batches(torch_npu, debugger, tmp_path):
    """Statistics stay on the device until a batch is fetched: a handful of device-to-host
    transfers for the whole step, not one per statistic or per tensor."""
    x = torch.randn(4, 16).npu()
    g = torch.rand(16).npu()
    dbg = debugger(dump_path=str(tmp_path), task="statistics", level="L1")
    dbg.start()
    before = torch_npu._backend.stats["d2h"]
    for _ in range(40):
        x = torch_npu.npu_rms_norm(x, g)[0] * 1.5
    during = torch_npu._backend.stats["d2h"] - before
    dbg.stop()
    dbg.step()
    total = torch_npu._backend.stats["d2h"] - before
    data = _dump_json(tmp_path)["data"]
    entries = sum(1 for r in data.values() for v in [*r.get("input_args", []), *r.get("output", [])]
                  if isinstance(v, dict) and v.get("type") == "torch.Tensor")
    assert entries >= 200
    # one transfer per (kind, width, dtype, device) group at each crash-journal flush (every
    # journal_batch records) and at publish: a few per step, against hundreds of tensors
    flushes = len(data) // dbg._get().dumper.session.journal_batch
    assert during <= flushes, (during, flushes)
    assert total <= flushes + 2, total


def test_md5_of_npu_tensors_is_fetched_in_batches(torch_npu, debugger, tmp_path):
    """md5 (CRC-32) on a device: each tensor's bytes stay on the device until its record's batch is
    fetched, then come to the host together (one transfer per fetch, not one per tensor), and every
    checksum is that of the tensor's bytes when it was recorded (a later in-place write changes nothing)."""
    import zlib

    x = torch.randn(4, 16).npu()
    g = torch.rand(16).npu()
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"task": "statistics", "dump_path": str(tmp_path / "d"), "level": "L1",
                               "statistics": {"summary_mode": "md5"}}))
    dbg = debugger(config_path=str(cfg))
    dbg.start()
    before = torch_npu._backend.stats["d2h"]
    want = []
    for _ in range(40):
        want.append((x.cpu(), g.cpu()))
        before += 2  # (the reference copies above)
        x = torch_npu.npu_rms_norm(x, g)[0] * 1.5
    during = torch_npu._backend.stats["d2h"] - before
    x.mul_(0.0)  # after its record: its checksum is of the values it had
    dbg.stop()
    dbg.step()
    data = _dump_json(tmp_path / "d")["data"]
    names = [n for n in data if n.startswith("NPU.npu_rms_norm.")]
    assert len(names) == 40
    for n, (xi, gi) in zip(names, want):
        args = data[n]["input_args"]
        assert args[0]["md5"] == f"{zlib.crc32(xi.contiguous().numpy().tobytes()):08x}", n
        assert args[1]["md5"] == f"{zlib.crc32(gi.contiguous().numpy().tobytes()):08x}", n
    tensors = sum(1 for r in data.values() for v in [*r.get("input_args", []), *r.get("output", [])]
                  if isinstance(v, dict) and v.get("type") == "torch.Tensor")
    assert tensors >= 200
    flushes = len(data) // dbg._get().dumper.session.journal_batch
    # per flush: the statistics batch and the checksums' batch, against 3-4 tensors per record
    assert during <= 2 * flushes, (during, flushes, tensors)


def test_seed_all_seeds_the_npu_and_sets_deterministic_collectives(torch_npu, monkeypatch):
    from msprobe.pytorch import seed_all

    monkeypatch.delenv("HCCL_DETERMINISTIC", raising=False)
    monkeypatch.delenv("LCCL_DETERMINISTIC", raising=False)
    start = len(torch_npu.npu.calls)
    seed_all(4321, mode=False, rm_dropout=False)
    assert ("manual_seed", 4321) in torch_npu.npu.calls[start:] and ("manual_seed_all", 4321) in torch_npu.npu.calls
    assert os.environ["HCCL_DETERMINISTIC"] == "False" and "LCCL_DETERMINISTIC" not in os.environ
    try:
        seed_all(5, mode=True, rm_dropout=False)
        assert os.environ["HCCL_DETERMINISTIC"] == "True" and os.environ["LCCL_DETERMINISTIC"] == "1"
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


def test_npu_available(torch_npu):
    from msprobe.dumpers.pytorch import npu_available

    assert npu_available() is True


_NO_NPU = r"""
import sys, json
import torch
from msprobe.dumpers.pytorch import PrecisionDebugger, npu_available, seed_all
dbg = PrecisionDebugger(dump_path=sys.argv[1], task="statistics", level="L1")
seed_all(3, rm_dropout=False)
dbg.start()
torch.nn.functional.relu(torch.randn(3))
dbg.stop(); dbg.step()
print(json.dumps({"mods": sorted(m for m in sys.modules if m.split(".")[0] == "torch_npu"),
                  "available": npu_available(), "backend": torch._C._get_privateuse1_backend_name(),
                  "npu_attr": hasattr(torch, "npu")}))
"""


def test_without_torch_npu_nothing_of_it_is_imported(tmp_path):
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root)
    res = subprocess.run([sys.executable, "-c", _NO_NPU, str(tmp_path)], capture_output=True, text=True,
                         env=env, cwd=str(tmp_path), timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got == {"mods": [], "available": False, "backend": "privateuseone", "npu_attr": False}
    assert "Functional.relu.0.forward" in _dump_json(tmp_path)["data"]


def test_fusion_attention_bf16_gqa_forward_backward(torch_npu, debugger, tmp_path):
    torch.manual_seed(2)
    B, N, NKV, S, D = 2, 4, 2, 6, 8
    q = torch.randn(B, S, N * D).bfloat16()
    k = torch.randn(B, S, NKV * D).bfloat16()
    v = torch.randn(B, S, NKV * D).bfloat16()
    mask = torch.triu(torch.ones(S, S, dtype=torch.bool), 1)
    w = torch.randn(B, S, N * D)
    qn, kn, vn = (t.npu().requires_grad_() for t in (q, k, v))
    out = {}

    def body():
        res = torch_npu.npu_fusion_attention(qn, kn, vn, N, "BSH", atten_mask=mask.npu(), scale=D ** -0.5)
        out["res"] = res
        (res[0].float() * w.npu()).sum().backward()

    data = _run_recorded(debugger, tmp_path, body)
    fwd = data["NPU.npu_fusion_attention.0.forward"]
    assert [a.get("type") for a in fwd["input_args"]] == ["torch.Tensor"] * 3 + ["int", "str"]
    assert fwd["input_kwargs"]["atten_mask"]["dtype"] == "torch.bool"
    o = fwd["output"]
    assert [e["dtype"] for e in o[:4]] == ["torch.bfloat16", "torch.float32", "torch.float32", "torch.bfloat16"]
    assert o[1]["shape"] == [B, N, S, 8] and o[3]["shape"] == [0] and o[3]["Max"] is None
    assert o[4:] == [{"type": "int", "value": 0}] * 3  # seed, offset, numels

    def split(t, n):
        return t.float().reshape(B, S, n, D).transpose(1, 2).detach().requires_grad_()

    qc, kc, vc = split(q, N), split(k, NKV), split(v, NKV)
    ref = torch.nn.functional.scaled_dot_product_attention(
        qc, kc.repeat_interleave(N // NKV, 1), vc.repeat_interleave(N // NKV, 1), attn_mask=~mask, scale=D ** -0.5)
    ref = ref.transpose(1, 2).reshape(B, S, N * D)
    (ref.bfloat16().float() * w).sum().backward()
    _stats_close(o[0], ref.bfloat16(), rel=2e-2)
    bwd = data["NPU.npu_fusion_attention.0.backward"]
    assert bwd["input"][0]["dtype"] == "torch.bfloat16" and all(g is None for g in bwd["input"][1:])
    for entry, ref_g, n in zip(bwd["output"][:3], (qc.grad, kc.grad, vc.grad), (N, NKV, NKV)):
        _stats_close(entry, ref_g.transpose(1, 2).reshape(B, S, n * D).bfloat16(), rel=3e-2)


def test_tensor_npu_is_not_recorded_like_tensor_cuda(torch_npu, debugger, tmp_path):
    # 26.2.0's lists wrap neither Tensor.npu nor Tensor.cuda (spec/PRODUCER.md section 20, API coverage)
    data = _run_recorded(debugger, tmp_path, lambda: (torch.ones(3).npu(), torch.ones(2).to(torch.device("npu", 0))))
    assert not [n for n in data if n.startswith(("Tensor.npu.", "Tensor.cuda."))], list(data)
    # (the test-only torch_npu's Tensor.npu is Python calling Tensor.to: that nested call is recorded)
    to = [v for n, v in data.items() if n.startswith("Tensor.to.")]
    assert to and to[-1]["input_args"][1] == {"type": "torch.device", "value": "npu:0"}, list(data)
