"""The records of the calls a dumper sees, the skeletons both frameworks run: an API call
(``record_api`` over an :class:`~msprobe.dumpers.adapter.ApiCall`) and its backward hook, a module
call's forward and backward (also held until its gradients are in), the parents of backwards that
never completed, and debug ``save``. :class:`CallRecords` is a part of
:class:`~msprobe.dumpers.control.DumperCore` (its base): the state it works on is the core's."""
from __future__ import annotations

import weakref
from typing import Any, Callable, Optional

from msprobe.dumpers.adapter import ApiCall, ApiCaller
from msprobe.dumpers.stacks import capture_stack

__all__ = ["CallRecords", "backward_parent"]


class CallRecords:
    """The core's records of calls (methods of :class:`~msprobe.dumpers.control.DumperCore`; ``self``
    is the core, typed ``Any`` here: control.py imports this module, not the other way round)."""

    # ---------------------------------------------------------------- API calls
    def record_api(self: Any, caller: ApiCaller, orig: Callable[..., Any], api_key: str, args: tuple,
                   kwargs: dict) -> Any:
        """One API call, ``orig(*args, **kwargs)``, recorded (the API wrappers' callback, through the
        adapter; ``caller``: the adapter, or another kind of call it records the same way): its
        forward record around the call, or, filtered out, its place in construct.json and its
        backward where ``list``/``data_mode`` still want it; the adapter calls the API
        (:meth:`ApiCaller.call_api`) with its backward hooks."""
        if self.call_skipped() or self._region is not None:  # module_dump(...): APIs not dumped (nor counted)
            return orig(*args, **kwargs)
        selection = self._filter
        guard = self.guard
        guard.inside = True
        try:
            base, _ = self._session.next_api_name(api_key)
            call = ApiCall(orig, api_key, args, kwargs, base, self.parent(), caller.is_collective(api_key))
            call.backward = not call.collective and caller.backward_possible(call)
            if not selection.wanted(call.fwd, self._enabled):
                call.recorded = False
                structure = self._enabled and self._modules_dumped and selection.in_token_range()
                # its backward may still be wanted (list names it, data_mode backward)
                call.listed = self._enabled and call.backward and selection.backward_listed(call.bwd,
                                                                                           selection.mix_listed())
                if not structure and not call.listed:
                    return orig(*args, **kwargs)
                if structure:  # filtered out: not recorded, but part of the structure
                    self._session.add_structure(call.fwd, call.parent)
                return caller.call_api(call)
            call.rec = caller.encode_inputs(call)
            call.stack = capture_stack() if self.config.stack else None
            out = caller.call_api(call)
            if call.collective:
                if not caller.collective_output(call, out):
                    return out  # recorded in call order, its output once the work completes
            else:
                self.forward_output(call.rec, call.fwd, out)
            encoder = self._encoder
            if selection.keep(call.rec, call.fwd, encoder):
                self._session.add_record(call.fwd, call.rec, stack=call.stack, parent=call.parent,
                                         stats=encoder.take_stats())
            return out
        finally:
            guard.inside = False

    def api_backward_hook(self: Any, bwd: str, record: bool = True) -> Callable[[Any, Any], None]:
        """``hook(grad_input, grad_output)`` of an API call's backward ``bwd`` (gradients of its
        inputs, of its outputs), set up now: its record (parent: the module backward running), or
        its place in construct.json when filtered out or ``record`` is False; nothing once the
        step of the call is over."""
        return _ApiBackwardHook(self._weak_self, self._generation, bwd, record)

    # ---------------------------------------------------------------- records
    def record_backward(self: Any, bwd: str, grads_in: Any, grads_out: Any, parent: Optional[str]) -> None:
        """A backward record: ``input`` = gradients of the forward outputs, ``output`` = of its inputs."""
        if self.config.task == "structure":  # its place in construct.json only
            self._session.add_structure(bwd, parent)
            return
        self.guard.inside = True
        try:
            want_in, want_out = self._filter.io("backward")
            encoder = self._encoder
            save = encoder.wants_tensors(bwd)
            rec: dict = {}
            if want_in:
                rec["input"] = encoder.encode_list(grads_in, f"{bwd}.input", save)
            if want_out:
                rec["output"] = encoder.encode_list(grads_out, f"{bwd}.output", save)
            if self._filter.keep(rec, bwd, encoder):
                self._session.add_record(bwd, rec, parent=parent, stats=encoder.take_stats())
        finally:
            self.guard.inside = False

    def forward_inputs(self: Any, fwd: str, args: tuple, kwargs: dict, encode_arg: Any = None) -> dict:
        """A forward record with its ``input_args``/``input_kwargs`` (none when inputs are not
        dumped); ``encode_arg``: how a positional argument is encoded (default: the encoder)."""
        want_in, _ = self._filter.io("forward")
        rec: dict = {}
        if want_in and self.config.task != "structure":
            encoder = self._encoder
            save = encoder.wants_tensors(fwd)
            if encode_arg is None:
                rec["input_args"] = encoder.encode_list(args, f"{fwd}.input", save)
            else:
                rec["input_args"] = [encode_arg(arg, f"{fwd}.input.{i}", save) for i, arg in enumerate(args)]
            rec["input_kwargs"] = encoder.encode_map(kwargs, f"{fwd}.kwargs", save)
        return rec

    def forward_output(self: Any, rec: dict, fwd: str, out: Any) -> None:
        _, want_out = self._filter.io("forward")
        if want_out and self.config.task != "structure":
            rec["output"] = self.adapter.encode_output(out, f"{fwd}.output", self._encoder.wants_tensors(fwd))

    def module_forward_begin(self: Any, key: str, args: tuple, kwargs: dict) -> Optional[tuple]:
        """A module's (Cell's) forward pre-hook: counts the call, pushes it on the module stack and
        encodes its inputs. Returns the call in flight, ``(fwd, rec, parent, stack)`` with ``rec``
        None when the call is filtered out, or None when nothing is dumped now."""
        if self.call_skipped():
            return None
        selection = self._filter
        if self._region is not None and key != self._region:
            return None  # inside module_dump(...): only that module is dumped
        fwd = f"{key}.forward.{self._session.next_module_index(key)}"
        parent = self.parent()
        self._module_stack.append(fwd)
        if not selection.wanted(fwd, self._enabled):
            return fwd, None, parent, None
        self.guard.inside = True
        try:
            return fwd, self.forward_inputs(fwd, args, kwargs), parent, \
                capture_stack() if self.config.stack else None
        finally:
            self.guard.inside = False

    def module_forward_end(self: Any, call: tuple, module: Any, key: str, output: Any, gated: bool = False) -> None:
        """The forward hook for a call from ``module_forward_begin``: pops it, records its outputs
        and own parameters, hooks the parameters' gradients. A filtered-out call is a structure
        entry (``gated``: only while the dump is on and inside token_range)."""
        fwd, rec, parent, stack = call
        self._parent_of[fwd] = parent
        if self._module_stack and self._module_stack[-1] == fwd:
            self._module_stack.pop()
        config, selection = self.config, self._filter
        if rec is None:
            selection.scope_leave(fwd)
            if not gated or (self._enabled and selection.in_token_range()):
                self._session.add_structure(fwd, parent)
                if self._enabled and config.backward_enabled and config.task != "structure":
                    self.adapter.hook_param_grads(module, key)  # data_mode backward, list of backward names
            return
        self.guard.inside = True
        try:
            _, want_out = selection.io("forward")
            encoder = self._encoder
            save = encoder.wants_tensors(fwd)
            if want_out and config.task != "structure":
                rec["output"] = self.adapter.encode_output(output, f"{fwd}.output", save)
                rec["parameters"] = {name: encoder.encode(param, f"{fwd}.parameters.{name}", save)
                                     for name, param in self.adapter.module_params(module)}
            if selection.keep(rec, fwd, encoder):
                self._session.add_record(fwd, rec, stack=stack, parent=parent, stats=encoder.take_stats())
            if config.task != "structure":
                self.adapter.hook_param_grads(module, key)
        finally:
            self.guard.inside = False
            selection.scope_leave(fwd)

    def module_backward(self: Any, bwd: str, fwd: str, grads_in: Any, grads_out: Any, live: bool = False) -> None:
        """A module's backward (of its forward call ``fwd``): a record, or a structure entry when
        filtered out; its parent is the backward of the forward's parent. ``live``: the step of
        the forward call is still being dumped (after ``stop()`` too)."""
        parent = backward_parent(self._parent_of.get(fwd))
        selection = self._filter
        try:
            if not selection.wanted(bwd, self._enabled or live, selection.inside_listed_backward()):
                self._session.add_structure(bwd, parent)
                return
            self.record_backward(bwd, grads_in, grads_out, parent)
        finally:
            selection.scope_leave(bwd)

    def hold_backward(self: Any, bwd: str, fwd: str, live: bool = False) -> Optional[tuple]:
        """A module's backward due now whose gradients are not all in yet: its place in the documents
        and the end of its scope now, its record by :meth:`fill_backward` with the held place (None:
        it is not recorded, a structure entry only)."""
        parent = backward_parent(self._parent_of.get(fwd))
        selection = self._filter
        try:
            if not selection.wanted(bwd, self._enabled or live, selection.inside_listed_backward()):
                self._session.add_structure(bwd, parent)
                return None
            return parent, self._session.reserve(bwd, parent)
        finally:
            selection.scope_leave(bwd)

    def fill_backward(self: Any, bwd: str, held: tuple, grads_in: Any, grads_out: Any) -> None:
        """The record of a backward held by :meth:`hold_backward`, at its place."""
        parent, placeholder = held
        try:
            self.record_backward(bwd, grads_in, grads_out, parent)
        finally:
            self._session.unreserve(bwd, placeholder)

    def fix_dangling_parents(self: Any) -> None:
        """A module whose backward never completed leaves no record: its children go to the
        nearest recorded ancestor."""
        parent_of = self._parent_of

        def fix(parent: Optional[str], known: Callable[[Optional[str]], bool]) -> Optional[str]:
            hops = 0
            while parent is not None and not known(parent) and hops < 64:
                parent = backward_parent(parent_of.get(parent.replace(".backward.", ".forward.")))
                hops += 1
            return parent if known(parent) else None

        self._session.rewrite_parents(fix)

    # ------------------------------------------------------------------ debug
    def save_debug(self: Any, variable: Any, name: str, save_backward: bool = False) -> Optional[str]:
        """debug level ``save``: the record ``<name>.<n>.debug`` and, ``save_backward``,
        ``<name>_grad.<n>.debug`` (None when this step/rank is not dumped)."""
        if not self._enabled and not (self._session.step_enabled() and self._session.rank_enabled()):
            return None
        count = self._debug_counts.get(name, 0)
        self._debug_counts[name] = count + 1
        key = f"{name}.{count}.debug"
        self.guard.inside = True
        try:
            self.record(key, self._encoder.encode(variable, key, self._encoder.wants_tensors(key)), construct=False,
                        filtered=False)
        finally:
            self.guard.inside = False
        if save_backward:
            _save_grads(self, variable, f"{name}_grad.{count}.debug")
        return key


class _ApiBackwardHook:
    """:meth:`CallRecords.api_backward_hook`'s hook: one object per API call (its backward hook lives until
    the backward runs; a closure was a function and four cells, each walked by the garbage collector)."""

    __slots__ = ("core_ref", "generation", "bwd", "record")

    def __init__(self, core_ref: Callable[[], Any], generation: int, bwd: str, record: bool) -> None:
        self.core_ref = core_ref
        self.generation = generation
        self.bwd = bwd
        self.record = record

    def __call__(self, grad_input: Any, grad_output: Any) -> None:
        core = self.core_ref()
        if core is None or not core.live(self.generation):
            return None
        bwd = self.bwd
        bw_parent = core.running_backward()
        if not self.record or not core.wanted_backward(bwd, True):
            if core.dumps_modules():
                core.structure(bwd, bw_parent)
            return None
        core.record_backward(bwd, grad_output, grad_input, bw_parent)
        return None


def backward_parent(parent: Optional[str]) -> Optional[str]:
    """The backward of a forward module call ``parent`` (``....forward.<n>`` -> ``....backward.<n>``)."""
    if parent is None:
        return None
    head, _, index = parent.rpartition(".forward.")
    return f"{head}.backward.{index}" if head else parent


def _nest(variable: Any, grads: dict, path: tuple = ()) -> Any:
    """``variable``'s nesting with the gradient entries found in ``grads`` (by path), else None."""
    if isinstance(variable, (list, tuple)):
        return [_nest(item, grads, path + (str(i),)) for i, item in enumerate(variable)]
    if isinstance(variable, dict):
        return {key: _nest(item, grads, path + (str(key),)) for key, item in variable.items()}
    return grads.get(path)


def _save_grads(core: Any, variable: Any, key: str) -> None:
    """The gradients of ``variable``'s tensors, in its nesting: the record is there at once
    with ``null`` in each place (as the real tool writes it) and fills in as they arrive."""
    tensors: list = []
    hookable = core.adapter.grad_hookable

    def collect(value: Any, path: tuple) -> None:
        if hookable(value):
            tensors.append((path, value))
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                collect(item, path + (str(i),))
        elif isinstance(value, dict):
            for name, item in value.items():
                collect(item, path + (str(name),))

    collect(variable, ())
    grads: dict = {}
    core.record(key, _nest(variable, grads), construct=False, filtered=False)
    core_ref = weakref.ref(core)
    generation = core.generation()
    for path, tensor in tensors:
        def hook(grad, path=path):
            alive = core_ref()
            if alive is None or not alive.live(generation):
                return None
            alive.guard.inside = True
            try:
                encoder = alive.encoder()
                grads[path] = encoder.encode(grad, ".".join((key,) + path), encoder.wants_tensors(key))
                alive.record(key, _nest(variable, grads), construct=False, filtered=False)
            finally:
                alive.guard.inside = False
            return None

        core.adapter.on_grad(tensor, hook)
