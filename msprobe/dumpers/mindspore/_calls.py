"""The MindSpore calls recorded outside the API wrappers: the Primitives held by the model's Cells
(``Primitive.<attribute>.<Class>.<n>``: the instance's class swapped for a subclass whose ``__call__``
records) and ``mindspore.jit`` functions and Cells (``Jit.<name>.<n>``: its executor patched; the
bytecode-capture context made a no-op at L1/mix); their gradients arrive through
``ops.HookBackward`` on the inputs and outputs, in arrival order, as the real tool records them."""
from __future__ import annotations

import weakref
from typing import Any, Optional

import mindspore
from mindspore import Tensor, nn, ops
from mindspore.ops import Primitive

from msprobe.dumpers.adapter import ApiCall, ApiCaller
from msprobe.dumpers.control import DumperCore
from msprobe.dumpers.mindspore import _observer
from msprobe.dumpers.mindspore._apis import GUARD, PIJIT_CONTEXT, import_first

__all__ = ["HookedCalls", "JitPatches", "floating", "has_tensor"]


def has_tensor(values) -> bool:
    return any(isinstance(v, Tensor) for v in values)


def floating(t: Tensor) -> bool:
    return t.dtype in (mindspore.float16, mindspore.float32, mindspore.float64, mindspore.bfloat16)


class HookedCalls(ApiCaller):
    """The calls recorded outside the API wrappers: the Primitives held by the model's Cells
    (``Primitive.<attribute>.<Class>.<n>``) and ``mindspore.jit`` functions and Cells
    (``Jit.<name>.<n>``); their gradients arrive through ``ops.HookBackward``."""

    def __init__(self, dumper: Any) -> None:
        self.dumper = weakref.ref(dumper)
        self.primitives: list = []  # (primitive, original class)

    @property  # (the dumper's, read through a weak reference)
    def core(self) -> DumperCore:
        dumper = self.dumper()
        assert dumper is not None  # (record() runs only while the dumper lives)
        return dumper.core

    def hook_primitives(self, model) -> None:
        seen = {id(prim) for prim, _ in self.primitives}
        for _, cell in model.cells_and_names():
            for attr, value in list(vars(cell).items()):
                if not isinstance(value, Primitive) or id(value) in seen:
                    continue
                seen.add(id(value))
                self._wrap_primitive(value, f"Primitive.{attr}.{type(value).__name__}")

    def _wrap_primitive(self, prim: Primitive, api_key: str) -> None:
        cls = type(prim)
        owner = weakref.ref(self)
        orig_call = cls.__call__

        def __call__(primitive, *args, **kwargs):
            calls = owner()
            dumper = calls.dumper() if calls is not None else None
            if dumper is None or not dumper.core.is_on() or getattr(GUARD, "inside", False) \
                    or not GUARD.__dict__.get("on", True):
                return orig_call(primitive, *args, **kwargs)
            return calls.record(lambda *a, **k: orig_call(primitive, *a, **k), api_key, args, kwargs)

        sub = type(cls.__name__, (cls,), {"__call__": __call__, "__msprobe_wrapped__": True,
                                           "__module__": cls.__module__})
        prim.__class__ = sub
        self.primitives.append((prim, cls))

    def unwrap_primitives(self) -> None:
        for prim, cls in self.primitives:
            prim.__class__ = cls
        self.primitives = []

    def record(self, call, api_key: str, args: tuple, kwargs: dict, head: tuple = ()):
        """A Primitive or jit call: forward record around ``call(*head, *args, **kwargs)``, gradients
        through ops.HookBackward (``head``: leading arguments not recorded, a jit Cell's self)."""
        dumper = self.dumper()
        if dumper is None:
            return call(*head, *args, **kwargs)
        return dumper.core.record_api(self, (lambda *a, **k: call(*head, *a, **k)) if head else call, api_key, args,
                                      kwargs)

    def backward_possible(self, call: ApiCall) -> bool:
        dumper = self.dumper()
        return dumper is not None and dumper.bw_wanted() and has_tensor(call.args)

    def call_api(self, call: ApiCall) -> Any:
        """The call, its tensors routed through ops.HookBackward when its backward is wanted."""
        if not (call.backward if call.recorded else call.listed):
            return call.run()
        out = call.orig(*self._hook_grads(call.args, call.bwd, "output"), **call.kwargs)
        return self._hook_grads(out, call.bwd, "input")

    def _hook_grads(self, values: Any, bwd: str, side: str) -> Any:
        """Route the tensors of ``values`` through ops.HookBackward: their gradients extend the
        backward record's ``side`` list as they arrive."""
        dumper = self.dumper()
        if dumper is None:
            return values
        core_ref = weakref.ref(dumper.core)
        captured: list = []
        generation = dumper.core.generation()
        structure = dumper.config.task == "structure"
        observer, order = dumper.observer, next(_observer.ORDER)

        def hook(grad):
            core = core_ref()
            if core is None or not core.live(generation):
                return None
            if observer is not None:  # the Cell calls begun after this one are written first
                observer.api_event(order)
            captured.extend(grad if isinstance(grad, (tuple, list)) else (grad,))
            parent = core.running_backward()
            if structure or not core.wanted_backward(bwd, True):
                if core.dumps_modules():
                    core.structure(bwd, parent)
                return None
            GUARD.inside = True
            try:
                _add_backward_side(core, bwd, side, captured, parent)
            finally:
                GUARD.inside = False
            return None

        if isinstance(values, Tensor):
            return ops.HookBackward(hook)(values)
        if isinstance(values, (tuple, list)):
            hooked = [ops.HookBackward(hook)(value) if isinstance(value, Tensor) and floating(value) else value
                      for value in values]
            return type(values)(hooked) if isinstance(values, tuple) else hooked
        return values


def _add_backward_side(core: DumperCore, bwd: str, side: str, captured: list, parent: Optional[str]) -> None:
    """The backward record ``bwd`` with its ``side`` (``input``/``output``) now ``captured``."""
    want_in, want_out = core.io("backward")
    if not (want_in if side == "input" else want_out):
        return
    encoder = core.encoder()
    save = encoder.wants_tensors(bwd)
    rec = core.record_of(bwd)
    rec = dict(rec) if isinstance(rec, dict) else {}
    entries = [encoder.encode(grad, f"{bwd}.{side}.{i}", save) for i, grad in enumerate(captured)]
    new = {"input": rec.get("input", []), "output": rec.get("output", [])}
    new[side] = entries
    if not want_in:
        new.pop("input")
    if not want_out:
        new.pop("output")
    core.record(bwd, new, parent=parent)


class JitPatches:
    """``mindspore.jit``'s executor and its bytecode-capture context, patched while a dumper runs
    at L1/mix (and restored at close)."""

    def __init__(self, dumper: Any) -> None:
        self.dumper = weakref.ref(dumper)
        self._jit_saved: Optional[tuple] = None
        self._pijit_saved: Optional[tuple] = None

    def patch_jit(self) -> None:
        """Calls of ``mindspore.jit`` functions and Cells (compiled graphs, whose inside no hook sees)
        are recorded as ``Jit.<function or Cell class>.<n>``."""
        if self._jit_saved is not None:
            return
        executor = import_first(("mindspore.common.api", "_JitExecutor"),
                                ("mindspore.common.api", "_MindsporeFunctionExecutor"))
        if executor is None:
            return
        orig = executor.__call__
        dumper_ref = self.dumper

        def __call__(ex, *args, **kwargs):
            dumper = dumper_ref()
            if dumper is None or not dumper.core.is_on() or getattr(GUARD, "inside", False) \
                    or not GUARD.__dict__.get("on", True):
                return orig(ex, *args, **kwargs)
            if args and isinstance(args[0], nn.Optimizer):  # the optimizer's own jit step: not the model's
                return orig(ex, *args, **kwargs)
            name = getattr(getattr(ex, "fn", None), "__name__", None) or "JitFunction"
            head: tuple = ()
            if args and isinstance(args[0], nn.Cell) and name == "construct":
                name, head, args = type(args[0]).__name__, args[:1], args[1:]
            return dumper.calls.record(lambda *a, **k: orig(ex, *a, **k), f"Jit.{name}", args, kwargs, head)

        executor.__call__ = __call__
        self._jit_saved = (executor, orig)

    def unpatch_jit(self) -> None:
        if self._jit_saved is not None:
            executor, orig = self._jit_saved
            executor.__call__ = orig
            self._jit_saved = None

    def patch_pijit(self) -> None:
        """``mindspore.jit(capture_mode="bytecode")`` functions and Cells run as plain PyNative code
        while the dumper is on at L1/mix, so their APIs are recorded one by one (the documented
        behaviour: the decorated part is "restored to a dynamic graph"; 26.2.0 does the same by
        making the capture context a no-op)."""
        if self._pijit_saved is not None:
            return
        context = import_first(*PIJIT_CONTEXT)
        if context is None:
            return
        enter, leave = context.__enter__, context.__exit__
        dumper_ref = self.dumper
        eager: list = []  # per entered context: True when it was not entered (runs eagerly)

        def __enter__(ctx):
            dumper = dumper_ref()
            skip = dumper is not None and dumper.core.is_on() and dumper.core.dumps_apis()
            eager.append(skip)
            return None if skip else enter(ctx)

        def __exit__(ctx, *exc):
            if eager and eager.pop():
                return None
            return leave(ctx, *exc)

        context.__enter__, context.__exit__ = __enter__, __exit__
        self._pijit_saved = (context, enter, leave)

    def unpatch_pijit(self) -> None:
        if self._pijit_saved is not None:
            context, enter, leave = self._pijit_saved
            context.__enter__, context.__exit__ = enter, leave
            self._pijit_saved = None
