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
from msprobe.run_ut import standards as S
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
    header = [h.strip() for h in rows[0]]
    if "API Name" not in header or "Status" not in header:
        raise ConfigError(f"{path}: not an accuracy_checking_details CSV (no 'API Name'/'Status' column)")
    idx = {key: header.index(h) for h, key in _IN.items() if h in header}
    out = {}
    for r in rows[1:]:
        if not r:
            continue
        rec = {k: (r[i].strip() if i < len(r) else "") for k, i in idx.items()}
        out[rec["name"]] = rec
    return out


def _num(v: Optional[str]) -> Optional[float]:
    if v is None:
        return None
    v = v.strip()
    if v in ("", "N/A", "None", "nan"):
        return None
    try:
        return float(v)
    except ValueError:
        return None


def _ratio(n: Optional[float], g: Optional[float]) -> Optional[float]:
    if n is None or g is None:
        return None
    if max(abs(n), abs(g)) <= _EPS:
        return 1.0
    return abs(n) / max(abs(g), _EPS)


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
        algo = S.BINARY
    elif dtype == "float64":
        out.update(final=SKIP, message="float64 is not covered by the new precision standard.")
        return out
    elif ".backward." in name:
        algo = S.BENCHMARK  # gradients: the benchmark comparison (as run_ut judges them)
    else:
        algo = S.algorithm_of(api_name)
    statuses, msgs = _apply(algo, npu, gpu, dtype, out)
    if statuses is None:  # the files lack this algorithm's columns
        algo = S.BENCHMARK
        statuses, msgs = _apply(algo, npu, gpu, dtype, out)
    if statuses is None:
        out.update(final=SKIP, message="The details files hold no metric to judge this row.")
        return out
    out["algorithm"] = S.ALGORITHM_LABELS[algo]
    out["final"] = ERROR if ERROR in statuses else PASS
    out["message"] = "\n".join(msgs)
    return out


def _st(ok: bool) -> str:
    return PASS if ok else ERROR


def _apply(algo: str, npu: dict, gpu: dict, dtype: str, out: dict) -> tuple:
    # the indices of each side (None where the CSV cell is empty: checked before each use)
    n: dict = {k: _num(v) for k, v in npu.items() if k not in ("name", "status", "message", "device_dtype")}
    g: dict = {k: _num(v) for k, v in gpu.items() if k not in ("name", "status", "message", "device_dtype")}
    msgs: list = []
    if algo == S.BINARY:
        if n.get("binary_err") is None:
            return None, msgs
        out["binary_err"] = n["binary_err"]
        out["binary_status"] = _st(n["binary_err"] == 0)
        if n["binary_err"]:
            msgs.append("Binary consistency error rate is not 0.")
        return [out["binary_status"]], msgs
    if algo == S.ABSOLUTE:
        keys = ("inf_nan_err", "rel_err_ratio", "abs_err_ratio")
        if all(n.get(k) is None for k in keys):
            return None, msgs
        sts = []
        for k, sk, label in zip(keys, ("inf_nan_status", "rel_err_status", "abs_err_status"),
                                ("inf/nan error rate", "relative error rate", "absolute error rate")):
            v = n.get(k) or 0.0
            out[k], out[sk] = v, _st(v == 0)
            sts.append(out[sk])
            if v:
                msgs.append(f"{label} {v:g} is not 0.")
        return sts, msgs
    if algo == S.ULP:
        if n.get("ulp_ratio") is None:
            return None, msgs
        nr, nm, gr = n["ulp_ratio"], n.get("ulp_mean") or 0.0, g.get("ulp_ratio")
        out["ulp_mean"], out["ulp_ratio"] = nm, nr
        out["ulp_ratio_ratio"] = _ratio(nr, gr)
        below_gpu = gr is not None and nr < gr
        ok = (nm < 64 or nr < 0.05 or below_gpu) if dtype == "float32" else (nr < 0.001 or below_gpu)
        out["ulp_status"] = _st(ok)
        if not ok:
            msgs.append(f"ULP error: mean {nm:g}, share above the threshold {nr:g} (GPU {gr}).")
        return [out["ulp_status"]], msgs
    if algo == S.THOUSANDTH:
        if n.get("rel1000") is None:
            return None, msgs
        out["rel1000"] = n["rel1000"]
        out["rel1000_status"] = _st(n["rel1000"] > 0.999)
        if n["rel1000"] <= 0.999:
            msgs.append(f"Dual-thousand index {n['rel1000']:g} <= 0.999.")
        return [out["rel1000_status"]], msgs
    # benchmark comparison
    limits = S.benchmark_ratio_limits()
    sts = []
    any_metric = False
    for src, rk, sk, lim_key, label in (
            ("small_value_err", "sv_ratio", "sv_status", "small_value", "small-value error ratio"),
            ("rmse", "rmse_ratio", "rmse_status", "rmse", "RMSE"),
            ("max_rel", "max_rel_ratio", "max_rel_status", "max_rel", "max relative error"),
            ("mean_rel", "mean_rel_ratio", "mean_rel_status", "mean_rel", "mean relative error"),
            ("eb", "eb_ratio", "eb_status", "eb", "error balance")):
        r = _ratio(n.get(src), g.get(src))
        if r is None:
            continue
        any_metric = True
        out[rk] = r
        out[sk] = _st(r <= limits[lim_key])
        if src != "eb":
            sts.append(out[sk])
        if out[sk] == ERROR:
            msgs.append(f"NPU/GPU {label} ratio {r:g} > {limits[lim_key]:g}"
                        + (" (not counted)." if src == "eb" else "."))
    if not any_metric:
        return None, msgs
    return sts, msgs


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
    for p in (npu_csv, gpu_csv):
        if not os.path.isfile(p):
            raise ConfigError(f"{p}: no such details CSV")
    npu, gpu = _read_details(npu_csv), _read_details(gpu_csv)
    os.makedirs(out_path, exist_ok=True)
    ts = time.strftime("%Y%m%d%H%M%S")
    res_path = os.path.join(out_path, f"api_precision_compare_result_{ts}.csv")
    det_path = os.path.join(out_path, f"api_precision_compare_details_{ts}.csv")
    per_api: dict = {}
    counts: dict = {}
    with open(det_path, "w", newline="", encoding="utf-8-sig") as fh:
        w = csv.writer(fh)
        w.writerow(COMPARE_DETAILS_HEADER)
        for name, row in npu.items():
            j = judge_row(row, gpu.get(name))
            w.writerow([j.get(k) if k in ("name", "algorithm") and j.get(k) else
                        (j.get(k) or BLANK) if k in ("message", "final") or k.endswith("_status") else
                        format_value(j.get(k)) for k, _ in _FIELDS])
            api = api_of_row(name)
            direction = "backward" if ".backward." in name else "forward"
            e = per_api.setdefault(api, {"forward": [], "backward": [], "messages": []})
            e[direction].append(j["final"])
            if j["final"] in (SKIP, ERROR) and j.get("message"):
                e["messages"].append(j["message"])
    with open(res_path, "w", newline="", encoding="utf-8-sig") as fh:
        w = csv.writer(fh)
        w.writerow(COMPARE_RESULT_HEADER)
        for api, e in per_api.items():
            fwd, bwd = _aggregate(e["forward"]), _aggregate(e["backward"])
            for s in (fwd, bwd):
                if s:
                    counts[s] = counts.get(s, 0) + 1
            msg = "" if fwd != SKIP and bwd != SKIP and ERROR not in (fwd, bwd) else \
                "; ".join(dict.fromkeys(m.replace("\n", " ") for m in e["messages"]))
            w.writerow([api, fwd or BLANK, bwd or BLANK, msg])
    return {"result_csv": res_path, "details_csv": det_path, "apis": len(per_api), "counts": counts,
            "unmatched": sorted(set(npu) - set(gpu))}
