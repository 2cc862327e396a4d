"""Compare one device output with its CPU benchmark: the metrics and the status of one details row.

Everything is computed in float64 on the CPU. The status of a row combines the
docs' section 4.1 rule (cosine > 0.99, max abs error < 0.001, then the
dual-hundred/thousand/ten-thousand indices by dtype) with the single-side verdict
of the API's algorithm under the new precision standard (binary consistency,
absolute threshold, ULP error, thousandth rule); the benchmark-comparison metrics
are reported and judged later by ``api_precision_compare``.
"""
from __future__ import annotations

import math
from typing import Any, Optional

from msprobe.run_ut import standards as S

__all__ = ["DETAILS_HEADER", "DETAIL_FIELDS", "compare_values", "skip_row", "worst", "PASS", "WARNING", "ERROR",
           "SKIP", "dtype_name"]

PASS, WARNING, ERROR, SKIP = "pass", "warning", "error", "SKIP"
_RANK = {PASS: 0, SKIP: 0, WARNING: 1, ERROR: 2}

#: internal field -> column header of accuracy_checking_details_{ts}.csv (the docs' columns)
DETAIL_FIELDS = [
    ("name", "API Name"), ("bench_dtype", "Bench Dtype"), ("device_dtype", "DEVICE Dtype"), ("shape", "Shape"),
    ("cosine", "余弦相似度"), ("max_abs", "最大绝对误差"), ("rel100", "双百指标"), ("rel1000", "双千指标"),
    ("rel10000", "双万指标"), ("binary_err", "二进制一致错误率"), ("eb", "误差均衡性"), ("rmse", "均方根误差"),
    ("small_value_err", "小值域错误占比"), ("max_rel", "相对误差最大值"), ("mean_rel", "相对误差平均值"),
    ("inf_nan_err", "inf/nan错误率"), ("rel_err_ratio", "相对误差错误率"), ("abs_err_ratio", "绝对误差错误率"),
    ("ulp_max", "ULP误差最大值"), ("ulp_mean", "ULP误差平均值"), ("ulp_ratio", "ULP误差大于阈值占比"),
    ("status", "Status"), ("message", "Message"),
]
DETAILS_HEADER = [h for _, h in DETAIL_FIELDS]


def worst(statuses) -> str:
    out = PASS
    for s in statuses:
        if s is not None and _RANK.get(s, 0) > _RANK[out]:
            out = s
    return out


def dtype_name(t: Any) -> str:
    """``torch.float32`` for a tensor, the Python type name for anything else."""
    import torch

    if isinstance(t, torch.Tensor):
        return str(t.dtype)
    return type(t).__name__


def _canon(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def skip_row(name: str, message: str) -> dict:
    return {"name": name, "status": SKIP, "message": message}


def compare_values(name: str, api_name: str, bench: Any, device: Any, *, recorded: Any = None) -> dict:
    """One details row: ``device`` (output or gradient on the device side) against ``bench``.

    ``recorded``, when given, is the output the dump holds for this position (a tensor
    dump): it is judged against the benchmark too and can only make the row worse.
    """
    import torch

    if bench is None:
        return skip_row(name, "No benchmark value at this position (the API returned None or no gradient flows "
                              "to this argument): nothing to compare.")
    if device is None:
        return _row(name, bench, device, {"status": ERROR}, ["The device side returned nothing where the benchmark "
                                                             "has a value."])
    if not isinstance(bench, torch.Tensor) or not isinstance(device, torch.Tensor):
        return _compare_builtin(name, bench, device)
    if bench.numel() == 0 or device.numel() == 0:
        return skip_row(name, "Empty tensor: there is no element to compare.")
    if tuple(bench.shape) != tuple(device.shape):
        return _row(name, bench, device, {"status": ERROR},
                    [f"Shape mismatch: device {tuple(device.shape)} vs benchmark {tuple(bench.shape)}."])
    if bench.is_complex() or device.is_complex():
        bench, device = torch.view_as_real(bench.detach().cpu()), torch.view_as_real(device.detach().cpu())
    if not device.is_floating_point() or not bench.is_floating_point():
        row = _compare_exact(name, bench, device)
    else:
        row = _compare_float(name, api_name, bench, device)
    if recorded is not None and isinstance(recorded, torch.Tensor) and recorded.numel():
        _judge_recorded(row, name, api_name, bench, recorded)
    return row


def _row(name: str, bench: Any, device: Any, fields: dict, messages: list) -> dict:
    import torch

    row = {"name": name, "bench_dtype": dtype_name(bench), "device_dtype": dtype_name(device)}
    ref = device if isinstance(device, torch.Tensor) else bench
    row["shape"] = str(tuple(ref.shape)) if isinstance(ref, torch.Tensor) else "[]"
    row.update(fields)
    row["message"] = "\n".join(m for m in messages if m)
    return row


def _compare_builtin(name: str, bench: Any, device: Any) -> dict:
    import torch

    if isinstance(bench, torch.Tensor) != isinstance(device, torch.Tensor):
        return _row(name, bench, device, {"status": ERROR},
                    [f"Type mismatch: device {type(device).__name__} vs benchmark {type(bench).__name__}."])
    if isinstance(bench, float) and isinstance(device, float):
        return _compare_float(name, "", torch.tensor(bench, dtype=torch.float64),
                              torch.tensor(device, dtype=torch.float64))
    same = bench == device
    try:
        same = bool(same)
    except Exception:  # noqa: BLE001 - exotic objects
        same = repr(bench) == repr(device)
    return _row(name, bench, device, {"binary_err": 0.0 if same else 1.0, "status": PASS if same else ERROR},
                [f"{type(device).__name__} value: binary comparison only."])


def _compare_exact(name: str, bench: Any, device: Any) -> dict:
    import torch

    d = device.detach().cpu()
    b = bench.detach().cpu()
    if b.dtype != d.dtype:
        b = b.to(d.dtype)
    diff = (d != b)
    if d.is_floating_point():
        diff &= ~(torch.isnan(d) & torch.isnan(b))
    rate = float(diff.sum()) / d.numel()
    return _row(name, bench, device, {"binary_err": rate, "status": PASS if rate == 0 else ERROR},
                [f"{_canon(d.dtype)} data: binary comparison only."])


def _as64(t: Any) -> Any:
    import torch

    return t.detach().to("cpu").to(torch.float64).reshape(-1)


def _compare_float(name: str, api_name: str, bench: Any, device: Any) -> dict:
    import torch

    dtype = _canon(device.dtype)
    d, b = _as64(device), _as64(bench)
    n = d.numel()
    msgs: list = []
    f: dict = {}
    fin_d, fin_b = torch.isfinite(d), torch.isfinite(b)
    both = fin_d & fin_b
    special = ~(fin_d & fin_b)
    same_special = (torch.isnan(d) & torch.isnan(b)) | (d == b)
    inf_nan_err = float((special & ~same_special).sum()) / n
    if not bool(both.all()):
        d, b = d[both], b[both]
    diff = d - b
    absd = diff.abs()
    max_abs = float(absd.max()) if absd.numel() else 0.0
    f["max_abs"] = max_abs
    # cosine similarity
    if n == 1:
        msgs.append("Scalar output: the cosine similarity does not apply.")
        cos = None
    else:
        nd, nb = float(d.norm()), float(b.norm())
        if not d.numel():  # every element NaN/Inf (a mask filled with -inf): inf_nan_err judges them
            msgs.append("No finite element on both sides: the cosine similarity does not apply.")
            cos = None
        elif (nd == 0 or nb == 0) and max(float(d.abs().max()), float(b.abs().max())) < 1e-12:
            msgs.append("Device and benchmark outputs are all (numerically) zero: the cosine similarity does not apply.")
            cos = None
        elif nd == 0 or nb == 0:
            cos = 0.0
        else:
            cos = float(torch.dot(d, b)) / (nd * nb)
            cos = min(cos, 1.0)
        f["cosine"] = cos
    covered = dtype in S.NEW_STANDARD_DTYPES
    if covered:
        m = absd.numel()
        sv, satol = S.SMALL_VALUE[dtype], S.SMALL_VALUE_ATOL[dtype]
        absb = b.abs()
        small = absb < sv
        n_small = int(small.sum())
        f["eb"] = abs(float(torch.sign(diff).sum())) / m if m else 0.0
        f["rmse"] = math.sqrt(float((diff * diff).mean())) if m else 0.0
        f["small_value_err"] = float((small & (absd > satol)).sum()) / n_small if n_small else 0.0
        normal = ~small
        if bool(normal.any()):
            rel = absd[normal] / absb[normal]
            f["max_rel"], f["mean_rel"] = float(rel.max()), float(rel.mean())
        else:
            f["max_rel"] = f["mean_rel"] = 0.0
    else:
        msgs.append(f"{_canon(device.dtype)} is not covered by the new precision standard: "
                    "only the cosine/max-abs-error rule applies.")
    # the docs' section 4.1 rule
    old = _old_rule(f, cos, max_abs, dtype, absd, b, msgs)
    new = _new_rule(f, api_name, dtype, device, bench, absd, b, inf_nan_err, msgs) if covered else None
    status = worst([old, new])
    if inf_nan_err > 0:
        f["inf_nan_err"] = inf_nan_err
        msgs.append(f"inf/nan differ from the benchmark at {inf_nan_err:.2%} of the elements.")
        status = ERROR
    f["status"] = status
    return _row(name, bench, device, f, msgs)


def _rel_all(absd: Any, b: Any) -> Any:
    import torch

    absb = b.abs()
    rel = torch.where(absb > 0, absd / absb.clamp_min(1e-300), torch.where(absd > 0, math.inf, 0.0))
    return rel


def _old_rule(f: dict, cos: Optional[float], max_abs: float, dtype: str, absd: Any, b: Any, msgs: list) -> str:
    if cos is not None and cos <= 0.99:
        msgs.append(f"Cosine similarity {cos:.6f} <= 0.99: error.")
        return ERROR
    if max_abs < 0.001:
        msgs.append("Max abs error < 0.001: pass (the relative-error indices are left blank).")
        return PASS
    rel = _rel_all(absd, b)
    m = rel.numel()
    for key, t in (("rel100", 0.01), ("rel1000", 0.001), ("rel10000", 0.0001)):
        f[key] = float((rel < t).sum()) / m if m else 1.0

    # (index deciding error, its tolerance, index deciding warning, its tolerance) by dtype
    if dtype in ("float16", "bfloat16"):
        steps = (("rel100", 0.01, "Dual-hundred"), ("rel1000", 0.001, "Dual-thousand"))
    else:
        steps = (("rel1000", 0.001, "Dual-thousand"), ("rel10000", 0.0001, "Dual-ten-thousand"))
    for (key, t, label), verdict in zip(steps, (ERROR, WARNING)):
        if not (1.0 - f[key]) < t:
            msgs.append(f"{label} index fails: {verdict}.")
            return verdict
    return PASS


def _new_rule(f: dict, api_name: str, dtype: str, device: Any, bench: Any, absd: Any, b: Any, inf_nan_err: float,
              msgs: list) -> Optional[str]:
    import torch

    algo = S.algorithm_of(api_name)
    if algo == S.BINARY:
        d = device.detach().cpu()
        bb = bench.detach().cpu().to(d.dtype)
        neq = (d != bb) & ~(torch.isnan(d) & torch.isnan(bb))
        rate = float(neq.sum()) / d.numel()
        f["binary_err"] = rate
        if rate:
            msgs.append(f"Binary consistency: {rate:.2%} of the elements differ from the benchmark: error.")
            return ERROR
        return PASS
    if algo == S.ABSOLUTE:
        rtol, sv, satol = S.absolute_thresholds(dtype) or (0.0, 0.0, 0.0)  # covered dtypes all have them
        absb = b.abs()
        small = absb < sv
        normal = ~small
        n_n, n_s = int(normal.sum()), int(small.sum())
        f["inf_nan_err"] = inf_nan_err
        f["rel_err_ratio"] = float((normal & (absd > rtol * absb)).sum()) / n_n if n_n else 0.0
        f["abs_err_ratio"] = float((small & (absd > satol)).sum()) / n_s if n_s else 0.0
        if f["rel_err_ratio"] or f["abs_err_ratio"] or inf_nan_err:
            msgs.append("Absolute threshold: relative/absolute error or inf/nan above the thresholds: error.")
            return ERROR
        return PASS
    if algo == S.ULP:
        mant, min_exp = S.ULP_PARAMS[dtype]
        absb = b.abs()
        exp = torch.floor(torch.log2(absb.clamp_min(2.0 ** min_exp))).clamp_min(min_exp)
        ulp = torch.pow(2.0, exp - mant)
        err = absd / ulp
        thr = S.ulp_threshold(dtype)
        m = err.numel()
        f["ulp_max"] = float(err.max()) if m else 0.0
        f["ulp_mean"] = float(err.mean()) if m else 0.0
        f["ulp_ratio"] = float((err > thr).sum()) / m if m else 0.0
        ok = (f["ulp_mean"] < 64 or f["ulp_ratio"] < 0.05) if dtype == "float32" else f["ulp_ratio"] < 0.001
        if not ok:
            msgs.append(f"ULP error: mean {f['ulp_mean']:.3f}, {f['ulp_ratio']:.2%} above {thr:g} ULP: error.")
            return ERROR
        return PASS
    if algo == S.THOUSANDTH:
        rel = _rel_all(absd, b)
        m = rel.numel()
        f["rel1000"] = float((rel < 0.001).sum()) / m if m else 1.0
        if f["rel1000"] <= 0.999:
            msgs.append(f"Thousandth rule: only {f['rel1000']:.4%} of the elements within 0.1%: error.")
            return ERROR
        return PASS
    return None


def _judge_recorded(row: dict, name: str, api_name: str, bench: Any, recorded: Any) -> None:
    """The dumped output (what the device really produced) against the benchmark."""
    import torch

    if tuple(recorded.shape) != tuple(bench.shape):
        row["status"] = ERROR
        row["message"] = (row.get("message", "") + f"\nDumped output shape {tuple(recorded.shape)} differs from "
                          f"the benchmark's {tuple(bench.shape)}: error.").strip()
        return
    rec = recorded
    if isinstance(bench, torch.Tensor) and bench.is_floating_point() and not rec.is_floating_point():
        rec = rec.to(bench.dtype)
    sub = compare_values(name, api_name, bench, rec)
    if _RANK.get(str(sub.get("status")), 0) > _RANK.get(str(row.get("status")), 0):
        row["status"] = sub["status"]
        detail = ", ".join(f"{k} {sub[k]:.6g}" for k in ("cosine", "max_abs", "binary_err", "ulp_mean")
                           if isinstance(sub.get(k), float))
        row["message"] = (row.get("message", "") + f"\nThe dumped output differs from the benchmark "
                          f"({detail}): {sub['status']}. {sub.get('message', '')}").strip()
