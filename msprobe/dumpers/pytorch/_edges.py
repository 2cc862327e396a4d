"""The autograd graph as the observer reads it (spec/PRODUCER.md §20 item 43): sequence numbers, the
graph edges into a tensor, a module call's input edges taken before its forward."""
from __future__ import annotations

import itertools
from typing import Any, Optional

import torch

__all__ = ["InputEdges", "STARTS", "edge", "node_edge", "node_seq", "sequence_mark"]

_seq_nr = getattr(torch._C._autograd, "_get_sequence_nr", None)


def sequence_mark() -> Optional[int]:
    """The autograd sequence number the next node created in this thread gets (None: not known)."""
    return _seq_nr() if _seq_nr is not None else None


def edge(t: torch.Tensor) -> tuple:
    """What the graph's edges into ``t`` look like: its node and output number, or the leaf itself."""
    return ("leaf", id(t)) if t.grad_fn is None else (id(t.grad_fn), t.output_nr)


def node_edge(node: Any, nr: int) -> tuple:
    """The key of :func:`edge` for the graph edge (node, output number)."""
    variable = getattr(node, "variable", None)
    return ("leaf", id(variable)) if variable is not None else (id(node), nr)


#: module forwards begun, counted: a later one is newer when two calls have the same mark
STARTS = itertools.count()


class InputEdges:
    """A module call's input tensors that need a gradient, as graph edges, taken before its forward
    (an in-place op inside the module changes the tensor's node, not the edge its gradient reaches)."""

    __slots__ = ("mark", "order", "keys", "nodes", "apis")

    def __init__(self, tensors: list, mark: int) -> None:
        self.mark = mark
        self.order = next(STARTS)  # (calls that created no node between them share a mark)
        self.apis: list = []  # API calls inside the forward that returned one of these inputs unchanged
        self.keys: dict = {}
        self.nodes: list = []  # kept until the forward ends, so that the ids stay theirs
        for index, t in enumerate(tensors):
            self.keys.setdefault(edge(t), index)
            self.nodes.append(t if t.grad_fn is None else t.grad_fn)

    def holds(self, t: torch.Tensor) -> bool:
        return edge(t) in self.keys

    def index_of(self, node: Any, nr: int) -> Optional[int]:
        return self.keys.get(node_edge(node, nr))


def node_seq(node: Any) -> Optional[int]:
    """A node's sequence number (None for a leaf's, whose gradient accumulation runs first)."""
    if node is None or hasattr(node, "variable"):
        return None
    try:
        return node._sequence_nr()  # noqa: SLF001 - torch's Node API
    except Exception:  # noqa: BLE001
        return None
