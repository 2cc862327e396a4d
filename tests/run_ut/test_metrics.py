"""The judgement of one output: the docs' rule by dtype and the new-standard algorithms."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from msprobe.run_ut import standards as S  # noqa: E402
from msprobe.run_ut.metrics import compare_values  # noqa: E402

B = torch.linspace(0.5, 1.0, 10000, dtype=torch.float64)


@pytest.mark.parametrize("dtype,scale,expect", [
    (torch.float32, 1 + 5e-4, "pass"),        # max abs error < 0.001
    (torch.float32, 1 + 5e-3, "error"),       # dual-thousand fails
    (torch.float16, 1 + 5e-3, "warning"),     # dual-hundred passes, dual-thousand fails
    (torch.float16, 1 + 5e-2, "error"),       # dual-hundred fails
    (torch.float64, 1 + 5e-4, "pass"),
])
def test_docs_rule_by_dtype(dtype, scale, expect):
    row = compare_values("x.forward.output.0", "sum", B, (B * scale).to(dtype))
    assert row["status"] == expect, row["message"]
    assert row["device_dtype"] == str(dtype) and row["bench_dtype"] == "torch.float64"


def test_dual_thousand_warning_band_float32():
    d = B.clone()
    d[:5] *= 1.01  # 0.05% of the elements off by 1%: dual-thousand passes, dual-ten-thousand fails
    row = compare_values("x", "sum", B, d.to(torch.float32))
    assert row["status"] == "warning"


def test_cosine_error_and_special_cases():
    assert compare_values("x", "sum", B, (-B).float())["status"] == "error"
    z = torch.zeros(4, dtype=torch.float64)
    row = compare_values("x", "sum", z, z.float())
    assert row["status"] == "pass" and row.get("cosine") is None and "zero" in row["message"]
    row = compare_values("x", "sum", torch.tensor(2.0, dtype=torch.float64), torch.tensor(2.0))
    assert row["status"] == "pass" and "Scalar" in row["message"]
    nan = B.clone()
    nan[3] = float("nan")
    assert compare_values("x", "sum", B, nan.float())["status"] == "error"
    assert compare_values("x", "sum", B, B[:5].float())["status"] == "error"  # shape mismatch
    assert compare_values("x", "sum", None, B)["status"] == "SKIP"
    assert compare_values("x", "sum", B[:0], B[:0])["status"] == "SKIP"


def test_binary_for_int_bool_and_exact_ops():
    i = torch.arange(10)
    assert compare_values("x", "sum", i, i)["status"] == "pass"
    j = i.clone()
    j[0] = 5
    row = compare_values("x", "sum", i, j)
    assert row["status"] == "error" and row["binary_err"] == pytest.approx(0.1)
    # relu must be exact: one ULP off is an error although max abs error < 0.001
    d = B.float().clone()
    d[7] = torch.nextafter(d[7], torch.tensor(10.0))
    assert S.algorithm_of("relu") == S.BINARY
    assert compare_values("x", "relu", B, d)["status"] == "error"
    assert compare_values("x", "sum", B, d)["status"] == "pass"


def test_absolute_threshold_ulp_and_thousandth():
    assert S.algorithm_of("__add__") == S.ABSOLUTE and S.algorithm_of("add_") == S.ABSOLUTE
    assert S.algorithm_of("linear") == S.ULP and S.algorithm_of("conv2d") == S.THOUSANDTH
    assert S.algorithm_of("add.Tensor") == S.ABSOLUTE  # Aten overload
    d = (B * (1 + 1e-5)).float()  # 10 ULP-ish of fp32, relative 1e-5 > 1e-6 rtol
    assert compare_values("x", "add", B, d)["status"] == "error"
    assert compare_values("x", "add", B, B.float())["status"] == "pass"
    row = compare_values("x", "matmul", B, d)
    assert row["ulp_mean"] > 32 and row["status"] == "error"
    assert compare_values("x", "matmul", B, B.float())["status"] == "pass"
    c = B.clone()
    c[:20] *= 1.01  # 0.2% of the elements beyond 0.1%
    assert compare_values("x", "conv2d", B, c.float())["status"] == "error"
    assert compare_values("x", "conv2d", B, B.float())["status"] == "pass"


def test_rounding_noise_in_the_small_value_domain_is_not_a_cosine_error():
    """A bias gradient that is zero in exact arithmetic (BERT's key projection: softmax ignores a
    constant added to every key) is cancellation noise near 1e-14 on both sides: two noises have no
    meaningful cosine, and every element is within the small-value tolerance (a healthy BERT's
    run_ut once listed Functional.linear as an error for it)."""
    g = torch.Generator().manual_seed(0)
    bench = torch.randn(32, generator=g, dtype=torch.float64) * 1e-14
    device = (bench + torch.randn(32, generator=g, dtype=torch.float64) * 1e-14).to(torch.float32)
    row = compare_values("Functional.linear.1.backward.output.2", "", bench, device)
    assert row["status"] == "pass", row["message"]
    assert row["cosine"] is None and "rounding noise" in row["message"]
    # values above the small-value bound keep the cosine rule
    row = compare_values("x", "", bench * 1e10, (device.double() * 1e10).to(torch.float32))
    assert row["status"] == "error" and row["cosine"] is not None and row["cosine"] <= 0.99


def _silu_case(dtype_of_kernel):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(4, 8, 64, generator=g) * 0.1).float()  # a freshly initialised model's activations
    bench = torch.nn.functional.silu(x.double())
    device = torch.nn.functional.silu(x)  # the replay: a correct float32 kernel
    recorded = torch.nn.functional.silu(x.to(dtype_of_kernel)).to(torch.float32)  # what the dump holds
    return compare_values("Functional.silu.0.forward.output.0", "silu", bench, device, recorded=recorded)


def test_a_dumped_output_computed_in_bfloat16_is_an_error_even_below_0_001():
    """The docs' rule passes the dumped output (max abs error < 0.001); against the replay's error it
    is ~1e4x further from the benchmark, with a mean relative error ~1e-3 for a float32 API."""
    row = _silu_case(torch.bfloat16)
    assert row["status"] == "error", row["message"]
    assert "further from the benchmark than this device's replay" in row["message"]
    assert _silu_case(torch.float32)["status"] == "pass"  # the healthy dump: the same kernel as the replay


def test_matmul_and_conv_outputs_are_not_held_against_the_replay():
    """Their float32 precision follows backend flags the training process may set and run_ut does
    not (TF32 convolutions by default on CUDA, HF32 on Ascend, set_float32_matmul_precision): a
    reduced-precision linear is judged by the rules of its own algorithm (the ULP rule, the
    thousandth rule), not by the replay's error, and so is a gradient row (the benchmark rule)."""
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(8, 16, generator=g) * 0.05, torch.randn(4, 16, generator=g) * 0.05
    bench = torch.nn.functional.linear(x.double(), w.double())
    device = torch.nn.functional.linear(x, w)
    recorded = torch.nn.functional.linear(x.bfloat16(), w.bfloat16()).float()
    for api in ("linear", "matmul", "conv2d", "conv3d"):
        row = compare_values("Functional.x.0.forward.output.0", api, bench, device, recorded=recorded)
        assert "replay" not in row["message"], (api, row["message"])
    row = compare_values("Functional.silu.0.backward.output.0", "", bench, device, recorded=recorded)
    assert "replay" not in row["message"]
    # the same numbers as an elementwise API's output are held against the replay
    row = compare_values("Functional.gelu.0.forward.output.0", "gelu", bench, device, recorded=recorded)
    assert row["status"] == "error" and "replay" in row["message"]
