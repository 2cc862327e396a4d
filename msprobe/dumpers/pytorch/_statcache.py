"""The statistics already computed in a step, by the memory they describe (the PyTorch encoder's cache),
and a ``DTensor``'s full value."""
from __future__ import annotations

import weakref
from typing import Any

import torch

__all__ = ["StatCache", "dense_value"]


def dense_value(tensor: torch.Tensor) -> torch.Tensor:
    """A ``DTensor`` (FSDP2's sharded parameters, tensor parallelism) as its full value, gathered from its
    mesh: the statistics are the whole tensor's, as 26.2.0's reductions over it give (every rank reaches
    the same record, so the gather is a collective they all make); any other tensor as it is."""
    if type(tensor).__name__ == "DTensor" and hasattr(tensor, "full_tensor"):
        return tensor.full_tensor()
    return tensor



class StatCache:
    """Statistics already computed in this step, by the memory they describe.

    An API's output is usually the next API's input, and a reshape or a view of a
    tensor covers the same elements: such tensors reuse the pending statistics
    instead of reading the memory again. An entry holds only a weak reference to the
    storage's owner (the view base) and its version counter: once the owner dies or
    the memory is written in place, the entry no longer matches.
    """

    __slots__ = ("entries", "limit", "ordered", "gathered")

    def __init__(self, limit: int = 65536, ordered: bool = False):
        self.entries: dict = {}
        #: (id, version) of a DTensor -> (weak reference to it, its gathered full tensor), for the step
        self.gathered: dict = {}
        self.limit = limit
        self.ordered = ordered  # md5 mode: the checksum depends on the element order

    def memory_key(self, t: torch.Tensor) -> tuple:
        base = t._base
        if base is None:
            base = t
        if t.is_contiguous():
            # a 0-d tensor's statistics (Mean/Norm = its value) are not those of its [1]-shaped views
            layout: tuple = (t.numel(), t.dim() == 0)
        elif self.ordered:  # a transposed view holds the same elements in another order
            layout = (tuple(t.shape), tuple(t.stride()))
        else:
            layout = tuple(sorted(zip(t.shape, t.stride())))
        return (id(base), t.storage_offset(), layout, t.dtype, t.device), base

    def get(self, t: torch.Tensor) -> Any:
        return self.lookup(t, *self.memory_key(t))

    def lookup(self, t: torch.Tensor, key: tuple, base: torch.Tensor) -> Any:
        """The handle cached under ``key`` (from ``memory_key(t)``) while its memory is unchanged, else None."""
        e = self.entries.get(key)
        if e is not None and e[0]() is base and e[1] == t._version:
            return e[2]
        return None

    def put(self, t: torch.Tensor, handle: Any) -> None:
        key, base = self.memory_key(t)
        self.store(t, key, base, handle)

    def store(self, t: torch.Tensor, key: tuple, base: torch.Tensor, handle: Any) -> None:
        if len(self.entries) >= self.limit:
            self.entries.clear()
        try:
            self.entries[key] = (weakref.ref(base), t._version, handle)
        except TypeError:
            pass

    def dense(self, t: torch.Tensor) -> torch.Tensor:
        """``_dense(t)``, a ``DTensor``'s gather made once per step (and memory version): FSDP2's
        sharded parameters reach several records of a step (their statistics are cached by the
        memory they describe, but the gather itself was repeated for each record)."""
        if type(t).__name__ != "DTensor":
            return t
        key = (id(t), t._version)
        e = self.gathered.get(key)
        if e is not None and e[0]() is t:
            return e[1]
        full = dense_value(t)
        try:
            self.gathered[key] = (weakref.ref(t), full)
        except TypeError:
            pass
        return full

    def clear(self) -> None:
        self.entries.clear()
        self.gathered.clear()
