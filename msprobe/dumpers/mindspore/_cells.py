"""One Cell's hooks in PyNative (L0/mix): its forward records, and its backward observed on MindSpore's
autograd graph (_observer.py), or, on a MindSpore that shows no graph to Python, through MindSpore's
Cell backward pre/post hooks."""
from __future__ import annotations

from typing import Any

from mindspore import nn

from msprobe.dumpers.control import ModuleForwardHooks
from msprobe.dumpers.mindspore._apis import GUARD

__all__ = ["EXECUTOR", "CellHooks", "grad_recording"]

try:
    from mindspore.common.api import _pynative_executor as EXECUTOR
except ImportError:  # pragma: no cover - other MindSpore layouts
    EXECUTOR = None


def grad_recording() -> bool:
    """True while MindSpore records the forward pass of a gradient computation."""
    if EXECUTOR is None:
        return True
    try:
        return bool(EXECUTOR.requires_grad())
    except Exception:  # noqa: BLE001 - MindSpore may raise anything here: never break training for the dump
        return True


class CellHooks(ModuleForwardHooks):
    """One Cell's hooks (L0/mix in PyNative): forward pre/post (its records) and, with the backward
    dumped, the observer of each call's backward (_observer.py: tensor hooks on its outputs, post hooks
    on its own nodes; its record after its parameters_grad). A MindSpore without the autograd graph in
    Python gets MindSpore's Cell backward pre/post hooks instead (identity nodes: start() warns)."""

    def __init__(self, dumper: Any, cell: nn.Cell, key: str) -> None:
        super().__init__(dumper, key)  # calls: forward calls in flight, (fwd, rec, parent, stack) or None
        self.inputs: list = []  # per forward call in flight: its observed inputs (None: not observed)
        self.done: list = []  # (MindSpore's hooks) finished forward indexes, popped by the backward pass (LIFO)
        self.running: list = []  # (MindSpore's hooks) backward calls in flight: (backward name, recorded)
        handles = dumper.cell_handles
        handles.append(cell.register_forward_pre_hook(self.pre, with_kwargs=True))
        handles.append(cell.register_forward_hook(self.post, with_kwargs=True))
        self.observer = dumper.observer if dumper.config.backward_enabled else None
        if dumper.config.backward_enabled and self.observer is None:
            handles.append(cell.register_backward_pre_hook(self.backward_pre))
            handles.append(cell.register_backward_hook(self.backward_post))

    def pre(self, module, args, kwargs):
        super().pre(module, args, kwargs)
        if self.observer is not None:
            observe = self.calls[-1] is not None and grad_recording()
            self.inputs.append(self.observer.inputs(args, kwargs or {}) if observe else None)
        return None

    def post(self, cell, args, kwargs, output):
        dumper = self.dumper()
        item = self.calls.pop() if self.calls else None
        inputs = self.inputs.pop() if self.inputs else None
        if item is not None and dumper is not None:
            if self.observer is None and grad_recording():
                self.done.append((int(item[0].rsplit(".", 1)[1]), dumper.core.generation()))
            dumper.core.module_forward_end(item, cell, self.key, output)
            if inputs is not None:
                self._observe(dumper, item[0], inputs, output)
        return None

    def _observe(self, dumper: Any, fwd: str, inputs: Any, output: Any) -> None:
        """Hook the backward of the call ``fwd`` (spec/PRODUCER.md §20 item 43: observed, not rerouted)."""
        dumper_ref = self.dumper
        bwd = fwd.replace(".forward.", ".backward.")
        generation = dumper.core.generation()
        key = self.key

        def begin():
            alive = dumper_ref()
            if alive is not None and alive.core.live(generation):
                alive.core.begin_backward(bwd)

        def leave():
            alive = dumper_ref()
            if alive is not None:
                alive.core.end_backward(bwd, anywhere=True)

        def done(grad_output, grad_input):
            alive = dumper_ref()
            if alive is None or not alive.core.live(generation):
                return
            alive.flush_param_grads(key + ".parameters_grad")
            alive.core.module_backward(bwd, fwd, grad_output, grad_input, live=True)

        observer = self.observer
        if observer is None:
            return
        GUARD.inside = True
        try:
            observer.observe(inputs, output, begin, leave, done)
        except Exception:  # noqa: BLE001 - never break training for the dump
            pass
        finally:
            GUARD.inside = False

    def backward_pre(self, cell, grad_output):
        dumper = self.dumper()
        if dumper is None:
            return None
        core = dumper.core
        index, generation = self.done.pop() if self.done else (0, -1)
        live = core.live(generation)  # the forward ran while this step was dumped (also before a stop())
        bwd = f"{self.key}.backward.{index}"
        self.running.append((bwd, live))
        if live:
            core.begin_backward(bwd)
        return None

    def backward_post(self, cell, grad_input, grad_output):
        dumper = self.dumper()
        if dumper is None:
            return None
        core = dumper.core
        if self.running:
            bwd, live = self.running.pop()
        else:  # no pre hook ran for it
            index, generation = self.done.pop() if self.done else (0, -1)
            bwd, live = f"{self.key}.backward.{index}", core.live(generation)
        if not live:
            return None
        core.end_backward(bwd)
        dumper.flush_param_grads(self.key + ".parameters_grad")
        core.module_backward(bwd, bwd.replace(".backward.", ".forward."), grad_output, grad_input, live=True)
        return None
