"""Framework-neutral parts of a dumper: the list/scope/token_range filters, data_mode
directions, overflow gating, construct.json parents and the call-stack capture.

A framework dumper mixes ``DumperControl`` in, calls ``_init_state`` (``config``, ``session``,
``encoder``, ``enabled``, ``_hooked_models``, ``module_stack``, ``token_range``, ``_token_count``,
``_scope_state``, ``_parent_of``...) and provides the methods ``_encode_output(out, prefix, save)``,
``_module_params(module)`` (a module's own ``(name, parameter)`` pairs) and
``_hook_param_grads(module, key)``.
"""
from __future__ import annotations

import linecache
import os
import sys
from typing import Any, Optional

__all__ = ["DumperControl", "capture_stack", "render_stack"]

_PKG_DIRS = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),)


def capture_stack() -> tuple:
    """(filename, lineno, function) of the user frames, innermost first; code lines are read at publish."""
    f = sys._getframe(2)
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
    guard = None  # the framework's thread-local API guard (``guard.inside`` while the dumper works)

    def _init_state(self, config: Any, framework: str, encoder_cls: Any, patcher_cls: Any, fetch_stats: Any,
                    get_rank: Any) -> None:
        """What every dumper starts with: its session and encoder, the API patcher, and the
        bookkeeping this mixin reads (stacks, filters, parents, levels)."""
        from msprobe.dumpers.session import DumpSession

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
        self.token_range = None
        self._token_count = -1
        self._parent_of: dict = {}
        self.debug_counts: dict = {}
        self.L1 = config.level in ("L1", "mix")
        self.L0 = config.level in ("L0", "mix")

    def _set_token_range(self, model: Any, token_range: Optional[list]) -> None:
        if token_range is None:
            return
        from msprobe.errors import ConfigError

        if model is None:
            raise ConfigError("token_range requires model")
        if not (isinstance(token_range, (list, tuple)) and len(token_range) == 2
                and all(isinstance(x, int) and x >= 0 for x in token_range) and token_range[0] <= token_range[1]):
            raise ConfigError(f"invalid token_range={token_range!r}; valid: [start, end] integers, start <= end")
        self.token_range = tuple(token_range)

    def _record_backward(self, bwd: str, grads_in: Any, grads_out: Any, parent: Optional[str]) -> None:
        """A backward record: ``input`` = gradients of the forward outputs, ``output`` = of its inputs."""
        self.guard.inside = True
        try:
            want_in, want_out = self._io("backward")
            save = self.encoder.wants_tensors(bwd)
            rec: dict = {}
            if want_in:
                rec["input"] = [self.encoder.encode(g, f"{bwd}.input.{i}", save) for i, g in enumerate(grads_in)]
            if want_out:
                rec["output"] = [self.encoder.encode(g, f"{bwd}.output.{i}", save) for i, g in enumerate(grads_out)]
            if self._keep(rec):
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
            rec["input_kwargs"] = {k: enc(v, f"{fwd}.input.{k}", save) for k, v in kwargs.items()}
        return rec

    def _forward_output(self, rec: dict, fwd: str, out: Any) -> None:
        _, want_out = self._io("forward")
        if want_out and self.config.task != "structure":
            rec["output"] = self._encode_output(out, f"{fwd}.output", self.encoder.wants_tensors(fwd))

    def _add_models(self, model: Any, cls: type, what: str, handles: list) -> Optional[list]:
        """The models of ``start(model=...)`` (one, or a list/tuple), None when they are hooked
        already; with a token_range the first one's forward pre-hook counts the tokens."""
        from msprobe.errors import ConfigError

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
            if not gated or (self.enabled and self._in_token_range()):
                self.session.add_structure(fwd, parent)
            return
        self.guard.inside = True
        try:
            _, want_out = self._io("forward")
            save = self.encoder.wants_tensors(fwd)
            if want_out and self.config.task != "structure":
                rec["output"] = self._encode_output(output, f"{fwd}.output", save)
                rec["parameters"] = {name: self.encoder.encode(p, f"{fwd}.parameters.{name}", save)
                                     for name, p in self._module_params(module)}
            if self._keep(rec):
                self.session.add_record(fwd, rec, stack=stack, parent=parent)
                self._hook_param_grads(module, key)
        finally:
            self.guard.inside = False

    def _module_backward(self, bwd: str, fwd: str, grads_in: Any, grads_out: Any) -> None:
        """A module's backward (of its forward call ``fwd``): a record, or a structure entry when
        filtered out; its parent is the backward of the forward's parent."""
        parent = self._bw_parent(self._parent_of.get(fwd))
        if not self._wanted(bwd):
            self.session.add_structure(bwd, parent)
            return
        self._record_backward(bwd, grads_in, grads_out, parent)

    def _save_debug(self, variable: Any, name: str) -> Optional[str]:
        """debug level ``save``: the record ``<name>.<n>.debug`` (None when this step/rank is not dumped)."""
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
        return key
    # ---------------------------------------------------------------- filters
    def _in_scope(self, name: str) -> bool:
        scope = self.config.scope
        if not scope:
            return True
        if self._scope_state == 0 and name == scope[0]:
            self._scope_state = 1
        if self._scope_state == 1:
            if name == scope[1]:
                self._scope_state = 2
            return True
        return False

    def _wanted(self, name: str, inside_listed: Optional[bool] = None) -> bool:
        """``inside_listed``: whether the call sits in a module named by ``list`` (mix level);
        None = look at the current module stack (forward)."""
        if not self.enabled:
            return False
        if not self._in_token_range():
            return False
        lst = self.config.list
        if lst:
            if not any(item == name or item in name for item in lst):
                if inside_listed is None:
                    inside_listed = self.config.level == "mix" and self._inside_listed_module()
                if not inside_listed:
                    return False
        return self._in_scope(name)

    def _in_token_range(self) -> bool:
        return self.token_range is None or self.token_range[0] <= self._token_count <= self.token_range[1]

    def _inside_listed_module(self) -> bool:
        lst = self.config.list
        return any(any(item == m or item in m for item in lst) for m in self.module_stack)

    def _io(self, direction: str) -> tuple:
        cfg = self.config
        ok = cfg.forward_enabled if direction == "forward" else cfg.backward_enabled
        return ok and cfg.input_enabled, ok and cfg.output_enabled

    def _parent(self) -> Optional[str]:
        return self.module_stack[-1] if self.module_stack else None

    def _keep(self, rec: dict) -> bool:
        """overflow_check keeps only records whose tensors hold Inf/NaN, up to overflow_nums."""
        if self.config.task != "overflow_check":
            return True
        if not self.encoder.take_overflow():
            return False
        n = self.config.overflow_nums
        self.session.overflow_found += 1
        if n != -1 and self.session.overflow_found >= n:
            self.enabled = False
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
        data, construct = self.session.data, self.session.construct
        for child, parent in list(construct.items()):
            seen = 0
            while parent is not None and parent not in data and parent not in construct and seen < 64:
                parent = self._bw_parent(self._parent_of.get(parent.replace(".backward.", ".forward.")))
                seen += 1
            construct[child] = parent if parent in data or parent in construct else None
