"""The data model of the reader: records as light digests with a locator.

A :class:`DumpRecord` starts as a name, a position and the (step, rank) it
belongs to, plus a :class:`~msprobe.readers._source.RankSource` that can fetch
its JSON; its arguments are parsed only when asked for, and tensors are read only
by :meth:`TensorRef.load`.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterator, Optional

from msprobe.errors import RecordNotFoundError, TensorLoadError
from msprobe.format.model import (
    Arg,
    MappingArg,
    SequenceArg,
    TensorArg,
    parse_arg,
)
from msprobe.format.naming import read_record_name
from msprobe.index.rows import forward_twin, record_fields, record_tensors
from msprobe.readers._replay import replay_inputs
from msprobe.readers._tensor import load_tensor_file

if TYPE_CHECKING:
    from msprobe.readers.protocols import RecordSource

__all__ = ["DumpRecord", "TensorRef", "bind_args"]


class TensorRef(TensorArg):
    """A tensor entry of a record that can load its tensor file.

    Everything of :class:`~msprobe.format.model.TensorArg` (``dtype``, ``shape``,
    ``stats``, ``md5``, ``requires_grad``, ``data_name``, ``to_json()``), plus
    ``load()``, ``has_nan``/``has_inf`` and the ``record`` it belongs to.
    """

    kind = "tensor"
    __slots__ = ("record",)

    def __init__(self, raw: Any, path: str = "", record: Optional["DumpRecord"] = None):
        super().__init__(raw, path)
        self.record = record

    @property
    def has_nan(self) -> bool:
        return any(isinstance(v, float) and math.isnan(v) for v in self.stats.values())

    @property
    def has_inf(self) -> bool:
        return any(isinstance(v, float) and math.isinf(v) for v in self.stats.values())

    @property
    def key(self) -> Optional[str]:
        """The storage key of the tensor file (None for a statistics-only entry)."""
        dn = self.data_name
        if not isinstance(dn, str) or self.record is None:
            return None
        ts = self.record.source.tensor_store() if hasattr(self.record.source, "tensor_store") else None
        if ts is not None:
            return ts.locations().get(dn)
        return self.record.source.tensor_key(dn)

    @property
    def url(self) -> Optional[str]:
        key = self.key
        return None if key is None else f"{self.record.source.store.url.rstrip('/')}/{key}"  # type: ignore[union-attr]

    def load(self, framework: str = "numpy", *, max_bytes: Optional[int] = None, check: bool = True) -> Any:
        """Read the dumped tensor (a numpy array; ``framework="torch"`` for a torch tensor).

        .pt files go through ``torch.load(weights_only=True)``, .npy files through
        ``numpy.load(allow_pickle=False)``; raw files (MindSpore dtypes numpy lacks) are
        decoded with the record's dtype and shape. numpy has no bfloat16/float8: such
        tensors come back as float32 arrays (exactly representable).
        Raises :class:`TensorLoadError` naming the record and the file.
        """
        rec_name = self.record.name if self.record is not None else "?"
        dn = self.data_name
        if not isinstance(dn, str):
            raise TensorLoadError(f"record {rec_name!r}: {self.path or 'argument'} has no data_name "
                                  "(a statistics-only dump holds no tensor files)")
        ts = self.record.source.tensor_store() if self.record is not None and hasattr(
            self.record.source, "tensor_store") else None
        if ts is not None:
            return ts.load(dn, framework, record=rec_name, dtype=self.dtype if check else None,
                           shape=self.shape if check else None)
        key = self.key
        return load_tensor_file(self.record.source.store, key,  # type: ignore[union-attr, arg-type]
                                record=rec_name, dtype=self.dtype,
                                shape=self.shape, framework=framework, max_bytes=max_bytes, check=check)

    def __repr__(self) -> str:
        extra = f", data_name={self.data_name!r}" if self.data_name else ""
        return f"TensorRef({self.path!r}, {self.dtype}, {list(self.shape)}{extra})"


def bind_args(arg: Arg, record: Optional["DumpRecord"]) -> Arg:
    """Replace every TensorArg inside ``arg`` by a TensorRef bound to ``record``."""
    if isinstance(arg, TensorArg) and not isinstance(arg, TensorRef):
        return TensorRef(arg.raw, arg.path, record)
    if isinstance(arg, SequenceArg):
        arg.items = [bind_args(a, record) for a in arg.items]
    elif isinstance(arg, MappingArg):
        arg.items = {k: bind_args(v, record) for k, v in arg.items.items()}
    return arg


class DumpRecord:
    """One record of a dump (an API call, a module call, a parameter gradient, a debug save).

    Digest fields are cheap: ``name``, ``kind``, ``api_type``, ``api_name``,
    ``call_index``, ``direction``, ``seq`` (execution order within its rank),
    ``step``, ``rank``, ``rank_dir``. Sections (``input_args``, ``input_kwargs``,
    ``output``, ``parameters``; ``input``/``output`` for backward records) are parsed
    from the rank's dump.json on first use.
    """

    __slots__ = ("name", "seq", "source", "_digest", "_raw", "_fields", "_dump")

    def __init__(self, name: str, seq: int, source: RecordSource, digest: Optional[dict] = None, dump: Any = None,
                 raw: Any = None):
        self.name = name
        self.seq = seq
        self.source = source
        self._digest = digest
        self._raw: Any = _UNSET if raw is None else raw  # the record's JSON object, when already parsed
        self._fields: Optional[tuple] = None
        self._dump = dump

    # -- digest -----------------------------------------------------------------
    def _f(self) -> tuple:
        if self._fields is None:
            d = self._digest
            if d is not None and "kind" in d:
                self._fields = (d.get("kind"), d.get("api_type"), d.get("api_name"), d.get("call_index"),
                                d.get("direction"))
            else:
                self._fields = record_fields(self.name)
        return self._fields

    kind = property(lambda self: self._f()[0], doc="'api' | 'module' | 'parameters_grad' | 'debug'")
    api_type = property(lambda self: self._f()[1], doc="'Functional', 'Tensor', 'Module', 'Cell', ...")
    api_name = property(lambda self: self._f()[2], doc="the name without api_type, call index and direction")
    call_index = property(lambda self: self._f()[3])
    direction = property(lambda self: self._f()[4], doc="'forward' | 'backward' | None")
    step = property(lambda self: self.source.step)
    rank = property(lambda self: self.source.rank)
    rank_dir = property(lambda self: self.source.rank_dir)

    @property
    def parsed(self) -> Any:
        """The :class:`~msprobe.format.naming.RecordName` (class name, module path, ...); a name outside
        the naming grammar gives kind ``"unknown"``, as ``kind`` does (one tolerant rule,
        :func:`~msprobe.format.naming.read_record_name`)."""
        return read_record_name(self.name)

    def __repr__(self) -> str:
        where = f"step={self.step}, rank_dir={self.rank_dir!r}"
        return f"DumpRecord({self.name!r}, {where}, seq={self.seq})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, DumpRecord) and other.name == self.name and other.seq == self.seq
                and other.source.key == self.source.key)

    def __hash__(self) -> int:
        return hash((self.name, self.seq, self.source.key))

    # -- the JSON, on demand ------------------------------------------------------
    @property
    def raw(self) -> Any:
        """The record's JSON value (reads dump.json the first time)."""
        if self._raw is _UNSET:
            self._raw = self.source.raw_record(self.name)
        return self._raw

    def to_json(self) -> Any:
        return self.raw

    def section(self, key: str) -> Optional[Arg]:
        raw = self.raw
        if not isinstance(raw, dict) or key not in raw:
            return None
        return bind_args(parse_arg(raw[key], key), self)

    def _list(self, key: str) -> list:
        s = self.section(key)
        if isinstance(s, SequenceArg):
            return list(s)
        return [] if s is None else [s]

    @property
    def input_args(self) -> list:
        return self._list("input_args")

    @property
    def input_kwargs(self) -> dict:
        s = self.section("input_kwargs")
        return dict(s.items) if isinstance(s, MappingArg) else {}

    @property
    def input(self) -> list:
        """Backward records: the gradients flowing in (of the forward outputs)."""
        return self._list("input")

    @property
    def output(self) -> list:
        return self._list("output")

    @property
    def parameters(self) -> dict:
        """Module parameters; for a parameters_grad record, the gradient of each parameter
        (a one-element list in the JSON is unwrapped to its tensor)."""
        if self.kind == "parameters_grad":
            raw = self.raw
            if not isinstance(raw, dict):
                return {}
            out = {}
            for k, v in raw.items():
                a = bind_args(parse_arg(v, k), self)
                out[k] = a.items[0] if isinstance(a, SequenceArg) and len(a) == 1 else a
            return out
        s = self.section("parameters")
        return dict(s.items) if isinstance(s, MappingArg) else {}

    @property
    def value(self) -> Arg:
        """Debug records: the saved value."""
        return bind_args(parse_arg(self.raw, ""), self)

    def args(self) -> Iterator[Arg]:
        """Every top-level section as an Arg (the whole value for parameters_grad/debug)."""
        raw = self.raw
        if self.kind in ("parameters_grad", "debug") or not isinstance(raw, dict):
            yield bind_args(parse_arg(raw, ""), self)
            return
        for key, value in raw.items():
            yield bind_args(parse_arg(value, key), self)

    def tensors(self) -> list:
        """[(io, TensorRef)] of every tensor-like argument, in document order."""
        return [(io, TensorRef(t, p, self)) for io, p, t in record_tensors(self.kind, self.raw)]

    def tensor(self, arg_path: str) -> TensorRef:
        for _, t in self.tensors():
            if t.path == arg_path:
                return t

        raise RecordNotFoundError(f"record {self.name!r} has no tensor at {arg_path!r}")

    # -- stack and structure --------------------------------------------------------
    @property
    def stack_id(self) -> Optional[str]:
        d = self._digest
        if d is not None and "stack_id" in d:
            return d["stack_id"]
        ids = self.source.stack_ids()
        sid = ids.get(self.name)
        if sid is None and self.direction == "backward":
            sid = ids.get(forward_twin(self.name, self.kind))
        return sid

    @property
    def stack(self) -> Optional[list]:
        """Call-stack frames from stack.json (a backward record gets its forward's stack)."""
        frames = self.source.frames_of(self.name)
        if frames is None and self.direction == "backward":
            frames = self.source.frames_of(forward_twin(self.name, self.kind))
        return frames

    @property
    def parent_name(self) -> Optional[str]:
        d = self._digest
        if d is not None and "parent" in d:
            return d["parent"]
        p = self.source.parents().get(self.name)
        return p if isinstance(p, str) else None

    @property
    def parent(self) -> Optional["DumpRecord"]:
        """The enclosing module's record (construct.json), None at the top or at L1."""
        name = self.parent_name
        if name is None or self._dump is None:
            return None
        return self._dump.record_in(self.source, name)

    @property
    def children_names(self) -> list:
        return [k for k, v in self.source.parents().items() if v == self.name]

    @property
    def children(self) -> list:
        if self._dump is None:
            return []
        out = []
        for n in self.children_names:
            r = self._dump.record_in(self.source, n)
            if r is not None:
                out.append(r)
        return out

    # -- replay ---------------------------------------------------------------------
    def replay_inputs(self, mode: str = "auto", *, framework: str = "torch", seed: Optional[int] = None,
                      need_grad: bool = False, max_generated_bytes: Optional[int] = None) -> tuple:
        """``(args, kwargs)`` to call the API again, like the real tool's run_ut.

        ``mode``: ``"real"`` loads every dumped tensor (an error when a tensor has no file),
        ``"random"`` generates every tensor from its dtype/shape/Max/Min, ``"auto"`` loads
        what was dumped and generates the rest. Non-tensor arguments are decoded
        (slices, ellipsis, torch dtypes, None, nested lists). ``max_generated_bytes``: the most
        bytes the generated tensors of this call may take together, checked from the declared
        shapes before anything is generated (:class:`msprobe.readers._replay.InputTooLargeError`).
        """
        return replay_inputs(self, mode=mode, framework=framework, seed=seed, need_grad=need_grad,
                             max_generated_bytes=max_generated_bytes)

    def summary(self) -> dict:
        """The digest as a plain dict."""
        return {"name": self.name, "kind": self.kind, "api_type": self.api_type, "api_name": self.api_name,
                "call_index": self.call_index, "direction": self.direction, "step": self.step,
                "rank": self.rank, "rank_dir": self.rank_dir, "seq": self.seq}


class _Unset:
    __slots__ = ()


_UNSET = _Unset()
