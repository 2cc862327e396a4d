"""Walking a call's values: a tuple output's entries, the first tensor, the tensors that need a
gradient (through tuples, lists and dicts, as 26.2.0's module hooks route them)."""
from __future__ import annotations

from typing import Any, Optional

import torch

__all__ = ["is_sequence", "first_tensor", "needs_grad", "grad_tensors"]


def is_sequence(out: Any) -> bool:
    """A tuple output is written one entry per element; anything else (a list, a dict, a namedtuple or
    dataclass, by field) is the one entry of the output (26.2.0's rule)."""
    return isinstance(out, tuple) and not isinstance(out, torch.Size) and not hasattr(type(out), "_fields")


def first_tensor(out: Any) -> Optional[torch.Tensor]:
    while not isinstance(out, torch.Tensor):
        if isinstance(out, (list, tuple)) and out:
            out = out[0]
        elif isinstance(out, dict) and out:
            out = next(iter(out.values()))
        else:
            return None
    return out


def needs_grad(values: Any) -> bool:
    return torch.is_grad_enabled() and any(isinstance(v, torch.Tensor) and v.requires_grad for v in values)


def _seq_type(v: Any) -> bool:
    return type(v) in (tuple, list) or (isinstance(v, tuple) and hasattr(v, "_fields"))


def _routed(v: Any, nested: bool) -> bool:
    """Whether the tap routes ``v``: at the top level (an API's arguments) every floating tensor; nested
    (a module's arguments and output) the tensors that need a gradient, as 26.2.0's module hooks."""
    return isinstance(v, torch.Tensor) and (v.requires_grad if nested else v.is_floating_point())


def _float_tensors(values: Any, out: list, nested: bool) -> None:
    for v in values:
        if _routed(v, nested):
            out.append(v)
        elif nested and _seq_type(v):
            _float_tensors(v, out, nested)
        elif nested and isinstance(v, dict):
            _float_tensors(list(v.values()), out, nested)


def grad_tensors(values: Any) -> list:
    """The tensors needing a gradient in ``values`` (through tuples, lists and dicts), when grad is on."""
    flat: list = []
    if torch.is_grad_enabled():
        _float_tensors(values, flat, True)
    return flat
