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
