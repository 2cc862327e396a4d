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


#: elements per chunk of the passes over an output pair (2 MiB of float64): the metrics keep the pair
#: and at most one float64 array of its size (for a mean), never a float64 temporary per operation
_CHUNK = 1 << 18


def _flat(t: Any) -> Any:
    """``t`` on the CPU as a 1-D tensor in its own dtype (a view where it can be)."""
    return t.detach().cpu().reshape(-1)


def _chunks(n: int):
    return ((s, min(s + _CHUNK, n)) for s in range(0, n, _CHUNK))


def _compare_exact(name: str, bench: Any, device: Any) -> dict:
    d, b = _flat(device), _flat(bench)
    conv = b.dtype != d.dtype
    floating = d.is_floating_point()
    wrong = 0
    for s, e in _chunks(d.numel()):
        dc, bc = d[s:e], b[s:e]
        if conv:
            bc = bc.to(d.dtype)
        wrong += int(_differ(dc, bc, floating).sum())
    rate = float(wrong) / d.numel()
    return _row(name, bench, device, {"binary_err": rate, "status": PASS if rate == 0 else ERROR},
                [f"{_canon(d.dtype)} data: binary comparison only."])


def _differ(d: Any, b: Any, floating: bool) -> Any:
    """Where ``d`` and ``b`` differ (two NaNs are equal)."""
    import torch

    diff = d != b
    if floating:
        diff &= ~(torch.isnan(d) & torch.isnan(b))
    return diff


class _Pair:
    """A device output and its benchmark, read as float64 chunks of the elements compared: the pairs
    where both are finite. Every value is the one a float64 copy of the whole pair gives: where every
    pair is finite the chunks are converted from the two outputs; otherwise the finite pairs are
    gathered into two float64 arrays first."""

    def __init__(self, device: Any, bench: Any):
        import torch

        self.f64 = torch.float64
        self.dev, self.bench = _flat(device), _flat(bench)
        self.n = self.dev.numel()
        bad = 0
        mask = None
        for s, e in _chunks(self.n):
            d, b = self.dev[s:e].to(self.f64), self.bench[s:e].to(self.f64)
            fin = torch.isfinite(d) & torch.isfinite(b)
            if mask is None and not bool(fin.all()):
                mask = torch.ones(self.n, dtype=torch.bool)
            if mask is not None:
                mask[s:e] = fin
                same = (torch.isnan(d) & torch.isnan(b)) | (d == b)
                bad += int((~fin & ~same).sum())
        self.inf_nan_err = float(bad) / self.n
        self.d, self.b = self.dev, self.bench
        if mask is not None:
            m = int(mask.sum())
            self.d, self.b = torch.empty(m, dtype=self.f64), torch.empty(m, dtype=self.f64)
            at = 0
            for s, e in _chunks(self.n):
                keep = mask[s:e]
                k = int(keep.sum())
                self.d[at:at + k] = self.dev[s:e].to(self.f64)[keep]
                self.b[at:at + k] = self.bench[s:e].to(self.f64)[keep]
                at += k
        self.m = self.d.numel()
        self._scratch: Any = None

    def full(self, which: str) -> Any:
        """The compared elements of one side as one float64 array (converted once when needed)."""
        t = self.d if which == "d" else self.b
        return t if t.dtype == self.f64 else t.to(self.f64)

    def scratch(self, full_d: Any = None) -> Any:
        """A float64 array of ``m`` elements to fill: ``full_d`` (a converted copy of the device side
        that is no longer needed) where there is one."""
        if self._scratch is None:
            if full_d is not None and full_d.data_ptr() != self.d.data_ptr():
                self._scratch = full_d
            else:
                import torch

                self._scratch = torch.empty(self.m, dtype=self.f64)
        return self._scratch

    def pairs(self):
        """(slice, d - b, |d - b|, |b|): float64 chunks of the compared elements, in order."""
        for s, e in _chunks(self.m):
            b = self.b[s:e].to(self.f64)
            diff = self.d[s:e].to(self.f64) - b
            yield slice(s, e), diff, diff.abs(), b.abs()


def _compare_float(name: str, api_name: str, bench: Any, device: Any) -> dict:
    import torch

    dtype = _canon(device.dtype)
    p = _Pair(device, bench)
    n, m = p.n, p.m
    msgs: list = []
    f: dict = {}
    inf_nan_err = p.inf_nan_err
    pos = neg = 0
    max_abs = None
    covered = dtype in S.NEW_STANDARD_DTYPES
    sv, satol = (S.SMALL_VALUE[dtype], S.SMALL_VALUE_ATOL[dtype]) if covered else (0.0, 0.0)
    n_small = small_err = n_normal = 0
    max_rel = None
    # cosine similarity, over the whole arrays (a float sum depends on how it is split)
    cos = None
    full_d = None
    if n == 1:
        msgs.append("Scalar output: the cosine similarity does not apply.")
    else:
        full_d, full_b = p.full("d"), p.full("b")
        nd, nb = float(full_d.norm()), float(full_b.norm())
        if not full_d.numel():  # every element NaN/Inf (a mask filled with -inf): inf_nan_err judges them
            msgs.append("No finite element on both sides: the cosine similarity does not apply.")
        elif (nd == 0 or nb == 0) and max(_abs_max(full_d), _abs_max(full_b)) < 1e-12:
            msgs.append("Device and benchmark outputs are all (numerically) zero: the cosine similarity does not apply.")
        elif nd == 0 or nb == 0:
            cos = 0.0
        else:
            cos = float(torch.dot(full_d, full_b)) / (nd * nb)
            cos = min(cos, 1.0)
        del full_b
    for _, diff, absd, absb in p.pairs():
        pos += int((diff > 0).sum())
        neg += int((diff < 0).sum())
        cm = float(absd.max())
        max_abs = cm if max_abs is None else max(max_abs, cm)
        if covered:
            small = absb < sv
            n_small += int(small.sum())
            small_err += int((small & (absd > satol)).sum())
            normal = ~small
            k = int(normal.sum())
            if k:
                rel = p.scratch(full_d)[n_normal:n_normal + k]
                torch.div(absd[normal], absb[normal], out=rel)
                n_normal += k
    full_d = None
    max_abs = max_abs if max_abs is not None else 0.0
    f["max_abs"] = max_abs
    if n != 1:
        f["cosine"] = cos
    if covered:
        if n_normal:
            rel = p.scratch()[:n_normal]
            max_rel, mean_rel = float(rel.max()), float(rel.mean())
        f["eb"] = abs(float(pos - neg)) / m if m else 0.0
        if m:
            sq = p.scratch()
            for at, diff, _, _ in p.pairs():
                torch.mul(diff, diff, out=sq[at])
            f["rmse"] = math.sqrt(float(sq.mean()))
        else:
            f["rmse"] = 0.0
        f["small_value_err"] = float(small_err) / n_small if n_small else 0.0
        if n_normal:
            f["max_rel"], f["mean_rel"] = max_rel, mean_rel
        else:
            f["max_rel"] = f["mean_rel"] = 0.0
    else:
        msgs.append(f"{_canon(device.dtype)} is not covered by the new precision standard: "
                    "only the cosine/max-abs-error rule applies.")
    # the docs' section 4.1 rule
    old = _old_rule(f, cos, max_abs, dtype, p, msgs)
    new = _new_rule(f, api_name, dtype, device, bench, p, inf_nan_err, msgs) if covered else None
    status = worst([old, new])
    if inf_nan_err > 0:
        f["inf_nan_err"] = inf_nan_err
        msgs.append(f"inf/nan differ from the benchmark at {inf_nan_err:.2%} of the elements.")
        status = ERROR
    f["status"] = status
    return _row(name, bench, device, f, msgs)


def _abs_max(t: Any) -> float:
    """``float(t.abs().max())`` of a non-empty ``t``, without the copy."""
    import torch

    lo, hi = torch.aminmax(t)
    return max(-float(lo), float(hi))


def _rel_all(absd: Any, absb: Any) -> Any:
    import torch

    return torch.where(absb > 0, absd / absb.clamp_min(1e-300), torch.where(absd > 0, math.inf, 0.0))


def _old_rule(f: dict, cos: Optional[float], max_abs: float, dtype: str, p: _Pair, msgs: list) -> str:
    if cos is not None and cos <= 0.99:
        msgs.append(f"Cosine similarity {cos:.6f} <= 0.99: error.")
        return ERROR
    if max_abs < 0.001:
        msgs.append("Max abs error < 0.001: pass (the relative-error indices are left blank).")
        return PASS
    below = {0.01: 0, 0.001: 0, 0.0001: 0}
    for _, _, absd, absb in p.pairs():
        rel = _rel_all(absd, absb)
        for t in below:
            below[t] += int((rel < t).sum())
    m = p.m
    for key, t in (("rel100", 0.01), ("rel1000", 0.001), ("rel10000", 0.0001)):
        f[key] = float(below[t]) / m if m else 1.0

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


def _new_rule(f: dict, api_name: str, dtype: str, device: Any, bench: Any, p: _Pair, inf_nan_err: float,
              msgs: list) -> Optional[str]:
    import torch

    algo = S.algorithm_of(api_name)
    m = p.m
    if algo == S.BINARY:
        d, b = p.dev, p.bench
        wrong = 0
        for s, e in _chunks(p.n):
            wrong += int(_differ(d[s:e], b[s:e].to(d.dtype), True).sum())
        rate = float(wrong) / p.n
        f["binary_err"] = rate
        if rate:
            msgs.append(f"Binary consistency: {rate:.2%} of the elements differ from the benchmark: error.")
            return ERROR
        return PASS
    if algo == S.ABSOLUTE:
        rtol, sv, satol = S.absolute_thresholds(dtype) or (0.0, 0.0, 0.0)  # covered dtypes all have them
        n_n = n_s = rel_err = abs_err = 0
        for _, _, absd, absb in p.pairs():
            small = absb < sv
            normal = ~small
            n_n += int(normal.sum())
            n_s += int(small.sum())
            rel_err += int((normal & (absd > rtol * absb)).sum())
            abs_err += int((small & (absd > satol)).sum())
        f["inf_nan_err"] = inf_nan_err
        f["rel_err_ratio"] = float(rel_err) / n_n if n_n else 0.0
        f["abs_err_ratio"] = float(abs_err) / n_s if n_s else 0.0
        if f["rel_err_ratio"] or f["abs_err_ratio"] or inf_nan_err:
            msgs.append("Absolute threshold: relative/absolute error or inf/nan above the thresholds: error.")
            return ERROR
        return PASS
    if algo == S.ULP:
        mant, min_exp = S.ULP_PARAMS[dtype]
        thr = S.ulp_threshold(dtype)
        above = 0
        if m:
            err = p.scratch()
            for at, _, absd, absb in p.pairs():
                exp = torch.floor(torch.log2(absb.clamp_min(2.0 ** min_exp))).clamp_min(min_exp)
                ulp = torch.pow(2.0, exp - mant)
                torch.div(absd, ulp, out=err[at])
                above += int((err[at] > thr).sum())
            f["ulp_max"], f["ulp_mean"] = float(err.max()), float(err.mean())
        else:
            f["ulp_max"] = f["ulp_mean"] = 0.0
        f["ulp_ratio"] = float(above) / m if m else 0.0
        ok = (f["ulp_mean"] < 64 or f["ulp_ratio"] < 0.05) if dtype == "float32" else f["ulp_ratio"] < 0.001
        if not ok:
            msgs.append(f"ULP error: mean {f['ulp_mean']:.3f}, {f['ulp_ratio']:.2%} above {thr:g} ULP: error.")
            return ERROR
        return PASS
    if algo == S.THOUSANDTH:
        within = 0
        for _, _, absd, absb in p.pairs():
            within += int((_rel_all(absd, absb) < 0.001).sum())
        f["rel1000"] = float(within) / m if m else 1.0
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
