"""The dialects: what each producer of the format writes differently, as objects.

A :class:`Dialect` says how to recognise its dumps (its rank directory names, the votes its
records cast), how to normalise its record names to the documented spelling, and which
statistics rule it follows. Readers accept every dialect; writers choose one. Adding a dialect
is one entry of :data:`DIALECTS` (docs/architecture.md, "Recipe: add a dialect").
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from msprobe.errors import UnknownDialectError
from msprobe.format.layout import parse_rank_dir

__all__ = ["Dialect", "DIALECTS", "get_dialect", "detect_dialect", "normalise_record_name", "casts_stats"]

_PGRAD_COUNT_RE = re.compile(r"\.parameters_grad\.\d+$")
_FORWARD_RE = re.compile(r"\.(?:\d+\.forward|forward\.\d+)$")
_TORCH_INT = ("torch.int", "torch.uint", "torch.long", "torch.short")


@dataclass(frozen=True)
class Dialect:
    """What a producer writes differently. Readers accept all; writers choose one."""

    name: str
    single_rank_dir: str  # 'rank' or 'proc'
    params_grad_count: bool  # '...parameters_grad.0' (26.x) vs '...parameters_grad' (8.x)
    is_recompute: bool  # forward records carry "is_recompute": false (8.x)
    int_stats_as_int: bool  # int tensors: Max/Min ints and Mean/Norm null (26.x) vs floats (8.x)
    memory_format_key: str  # 'format' in every known release ('value' is never written)
    summary_modes: tuple

    # -- its statistics rule ----------------------------------------------------------------------
    @property
    def casts_stats(self) -> bool:
        """Integer and float64 tensors' statistics computed in float32, all four given (8.x, 1.x),
        instead of integer Max/Min and null Mean/Norm (26.x, ours)."""
        return not self.int_stats_as_int

    # -- its names --------------------------------------------------------------------------------
    def normalise_name(self, name: str) -> str:
        """A record name of this dialect in the documented spelling (26.x's ``parameters_grad.N``
        -> ``parameters_grad``)."""
        return _PGRAD_COUNT_RE.sub(".parameters_grad", name) if self.params_grad_count else name

    # -- recognising it ---------------------------------------------------------------------------
    def claims_rank_dirs(self, names: Iterable[str]) -> bool:
        """Whether rank directory names alone say a dump is this dialect's (26.x's ``proc<pid>``)."""
        return self.single_rank_dir == "proc" and any(name.startswith("proc") for name in names)

    def record_votes(self, name: str, record: Any, int_stats: tuple) -> int:
        """How strongly one record speaks for this dialect: its parameter-gradient name (2), whether
        a forward record carries ``is_recompute`` (1), and ``int_stats`` = (float, integer) Max
        counts of its integer tensors (1 each)."""
        votes = 0
        if name.endswith(".parameters_grad"):
            votes += 0 if self.params_grad_count else 2
        elif _PGRAD_COUNT_RE.search(name):
            votes += 2 if self.params_grad_count else 0
        elif isinstance(record, dict) and _FORWARD_RE.search(name):
            votes += 1 if ("is_recompute" in record) == self.is_recompute else 0
        return votes + int_stats[1 if self.int_stats_as_int else 0]


DIALECTS = {
    "msprobe-8": Dialect("msprobe-8", "rank", False, True, False, "format", ("statistics", "md5")),
    "msprobe-26": Dialect("msprobe-26", "proc", True, False, True, "format", ("statistics", "md5", "xor")),
}
#: msprobe 1.x (2024, also atat): the documented layout (``rank``), 8.x-style parameter-gradient names and
#: float statistics, but no ``is_recompute`` and no top-level ``framework`` key (spec/FORMAT.md 4.1, 4.3).
DIALECTS["msprobe-1"] = Dialect("msprobe-1", "rank", False, False, False, "format", ("statistics", "md5"))
#: Ours: the documented layout (``rank``), 8.x record names, 26.x statistics types. See spec/FORMAT.md.
DIALECTS["msprobe-lake"] = Dialect("msprobe-lake", "rank", False, False, True, "format", ("statistics", "md5", "xor"))

#: the real tool's two releases whose records tell them apart (the vote of :func:`detect_dialect`):
#: the first is also a rank directory's dialect when there is no document to read
_VOTERS = (DIALECTS["msprobe-8"], DIALECTS["msprobe-26"])
_ONE_X = DIALECTS["msprobe-1"]
#: the dialects whose record names differ from the documented spelling
_RENAMING = tuple(dialect for dialect in DIALECTS.values() if dialect.params_grad_count)


def get_dialect(name: str) -> Dialect:
    try:
        return DIALECTS[name]
    except KeyError:
        raise UnknownDialectError(f"unknown dialect {name!r}; known: {', '.join(sorted(DIALECTS))}") from None


def casts_stats(name: str) -> bool:
    """Whether the dialect called ``name`` computes integer/float64 statistics in float32 (False
    for a name no dialect has)."""
    dialect = DIALECTS.get(name)
    return dialect is not None and dialect.casts_stats


def normalise_record_name(name: str) -> str:
    """A record name of any dialect in the documented spelling (what compare matches on)."""
    for dialect in _RENAMING:
        name = dialect.normalise_name(name)
    return name


def detect_dialect(rank_dir_names: Iterable[str] = (), data: Optional[dict] = None,
                   marker: Optional[dict] = None, header: Optional[dict] = None) -> str:
    """Guess the producer from cheap evidence: our marker file, the rank directory names,
    the document's header (``header``: the document object; 1.x wrote no ``framework``), then
    the records (``is_recompute``, parameters_grad count, integer statistics).

    Returns a key of :data:`DIALECTS`; 'unknown' never — it raises UnknownDialectError when
    nothing looks like an msprobe dump."""
    if marker and marker.get("dialect") in DIALECTS:
        return marker["dialect"]
    names = list(rank_dir_names)
    for dialect in DIALECTS.values():
        if dialect.claims_rank_dirs(names):
            return dialect.name
    if data is None:
        if any(parse_rank_dir(n) for n in names):
            return _VOTERS[0].name
        raise UnknownDialectError("no rank directory (rank, rank<N>, proc<pid>) and no document to inspect")
    if header is not None and _is_1x(header, data):
        return _ONE_X.name
    first, second = _VOTERS
    votes_first = votes_second = 0
    for i, (name, rec) in enumerate(data.items()):
        if i >= 64 or abs(votes_first - votes_second) > 8:
            break
        int_stats = _int_stat_votes(rec)
        votes_first += first.record_votes(name, rec, int_stats)
        votes_second += second.record_votes(name, rec, int_stats)
    return second.name if votes_second > votes_first else first.name


def _is_1x(header: dict, data: dict) -> bool:
    """spec/FORMAT.md 4.3 step 4: a document without a top-level ``framework`` key whose first 64
    records hold no ``is_recompute`` and no ``.parameters_grad.<n>`` name was written by 1.x."""
    if "framework" in header or header.get("fragment"):
        return False
    for i, (name, rec) in enumerate(data.items()):
        if i >= 64:
            break
        if _PGRAD_COUNT_RE.search(name) or (isinstance(rec, dict) and "is_recompute" in rec):
            return False
    return True


def _int_stat_votes(value: Any, depth: int = 0) -> tuple:
    """(float, integer) Max counts of the PyTorch integer tensors in ``value``: 26.x writes integer
    Max (and null Mean), 8.x floats."""
    floats = ints = 0
    if depth > 6:
        return floats, ints
    if isinstance(value, dict):
        if value.get("type") == "torch.Tensor" and str(value.get("dtype", "")).startswith(_TORCH_INT):
            mx = value.get("Max") if value.get("shape") else None  # 0-d tensors keep their type in both
            if isinstance(mx, float):
                floats += 1
            elif isinstance(mx, int) and not isinstance(mx, bool):
                ints += 1
            return floats, ints
        items: Iterable = value.values()
    elif isinstance(value, list):
        items = value
    else:
        return floats, ints
    for item in items:
        item_floats, item_ints = _int_stat_votes(item, depth + 1)
        floats, ints = floats + item_floats, ints + item_ints
    return floats, ints
