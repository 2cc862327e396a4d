"""The PyTorch adapter: API and module hooks feeding the framework-neutral DumpSession."""
from __future__ import annotations

import os
import sys
import warnings
import weakref
from typing import Any, Callable, Optional, cast

import torch

from msprobe.dumpers.adapter import ApiCall, FrameworkAdapter
from msprobe.dumpers.config import DumpConfig
from msprobe.dumpers.control import DumperCore, ModuleForwardHooks, core_attribute
from msprobe.dumpers.pytorch import _comm, _ptfile
from msprobe.dumpers.pytorch._apis import GUARD, ApiPatcher
from msprobe.dumpers.pytorch._clipgrad import ClipGradPatch, clip_grad_functions
from msprobe.dumpers.pytorch._edges import InputEdges, node_seq, sequence_mark
from msprobe.dumpers.pytorch._encode import Encoder, fetch_stats
from msprobe.dumpers.pytorch._model_checks import refuse_compiled, warn_captured_apis, warn_fsdp2
from msprobe.dumpers.pytorch._observer import OutputApi, changed_output, observe, observed_output, on_grad, output_call
from msprobe.dumpers.pytorch._online_api import online_api
from msprobe.dumpers.pytorch._order import ENDS, before_accumulation, before_event, leaf_accumulates, release_order
from msprobe.dumpers.pytorch._values import first_tensor, grad_tensors, is_sequence
from msprobe.dumpers.pytorch._watches import model_users
from msprobe.errors import ConfigError

__all__ = ["TorchDumper"]

_TORCH_DIR = os.path.dirname(torch.__file__)


def _get_rank() -> Optional[int]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except Exception:  # noqa: BLE001 - never break training for the dump
        pass
    return None


class TorchDumper(FrameworkAdapter):
    """Owns the patcher, the module hooks and the session for one process (through its
    :class:`DumperCore`, whose framework adapter it is)."""

    #: a forward call inside a module's backward (torch.utils.checkpoint's recompute) has that backward
    #: as its parent, as 26.2.0's one module stack of forwards and backwards gives it
    backward_parents_forward = True
    framework = "pytorch"
    encoder_cls = Encoder
    patcher_cls = ApiPatcher
    guard = GUARD
    fetch_stats = staticmethod(fetch_stats)
    get_rank = staticmethod(_get_rank)

    def __init__(self, config: DumpConfig):
        if config.level == "L2":
            raise ConfigError("level 'L2' is the kernel dump: PrecisionDebugger runs it with KernelDumper")
        self.config = config
        self.core = core = DumperCore(self, config)
        # the collaborators the core built of the classes above
        self.encoder, self.patcher = cast(Encoder, core.encoder()), core.patcher()
        self._module_handles: list = []
        self.last_module_fwd: Optional[str] = None  # the last module forward call that ended
        self.in_flight: list = []  # InputEdges of the module forwards running (innermost last)
        self._optim_handles: list = []
        self.mutating = _MutatingKeys()
        self._captured_checked: set = set()
        self.online = None
        if config.online is not None:  # online_run_ut: packets to the checker instead of dump files
            from msprobe.dumpers.pytorch._online import OnlineRunUt

            self.online = OnlineRunUt(config.online, core.rank)
        if core.dumps_apis() and config.level != "debug":
            # the API wrappers go in when the debugger is created, as 26.2.0 does: a model built after
            # it that keeps an API in an attribute (transformers' GELUActivation: self.act = F.gelu)
            # holds the wrapper, so its calls are recorded; they pass straight through until start()
            core.patch_apis(self.on_api)

    # for the dumper's users (tests, tools): the adapter itself asks the core (DumperCore's public methods)
    session = core_attribute("session")
    enabled = core_attribute("enabled")

    # ---------------------------------------------------------------- control
    def start(self, model: Any = None, token_range: Optional[list] = None) -> None:
        config, core = self.config, self.core
        refuse_compiled(model)
        warn_fsdp2(model, self._captured_checked)
        core.set_token_range(model, token_range)
        apis = core.dumps_apis() and config.level != "debug"
        if model is not None and apis:
            warn_captured_apis(model, self.patcher, self._captured_checked)
        if model is not None and (core.dumps_modules() or token_range is not None):
            self._hook_models(model)
        if config.level == "mix" and not self._optim_handles:
            self._hook_optimizers()
        elif core.dumps_modules() and not core.has_models():
            raise ConfigError(f"level {config.level!r} dumps modules and needs start(model=...)")
        if not core.begin():
            return
        if apis:
            core.patch_apis(self.on_api)
        core.turn_on()

    def stop(self) -> None:
        """The dump goes off; dump.json holds what was recorded so far. Backward calls of the
        forward calls recorded before are still recorded until ``step()`` (the docs: stop before
        loss.backward(), step after it)."""
        self.core.stop()

    def step(self) -> None:
        self.stop()
        core = self.core
        self.in_flight.clear()
        if self.online is not None:
            self.online.end_step(core.current_step())
        core.end_step(warn=self.online is None)
        _comm.drop_pending()
        self.encoder.cache.clear()

    def close(self) -> None:
        self.stop()
        core = self.core
        if self.online is not None:
            self.online.close(core.current_step())
        else:  # a step ended by the process, not by step(): said as step() says it
            core.warn_if_nothing()
        core.unpatch_apis()
        for handle in self._module_handles + self._optim_handles:
            handle.remove()
        self._module_handles = []
        self._optim_handles = []
        core.close()
        _ptfile.POOL.clear()  # every file is written: the buffers kept for the next ones go

    # ------------------------------------------------------------------- APIs
    def on_api(self, orig, api_key: str, args: tuple, kwargs: dict):
        """The API wrappers' callback: ``orig(*args, **kwargs)`` recorded (online_run_ut: sent to
        the checker instead)."""
        core = self.core
        online = self.online
        if online is not None and not core.call_skipped() and not core.in_module_dump():
            return online_api(self, online, orig, api_key, args, kwargs)
        return core.record_api(self, orig, api_key, args, kwargs)

    def is_collective(self, api_key: str) -> bool:
        return api_key.startswith("Distributed.")

    def backward_possible(self, call: ApiCall) -> bool:
        return self.backward_wanted()

    def receive_buffers(self, call: ApiCall) -> frozenset:
        # a receive buffer's content before the call is no data: null, as 26.2.0
        return _comm.receive_buffers(call.api_key, call.args, call.kwargs, _get_rank())

    def call_api(self, call: ApiCall) -> Any:
        """The call; its backward hooked (a recorded call: when gradients are recorded once it returned)."""
        core = self.core
        if not call.recorded:
            out = call.run()
            if call.backward:
                self._hook_api_backward(out, call.bwd, call.parent, call.args, call.kwargs)
            return out
        if call.api_key in self.mutating:  # writes memory (maybe without a version bump): forget cached stats
            self.encoder.cache.clear()
        try:
            out = call.run()
        except BaseException:
            # a call cut short (torch.utils.checkpoint stops its non-reentrant recompute inside the
            # call that recovers the last saved tensor, or the API raised): its inputs, as 26.2.0
            if call.rec and core.is_on():
                core.record(call.fwd, call.rec, stack=call.stack, parent=call.parent, filtered=False)
            raise
        if not call.collective and self.backward_wanted():
            self._hook_api_backward(out, call.bwd, call.parent, call.args, call.kwargs)
        return out

    def collective_output(self, call: ApiCall, out: Any) -> bool:
        if _comm.is_work(out) and _comm.record_after_wait(self.core, call.rec, call.fwd, out, call.values(),
                                                          call.stack, call.parent):
            return False
        self.core.forward_output(call.rec, call.fwd, call.values())  # the arguments after the collective, as msprobe
        return True

    def backward_wanted(self) -> bool:
        return self.config.backward_enabled and torch.is_grad_enabled()

    def encode_output(self, out: Any, prefix: str, save: bool, encoder: Any = None) -> list:
        return (encoder or self.encoder).encode_output(out, prefix, save, is_sequence=is_sequence)

    def _hook_api_backward(self, out: Any, bwd: str, parent: Optional[str], args: tuple = (),
                           kwargs: Optional[dict] = None) -> None:
        first = first_tensor(out)
        if first is None or not first.requires_grad:
            return
        node = first.grad_fn  # (read once: each read is a call into torch)
        if node is None or _identity_dropout(bwd, args, kwargs or {}):
            return
        hook = _SeqHook(node_seq(node), self.core.api_backward_hook(bwd))
        for arg in args:
            if arg is first:
                break
        else:  # (an output that is none of the arguments: the common case)
            node.register_hook(hook)
            return
        # an API that returned its argument unchanged (x.float() of a float32 x): 26.2.0 records the
        # identity node its module hooks put on a module's output, or on the inputs of the module
        # whose forward is running
        inputs = next((edges for edges in reversed(self.in_flight) if edges.holds(first)), None)
        if inputs is not None:
            inputs.apis.append(lambda grads: hook(grads, grads))
            return
        call = output_call(first)
        if call is not None:  # from the module call's identity node on its outputs: all their gradients
            call.out_apis.append(OutputApi(hook, self._api_place(bwd)))
            return
        if observed_output(first):
            on_grad(first, lambda grad: hook((grad,), (grad,)), last=True)
            return
        if first is args[0] and changed_output(first):
            # in place on a module's output: 26.2.0 records the gradient of the result, once, as the
            # base of the view sees it when the output is a view (a Linear's 3-d output)
            as_base = _as_base(first)
            on_grad(first, lambda grad: hook((as_base(grad),), (grad,)), last=True)
            return
        first.grad_fn.register_hook(hook)

    def _api_place(self, bwd: str) -> Callable[[], Callable[[], None]]:
        """What holds the place of the API backward record ``bwd`` now (under the module backward
        running), returning what drops it when no record filled it."""
        core = self.core

        def reserve() -> Callable[[], None]:
            placeholder = core.reserve_place(bwd, core.running_backward())
            return lambda: core.drop_place(bwd, placeholder)

        return reserve

    # ---------------------------------------------------------------- modules
    def _hook_models(self, model: Any) -> None:
        models = self.core.add_models(model, torch.nn.Module, "torch.nn.Module", self._module_handles)
        if models is None or not self.core.dumps_modules():
            return
        if self.config.backward_enabled and sequence_mark() is None:
            warnings.warn("msprobe: this torch has no autograd sequence numbers (torch._C._autograd._get_sequence_nr):"
                          " module backward records hold no input gradients (spec/PRODUCER.md section 20 item 43)",
                          RuntimeWarning, stacklevel=3)
        multi = len(models) > 1
        for index, root in enumerate(models):
            for path, sub in root.named_modules():
                if sub is root or not path:
                    continue
                key = f"Module.{index}.{path}.{type(sub).__name__}" if multi else f"Module.{path}.{type(sub).__name__}"
                self.hook_module(sub, key)

    def _hook_optimizers(self) -> None:
        """At mix level, optimizer.step() APIs get the pseudo-module parent 'optimizer', and those of
        ``torch.nn.utils.clip_grad_norm_`` (``clip_grad_norm``, ``clip_grad_value_``, Megatron's
        ``MegatronOptimizer.clip_grad_norm``) the parent 'clip_grad' (as msprobe 26 does)."""
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        core_ref = weakref.ref(self.core)

        def pre(opt, args, kwargs):
            core = core_ref()
            if core is not None and core.is_on():
                core.enter_module("optimizer")

        def post(opt, args, kwargs):
            core = core_ref()
            if core is not None:
                core.leave_module("optimizer")

        self._optim_handles = [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]
        self._optim_handles.extend(ClipGradPatch(core_ref, owner, name) for owner, name in clip_grad_functions())

    def hook_module(self, module: torch.nn.Module, key: str) -> None:
        """The forward and backward hooks of one module, recorded as ``key`` (``Module.<path>.<Class>``)."""
        _ModuleHooks(self, module, key)

    def add_handle(self, handle: Any) -> None:
        self._module_handles.append(handle)

    def module_params(self, module: torch.nn.Module) -> Any:
        return module.named_parameters(recurse=False)

    def hook_param_grads(self, module: torch.nn.Module, key: str) -> None:
        core = self.core
        if not self.config.backward_enabled or not core.note_param_grads(module):
            return  # (noted: this step dumps the module's parameter gradients)
        if getattr(module, "__msprobe_pgrad_hooked__", False):
            return
        module.__msprobe_pgrad_hooked__ = True  # type: ignore[assignment]  # torch types Module attrs as Tensor|Module
        name = f"{key}.parameters_grad"
        core_ref = weakref.ref(core)
        wanted = [pname for pname, param in module.named_parameters(recurse=False) if param.requires_grad]
        leaf_ids = {pname: id(param) for pname, param in module.named_parameters(recurse=False)}
        for pname, param in module.named_parameters(recurse=False):
            if not param.requires_grad:
                continue

            def hook(param, pname=pname):
                alive = core_ref()
                if alive is not None:
                    leaf_accumulates(param)  # (a module call with this parameter as input is written first)
                # the module's forward ran while this step was dumped (also before a stop())
                if alive is None or not alive.param_grads_noted(id(module)) or param.grad is None \
                        or not alive.wanted(name, True):
                    return
                GUARD.inside = True
                try:
                    before_accumulation(module)  # module calls completed before it, in the engine's order
                    encoder = alive.encoder()
                    entry = encoder.encode(param.grad, f"{name}.{pname}", encoder.wants_tensors(name))
                    if not alive.keep({pname: entry}, name):
                        return
                    rec = alive.record_of(name)
                    if isinstance(rec, dict) and not all(each in rec for each in wanted):
                        # not complete yet: the record takes its place where the module's last parameter
                        # gets its first gradient, as 26.2.0's (later accumulations keep the place)
                        alive.forget(name)
                    rec = dict(rec) if isinstance(rec, dict) else {}
                    rec[pname] = [entry]
                    rec = {each: rec[each] for each in release_order(list(rec), leaf_ids)}
                    alive.record(name, rec, parent=None, construct=False, filtered=False)  # FORMAT §12: not listed
                finally:
                    GUARD.inside = False

            self._module_handles.append(param.register_post_accumulate_grad_hook(hook))

    # ------------------------------------------------------------------ debug
    def save(self, variable: Any, name: str, save_backward: bool = True) -> None:
        self.core.save_debug(variable, name, save_backward)

    def grad_hookable(self, value: Any) -> bool:
        return isinstance(value, torch.Tensor) and value.requires_grad

    def on_grad(self, tensor: Any, hook: Any) -> None:
        tensor.register_hook(hook)


class _ModuleHooks(ModuleForwardHooks):
    """One module's hooks: forward pre/post (its records) and, with backward dumped, the taps
    on its inputs and outputs whose gradients give its backward record."""

    def __init__(self, dumper: TorchDumper, module: torch.nn.Module, key: str) -> None:
        super().__init__(dumper, key)
        self.taps: dict = {}  # forward name -> its tap's state (the output gradients, once they arrive)
        add = dumper.add_handle
        add(module.register_forward_pre_hook(self.pre, with_kwargs=True))
        if dumper.config.backward_enabled:
            add(module.register_forward_pre_hook(self.pre_backward, with_kwargs=True))
        add(module.register_forward_hook(self.post, with_kwargs=True, always_call=True))
        if dumper.config.backward_enabled:
            add(module.register_forward_hook(self.post_backward, with_kwargs=True))

    def post(self, module, args, kwargs, output):
        dumper = self.dumper()
        item = self.calls.pop() if self.calls else None
        if item is not None and dumper is not None:
            dumper.last_module_fwd = item[0]
            if output is None and sys.exc_info()[0] is not None:
                # the forward raised (a checkpoint recompute cut short): leave the module and keep
                # its place in construct.json, but write no record (spec/PRODUCER.md §20 item 27)
                item = (item[0], None, item[2], item[3])
            dumper.core.module_forward_end(item, module, self.key, output, gated=True)
        return None

    def emit_backward(self, core: DumperCore, index: int, generation: int, grad_output, grad_input,
                      held: Optional[list] = None) -> None:
        """The module's backward record; ``held``: its place was held (:meth:`hold_backward`) then."""
        bwd = f"{self.key}.backward.{index}"
        if held is not None:
            if held and held[0] is not None and core.live(generation):
                core.fill_backward(bwd, held[0], grad_output, grad_input)
            return
        if core.live(generation):
            core.module_backward(bwd, f"{self.key}.forward.{index}", grad_output, grad_input, live=True)
        core.end_backward(bwd)

    def hold_backward(self, core: DumperCore, index: int, generation: int, held: list) -> None:
        """The record is due, not all its output gradients are in: its place now (``held``)."""
        bwd = f"{self.key}.backward.{index}"
        held.append(core.hold_backward(bwd, f"{self.key}.forward.{index}", live=True)
                    if core.live(generation) else None)
        core.end_backward(bwd)

    def pre_backward(self, module, args, kwargs):
        # the inputs' graph edges, before the forward (spec/PRODUCER.md §20 item 43: observed, not rerouted)
        dumper = self.dumper()
        calls = self.calls
        if dumper is None or not calls or calls[-1] is None:  # (None: the dump was off at the pre hook)
            return None
        inputs = grad_tensors(args)
        mark = sequence_mark()
        if mark is not None and torch.is_grad_enabled():
            model_users(inputs)  # (what the model's own forward made since a top-level call ended)
            edges = InputEdges(inputs, mark)
            self.taps[calls[-1][0]] = (edges, len(inputs))
            dumper.in_flight.append(edges)
        return None

    def post_backward(self, module, args, kwargs, output):
        dumper = self.dumper()
        if dumper is None or not dumper.core.is_on() or not torch.is_grad_enabled():
            return None
        key = self.key
        fwd = dumper.last_module_fwd
        if fwd is None or not fwd.startswith(key + ".forward."):
            return None
        index = int(fwd.rsplit(".", 1)[1])
        generation = dumper.core.generation()
        edges, n_in = self.taps.pop(fwd, (None, 0))
        if edges is not None and edges in dumper.in_flight:
            dumper.in_flight.remove(edges)
        # the output's tensors that need a gradient, in depth-first order through tuples, lists and
        # dicts (a ModelOutput): the record's "input" holds one gradient each, as 26.2.0's
        outputs = grad_tensors((output,))
        if not outputs:
            return None
        dumper_ref = self.dumper
        bwd = f"{key}.backward.{index}"

        def begin():
            alive = dumper_ref()
            if alive is not None and alive.core.live(generation):
                alive.core.begin_backward(bwd)

        held = []  # the record's held place (one entry once held)

        def hold():
            alive = dumper_ref()
            if alive is not None:
                self.hold_backward(alive.core, index, generation, held)

        def done(grad_output, grad_input):
            alive = dumper_ref()
            if alive is not None:
                self.emit_backward(alive.core, index, generation, grad_output, grad_input, held if held else None)

        GUARD.inside = True
        try:
            grads = observe(outputs, edges, n_in, begin, done, hold, watch=True,
                            parent=dumper.in_flight[-1] if dumper.in_flight else None)
            ENDS[module] = grads.end
        except Exception:  # noqa: BLE001 - never break training for the dump
            pass
        finally:
            GUARD.inside = False
        return None


class _SeqHook:
    """An API call's backward hook on its output's autograd node: the module calls completed before the
    node (``seq``: its sequence number), in the engine's order, then the record (``record``: the core's
    hook). One object per call (a closure was a function and two cells)."""

    __slots__ = ("seq", "record")

    def __init__(self, seq: Any, record: Callable[[Any, Any], None]) -> None:
        self.seq = seq
        self.record = record

    def __call__(self, grad_inputs: Any, grad_outputs: Any) -> None:
        before_event(self.seq)
        return self.record(grad_inputs, grad_outputs)


class _MutatingKeys:
    """API keys that write into an argument: in-place methods (``add_``, ``__iadd__``, ``__setitem__``),
    ``out=``-style copies and every collective. Memoized per key."""

    def __init__(self) -> None:
        self._known: dict = {}

    def __contains__(self, api_key: str) -> bool:
        v = self._known.get(api_key)
        if v is None:
            prefix, _, api = api_key.partition(".")
            v = (prefix == "Distributed" or api.endswith("_") and not api.endswith("__")
                 or api in ("__setitem__", "copy_", "set_") or api.startswith("__i"))
            self._known[api_key] = v
        return v


_DROPOUTS = ("Functional.dropout.", "Functional.dropout1d.", "Functional.dropout2d.", "Functional.dropout3d.")


def _as_base(view: torch.Tensor) -> Callable[[Any], Any]:
    """What turns a gradient of ``view`` into the gradient its base gets (the base's shape, zeros
    outside the view); the identity for a tensor that is no view."""
    base = view._base
    if base is None:
        return lambda grad: grad
    shape, size, stride = tuple(base.shape), tuple(view.size()), tuple(view.stride())
    offset = view.storage_offset() - base.storage_offset()

    def as_base(grad: Any) -> Any:
        if not isinstance(grad, torch.Tensor) or tuple(grad.shape) != size:
            return grad
        inside = GUARD.inside
        GUARD.inside = True
        try:
            with torch.no_grad():
                out = grad.new_zeros(shape)
                out.as_strided(size, stride, offset).copy_(grad)
                return out
        except Exception:  # noqa: BLE001 - never break training for the dump
            return grad
        finally:
            GUARD.inside = inside

    return as_base


def _identity_dropout(bwd: str, args: tuple, kwargs: dict) -> bool:
    """A dropout with ``p=0`` returns its input: its output's autograd node is the previous op's, so a
    backward record would copy that op's gradients; 26.2.0 writes none (nor do we). Other calls that
    return their input unchanged (``x.float()`` of a float32 ``x``) keep 26.2.0's copy (FORMAT §9)."""
    if not bwd.startswith(_DROPOUTS):
        return False
    p = args[1] if len(args) >= 2 else kwargs.get("p", 0.5)
    return isinstance(p, (int, float)) and p == 0
