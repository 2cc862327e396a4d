"""The written contract between a framework's dumper and the framework-neutral :class:`DumperCore`.

A framework is added by one :class:`FrameworkAdapter` subclass (docs/architecture.md, "Add a
framework"): it names its collaborators (class attributes the core builds and uses) and
answers the questions the core asks while it records:

* collaborators: ``framework`` (the name in dump.json), ``encoder_cls`` (a
  :class:`StatEncoder`: values -> record entries), ``patcher_cls`` (an :class:`ApiPatcher`:
  the API wrappers), ``guard`` (an :class:`ApiGuard`: thread-local flags that keep the
  dumper's own calls out of the dump), ``fetch_stats`` (resolves a batch of the encoder's stat
  handles into dicts) and ``get_rank`` (this process's rank, None outside a distributed job);
* an API call (:class:`ApiCall`, recorded by :meth:`DumperCore.record_api`): what a
  collective is (:meth:`FrameworkAdapter.is_collective`), whether its backward can be recorded
  (:meth:`FrameworkAdapter.backward_possible`), how its inputs are encoded (a collective's
  receive buffers, known from the call's peers or root and this rank, are not data:
  :meth:`FrameworkAdapter.receive_buffers`), how it is called
  (:meth:`FrameworkAdapter.call_api`, with the framework's backward hooks) and a collective's
  outputs (:meth:`FrameworkAdapter.collective_output`);
* a module: its own parameters, how their gradients and a tensor's are hooked, how an output is
  encoded;
* stopping: what the framework flushes around the core's :meth:`DumperCore.stop`.

``msprobe.testing.AdapterTests`` holds the tests every adapter passes (PyTorch in the main
environment, MindSpore in its venv).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, ClassVar, Iterable, Optional, Protocol

__all__ = ["ApiCall", "ApiCaller", "ApiGuard", "ApiPatcher", "FetchStats", "FrameworkAdapter", "GetRank",
           "StatEncoder"]

#: resolves a batch of stat handles (the encoder's) into one dict of statistics each
FetchStats = Callable[[list], list]
#: this process's rank, None outside a distributed job
GetRank = Callable[[], Optional[int]]


class ApiGuard(Protocol):
    """Thread-local flags read by the API wrappers: ``on`` (the dump is on) and ``inside`` (the
    dumper is working: calls made now are its own, not the model's)."""

    on: bool
    inside: bool


class ApiPatcher(Protocol):
    """The API wrappers: ``install(callback)`` routes every wrapped API through
    ``callback(orig, api_key, args, kwargs)``; ``uninstall()`` puts the originals back."""

    @property
    def installed(self) -> bool: ...

    def install(self, callback: Callable[..., Any]) -> None: ...

    def uninstall(self) -> None: ...


class StatEncoder(Protocol):
    """Values -> record entries (msprobe/dumpers/encode.py's ``ValueEncoder`` and its framework
    subclasses); a tensor's statistics still on the device are an ``(entry, stat handle)`` pair the
    encoder keeps until the core takes them (``take_stats``) and hands them to the session with the
    record they belong to."""

    session: Any
    check_overflow: bool

    def __init__(self, session: Any, *, save_tensors: bool, summary_mode: str, tensor_list: list) -> None: ...

    def encode(self, value: Any, data_prefix: str, save: bool) -> Any: ...

    def encode_output(self, out: Any, prefix: str, save: bool, *, is_sequence: Any = ...) -> list: ...

    def encode_list(self, values: Any, prefix: str, save: bool) -> list: ...

    def encode_map(self, values: dict, prefix: str, save: bool) -> dict: ...

    def wants_tensors(self, name: str) -> bool: ...

    def take_stats(self) -> list: ...

    def take_overflow(self, name: str) -> bool: ...

    def settle_overflow(self, name: str, *, keep: bool) -> None: ...


class ApiCall:
    """One API call on its way through :meth:`DumperCore.record_api`: the original and its
    arguments, its record names, its construct.json ``parent``, whether it is a ``collective``,
    whether its ``backward`` can be recorded, whether its forward is ``recorded`` (else only its
    backward, when ``listed``, or its place in the structure), and the forward record being
    built (``rec``) with its ``stack``."""

    __slots__ = ("orig", "api_key", "args", "kwargs", "fwd", "bwd", "parent", "collective", "backward",
                 "recorded", "listed", "rec", "stack")

    def __init__(self, orig: Callable[..., Any], api_key: str, args: tuple, kwargs: dict, base: str,
                 parent: Optional[str], collective: bool) -> None:
        self.orig = orig
        self.api_key = api_key
        self.args = args
        self.kwargs = kwargs
        self.fwd = base + ".forward"
        self.bwd = base + ".backward"
        self.parent = parent
        self.collective = collective
        self.backward = False
        self.recorded = True
        self.listed = False
        self.rec: dict = {}
        self.stack: Any = None

    def run(self) -> Any:
        """The original call, unhooked."""
        return self.orig(*self.args, **self.kwargs)

    def values(self) -> tuple:
        """Its arguments, positional then keyword (a collective's outputs: its buffers after the call)."""
        return tuple(self.args) + tuple(self.kwargs.values())


class ApiCaller(ABC):
    """What :meth:`DumperCore.record_api` asks about a kind of call (a framework's APIs; MindSpore's
    Primitives and jit functions are another kind, with their own hooks)."""

    #: the :class:`~msprobe.dumpers.control.DumperCore` recording the calls (set by the adapter's
    #: constructor; not imported here: control.py imports this module)
    core: Any

    def is_collective(self, api_key: str) -> bool:
        """Whether ``api_key`` is a communication call (forward-only records; its outputs are its
        buffers after the call)."""
        return False

    @abstractmethod
    def backward_possible(self, call: ApiCall) -> bool:
        """Whether the call's backward can be recorded (backward dumped, gradients recorded now,
        a tensor among its arguments): asked before the call."""

    def receive_buffers(self, call: ApiCall) -> frozenset:
        """A collective's arguments that are this rank's receive buffers (positions and keyword
        names), known from the API's argument roles, its peers or root and this rank: their
        content before the call is no data, written ``null``. None by default."""
        return frozenset()

    def input_encoder(self, call: ApiCall) -> Optional[Callable[[Any, str, bool], Any]]:
        """How the call's positional arguments are encoded (None: the encoder's ``encode``)."""
        return None

    def encode_inputs(self, call: ApiCall) -> dict:
        """The forward record with the call's inputs (``input_args``/``input_kwargs``), a
        collective's receive buffers ``null``."""
        args, kwargs = call.args, call.kwargs
        buffers = self.receive_buffers(call) if call.collective else None
        if buffers:
            args = tuple(None if i in buffers else a for i, a in enumerate(args))
            kwargs = {k: None if k in buffers else v for k, v in kwargs.items()}
        return self.core.forward_inputs(call.fwd, args, kwargs, self.input_encoder(call))

    @abstractmethod
    def call_api(self, call: ApiCall) -> Any:
        """Call the API and return its result; with ``call.backward`` (and, when its forward is not
        recorded, ``call.listed``), hooked so that its gradients reach
        :meth:`DumperCore.api_backward_hook`."""

    def collective_output(self, call: ApiCall, out: Any) -> bool:
        """A collective's ``output`` entries in ``call.rec`` (its buffers after the call); False when
        the record is completed later (an asynchronous call: when its work is waited for)."""
        self.core.forward_output(call.rec, call.fwd, call.values())
        return True


class FrameworkAdapter(ApiCaller):
    """What a framework's dumper supplies to its :class:`DumperCore`: its collaborators (class
    attributes), its API calls (:class:`ApiCaller`), its modules, and its part of stopping."""

    #: the framework's name in dump.json
    framework: ClassVar[str]
    #: ``encoder_cls(session, save_tensors=..., summary_mode=..., tensor_list=...)``
    encoder_cls: ClassVar[type[StatEncoder]]
    #: ``patcher_cls()``
    patcher_cls: ClassVar[type[ApiPatcher]]
    #: the thread-local API guard of the framework's wrappers
    guard: ClassVar[ApiGuard]
    #: whether a forward call made while a module's backward runs and no module forward is
    #: open (a checkpoint's recompute) takes that backward as its construct.json parent
    backward_parents_forward: bool = False

    @staticmethod
    @abstractmethod
    def fetch_stats(handles: list) -> list:
        """The statistics of a batch of the encoder's stat handles (one dict each)."""

    @staticmethod
    @abstractmethod
    def get_rank() -> Optional[int]:
        """This process's rank, None outside a distributed job."""

    @abstractmethod
    def encode_output(self, out: Any, prefix: str, save: bool) -> list:
        """The ``output`` entries of a call's result (the framework's rule for sequences)."""

    @abstractmethod
    def module_params(self, module: Any) -> Iterable[tuple[str, Any]]:
        """A module's own ``(name, parameter)`` pairs (its children's left out)."""

    @abstractmethod
    def hook_param_grads(self, module: Any, key: str) -> None:
        """Hook the gradients of ``module``'s parameters: its ``<key>.parameters_grad`` record."""

    @abstractmethod
    def grad_hookable(self, value: Any) -> bool:
        """Whether ``value`` is a tensor whose gradient a hook can receive (``save(..., save_backward=True)``)."""

    @abstractmethod
    def on_grad(self, tensor: Any, hook: Any) -> None:
        """Call ``hook(gradient)`` when ``tensor``'s gradient is computed."""

    # ---------------------------------------------------------------- stopping (DumperCore.stop)
    def before_stop(self) -> None:
        """The dump is about to go off (still on): wait for work in flight that records."""

    def flush_records(self) -> None:
        """The dump is off: write the records still held back, before dump.json is published."""

    def after_publish(self) -> None:
        """dump.json is published: publish or reset what the framework holds beside it."""
