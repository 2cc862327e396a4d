"""The Result and Err_message of compare rows: 26.2.0's per-record rules, one table of column rules.

The real compare (mindstudio-probe 26.2.0) judges each *record* (API or module call) as a whole:
every row of the record starts at ``pass`` with no message, then each rule of the mode may raise
some rows to ``warning`` or ``error`` (never lower) and append its message; Err_message is the
JSON list of the messages a row collected, in rule order. The rules and their order were
reproduced from crafted dumps run through the real tool (the fixtures and CSVs under
tests/fixtures/real/compare_outputs/verdict_rules/ and result_rule/); docs/compare.md lists them
with their sources. Rows are classed by their target name: ``.output.`` in it makes an output
row, anything else (positional and keyword inputs, parameters, parameter gradients) an input row.

:data:`RULES` holds each mode's rules in order; each rule is a function of the rows' columns
(the engine's frame, :class:`msprobe.compare._frame.Frame`) that returns the rows it fires
on, and :func:`judge` evaluates the table over all rows at once. A record whose API is in
:data:`ALL_IGNORE` is not judged; one in :data:`INPUT_IGNORE` has its output rows judged by the
rules that do not read inputs. ``tests/compare/row_oracle.py`` keeps the rules one row at a time,
the reference this table is held to.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["Rule", "RULES", "judge", "ALL_IGNORE", "INPUT_IGNORE", "ignore_class", "ROUNDOFF_FLOOR", "ROUNDOFF_RULE",
           "roundoff_floor", "roundoff_rows", "roundoff_floor_sql", "ONLY_10X"]

PASS, WARNING, ERROR = "pass", "warning", "error"
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
#: what an md5 cell holds when the side has no CRC-32
NO_CRC = (_NA, "Nan", "")

#: The largest relative difference of a statistic that float round-off alone gives, by dtype: 256
#: unit round-offs u of the dtype (2^-16 for float32, u = 2^-24: the worst-case error bound n*u of
#: a sum of n = 256 terms added in another order, or the typical sqrt(n)*u of n = 65,536, a
#: hidden size), capped at 1e-2 for the 16- and 8-bit floats (256*u would be 12.5 % for float16
#: and 100 % for bfloat16 and hide real faults; 1e-2 is below a 5 % fault and far below the 10x
#: rule's own 0.1 for exact inputs). Integers, bools and anything else: 0 (no round-off). The
#: Result column does not read it (it is 26.2.0's); the first divergence does
#: (:func:`roundoff_rows`), and it is the same on every machine.
ROUNDOFF_FLOOR = {"float64": 2.0 ** -45, "float32": 2.0 ** -16, "float16": 1e-2, "bfloat16": 1e-2, "float8": 1e-2}
_DTYPE_ALIASES = {"double": "float64", "float": "float32", "half": "float16"}
#: the first divergence's rule, as summary.json's ``divergence`` and compare's stdout state it
ROUNDOFF_RULE = ("first row whose Result is not pass, passing over rows flagged only by the 10x rule whose "
                 "outputs' NormRelativeErr are float round-off (<= 2^-16 float32, 1e-2 float16/bfloat16, "
                 "2^-45 float64)")


def ignore_class(api: str) -> int:
    """0: judged, 1: outputs only (:data:`INPUT_IGNORE`), 2: not judged (:data:`ALL_IGNORE`),
    from a record's API name (the second dotted part of its first input row's name)."""
    return 2 if api in ALL_IGNORE else (1 if api in INPUT_IGNORE else 0)


@dataclass(frozen=True)
class Rule:
    """One of 26.2.0's rules: its message (``error: ...`` or ``warning: ...``), the rows it fires
    on (``rows(frame)``: a boolean mask or row indices) and whether input-ignored records skip it."""

    message: str
    rows: Callable[[Any], Any]
    skips_input_ignored: bool

    @property
    def warning(self) -> bool:
        return self.message.startswith("warning")


# ---------------------------------------------------------------- the rules over columns

def _inf_nan(frame: Any) -> Any:
    """The target's Max or Min is NaN/inf and the bench's are not."""
    return frame.nonfinite_max_min("target") & ~frame.nonfinite_max_min("bench")


def _norm_output(frame: Any) -> Any:
    """Statistics: every input's NormRelativeErr is below 0.1 and an output's is above 0.5."""
    import numpy as np

    inputs = frame.group_max(~frame.output_rows & frame.has_target, frame.norm_cell)
    return frame.output_rows & (inputs[frame.groups] < NORM_IN_LIMIT) & (np.abs(frame.norm_percent) > NORM_OUT_LIMIT)


def _framework(dtype: Any) -> int:
    """1 for a torch dtype name, 2 for a MindSpore one (``Float32``, ``BFloat16``), 0 for anything else."""
    text = str(dtype)
    if text.startswith("torch."):
        return 1
    return 2 if text[:1].isupper() and text[1:2].isalpha() and text != "N/A" else 0


def same_dtype(target: Any, bench: Any) -> bool:
    """Equal dtype names, or a MindSpore and a torch dtype of the same class (``Float32``, ``torch.float32``)."""
    if target == bench:
        return True
    return _framework(target) * _framework(bench) == 2 and dtype_class(str(target)) == dtype_class(str(bench))


def _across(frame: Any) -> Any:
    """The rows whose target dtype is a MindSpore one and whose bench dtype a torch one (or the reverse),
    in a compare across frameworks (-am/-cm/-lm; otherwise none)."""
    import numpy as np

    if not frame.across_frameworks:
        return np.zeros(frame.row_count, dtype=bool)

    kind = np.frompyfunc(_framework, 1, 1)
    target, bench = kind(frame.text("target", "dtype")), kind(frame.text("bench", "dtype"))
    return ((target * bench) == 2).astype(bool)


def _requires_grad(frame: Any) -> Any:
    """The requires_grad flags differ (a MindSpore tensor, which has none, against a torch one excepted)."""
    target, bench = frame.text("target", "requires_grad"), frame.text("bench", "requires_grad")
    known = (target != "") & (bench != "") & (target != _NA) & (bench != _NA)
    plain = frame.matched & (target != "") & (bench != "") & (target != bench)
    return plain & (known | ~_across(frame))


def _scalars(frame: Any) -> Any:
    """A scalar (non-tensor) input whose value differs."""
    return ~frame.output_rows & frame.scalar_differs()


def dtype_class(dtype: str) -> str:
    """The class of a dtype name of either framework (``torch.int64`` and ``Int32``: int)."""
    name = dtype.lower().rsplit(".", 1)[-1]
    for prefix, kind in (("bool", "bool"), ("complex", "complex"), ("uint", "int"), ("int", "int"),
                         ("float", "float"), ("bfloat", "float"), ("half", "float"), ("double", "float")):
        if name.startswith(prefix):
            return kind
    return name


def _dtype(frame: Any) -> Any:
    """The dtypes differ (fused qkv/gate_up bench names excepted); across frameworks (a torch dtype
    against a MindSpore one) their classes differ."""
    import numpy as np

    target, bench = frame.text("target", "dtype"), frame.text("bench", "dtype")
    differ = target != bench
    across = _across(frame)
    if across.any():
        classes = np.frompyfunc(dtype_class, 1, 1)
        differ = np.where(across, classes(target) != classes(bench), differ)
    if frame.across_frameworks:  # an argument one framework passes as no tensor or value (a group object)
        differ = differ & (target != _NA) & (bench != _NA)
    return (frame.matched & (frame.name != _NA) & ~frame.bench_name_has("qkv", "gate_up") & (target != "")
            & (bench != "") & differ.astype(bool))


def _shape(frame: Any) -> Any:
    differ = frame.matched & (frame.text("target", "shape") != frame.text("bench", "shape"))
    if frame.across_frameworks:  # an argument one framework passes as no tensor or value (a group object)
        differ = differ & (frame.text("target", "dtype") != _NA) & (frame.text("bench", "dtype") != _NA)
    return differ


def _first_output_where(frame: Any, groups: Any) -> Any:
    """The first output row of each record in the mask ``groups`` that has one."""
    first = frame.first_output()
    return first[groups & (first >= 0)]


def _norm_10x(frame: Any) -> Any:
    """Statistics, on the first output row: the outputs' largest NormRelativeErr is more than 10
    times the inputs' largest, or above 0.1 when every input is exact."""
    import numpy as np

    inputs = frame.group_max(~frame.output_rows & frame.has_target, frame.norm_cell)
    outputs = frame.group_max(frame.output_rows, frame.norm_cell)
    with np.errstate(all="ignore"):
        big = np.where(inputs == 0, outputs > NORM_ZERO_IN_OUT,
                       (outputs / np.where(inputs == 0, 1, inputs)) > NORM_RATIO)
    return _first_output_where(frame, big)


def _ratio(frame: Any) -> Any:
    """Tensor, on the first output row: the inputs' smallest One Thousandth Err Ratio is above
    0.9 and the outputs' smallest is below 0.1."""
    inputs = frame.group_min(~frame.output_rows, frame.ratio_number)
    outputs = frame.group_min(frame.output_rows, frame.ratio_number)
    return _first_output_where(frame, (inputs > RATIO_IN_LIMIT) & (outputs < RATIO_OUT_LIMIT))


def _cosine(frame: Any) -> Any:
    """Tensor, on the first output row: the inputs' smallest Cosine is above 0.9 and more than
    0.1 above the outputs' smallest."""
    inputs = frame.group_min(~frame.output_rows, frame.cosine_number)
    outputs = frame.group_min(frame.output_rows, frame.cosine_number)
    return _first_output_where(frame, (inputs > COSINE_IN_LIMIT) & (inputs - outputs > COSINE_DROP))


def _crc_differs(frame: Any) -> Any:
    import numpy as np

    target, bench = frame.text("target", "md5"), frame.text("bench", "md5")
    blank = np.isin(target, NO_CRC) | np.isin(bench, NO_CRC)
    return target != bench, blank


def _crc(frame: Any) -> Any:
    differs, blank = _crc_differs(frame)
    return differs & ~blank


def _crc_unmatched(frame: Any) -> Any:
    differs, blank = _crc_differs(frame)
    return differs & blank


_COMMON_HEAD = [Rule(MSG_INF_NAN, _inf_nan, False)]
_COMMON_MIDDLE = [Rule(MSG_REQ_GRAD, _requires_grad, False), Rule(MSG_SCALAR, _scalars, True),
                  Rule(MSG_DTYPE, _dtype, False), Rule(MSG_SHAPE, _shape, False)]
#: each mode's rules, in 26.2.0's order (Err_message lists the messages in this order)
RULES = {
    "statistics": _COMMON_HEAD + [Rule(MSG_NORM_OUT, _norm_output, True)] + _COMMON_MIDDLE
                  + [Rule(MSG_NORM_10X, _norm_10x, True)],
    "tensor": _COMMON_HEAD + [Rule(MSG_RATIO, _ratio, True)] + _COMMON_MIDDLE + [Rule(MSG_COSINE, _cosine, True)],
    "md5": [Rule(MSG_CRC, _crc, False), Rule(MSG_CRC_UNMATCHED, _crc_unmatched, False)],
}


def roundoff_floor(dtype: Any) -> float:
    """:data:`ROUNDOFF_FLOOR` of a dtype name of either framework (``torch.float32``, ``BFloat16``,
    ``torch.float8_e4m3fn``); 0 for integers, bools and unknown names."""
    name = str(dtype).lower().rsplit(".", 1)[-1]
    name = _DTYPE_ALIASES.get(name, name)
    return ROUNDOFF_FLOOR.get("float8" if name.startswith("float8") else name, 0.0)


def roundoff_floor_sql(column: str) -> str:
    """SQL: :func:`roundoff_floor` of the dtype names in ``column`` (the explorer's first divergence)."""
    name = f"lower(regexp_extract(coalesce({column}, ''), '([^.]*)$', 1))"
    cases = [f"WHEN {name} IN ({', '.join(repr(n) for n in names)}) THEN {floor!r}"
             for floor, names in _floor_names().items()]
    return f"(CASE {' '.join(cases)} WHEN {name} LIKE 'float8%' THEN {ROUNDOFF_FLOOR['float8']!r} ELSE 0.0 END)"


def _floor_names() -> dict:
    """{floor: [the dtype names (last dotted part, lower case) that have it]}."""
    out: dict = {}
    for name, floor in ROUNDOFF_FLOOR.items():
        out.setdefault(floor, []).append(name)
    for alias, name in _DTYPE_ALIASES.items():
        out[ROUNDOFF_FLOOR[name]].append(alias)
    return out


#: the Err_message of a row only the 10x rule flags
ONLY_10X = json.dumps([MSG_NORM_10X])


def roundoff_rows(frame: Any, messages: Any) -> Any:
    """The rows whose only message is the 10x rule's (:data:`MSG_NORM_10X`) and whose record's
    output rows all differ from the bench by float round-off: each matched output's
    NormRelativeErr at most :func:`roundoff_floor` of its target dtype (an ``inf``, ``nan`` or
    unreadable one is no round-off). The 10x rule has no floor of its own: on a round-off output
    (7.2e-07) over a rounder input (6.4e-08) it fires. Such rows keep their Result (26.2.0's);
    the first divergence passes over them."""
    import numpy as np

    only = np.asarray(messages == ONLY_10X, dtype=bool)
    if not only.any():
        return only
    dtypes = frame.text("target", "dtype").tolist()
    floor_of = {dtype: roundoff_floor(dtype) for dtype in set(dtypes)}  # a few dtypes, many rows
    floors = np.fromiter(map(floor_of.__getitem__, dtypes), dtype=float, count=len(dtypes))
    with np.errstate(invalid="ignore"):
        within = frame.norm <= floors  # NaN (a nan difference) is no round-off
    departs = frame.output_rows & frame.matched & ~frame.norm_none & ~within
    departed = np.zeros(frame.group_count, dtype=bool)
    departed[frame.groups[departs]] = True
    return only & ~departed[frame.groups]


def judge(frame: Any, mode: str) -> tuple:
    """(Result column, Err_message column) of every row of ``frame``: the mode's rules evaluated
    over the columns, each restricted to the rows its record's ignore class leaves."""
    import numpy as np

    rules = RULES[mode]
    fired = np.zeros(frame.row_count, dtype=np.int64)
    for bit, rule in enumerate(rules):
        rows = np.zeros(frame.row_count, dtype=bool)
        rows[rule.rows(frame)] = True
        fired |= (rows & (frame.fully_judged if rule.skips_input_ignored else frame.judged)).astype(np.int64) << bit
    if not frame.row_count:
        return np.array([], dtype=object), np.array([], dtype=object)
    warnings = sum(1 << bit for bit, rule in enumerate(rules) if rule.warning)
    distinct, inverse = np.unique(fired, return_inverse=True)
    results, messages = [], []
    for bits in distinct.tolist():
        messages.append(json.dumps([rule.message for bit, rule in enumerate(rules) if bits >> bit & 1]))
        results.append(PASS if bits == 0 else (WARNING if bits & ~warnings == 0 else ERROR))
    return np.array(results, dtype=object)[inverse.ravel()], np.array(messages, dtype=object)[inverse.ravel()]
