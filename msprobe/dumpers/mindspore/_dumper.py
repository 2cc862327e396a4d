"""The MindSpore adapter (PyNative): API, Primitive and Cell hooks feeding the framework-neutral DumpSession.

* APIs (``ops``/``Tensor``/``mint``/... listed in support_wrap_ops.yaml): the wrapper
  records the forward call; when MindSpore is recording a gradient, the call runs inside a
  throw-away Cell whose backward hook gives the backward record (gradients of the outputs as
  ``input``, of the tensor arguments as ``output``, ``null`` where an argument gets none).
* Primitives held by the cells of ``start(model=...)`` (``self.conv2d = ops.Conv2D(...)``):
  the instance's class is swapped for a subclass whose ``__call__`` records
  ``Primitive.<attribute>.<Class>.<n>``; their gradients arrive through ``ops.HookBackward``
  on the inputs and outputs, in arrival order, as the real tool records them; and
  ``mindspore.jit`` calls (_calls.py).
* Cells (L0/mix): forward pre/post hooks; their backward observed on MindSpore's autograd graph
  (_cells.py, _observer.py: pre hooks on the outputs' nodes, post hooks on the Cell's own nodes, no
  node added), and Parameter hooks for ``parameters_grad`` (here); Cells inside compiled graphs
  (_graph.py).
"""
from __future__ import annotations

import warnings
import weakref
from typing import Any, Optional, cast

import mindspore
from mindspore import Parameter, Tensor, nn

from msprobe.dumpers.adapter import ApiCall, FrameworkAdapter
from msprobe.dumpers.config import DumpConfig
from msprobe.dumpers.control import DumperCore, core_attribute
from msprobe.dumpers.mindspore import _observer
from msprobe.dumpers.mindspore._apis import GUARD, ApiPatcher, import_first
from msprobe.dumpers.mindspore._calls import HookedCalls, JitPatches, floating, has_tensor
from msprobe.dumpers.mindspore._cells import EXECUTOR, CellHooks, grad_recording
from msprobe.dumpers.mindspore._encode import Encoder, fetch_stats
from msprobe.dumpers.mindspore._graph import GraphCellDump, is_jit_cell
from msprobe.dumpers.session import DumpSession
from msprobe.errors import ConfigError
from msprobe.format.comm import comm_api

__all__ = ["MindSporeDumper"]


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
        self.calls = HookedCalls(self)  # Primitive and jit calls
        self._jit = JitPatches(self)
        self.pending_param_grads: dict = {}  # parameters_grad records waiting for their Cell's backward hook
        self._graph: Optional[GraphCellDump] = None  # GraphCellDump: the Cells dumped inside compiled graphs (_graph.py)
        self._warned_points = False
        # the Cells' backward observed without changing the graph (_observer.py); None: this MindSpore
        # shows no autograd graph to Python, and MindSpore's Cell backward hooks are used instead
        self.observer = _observer.CellObserver(EXECUTOR) if _observer.SUPPORTED else None
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
        return self.config.backward_enabled and grad_recording()

    # ------------------------------------------------------------------- APIs
    def on_api(self, orig, api_key: str, args: tuple, kwargs: dict):
        """The API wrappers' callback: ``orig(*args, **kwargs)`` recorded."""
        return self.core.record_api(self, orig, api_key, args, kwargs)

    def is_collective(self, api_key: str) -> bool:
        return api_key.startswith(_DIST_PREFIXES)  # collectives: forward-only records

    def encode_inputs(self, call: ApiCall) -> dict:
        rec = super().encode_inputs(call)
        if call.collective:
            _group_members(rec, call.api_key)
        return rec

    def backward_possible(self, call: ApiCall) -> bool:
        return self.bw_wanted() and (has_tensor(call.args) or has_tensor(call.kwargs.values()))

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
        if isinstance(value, (list, tuple)) and has_tensor(value):
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
                    CellHooks(self, sub, key)
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
        return isinstance(value, Tensor) and floating(value)

    def on_grad(self, tensor: Any, hook: Any) -> None:
        tensor.register_hook(hook)


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
    wait = getattr(EXECUTOR, "sync", None)
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


_GROUP_RANKS: dict = {}  # group name -> its members' global ranks (None: not known)


def _group_ranks(name: str) -> Optional[list]:
    """The global ranks of MindSpore's communication group ``name``, None where MindSpore cannot say."""
    if name not in _GROUP_RANKS:
        ranks = None
        get = import_first(("mindspore.mint.distributed", "get_process_group_ranks"),
                           ("mindspore.communication", "get_process_group_ranks"))
        try:
            found = get(name) if get is not None else None
            ranks = [int(rank) for rank in found] if found else None
        except Exception:  # noqa: BLE001 - MindSpore may raise anything here: never break training for the dump
            ranks = None
        _GROUP_RANKS[name] = ranks
    return _GROUP_RANKS[name]


def _group_members(rec: dict, api_key: str) -> None:
    """A collective's ``group`` (a name in MindSpore) given its members' global ranks beside the name,
    ``group_ranks``, as a torch ProcessGroup entry has them (spec/FORMAT.md 25.1, 26.7; PRODUCER.md 20)."""
    found = comm_api(api_key + ".0.forward")
    if found is None or "group" not in found[1].params:
        return
    args, kwargs = rec.get("input_args"), rec.get("input_kwargs")
    position = found[1].position("group")
    if isinstance(kwargs, dict) and "group" in kwargs:
        entry = kwargs["group"]
    elif isinstance(args, list) and position < len(args):
        entry = args[position]
    else:
        return
    if isinstance(entry, dict) and entry.get("type") == "str" and isinstance(entry.get("value"), str):
        ranks = _group_ranks(entry["value"])
        if ranks is not None:
            entry["group_ranks"] = ranks


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
