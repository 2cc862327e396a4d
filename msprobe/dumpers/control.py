"""Framework-neutral parts of a dumper, composed into each framework's dumper.

* :class:`FrameworkAdapter` (msprobe/dumpers/adapter.py, the written contract): what a framework
  supplies: its encoder, API patcher, guard, statistics fetch and rank, how an API is called and
  what a collective is, how an output and a module's own parameters are encoded, how a gradient
  hook goes on a module's parameters and on a tensor. ``TorchDumper`` and ``MindSporeDumper`` are
  adapters.
* :class:`RecordFilter` (msprobe/dumpers/record_filter.py): which calls are recorded: ``scope``,
  ``list``, ``data_mode`` directions, ``token_range`` and the overflow gating of ``overflow_check``.
* :class:`DumperCore`: the state and the records every dumper shares (its session, encoder and
  patcher, the module stacks, construct.json parents, the step generation, the records of API
  calls (``record_api``) and of modules, ``stop``, ``save``), built by the framework's dumper with
  itself as the adapter.
* ``capture_stack`` / ``render_stack`` (msprobe/dumpers/stacks.py): the call stack of a record.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Optional

from msprobe.dumpers.adapter import ApiCall, ApiCaller, ApiGuard, ApiPatcher, FrameworkAdapter, StatEncoder
from msprobe.dumpers.config import DumpConfig
from msprobe.dumpers.record_filter import RecordFilter
from msprobe.dumpers.session import DumpSession
from msprobe.dumpers.stacks import capture_stack, render_stack
from msprobe.errors import ConfigError

__all__ = ["ApiCall", "DumperCore", "FrameworkAdapter", "RecordFilter", "backward_parent", "capture_stack", "core_attribute",
           "render_stack"]


def core_attribute(name: str) -> Any:
    """A framework dumper's attribute that is its core's (``session``, ``encoder``, ``patcher``,
    ``enabled``): read and set through ``dumper.core``, for the dumper's users."""

    def get(dumper: Any) -> Any:
        return getattr(dumper.core, name)

    def put(dumper: Any, value: Any) -> None:
        setattr(dumper.core, name, value)

    return property(get, put, doc=f"the core's ``{name}``")


class ModuleForwardHooks:
    """The forward half of one module's (PyTorch) or Cell's (MindSpore) hooks, the same in both
    frameworks: a weak reference to the dumper, the module's key, and the stack of its forward calls in
    flight (what :meth:`DumperCore.module_forward_begin` gave, or None without a dumper), pushed by
    :meth:`pre` and popped by the framework's post hook."""

    def __init__(self, dumper: Any, key: str) -> None:
        self.dumper = weakref.ref(dumper)
        self.key = key
        self.calls: list = []  # forward calls in flight (from module_forward_begin)

    def pre(self, module, args, kwargs):
        dumper = self.dumper()
        self.calls.append(None if dumper is None else dumper.core.module_forward_begin(self.key, args, kwargs))
        return None


class DumperCore:
    """What every dumper holds and records, whatever the framework: the session, encoder and API
    patcher, the module stacks and parents, the step generation, the records of module calls and
    of ``save``. ``adapter``: the framework's dumper, whose collaborators (msprobe/dumpers/adapter.py)
    the core builds: its session (with the adapter's ``fetch_stats`` and ``get_rank``), encoder and
    patcher; ``guard``: its thread-local API guard (``guard.inside`` while the dumper works)."""

    def __init__(self, adapter: FrameworkAdapter, config: DumpConfig) -> None:
        self.adapter = adapter
        self.guard: ApiGuard = adapter.guard
        self.config = config
        self.session = DumpSession(config, adapter.framework, fetch_stats=adapter.fetch_stats,
                                   render_stack=render_stack, get_rank=adapter.get_rank)
        self.encoder: StatEncoder = adapter.encoder_cls(self.session, save_tensors=config.task == "tensor",
                                                        summary_mode=config.summary_mode,
                                                        tensor_list=config.tensor_list)
        self.encoder.check_overflow = config.task == "overflow_check"
        self.patcher: ApiPatcher = adapter.patcher_cls()
        self.enabled = False
        self.module_stack: list = []
        self.bw_stack: list = []
        self.filter = RecordFilter(config, self.module_stack, self.bw_stack)
        self.hooked_models: list = []
        self.parent_of: dict = {}
        self.pgrad_seen: set = set()  # modules whose parameter gradients this step dumps
        self.debug_counts: dict = {}
        self.apis_dumped = config.level in ("L1", "mix")
        self.modules_dumped = config.level in ("L0", "mix")
        #: the step generation: a backward hook set up while the dump was on records until the
        #: step ends (``step()``), also after ``stop()`` (the docs: stop before loss.backward()
        #: and step() after it collects the forward *and* backward of the calls in between)
        self.generation = 0
        self.region: Optional[str] = None  # module_dump(module, name): the module's key, until module_dump_end
        self.dumped_step = False  # start() turned the dump on in this step
        self.records_before = 0
        self.told_nothing = False

    # ---------------------------------------------------------------- steps
    def begin(self) -> bool:
        """``start()``: whether this step and rank are dumped (the session claims its directory then)."""
        if not (self.session.step_enabled() and self.session.rank_enabled()):
            self.enabled = False
            return False
        self.session.claim()
        return True

    def turn_on(self) -> None:
        self.enabled = True
        self.dumped_step = True
        self.guard.on = True

    def stop(self) -> None:
        """``stop()``: the dump goes off and dump.json holds what was recorded so far (the adapter
        waits for its work in flight first, and writes what it held back before the publish)."""
        if not self.enabled:
            return
        adapter = self.adapter
        adapter.before_stop()
        self.enabled = False
        self.guard.on = False
        adapter.flush_records()
        self.fix_dangling_parents()
        self.session.publish()
        adapter.after_publish()

    def live(self, generation: int) -> bool:
        """Whether a hook set up in step generation ``generation`` still records."""
        return self.enabled or generation == self.generation

    def end_step_state(self) -> None:
        """What a step's end resets (both dumpers)."""
        self.generation += 1
        self.filter.end_step()
        self.debug_counts.clear()
        self.bw_stack.clear()
        self.parent_of.clear()
        self.pgrad_seen.clear()
        reset = getattr(self.encoder, "reset_overflow", None)
        if reset is not None:
            reset()

    def warn_if_nothing(self) -> None:
        """At ``step()``: a step that was dumped (``start()`` ran with its step and rank on) and
        recorded nothing warns once, naming the filter that excluded every call (``list``,
        ``scope``, ``data_mode``, ``token_range``) or saying that no wrapped call ran."""
        import warnings

        started, self.dumped_step = self.dumped_step, False
        before, self.records_before = self.records_before, self.session.records_total
        config = self.config
        if (not started or self.session.records_total > before or self.told_nothing
                or config.task == "overflow_check" or config.level == "debug"):
            return
        self.told_nothing = True
        seen = sorted(set(self.session.api_counts) | {key.rsplit(".", 1)[0] for key in self.session.module_counts})
        why = self.filter.nothing_recorded(seen)
        if not why:
            hooked = "no model passed to start(model)" if not self.hooked_models else "the model's modules"
            why.append(f"no call went through a wrapped API or a hooked module between start() and step() "
                       f"(level {config.level}, {len(seen)} APIs/modules seen; {hooked})")
        warnings.warn(f"msprobe: step {self.session.current_step} was dumped but recorded nothing: "
                      f"{'; '.join(why)} (said once)", RuntimeWarning, stacklevel=4)

    # ---------------------------------------------------------------- API calls
    def record_api(self, caller: ApiCaller, orig: Callable[..., Any], api_key: str, args: tuple,
                   kwargs: dict) -> Any:
        """One API call, ``orig(*args, **kwargs)``, recorded (the API wrappers' callback, through the
        adapter; ``caller``: the adapter, or another kind of call it records the same way): its
        forward record around the call, or, filtered out, its place in construct.json and its
        backward where ``list``/``data_mode`` still want it; the adapter calls the API
        (:meth:`ApiCaller.call_api`) with its backward hooks."""
        if self.call_skipped() or self.region is not None:  # module_dump(...): APIs not dumped (nor counted)
            return orig(*args, **kwargs)
        selection = self.filter
        guard = self.guard
        guard.inside = True
        try:
            base, _ = self.session.next_api_name(api_key)
            call = ApiCall(orig, api_key, args, kwargs, base, self.parent(), caller.is_collective(api_key))
            call.backward = not call.collective and caller.backward_possible(call)
            if not selection.wanted(call.fwd, self.enabled):
                call.recorded = False
                structure = self.enabled and self.modules_dumped and selection.in_token_range()
                # its backward may still be wanted (list names it, data_mode backward)
                call.listed = self.enabled and call.backward and selection.backward_listed(call.bwd,
                                                                                           selection.mix_listed())
                if not structure and not call.listed:
                    return orig(*args, **kwargs)
                if structure:  # filtered out: not recorded, but part of the structure
                    self.session.add_structure(call.fwd, call.parent)
                return caller.call_api(call)
            call.rec = caller.encode_inputs(call)
            call.stack = capture_stack() if self.config.stack else None
            out = caller.call_api(call)
            if call.collective:
                if not caller.collective_output(call, out):
                    return out  # recorded in call order, its output once the work completes
            else:
                self.forward_output(call.rec, call.fwd, out)
            if selection.keep(call.rec, call.fwd, self.encoder):
                self.session.add_record(call.fwd, call.rec, stack=call.stack, parent=call.parent)
            return out
        finally:
            guard.inside = False

    def api_backward_hook(self, bwd: str, record: bool = True) -> Callable[[Any, Any], None]:
        """``hook(grad_input, grad_output)`` of an API call's backward ``bwd`` (gradients of its
        inputs, of its outputs), set up now: its record (parent: the module backward running), or
        its place in construct.json when filtered out or ``record`` is False; nothing once the
        step of the call is over."""
        core_ref = weakref.ref(self)
        generation = self.generation

        def hook(grad_input: Any, grad_output: Any) -> None:
            core = core_ref()
            if core is None or not core.live(generation):
                return None
            bw_parent = core.bw_stack[-1] if core.bw_stack else None
            if not record or not core.filter.wanted(bwd, True, core.filter.inside_listed_backward()):
                if core.modules_dumped:
                    core.session.add_structure(bwd, bw_parent)
                return None
            core.record_backward(bwd, grad_output, grad_input, bw_parent)
            return None

        return hook

    # ---------------------------------------------------------------- records
    def record_backward(self, bwd: str, grads_in: Any, grads_out: Any, parent: Optional[str]) -> None:
        """A backward record: ``input`` = gradients of the forward outputs, ``output`` = of its inputs."""
        if self.config.task == "structure":  # its place in construct.json only
            self.session.add_structure(bwd, parent)
            return
        self.guard.inside = True
        try:
            want_in, want_out = self.filter.io("backward")
            encoder = self.encoder
            save = encoder.wants_tensors(bwd)
            rec: dict = {}
            if want_in:
                rec["input"] = [encoder.encode(grad, f"{bwd}.input.{i}", save) for i, grad in enumerate(grads_in)]
            if want_out:
                rec["output"] = [encoder.encode(grad, f"{bwd}.output.{i}", save) for i, grad in enumerate(grads_out)]
            if self.filter.keep(rec, bwd, encoder):
                self.session.add_record(bwd, rec, parent=parent)
        finally:
            self.guard.inside = False

    def forward_inputs(self, fwd: str, args: tuple, kwargs: dict, encode_arg: Any = None) -> dict:
        """A forward record with its ``input_args``/``input_kwargs`` (none when inputs are not
        dumped); ``encode_arg``: how a positional argument is encoded (default: the encoder)."""
        want_in, _ = self.filter.io("forward")
        rec: dict = {}
        if want_in and self.config.task != "structure":
            save = self.encoder.wants_tensors(fwd)
            encode = self.encoder.encode
            encode_positional = encode_arg or encode
            rec["input_args"] = [encode_positional(arg, f"{fwd}.input.{i}", save) for i, arg in enumerate(args)]
            rec["input_kwargs"] = {key: encode(value, f"{fwd}.kwargs.{key}", save) for key, value in kwargs.items()}
        return rec

    def forward_output(self, rec: dict, fwd: str, out: Any) -> None:
        _, want_out = self.filter.io("forward")
        if want_out and self.config.task != "structure":
            rec["output"] = self.adapter.encode_output(out, f"{fwd}.output", self.encoder.wants_tensors(fwd))

    def add_models(self, model: Any, cls: type, what: str, handles: list) -> Optional[list]:
        """The models of ``start(model=...)`` (one, or a list/tuple), None when they are hooked
        already; with a token_range the first one's forward pre-hook counts the tokens."""
        models = list(model) if isinstance(model, (list, tuple)) else [model]
        for candidate in models:
            if not isinstance(candidate, cls):
                raise ConfigError(f"model must be a {what} or a list/tuple of them, got {type(candidate).__name__}")
        if any(candidate is hooked for candidate in models for hooked in self.hooked_models):
            return None
        self.hooked_models.extend(models)
        if self.filter.token_range is not None:
            handles.append(models[0].register_forward_pre_hook(self.filter.count_token))
        return models

    def parent(self) -> Optional[str]:
        """The construct.json parent of a forward call made now: the innermost module forward open,
        else (where the adapter says so) the innermost module backward running."""
        if self.module_stack:
            return self.module_stack[-1]
        return self.bw_stack[-1] if self.bw_stack and self.adapter.backward_parents_forward else None

    def call_skipped(self) -> bool:
        """Whether a call now is neither recorded nor counted: before start(), after stop(), in a step
        not dumped, or outside token_range."""
        if not self.enabled:
            return True
        selection = self.filter
        return selection.token_range is not None and not selection.in_token_range()

    def module_forward_begin(self, key: str, args: tuple, kwargs: dict) -> Optional[tuple]:
        """A module's (Cell's) forward pre-hook: counts the call, pushes it on the module stack and
        encodes its inputs. Returns the call in flight, ``(fwd, rec, parent, stack)`` with ``rec``
        None when the call is filtered out, or None when nothing is dumped now."""
        if self.call_skipped():
            return None
        selection = self.filter
        if self.region is not None and key != self.region:
            return None  # inside module_dump(...): only that module is dumped
        fwd = f"{key}.forward.{self.session.next_module_index(key)}"
        parent = self.parent()
        self.module_stack.append(fwd)
        if not selection.wanted(fwd, self.enabled):
            return fwd, None, parent, None
        self.guard.inside = True
        try:
            return fwd, self.forward_inputs(fwd, args, kwargs), parent, \
                capture_stack() if self.config.stack else None
        finally:
            self.guard.inside = False

    def module_forward_end(self, call: tuple, module: Any, key: str, output: Any, gated: bool = False) -> None:
        """The forward hook for a call from ``module_forward_begin``: pops it, records its outputs
        and own parameters, hooks the parameters' gradients. A filtered-out call is a structure
        entry (``gated``: only while the dump is on and inside token_range)."""
        fwd, rec, parent, stack = call
        self.parent_of[fwd] = parent
        if self.module_stack and self.module_stack[-1] == fwd:
            self.module_stack.pop()
        config, selection = self.config, self.filter
        if rec is None:
            selection.scope_leave(fwd)
            if not gated or (self.enabled and selection.in_token_range()):
                self.session.add_structure(fwd, parent)
                if self.enabled and config.backward_enabled and config.task != "structure":
                    self.adapter.hook_param_grads(module, key)  # data_mode backward, list of backward names
            return
        self.guard.inside = True
        try:
            _, want_out = selection.io("forward")
            encoder = self.encoder
            save = encoder.wants_tensors(fwd)
            if want_out and config.task != "structure":
                rec["output"] = self.adapter.encode_output(output, f"{fwd}.output", save)
                rec["parameters"] = {name: encoder.encode(param, f"{fwd}.parameters.{name}", save)
                                     for name, param in self.adapter.module_params(module)}
            if selection.keep(rec, fwd, encoder):
                self.session.add_record(fwd, rec, stack=stack, parent=parent)
            if config.task != "structure":
                self.adapter.hook_param_grads(module, key)
        finally:
            self.guard.inside = False
            selection.scope_leave(fwd)

    def module_backward(self, bwd: str, fwd: str, grads_in: Any, grads_out: Any, live: bool = False) -> None:
        """A module's backward (of its forward call ``fwd``): a record, or a structure entry when
        filtered out; its parent is the backward of the forward's parent. ``live``: the step of
        the forward call is still being dumped (after ``stop()`` too)."""
        parent = backward_parent(self.parent_of.get(fwd))
        selection = self.filter
        try:
            if not selection.wanted(bwd, self.enabled or live, selection.inside_listed_backward()):
                self.session.add_structure(bwd, parent)
                return
            self.record_backward(bwd, grads_in, grads_out, parent)
        finally:
            selection.scope_leave(bwd)

    def hold_backward(self, bwd: str, fwd: str, live: bool = False) -> Optional[tuple]:
        """A module's backward due now whose gradients are not all in yet: its place in the documents
        and the end of its scope now, its record by :meth:`fill_backward` with the held place (None:
        it is not recorded, a structure entry only)."""
        parent = backward_parent(self.parent_of.get(fwd))
        selection = self.filter
        try:
            if not selection.wanted(bwd, self.enabled or live, selection.inside_listed_backward()):
                self.session.add_structure(bwd, parent)
                return None
            return parent, self.session.reserve(bwd, parent)
        finally:
            selection.scope_leave(bwd)

    def fill_backward(self, bwd: str, held: tuple, grads_in: Any, grads_out: Any) -> None:
        """The record of a backward held by :meth:`hold_backward`, at its place."""
        parent, placeholder = held
        try:
            self.record_backward(bwd, grads_in, grads_out, parent)
        finally:
            self.session.unreserve(bwd, placeholder)

    def fix_dangling_parents(self) -> None:
        """A module whose backward never completed leaves no record: its children go to the
        nearest recorded ancestor."""
        parent_of = self.parent_of

        def fix(parent: Optional[str], known: Callable[[Optional[str]], bool]) -> Optional[str]:
            hops = 0
            while parent is not None and not known(parent) and hops < 64:
                parent = backward_parent(parent_of.get(parent.replace(".backward.", ".forward.")))
                hops += 1
            return parent if known(parent) else None

        self.session.rewrite_parents(fix)

    # ------------------------------------------------------------------ debug
    def save_debug(self, variable: Any, name: str, save_backward: bool = False) -> Optional[str]:
        """debug level ``save``: the record ``<name>.<n>.debug`` and, ``save_backward``,
        ``<name>_grad.<n>.debug`` (None when this step/rank is not dumped)."""
        if not self.enabled and not (self.session.step_enabled() and self.session.rank_enabled()):
            return None
        count = self.debug_counts.get(name, 0)
        self.debug_counts[name] = count + 1
        key = f"{name}.{count}.debug"
        self.guard.inside = True
        try:
            save = self.encoder.wants_tensors(key)
            self.session.add_record(key, self.encoder.encode(variable, key, save), construct=False)
        finally:
            self.guard.inside = False
        if save_backward:
            _save_grads(self, variable, f"{name}_grad.{count}.debug")
        return key


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


def _save_grads(core: DumperCore, variable: Any, key: str) -> None:
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
    core.session.add_record(key, _nest(variable, grads), construct=False)
    core_ref = weakref.ref(core)
    generation = core.generation
    for path, tensor in tensors:
        def hook(grad, path=path):
            alive = core_ref()
            if alive is None or not alive.live(generation):
                return None
            alive.guard.inside = True
            try:
                save = alive.encoder.wants_tensors(key)
                grads[path] = alive.encoder.encode(grad, ".".join((key,) + path), save)
                alive.session.add_record(key, _nest(variable, grads), construct=False)
            finally:
                alive.guard.inside = False
            return None

        core.adapter.on_grad(tensor, hook)
