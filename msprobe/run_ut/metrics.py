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

from msprobe.run_ut import standards

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
    for status in statuses:
        if status is not None and _RANK.get(status, 0) > _RANK[out]:
            out = status
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
        if (row.get("status") != ERROR and device.is_floating_point() and recorded.is_floating_point()
                and _replay_calibrated(api_name)):
            _judge_recorded_against_replay(row, bench, device, recorded)
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


def _flat(tensor: Any) -> Any:
    """``t`` on the CPU as a 1-D tensor in its own dtype (a view where it can be)."""
    return tensor.detach().cpu().reshape(-1)


def _chunks(count: int):
    return ((start, min(start + _CHUNK, count)) for start in range(0, count, _CHUNK))


def _compare_exact(name: str, bench: Any, device: Any) -> dict:
    target_flat, bench_flat = _flat(device), _flat(bench)
    conv = bench_flat.dtype != target_flat.dtype
    floating = target_flat.is_floating_point()
    wrong = 0
    for start, end in _chunks(target_flat.numel()):
        target_chunk, bench_chunk = target_flat[start:end], bench_flat[start:end]
        if conv:
            bench_chunk = bench_chunk.to(target_flat.dtype)
        wrong += int(_differ(target_chunk, bench_chunk, floating).sum())
    rate = float(wrong) / target_flat.numel()
    return _row(name, bench, device, {"binary_err": rate, "status": PASS if rate == 0 else ERROR},
                [f"{_canon(target_flat.dtype)} data: binary comparison only."])


def _differ(target: Any, bench: Any, floating: bool) -> Any:
    """Where ``d`` and ``b`` differ (two NaNs are equal)."""
    import torch

    diff = target != bench
    if floating:
        diff &= ~(torch.isnan(target) & torch.isnan(bench))
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
        for start, end in _chunks(self.n):
            target_chunk, bench_chunk = self.dev[start:end].to(self.f64), self.bench[start:end].to(self.f64)
            finite = torch.isfinite(target_chunk) & torch.isfinite(bench_chunk)
            if mask is None and not bool(finite.all()):
                mask = torch.ones(self.n, dtype=torch.bool)
            if mask is not None:
                mask[start:end] = finite
                same = (torch.isnan(target_chunk) & torch.isnan(bench_chunk)) | (target_chunk == bench_chunk)
                bad += int((~finite & ~same).sum())
        self.inf_nan_err = float(bad) / self.n
        self.d, self.b = self.dev, self.bench
        if mask is not None:
            kept = int(mask.sum())
            self.d, self.b = torch.empty(kept, dtype=self.f64), torch.empty(kept, dtype=self.f64)
            offset = 0
            for start, end in _chunks(self.n):
                keep = mask[start:end]
                count = int(keep.sum())
                self.d[offset:offset + count] = self.dev[start:end].to(self.f64)[keep]
                self.b[offset:offset + count] = self.bench[start:end].to(self.f64)[keep]
                offset += count
        self.m = self.d.numel()
        self._scratch: Any = None

    def full(self, which: str) -> Any:
        """The compared elements of one side as one float64 array (converted once when needed)."""
        values = self.d if which == "d" else self.b
        return values if values.dtype == self.f64 else values.to(self.f64)

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
        for start, end in _chunks(self.m):
            bench_chunk = self.b[start:end].to(self.f64)
            diff = self.d[start:end].to(self.f64) - bench_chunk
            yield slice(start, end), diff, diff.abs(), bench_chunk.abs()


def _compare_float(name: str, api_name: str, bench: Any, device: Any) -> dict:
    import torch

    dtype = _canon(device.dtype)
    pair = _Pair(device, bench)
    count, compared = pair.n, pair.m
    msgs: list = []
    fields: dict = {}
    inf_nan_err = pair.inf_nan_err
    pos = neg = 0
    max_abs = None
    covered = dtype in standards.NEW_STANDARD_DTYPES
    small_value, satol = (standards.SMALL_VALUE[dtype], standards.SMALL_VALUE_ATOL[dtype]) if covered else (0.0, 0.0)
    n_small = small_err = n_normal = 0
    max_rel = None
    # cosine similarity, over the whole arrays (a float sum depends on how it is split)
    cos = None
    full_target = None
    if count == 1:
        msgs.append("Scalar output: the cosine similarity does not apply.")
    else:
        full_target, full_bench = pair.full("d"), pair.full("b")
        target_norm, bench_norm = float(full_target.norm()), float(full_bench.norm())
        if not full_target.numel():  # every element NaN/Inf (a mask filled with -inf): inf_nan_err judges them
            msgs.append("No finite element on both sides: the cosine similarity does not apply.")
        elif (target_norm == 0 or bench_norm == 0) and max(_abs_max(full_target), _abs_max(full_bench)) < 1e-12:
            msgs.append("Device and benchmark outputs are all (numerically) zero: the cosine similarity does not apply.")
        elif target_norm == 0 or bench_norm == 0:
            cos = 0.0
        else:
            cos = float(torch.dot(full_target, full_bench)) / (target_norm * bench_norm)
            cos = min(cos, 1.0)
        del full_bench
    for _, diff, abs_diff, abs_bench in pair.pairs():
        pos += int((diff > 0).sum())
        neg += int((diff < 0).sum())
        chunk_max = float(abs_diff.max())
        max_abs = chunk_max if max_abs is None else max(max_abs, chunk_max)
        if covered:
            small = abs_bench < small_value
            n_small += int(small.sum())
            small_err += int((small & (abs_diff > satol)).sum())
            normal = ~small
            k = int(normal.sum())  # (not ``count``: that says below whether the cosine applies)
            if k:
                rel = pair.scratch(full_target)[n_normal:n_normal + k]
                torch.div(abs_diff[normal], abs_bench[normal], out=rel)
                n_normal += k
    full_target = None
    max_abs = max_abs if max_abs is not None else 0.0
    fields["max_abs"] = max_abs
    if cos is not None and cos <= 0.99 and covered and compared and n_small == compared and not small_err:
        # (a bias gradient that is zero in exact arithmetic, the key projection's: sums cancelling to 1e-14)
        msgs.append(f"Every benchmark element is a small value (|x| < {small_value:g}) and within the small-value "
                    f"tolerance ({satol:g}): rounding noise, the cosine similarity ({cos:.6f}) does not apply.")
        cos = None
    if count != 1:
        fields["cosine"] = cos
    if covered:
        if n_normal:
            rel = pair.scratch()[:n_normal]
            max_rel, mean_rel = float(rel.max()), float(rel.mean())
        fields["eb"] = abs(float(pos - neg)) / compared if compared else 0.0
        if compared:
            squares = pair.scratch()
            for where, diff, _, _ in pair.pairs():
                torch.mul(diff, diff, out=squares[where])
            fields["rmse"] = math.sqrt(float(squares.mean()))
        else:
            fields["rmse"] = 0.0
        fields["small_value_err"] = float(small_err) / n_small if n_small else 0.0
        if n_normal:
            fields["max_rel"], fields["mean_rel"] = max_rel, mean_rel
        else:
            fields["max_rel"] = fields["mean_rel"] = 0.0
    else:
        msgs.append(f"{_canon(device.dtype)} is not covered by the new precision standard: "
                    "only the cosine/max-abs-error rule applies.")
    # the docs' section 4.1 rule
    old = _old_rule(fields, cos, max_abs, dtype, pair, msgs)
    new = _new_rule(fields, api_name, dtype, device, bench, pair, inf_nan_err, msgs) if covered else None
    status = worst([old, new])
    if inf_nan_err > 0:
        fields["inf_nan_err"] = inf_nan_err
        msgs.append(f"inf/nan differ from the benchmark at {inf_nan_err:.2%} of the elements.")
        status = ERROR
    fields["status"] = status
    return _row(name, bench, device, fields, msgs)


def _abs_max(tensor: Any) -> float:
    """``float(t.abs().max())`` of a non-empty ``t``, without the copy."""
    import torch

    low, high = torch.aminmax(tensor)
    return max(-float(low), float(high))


def _rel_all(abs_diff: Any, abs_bench: Any) -> Any:
    import torch

    return torch.where(abs_bench > 0, abs_diff / abs_bench.clamp_min(1e-300), torch.where(abs_diff > 0, math.inf, 0.0))


def _old_rule(fields: dict, cos: Optional[float], max_abs: float, dtype: str, pair: _Pair, msgs: list) -> str:
    if cos is not None and cos <= 0.99:
        msgs.append(f"Cosine similarity {cos:.6f} <= 0.99: error.")
        return ERROR
    if max_abs < 0.001:
        msgs.append("Max abs error < 0.001: pass (the relative-error indices are left blank).")
        return PASS
    below = {0.01: 0, 0.001: 0, 0.0001: 0}
    for _, _, abs_diff, abs_bench in pair.pairs():
        rel = _rel_all(abs_diff, abs_bench)
        for tolerance in below:
            below[tolerance] += int((rel < tolerance).sum())
    compared = pair.m
    for key, tolerance in (("rel100", 0.01), ("rel1000", 0.001), ("rel10000", 0.0001)):
        fields[key] = float(below[tolerance]) / compared if compared else 1.0

    # (index deciding error, its tolerance, index deciding warning, its tolerance) by dtype
    if dtype in ("float16", "bfloat16"):
        steps = (("rel100", 0.01, "Dual-hundred"), ("rel1000", 0.001, "Dual-thousand"))
    else:
        steps = (("rel1000", 0.001, "Dual-thousand"), ("rel10000", 0.0001, "Dual-ten-thousand"))
    for (key, tolerance, label), verdict in zip(steps, (ERROR, WARNING)):
        if not (1.0 - fields[key]) < tolerance:
            msgs.append(f"{label} index fails: {verdict}.")
            return verdict
    return PASS


def _new_rule(fields: dict, api_name: str, dtype: str, target: Any, bench: Any, pair: _Pair, inf_nan_err: float,
              msgs: list) -> Optional[str]:
    import torch

    algo = standards.algorithm_of(api_name)
    compared = pair.m
    if algo == standards.BINARY:
        target_flat, bench_flat = pair.dev, pair.bench
        wrong = 0
        for start, end in _chunks(pair.n):
            wrong += int(_differ(target_flat[start:end], bench_flat[start:end].to(target_flat.dtype), True).sum())
        rate = float(wrong) / pair.n
        fields["binary_err"] = rate
        if rate:
            msgs.append(f"Binary consistency: {rate:.2%} of the elements differ from the benchmark: error.")
            return ERROR
        return PASS
    if algo == standards.ABSOLUTE:
        # covered dtypes all have them
        rtol, small_value, satol = standards.absolute_thresholds(dtype) or (0.0, 0.0, 0.0)
        normal_count = small_count = rel_err = abs_err = 0
        for _, _, abs_diff, abs_bench in pair.pairs():
            small = abs_bench < small_value
            normal = ~small
            normal_count += int(normal.sum())
            small_count += int(small.sum())
            rel_err += int((normal & (abs_diff > rtol * abs_bench)).sum())
            abs_err += int((small & (abs_diff > satol)).sum())
        fields["inf_nan_err"] = inf_nan_err
        fields["rel_err_ratio"] = float(rel_err) / normal_count if normal_count else 0.0
        fields["abs_err_ratio"] = float(abs_err) / small_count if small_count else 0.0
        if fields["rel_err_ratio"] or fields["abs_err_ratio"] or inf_nan_err:
            msgs.append("Absolute threshold: relative/absolute error or inf/nan above the thresholds: error.")
            return ERROR
        return PASS
    if algo == standards.ULP:
        mant, min_exp = standards.ULP_PARAMS[dtype]
        thr = standards.ulp_threshold(dtype)
        above = 0
        if compared:
            err = pair.scratch()
            for where, _, abs_diff, abs_bench in pair.pairs():
                exp = torch.floor(torch.log2(abs_bench.clamp_min(2.0 ** min_exp))).clamp_min(min_exp)
                ulp = torch.pow(2.0, exp - mant)
                torch.div(abs_diff, ulp, out=err[where])
                above += int((err[where] > thr).sum())
            fields["ulp_max"], fields["ulp_mean"] = float(err.max()), float(err.mean())
        else:
            fields["ulp_max"] = fields["ulp_mean"] = 0.0
        fields["ulp_ratio"] = float(above) / compared if compared else 0.0
        if dtype == "float32":
            passed = fields["ulp_mean"] < 64 or fields["ulp_ratio"] < 0.05
        else:
            passed = fields["ulp_ratio"] < 0.001
        if not passed:
            msgs.append(f"ULP error: mean {fields['ulp_mean']:.3f}, {fields['ulp_ratio']:.2%} above {thr:g} ULP: "
                        "error.")
            return ERROR
        return PASS
    if algo == standards.THOUSANDTH:
        within = 0
        for _, _, abs_diff, abs_bench in pair.pairs():
            within += int((_rel_all(abs_diff, abs_bench) < 0.001).sum())
        fields["rel1000"] = float(within) / compared if compared else 1.0
        if fields["rel1000"] <= 0.999:
            msgs.append(f"Thousandth rule: only {fields['rel1000']:.4%} of the elements within 0.1%: error.")
            return ERROR
        return PASS
    return None


#: the dumped output is judged wrong when it is this many times further from the benchmark (RMSE) than
#: the replay on this device, and its mean relative error is above the dtype's tolerance below
_RECORDED_RMSE_RATIO = 100.0
_RECORDED_MEAN_REL = {"float16": 1e-2, "bfloat16": 1e-2}
_RECORDED_MEAN_REL_DEFAULT = 1e-4  # float32, float64: a kernel computing in bfloat16 gives ~1e-3


def _replay_calibrated(api_name: str) -> bool:
    """Whether a dumped output of ``api_name`` is held against the replay's error: forward outputs
    only (a gradient row has no API name), and not the matmul and convolution families, whose float32
    precision follows the backend's flags (TF32 convolutions by default on CUDA, HF32 on Ascend,
    ``torch.set_float32_matmul_precision``) that the training process may set and run_ut does not."""
    if not api_name:
        return False
    base = standards.base_api_name(api_name)
    return (standards.algorithm_of(api_name) not in (standards.ULP, standards.THOUSANDTH)
            and not base.startswith(("conv", "_convolution")) and base != "scaled_dot_product_attention")


def _rmse_and_mean_rel(values: Any, bench: Any) -> tuple:
    """(RMSE, mean relative error over the non-zero benchmark elements) of ``values`` against
    ``bench``, over their finite pairs in float64 chunks (:class:`_Pair`: no float64 copy of the
    whole output); None where there is no finite pair / no non-zero benchmark element."""
    pair = _Pair(values, bench)
    if not pair.m:
        return None, None
    squares = relative = 0.0
    nonzero = 0
    for _, diff, abs_diff, abs_bench in pair.pairs():
        squares += float((diff * diff).sum())
        keep = abs_bench > 0
        nonzero += int(keep.sum())
        relative += float((abs_diff[keep] / abs_bench[keep]).sum())
    return math.sqrt(squares / pair.m), (relative / nonzero if nonzero else None)


def _judge_recorded_against_replay(row: dict, bench: Any, device: Any, recorded: Any) -> None:
    """The dumped output against the error a correct kernel of this device makes (the replay's).

    The docs' rule passes any output within 0.001 of the benchmark, which hides a kernel computing
    a float32 API in bfloat16 whenever its values are below ~0.3 (a freshly initialised model's
    activations). The replay, the same API on the same inputs on this device, says how far from
    the float64 benchmark a correct kernel lands: a dumped output 100x further (RMSE) with a mean
    relative error above the dtype's tolerance is an error."""
    if tuple(recorded.shape) != tuple(bench.shape) or tuple(device.shape) != tuple(bench.shape):
        return
    rec_rmse, mean_rel = _rmse_and_mean_rel(recorded, bench)
    dev_rmse, _ = _rmse_and_mean_rel(device, bench)
    if rec_rmse is None or dev_rmse is None or mean_rel is None:
        return
    tolerance = _RECORDED_MEAN_REL.get(_canon(recorded.dtype), _RECORDED_MEAN_REL_DEFAULT)
    if mean_rel <= tolerance or rec_rmse <= _RECORDED_RMSE_RATIO * dev_rmse:
        return
    ratio = f"{rec_rmse / dev_rmse:.3g}x" if dev_rmse else "infinitely"
    row["status"] = ERROR
    row["message"] = (row.get("message", "") + f"\nThe dumped output is {ratio} further from the benchmark than "
                      f"this device's replay (RMSE {rec_rmse:.3g} vs {dev_rmse:.3g}; its mean relative error "
                      f"{mean_rel:.3g} is above {tolerance:g}): the kernel that produced it is less precise than "
                      f"{dtype_name(recorded)}: error.").strip()


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
        detail = ", ".join(f"{key} {sub[key]:.6g}" for key in ("cosine", "max_abs", "binary_err", "ulp_mean")
                           if isinstance(sub.get(key), float))
        row["message"] = (row.get("message", "") + f"\nThe dumped output differs from the benchmark "
                          f"({detail}): {sub['status']}. {sub.get('message', '')}").strip()
