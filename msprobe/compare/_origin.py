"""Where an error is introduced: the localisation compare and the lake report as the first divergence.

26.2.0's Result column flags a record when its output's error is large *relative to its inputs'*
(rule S7: 10 times), so a fault whose own record passes (a weight 5 % off feeds a linear whose
output is 5 % off: the ratio is 1) is reported downstream, where some op amplifies it. This
module answers the user's question instead: walking one rank pair's records in the target's
execution order, the first record where an error *enters*:

* an **output** departing from the bench beyond the threshold while every input stays within it
  (the record computes something wrong), or
* an **input** departing beyond the threshold that no earlier record produced (its statistics are
  those of no earlier output of the target): a parameter/weight, or data the dump does not show
  being computed (``role`` "parameter" for a ``parameters`` entry or a tensor that requires grad,
  else "input");
* a record only one side has (a layer skipped, an op added: ``role`` "missing in target" /
  "extra in target"), when it comes before the first error introduced.

A leaf departs by the largest of its statistics' differences, each relative to the bench
tensor's scale (``max(|Max|, |Min|)``; the Norm relative to the bench Norm): a mean near zero
does not blow the measure up. NaN or Inf on one side only, a different shape, or a different dtype
(``dtype`` noted) always depart; in md5 mode a different CRC-32 departs.
"""
from __future__ import annotations

import math
from typing import Any, Optional

from msprobe.compare._rows import leaf_side, record_leaves

__all__ = ["ORIGIN_THRESHOLD", "find_origin", "departure", "describe", "earliest", "order_key"]

#: a leaf departs from the bench when its statistics differ by more than this fraction of its scale
ORIGIN_THRESHOLD = 1e-4
_OUT_IO = ("output", "parameters_grad")


def _num(v: Any) -> Optional[float]:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf


def _rel(a: Optional[float], b: Optional[float], scale: float) -> float:
    if a is None or b is None or a == b or (a != a and b != b):
        return 0.0
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / scale if scale > 0 else math.inf


def departure(n: Any, b: Any, md5: bool = False) -> tuple:
    """(size, note) of a target leaf ``n`` against its bench leaf ``b`` (:class:`_rows.Side`):
    the largest relative difference of their statistics (inf where one side only is non-finite,
    or the shapes differ), and a note ("dtype X vs Y", "shape", "CRC-32") or None."""
    if n.shape != b.shape:
        return math.inf, "shape"
    if md5:
        return (math.inf, "CRC-32") if n.md5 != b.md5 else (0.0, None)
    note = f"dtype {n.dtype} vs {b.dtype}" if n.dtype != b.dtype else None
    if not n.tensor or not b.tensor:
        return (0.0 if n.stats[0] == b.stats[0] else math.inf), note
    mx_n, mn_n, me_n, no_n = (_num(v) for v in n.stats)
    mx_b, mn_b, me_b, no_b = (_num(v) for v in b.stats)
    ends = [abs(v) for v in (mx_b, mn_b) if v is not None and math.isfinite(v)]
    scale = max(ends) if ends else 0.0
    size = max(_rel(mx_n, mx_b, scale), _rel(mn_n, mn_b, scale), _rel(me_n, me_b, scale),
               _rel(no_n, no_b, abs(no_b) if no_b is not None and math.isfinite(no_b) else 0.0))
    return size, note


def _sig(s: Any) -> tuple:
    return (s.dtype, tuple(repr(v) for v in s.stats))


def _has_tensor(leaves: list) -> bool:
    return any(leaf is not None and leaf_side(leaf).tensor for _, leaf, _ in leaves)


def find_origin(data_n: dict, data_b: dict, pairs: list, rest: list, mode: str,
                threshold: Optional[float] = None) -> Optional[dict]:
    """The first record of one rank pair where an error is introduced (see the module doc):
    ``{record, bench_record, row, argument, role, size, note, record_index}`` or None.
    ``pairs``/``rest``: :func:`msprobe.compare._match.match_records`' matching."""
    thr = ORIGIN_THRESHOLD if threshold is None else threshold
    md5 = mode == "md5"
    tensor_task = mode == "tensor"
    b_pos = {nm: i for i, nm in enumerate(data_b)}
    missing = [nm for nm in rest if _has_tensor(record_leaves(nm, data_b[nm], tensor_task))]
    # a bench-only record sits before the first matched target record that follows it in the bench
    miss_at: list = []
    if missing:
        matched_b = sorted((b_pos[bm], i) for i, (_, bm) in enumerate(pairs) if bm is not None)
        import bisect

        keys = [p for p, _ in matched_b]
        for nm in missing:
            k = bisect.bisect_right(keys, b_pos[nm])
            miss_at.append((matched_b[k][1] if k < len(matched_b) else len(pairs), nm))
        miss_at.sort()
    produced: set = set()
    for rec_i, (nm, bm) in enumerate(pairs):
        if miss_at and miss_at[0][0] <= rec_i:
            return _missing(miss_at[0][1], miss_at[0][0])
        leaves = record_leaves(nm, data_n[nm], tensor_task)
        if bm is None:
            if nm.endswith(".debug") or not _has_tensor(leaves):
                continue
            return {"record": nm, "bench_record": None, "row": nm, "argument": None, "role": "extra in target",
                    "size": None, "note": "the bench has no such record", "record_index": rec_i}
        b_leaves = {sfx: leaf for sfx, leaf, _ in record_leaves(bm, data_b[bm], tensor_task)}
        ins: list = []
        outs: list = []
        for sfx, leaf, io in leaves:
            if sfx not in b_leaves or leaf is None or b_leaves[sfx] is None:
                continue
            n = leaf_side(leaf)
            size, note = departure(n, leaf_side(b_leaves[sfx]), md5)
            (outs if io in _OUT_IO else ins).append((sfx, io, n, size, note))
        found = None
        for sfx, io, n, size, note in ins:
            if (size > thr or note) and _sig(n) not in produced:
                role = "parameter" if io == "parameters" or n.rg == "True" else "input"
                found = (sfx, role, size, note)
                break
        if found is None and all(not (size > thr or note) for *_, size, note in ins):
            bad = [(size, sfx, note) for sfx, _, _, size, note in outs if size > thr or note]
            if bad:
                size, sfx, note = max(bad, key=lambda t: t[0])
                found = (sfx, "output", size, note)
        if found is not None:
            sfx, role, size, note = found
            if not math.isfinite(size):
                size, note = None, note or "NaN/Inf on the target side only"
            return {"record": nm, "bench_record": bm, "row": f"{nm}.{sfx}" if sfx else nm, "argument": sfx,
                    "role": role, "size": size, "note": note, "record_index": rec_i}
        for _, _, n, _, _ in outs:
            if n.tensor:
                produced.add(_sig(n))
    if miss_at:
        return _missing(miss_at[0][1], miss_at[0][0])
    return None


def _step_key(s: Any) -> tuple:
    return (s is None, s if isinstance(s, int) else 0, str(s))


def order_key(r: dict, key: str, i: int = 0) -> tuple:
    """Sort key of rank-pair result ``r`` by its ``key`` entry (a first divergence, origin or first
    NaN, with a ``record_index``): the earliest step, then the lowest record index over the ranks
    of that step, then rank order (``i``: the result's position, the last tie-break)."""
    ri = r[key].get("record_index")
    return (_step_key(r.get("step")), str(r.get("split") or ""), math.inf if ri is None else ri,
            r.get("rank") is None, r.get("rank") or 0, i)


def earliest(results: list, key: str) -> Optional[dict]:
    """The result whose ``key`` entry comes first in :func:`order_key`'s order (None when no
    result has one): the one rule compare and the lake's questions pick by."""
    got = [(order_key(r, key, i), i) for i, r in enumerate(results) if r.get(key)]
    return results[min(got)[1]] if got else None


def _missing(bench_name: str, at: int) -> dict:
    return {"record": bench_name, "bench_record": bench_name, "row": bench_name, "argument": None,
            "role": "missing in target", "size": None, "note": "the target has no such record", "record_index": at}


def describe(o: dict) -> str:
    """One line: ``Functional.linear.6.forward input.1 (parameter, 5% off the bench)``."""
    if o["role"] in ("missing in target", "extra in target"):
        return f"{o['record']} ({o['role']}: {o['note']})"
    how = [f"{o['size'] * 100:.3g}% off the bench"] if o.get("size") is not None else []
    if o.get("note"):
        how.append(o["note"])
    return f"{o['record']} {o['argument']} ({o['role']}, {', '.join(how)})"
