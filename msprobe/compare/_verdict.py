"""The Result and Err_message of compare rows: 26.2.0's per-record rules, one function per rule.

The real compare (mindstudio-probe 26.2.0) judges each *record* (API or module call) as a whole:
every row of the record starts at ``pass`` with no message, then each rule of the mode may raise
some rows to ``warning`` or ``error`` (never lower) and append its message; Err_message is the
JSON list of the messages a row collected, in rule order. The rules and their order were
reproduced from crafted dumps run through the real tool (the fixtures and CSVs under
tests/fixtures/real/compare_outputs/verdict_rules/ and result_rule/); docs/compare.md lists them
with their sources. Rows are classed by their target name: ``.output.`` in it makes an output
row, anything else (positional and keyword inputs, parameters, parameter gradients) an input row.

:func:`judge_record` is the entry point; it works on :class:`Facts`, what a row shows, so that
the rules stay plain functions of the CSV cells (and can be vectorised over many records).
"""
from __future__ import annotations

import json
import math
from typing import Any, Optional

__all__ = ["Facts", "judge_record", "diverges", "ignore_level", "ALL_IGNORE", "INPUT_IGNORE", "RULES"]

PASS, WARNING, ERROR = "pass", "warning", "error"
_LEVEL = {PASS: 0, WARNING: 1, ERROR: 2}
_NA = "N/A"

#: API names (the second part of a record name) that no rule judges ...
ALL_IGNORE = frozenset({"empty", "empty_like", "numpy", "to", "__setitem__", "empty_with_format",
                        "new_empty_strided", "new_empty", "empty_strided"})
#: ... and those judged on their outputs only (collectives whose inputs differ by design)
INPUT_IGNORE = frozenset({"_reduce_scatter_base", "_all_gather_base", "all_to_all_single", "batch_isend_irecv"})

MSG_INF_NAN = "error: There is nan/inf/-inf in the maximum or minimum value of NPU."
MSG_NORM_OUT = "error: The NormRelativeErr of output is greater than 0.5."
MSG_REQ_GRAD = "error: The Required_Grad of NPU and Bench are inconsistent"
MSG_SCALAR = "error: The scalar parameters of NPU and Bench are inconsistent."
MSG_DTYPE = "error: The dtype of NPU and Bench are inconsistent."
MSG_SHAPE = "error: The shape of NPU and Bench are inconsistent."
MSG_NORM_10X = "warning: The norm relative error of output is 10 times that of input."
MSG_RATIO = "error: The input/parameters of One Thousandth Err Ratio > 0.9 while the output < 0.6."
MSG_COSINE = "warning: The input/parameters of Cosine > 0.9, and input/parameters - output > 0.1"
MSG_CRC = "error: The CRC-32 value of NPU differs from that of the bench."
MSG_CRC_UNMATCHED = "warning: The parameter of NPU does not match the bench."

#: thresholds of the rules (26.2.0's values)
NORM_IN_LIMIT = 0.1      # inputs' largest NormRelativeErr below this ...
NORM_OUT_LIMIT = 0.5     # ... and an output's above this: error
NORM_RATIO = 10          # outputs' largest NormRelativeErr over inputs' largest: warning
NORM_ZERO_IN_OUT = 0.1   # the same when every input is exact: outputs' largest above this
RATIO_IN_LIMIT = 0.9     # inputs' smallest One Thousandth Err Ratio above this ...
RATIO_OUT_LIMIT = 0.1    # ... and outputs' smallest below this: error
COSINE_IN_LIMIT = 0.9    # inputs' smallest Cosine above this ...
COSINE_DROP = 0.1        # ... and more than this above the outputs' smallest: warning


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
