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

import dataclasses
import weakref
from typing import Any, Callable, Optional

from msprobe.dumpers.adapter import ApiCall, ApiGuard, ApiPatcher, FrameworkAdapter, StatEncoder
from msprobe.dumpers.config import DumpConfig
from msprobe.dumpers.record_filter import RecordFilter
from msprobe.dumpers.records import CallRecords, backward_parent
from msprobe.dumpers.session import DumpSession
from msprobe.dumpers.stacks import capture_stack, render_stack
from msprobe.errors import ConfigError

__all__ = ["ApiCall", "DumperCore", "FrameworkAdapter", "RecordFilter", "backward_parent", "capture_stack", "core_attribute",
           "render_stack"]


def core_attribute(name: str) -> Any:
    """A framework dumper's attribute that is its core's (``session``, ``encoder``, ``patcher``,
    ``enabled``): read and set through ``dumper.core``, for the dumper's users."""

    private = "_" + name

    def get(dumper: Any) -> Any:
        return getattr(dumper.core, private)

    def put(dumper: Any, value: Any) -> None:
        setattr(dumper.core, private, value)

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


class DumperCore(CallRecords):
    """What every dumper holds and records, whatever the framework: the session, encoder and API
    patcher, the module stacks and parents, the step generation, the records of module calls and
    of ``save``. ``adapter``: the framework's dumper, whose collaborators (msprobe/dumpers/adapter.py)
    the core builds: its session (with the adapter's ``fetch_stats`` and ``get_rank``), encoder and
    patcher; ``guard``: its thread-local API guard (``guard.inside`` while the dumper works).

    The reverse contract: an adapter asks the core through its public methods only (docs/architecture.md,
    "What an adapter may ask of the core"; tests/test_adapter_contract.py counts the rest, 0): the
    session, the module and backward stacks, the parents, the sets and counters below stay the core's.

    * the step: :meth:`begin`, :meth:`turn_on`, :meth:`stop`, :meth:`end_step`, :meth:`close`,
      :meth:`is_on`, :meth:`generation`, :meth:`live`, :meth:`current_step`, :meth:`set_step`,
      :meth:`rank`, :meth:`warn_if_nothing`, :meth:`call_skipped`;
    * what is dumped: :meth:`dumps_apis`, :meth:`dumps_modules`, :meth:`wanted`,
      :meth:`wanted_backward`, :meth:`io`, :meth:`keep`, :meth:`set_token_range`;
    * models: :meth:`add_models`, :meth:`has_models`, :meth:`is_hooked`, :meth:`dump_module`,
      :meth:`end_module_dump`, :meth:`in_module_dump`, :meth:`note_param_grads`,
      :meth:`param_grads_noted`;
    * modules and backwards: :meth:`enter_module`, :meth:`leave_module`, :meth:`leave_all_modules`,
      :meth:`begin_backward`, :meth:`end_backward`, :meth:`running_backward`, and the records of a
      module call (:meth:`module_forward_begin`, :meth:`module_forward_end`, :meth:`module_backward`,
      :meth:`hold_backward`, :meth:`fill_backward`);
    * records: :meth:`record` (the record, with what the encoder made for it, handed to the session
      once), :meth:`structure`, :meth:`record_of`, :meth:`forget`, :meth:`reserve_place`,
      :meth:`drop_place`, :meth:`next_api_name`, :meth:`next_module_index`, :meth:`journal_held`,
      :meth:`record_api`, :meth:`api_backward_hook`, :meth:`forward_inputs`, :meth:`forward_output`,
      :meth:`save_debug`;
    * collaborators: :meth:`encoder`, :meth:`patcher`, :meth:`patch_apis`, :meth:`unpatch_apis`,
      :meth:`write_under` (the session moves to a sub-directory: MindSpore's jit-Cell split).
    """

    def __init__(self, adapter: FrameworkAdapter, config: DumpConfig) -> None:
        self.adapter = adapter
        self.guard: ApiGuard = adapter.guard
        self.config = config
        self._session = DumpSession(config, adapter.framework, fetch_stats=adapter.fetch_stats,
                                    render_stack=render_stack, get_rank=adapter.get_rank)
        self._encoder: StatEncoder = adapter.encoder_cls(self._session, save_tensors=config.task == "tensor",
                                                         summary_mode=config.summary_mode,
                                                         tensor_list=config.tensor_list)
        self._encoder.check_overflow = config.task == "overflow_check"
        self._patcher: ApiPatcher = adapter.patcher_cls()
        self._enabled = False
        self._module_stack: list = []
        self._bw_stack: list = []
        self._filter = RecordFilter(config, self._module_stack, self._bw_stack)
        self._hooked_models: list = []
        self._parent_of: dict = {}
        self._pgrad_seen: set = set()  # modules whose parameter gradients this step dumps
        self._debug_counts: dict = {}
        self._apis_dumped = config.level in ("L1", "mix")
        self._modules_dumped = config.level in ("L0", "mix")
        #: the step generation: a backward hook set up while the dump was on records until the
        #: step ends (``step()``), also after ``stop()`` (the docs: stop before loss.backward()
        #: and step() after it collects the forward *and* backward of the calls in between)
        self._generation = 0
        self._weak_self = weakref.ref(self)  # (the API backward hooks' reference to the core, one for all)
        self._region: Optional[str] = None  # module_dump(module, name): the module's key, until module_dump_end
        self._dumped_step = False  # start() turned the dump on in this step
        self._records_before = 0
        self._told_nothing = False

    # ---------------------------------------------------------------- collaborators
    def encoder(self) -> StatEncoder:
        """The encoder the core built of the adapter's ``encoder_cls``."""
        return self._encoder

    def patcher(self) -> ApiPatcher:
        """The API wrappers the core built of the adapter's ``patcher_cls``."""
        return self._patcher

    def patch_apis(self, callback: Callable[..., Any]) -> None:
        self._patcher.install(callback)

    def unpatch_apis(self) -> None:
        self._patcher.uninstall()

    def write_under(self, sub: str) -> None:
        """From now on the core's records go to ``<dump_path>/<sub>`` (a session of their own, at the
        same step): MindSpore's jit-Cell split (spec/PRODUCER.md §23.3)."""
        self._session = self.new_session(sub)
        self._encoder.session = self._session

    def new_session(self, sub: str) -> DumpSession:
        """A session of this dumper's configuration under ``<dump_path>/<sub>``, at the current step."""
        config = dataclasses.replace(self.config, dump_path=self.config.dump_path.rstrip("/") + "/" + sub)
        session = DumpSession(config, self.adapter.framework, fetch_stats=self.adapter.fetch_stats,
                              render_stack=render_stack, get_rank=self.adapter.get_rank)
        session.set_step(self._session.current_step)
        return session

    # ---------------------------------------------------------------- steps
    def begin(self) -> bool:
        """``start()``: whether this step and rank are dumped (the session claims its directory then)."""
        if not (self._session.step_enabled() and self._session.rank_enabled()):
            self._enabled = False
            return False
        self._session.claim()
        return True

    def turn_on(self) -> None:
        self._enabled = True
        self._dumped_step = True
        self.guard.on = True

    def is_on(self) -> bool:
        """Whether the dump is on (between ``start()`` and ``stop()`` of a dumped step)."""
        return self._enabled

    def stop(self) -> None:
        """``stop()``: the dump goes off and dump.json holds what was recorded so far (the adapter
        waits for its work in flight first, and writes what it held back before the publish)."""
        if not self._enabled:
            return
        adapter = self.adapter
        adapter.before_stop()
        self._enabled = False
        self.guard.on = False
        adapter.flush_records()
        self.fix_dangling_parents()
        self._session.publish()
        adapter.after_publish()

    def generation(self) -> int:
        """The step generation now (a hook set up now records while :meth:`live` says so)."""
        return self._generation

    def live(self, generation: int) -> bool:
        """Whether a hook set up in step generation ``generation`` still records."""
        return self._enabled or generation == self._generation

    def current_step(self) -> int:
        return self._session.current_step

    def set_step(self, step: int) -> None:
        """Number the current step ``step`` (``set_init_step``)."""
        self._session.set_step(step)

    def rank(self) -> Optional[int]:
        """This process's rank (resolved once), None outside a distributed job."""
        return self._session.resolve_rank()

    def end_step(self, *, warn: bool = True) -> None:
        """``step()``, after ``stop()``: parents of backwards that never completed mended, the step
        published and closed (``warn``: a dumped step that recorded nothing says so), the next begun."""
        self.fix_dangling_parents()
        if warn:
            self.warn_if_nothing(stacklevel=5)
        self._session.end_step()
        self.end_step_state()

    def close(self) -> None:
        """The dumper is torn down: the current step's dump is final."""
        self._session.close()

    def end_step_state(self) -> None:
        """What a step's end resets (both dumpers)."""
        self._generation += 1
        self._filter.end_step()
        self._debug_counts.clear()
        self._bw_stack.clear()
        self._parent_of.clear()
        self._pgrad_seen.clear()
        self._encoder.take_stats()  # made for no record of the step (one the filter did not keep)
        reset = getattr(self._encoder, "reset_overflow", None)
        if reset is not None:
            reset()

    def warn_if_nothing(self, stacklevel: int = 4) -> None:
        """At ``step()``: a step that was dumped (``start()`` ran with its step and rank on) and
        recorded nothing warns once, naming the filter that excluded every call (``list``,
        ``scope``, ``data_mode``, ``token_range``) or saying that no wrapped call ran."""
        import warnings

        session = self._session
        started, self._dumped_step = self._dumped_step, False
        before, self._records_before = self._records_before, session.records_total
        config = self.config
        if (not started or session.records_total > before or self._told_nothing
                or config.task == "overflow_check" or config.level == "debug"):
            return
        self._told_nothing = True
        seen = sorted(set(session.api_counts) | {key.rsplit(".", 1)[0] for key in session.module_counts})
        why = self._filter.nothing_recorded(seen)
        if not why:
            hooked = "no model passed to start(model)" if not self._hooked_models else "the model's modules"
            why.append(f"no call went through a wrapped API or a hooked module between start() and step() "
                       f"(level {config.level}, {len(seen)} APIs/modules seen; {hooked})")
        warnings.warn(f"msprobe: step {session.current_step} was dumped but recorded nothing: "
                      f"{'; '.join(why)} (said once)", RuntimeWarning, stacklevel=stacklevel)

    # ---------------------------------------------------------------- what is dumped
    def dumps_apis(self) -> bool:
        """Whether API calls are dumped (level L1, mix)."""
        return self._apis_dumped

    def dumps_modules(self) -> bool:
        """Whether modules (Cells) are dumped (level L0, mix)."""
        return self._modules_dumped

    def set_token_range(self, model: Any, token_range: Optional[list]) -> None:
        self._filter.set_token_range(model, token_range)

    def wanted(self, name: str, on: Optional[bool] = None, inside_listed: Optional[bool] = None) -> bool:
        """Whether the record ``name`` is dumped (``on``: the dump is on, by default whether it is now)."""
        return self._filter.wanted(name, self._enabled if on is None else on, inside_listed)

    def wanted_backward(self, bwd: str, on: bool) -> bool:
        """Whether the backward record ``bwd`` is dumped, inside the module backward running now."""
        selection = self._filter
        if selection.wants_all():  # (no list: whether a listed module's backward runs is not asked)
            return bool(on)
        return selection.wanted(bwd, on, selection.inside_listed_backward())

    def io(self, direction: str) -> tuple:
        """(inputs dumped, outputs dumped) of the records of ``direction`` (``data_mode``)."""
        return self._filter.io(direction)

    def keep(self, rec: dict, name: str, encoder: Any = None) -> bool:
        """Whether a record made (by ``encoder``, the core's by default) is kept (overflow_check)."""
        return self._filter.keep(rec, name, encoder or self._encoder)

    # ---------------------------------------------------------------- models
    def add_models(self, model: Any, cls: type, what: str, handles: list) -> Optional[list]:
        """The models of ``start(model=...)`` (one, or a list/tuple), None when they are hooked
        already; with a token_range the first one's forward pre-hook counts the tokens."""
        models = list(model) if isinstance(model, (list, tuple)) else [model]
        for candidate in models:
            if not isinstance(candidate, cls):
                raise ConfigError(f"model must be a {what} or a list/tuple of them, got {type(candidate).__name__}")
        if any(candidate is hooked for candidate in models for hooked in self._hooked_models):
            return None
        self._hooked_models.extend(models)
        if self._filter.token_range is not None:
            handles.append(models[0].register_forward_pre_hook(self._filter.count_token))
        return models

    def has_models(self) -> bool:
        """Whether a model was passed to ``start(model=...)`` (or to ``module_dump``)."""
        return bool(self._hooked_models)

    def is_hooked(self, model: Any) -> bool:
        return any(model is hooked for hooked in self._hooked_models)

    def dump_module(self, module: Any, key: str) -> bool:
        """``module_dump(module, name)``: only ``module`` (as ``key``) is dumped until
        :meth:`end_module_dump`; True when the module was not hooked yet (the adapter hooks it)."""
        new = not self.is_hooked(module)
        if new:
            self._hooked_models.append(module)
        self._region = key
        return new

    def end_module_dump(self) -> None:
        self._region = None

    def in_module_dump(self) -> bool:
        """Whether ``module_dump(...)`` is on (API calls are then neither recorded nor counted)."""
        return self._region is not None

    def note_param_grads(self, module: Any) -> bool:
        """This step dumps ``module``'s parameter gradients; False when it was noted already."""
        key = id(module)
        if key in self._pgrad_seen:
            return False
        self._pgrad_seen.add(key)
        return True

    def param_grads_noted(self, module_id: int) -> bool:
        """Whether this step dumps the parameter gradients of the module ``id(module) == module_id``."""
        return module_id in self._pgrad_seen

    # ---------------------------------------------------------------- modules and backwards
    def enter_module(self, name: str) -> None:
        """The calls from now on map to the (pseudo-)module ``name`` in construct.json (the
        optimizer's "optimizer", "clip_grad"), until :meth:`leave_module`."""
        self._module_stack.append(name)
        self._session.ensure_structure(name)

    def leave_module(self, name: str) -> None:
        stack = self._module_stack
        if stack and stack[-1] == name:
            stack.pop()

    def leave_all_modules(self) -> None:
        """Forget the module forwards open (a step's end where their post hooks never ran)."""
        self._module_stack.clear()

    def begin_backward(self, bwd: str) -> None:
        """A module's backward ``bwd`` begins: the parent of what runs inside it, in its scope."""
        self._filter.scope_enter(bwd)
        self._bw_stack.append(bwd)

    def end_backward(self, bwd: str, *, anywhere: bool = False) -> None:
        """The module's backward ``bwd`` ends (when it is the innermost running; ``anywhere``: wherever
        it is among those running, as MindSpore's observer ends a call whose inner calls are left)."""
        stack = self._bw_stack
        if stack and stack[-1] == bwd:
            stack.pop()
        elif anywhere and bwd in stack:
            stack.remove(bwd)

    def running_backward(self) -> Optional[str]:
        """The innermost module backward running, None when none is."""
        stack = self._bw_stack
        return stack[-1] if stack else None

    def parent(self) -> Optional[str]:
        """The construct.json parent of a forward call made now: the innermost module forward open,
        else (where the adapter says so) the innermost module backward running."""
        if self._module_stack:
            return self._module_stack[-1]
        return self._bw_stack[-1] if self._bw_stack and self.adapter.backward_parents_forward else None

    def call_skipped(self) -> bool:
        """Whether a call now is neither recorded nor counted: before start(), after stop(), in a step
        not dumped, or outside token_range."""
        if not self._enabled:
            return True
        selection = self._filter
        return selection.token_range is not None and not selection.in_token_range()

    # ---------------------------------------------------------------- records
    def record(self, name: str, rec: Any, *, stack: Optional[tuple] = None, parent: Optional[str] = None,
               construct: bool = True, filtered: bool = True) -> bool:
        """Add (or replace) the record ``name`` with what the encoder made for it (its statistics
        still on the device), handed to the session at once; ``filtered``: only when the filter keeps
        it (overflow_check). Returns whether it was added."""
        if filtered and not self._filter.keep(rec, name, self._encoder):
            return False
        self._session.add_record(name, rec, stack=stack, parent=parent, construct=construct,
                                 stats=self._encoder.take_stats())
        return True

    def structure(self, name: str, parent: Optional[str]) -> None:
        """A call not recorded that is part of the model's structure (construct.json)."""
        self._session.add_structure(name, parent)

    def record_of(self, name: str) -> Any:
        """The record ``name`` of the current step so far (None when there is none)."""
        return self._session.record(name)

    def forget(self, name: str) -> None:
        """Drop the record ``name`` of the current step (it is added again at its new place)."""
        self._session.remove_record(name)

    def reserve_place(self, name: str, parent: Optional[str]) -> Any:
        """Hold the place of the record ``name`` whose values come later (:meth:`record` fills it);
        returns the placeholder for :meth:`drop_place`."""
        return self._session.reserve(name, parent)

    def drop_place(self, name: str, placeholder: Any) -> None:
        """Drop a held place that no record filled."""
        self._session.unreserve(name, placeholder)

    def next_api_name(self, api_key: str) -> tuple:
        """(``<api_key>.<n>``, n): the next call of ``api_key``, counted."""
        return self._session.next_api_name(api_key)

    def next_module_index(self, key: str) -> int:
        return self._session.next_module_index(key)

    def journal_held(self) -> Any:
        """A block whose records are queued, not journaled (a compiled graph's run)."""
        return self._session.journal_held()
