"""NaN, +Inf and -Inf in a record's statistics, told apart; a mask's intended ``-inf`` is no anomaly.

A healthy transformer writes ``-inf`` on purpose: ``masked_fill(mask, -inf)`` builds the
attention mask, which is then passed on (``attn_mask=``) and added to the scores. Such a
tensor holds ``-inf`` and nothing worse (no NaN, no ``+inf``). :class:`NonFiniteTracker`
walks one rank's records in execution order and calls each entry one of:

* ``"nan"``: a NaN statistic;
* ``"inf"``: ``+inf``, or ``-inf`` that is not a mask's;
* ``"masked"``: ``-inf`` only, in an output of ``masked_fill``/``masked_fill_``,
  ``full``/``full_like``/``new_full``/``fill_`` (or its fill value), in an input whose name says ``mask``, in the same tensor passed on (same dtype,
  shape and statistics), or in the output of a record fed such a mask;
* ``None``: finite.

Statistics are ``(Max, Min, Mean, Norm)``; an infinite Norm or Mean is explained by the
Max/Min it comes with (``-inf`` in the tensor gives ``Norm inf``), and is ``+inf`` only when
Max and Min are finite (the statistic overflowed). Max and Min carry a NaN of the tensor (both
tools take them with NaN-propagating reductions), so a NaN Mean under ``Max +inf, Min -inf`` is
the sum ``inf + -inf``, not a NaN element: that tensor is ``inf`` (a float16 matmul that
overflowed both ways), and the first NaN is looked for further on.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Optional

__all__ = ["MASKING_APIS", "stat_kinds", "NonFiniteTracker", "describe"]

#: APIs whose -inf outputs are a mask by construction (``masked_fill(mask, -inf)``, and the
#: ``torch.full((t, t), -inf)`` / ``fill_`` a causal mask starts from before ``triu``)
MASKING_APIS = frozenset({"masked_fill", "masked_fill_", "full", "full_like", "fill_", "new_full"})
_INF = math.inf


def _float(value: Any) -> Optional[float]:
    return value if value.__class__ is float else None


def stat_kinds(stats: Iterable[Any]) -> frozenset:
    """{'nan', '+inf', '-inf'} present in ``(Max, Min, Mean, Norm)`` (missing values tolerated)."""
    maximum, minimum, mean, norm = (list(stats) + [None] * 4)[:4]
    maximum, minimum, mean, norm = _float(maximum), _float(minimum), _float(mean), _float(norm)
    out = set()
    both_infs = maximum == _INF and minimum == -_INF
    if any(value is not None and value != value for value in (maximum, minimum)) or (
            not both_infs and any(value is not None and value != value for value in (mean, norm))):
        out.add("nan")
    if maximum == _INF or minimum == _INF:
        out.add("+inf")
    if minimum == -_INF or maximum == -_INF:
        out.add("-inf")
    finite_ends = maximum is not None and minimum is not None and math.isfinite(maximum) and math.isfinite(minimum)
    if finite_ends and any(value is not None and math.isinf(value) for value in (mean, norm)):
        out.add("+inf")  # the statistic overflowed: the tensor is finite, its Norm is not
    return frozenset(out)


def _api_name(record: str) -> str:
    parts = record.split(".")
    return parts[1] if len(parts) > 2 else ""


class NonFiniteTracker:
    """Classify the entries of one rank's records, fed in execution order (see the module doc)."""

    def __init__(self) -> None:
        self._masks: set = set()
        self._api = ""
        self._fed = False
        self.counts = {"nan": 0, "inf": 0, "masked": 0}

    def record(self, name: str) -> None:
        """Start the entries of record ``name``."""
        self._api = _api_name(name)
        self._fed = False

    def see(self, io: Optional[str], path: str, stats: Iterable[Any], dtype: Any = None, shape: Any = None) -> Optional[str]:
        stats = tuple(stats)
        kinds = stat_kinds(stats)
        if not kinds:
            return None
        if "nan" in kinds:
            kind = "nan"
        elif kinds == {"-inf"} and self._is_mask(io, path, (str(dtype), str(shape), stats)):
            kind = "masked"
        else:
            kind = "inf"
        self.counts[kind] += 1
        return kind

    def _is_mask(self, io: Optional[str], path: str, sig: tuple) -> bool:
        is_input = io in ("input", "input_args", "input_kwargs")
        leaf = path.rsplit(".", 1)[-1].lower() if path else ""
        ok = (self._api in MASKING_APIS or sig in self._masks or (is_input and "mask" in leaf)
              or (not is_input and self._fed))
        if ok:
            self._masks.add(sig)
            if is_input:
                self._fed = True
        return ok


def describe(counts: dict, unit: str = "tensors") -> str:
    """One line: what was found, e.g. ``no NaN, no +/-Inf (-inf only in masks: 12 tensors)``."""
    nan, inf, masked = counts.get("nan", 0), counts.get("inf", 0), counts.get("masked", 0)
    parts = [f"NaN in {nan} {unit}" if nan else "no NaN", f"+/-Inf in {inf} {unit}" if inf else "no +/-Inf"]
    text = ", ".join(parts)
    if masked:
        text += f" (-inf only in masked_fill outputs and the masks they feed: {masked} {unit}, as intended)"
    return text
