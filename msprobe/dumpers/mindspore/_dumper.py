"""The MindSpore adapter (PyNative): API, Primitive and Cell hooks feeding the framework-neutral DumpSession.

* APIs (``ops``/``Tensor``/``mint``/... listed in support_wrap_ops.yaml): the wrapper
  records the forward call; when MindSpore is recording a gradient, the call runs inside a
  throw-away Cell whose backward hook gives the backward record (gradients of the outputs as
  ``input``, of the tensor arguments as ``output``, ``null`` where an argument gets none).
* Primitives held by the cells of ``start(model=...)`` (``self.conv2d = ops.Conv2D(...)``):
  the instance's class is swapped for a subclass whose ``__call__`` records
  ``Primitive.<attribute>.<Class>.<n>``; their gradients arrive through ``ops.HookBackward``
  on the inputs and outputs, in arrival order, as the real tool records them.
* Cells (L0/mix): forward pre/post hooks, backward pre/post hooks, and Parameter hooks for
  ``parameters_grad``.
"""
from __future__ import annotations

import dataclasses
import warnings
import weakref
from typing import Any, Optional

import mindspore
from mindspore import Parameter, Tensor, nn, ops
from mindspore.ops import Primitive

from msprobe.dumpers.config import DumpConfig
from msprobe.dumpers.control import DumperControl, capture_stack, render_stack
from msprobe.dumpers.mindspore._apis import GUARD, PIJIT_CONTEXT, ApiPatcher, import_first
from msprobe.dumpers.mindspore._encode import Encoder, fetch_stats
from msprobe.dumpers.mindspore._graph import GraphCellDump, is_jit_cell
from msprobe.dumpers.session import DumpSession
from msprobe.errors import ConfigError

__all__ = ["MindSporeDumper"]

try:
    from mindspore.common.api import _pynative_executor as _EXECUTOR
except ImportError:  # pragma: no cover - other MindSpore layouts
    _EXECUTOR = None


def _grad_recording() -> bool:
    """True while MindSpore records the forward pass of a gradient computation."""
    if _EXECUTOR is None:
        return True
    try:
        return bool(_EXECUTOR.requires_grad())
    except Exception:  # noqa: BLE001 - MindSpore may raise anything here: never break training for the dump
        return True


def _get_rank() -> Optional[int]:
    try:
        from mindspore.communication import GlobalComm, get_rank

        if getattr(GlobalComm, "INITED", False):
            return int(get_rank())
    except Exception:  # noqa: BLE001 - MindSpore may raise anything here: never break training for the dump
        pass
    return None


def _graph_mode() -> bool:
    try:
        return mindspore.get_context("mode") == mindspore.GRAPH_MODE
    except Exception:  # noqa: BLE001 - MindSpore may raise anything here: never break training for the dump
        return False


def _device_target() -> str:
    try:
        return str(mindspore.get_context("device_target"))
    except Exception:  # noqa: BLE001 - MindSpore may raise anything here: never break training for the dump
        return "CPU"


class _ApiCell(nn.Cell):
    """One API call as a Cell, so that MindSpore's Cell backward hook sees its gradients."""

    def __init__(self, fn):
        super().__init__(auto_prefix=False)
        self.fn = fn

    def construct(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def _has_tensor(values) -> bool:
    return any(isinstance(v, Tensor) for v in values)


class MindSporeDumper(DumperControl):
    """Owns the patcher, the Primitive/Cell hooks and the session for one process."""

    guard = GUARD

    def __init__(self, config: DumpConfig):
        if config.level == "L2":
            raise ConfigError("level 'L2' (kernel dump) needs MindSpore on Ascend hardware "
                              f"(device_target 'Ascend'); this process runs on {_device_target()!r}")
        self._init_state(config, "mindspore", Encoder, ApiPatcher, fetch_stats, _get_rank)
        self._cell_handles: list = []
        self._param_handles: list = []
        self._primitives: list = []  # (primitive, original class)
        self._prim_classes: dict = {}
        self._jit_saved: Optional[tuple] = None
        self._pijit_saved: Optional[tuple] = None
        self._pgrads: dict = {}  # parameters_grad records waiting for their Cell's backward hook
        self._graph: Optional[GraphCellDump] = None  # GraphCellDump: the Cells dumped inside compiled graphs (_graph.py)
        self._warned_points = False
        if self.L1 and not _graph_mode():
            # the API wrappers go in when the debugger is created, as 26.2.0 does: a Cell built after it
            # that keeps an op in an attribute (self.act = ops.gelu) holds the wrapper; they pass
            # straight through until start()
            self.patcher.install(self._on_api)

    # ---------------------------------------------------------------- control
    def start(self, model: Any = None, token_range: Optional[list] = None) -> None:
        cfg = self.config
        if _graph_mode():  # graphs run before start (outside the dump) finish their callbacks first
            _synchronize()
        if _graph_mode() and cfg.level not in ("L0", "debug"):
            raise ConfigError(
                f"level {cfg.level!r} dumps MindSpore in PyNative mode only: this process runs in GRAPH_MODE, "
                "where msprobe dumps level 'L0' (Cells) and 'L2' (kernels, Ascend only); use level 'L0' or "
                "call mindspore.set_context(mode=mindspore.PYNATIVE_MODE)")
        if _graph_mode() and cfg.level == "L0" and _device_target() != "CPU":
            raise ConfigError(  # the dump points are pyfunc Custom ops: MindSpore runs those on CPU
                f"GRAPH_MODE level 'L0' is dumped on CPU only (device_target 'CPU'); this process runs on "
                f"{_device_target()!r}, where msprobe's own TensorDump-based dump applies")
        if _graph_mode() and token_range is not None:
            raise ConfigError("token_range needs PyNative mode (it counts the model's forward calls through "
                              "a hook, which GRAPH_MODE does not run)")
        self._set_token_range(model, token_range)
        if model is not None:
            if _graph_mode():
                _warn_precompiled(model, self._hooked_models)
            self._hook_models(model)
        elif self.L0 and not self._hooked_models:
            raise ConfigError(f"level {cfg.level!r} dumps Cells and needs start(model=...)")
        if not (self.session.step_enabled() and self.session.rank_enabled()):
            self.enabled = False
            return
        self.session.claim()
        if self._split_session is not None:
            self._split_session.set_step(self.session.current_step)
            self._split_session.claim()
        if self.L1:
            self.patcher.install(self._on_api)
            self._patch_jit()
            self._patch_pijit()
        self.enabled = True
        self._dumped_step = True
        GUARD.on = True

    def stop(self) -> None:
        if not self.enabled:
            return
        if self._graph is not None:
            _sync()  # the points' callbacks run as the (asynchronous) executor reaches them
            self._warn_no_points()
        self.enabled = False
        GUARD.on = False
        if self._graph is not None:
            self._graph.flush_param_grads()
        self._flush_param_grads()
        self._fix_dangling_parents()
        self.session.publish()
        if self._graph is not None:
            self._graph.reset()
        if self._split_session is not None:
            self._split_session.publish()

    @property
    def _split_session(self) -> Optional[DumpSession]:
        """The ``graph/`` session of the jit-Cell split (spec/PRODUCER.md §23.3); None without the split."""
        g = self._graph
        return g.session if g is not None and g.session is not self.session else None

    def _warn_no_points(self) -> None:
        """GRAPH_MODE: a dumped step in which no dump point ran means the model ran from a graph
        compiled before start(model) (or did not run): said once, instead of an empty dump."""
        g = self._graph
        if g is None:  # called only once the graph dump exists (end of step)
            return
        if g.fired or self._split_session is not None or not _graph_mode() or self._warned_points:
            return
        self._warned_points = True
        cells = [k for k in g.keys() if k]
        warnings.warn(
            f"msprobe: no Cell of the model was dumped in step {self.session.current_step} (GRAPH_MODE level L0): "
            f"no dump point of {', '.join(cells[:3]) + (', ...' if len(cells) > 3 else '')} ran between start() and "
            "stop(). A graph compiled before debugger.start(model) has no dump points and keeps running "
            "undumped: call debugger.start(model) before the model (or the function or Model.train that runs "
            "it) is first run", RuntimeWarning, stacklevel=4)

    def step(self) -> None:
        """Ends the step: the backward of the calls recorded before ``stop()`` is in it (the
        docs: stop before the backward, step after it)."""
        self.stop()
        self._flush_param_grads()
        self._fix_dangling_parents()
        if self._graph is None:  # (GRAPH_MODE says it itself: _warn_no_points)
            self._warn_if_nothing()
        self.session.end_step()
        if self._split_session is not None:
            self._split_session.end_step()
        self._end_step_state()
        self.module_stack.clear()

    def close(self) -> None:
        self.stop()
        if self._graph is None:  # a step ended by the process, not by step(): said as step() says it
            self._warn_if_nothing()
        self.patcher.uninstall()
        self._unpatch_jit()
        self._unpatch_pijit()
        for h in self._cell_handles + self._param_handles:
            try:
                h.remove()
            except Exception:  # noqa: BLE001 - MindSpore may raise anything here: never break training for the dump
                pass
        self._cell_handles = []
        self._param_handles = []
        for prim, cls in self._primitives:
            prim.__class__ = cls
        self._primitives = []
        if self._graph is not None:
            self._graph.unwrap()
        if self._split_session is not None:
            self._split_session.close()
        self.session.close()

    def _bw_wanted(self) -> bool:
        return self.config.backward_enabled and _grad_recording()

    # ------------------------------------------------------------------- APIs
    def _on_api(self, orig, api_key: str, args: tuple, kwargs: dict):
        if not self.enabled:  # before start(), after stop(), in a step not dumped: not recorded nor counted
            return orig(*args, **kwargs)
        if self.token_range is not None and not self._in_token_range():
            return orig(*args, **kwargs)
        GUARD.inside = True
        try:
            base, _ = self.session.next_api_name(api_key)
            fwd = base + ".forward"
            parent = self._parent()
            dist = api_key.startswith(_DIST_PREFIXES)  # collectives: forward-only records
            bw = not dist and self._bw_wanted() and (_has_tensor(args) or _has_tensor(kwargs.values()))
            if not self._wanted(fwd):
                structure = self.enabled and self.L0 and self._in_token_range()
                # its backward may still be wanted (list names it, data_mode backward)
                backward = self.enabled and bw and self._bw_listed(base + ".backward", self._mix_listed())
                if not structure and not backward:
                    return orig(*args, **kwargs)
                if structure:
                    self.session.add_structure(fwd, parent)
                return self._call_api(orig, args, kwargs, base + ".backward", parent, bw, record=backward)
            # a call that writes into its arguments: read them (copies) before it does
            rec = self._forward_inputs(fwd, args, kwargs, self._encode_copy if _mutates(api_key) else None)
            stack = capture_stack() if self.config.stack else None
            out = self._call_api(orig, args, kwargs, base + ".backward", parent, bw, record=True)
            if api_key.startswith("MintDistributed."):
                self._collective_output(rec, fwd, api_key, args, kwargs, out)
            else:
                self._forward_output(rec, fwd, out)
            if self._keep(rec, fwd):
                self.session.add_record(fwd, rec, stack=stack, parent=parent)
            return out
        finally:
            GUARD.inside = False

    def _mix_listed(self) -> bool:
        """mix with a ``list``: a backward may sit in a listed module's backward (known only then)."""
        return self.config.level == "mix" and bool(self.config.list)

    def _collective_output(self, rec: dict, fwd: str, api_key: str, args: tuple, kwargs: dict, out: Any) -> None:
        """mint.distributed collectives write into their arguments: the output entries are the
        arguments after the call (as msprobe does), an async call waited for first."""
        _, want_out = self._io("forward")
        if not want_out or self.config.task == "structure":
            return
        if kwargs.get("async_op") or api_key.rpartition(".")[2] in ("isend", "irecv", "batch_isend_irecv"):
            for handle in (out if isinstance(out, (list, tuple)) else (out,)):
                if hasattr(handle, "wait"):
                    handle.wait()
        save = self.encoder.wants_tensors(fwd)
        values = list(args) + list(kwargs.values())
        rec["output"] = [self._encode_copy(v, f"{fwd}.output.{i}", save) for i, v in enumerate(values)]

    def _encode_copy(self, value: Any, prefix: str, save: bool) -> Any:
        """An entry of the value as it is now (tensors, also in lists such as all_gather's, copied)."""
        if isinstance(value, Tensor):
            return self.encoder.tensor(value, prefix, save, snapshot=True)
        if isinstance(value, (list, tuple)) and _has_tensor(value):
            return [self._encode_copy(v, f"{prefix}.{i}", save) for i, v in enumerate(value)]
        return self.encoder.encode(value, prefix, save)

    def _encode_output(self, out: Any, prefix: str, save: bool) -> list:
        return self.encoder.encode_output(out, prefix, save)

    def _call_api(self, orig, args: tuple, kwargs: dict, bwd: str, parent: Optional[str], bw: bool,
                  record: bool):
        if not bw:
            return orig(*args, **kwargs)
        cell = _ApiCell(orig)
        dumper = weakref.ref(self)
        gen = self._gen

        def hook(_cell, grad_input, grad_output):
            d = dumper()
            if d is None or not d._live(gen):
                return None
            bw_parent = d.bw_stack[-1] if d.bw_stack else None
            if not record or not d._wanted(bwd, d._inside_listed_backward(), live=True):
                if d.L0:
                    d.session.add_structure(bwd, bw_parent)
                return None
            d._record_backward(bwd, grad_output, grad_input, bw_parent)
            return None

        cell.register_backward_hook(hook)
        return cell(*args, **kwargs)

    # ------------------------------------------------------------- Primitives
    def _hook_primitives(self, model) -> None:
        seen = {id(p) for p, _ in self._primitives}
        for _, cell in model.cells_and_names():
            for attr, value in list(vars(cell).items()):
                if not isinstance(value, Primitive) or id(value) in seen:
                    continue
                seen.add(id(value))
                self._wrap_primitive(value, f"Primitive.{attr}.{type(value).__name__}")

    def _wrap_primitive(self, prim: Primitive, api_key: str) -> None:
        cls = type(prim)
        dumper = weakref.ref(self)
        orig_call = cls.__call__

        def __call__(p, *args, **kwargs):
            d = dumper()
            if d is None or not d.enabled or getattr(GUARD, "inside", False) or not GUARD.__dict__.get("on", True):
                return orig_call(p, *args, **kwargs)
            return d._on_hooked_call(lambda *a, **k: orig_call(p, *a, **k), api_key, args, kwargs)

        sub = type(cls.__name__, (cls,), {"__call__": __call__, "__msprobe_wrapped__": True,
                                           "__module__": cls.__module__})
        prim.__class__ = sub
        self._primitives.append((prim, cls))

    def _on_hooked_call(self, call, api_key: str, args: tuple, kwargs: dict, head: tuple = ()):
        """A Primitive or jit call: forward record around ``call(*head, *args, **kwargs)``, gradients
        through ops.HookBackward (``head``: leading arguments not recorded, a jit Cell's self)."""
        if self.token_range is not None and not self._in_token_range():
            return call(*head, *args, **kwargs)
        GUARD.inside = True
        try:
            base, _ = self.session.next_api_name(api_key)
            fwd, bwd = base + ".forward", base + ".backward"
            parent = self._parent()
            wanted = self._wanted(fwd)
            bw = self._bw_wanted() and _has_tensor(args)
            if not wanted:
                if self.enabled and self.L0:
                    self.session.add_structure(fwd, parent)
                if not (self.enabled and bw and self._bw_listed(bwd, self._mix_listed())):
                    return call(*head, *args, **kwargs)
                out = call(*head, *self._hook_grads(args, bwd, "output"), **kwargs)  # its backward is wanted
                return self._hook_grads(out, bwd, "input")
            rec = self._forward_inputs(fwd, args, kwargs)
            stack = capture_stack() if self.config.stack else None
            if bw:
                args = self._hook_grads(args, bwd, "output")
            out = call(*head, *args, **kwargs)
            self._forward_output(rec, fwd, out)
            if self._keep(rec, fwd):
                self.session.add_record(fwd, rec, stack=stack, parent=parent)
            if bw:
                out = self._hook_grads(out, bwd, "input")
            return out
        finally:
            GUARD.inside = False

    def _hook_grads(self, values: Any, bwd: str, side: str) -> Any:
        """Route the tensors of ``values`` through ops.HookBackward: their gradients extend the
        backward record's ``side`` list as they arrive."""
        dumper = weakref.ref(self)
        captured: list = []
        gen = self._gen

        def hook(grad):
            d = dumper()
            if d is None or not d._live(gen):
                return None
            captured.extend(grad if isinstance(grad, (tuple, list)) else (grad,))
            parent = d.bw_stack[-1] if d.bw_stack else None
            if d.config.task == "structure" or not d._wanted(bwd, d._inside_listed_backward(), live=True):
                if d.L0:
                    d.session.add_structure(bwd, parent)
                return None
            GUARD.inside = True
            try:
                want_in, want_out = d._io("backward")
                if not (want_in if side == "input" else want_out):
                    return None
                save = d.encoder.wants_tensors(bwd)
                rec = d.session.record(bwd)
                rec = dict(rec) if isinstance(rec, dict) else {}
                entries = [d.encoder.encode(g, f"{bwd}.{side}.{i}", save) for i, g in enumerate(captured)]
                new = {"input": rec.get("input", []), "output": rec.get("output", [])}
                new[side] = entries
                if not want_in:
                    new.pop("input")
                if not want_out:
                    new.pop("output")
                if d._keep(new, bwd):
                    d.session.add_record(bwd, new, parent=parent)
            finally:
                GUARD.inside = False
            return None

        if isinstance(values, Tensor):
            return ops.HookBackward(hook)(values)
        if isinstance(values, (tuple, list)):
            hooked = [ops.HookBackward(hook)(v) if isinstance(v, Tensor) and _floating(v) else v for v in values]
            return type(values)(hooked) if isinstance(values, tuple) else hooked
        return values

    # -------------------------------------------------------------------- jit
    def _patch_jit(self) -> None:
        """Calls of ``mindspore.jit`` functions and Cells (compiled graphs, whose inside no hook sees)
        are recorded as ``Jit.<function or Cell class>.<n>``."""
        if self._jit_saved is not None:
            return
        executor = import_first(("mindspore.common.api", "_JitExecutor"),
                                ("mindspore.common.api", "_MindsporeFunctionExecutor"))
        if executor is None:
            return
        orig = executor.__call__
        dumper = weakref.ref(self)

        def __call__(ex, *args, **kwargs):
            d = dumper()
            if d is None or not d.enabled or getattr(GUARD, "inside", False) or not GUARD.__dict__.get("on", True):
                return orig(ex, *args, **kwargs)
            if args and isinstance(args[0], nn.Optimizer):  # the optimizer's own jit step: not the model's
                return orig(ex, *args, **kwargs)
            name = getattr(getattr(ex, "fn", None), "__name__", None) or "JitFunction"
            head: tuple = ()
            if args and isinstance(args[0], nn.Cell) and name == "construct":
                name, head, args = type(args[0]).__name__, args[:1], args[1:]
            return d._on_hooked_call(lambda *a, **k: orig(ex, *a, **k), f"Jit.{name}", args, kwargs, head)

        executor.__call__ = __call__
        self._jit_saved = (executor, orig)

    def _unpatch_jit(self) -> None:
        if self._jit_saved is not None:
            executor, orig = self._jit_saved
            executor.__call__ = orig
            self._jit_saved = None

    def _patch_pijit(self) -> None:
        """``mindspore.jit(capture_mode="bytecode")`` functions and Cells run as plain PyNative code
        while the dumper is on at L1/mix, so their APIs are recorded one by one (the documented
        behaviour: the decorated part is "restored to a dynamic graph"; 26.2.0 does the same by
        making the capture context a no-op)."""
        if self._pijit_saved is not None:
            return
        ctx = import_first(*PIJIT_CONTEXT)
        if ctx is None:
            return
        enter, leave = ctx.__enter__, ctx.__exit__
        dumper = weakref.ref(self)
        eager: list = []  # per entered context: True when it was not entered (runs eagerly)

        def __enter__(c):
            d = dumper()
            skip = d is not None and d.enabled and d.L1
            eager.append(skip)
            return None if skip else enter(c)

        def __exit__(c, *exc):
            if eager and eager.pop():
                return None
            return leave(c, *exc)

        ctx.__enter__, ctx.__exit__ = __enter__, __exit__
        self._pijit_saved = (ctx, enter, leave)

    def _unpatch_pijit(self) -> None:
        if self._pijit_saved is not None:
            ctx, enter, leave = self._pijit_saved
            ctx.__enter__, ctx.__exit__ = enter, leave
            self._pijit_saved = None

    # ------------------------------------------------------------------ Cells
    def _hook_models(self, model: Any) -> None:
        models = self._add_models(model, nn.Cell, "mindspore.nn.Cell", self._cell_handles)
        if models is None:
            return
        multi = len(models) > 1
        graph = _graph_mode()
        points = _device_target() == "CPU"  # jit Cells elsewhere: PyNative hooks on the Cell, no split
        for idx, m in enumerate(models):
            if self.L1:
                self._hook_primitives(m)
            if not self.L0:
                continue
            in_jit: list = []  # paths of jit Cells (PyNative): they and their Cells run compiled
            for path, sub in m.cells_and_names():
                if sub is m or not path:
                    continue
                key = f"Cell.{idx}.{path}.{type(sub).__name__}" if multi else f"Cell.{path}.{type(sub).__name__}"
                if points and not graph and not in_jit_cell(path, in_jit) and is_jit_cell(sub):
                    in_jit.append(path)
                if graph or in_jit_cell(path, in_jit):
                    self._graph_dump(split=not graph).wrap(sub, key)
                else:
                    self._hook_cell(sub, key)

    def _graph_dump(self, split: bool):
        """The dump points' owner; ``split`` (jit Cells in PyNative): the documented layout, jit
        Cells' data under ``graph/``, everything else under ``pynative/``, each with its own session."""
        if self._graph is None:
            session, encoder = self.session, self.encoder
            if split:
                session = self._new_session("graph")
                self.session = self._new_session("pynative")
                self.encoder.session = self.session
                encoder = Encoder(session, save_tensors=self.config.task == "tensor",
                                  summary_mode=self.config.summary_mode, tensor_list=self.config.tensor_list)
                encoder.check_overflow = self.encoder.check_overflow
            self._graph = GraphCellDump(self, session, encoder)
        return self._graph

    def _new_session(self, sub: str) -> DumpSession:
        cfg = dataclasses.replace(self.config, dump_path=_join(self.config.dump_path, sub))
        session = DumpSession(cfg, "mindspore", fetch_stats=fetch_stats, render_stack=render_stack,
                              get_rank=_get_rank)
        session.set_step(self.session.current_step)
        return session

    def _hook_cell(self, cell: nn.Cell, key: str) -> None:
        calls: list = []  # forward calls in flight: (fwd, rec, parent, stack) or None
        done: list = []  # finished forward indexes, popped by the backward pass (LIFO)
        dumper = weakref.ref(self)

        def pre(c, args, kwargs):
            d = dumper()
            calls.append(None if d is None else d._module_forward_begin(key, args, kwargs))
            return None

        running: list = []  # backward calls in flight: (backward name, recorded)

        def post(c, args, kwargs, output):
            d = dumper()
            item = calls.pop() if calls else None
            if item is not None and d is not None:
                if _grad_recording():
                    done.append((int(item[0].rsplit(".", 1)[1]), d._gen))
                d._module_forward_end(item, c, key, output)
            return None

        def bw_pre(c, grad_output):
            d = dumper()
            if d is None:
                return None
            n, gen = done.pop() if done else (0, -1)
            live = d._live(gen)  # the forward ran while this step was dumped (also before a stop())
            bwd = f"{key}.backward.{n}"
            running.append((bwd, live))
            if live:
                d._scope_enter(bwd)
                d.bw_stack.append(bwd)
            return None

        def bw_post(c, grad_input, grad_output):
            d = dumper()
            if d is None:
                return None
            if running:
                bwd, live = running.pop()
            else:  # no pre hook ran for it
                n, gen = done.pop() if done else (0, -1)
                bwd, live = f"{key}.backward.{n}", d._live(gen)
            if not live:
                return None
            if d.bw_stack and d.bw_stack[-1] == bwd:
                d.bw_stack.pop()
            d._flush_param_grads(key + ".parameters_grad")
            d._module_backward(bwd, bwd.replace(".backward.", ".forward."), grad_output, grad_input, live=True)
            return None

        self._cell_handles.append(cell.register_forward_pre_hook(pre, with_kwargs=True))
        self._cell_handles.append(cell.register_forward_hook(post, with_kwargs=True))
        if self.config.backward_enabled:
            self._cell_handles.append(cell.register_backward_pre_hook(bw_pre))
            self._cell_handles.append(cell.register_backward_hook(bw_post))

    def _flush_param_grads(self, name: Optional[str] = None) -> None:
        for key in ([name] if name is not None else list(self._pgrads)):
            rec = self._pgrads.pop(key, None)
            if rec and self._keep(rec, key):
                self.session.add_record(key, rec, parent=None, construct=False)

    @staticmethod
    def _module_params(cell: nn.Cell) -> Any:
        return cell._params.items()

    def _hook_param_grads(self, cell: nn.Cell, key: str) -> None:
        if not self.config.backward_enabled:
            return
        self._pgrad_seen.add(id(cell))  # this step dumps the Cell's parameter gradients
        if getattr(cell, "_msprobe_pgrad_hooked", False):
            return
        object.__setattr__(cell, "_msprobe_pgrad_hooked", True)
        name = f"{key}.parameters_grad"
        dumper = weakref.ref(self)
        for pname, p in cell._params.items():
            if not isinstance(p, Parameter) or not p.requires_grad:
                continue

            def hook(grad, pname=pname, cell_id=id(cell)):  # noqa: B008 - bound now, per parameter
                d = dumper()
                if d is None or cell_id not in d._pgrad_seen or not d._wanted(name, live=True):
                    return None
                GUARD.inside = True
                try:
                    save = d.encoder.wants_tensors(name)
                    # kept until the Cell's backward hook, which writes it just before the backward record
                    d._pgrads.setdefault(name, {})[pname] = [d.encoder.encode(grad, f"{name}.{pname}", save)]
                finally:
                    GUARD.inside = False
                return None

            self._param_handles.append(p.register_hook(hook))

    # ------------------------------------------------------------------ debug
    def save(self, variable: Any, name: str, save_backward: bool = True) -> None:
        self._save_debug(variable, name, save_backward)

    @staticmethod
    def _grad_hookable(value: Any) -> bool:
        return isinstance(value, Tensor) and _floating(value)

    @staticmethod
    def _on_grad(tensor: Any, fn: Any) -> None:
        tensor.register_hook(fn)


def _sync() -> None:
    wait = getattr(_EXECUTOR, "sync", None)
    if wait is not None:
        try:
            wait()
        except Exception:  # noqa: BLE001 - MindSpore may raise anything here: never break training for the dump
            pass


def _warn_precompiled(model: Any, hooked: list) -> None:
    """GRAPH_MODE: a model Cell called (hence compiled: MindSpore keeps the phases in the Cell's
    compile cache) before start(model) keeps its compiled graph, without dump points; said at
    once. A function or Model.train's network compiled before is seen at stop() instead."""
    models = list(model) if isinstance(model, (list, tuple)) else [model]
    for m in models:
        if isinstance(m, nn.Cell) and not any(m is h for h in hooked) and getattr(m, "_compile_cache", None):
            warnings.warn(
                f"msprobe: the Cell {type(m).__name__} was compiled (run in GRAPH_MODE) before "
                "debugger.start(model): its compiled graph has no dump points and its Cells will not be "
                "dumped; call debugger.start(model) before the first step", RuntimeWarning, stacklevel=4)


def in_jit_cell(path: str, jit_paths: list) -> bool:
    return any(path == p or path.startswith(p + ".") for p in jit_paths)


def _join(root: str, sub: str) -> str:
    return root.rstrip("/") + "/" + sub


_DIST_PREFIXES = ("Distributed.", "MintDistributed.")


def _floating(t: Tensor) -> bool:
    return t.dtype in (mindspore.float16, mindspore.float32, mindspore.float64, mindspore.bfloat16)


def _mutates(api_key: str) -> bool:
    """In-place APIs (``add_``, ``__iadd__``, ``assign``, mint.distributed collectives...) write
    into their arguments."""
    api = api_key.rpartition(".")[2]
    return api_key.startswith("MintDistributed.") or (api.endswith("_") and not api.endswith("__")) or \
        api.startswith("__i") or api in ("assign", "assign_add", "assign_sub", "scatter_update",
                                         "scatter_nd_update", "copy_")


def _synchronize() -> None:
    """Wait for the graphs in flight (their dump points' callbacks are asynchronous)."""
    try:
        import mindspore.runtime

        mindspore.runtime.synchronize()
    except Exception:  # noqa: BLE001 - no such call, or no device stream (CPU): nothing to wait for
        pass
