"""Match the records of two dumps: by full name, then across dialects, then by structure.

1. **Full name**: the same record name on both sides.
2. **Dialect**: names equal once dialect differences are removed (26.x ``parameters_grad.N`` vs
   8.x ``parameters_grad``); rank vs proc directories are paired in :func:`pair_sources`.
3. **Structure** (module-level dumps, L0/mix, whose call counts differ: one run calls a module
   or API once more): the construct tree (construct.json parent chain) is walked from the roots,
   and the children of each pair of matched parents are aligned in execution order: a shortest
   edit script (Myers' diff, like difflib's) on their count-free keys ``(type, api or module path,
   direction)``, then each gap re-aligned with its neighbourhood by the records' statistics.
   So ``Module.layer.Linear.forward.1`` matches ``...forward.0`` when the counts shift, and the
   extra call stays unmatched. Records outside the tree (parameters_grad) fall back to 1-2.

Records without a counterpart are returned (and listed in the CSV with N/A on the other side).
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Optional

from msprobe.compare._rows import as_float, norm_record_name

__all__ = ["match_records", "record_key"]

_DIRS = ("forward", "backward")


def record_key(name: str) -> tuple:
    """The count-free key of a record: ``(type, api or module path.Class, direction)``;
    a name without a call count (parameters_grad, debug) is its own key."""
    parts = name.split(".")
    if len(parts) >= 4:
        if parts[-2] in _DIRS and parts[-1].isdigit():  # Module.<path>.<Class>.forward.<n>
            return parts[0], ".".join(parts[1:-2]), parts[-2]
        if parts[-1] in _DIRS and parts[-2].isdigit():  # <Type>.<api>.<n>.forward
            return parts[0], ".".join(parts[1:-2]), parts[-1]
    return (name,)


def _counts_differ(data_n: dict, data_b: dict, par_n: dict, par_b: dict) -> bool:
    """Whether the records of the two construct trees hold a count-free key a different number of times."""
    return Counter(record_key(n) for n in data_n if n in par_n) != \
        Counter(record_key(n) for n in data_b if n in par_b)


def _children(data: dict, parents: dict) -> dict:
    kids: dict = {}
    for nm in data:
        if nm in parents:
            kids.setdefault(parents[nm], []).append(nm)
    return kids


def _signature(raw: Any, out: list) -> list:
    """The Norm (else Max) values of a record's tensors, in document order (at most 16)."""
    if len(out) >= 16:
        return out
    if isinstance(raw, dict):
        if "dtype" in raw and "shape" in raw:
            v = raw.get("Norm", raw.get("Max"))
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out.append(as_float(v))
        else:
            for v in raw.values():
                _signature(v, out)
    elif isinstance(raw, list):
        for v in raw:
            _signature(v, out)
    return out


def _similarity(x: list, y: list) -> float:
    """1 for records with equal statistics, towards 0 as they part."""
    if not x or not y or len(x) != len(y):
        return 0.0
    d = 0.0
    for a, b in zip(x, y):
        if a != b:
            d += min(abs(a - b) / (abs(b) + 1e-12), 1.0) if a == a and b == b else 1.0
    return 1.0 - d / len(x)


#: elements of the aligned neighbourhood re-aligned around each gap, and the most DP cells per window
WINDOW = 64
MAX_CELLS = 250_000


def _dp(a: list, b: list, ka: list, kb: list, sig_a: list, sig_b: list) -> list:
    """[(i, j)]: the alignment with the most key-equal pairs, then the most similar statistics,
    then the most equal names (Needleman-Wunsch without gap costs)."""
    n, m = len(a), len(b)
    score = [[0.0] * (m + 1) for _ in range(n + 1)]
    for i in range(1, n + 1):
        row, prev = score[i], score[i - 1]
        ki, si, ai = ka[i - 1], sig_a[i - 1], a[i - 1]
        for j in range(1, m + 1):
            best = prev[j] if prev[j] > row[j - 1] else row[j - 1]
            if ki == kb[j - 1]:
                w = prev[j - 1] + 1000.0 + _similarity(si, sig_b[j - 1]) + (0.001 if ai == b[j - 1] else 0.0)
                if w > best:
                    best = w
            row[j] = best
    out = []
    i, j = n, m
    while i > 0 and j > 0:
        if score[i][j] == score[i - 1][j]:
            i -= 1
        elif score[i][j] == score[i][j - 1]:
            j -= 1
        else:
            out.append((i - 1, j - 1))
            i, j = i - 1, j - 1
    out.reverse()
    return out


#: the most insertions plus deletions one sibling list may need (beyond: siblings pair by name)
MAX_EDITS = 1500


def _myers(a: list, b: list, max_d: int) -> Optional[list]:
    """[(i, j)] of a shortest edit script between ``a`` and ``b`` (Myers' O((N+M)D) diff),
    or None when more than ``max_d`` edits are needed."""
    n, m = len(a), len(b)
    v = {1: 0}
    trace = []
    for d in range(0, n + m + 1):
        if d > max_d:
            return None
        trace.append(dict(v))
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and v[k - 1] < v[k + 1]):
                x = v[k + 1]
            else:
                x = v[k - 1] + 1
            y = x - k
            while x < n and y < m and a[x] == b[y]:
                x += 1
                y += 1
            v[k] = x
            if x >= n and y >= m:
                return _backtrack(trace, n, m)
    return None  # pragma: no cover - the loop always ends at d <= n + m


def _backtrack(trace: list, n: int, m: int) -> list:
    x, y = n, m
    pairs = []
    for d in range(len(trace) - 1, -1, -1):
        v = trace[d]
        k = x - y
        if k == -d or (k != d and v.get(k - 1, -1) < v.get(k + 1, -1)):
            pk = k + 1
        else:
            pk = k - 1
        px = v.get(pk, 0)
        py = px - pk
        while x > px and y > py:
            pairs.append((x - 1, y - 1))
            x, y = x - 1, y - 1
        if d > 0:
            x, y = px, py
    pairs.reverse()
    return pairs


def _align(a: list, b: list, data_n: dict, data_b: dict) -> list:
    """[(i, j)] pairs of two sibling lists: a shortest edit script on the count-free keys (Myers),
    then each gap and its neighbourhood re-aligned by content, since a run of equal keys (a module
    called n or n+1 times) does not say by itself which call is the extra one."""
    ka, kb = [record_key(x) for x in a], [record_key(x) for x in b]
    if ka == kb:
        return [(i, i) for i in range(len(a))]
    pairs = _myers(ka, kb, MAX_EDITS)
    if pairs is None:  # too different to align: siblings pair by name
        where = {nm: j for j, nm in enumerate(b)}
        return [(i, where[nm]) for i, nm in enumerate(a) if nm in where]
    # gaps between consecutive pairs, as windows widened by WINDOW and merged where they overlap
    wins: list = []
    prev = (-1, -1)
    for i, j in pairs + [(len(a), len(b))]:
        if i - prev[0] > 1 or j - prev[1] > 1:
            w = [max(0, prev[0] + 1 - WINDOW), min(len(a), i + WINDOW),
                 max(0, prev[1] + 1 - WINDOW), min(len(b), j + WINDOW)]
            if wins and (w[0] <= wins[-1][1] or w[2] <= wins[-1][3]):
                last = wins[-1]
                wins[-1] = [min(last[0], w[0]), max(last[1], w[1]), min(last[2], w[2]), max(last[3], w[3])]
            else:
                wins.append(w)
        prev = (i, j)
    for i_lo, i_hi, j_lo, j_hi in wins:
        if (i_hi - i_lo) * (j_hi - j_lo) > MAX_CELLS:
            continue  # too large to refine: the edit script's alignment stands
        pairs = [(i, j) for i, j in pairs if not (i_lo <= i < i_hi or j_lo <= j < j_hi)]
        sa, sb = a[i_lo:i_hi], b[j_lo:j_hi]
        got = _dp(sa, sb, ka[i_lo:i_hi], kb[j_lo:j_hi], [_signature(data_n[x], []) for x in sa],
                  [_signature(data_b[x], []) for x in sb])
        pairs.extend((i_lo + i, j_lo + j) for i, j in got)
    pairs.sort()
    return pairs


def _structural(data_n: dict, data_b: dict, par_n: dict, par_b: dict) -> dict:
    """{target record: bench record} for the records of the construct trees, aligned level by level."""
    kids_n, kids_b = _children(data_n, par_n), _children(data_b, par_b)
    got: dict = {}
    # roots: no parent, and parents that are no record of the dump (a module whose own backward
    # was not dumped): those pair by name
    todo: list = [(None, None)] + [(p, p) for p in kids_n if p is not None and p not in data_n
                                   and p in kids_b and p not in data_b]
    while todo:
        pn, pb = todo.pop()
        a, b = kids_n.get(pn, ()), kids_b.get(pb, ())
        if not a or not b:
            continue
        for i, j in _align(a, b, data_n, data_b):
            x, y = a[i], b[j]
            got[x] = y
            if x in kids_n and y in kids_b:
                todo.append((x, y))
    return got


def _fuzzy(pairs: list, rest: list, how: dict) -> tuple:
    """The real tool's fuzzy match (``-f``): target records still unmatched pair, in order, with
    unmatched bench records of the same count-free key (the same API or module called a different
    number of times)."""
    free: dict = {}
    for nm in rest:
        free.setdefault(record_key(nm), []).append(nm)
    taken = set()
    out = []
    for nm, got in pairs:
        if got is None:
            cands = free.get(record_key(nm))
            if cands:
                got = cands.pop(0)
                taken.add(got)
                how["fuzzy"] = how.get("fuzzy", 0) + 1
        out.append((nm, got))
    return out, [nm for nm in rest if nm not in taken]


def match_records(data_n: dict, data_b: dict, par_n: Optional[dict] = None, par_b: Optional[dict] = None,
                  structural: Any = "auto", fuzzy: bool = False) -> tuple:
    """([(target name, bench name or None)] in target order, [bench-only names], {how: count}).

    ``structural``: "auto" aligns by the construct tree when both dumps have one and the count-free
    keys occur a different number of times on the two sides (else names are exact); True/False force it.
    ``fuzzy``: then pair what is left by count-free key, in order (see :func:`_fuzzy`)."""
    par_n, par_b = par_n or {}, par_b or {}
    use_tree = bool(par_n) and bool(par_b) and (structural is True or
                                                (structural == "auto" and _counts_differ(data_n, data_b, par_n, par_b)))
    tree = _structural(data_n, data_b, par_n, par_b) if use_tree else {}
    used: set = set(tree.values())
    by_norm: dict = {}
    for nm in data_b:
        if nm not in used:
            by_norm.setdefault(norm_record_name(nm), []).append(nm)
    pos = {k: 0 for k in by_norm}
    how = {"exact": 0, "dialect": 0, "structural": 0}
    pairs = []
    for nm in data_n:
        got = tree.get(nm)
        if got is not None:
            how["exact" if got == nm else "structural"] += 1
            pairs.append((nm, got))
            continue
        if use_tree and nm in par_n:
            # a record of the tree that the alignment left out: an extra call; names would mislead
            pairs.append((nm, None))
            continue
        if nm in data_b and nm not in used and (not use_tree or nm not in par_b):
            used.add(nm)
            how["exact"] += 1
            pairs.append((nm, nm))
            continue
        key = norm_record_name(nm)
        cands = by_norm.get(key)
        if cands:
            i = pos[key]
            while i < len(cands) and (cands[i] in used or (use_tree and cands[i] in par_b)):
                i += 1
            pos[key] = i
            if i < len(cands):
                got = cands[i]
                used.add(got)
                how["exact" if got == nm else "dialect"] += 1
        pairs.append((nm, got))
    rest = [nm for nm in data_b if nm not in used]
    if fuzzy:
        pairs, rest = _fuzzy(pairs, rest, how)
    return pairs, rest, how
