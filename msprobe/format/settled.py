"""Where a record's content was settled, when it is not where the record sits.

A module's ``parameters_grad`` record takes its place in ``dump.json`` where the module's last
parameter first gets its gradient in the step, and keeps that place when the gradient is
accumulated again (ours; 26.2.0 under gradient accumulation alike: spec/PRODUCER.md), but its
statistics are those of the gradient once the step's last accumulation is done. A module run
backward over several micro-batches (pipeline parallel: every micro-batch's forward, then every
backward) thus shows, at micro-batch 0's place, what micro-batch 1 wrote into the gradient: a
NaN born in micro-batch 1's backward would seem to come before the record that made it.

:func:`settled_positions` gives such a record the place where its content was settled: just after
the module's last backward record of the step. The questions that walk a rank's records in
execution order (compare's first NaN/Inf and origin, ``lake nan``, ``overflow_check``) take it
there. Records whose module ran backward once, or that have one ``parameters_grad`` record per
backward (26.2.0's ``.parameters_grad.<n>`` written as each gradient arrives), keep their place.
"""
from __future__ import annotations

import re
from typing import Iterable

__all__ = ["settled_positions", "settled_order"]

_PGRAD = re.compile(r"^(?P<module>(?:Module|Cell)\..+)\.parameters_grad(?:\.\d+)?$")
_BACKWARD = re.compile(r"^(?P<module>(?:Module|Cell)\..+)\.backward\.\d+$")


def settled_positions(names: Iterable[str]) -> dict:
    """{record index: position} of the records of one rank's step (``names`` in order) whose
    content postdates their place: a module's last ``parameters_grad`` record when the module has
    more backward records than ``parameters_grad`` records in the step and its last backward
    record comes after it; its position is that backward record's index + 0.5. Other records are
    absent (their position is their index)."""
    names = names if isinstance(names, list) else list(names)
    try:
        if ".parameters_grad" not in "\n".join(names):
            return {}  # no parameters_grad record: none moves (the common case, seen in one pass)
    except TypeError:  # a name that is no str: the walk below decides
        pass
    pgrads: dict = {}     # module -> indexes of its parameters_grad records
    backwards: dict = {}  # module -> indexes of its backward records
    for index, name in enumerate(names):
        if not name.startswith(("Module.", "Cell.")) or (".backward." not in name and ".parameters_grad" not in name):
            continue  # neither pattern can match (each needs one of the two texts)
        found = _PGRAD.match(name)
        if found is not None:
            pgrads.setdefault(found["module"], []).append(index)
            continue
        found = _BACKWARD.match(name)
        if found is not None:
            backwards.setdefault(found["module"], []).append(index)
    out: dict = {}
    for module, indexes in pgrads.items():
        done = backwards.get(module, [])
        if len(done) > len(indexes) and done[-1] > indexes[-1]:
            out[indexes[-1]] = done[-1] + 0.5
    return out


def settled_order(names: list) -> list:
    """The record indexes of ``names`` in the order their content was settled
    (:func:`settled_positions`): ``list(range(len(names)))`` when no record moves."""
    moved = settled_positions(names)
    if not moved:
        return list(range(len(names)))
    return sorted(range(len(names)), key=lambda index: moved.get(index, index))
