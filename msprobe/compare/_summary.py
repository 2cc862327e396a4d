"""What compare reports of one rank pair beside its CSV: :class:`PairSummary`, built per block
of rows and per forked chunk, and merged in row order; :class:`NonFiniteFirsts`, the first NaN
and first +/-Inf of one side."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from msprobe.compare._plot import PlotMarks
from msprobe.format.nonfinite import NonFiniteTracker

__all__ = ["PairSummary", "NonFiniteFirsts", "FIRST_KEYS", "comes_before"]

#: the entries of a summary that keep their first occurrence when summaries are merged
FIRST_KEYS = ("first_divergence", "first_nan_inf_target", "first_nan_inf_bench", "first_nan_target",
              "first_nan_bench", "first_inf_target", "first_inf_bench")


def settled(entry: dict) -> float:
    """Where a first NaN/Inf entry's content was settled: its ``settled_at``
    (:mod:`msprobe.format.settled`), else its record index."""
    at = entry.get("settled_at")
    if at is None:
        at = entry.get("record_index")
    return float("inf") if at is None else at


def comes_before(entry: dict, than: Optional[dict]) -> bool:
    """Whether ``entry`` comes before the entry ``than`` (None: nothing yet) where their content
    was settled: leaves arrive in record order, so only a moved record (``settled_at``) is passed."""
    return than is None or settled(entry) < settled(than)


class NonFiniteFirsts:
    """The first NaN and the first +/-Inf of one side (a mask's intended -inf counted apart,
    :mod:`msprobe.format.nonfinite`). ``positions``: {record index: position} of the records whose
    content postdates their place (:func:`msprobe.format.settled.settled_positions`), taken there."""

    def __init__(self, positions: Optional[dict] = None) -> None:
        self.tracker = NonFiniteTracker()
        self.first: dict = {"nan": None, "inf": None}
        self.positions = positions or {}

    def see(self, io: Any, suffix: str, side: Any, record: str, row: str, record_index: Any) -> Optional[dict]:
        """The entry for the summary when this leaf is the side's first NaN/Inf anomaly."""
        kind = self.tracker.see(io, suffix, side.stats, side.dtype, side.shape)
        if kind not in self.first:
            return None
        entry = {"record": record, "row": row, "record_index": record_index, "kind": kind}
        if record_index in self.positions:
            entry["settled_at"] = self.positions[record_index]
        if not comes_before(entry, self.first[kind]):
            return None
        self.first[kind] = entry
        return entry if comes_before(entry, self.first["nan" if kind == "inf" else "inf"]) else None

    def fill(self, summary: "PairSummary", side: str) -> None:
        """Set ``summary``'s first NaN, first Inf and masked -inf count of ``side`` from this tracker."""
        setattr(summary, f"first_nan_{side}", self.first["nan"])
        setattr(summary, f"first_inf_{side}", self.first["inf"])
        setattr(summary, f"masked_inf_{side}", self.tracker.counts["masked"])


@dataclass
class PairSummary:
    """The summary of some consecutive rows of one rank pair (a block, a forked chunk, the pair):
    row and record counts, rows per Result (in first-occurrence order), the NormRelativeErr
    series, the plot's marks and the first divergence / NaN / Inf entries (``row_index`` counted
    from the first of these rows)."""

    rows: int = 0
    records: int = 0
    matched_records: int = 0
    unmatched_rows: int = 0
    results: dict = field(default_factory=dict)
    series: list = field(default_factory=list)
    marks: PlotMarks = field(default_factory=PlotMarks)
    first_divergence: Optional[dict] = None
    first_nan_inf_target: Optional[dict] = None
    first_nan_inf_bench: Optional[dict] = None
    first_nan_target: Optional[dict] = None
    first_inf_target: Optional[dict] = None
    first_nan_bench: Optional[dict] = None
    first_inf_bench: Optional[dict] = None
    masked_inf_target: int = 0
    masked_inf_bench: int = 0

    def merge(self, later: "PairSummary") -> "PairSummary":
        """Append the summary of the rows that follow these; returns self."""
        offset = self.rows
        for result, count in later.results.items():
            self.results[result] = self.results.get(result, 0) + count
        self.series.extend(later.series)
        self.marks.merge(later.marks, offset)
        for key in FIRST_KEYS:
            got = getattr(later, key)
            mine = getattr(self, key)
            if got is not None and (mine is None or (key != "first_divergence" and "settled_at" in mine
                                                      and comes_before(got, mine))):
                got = dict(got)
                if "row_index" in got:
                    got["row_index"] += offset
                setattr(self, key, got)
        self.rows += later.rows
        self.records += later.records
        self.matched_records += later.matched_records
        self.unmatched_rows += later.unmatched_rows
        self.masked_inf_target += later.masked_inf_target
        self.masked_inf_bench += later.masked_inf_bench
        return self

    @classmethod
    def merged(cls, parts: list) -> "PairSummary":
        total = cls()
        for part in parts:
            total.merge(part)
        return total
