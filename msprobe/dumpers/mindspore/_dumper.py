"""The MindSpore adapter (PyNative): API, Primitive and Cell hooks feeding the framework-neutral DumpSession.

* APIs (``ops``/``Tensor``/``mint``/... listed in support_wrap_ops.yaml): the wrapper
  records the forward call; when MindSpore is recording a gradient, the call runs inside a
  throw-away Cell whose backward hook gives the backward record (gradients of the outputs as
  ``input``, of the tensor arguments as ``output``, ``null`` where an argument gets none).
* Primitives held by the cells of ``start(model=...)`` (``self.conv2d = ops.Conv2D(...)``):
  the instance's class is swapped for a subclass whose ``__call__`` records
  ``Primitive.<attribute>.<Class>.<n>``; their gradients arrive through ``ops.HookBackward``
  on the inputs and outputs, in arrival order, as the real tool records them.
* Cells (L0/mix): forward pre/post hooks; their backward observed on MindSpore's autograd graph
  (_observer.py: pre hooks on the outputs' nodes, post hooks on the Cell's own nodes, no node added),
  and Parameter hooks for ``parameters_grad``.
"""
from __future__ import annotations

import warnings
import weakref
from typing import Any, Optional, cast

import mindspore
from mindspore import Parameter, Tensor, nn, ops
from mindspore.ops import Primitive

from msprobe.dumpers.adapter import ApiCall, ApiCaller, FrameworkAdapter
from msprobe.dumpers.config import DumpConfig
from msprobe.dumpers.control import DumperCore, ModuleForwardHooks, core_attribute
from msprobe.dumpers.mindspore import _observer
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


class MindSporeDumper(FrameworkAdapter):
    """Owns the patcher, the Primitive/Cell hooks and the session for one process (through its
    :class:`DumperCore`, whose framework adapter it is)."""

    # for the dumper's users (tests, tools): the adapter itself asks the core (DumperCore's public methods)
    session = core_attribute("session")
    enabled = core_attribute("enabled")
    framework = "mindspore"
    encoder_cls = Encoder
    patcher_cls = ApiPatcher
    guard = GUARD
    fetch_stats = staticmethod(fetch_stats)
    get_rank = staticmethod(_get_rank)

    def __init__(self, config: DumpConfig):
        if config.level == "L2":
            raise ConfigError("level 'L2' (kernel dump) needs MindSpore on Ascend hardware "
                              f"(device_target 'Ascend'); this process runs on {_device_target()!r}")
        self.config = config
        self.core = core = DumperCore(self, config)
        # the collaborators the core built of the classes above
        self.encoder, self.patcher = cast(Encoder, core.encoder()), core.patcher()
        self.cell_handles: list = []
        self.param_handles: list = []
        self.calls = _HookedCalls(self)  # Primitive and jit calls
        self._jit = _JitPatches(self)
        self.pending_param_grads: dict = {}  # parameters_grad records waiting for their Cell's backward hook
        self._graph: Optional[GraphCellDump] = None  # GraphCellDump: the Cells dumped inside compiled graphs (_graph.py)
        self._warned_points = False
        # the Cells' backward observed without changing the graph (_observer.py); None: this MindSpore
        # shows no autograd graph to Python, and MindSpore's Cell backward hooks are used instead
        self.observer = _observer.CellObserver(_EXECUTOR) if _observer.SUPPORTED else None
        self._reroutes = False  # a Cell's backward is hooked by MindSpore's hooks: said once at start(), see _warn_reroute
        self._warned_reroute = False
        if core.dumps_apis() and not _graph_mode():
            # the API wrappers go in when the debugger is created, as 26.2.0 does: a Cell built after it
            # that keeps an op in an attribute (self.act = ops.gelu) holds the wrapper; they pass
            # straight through until start()
            core.patch_apis(self.on_api)

    # ---------------------------------------------------------------- control
    def start(self, model: Any = None, token_range: Optional[list] = None) -> None:
        config, core = self.config, self.core
        graph = _graph_mode()
        if graph:  # graphs run before start (outside the dump) finish their callbacks first
            _synchronize()
        _check_graph_mode(config, graph, token_range)
        core.set_token_range(model, token_range)
        if model is not None:
            if graph:
                _warn_precompiled(model, core.is_hooked)
            self._hook_models(model)
            self._warn_reroute()
        elif core.dumps_modules() and not core.has_models():
            raise ConfigError(f"level {config.level!r} dumps Cells and needs start(model=...)")
        if not core.begin():
            return
        split = self.split_session
        if split is not None:
            split.set_step(core.current_step())
            split.claim()
        if core.dumps_apis():
            core.patch_apis(self.on_api)
            self._jit.patch_jit()
            self._jit.patch_pijit()
        core.turn_on()

    def stop(self) -> None:
        self.core.stop()

    def before_stop(self) -> None:
        if self._graph is not None:
            _sync()  # the points' callbacks run as the (asynchronous) executor reaches them
            self._warn_no_points()

    def flush_records(self) -> None:
        if self.observer is not None:
            self.observer.flush_all()
        if self._graph is not None:
            self._graph.flush_param_grads()
        self.flush_param_grads()

    def after_publish(self) -> None:
        if self._graph is not None:
            self._graph.reset()
        if self.split_session is not None:
            self.split_session.publish()

    @property
    def split_session(self) -> Optional[DumpSession]:
        """The ``graph/`` session of the jit-Cell split (spec/PRODUCER.md §23.3); None without the split."""
        graph = self._graph
        return graph.own_session if graph is not None else None

    def _warn_reroute(self) -> None:
        """PyNative L0/mix with the backward dumped: MindSpore's Cell backward hooks route a Cell's
        inputs and outputs through an identity node of their own, and a tensor used both inside and
        outside the Cell then gets its gradient summed in another order (spec/PRODUCER.md §20 item 43,
        measured by tests/dumpers/mindspore/ms_test_observer.py): said once, at the first start()."""
        if not self._reroutes or self._warned_reroute:
            return
        self._warned_reroute = True
        warnings.warn(
            f"msprobe: level {self.config.level!r} records the Cells' backward through MindSpore's Cell backward "
            "hooks, which route each Cell's inputs and outputs through an identity node: a tensor used both inside "
            "and outside a Cell (a norm's input that also feeds a residual) gets its gradient summed in another "
            "order, so the losses, gradients and parameters may differ from a run without the dump in their last "
            "bits (spec/PRODUCER.md §20 item 43). Level 'L1', or data_mode ['forward'], hooks no Cell's backward",
            RuntimeWarning,
            stacklevel=4)

    def _warn_no_points(self) -> None:
        """GRAPH_MODE: a dumped step in which no dump point ran means the model ran from a graph
        compiled before start(model) (or did not run): said once, instead of an empty dump."""
        graph = self._graph
        if graph is None:  # called only once the graph dump exists (end of step)
            return
        if graph.fired or self.split_session is not None or not _graph_mode() or self._warned_points:
            return
        self._warned_points = True
        cells = [key for key in graph.keys() if key]
        warnings.warn(
            f"msprobe: no Cell of the model was dumped in step {self.core.current_step()} (GRAPH_MODE level L0): "
            f"no dump point of {', '.join(cells[:3]) + (', ...' if len(cells) > 3 else '')} ran between start() and "
            "stop(). A graph compiled before debugger.start(model) has no dump points and keeps running "
            "undumped: call debugger.start(model) before the model (or the function or Model.train that runs "
            "it) is first run", RuntimeWarning, stacklevel=6)

    def step(self) -> None:
        """Ends the step: the backward of the calls recorded before ``stop()`` is in it (the
        docs: stop before the backward, step after it)."""
        self.stop()
        core = self.core
        if self.observer is not None:
            self.observer.flush_all()
        self.flush_param_grads()
        core.end_step(warn=self._graph is None)  # (GRAPH_MODE says it itself: _warn_no_points)
        if self.split_session is not None:
            self.split_session.end_step()
        core.leave_all_modules()

    def close(self) -> None:
        self.stop()
        core = self.core
        if self._graph is None:  # a step ended by the process, not by step(): said as step() says it
            core.warn_if_nothing()
        core.unpatch_apis()
        self._jit.unpatch_jit()
        self._jit.unpatch_pijit()
        for handle in self.cell_handles + self.param_handles:
            try:
                handle.remove()
            except Exception:  # noqa: BLE001 - MindSpore may raise anything here: never break training for the dump
                pass
        self.cell_handles = []
        self.param_handles = []
        self.calls.unwrap_primitives()
        if self._graph is not None:
            self._graph.unwrap()
        if self.split_session is not None:
            self.split_session.close()
        core.close()

    def bw_wanted(self) -> bool:
        return self.config.backward_enabled and _grad_recording()

    # ------------------------------------------------------------------- APIs
    def on_api(self, orig, api_key: str, args: tuple, kwargs: dict):
        """The API wrappers' callback: ``orig(*args, **kwargs)`` recorded."""
        return self.core.record_api(self, orig, api_key, args, kwargs)

    def is_collective(self, api_key: str) -> bool:
        return api_key.startswith(_DIST_PREFIXES)  # collectives: forward-only records

    def backward_possible(self, call: ApiCall) -> bool:
        return self.bw_wanted() and (_has_tensor(call.args) or _has_tensor(call.kwargs.values()))

    def input_encoder(self, call: ApiCall) -> Any:
        # a call that writes into its arguments: read them (copies) before it does
        return self._encode_copy if _mutates(call.api_key) else None

    def call_api(self, call: ApiCall) -> Any:
        return self._call_api(call.orig, call.args, call.kwargs, call.bwd, call.backward,
                              record=call.recorded or call.listed)

    def collective_output(self, call: ApiCall, out: Any) -> bool:
        if _writes_arguments(call.api_key):
            self._collective_output(call.rec, call.fwd, call.api_key, call.args, call.kwargs, out)
        else:
            self.core.forward_output(call.rec, call.fwd, out)
        return True

    def _collective_output(self, rec: dict, fwd: str, api_key: str, args: tuple, kwargs: dict, out: Any) -> None:
        """mint.distributed (and in-place ops.communication) collectives write into their arguments: the
        output entries are the arguments after the call (as msprobe does), an async call waited for first."""
        _, want_out = self.core.io("forward")
        if not want_out or self.config.task == "structure":
            return
        if kwargs.get("async_op") or api_key.rpartition(".")[2] in ("isend", "irecv", "batch_isend_irecv"):
            for handle in (out if isinstance(out, (list, tuple)) else (out,)):
                if hasattr(handle, "wait"):
                    handle.wait()
        save = self.encoder.wants_tensors(fwd)
        values = list(args) + list(kwargs.values())
        rec["output"] = [self._encode_copy(value, f"{fwd}.output.{i}", save) for i, value in enumerate(values)]

    def _encode_copy(self, value: Any, prefix: str, save: bool) -> Any:
        """An entry of the value as it is now (tensors, also in lists such as all_gather's, copied)."""
        if isinstance(value, Tensor):
            return self.encoder.tensor(value, prefix, save, snapshot=True)
        if isinstance(value, (list, tuple)) and _has_tensor(value):
            return [self._encode_copy(item, f"{prefix}.{i}", save) for i, item in enumerate(value)]
        return self.encoder.encode(value, prefix, save)

    def encode_output(self, out: Any, prefix: str, save: bool) -> list:
        return self.encoder.encode_output(out, prefix, save)

    def _call_api(self, orig, args: tuple, kwargs: dict, bwd: str, backward: bool, record: bool):
        if not backward:
            return orig(*args, **kwargs)
        cell = _ApiCell(orig)
        hook = self.core.api_backward_hook(bwd, record)
        observer, order = self.observer, next(_observer.ORDER)

        def on_backward(_cell, grad_input, grad_output):
            if observer is not None:  # the Cell calls begun after this one are written first
                observer.api_event(order)
            return hook(grad_input, grad_output)

        cell.register_backward_hook(on_backward)
        return cell(*args, **kwargs)

    # ------------------------------------------------------------------ Cells
    def _hook_models(self, model: Any) -> None:
        core = self.core
        models = core.add_models(model, nn.Cell, "mindspore.nn.Cell", self.cell_handles)
        if models is None:
            return
        multi = len(models) > 1
        graph = _graph_mode()
        points = _device_target() == "CPU"  # jit Cells elsewhere: PyNative hooks on the Cell, no split
        for index, root in enumerate(models):
            if core.dumps_apis():
                self.calls.hook_primitives(root)
            if not core.dumps_modules():
                continue
            in_jit: list = []  # paths of jit Cells (PyNative): they and their Cells run compiled
            for path, sub in root.cells_and_names():
                if sub is root or not path:
                    continue
                key = f"Cell.{index}.{path}.{type(sub).__name__}" if multi else f"Cell.{path}.{type(sub).__name__}"
                if points and not graph and not in_jit_cell(path, in_jit) and is_jit_cell(sub):
                    in_jit.append(path)
                if graph or in_jit_cell(path, in_jit):
                    self._graph_dump(split=not graph).wrap(sub, key)
                else:
                    _CellHooks(self, sub, key)
                    self._reroutes = self._reroutes or (self.config.backward_enabled and self.observer is None)

    def _graph_dump(self, split: bool):
        """The dump points' owner; ``split`` (jit Cells in PyNative): the documented layout, jit
        Cells' data under ``graph/``, everything else under ``pynative/``, each with its own session."""
        if self._graph is None:
            core = self.core
            own = None
            if split:
                own = core.new_session("graph")
                core.write_under("pynative")
            self._graph = GraphCellDump(self, own)
        return self._graph

    def flush_param_grads(self, name: Optional[str] = None) -> None:
        """Write the waiting parameters_grad records (``name``'s only)."""
        core = self.core
        for key in ([name] if name is not None else list(self.pending_param_grads)):
            rec = self.pending_param_grads.pop(key, None)
            if rec:
                core.record(key, rec, parent=None, construct=False)

    def module_params(self, module: nn.Cell) -> Any:
        return module._params.items()

    def hook_param_grads(self, module: nn.Cell, key: str) -> None:
        if not self.config.backward_enabled:
            return
        self.core.note_param_grads(module)  # this step dumps the Cell's parameter gradients
        if getattr(module, "_msprobe_pgrad_hooked", False):
            return
        object.__setattr__(module, "_msprobe_pgrad_hooked", True)
        name = f"{key}.parameters_grad"
        dumper = weakref.ref(self)
        for pname, param in module._params.items():
            if not isinstance(param, Parameter) or not param.requires_grad:
                continue

            def hook(grad, pname=pname, cell_id=id(module)):  # noqa: B008 - bound now, per parameter
                alive = dumper()
                if alive is None or not alive.core.param_grads_noted(cell_id) or not alive.core.wanted(name, True):
                    return None
                GUARD.inside = True
                try:
                    save = alive.encoder.wants_tensors(name)
                    # kept until the Cell's backward hook, which writes it just before the backward record
                    alive.pending_param_grads.setdefault(name, {})[pname] = [
                        alive.encoder.encode(grad, f"{name}.{pname}", save)]
                finally:
                    GUARD.inside = False
                return None

            self.param_handles.append(param.register_hook(hook))

    # ------------------------------------------------------------------ debug
    def save(self, variable: Any, name: str, save_backward: bool = True) -> None:
        self.core.save_debug(variable, name, save_backward)

    def grad_hookable(self, value: Any) -> bool:
        return isinstance(value, Tensor) and _floating(value)

    def on_grad(self, tensor: Any, hook: Any) -> None:
        tensor.register_hook(hook)


class _HookedCalls(ApiCaller):
    """The calls recorded outside the API wrappers: the Primitives held by the model's Cells
    (``Primitive.<attribute>.<Class>.<n>``) and ``mindspore.jit`` functions and Cells
    (``Jit.<name>.<n>``); their gradients arrive through ``ops.HookBackward``."""

    def __init__(self, dumper: MindSporeDumper) -> None:
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
        return dumper is not None and dumper.bw_wanted() and _has_tensor(call.args)

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
            hooked = [ops.HookBackward(hook)(value) if isinstance(value, Tensor) and _floating(value) else value
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


class _JitPatches:
    """``mindspore.jit``'s executor and its bytecode-capture context, patched while a dumper runs
    at L1/mix (and restored at close)."""

    def __init__(self, dumper: MindSporeDumper) -> None:
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


class _CellHooks(ModuleForwardHooks):
    """One Cell's hooks (L0/mix in PyNative): forward pre/post (its records) and, with the backward
    dumped, the observer of each call's backward (_observer.py: tensor hooks on its outputs, post hooks
    on its own nodes; its record after its parameters_grad). A MindSpore without the autograd graph in
    Python gets MindSpore's Cell backward pre/post hooks instead (identity nodes: start() warns)."""

    def __init__(self, dumper: MindSporeDumper, cell: nn.Cell, key: str) -> None:
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
            observe = self.calls[-1] is not None and _grad_recording()
            self.inputs.append(self.observer.inputs(args, kwargs or {}) if observe else None)
        return None

    def post(self, cell, args, kwargs, output):
        dumper = self.dumper()
        item = self.calls.pop() if self.calls else None
        inputs = self.inputs.pop() if self.inputs else None
        if item is not None and dumper is not None:
            if self.observer is None and _grad_recording():
                self.done.append((int(item[0].rsplit(".", 1)[1]), dumper.core.generation()))
            dumper.core.module_forward_end(item, cell, self.key, output)
            if inputs is not None:
                self._observe(dumper, item[0], inputs, output)
        return None

    def _observe(self, dumper: MindSporeDumper, fwd: str, inputs: Any, output: Any) -> None:
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


def _check_graph_mode(config: DumpConfig, graph: bool, token_range: Optional[list]) -> None:
    """What GRAPH_MODE refuses at ``start()``: levels other than L0/debug, L0 off CPU, token_range."""
    if not graph:
        return
    if config.level not in ("L0", "debug"):
        raise ConfigError(
            f"level {config.level!r} dumps MindSpore in PyNative mode only: this process runs in GRAPH_MODE, "
            "where msprobe dumps level 'L0' (Cells) and 'L2' (kernels, Ascend only); use level 'L0' or "
            "call mindspore.set_context(mode=mindspore.PYNATIVE_MODE)")
    if config.level == "L0" and _device_target() != "CPU":
        raise ConfigError(  # the dump points are pyfunc Custom ops: MindSpore runs those on CPU
            f"GRAPH_MODE level 'L0' is dumped on CPU only (device_target 'CPU'); this process runs on "
            f"{_device_target()!r}, where msprobe's own TensorDump-based dump applies")
    if token_range is not None:
        raise ConfigError("token_range needs PyNative mode (it counts the model's forward calls through "
                          "a hook, which GRAPH_MODE does not run)")


def _sync() -> None:
    wait = getattr(_EXECUTOR, "sync", None)
    if wait is not None:
        try:
            wait()
        except Exception:  # noqa: BLE001 - MindSpore may raise anything here: never break training for the dump
            pass


def _warn_precompiled(model: Any, hooked: Any) -> None:
    """GRAPH_MODE: a model Cell called (hence compiled: MindSpore keeps the phases in the Cell's
    compile cache) before start(model) keeps its compiled graph, without dump points; said at
    once. A function or Model.train's network compiled before is seen at stop() instead."""
    models = list(model) if isinstance(model, (list, tuple)) else [model]
    for m in models:
        if isinstance(m, nn.Cell) and not hooked(m) and getattr(m, "_compile_cache", None):
            warnings.warn(
                f"msprobe: the Cell {type(m).__name__} was compiled (run in GRAPH_MODE) before "
                "debugger.start(model): its compiled graph has no dump points and its Cells will not be "
                "dumped; call debugger.start(model) before the first step", RuntimeWarning, stacklevel=4)


def in_jit_cell(path: str, jit_paths: list) -> bool:
    return any(path == p or path.startswith(p + ".") for p in jit_paths)


_DIST_PREFIXES = ("Distributed.", "MintDistributed.", "Communication.")
_IS_INPLACE = import_first(("mindspore.ops.function.comm_func", "is_inplace_func"))


def _writes_arguments(api_key: str) -> bool:
    """A communication call that writes into its arguments: mint.distributed's always, ops.communication's
    while MindSpore's ``set_comm_ops_inplace`` leaves them in place (its default), asked now."""
    if api_key.startswith("MintDistributed."):
        return True
    if not api_key.startswith("Communication."):
        return False
    if _IS_INPLACE is None:
        return True
    try:
        return bool(_IS_INPLACE(api_key.split(".")[1]))
    except Exception:  # noqa: BLE001 - MindSpore may raise anything here: never break training for the dump
        return True


def _floating(t: Tensor) -> bool:
    return t.dtype in (mindspore.float16, mindspore.float32, mindspore.float64, mindspore.bfloat16)


def _mutates(api_key: str) -> bool:
    """In-place APIs (``add_``, ``__iadd__``, ``assign``, mint.distributed collectives...) write
    into their arguments."""
    api = api_key.rpartition(".")[2]
    return _writes_arguments(api_key) or (api.endswith("_") and not api.endswith("__")) or \
        api.startswith("__i") or api in ("assign", "assign_add", "assign_sub", "scatter_update",
                                         "scatter_nd_update", "copy_")


def _synchronize() -> None:
    """Wait for the graphs in flight (their dump points' callbacks are asynchronous)."""
    try:
        import mindspore.runtime

        mindspore.runtime.synchronize()
    except Exception:  # noqa: BLE001 - no such call, or no device stream (CPU): nothing to wait for
        pass
