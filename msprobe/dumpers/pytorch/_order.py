"""The order in which the observed module calls' backward records are written: where 26.2.0's identity
node on a call's inputs would have run (before the first event of an older node, or at the end of the
backward pass, newest first), and the order of the leaves' gradient accumulations."""
from __future__ import annotations

import weakref
from typing import Any, Callable, Optional

import torch

from msprobe.dumpers.pytorch._watches import WATCHES

__all__ = ["COMPLETED", "Completed", "ENDS", "RELEASED", "before_accumulation", "before_event", "end_of_backward",
           "leaf_accumulates", "release_order"]

class Completed:
    """Module calls whose gradients are all in, not yet written: each is written where 26.2.0's identity
    node on its inputs would have run, i.e. before the first observed event of a node older than the call
    (its sequence number below the call's mark; the engine runs the newer ready node first), or at the end
    of the backward pass, newest first. Gradient accumulation (sequence number max) comes before."""

    def __init__(self) -> None:
        self.calls: list = []
        self.open: list = []  # begun, not all gradients in
        self.held: list = []  # written with their place held, an output's gradient still to come

    def add(self, call: Any) -> None:
        self.calls.append(call)

    def flush_before(self, seq: Optional[int], begun_after: Optional[int] = None) -> None:
        """Write the completed calls newer than the node ``seq`` (all: None), or those begun after the
        start count ``begun_after``."""
        if not self.calls:
            return

        def due(c: Any) -> bool:
            return c.order > begun_after if begun_after is not None else seq is None or c.mark > seq

        self._flush(due)

    def flush_from(self, call: Any) -> None:
        """Write ``call`` and the completed calls newer than it (begun later with the same mark)."""
        self._flush(lambda c: (c.mark, c.order) >= (call.mark, call.order))

    def _flush(self, due: Callable[[Any], bool]) -> None:
        calls = [c for c in self.calls if due(c)]
        if not calls:
            return
        self.calls = [c for c in self.calls if not due(c)]
        for call in sorted(calls, key=lambda c: (-c.mark, -c.order)):
            call.emit()

    def flush_all(self) -> None:
        for call in self.open:
            call.finish()
        self.open = []
        self.flush_before(None)
        held, self.held = self.held, []
        for call in held:
            call.release()

    def older_event(self, seq: int, begun_after: Optional[int] = None) -> None:
        """A node older than a begun call runs: a call that waits on no node of its own is over.
        ``begun_after``: the event is the identity node 26.2.0 makes at the end of a forward, whose
        start count this is: only the calls begun after it are written first (not those inside it)."""
        if self.open:
            for call in [c for c in self.open if c.finish_on_older and c.mark > seq]:
                call.finish()
        if self.calls:
            self.flush_before(seq, begun_after)


COMPLETED = Completed()


#: module -> the start count at the end of its last forward (weakly: a module may go)
ENDS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def before_accumulation(module: Any) -> None:
    """A parameter of ``module`` gets its gradient: the node that sent it is the module's, older than
    the calls begun after the module's forward ended, whose completed records come first."""
    end = ENDS.get(module) if COMPLETED.calls else None
    if end is not None:
        COMPLETED.flush_before(None, end)


def before_event(seq: Optional[int]) -> None:
    """A hook of the dumper is about to record something for the node ``seq``: write first the module
    calls completed before it in the engine's order."""
    if seq is not None:
        COMPLETED.older_event(seq)


#: id of a leaf -> (the call whose identity node in 26.2.0 hands it its gradient, its input index there)
RELEASED: dict = {}


def leaf_accumulates(leaf: torch.Tensor) -> None:
    """The gradient of ``leaf`` (a parameter) is accumulated now. When it is an input of a completed module
    call (``_WeightNorm`` gets a parametrization's ``original0`` and ``original1``), 26.2.0's identity node
    on that call's inputs sits between the call's nodes and the leaf's accumulation, and ran before it:
    the call's record (and those of the newer completed calls, which the engine runs first) is written
    now, and the leaves it hands gradients to are accumulated in its input order (:func:`release_order`)."""
    calls = [c for c in COMPLETED.calls if id(leaf) in c.leaves]
    if not calls:
        return
    COMPLETED.flush_from(min(calls, key=lambda c: (c.mark, c.order)))
    for call in calls:
        for key, index in call.leaves.items():
            RELEASED.setdefault(key, (call, index))


def release_order(names: list, leaf_ids: dict) -> list:
    """``names`` (parameter names, in the order their gradients were accumulated here) in the order 26.2.0
    accumulates them: the leaves one identity node hands gradients to come together, where the first of
    them came, in that node's input order (``leaf_ids``: name -> id of the parameter)."""
    first: dict = {}
    keys = []
    for position, name in enumerate(names):
        group = RELEASED.get(leaf_ids.get(name))
        if group is None:
            keys.append((position, 0))
        else:
            keys.append((first.setdefault(id(group[0]), position), group[1]))
    return [name for _, name in sorted(zip(keys, names))]


def end_of_backward() -> None:
    COMPLETED.flush_all()
    WATCHES.clear()
    RELEASED.clear()
