"""run_ut replays NPU.* APIs where torch_npu imports (here the fake one): device side on the NPU in
the recorded dtype, benchmark on the CPU in float64."""
from __future__ import annotations


def test_npu_api_replayed_on_npu(torch_npu):
    import torch

    from msprobe.run_ut import ApiPacket, CheckOptions, check_api, execute

    execute._NPU = None  # re-probe torch_npu (imported by the fixture)
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    g = torch.ones(8, dtype=torch.bfloat16)
    res = check_api(ApiPacket("NPU.npu_rms_norm.0", [x, g], {"epsilon": 1e-6}), CheckOptions(device="npu:0"))
    assert res.forward in ("pass", "warning"), res.rows  # bf16 rounding: the dual-thousand index may warn
    first = res.rows[0]
    assert first["device_dtype"] == "torch.bfloat16" and first["bench_dtype"] == "torch.float64"
    # Torch APIs run on the NPU too
    a = torch.randn(8, 8)
    res = check_api(ApiPacket("Torch.matmul.0", [a, a], {}), CheckOptions(device="npu:0"))
    assert res.forward == "pass", res.rows
