"""The row-by-row compare: the reference the product's column-wise engine is held to.

This is the row builder compare used before it had one engine (moved here from
``msprobe/compare/_core.py``, ``_verdict.py`` and ``_rows.py``): each row is built from
:func:`msprobe.compare._rows.leaf_side` of its two leaves, its metrics computed one value at a
time (:func:`msprobe.compare._rows.diff_cells`, ``tensor_metrics``), and 26.2.0's rules run as one
plain function per rule over the rows of each record (:class:`Facts`, :func:`judge_record`).
:func:`oracle_pair` has the signature of :func:`msprobe.compare._columnar.columnar_pair`;
:func:`oracle_compare` runs :func:`msprobe.compare.compare` with it in its place (in this
process: forked chunks and the workers of a fork-started process pool inherit it).
"""
from __future__ import annotations

import json
import math
from typing import Any, Optional

from msprobe.compare import _columnar
from msprobe.compare._columnar import bench_counterpart, load_side
from msprobe.compare._plot import PlotMarks
from msprobe.compare._rows import COLUMNS, diff_cells, leaf_side, record_leaves, tensor_metrics
from msprobe.compare._summary import NonFiniteFirsts, PairSummary
from msprobe.compare._verdict import (
    ALL_IGNORE,
    COSINE_DROP,
    COSINE_IN_LIMIT,
    INPUT_IGNORE,
    MSG_COSINE,
    MSG_CRC,
    MSG_CRC_UNMATCHED,
    MSG_DTYPE,
    MSG_INF_NAN,
    MSG_NORM_10X,
    MSG_NORM_OUT,
    MSG_RATIO,
    MSG_REQ_GRAD,
    MSG_SCALAR,
    MSG_SHAPE,
    NORM_IN_LIMIT,
    NORM_OUT_LIMIT,
    NORM_RATIO,
    NORM_ZERO_IN_OUT,
    RATIO_IN_LIMIT,
    RATIO_OUT_LIMIT,
    roundoff_floor,
)
from msprobe.compare._write import write_columns

PASS, WARNING, ERROR = "pass", "warning", "error"
_LEVEL = {PASS: 0, WARNING: 1, ERROR: 2}
_NA = "N/A"
_N_METRICS = {"statistics": 8, "md5": 2, "tensor": 6}
_Firsts = NonFiniteFirsts
_load = load_side


class Facts:
    """What the rules read of one row: names, dtypes, shapes, requires_grad (the CSV strings),
    the target and bench Max/Min (as dumped), the NormRelativeErr cell, Cosine and One Thousandth
    Err Ratio (tensor mode: numbers or strings such as ``unsupported``), the MD5 cells, and
    whether the row is a scalar argument whose value differs."""

    __slots__ = ("name", "bench_name", "output", "dtype_n", "dtype_b", "shape_n", "shape_b", "rg_n", "rg_b",
                 "max_n", "min_n", "max_b", "min_b", "norm_rel", "cosine", "ratio", "md5_n", "md5_b",
                 "scalar_differs", "result", "msgs")

    def __init__(self, name: str, bench_name: str, *, dtype_n: str = _NA, dtype_b: str = _NA, shape_n: str = _NA,
                 shape_b: str = _NA, rg_n: str = _NA, rg_b: str = _NA, max_n: Any = None, min_n: Any = None,
                 max_b: Any = None, min_b: Any = None, norm_rel: str = _NA, cosine: Any = None, ratio: Any = None,
                 md5_n: str = _NA, md5_b: str = _NA, scalar_differs: bool = False):
        self.name, self.bench_name = name, bench_name
        self.output = ".output." in name
        self.dtype_n, self.dtype_b, self.shape_n, self.shape_b = dtype_n, dtype_b, shape_n, shape_b
        self.rg_n, self.rg_b = rg_n, rg_b
        self.max_n, self.min_n, self.max_b, self.min_b = max_n, min_n, max_b, min_b
        self.norm_rel, self.cosine, self.ratio = norm_rel, cosine, ratio
        self.md5_n, self.md5_b = md5_n, md5_b
        self.scalar_differs = scalar_differs
        self.result = PASS
        self.msgs: list = []

    @property
    def matched(self) -> bool:
        return bool(self.bench_name) and self.bench_name != _NA

    def raise_to(self, level: str, msg: str) -> None:
        """The rule's level if it is worse than the row's, and its message (always appended)."""
        if _LEVEL[level] > _LEVEL[self.result]:
            self.result = level
        self.msgs.append(msg)

    @property
    def err_message(self) -> str:
        return json.dumps(self.msgs)


# ---------------------------------------------------------------- cell readers

def _inf_or_nan(v: Any) -> bool:
    if isinstance(v, float):
        return math.isnan(v) or math.isinf(v)
    if isinstance(v, str):
        return v.strip().lower() in ("inf", "-inf", "nan")
    return False


def percent(cell: Any) -> float:
    """A relative-error cell as a fraction: ``"12.5%"`` -> 0.125, ``"inf"`` -> inf; 0 for what does
    not read as a number (``N/A``, ``Diff``)."""
    try:
        return float(str(cell).strip("%")) / 100
    except ValueError:
        return 0.0


def _number(v: Any, percent_only: bool) -> Optional[float]:
    """The value a rule aggregates, or None when the cell takes no part: NaN, N/A, and strings
    (in statistics mode only ``%`` cells count; in tensor mode numbers do)."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, str):
        s = v.strip()
        if s.endswith("%"):
            x = percent(s)
        elif percent_only:
            return None
        else:
            try:
                x = float(s)
            except ValueError:
                return None
    elif isinstance(v, (int, float)):
        if percent_only:
            return None
        x = float(v)
    else:
        return None
    return None if x != x else x


def _largest(rows: list, attr: str) -> float:
    """The largest (percent) cell of ``rows``, 0 when none counts."""
    best = 0.0
    for r in rows:
        x = _number(getattr(r, attr), True)
        if x is not None and x > best:
            best = x
    return best


def _smallest(rows: list, attr: str) -> float:
    """The smallest numeric cell of ``rows``, 1 when none counts."""
    best = 1.0
    for r in rows:
        x = _number(getattr(r, attr), False)
        if x is not None and x < best:
            best = x
    return best


# ---------------------------------------------------------------- the rules
# each takes (inputs, outputs, judged) where judged is the rows the record's ignore class leaves


def rule_inf_nan(inputs: list, outputs: list, judged: list) -> None:
    """error: the target's Max or Min is NaN/inf and the bench's are not."""
    for r in judged:
        if _inf_or_nan(r.max_b) or _inf_or_nan(r.min_b):
            continue
        if _inf_or_nan(r.max_n) or _inf_or_nan(r.min_n):
            r.raise_to(ERROR, MSG_INF_NAN)


def rule_norm_output(inputs: list, outputs: list, judged: list) -> None:
    """error (statistics): every input's NormRelativeErr is below 0.1 and an output's is above 0.5."""
    if abs(_largest(inputs, "norm_rel")) < NORM_IN_LIMIT:
        for r in outputs:
            if abs(percent(r.norm_rel)) > NORM_OUT_LIMIT:
                r.raise_to(ERROR, MSG_NORM_OUT)


def rule_requires_grad(inputs: list, outputs: list, judged: list) -> None:
    """error: requires_grad differs (matched rows)."""
    for r in judged:
        if r.matched and r.rg_n and r.rg_b and r.rg_n != r.rg_b:
            r.raise_to(ERROR, MSG_REQ_GRAD)


def rule_scalars(inputs: list, outputs: list, judged: list) -> None:
    """error: a scalar (non-tensor) input differs."""
    for r in inputs:
        if r.matched and r.scalar_differs:
            r.raise_to(ERROR, MSG_SCALAR)


def rule_dtype(inputs: list, outputs: list, judged: list) -> None:
    """error: the dtypes differ (matched rows; fused qkv/gate_up bench names excepted)."""
    for r in judged:
        if not r.matched or r.name == _NA or "qkv" in r.bench_name or "gate_up" in r.bench_name:
            continue
        if r.dtype_n and r.dtype_b and r.dtype_n != r.dtype_b:
            r.raise_to(ERROR, MSG_DTYPE)


def rule_shape(inputs: list, outputs: list, judged: list) -> None:
    """error: the shapes differ (matched rows)."""
    for r in judged:
        if r.matched and r.shape_n != r.shape_b:
            r.raise_to(ERROR, MSG_SHAPE)


def rule_norm_10x(inputs: list, outputs: list, judged: list) -> None:
    """warning on the first output row (statistics): the outputs' largest NormRelativeErr is more
    than 10 times the inputs' largest, or above 0.1 when every input is exact."""
    if not outputs:
        return
    x_in, x_out = abs(_largest(inputs, "norm_rel")), abs(_largest(outputs, "norm_rel"))
    if (x_out > NORM_ZERO_IN_OUT) if x_in == 0 else (x_out / x_in > NORM_RATIO):
        outputs[0].raise_to(WARNING, MSG_NORM_10X)


def rule_ratio(inputs: list, outputs: list, judged: list) -> None:
    """error on the first output row (tensor): the inputs' smallest One Thousandth Err Ratio is
    above 0.9 and the outputs' smallest is below 0.1."""
    if outputs and _smallest(inputs, "ratio") > RATIO_IN_LIMIT and _smallest(outputs, "ratio") < RATIO_OUT_LIMIT:
        outputs[0].raise_to(ERROR, MSG_RATIO)


def rule_cosine(inputs: list, outputs: list, judged: list) -> None:
    """warning on the first output row (tensor): the inputs' smallest Cosine is above 0.9 and
    more than 0.1 above the outputs' smallest."""
    if not outputs:
        return
    c_in, c_out = _smallest(inputs, "cosine"), _smallest(outputs, "cosine")
    if c_in > COSINE_IN_LIMIT and c_in - c_out > COSINE_DROP:
        outputs[0].raise_to(WARNING, MSG_COSINE)


def rule_crc(inputs: list, outputs: list, judged: list) -> None:
    """md5: error when the CRC-32 values differ, warning when one side has none (unmatched)."""
    for r in judged:
        if r.md5_n != r.md5_b:
            if r.md5_n in (_NA, "Nan", "") or r.md5_b in (_NA, "Nan", ""):
                r.raise_to(WARNING, MSG_CRC_UNMATCHED)
            else:
                r.raise_to(ERROR, MSG_CRC)


#: (rule, whether it skips the input-ignored records) per mode, in 26.2.0's order
RULES = {
    "statistics": [(rule_inf_nan, False), (rule_norm_output, True), (rule_requires_grad, False),
                   (rule_scalars, True), (rule_dtype, False), (rule_shape, False), (rule_norm_10x, True)],
    "tensor": [(rule_inf_nan, False), (rule_ratio, True), (rule_requires_grad, False), (rule_scalars, True),
               (rule_dtype, False), (rule_shape, False), (rule_cosine, True)],
    "md5": [(rule_crc, False)],
}


def ignore_level(facts: list) -> Optional[str]:
    """'all' / 'input' / None: the record's ignore class, from the API name (the second dotted part)
    of its first input row's target name."""
    first = next((f for f in facts if not f.output), None)
    if first is None:
        return None
    parts = first.name.split(".")
    if len(parts) < 2:
        return None
    if parts[1] in ALL_IGNORE:
        return "all"
    if parts[1] in INPUT_IGNORE:
        return "input"
    return None


def judge_record(mode: str, facts: list) -> list:
    """Set ``result`` and ``msgs`` of every row (:class:`Facts`) of one record; returns ``facts``."""
    inputs = [f for f in facts if not f.output]
    outputs = [f for f in facts if f.output]
    ign = ignore_level(facts)
    if ign == "all":
        return facts
    judged = outputs if ign == "input" else inputs + outputs
    for rule, skips_input_ignored in RULES[mode]:
        if ign == "input" and skips_input_ignored:
            continue
        rule(inputs, outputs, judged)
    return facts


def diverges(result: str, norm_rel: Optional[float], threshold: Optional[float]) -> bool:
    """Whether a matched row is a divergence: its Result is not ``pass`` (``threshold`` None),
    or its NormRelativeErr (a fraction; None/NaN when undefined) exceeds ``threshold``."""
    if threshold is None:
        return result != PASS
    return norm_rel is not None and norm_rel == norm_rel and norm_rel > threshold


def stats_metrics(n: Any, b: Any) -> tuple:
    """(the 8 metric strings: 4 diffs then 4 relative errors, NormRelativeErr as a fraction or None);
    the verdict is the record's (:mod:`msprobe.compare._verdict`)."""
    ns, bs = n.stats, b.stats
    d0, r0, _ = diff_cells(ns[0], bs[0])
    d1, r1, _ = diff_cells(ns[1], bs[1])
    d2, r2, _ = diff_cells(ns[2], bs[2])
    d3, r3, f3 = diff_cells(ns[3], bs[3])
    return [d0, d1, d2, d3, r0, r1, r2, r3], f3


def md5_metrics(n: Any, b: Any) -> list:
    return [n.md5, b.md5]


def _scalar_differs(n: Any, b: Any) -> bool:
    """A scalar argument (``<class ...>`` dtype on both sides, shape ``[]``) whose value differs."""
    return "class" in n.dtype and "class" in b.dtype and n.shape == "[]" and n.stats[0] != b.stats[0]


def _facts(mode: str, row: list, n: Any, b: Any, metrics: list) -> Facts:
    """What the verdict rules read of a row (see :mod:`msprobe.compare._verdict`)."""
    if b is None:
        return Facts(row[0], _NA, dtype_n=n.dtype, shape_n=n.shape, rg_n=n.rg, max_n=n.stats[0], min_n=n.stats[1],
                     md5_n=n.md5 if mode == "md5" else _NA)
    f = Facts(row[0], row[1], dtype_n=n.dtype, dtype_b=b.dtype, shape_n=n.shape, shape_b=b.shape, rg_n=n.rg,
              rg_b=b.rg, max_n=n.stats[0], min_n=n.stats[1], max_b=b.stats[0], min_b=b.stats[1],
              scalar_differs=_scalar_differs(n, b))
    if mode == "statistics":
        f.norm_rel = metrics[7]
    elif mode == "tensor":
        f.cosine, f.ratio = metrics[0], metrics[4]
    else:
        f.md5_n, f.md5_b = metrics[0], metrics[1]
    return f


def _chunk(c: Any, lo: int, hi: int, with_rest: bool) -> dict:
    """Rows of the record pairs ``lo:hi`` (and the bench-only records when ``with_rest``),
    returned as ``row_list``."""
    data_n, data_b, pairs, rest = c.target_data, c.bench_data, c.pairs, c.rest
    src_n, src_b, mode = c.target_source, c.bench_source, c.mode
    mapping = c.mapping or {}
    threshold = c.threshold
    tensor_task = mode == "tensor"
    cols = COLUMNS[mode]
    drop = None if c.stack is not False else cols.index("NPU_Stack_Info")
    rows: list = []
    counts: dict = {}
    series: list = []
    first_div = None
    first_nan_n = None
    first_nan_b = None
    fin_n, fin_b = _Firsts(), _Firsts()
    plot_marks = PlotMarks()
    matched_records = 0
    unmatched_rows = 0
    done = 0
    prog = c.progress
    leaves_cache: dict = {}

    def bench_leaves_of(name: str) -> dict:
        got = leaves_cache.get(name)
        if got is None:
            got = {}
            for suffix, leaf, _io in record_leaves(name, data_b[name], tensor_task):
                got.setdefault(suffix, leaf)
            leaves_cache[name] = got
        return got

    def finish(facts: list, start: int, rec_i: Optional[int], nm: str) -> None:
        """Judge one record's rows (26.2.0's rules), count them, note the first divergence."""
        nonlocal first_div
        judge_record(mode, [f for f, _ in facts])
        # every matched output of the record differs by float round-off: a row only the 10x rule
        # flags is then no divergence (its Result stays)
        roundoff = threshold is None and all(m is None or (m == m and m <= roundoff_floor(f.dtype_n))
                                             for f, m in facts if f.output and f.matched)
        for k, (f, m) in enumerate(facts):
            row = rows[start + k]
            row[_RES], row[_ERR] = f.result, f.err_message
            counts[f.result] = counts.get(f.result, 0) + 1
            plot_marks.see(done + start + k, f.result, f.name, m)
            if first_div is None and rec_i is not None and f.matched and f.name != _NA \
                    and diverges(f.result, m, threshold) and not (roundoff and f.msgs == [MSG_NORM_10X]):
                first_div = {"record": nm, "row": f.name, "record_index": rec_i, "row_index": done + start + k,
                             "result": f.result, "err_message": f.err_message,
                             "norm_relative_err": m if m == m else None,
                             "metrics": dict(zip(cols[8:8 + _N_METRICS[mode]], row[8:8 + _N_METRICS[mode]]))}

    _RES, _ERR = cols.index("Result"), cols.index("Err_message")
    for rec_i in range(lo, hi):
        if prog is not None and (rec_i - lo) % 1000 == 999:
            prog.update(1000)
        nm, bm = pairs[rec_i]
        raw_n = data_n[nm]
        leaves_n = record_leaves(nm, raw_n, tensor_task)
        bench_leaves: dict = {}
        if bm is not None:
            matched_records += 1
            bench_leaves = dict(bench_leaves_of(bm))
            fin_b.tracker.record(bm)
        fin_n.tracker.record(nm)
        frames = src_n.frames_of(nm) if not nm.endswith(("backward", "debug")) else None
        stack = str(frames) if frames else _NA
        first_row = True
        start = len(rows)
        facts: list = []
        for suffix, leaf, _io in leaves_n:
            n = leaf_side(leaf)
            row_name = f"{nm}.{suffix}" if suffix else nm
            seen = fin_n.see(_io, suffix, n, nm, row_name, rec_i)
            if first_nan_n is None and seen is not None:
                first_nan_n = seen
            bname, bl = bench_counterpart(row_name, suffix, mapping, data_b, bench_leaves_of, bm, bench_leaves)
            if bname is not None:
                b = leaf_side(bl)
                seen = fin_b.see(_io, suffix, b, bm, bname, rec_i)
                if first_nan_b is None and seen is not None:
                    first_nan_b = seen
                head = [row_name, bname, n.dtype, b.dtype, n.shape, b.shape, n.rg, b.rg]
                norm_rel = None
                if mode == "statistics":
                    metrics, norm_rel = stats_metrics(n, b)
                    series.append(norm_rel if n.tensor else None)
                    row = head + metrics + list(map(str, n.stats)) + list(map(str, b.stats))
                elif mode == "md5":
                    metrics = md5_metrics(n, b)
                    series.append(None)
                    row = head + metrics
                else:
                    na = _load(src_n, n, nm) if n.tensor else None
                    ba = _load(src_b, b, bm) if b.tensor else None
                    metrics = tensor_metrics(na, ba)
                    _, norm_rel = stats_metrics(n, b)
                    series.append(norm_rel if n.tensor else None)
                    row = head + [str(m) for m in metrics] + list(map(str, n.stats)) + list(map(str, b.stats))
                row += [str(n.rg == b.rg), "pass", "[]", stack if first_row else _NA]
                if mode == "tensor":
                    row.append(f"['{n.data_name or -1}', '{b.data_name or -1}']")
                facts.append((_facts(mode, row, n, b, metrics), norm_rel))
            else:
                unmatched_rows += 1
                series.append(None)
                row = _unmatched_row(mode, row_name, n, stack if first_row else _NA, target_side=True)
                facts.append((_facts(mode, row, n, None, []), None))
            rows.append(row)
            first_row = False
        # bench leaves of a matched record that the target lacks (judged with the record)
        for suffix, bl in bench_leaves.items():
            unmatched_rows += 1
            series.append(None)
            row = _unmatched_row(mode, f"{bm}.{suffix}" if suffix else bm, leaf_side(bl), _NA, target_side=False)
            rows.append(row)
            facts.append((Facts(_NA, row[1], md5_b=leaf_side(bl).md5 if mode == "md5" else _NA), None))
        finish(facts, start, rec_i, nm)
    for bm in (rest if with_rest else ()):
        start = len(rows)
        facts = []
        fin_b.tracker.record(bm)
        for suffix, bl, _io in record_leaves(bm, data_b[bm], tensor_task):
            b = leaf_side(bl)
            seen = fin_b.see(_io, suffix, b, bm, f"{bm}.{suffix}" if suffix else bm, None)
            if first_nan_b is None and seen is not None:
                first_nan_b = seen
            unmatched_rows += 1
            series.append(None)
            row = _unmatched_row(mode, f"{bm}.{suffix}" if suffix else bm, b, _NA, target_side=False)
            rows.append(row)
            facts.append((Facts(_NA, row[1], md5_b=b.md5 if mode == "md5" else _NA), None))
        finish(facts, start, None, bm)
    if prog is not None:
        prog.update((hi - lo) % 1000)
    out = {"rows": done + len(rows), "records": hi - lo, "results": counts, "series": series,
           "first_divergence": first_div,
           "first_nan_inf_target": first_nan_n, "first_nan_inf_bench": first_nan_b,
           "firsts": (fin_n, fin_b), "marks": plot_marks,
           "matched_records": matched_records, "unmatched_rows": unmatched_rows,
           "row_list": rows}
    if drop is not None:
        out["row_list"] = [r[:drop] + r[drop + 1:] for r in rows]
    return out


def _fmt(v: Any) -> str:
    return str(v)


def _unmatched_row(mode: str, name: str, s: Any, stack: str, *, target_side: bool) -> list:
    """A row for a leaf that has no counterpart: the other side's columns are N/A."""
    cols = COLUMNS[mode]
    row = {c: _NA for c in cols}
    if target_side:
        row.update({"NPU Name": name, "NPU Dtype": s.dtype, "NPU Tensor Shape": s.shape, "NPU Requires_grad": s.rg})
        pre = "NPU"
    else:
        row.update({"Bench Name": name, "Bench Dtype": s.dtype, "Bench Tensor Shape": s.shape,
                    "Bench Requires_grad": s.rg})
        pre = "Bench"
    if mode in ("statistics", "tensor"):
        for k, v in zip(("max", "min", "mean", "l2norm"), s.stats):
            row[f"{pre} {k}"] = _fmt(v)
    if mode == "md5":
        row["NPU MD5" if target_side else "BENCH MD5"] = s.md5
    if mode == "tensor":
        row["Data_name"] = f"['{s.data_name or -1}', '-1']" if target_side else f"['-1', '{s.data_name or -1}']"
    row["Requires_grad Consistent"] = _NA
    row["Err_message"] = '["No bench data matched."]' if target_side else '["No target data matched."]'
    row["NPU_Stack_Info"] = stack
    return [row[c] for c in cols]




def oracle_pair(c: Any, path: str, keep_rows: bool = False, *, start: int = 0, stop: Optional[int] = None,
                with_rest: bool = True) -> tuple:
    """:func:`msprobe.compare._columnar.columnar_pair`, one row at a time."""
    stop = len(c.pairs) if stop is None else stop
    out = _chunk(c, start, stop, with_rest)
    rows = out.pop("row_list")
    if rows:
        write_columns(path, [list(col) for col in zip(*rows)])
    summary = PairSummary(rows=out["rows"], records=out["records"], matched_records=out["matched_records"],
                          unmatched_rows=out["unmatched_rows"], results=out["results"], series=out["series"],
                          marks=out["marks"])
    for key in ("first_divergence", "first_nan_inf_target", "first_nan_inf_bench"):
        setattr(summary, key, out[key])
    c_first = out["firsts"]
    c_first[0].fill(summary, "target")
    c_first[1].fill(summary, "bench")
    return summary, (rows if keep_rows else [])


def oracle_compare(monkeypatch: Any, *args: Any, **kw: Any) -> dict:
    """:func:`msprobe.compare.compare` with the row builder in place of the engine."""
    import multiprocessing

    from msprobe.compare import compare

    assert kw.get("workers", 1) == 1 or multiprocessing.get_start_method() == "fork"
    with monkeypatch.context() as patch:
        patch.setattr(_columnar, "columnar_pair", oracle_pair)
        return compare(*args, **kw)
