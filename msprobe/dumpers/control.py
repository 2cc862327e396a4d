"""Framework-neutral parts of a dumper: the list/scope/token_range filters, data_mode
directions, overflow gating, construct.json parents and the call-stack capture.

A framework dumper mixes ``DumperControl`` in, calls ``_init_state`` (``config``, ``session``,
``encoder``, ``enabled``, ``_hooked_models``, ``module_stack``, ``token_range``, ``_token_count``,
``_scope_state``, ``_parent_of``...) and provides the methods ``_encode_output(out, prefix, save)``,
``_module_params(module)`` (a module's own ``(name, parameter)`` pairs),
``_hook_param_grads(module, key)``, and for ``save(..., save_backward=True)``
``_grad_hookable(value)`` / ``_on_grad(tensor, fn)`` (a gradient hook on a tensor).
"""
from __future__ import annotations

import linecache
import os
import re
import sys
import types
import weakref
from typing import Any, Callable, Optional

from msprobe.dumpers.session import DumpSession
from msprobe.errors import ConfigError

__all__ = ["DumperControl", "capture_stack", "render_stack"]

_PKG_DIRS = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),)
#: a record name's direction: API ``....forward``/``....backward``, module ``....forward.<n>``
_DIRECTION = re.compile(r"\.(forward|backward)(?:\.\d+)?$")
_MODULE_NAME = re.compile(r"^(Module|Cell)\..*\.(forward|backward)\.\d+$")


def capture_stack() -> tuple:
    """(filename, lineno, function) of the user frames, innermost first; code lines are read at publish."""
    f: Optional[types.FrameType] = sys._getframe(2)
    out = []
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(_PKG_DIRS) and fn != "<string>":
            out.append((fn, f.f_lineno, f.f_code.co_name))
        f = f.f_back
    return tuple(out)


def render_stack(frames: tuple) -> list:
    return [f"File {fn}, line {ln}, in {func}, \n {linecache.getline(fn, ln).strip()}" for fn, ln, func in frames]


class DumperControl:
    # the framework's thread-local API guard (``guard.inside`` while the dumper works), a
    # threading.local that each subclass sets
    guard: Any = None

    # -- provided by each framework's dumper (the PyTorch and MindSpore ones define them all)
    def _encode_output(self, out: Any, prefix: str, save: bool) -> list:
        raise NotImplementedError

    @staticmethod
    def _module_params(mod: Any) -> Any:
        raise NotImplementedError

    def _hook_param_grads(self, mod: Any, key: str) -> None:
        raise NotImplementedError

    @staticmethod
    def _grad_hookable(value: Any) -> bool:
        raise NotImplementedError

    @staticmethod
    def _on_grad(tensor: Any, fn: Any) -> None:
        raise NotImplementedError

    def _init_state(self, config: Any, framework: str, encoder_cls: Any, patcher_cls: Any, fetch_stats: Any,
                    get_rank: Any) -> None:
        """What every dumper starts with: its session and encoder, the API patcher, and the
        bookkeeping this mixin reads (stacks, filters, parents, levels)."""
        self.config = config
        self.session = DumpSession(config, framework, fetch_stats=fetch_stats, render_stack=render_stack,
                                   get_rank=get_rank)
        self.encoder = encoder_cls(self.session, save_tensors=config.task == "tensor",
                                   summary_mode=config.summary_mode, tensor_list=config.tensor_list)
        self.encoder.check_overflow = config.task == "overflow_check"
        self.patcher = patcher_cls()
        self.enabled = False
        self.module_stack: list = []
        self.bw_stack: list = []
        self._hooked_models: list = []
        self._scope_state = 0  # 0 before scope start, 1 inside, 2 after end
        self.token_range: Optional[tuple] = None
        self._token_count = -1
        self._parent_of: dict = {}
        self._pgrad_seen: set = set()  # modules whose parameter gradients this step dumps
        self.debug_counts: dict = {}
        self.L1 = config.level in ("L1", "mix")
        self.L0 = config.level in ("L0", "mix")
        #: the step generation: a backward hook set up while the dump was on records until the
        #: step ends (``step()``), also after ``stop()`` (the docs: stop before loss.backward()
        #: and step() after it collects the forward *and* backward of the calls in between)
        self._gen = 0
        self._overflow_count = 0  # overflow_check: overflowing records over the whole run
        self._overflow_done = False  # overflow_nums reached: no more detection for the run
        self._region: Optional[str] = None  # module_dump(module, name): the module's key, until module_dump_end

    def _warn_if_nothing(self) -> None:
        """At ``step()``: a step that was dumped (``start()`` ran with its step and rank on) and
        recorded nothing warns once, naming the filter that excluded every call (``list``,
        ``scope``, ``data_mode``, ``token_range``) or saying that no wrapped call ran."""
        import warnings

        started, self._dumped_step = getattr(self, "_dumped_step", False), False
        before, self._records_before = getattr(self, "_records_before", 0), self.session.records_total
        cfg = self.config
        if (not started or self.session.records_total > before or getattr(self, "_told_nothing", False)
                or cfg.task == "overflow_check" or cfg.level == "debug"):
            return
        self._told_nothing = True
        seen = sorted(set(self.session.api_counts) | {k.rsplit(".", 1)[0] for k in self.session.module_counts})
        why = []
        if cfg.list:
            import difflib

            short = {**{n.split(".", 1)[-1]: n for n in seen}, **{n: n for n in seen}}  # linear -> Functional.linear
            near = sorted({short[m] for item in cfg.list
                           for m in difflib.get_close_matches(item, list(short), n=2, cutoff=0.6)})
            why.append(f"list {cfg.list} matched none of the {len(seen)} APIs/modules called"
                       + (f" (near: {', '.join(near[:4])})" if near else
                          f" ({', '.join(seen[:4])}{', ...' if len(seen) > 4 else ''})" if seen else ""))
        if cfg.scope:
            state = ("its start never ran" if self._scope_state == 0 else "it opened but nothing in it was dumped")
            why.append(f"scope {cfg.scope}: {state}")
        if cfg.data_mode != ["all"]:
            why.append(f"data_mode {cfg.data_mode}")
        if self.token_range is not None:
            why.append(f"token_range {list(self.token_range)} (forward calls counted: {self._token_count + 1})")
        if not why:
            hooked = "no model passed to start(model)" if not self._hooked_models else "the model's modules"
            why.append(f"no call went through a wrapped API or a hooked module between start() and step() "
                       f"(level {cfg.level}, {len(seen)} APIs/modules seen; {hooked})")
        warnings.warn(f"msprobe: step {self.session.current_step} was dumped but recorded nothing: "
                      f"{'; '.join(why)} (said once)", RuntimeWarning, stacklevel=4)

    def _live(self, gen: int) -> bool:
        """Whether a hook set up in step generation ``gen`` still records."""
        return self.enabled or gen == self._gen

    def _end_step_state(self) -> None:
        """What a step's end resets (both dumpers)."""
        self._gen += 1
        self._scope_state = 0
        self._token_count = -1
        self.debug_counts.clear()
        self.bw_stack.clear()
        self._parent_of.clear()
        self._pgrad_seen.clear()
        reset = getattr(self.encoder, "reset_overflow", None)
        if reset is not None:
            reset()

    def _set_token_range(self, model: Any, token_range: Optional[list]) -> None:
        if token_range is None:
            return

        if model is None:
            raise ConfigError("token_range requires model")
        if not (isinstance(token_range, (list, tuple)) and len(token_range) == 2
                and all(isinstance(x, int) and x >= 0 for x in token_range) and token_range[0] <= token_range[1]):
            raise ConfigError(f"invalid token_range={token_range!r}; valid: [start, end] integers, start <= end")
        self.token_range = tuple(token_range)

    def _record_backward(self, bwd: str, grads_in: Any, grads_out: Any, parent: Optional[str]) -> None:
        """A backward record: ``input`` = gradients of the forward outputs, ``output`` = of its inputs."""
        if self.config.task == "structure":  # its place in construct.json only
            self.session.add_structure(bwd, parent)
            return
        self.guard.inside = True
        try:
            want_in, want_out = self._io("backward")
            save = self.encoder.wants_tensors(bwd)
            rec: dict = {}
            if want_in:
                rec["input"] = [self.encoder.encode(g, f"{bwd}.input.{i}", save) for i, g in enumerate(grads_in)]
            if want_out:
                rec["output"] = [self.encoder.encode(g, f"{bwd}.output.{i}", save) for i, g in enumerate(grads_out)]
            if self._keep(rec, bwd):
                self.session.add_record(bwd, rec, parent=parent)
        finally:
            self.guard.inside = False

    # ---------------------------------------------------------------- records
    def _forward_inputs(self, fwd: str, args: tuple, kwargs: dict, encode_arg: Any = None) -> dict:
        """A forward record with its ``input_args``/``input_kwargs`` (none when inputs are not
        dumped); ``encode_arg``: how a positional argument is encoded (default: the encoder)."""
        want_in, _ = self._io("forward")
        rec: dict = {}
        if want_in and self.config.task != "structure":
            save = self.encoder.wants_tensors(fwd)
            enc = self.encoder.encode
            arg = encode_arg or enc
            rec["input_args"] = [arg(a, f"{fwd}.input.{i}", save) for i, a in enumerate(args)]
            rec["input_kwargs"] = {k: enc(v, f"{fwd}.kwargs.{k}", save) for k, v in kwargs.items()}
        return rec

    def _forward_output(self, rec: dict, fwd: str, out: Any) -> None:
        _, want_out = self._io("forward")
        if want_out and self.config.task != "structure":
            rec["output"] = self._encode_output(out, f"{fwd}.output", self.encoder.wants_tensors(fwd))

    def _add_models(self, model: Any, cls: type, what: str, handles: list) -> Optional[list]:
        """The models of ``start(model=...)`` (one, or a list/tuple), None when they are hooked
        already; with a token_range the first one's forward pre-hook counts the tokens."""
        models = list(model) if isinstance(model, (list, tuple)) else [model]
        for m in models:
            if not isinstance(m, cls):
                raise ConfigError(f"model must be a {what} or a list/tuple of them, got {type(m).__name__}")
        if any(m is h for m in models for h in self._hooked_models):
            return None
        self._hooked_models.extend(models)
        if self.token_range is not None:
            handles.append(models[0].register_forward_pre_hook(self._on_root_forward))
        return models

    def _on_root_forward(self, module: Any, args: Any) -> None:
        self._token_count += 1

    def _module_forward_begin(self, key: str, args: tuple, kwargs: dict) -> Optional[tuple]:
        """A module's (Cell's) forward pre-hook: counts the call, pushes it on the module stack and
        encodes its inputs. Returns the call in flight, ``(fwd, rec, parent, stack)`` with ``rec``
        None when the call is filtered out, or None when nothing is dumped now."""
        if not self.enabled or (self.token_range is not None and not self._in_token_range()):
            return None
        if self._region is not None and key != self._region:
            return None  # inside module_dump(...): only that module is dumped
        n = self.session.next_module_index(key)
        fwd = f"{key}.forward.{n}"
        parent = self._parent()
        self.module_stack.append(fwd)
        if not self._wanted(fwd):
            return fwd, None, parent, None
        self.guard.inside = True
        try:
            return fwd, self._forward_inputs(fwd, args, kwargs), parent, \
                capture_stack() if self.config.stack else None
        finally:
            self.guard.inside = False

    def _module_forward_end(self, call: tuple, module: Any, key: str, output: Any, gated: bool = False) -> None:
        """The forward hook for a call from ``_module_forward_begin``: pops it, records its outputs
        and own parameters, hooks the parameters' gradients. A filtered-out call is a structure
        entry (``gated``: only while the dump is on and inside token_range)."""
        fwd, rec, parent, stack = call
        self._parent_of[fwd] = parent
        if self.module_stack and self.module_stack[-1] == fwd:
            self.module_stack.pop()
        if rec is None:
            self._scope_leave(fwd)
            if not gated or (self.enabled and self._in_token_range()):
                self.session.add_structure(fwd, parent)
                if self.enabled and self.config.backward_enabled and self.config.task != "structure":
                    self._hook_param_grads(module, key)  # data_mode backward, list of backward names
            return
        self.guard.inside = True
        try:
            _, want_out = self._io("forward")
            save = self.encoder.wants_tensors(fwd)
            if want_out and self.config.task != "structure":
                rec["output"] = self._encode_output(output, f"{fwd}.output", save)
                rec["parameters"] = {name: self.encoder.encode(p, f"{fwd}.parameters.{name}", save)
                                     for name, p in self._module_params(module)}
            if self._keep(rec, fwd):
                self.session.add_record(fwd, rec, stack=stack, parent=parent)
            if self.config.task != "structure":
                self._hook_param_grads(module, key)
        finally:
            self.guard.inside = False
            self._scope_leave(fwd)

    def _module_backward(self, bwd: str, fwd: str, grads_in: Any, grads_out: Any, live: bool = False) -> None:
        """A module's backward (of its forward call ``fwd``): a record, or a structure entry when
        filtered out; its parent is the backward of the forward's parent. ``live``: the step of
        the forward call is still being dumped (after ``stop()`` too)."""
        parent = self._bw_parent(self._parent_of.get(fwd))
        try:
            if not self._wanted(bwd, self._inside_listed_backward(), live=live):
                self.session.add_structure(bwd, parent)
                return
            self._record_backward(bwd, grads_in, grads_out, parent)
        finally:
            self._scope_leave(bwd)

    def _save_debug(self, variable: Any, name: str, save_backward: bool = False) -> Optional[str]:
        """debug level ``save``: the record ``<name>.<n>.debug`` and, ``save_backward``,
        ``<name>_grad.<n>.debug`` (None when this step/rank is not dumped)."""
        if not self.enabled and not (self.session.step_enabled() and self.session.rank_enabled()):
            return None
        n = self.debug_counts.get(name, 0)
        self.debug_counts[name] = n + 1
        key = f"{name}.{n}.debug"
        self.guard.inside = True
        try:
            save = self.encoder.wants_tensors(key)
            self.session.add_record(key, self.encoder.encode(variable, key, save), construct=False)
        finally:
            self.guard.inside = False
        if save_backward:
            self._save_grads(variable, f"{name}_grad.{n}.debug")
        return key

    def _save_grads(self, variable: Any, key: str) -> None:
        """The gradients of ``variable``'s tensors, in its nesting: the record is there at once
        with ``null`` in each place (as the real tool writes it) and fills in as they arrive."""
        tensors: list = []
        hookable = self._grad_hookable

        def collect(v: Any, path: tuple) -> None:
            if hookable(v):
                tensors.append((path, v))
            elif isinstance(v, (list, tuple)):
                for i, x in enumerate(v):
                    collect(x, path + (str(i),))
            elif isinstance(v, dict):
                for k, x in v.items():
                    collect(x, path + (str(k),))

        collect(variable, ())
        grads: dict = {}
        self.session.add_record(key, _nest(variable, grads), construct=False)
        dumper_ref = weakref.ref(self)
        gen = self._gen
        for path, t in tensors:
            def hook(g, path=path):
                d = dumper_ref()
                if d is None or not d._live(gen):
                    return None
                d.guard.inside = True
                try:
                    save = d.encoder.wants_tensors(key)
                    grads[path] = d.encoder.encode(g, ".".join((key,) + path), save)
                    d.session.add_record(key, _nest(variable, grads), construct=False)
                finally:
                    d.guard.inside = False
                return None

            self._on_grad(t, hook)

    # ---------------------------------------------------------------- filters
    def _in_scope(self, name: str) -> bool:
        """The scope range, in execution order (a backward name as its backward runs). A range
        that ends at a module (L0/mix) ends when that module's call ends: its inner calls are in
        it (8.1.1/26.2.0); one that ends at an API ends with that API."""
        scope = self.config.scope
        if not scope:
            return True
        if self._scope_state == 0 and name == scope[0]:
            self._scope_state = 1
        if self._scope_state == 1:
            if name == scope[1] and not (self.L0 and _MODULE_NAME.match(name)):
                self._scope_state = 2
            return True
        return False

    def _scope_enter(self, name: str) -> None:
        """A module's call begins (a backward one: when its output gradients arrive)."""
        scope = self.config.scope
        if scope and self._scope_state == 0 and name == scope[0]:
            self._scope_state = 1

    def _scope_leave(self, name: str) -> None:
        """A module's call ends: a scope ending at it ends here."""
        scope = self.config.scope
        if scope and self._scope_state == 1 and name == scope[1]:
            self._scope_state = 2

    def _listed(self, name: str) -> bool:
        """``list``: a full record name (forward or backward), or a part of names (``"relu"``)."""
        lst = self.config.list
        return not lst or any(item == name or item in name for item in lst)

    def _direction_on(self, name: str) -> bool:
        """``data_mode`` forward/backward: whether records of ``name``'s direction are dumped."""
        m = _DIRECTION.search(name)
        if m is not None:
            return self.config.forward_enabled if m.group(1) == "forward" else self.config.backward_enabled
        if "parameters_grad" in name:
            return self.config.backward_enabled
        return True

    def _wanted(self, name: str, inside_listed: Optional[bool] = None, live: bool = False) -> bool:
        """Whether the call ``name`` is recorded: the dump is on (or, ``live``, the step of its
        forward call is still dumped), inside token_range and scope, listed, of a dumped
        direction. ``inside_listed``: whether the call sits in a module named by ``list`` (mix
        level); None = look at the current module stack (forward). The scope is consulted for
        every call, in execution order, so that ``scope`` + ``list`` is their intersection."""
        if not (self.enabled or live) or self._overflow_done:
            return False
        if not self._in_token_range():
            return False
        if not self._in_scope(name):
            return False
        if not self._direction_on(name):
            return False
        if not self._listed(name):
            if inside_listed is None:
                inside_listed = self.config.level == "mix" and self._inside_listed_module()
            if not inside_listed:
                return False
        return True

    def _bw_listed(self, bwd: str, inside_listed: bool = False) -> bool:
        """At a forward call: whether its backward ``bwd`` may be recorded (hook it then), by
        ``list`` and ``data_mode``; the scope is decided when the backward runs."""
        return self.config.backward_enabled and not self._overflow_done and (inside_listed or self._listed(bwd))

    def _in_token_range(self) -> bool:
        return self.token_range is None or self.token_range[0] <= self._token_count <= self.token_range[1]

    def _inside_listed_module(self, stack: Optional[list] = None) -> bool:
        """Whether a module on ``stack`` (default: the forward module stack) is named by ``list``."""
        lst = self.config.list
        return bool(lst) and any(any(item == m or item in m for item in lst)
                                 for m in (self.module_stack if stack is None else stack))

    def _inside_listed_backward(self) -> bool:
        """mix: whether a module backward in progress is named by ``list`` (a backward runs
        inside its module's backward, which ``list`` names separately from its forward)."""
        return self.config.level == "mix" and self._inside_listed_module(self.bw_stack)

    def _io(self, direction: str) -> tuple:
        cfg = self.config
        ok = cfg.forward_enabled if direction == "forward" else cfg.backward_enabled
        return ok and cfg.input_enabled, ok and cfg.output_enabled

    def _parent(self) -> Optional[str]:
        return self.module_stack[-1] if self.module_stack else None

    def _keep(self, rec: dict, name: str, encoder: Any = None) -> bool:
        """overflow_check keeps only records whose tensors hold Inf/NaN, with their tensor files
        (the docs: the inputs and outputs of an overflowing API are dumped), up to
        ``overflow_nums`` records over the whole run (-1: no limit). ``encoder``: the one that
        encoded the record (default: the dumper's)."""
        if self.config.task != "overflow_check":
            return True
        enc = encoder or self.encoder
        found = enc.take_overflow(name) and not self._overflow_done
        enc.settle_overflow(name, keep=found)
        if not found:
            return False
        self._overflow_count += 1
        n = self.config.overflow_nums
        if n != -1 and self._overflow_count >= n:
            self._overflow_done = True
        return True

    @staticmethod
    def _bw_parent(parent: Optional[str]) -> Optional[str]:
        if parent is None:
            return None
        head, _, n = parent.rpartition(".forward.")
        return f"{head}.backward.{n}" if head else parent

    def _fix_dangling_parents(self) -> None:
        """A module whose backward never completed leaves no record: its children go to the
        nearest recorded ancestor."""
        def fix(parent: Optional[str], known: Callable[[Optional[str]], bool]) -> Optional[str]:
            seen = 0
            while parent is not None and not known(parent) and seen < 64:
                parent = self._bw_parent(self._parent_of.get(parent.replace(".backward.", ".forward.")))
                seen += 1
            return parent if known(parent) else None

        self.session.rewrite_parents(fix)


def _nest(variable: Any, grads: dict, path: tuple = ()) -> Any:
    """``variable``'s nesting with the gradient entries found in ``grads`` (by path), else None."""
    if isinstance(variable, (list, tuple)):
        return [_nest(v, grads, path + (str(i),)) for i, v in enumerate(variable)]
    if isinstance(variable, dict):
        return {k: _nest(v, grads, path + (str(k),)) for k, v in variable.items()}
    return grads.get(path)
