"""online_run_ut's branch of the PyTorch dumper: an API call's inputs and outputs sent to the
checker as one packet instead of recorded, and its backward (the gradients of the call's own
inputs, observed on its autograd nodes, and of its output) as another."""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import torch

from msprobe.dumpers.pytorch._apis import GUARD
from msprobe.dumpers.pytorch._edges import InputEdges, sequence_mark
from msprobe.dumpers.pytorch._observer import observe
from msprobe.dumpers.pytorch._values import first_tensor, needs_grad

if TYPE_CHECKING:
    from msprobe.dumpers.pytorch._online import OnlineRunUt

__all__ = ["online_api", "online_backward"]


def online_api(dumper: Any, online: OnlineRunUt, orig: Any, api_key: str, args: tuple, kwargs: dict) -> Any:
    """online_run_ut: the call's inputs and outputs go to the checker as one packet."""
    core = dumper.core
    GUARD.inside = True
    try:
        base, _ = core.next_api_name(api_key)
        fwd = base + ".forward"
        if api_key.startswith("Distributed.") or not core.wanted(fwd) or not online.admit():
            return orig(*args, **kwargs)  # collectives are not replayable; a shed packet costs no copy
        encoder = online.encoder
        try:
            rec = {"input_args": [encoder.encode(arg, f"{fwd}.input.{i}", True) for i, arg in enumerate(args)],
                   "input_kwargs": {key: encoder.encode(value, f"{fwd}.input.{key}", True)
                                    for key, value in kwargs.items()}}
        except Exception:  # noqa: BLE001 - never break training for the dump
            online.discard()
            return orig(*args, **kwargs)
        # the backward: gradients of this call's own inputs, in argument order (observed on the call's
        # own autograd nodes, spec/PRODUCER.md §20 item 43) and of its output; not with recompute (the
        # docs), not in place
        tap = (not online.settings.recompute and dumper.backward_wanted() and api_key not in dumper.mutating
               and needs_grad(args))
        grads_state: dict = {"gout": None}
        mark = sequence_mark() if tap else None
        tap = mark is not None
        GUARD.inside = True  # calls made inside the API are not recorded
        out = orig(*args, **kwargs)
        try:
            rec["output"] = dumper.encode_output(out, f"{fwd}.output", True, encoder)
            first = first_tensor(out)
            backward = tap and first is not None and first.requires_grad and first.grad_fn is not None
            online.submit(fwd, rec, core.current_step(), expects_backward=backward)
        except Exception:  # noqa: BLE001 - never break training for the dump
            online.discard()
            return out
        if backward and first is not None and mark is not None:  # (backward implies a tensor)
            _observe_online(first, args, mark, _online_grads_callback(dumper, base + ".backward", args, grads_state),
                            grads_state)
        return out
    finally:
        GUARD.inside = False


def _observe_online(first: torch.Tensor, args: tuple, mark: int, got: Any, state: dict) -> None:
    """Hand ``got`` the gradients of the call's floating arguments (None where none is needed), after
    ``state["gout"]`` holds its output's."""
    floats = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
    needs = [a.requires_grad for a in floats]
    edges = InputEdges([a for a in floats if a.requires_grad], mark)

    def done(grad_output: tuple, grad_input: tuple) -> None:
        state["gout"] = grad_output
        it = iter(grad_input)
        got(tuple(next(it) if need else None for need in needs))

    GUARD.inside = True
    try:
        observe([first], edges, sum(needs), lambda: None, done)
    except Exception:  # noqa: BLE001 - inference tensors and the like: no backward check, training goes on
        pass


def _online_grads_callback(dumper: Any, bwd: str, args: tuple, state: dict) -> Any:
    """The tap's callback: it receives the input gradients after the output's hook put the
    output's gradient in ``state``."""
    positions = [i for i, arg in enumerate(args) if isinstance(arg, torch.Tensor) and arg.is_floating_point()]
    dumper_ref = weakref.ref(dumper)
    count = len(args)

    def got(grads):
        alive = dumper_ref()
        if alive is None or alive.online is None or not alive.core.is_on() \
                or not alive.core.wanted(bwd, True, False):
            return
        full = [None] * count
        for position, grad in zip(positions, grads):
            full[position] = grad
        online_backward(alive, bwd, state["gout"] or (), full)

    return got


def online_backward(dumper: Any, bwd: str, grads_in: Any, grads_out: Any) -> None:
    """online_run_ut: a backward packet (gradients of the outputs, of the inputs)."""
    online = dumper.online
    if online is None or not online.admit():  # (the callback runs only while online is set)
        return
    GUARD.inside = True
    try:
        encoder = online.encoder
        rec = {"input": [encoder.encode(grad, f"{bwd}.input.{i}", True) for i, grad in enumerate(grads_in)],
               "output": [encoder.encode(grad, f"{bwd}.output.{i}", True) for i, grad in enumerate(grads_out)]}
        online.submit(bwd, rec, dumper.core.current_step())
    except Exception:  # noqa: BLE001 - never break training for the dump
        online.discard()
    finally:
        GUARD.inside = False
