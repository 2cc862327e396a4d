"""Level L2 (kernel dump) through the fake torch_npu's recording init_dump/set_dump/finalize_dump."""
from __future__ import annotations

import json
import re

import pytest

torch = pytest.importorskip("torch")

import msprobe.readers  # noqa: E402
from msprobe.errors import ConfigError, MissingDependencyError, MsprobeError  # noqa: E402


def _l2(debugger, tmp_path, lst, task="tensor", step=None):
    cfg = {"task": task, "dump_path": str(tmp_path / "dump"), "level": "L2", task: {"list": lst}}
    if step is not None:
        cfg["step"] = step
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return debugger(config_path=str(path))


def _calls(torch_npu, start):
    return [c for c, _ in torch_npu.npu.calls[start:] if c in ("init_dump", "set_dump", "finalize_dump")]


def _run(dbg, torch_npu, steps=2, calls=2):
    x = torch.randn(2, 8).npu().requires_grad_()
    g = torch.ones(8, device="npu", requires_grad=True)
    for _ in range(steps):
        dbg.start()
        for _ in range(calls):
            y, _ = torch_npu.npu_rms_norm(x, g)
            y.sum().backward()
        dbg.stop()
        dbg.step()


def test_forward_kernel_dump_per_step(torch_npu, debugger, tmp_path, capsys):
    dbg = _l2(debugger, tmp_path, ["NPU.npu_rms_norm.1.forward"])
    tmp_path = tmp_path / "dump"
    start = len(torch_npu.npu.calls)
    _run(dbg, torch_npu)
    # one init/set/finalize window per step, around the second call only
    assert _calls(torch_npu, start) == ["init_dump", "set_dump", "finalize_dump"] * 2
    out = capsys.readouterr().out
    assert out.count("the kernels of NPU.npu_rms_norm.1.forward were dumped") == 2
    for step in (0, 1):
        sd = tmp_path / f"step{step}"
        cfg = json.loads((sd / "kernel_config_0.json").read_text())
        assert cfg == {"dump": {"dump_list": [], "dump_path": str(sd), "dump_mode": "all", "dump_op_switch": "on"}}
        assert not (sd / "rank").exists() and not list(sd.glob("*/dump.json"))
        stamps = [p for p in sd.iterdir() if p.is_dir()]
        assert len(stamps) == 1 and re.fullmatch(r"\d{14}", stamps[0].name)
        files = sorted(p.name for p in (stamps[0] / "0").iterdir())
        assert files and all(f.startswith("NpuRmsNorm.") for f in files)  # just the API's own kernel
    d = msprobe.readers.open(str(tmp_path))
    kd = d.kernel_dumps()
    assert [(k.step, k.device, k.op_type) for k in kd] == [(0, 0, "NpuRmsNorm"), (1, 0, "NpuRmsNorm")]
    assert kd[0].read_bytes().startswith(b"FAKEACLDUMP") and kd[0].size == len(kd[0].read_bytes())
    assert set(d.kernel_configs()) == {(0, 0), (1, 0)}
    assert d.kernel_dumps(step=1) == [kd[1]]


def test_backward_kernel_dump_wraps_the_api_backward_node(torch_npu, debugger, tmp_path, capsys):
    dbg = _l2(debugger, tmp_path, ["NPU.npu_rms_norm.0.backward"], step=[1])
    tmp_path = tmp_path / "dump"
    start = len(torch_npu.npu.calls)
    _run(dbg, torch_npu)
    assert _calls(torch_npu, start) == ["init_dump", "set_dump", "finalize_dump"]  # step 1 only
    assert "the kernels of NPU.npu_rms_norm.0.backward were dumped (step 1)" in capsys.readouterr().out
    assert not (tmp_path / "step0").exists()
    types = {k.op_type for k in msprobe.readers.open(str(tmp_path)).kernel_dumps()}
    assert "NpuRmsNormBackward" in types and "NpuRmsNorm" not in types


def test_unsupported_api_is_reported_and_not_dumped(torch_npu, debugger, tmp_path, capsys):
    import torch.nn.functional as F

    dbg = _l2(debugger, tmp_path, ["Functional.linear.0.forward"])
    start = len(torch_npu.npu.calls)
    dbg.start()
    F.linear(torch.randn(2, 3), torch.randn(4, 3))  # on the CPU: no NPU kernel to dump
    dbg.stop()
    dbg.step()
    assert _calls(torch_npu, start) == []
    assert "kernel dump cannot dump Functional.linear.0.forward" in capsys.readouterr().out


@pytest.mark.parametrize("kwargs, match", [
    ({"task": "tensor", "list": []}, "exactly one API"),
    ({"task": "tensor", "list": ["NPU.npu_rms_norm.0.forward", "NPU.npu_swiglu.0.forward"]}, "exactly one API"),
    ({"task": "tensor", "list": ["npu_rms_norm"]}, "exactly one API"),
    ({"task": "statistics", "list": ["NPU.npu_rms_norm.0.forward"]}, "task 'tensor'"),
])
def test_bad_l2_config_is_a_config_error(torch_npu, debugger, tmp_path, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        _l2(debugger, tmp_path, kwargs["list"], task=kwargs["task"])


def test_without_torch_npu_or_npu_l2_is_a_typed_error(torch_npu, debugger, tmp_path, monkeypatch):
    import msprobe.dumpers.pytorch._kernel_dump as kernel_dump_mod

    monkeypatch.setattr(torch_npu.npu, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="needs an Ascend NPU"):
        _l2(debugger, tmp_path, ["NPU.npu_rms_norm.0.forward"])
    debugger._reset()
    monkeypatch.setattr(kernel_dump_mod, "torch_npu_module", lambda: None)  # (the name the L2 dumper calls)
    with pytest.raises(MissingDependencyError, match="torch_npu") as ei:
        _l2(debugger, tmp_path, ["NPU.npu_rms_norm.0.forward"])
    assert isinstance(ei.value, MsprobeError) and isinstance(ei.value, ImportError)


def test_msprobe_ls_lists_kernel_dumps(torch_npu, debugger, tmp_path, capsys):
    from msprobe.cli import main

    dbg = _l2(debugger, tmp_path, ["NPU.npu_rms_norm.0.forward"])
    _run(dbg, torch_npu, steps=1, calls=1)
    capsys.readouterr()
    main(["ls", str(tmp_path / "dump")])
    out = capsys.readouterr().out
    assert "kernel dump (L2): 1 file(s)" in out and "not decoded" in out
    main(["ls", "--json", str(tmp_path / "dump")])
    got = json.loads(capsys.readouterr().out)
    assert [(k["step"], k["device"]) for k in got["kernel_dumps"]] == [(0, 0)]
    assert got["kernel_dumps"][0]["name"].startswith("NpuRmsNorm.")
