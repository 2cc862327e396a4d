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
from msprobe.format.stats import MAX, NORM

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


def _counts_differ(target_data: dict, bench_data: dict, target_parents: dict, bench_parents: dict) -> bool:
    """Whether the records of the two construct trees hold a count-free key a different number of times."""
    return Counter(record_key(name) for name in target_data if name in target_parents) != \
        Counter(record_key(name) for name in bench_data if name in bench_parents)


def _children(data: dict, parents: dict) -> dict:
    children: dict = {}
    for name in data:
        if name in parents:
            children.setdefault(parents[name], []).append(name)
    return children


def _signature(raw: Any, out: list) -> list:
    """The Norm (else Max) values of a record's tensors, in document order (at most 16)."""
    if len(out) >= 16:
        return out
    if isinstance(raw, dict):
        if "dtype" in raw and "shape" in raw:
            value = raw.get(NORM.key, raw.get(MAX.key))
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out.append(as_float(value))
        else:
            for value in raw.values():
                _signature(value, out)
    elif isinstance(raw, list):
        for value in raw:
            _signature(value, out)
    return out


def _similarity(target: list, bench: list) -> float:
    """1 for records with equal statistics, towards 0 as they part."""
    if not target or not bench or len(target) != len(bench):
        return 0.0
    distance = 0.0
    for left, right in zip(target, bench):
        if left != right:
            distance += (min(abs(left - right) / (abs(right) + 1e-12), 1.0) if left == left and right == right
                         else 1.0)
    return 1.0 - distance / len(target)


#: elements of the aligned neighbourhood re-aligned around each gap, and the most DP cells per window
WINDOW = 64
MAX_CELLS = 250_000


def _dp(target: list, bench: list, target_keys: list, bench_keys: list, target_signatures: list,
        bench_signatures: list) -> list:
    """[(i, j)]: the alignment with the most key-equal pairs, then the most similar statistics,
    then the most equal names (Needleman-Wunsch without gap costs)."""
    rows, columns = len(target), len(bench)
    score = [[0.0] * (columns + 1) for _ in range(rows + 1)]
    for i in range(1, rows + 1):
        row, previous = score[i], score[i - 1]
        key, signature, name = target_keys[i - 1], target_signatures[i - 1], target[i - 1]
        for j in range(1, columns + 1):
            best = previous[j] if previous[j] > row[j - 1] else row[j - 1]
            if key == bench_keys[j - 1]:
                weight = (previous[j - 1] + 1000.0 + _similarity(signature, bench_signatures[j - 1])
                          + (0.001 if name == bench[j - 1] else 0.0))
                if weight > best:
                    best = weight
            row[j] = best
    out = []
    i, j = rows, columns
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


def _myers(target: list, bench: list, max_edits: int) -> Optional[list]:
    """[(i, j)] of a shortest edit script between ``target`` and ``bench`` (Myers' O((N+M)D) diff),
    or None when more than ``max_edits`` edits are needed."""
    target_count, bench_count = len(target), len(bench)
    furthest = {1: 0}  # diagonal -> the furthest target position reached on it
    trace = []
    for edits in range(0, target_count + bench_count + 1):
        if edits > max_edits:
            return None
        trace.append(dict(furthest))
        for diagonal in range(-edits, edits + 1, 2):
            if diagonal == -edits or (diagonal != edits and furthest[diagonal - 1] < furthest[diagonal + 1]):
                position = furthest[diagonal + 1]
            else:
                position = furthest[diagonal - 1] + 1
            other = position - diagonal
            while position < target_count and other < bench_count and target[position] == bench[other]:
                position += 1
                other += 1
            furthest[diagonal] = position
            if position >= target_count and other >= bench_count:
                return _backtrack(trace, target_count, bench_count)
    return None  # pragma: no cover - the loop always ends at edits <= target_count + bench_count


def _backtrack(trace: list, target_count: int, bench_count: int) -> list:
    position, other = target_count, bench_count
    pairs = []
    for edits in range(len(trace) - 1, -1, -1):
        furthest = trace[edits]
        diagonal = position - other
        if diagonal == -edits or (diagonal != edits
                                  and furthest.get(diagonal - 1, -1) < furthest.get(diagonal + 1, -1)):
            previous_diagonal = diagonal + 1
        else:
            previous_diagonal = diagonal - 1
        previous_position = furthest.get(previous_diagonal, 0)
        previous_other = previous_position - previous_diagonal
        while position > previous_position and other > previous_other:
            pairs.append((position - 1, other - 1))
            position, other = position - 1, other - 1
        if edits > 0:
            position, other = previous_position, previous_other
    pairs.reverse()
    return pairs


def _gap_windows(pairs: list, target_count: int, bench_count: int) -> list:
    """The gaps between consecutive pairs, as windows widened by WINDOW and merged where they overlap."""
    windows: list = []
    previous = (-1, -1)
    for i, j in pairs + [(target_count, bench_count)]:
        if i - previous[0] > 1 or j - previous[1] > 1:
            window = [max(0, previous[0] + 1 - WINDOW), min(target_count, i + WINDOW),
                      max(0, previous[1] + 1 - WINDOW), min(bench_count, j + WINDOW)]
            if windows and (window[0] <= windows[-1][1] or window[2] <= windows[-1][3]):
                last = windows[-1]
                windows[-1] = [min(last[0], window[0]), max(last[1], window[1]), min(last[2], window[2]),
                               max(last[3], window[3])]
            else:
                windows.append(window)
        previous = (i, j)
    return windows


def _align(target: list, bench: list, target_data: dict, bench_data: dict) -> list:
    """[(i, j)] pairs of two sibling lists: a shortest edit script on the count-free keys (Myers),
    then each gap and its neighbourhood re-aligned by content, since a run of equal keys (a module
    called n or n+1 times) does not say by itself which call is the extra one."""
    target_keys, bench_keys = [record_key(name) for name in target], [record_key(name) for name in bench]
    if target_keys == bench_keys:
        return [(i, i) for i in range(len(target))]
    pairs = _myers(target_keys, bench_keys, MAX_EDITS)
    if pairs is None:  # too different to align: siblings pair by name
        where = {name: j for j, name in enumerate(bench)}
        return [(i, where[name]) for i, name in enumerate(target) if name in where]
    for target_start, target_stop, bench_start, bench_stop in _gap_windows(pairs, len(target), len(bench)):
        if (target_stop - target_start) * (bench_stop - bench_start) > MAX_CELLS:
            continue  # too large to refine: the edit script's alignment stands
        pairs = [(i, j) for i, j in pairs
                 if not (target_start <= i < target_stop or bench_start <= j < bench_stop)]
        target_part, bench_part = target[target_start:target_stop], bench[bench_start:bench_stop]
        got = _dp(target_part, bench_part, target_keys[target_start:target_stop],
                  bench_keys[bench_start:bench_stop], [_signature(target_data[name], []) for name in target_part],
                  [_signature(bench_data[name], []) for name in bench_part])
        pairs.extend((target_start + i, bench_start + j) for i, j in got)
    pairs.sort()
    return pairs


def _structural(target_data: dict, bench_data: dict, target_parents: dict, bench_parents: dict) -> dict:
    """{target record: bench record} for the records of the construct trees, aligned level by level."""
    target_children, bench_children = _children(target_data, target_parents), _children(bench_data, bench_parents)
    got: dict = {}
    # roots: no parent, and parents that are no record of the dump (a module whose own backward
    # was not dumped): those pair by name
    todo: list = [(None, None)] + [(parent, parent) for parent in target_children
                                   if parent is not None and parent not in target_data
                                   and parent in bench_children and parent not in bench_data]
    while todo:
        target_parent, bench_parent = todo.pop()
        target, bench = target_children.get(target_parent, ()), bench_children.get(bench_parent, ())
        if not target or not bench:
            continue
        for i, j in _align(target, bench, target_data, bench_data):
            target_name, bench_name = target[i], bench[j]
            got[target_name] = bench_name
            if target_name in target_children and bench_name in bench_children:
                todo.append((target_name, bench_name))
    return got


def _fuzzy(pairs: list, rest: list, how: dict) -> tuple:
    """The real tool's fuzzy match (``-f``): target records still unmatched pair, in order, with
    unmatched bench records of the same count-free key (the same API or module called a different
    number of times)."""
    free: dict = {}
    for name in rest:
        free.setdefault(record_key(name), []).append(name)
    taken = set()
    out = []
    for name, got in pairs:
        if got is None:
            candidates = free.get(record_key(name))
            if candidates:
                got = candidates.pop(0)
                taken.add(got)
                how["fuzzy"] = how.get("fuzzy", 0) + 1
        out.append((name, got))
    return out, [name for name in rest if name not in taken]


def _by_dialect(bench_data: dict, used: set) -> dict:
    """{dialect-free name: [bench records]} of the bench records not yet matched."""
    by_norm: dict = {}
    for name in bench_data:
        if name not in used:
            by_norm.setdefault(norm_record_name(name), []).append(name)
    return by_norm


def match_records(target_data: dict, bench_data: dict, target_parents: Optional[dict] = None,
                  bench_parents: Optional[dict] = None, structural: Any = "auto", fuzzy: bool = False) -> tuple:
    """([(target name, bench name or None)] in target order, [bench-only names], {how: count}).

    ``structural``: "auto" aligns by the construct tree when both dumps have one and the count-free
    keys occur a different number of times on the two sides (else names are exact); True/False force it.
    ``fuzzy``: then pair what is left by count-free key, in order (see :func:`_fuzzy`)."""
    target_parents, bench_parents = target_parents or {}, bench_parents or {}
    use_tree = bool(target_parents) and bool(bench_parents) and (
        structural is True
        or (structural == "auto" and _counts_differ(target_data, bench_data, target_parents, bench_parents)))
    if not use_tree:
        names = list(target_data)
        if names == list(bench_data):  # the same records in the same order (the common case): each its own match
            pairs = [(name, name) for name in names]
            how = {"exact": len(pairs), "dialect": 0, "structural": 0}
            return pairs, [], how  # nothing is left for the fuzzy match
    tree = _structural(target_data, bench_data, target_parents, bench_parents) if use_tree else {}
    used: set = set(tree.values())
    # the bench's dialect-free names, made at the first target name without an exact match (none
    # where every name matches): the names matched before then are left out, as they would be skipped
    by_norm: Optional[dict] = None
    next_candidate: dict = {}
    how = {"exact": 0, "dialect": 0, "structural": 0}
    pairs = []
    for name in target_data:
        got = tree.get(name)
        if got is not None:
            how["exact" if got == name else "structural"] += 1
            pairs.append((name, got))
            continue
        if use_tree and name in target_parents:
            # a record of the tree that the alignment left out: an extra call; names would mislead
            pairs.append((name, None))
            continue
        if name in bench_data and name not in used and (not use_tree or name not in bench_parents):
            used.add(name)
            how["exact"] += 1
            pairs.append((name, name))
            continue
        key = norm_record_name(name)
        if by_norm is None:
            by_norm = _by_dialect(bench_data, used)
            next_candidate = dict.fromkeys(by_norm, 0)
        candidates = by_norm.get(key)
        if candidates:
            position = next_candidate[key]
            while position < len(candidates) and (candidates[position] in used
                                                  or (use_tree and candidates[position] in bench_parents)):
                position += 1
            next_candidate[key] = position
            if position < len(candidates):
                got = candidates[position]
                used.add(got)
                how["exact" if got == name else "dialect"] += 1
        pairs.append((name, got))
    rest = [name for name in bench_data if name not in used]
    if fuzzy:
        pairs, rest = _fuzzy(pairs, rest, how)
    return pairs, rest, how
