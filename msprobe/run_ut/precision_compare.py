"""``api_precision_compare``: judge an NPU run_ut details CSV against a GPU one (the docs' section 5).

Each NPU details row is matched by API name with the GPU row, and judged by the
algorithm of its API (:func:`msprobe.run_ut.standards.algorithm_of`):

- benchmark comparison: NPU/GPU ratios of the small-value error ratio (<= 2),
  RMSE (<= 2), max relative error (<= 10), mean relative error (<= 2); the error
  balance ratio (<= 2) is reported but does not decide;
- absolute threshold: the NPU's inf/nan, relative and absolute error rates must be 0;
- binary consistency: the NPU's binary error rate must be 0 (also every bool/int row);
- ULP: float32 passes with a mean ULP error < 64, or a share above the threshold
  < 0.05, or a share below the GPU's; float16/bfloat16 with a share < 0.001 or below the GPU's;
- thousandth (conv): the NPU's dual-thousand index > 0.999.

When a details file lacks the columns an algorithm needs (the real tool leaves
the new-standard columns empty on some devices), the row falls back to the
benchmark comparison. Reads details files of this package and of the real tool.
"""
from __future__ import annotations

import csv
import os
import time
from typing import Optional

from msprobe.errors import ConfigError
from msprobe.run_ut import standards
from msprobe.run_ut.csvio import BLANK, api_of_row, format_value, read_csv_rows
from msprobe.run_ut.execute import split_api_name

__all__ = ["api_precision_compare", "COMPARE_DETAILS_HEADER", "COMPARE_RESULT_HEADER", "judge_row"]

COMPARE_RESULT_HEADER = ["API name", "Forward Test Success", "Backward Test Success", "Message"]
_FIELDS = [
    ("name", "API name"),
    ("sv_ratio", "小值域错误比值"), ("sv_status", "小值域错误判定结果"),
    ("rmse_ratio", "均方根误差比值"), ("rmse_status", "均方根误差判定结果"),
    ("max_rel_ratio", "相对误差最大值比值"), ("max_rel_status", "相对误差最大值判定结果"),
    ("mean_rel_ratio", "相对误差平均值比值"), ("mean_rel_status", "相对误差平均值判定结果"),
    ("eb_ratio", "误差均衡性比值"), ("eb_status", "误差均衡性判定结果"),
    ("inf_nan_err", "inf/nan错误率"), ("inf_nan_status", "inf/nan判定结果"),
    ("rel_err_ratio", "相对误差错误率"), ("rel_err_status", "相对误差判定结果"),
    ("abs_err_ratio", "绝对误差错误率"), ("abs_err_status", "绝对误差判定结果"),
    ("binary_err", "二进制一致错误率"), ("binary_status", "二进制一致错误率判定结果"),
    ("ulp_mean", "ULP误差平均值"), ("ulp_ratio", "ULP误差大于阈值占比"),
    ("ulp_ratio_ratio", "ULP误差大于阈值占比比值"), ("ulp_status", "ULP误差判定结果"),
    ("rel1000", "双千指标"), ("rel1000_status", "双千指标判定结果"),
    ("final", "比对结果"), ("algorithm", "比对算法"), ("message", "Message"),
]
COMPARE_DETAILS_HEADER = [h for _, h in _FIELDS]

# details-CSV columns read (header text -> key); the real tool's and ours are the same
_IN = {"API Name": "name", "DEVICE Dtype": "device_dtype", "Status": "status", "Message": "message",
       "小值域错误占比": "small_value_err", "均方根误差": "rmse", "相对误差最大值": "max_rel",
       "相对误差平均值": "mean_rel", "误差均衡性": "eb", "二进制一致错误率": "binary_err",
       "inf/nan错误率": "inf_nan_err", "相对误差错误率": "rel_err_ratio", "绝对误差错误率": "abs_err_ratio",
       "ULP误差平均值": "ulp_mean", "ULP误差大于阈值占比": "ulp_ratio", "双千指标": "rel1000"}
_EPS = 1e-10
PASS, ERROR, SKIP = "pass", "error", "SKIP"


def _read_details(path: str) -> dict:
    rows = read_csv_rows(path)
    if not rows:
        raise ConfigError(f"{path}: empty CSV")
    header = [column.strip() for column in rows[0]]
    if "API Name" not in header or "Status" not in header:
        raise ConfigError(f"{path}: not an accuracy_checking_details CSV (no 'API Name'/'Status' column)")
    idx = {key: header.index(column) for column, key in _IN.items() if column in header}
    out = {}
    for row in rows[1:]:
        if not row:
            continue
        rec = {k: (row[index].strip() if index < len(row) else "") for k, index in idx.items()}
        out[rec["name"]] = rec
    return out


def _num(value: Optional[str]) -> Optional[float]:
    if value is None:
        return None
    value = value.strip()
    if value in ("", "N/A", "None", "nan"):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _ratio(target: Optional[float], bench: Optional[float]) -> Optional[float]:
    if target is None or bench is None:
        return None
    if max(abs(target), abs(bench)) <= _EPS:
        return 1.0
    return abs(target) / max(abs(bench), _EPS)


def judge_row(npu: dict, gpu: Optional[dict]) -> dict:
    """One api_precision_compare_details row from an NPU and a GPU details row (dicts of the CSV values)."""
    name = npu["name"]
    out: dict = {"name": name}
    if npu.get("status") == SKIP:
        out.update(final=SKIP, message=npu.get("message") or "Skipped by run_ut on the NPU side.")
        return out
    if gpu is None:
        out.update(final=SKIP, message="The GPU details file has no row of this name.")
        return out
    if gpu.get("status") == SKIP:
        out.update(final=SKIP, message="Skipped by run_ut on the GPU side: " + (gpu.get("message") or ""))
        return out
    dtype = (npu.get("device_dtype") or "").replace("torch.", "")
    _, api_name, _ = split_api_name(api_of_row(name))
    float_dtype = dtype in ("float16", "bfloat16", "float32", "float64")
    if not float_dtype:
        algo = standards.BINARY
    elif dtype == "float64":
        out.update(final=SKIP, message="float64 is not covered by the new precision standard.")
        return out
    elif ".backward." in name:
        algo = standards.BENCHMARK  # gradients: the benchmark comparison (as run_ut judges them)
    else:
        algo = standards.algorithm_of(api_name)
    statuses, msgs = _apply(algo, npu, gpu, dtype, out)
    if statuses is None:  # the files lack this algorithm's columns
        algo = standards.BENCHMARK
        statuses, msgs = _apply(algo, npu, gpu, dtype, out)
    if statuses is None:
        out.update(final=SKIP, message="The details files hold no metric to judge this row.")
        return out
    out["algorithm"] = standards.ALGORITHM_LABELS[algo]
    out["final"] = ERROR if ERROR in statuses else PASS
    out["message"] = "\n".join(msgs)
    return out


def _st(passed: bool) -> str:
    return PASS if passed else ERROR


def _apply(algo: str, target_row: dict, bench_row: dict, dtype: str, out: dict) -> tuple:
    # the indices of each side (None where the CSV cell is empty: checked before each use)
    text_keys = ("name", "status", "message", "device_dtype")
    target: dict = {key: _num(value) for key, value in target_row.items() if key not in text_keys}
    bench: dict = {key: _num(value) for key, value in bench_row.items() if key not in text_keys}
    msgs: list = []
    if algo == standards.BINARY:
        if target.get("binary_err") is None:
            return None, msgs
        out["binary_err"] = target["binary_err"]
        out["binary_status"] = _st(target["binary_err"] == 0)
        if target["binary_err"]:
            msgs.append("Binary consistency error rate is not 0.")
        return [out["binary_status"]], msgs
    if algo == standards.ABSOLUTE:
        keys = ("inf_nan_err", "rel_err_ratio", "abs_err_ratio")
        if all(target.get(key) is None for key in keys):
            return None, msgs
        statuses = []
        for key, status_key, label in zip(keys, ("inf_nan_status", "rel_err_status", "abs_err_status"),
                                ("inf/nan error rate", "relative error rate", "absolute error rate")):
            value = target.get(key) or 0.0
            out[key], out[status_key] = value, _st(value == 0)
            statuses.append(out[status_key])
            if value:
                msgs.append(f"{label} {value:g} is not 0.")
        return statuses, msgs
    if algo == standards.ULP:
        if target.get("ulp_ratio") is None:
            return None, msgs
        target_ratio, target_mean = target["ulp_ratio"], target.get("ulp_mean") or 0.0
        bench_ratio = bench.get("ulp_ratio")
        out["ulp_mean"], out["ulp_ratio"] = target_mean, target_ratio
        out["ulp_ratio_ratio"] = _ratio(target_ratio, bench_ratio)
        below_gpu = bench_ratio is not None and target_ratio < bench_ratio
        if dtype == "float32":
            passed = target_mean < 64 or target_ratio < 0.05 or below_gpu
        else:
            passed = target_ratio < 0.001 or below_gpu
        out["ulp_status"] = _st(passed)
        if not passed:
            msgs.append(f"ULP error: mean {target_mean:g}, share above the threshold {target_ratio:g} "
                        f"(GPU {bench_ratio}).")
        return [out["ulp_status"]], msgs
    if algo == standards.THOUSANDTH:
        if target.get("rel1000") is None:
            return None, msgs
        out["rel1000"] = target["rel1000"]
        out["rel1000_status"] = _st(target["rel1000"] > 0.999)
        if target["rel1000"] <= 0.999:
            msgs.append(f"Dual-thousand index {target['rel1000']:g} <= 0.999.")
        return [out["rel1000_status"]], msgs
    # benchmark comparison
    limits = standards.benchmark_ratio_limits()
    statuses = []
    any_metric = False
    for src, ratio_key, status_key, lim_key, label in (
            ("small_value_err", "sv_ratio", "sv_status", "small_value", "small-value error ratio"),
            ("rmse", "rmse_ratio", "rmse_status", "rmse", "RMSE"),
            ("max_rel", "max_rel_ratio", "max_rel_status", "max_rel", "max relative error"),
            ("mean_rel", "mean_rel_ratio", "mean_rel_status", "mean_rel", "mean relative error"),
            ("eb", "eb_ratio", "eb_status", "eb", "error balance")):
        ratio = _ratio(target.get(src), bench.get(src))
        if ratio is None:
            continue
        any_metric = True
        out[ratio_key] = ratio
        out[status_key] = _st(ratio <= limits[lim_key])
        if src != "eb":
            statuses.append(out[status_key])
        if out[status_key] == ERROR:
            msgs.append(f"NPU/GPU {label} ratio {ratio:g} > {limits[lim_key]:g}"
                        + (" (not counted)." if src == "eb" else "."))
    if not any_metric:
        return None, msgs
    return statuses, msgs


def _aggregate(statuses: list) -> str:
    if not statuses:
        return ""
    if ERROR in statuses:
        return ERROR
    if PASS in statuses:
        return PASS
    return SKIP


def api_precision_compare(npu_csv: str, gpu_csv: str, out_path: str = ".") -> dict:
    """Write ``api_precision_compare_result_{ts}.csv`` and ``..._details_{ts}.csv`` under ``out_path``."""
    for path in (npu_csv, gpu_csv):
        if not os.path.isfile(path):
            raise ConfigError(f"{path}: no such details CSV")
    target_rows, bench_rows = _read_details(npu_csv), _read_details(gpu_csv)
    os.makedirs(out_path, exist_ok=True)
    stamp = time.strftime("%Y%m%d%H%M%S")
    res_path = os.path.join(out_path, f"api_precision_compare_result_{stamp}.csv")
    det_path = os.path.join(out_path, f"api_precision_compare_details_{stamp}.csv")
    per_api: dict = {}
    counts: dict = {}
    with open(det_path, "w", newline="", encoding="utf-8-sig") as file:
        writer = csv.writer(file)
        writer.writerow(COMPARE_DETAILS_HEADER)
        for name, row in target_rows.items():
            judged = judge_row(row, bench_rows.get(name))
            writer.writerow([judged.get(key) if key in ("name", "algorithm") and judged.get(key) else
                        (judged.get(key) or BLANK) if key in ("message", "final") or key.endswith("_status") else
                        format_value(judged.get(key)) for key, _ in _FIELDS])
            api = api_of_row(name)
            direction = "backward" if ".backward." in name else "forward"
            entry = per_api.setdefault(api, {"forward": [], "backward": [], "messages": []})
            entry[direction].append(judged["final"])
            if judged["final"] in (SKIP, ERROR) and judged.get("message"):
                entry["messages"].append(judged["message"])
    with open(res_path, "w", newline="", encoding="utf-8-sig") as file:
        writer = csv.writer(file)
        writer.writerow(COMPARE_RESULT_HEADER)
        for api, entry in per_api.items():
            fwd, bwd = _aggregate(entry["forward"]), _aggregate(entry["backward"])
            for status in (fwd, bwd):
                if status:
                    counts[status] = counts.get(status, 0) + 1
            msg = "" if fwd != SKIP and bwd != SKIP and ERROR not in (fwd, bwd) else \
                "; ".join(dict.fromkeys(message.replace("\n", " ") for message in entry["messages"]))
            writer.writerow([api, fwd or BLANK, bwd or BLANK, msg])
    return {"result_csv": res_path, "details_csv": det_path, "apis": len(per_api), "counts": counts,
            "unmatched": sorted(set(target_rows) - set(bench_rows))}
