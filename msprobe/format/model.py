"""The record model: arguments and records, over the JSON they came from.

Every object keeps the JSON value it was parsed from (``.raw``), so
``to_json()`` returns exactly what was read, key order and unknown keys
included; the typed properties are views over it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Optional, Union

from msprobe.errors import DocumentError
from msprobe.format.naming import RecordName, check_file_name, parse_record_name, read_record_name
from msprobe.format.stats import STAT_KEYS, STATISTICS

__all__ = [
    "TENSOR_TYPES",
    "infer_framework",
    "Arg",
    "TensorArg",
    "ScalarArg",
    "NoneArg",
    "SliceArg",
    "EllipsisArg",
    "TypedValueArg",
    "SequenceArg",
    "MappingArg",
    "UnknownArg",
    "parse_arg",
    "iter_tensors",
    "Record",
    "tensor_entry",
    "is_tensor_entry",
    "tensor_entries",
    "data_names",
    "typed_value",
]

#: ``type`` values of tensor entries, per framework.
TENSOR_TYPES = frozenset({
    "torch.Tensor", "torch.nn.parameter.Parameter", "mindspore.Tensor", "mindspore.Parameter",
    "mindspore.common.parameter.Parameter", "numpy.ndarray", "mindtorch.Tensor",
})
_STAT_KEYS = STAT_KEYS


def is_tensor_entry(value: Any) -> bool:
    """A tensor entry (spec/FORMAT.md 10.2): an object whose ``type`` is one of TENSOR_TYPES, or
    any object with a string ``type`` and both ``dtype`` and ``shape``."""
    if not isinstance(value, dict):
        return False
    type_name = value.get("type")
    return isinstance(type_name, str) and (type_name in TENSOR_TYPES or "dtype" in value and "shape" in value)


class Arg:
    """One argument value in a record (a tensor entry, a scalar, null, a nested container...)."""

    kind = "unknown"
    __slots__ = ("raw", "path")

    def __init__(self, raw: Any, path: str = ""):
        self.raw = raw
        self.path = path  # e.g. 'input_args.0.1', 'input_kwargs.dim', 'parameters.weight'

    def to_json(self) -> Any:
        return self.raw

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r}, {self.raw!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Arg) and type(self) is type(other) and self.raw == other.raw

    __hash__ = None  # type: ignore[assignment]


class TensorArg(Arg):
    """A tensor entry: type, dtype, shape, Max/Min/Mean/Norm, requires_grad, md5 or data_name."""

    kind = "tensor"
    __slots__ = ()

    type = property(lambda self: self.raw.get("type"))
    dtype = property(lambda self: self.raw.get("dtype"))
    requires_grad = property(lambda self: self.raw.get("requires_grad"))
    data_name = property(lambda self: self.raw.get("data_name"))
    md5 = property(lambda self: self.raw.get("md5"))

    @property
    def shape(self) -> tuple:
        """The declared shape; () when there is none. A shape that is not a list of integers >= 0
        whose product fits int64 (``[NaN, 12]``, ``[Infinity, 12]``, ``[2**63, 2]``) is a
        :class:`~msprobe.errors.DocumentError`, never a ValueError/OverflowError later."""
        dims = self.raw.get("shape")
        if not isinstance(dims, list):
            return ()
        if not is_valid_shape(dims):
            raise DocumentError(f"tensor {self.path or 'entry'}: shape {str(dims)[:80]} is not a list of integers >= 0 "
                                "whose product fits int64")
        return tuple(dims)

    @property
    def numel(self) -> int:
        count = 1
        for dim in self.shape:
            count *= int(dim)
        return count

    max = property(lambda self: self.raw.get("Max"))
    min = property(lambda self: self.raw.get("Min"))
    mean = property(lambda self: self.raw.get("Mean"))
    norm = property(lambda self: self.raw.get("Norm"))

    @property
    def stats(self) -> dict:
        return {s.column: self.raw.get(s.key) for s in STATISTICS}


class ScalarArg(Arg):
    """``{"type": "int"|"float"|"bool"|"str"|"complex", "value": V}``."""

    kind = "scalar"
    __slots__ = ()
    type = property(lambda self: self.raw.get("type"))
    value = property(lambda self: self.raw.get("value"))


class NoneArg(Arg):
    """A bare JSON ``null``."""

    kind = "none"
    __slots__ = ()
    value = None


class SliceArg(Arg):
    """``{"type": "slice", "value": [start, stop, step]}``."""

    kind = "slice"
    __slots__ = ()

    @property
    def value(self) -> slice:
        bounds = self.raw.get("value") or [None, None, None]
        return slice(*bounds)


class EllipsisArg(Arg):
    """``{"type": "ellipsis", "value": "..."}``."""

    kind = "ellipsis"
    __slots__ = ()
    value = Ellipsis


class TypedValueArg(Arg):
    """dtype, device, memory_format, ReduceOp and other ``{"type": T, "value"|"format": V}`` values."""

    kind = "typed"
    __slots__ = ()
    type = property(lambda self: self.raw.get("type"))

    @property
    def value(self) -> Any:
        return self.raw.get("value", self.raw.get("format"))


class SequenceArg(Arg):
    """A JSON list (a list or tuple argument); items are Args."""

    kind = "sequence"
    __slots__ = ("items",)

    def __init__(self, raw: list, path: str = "", depth: int = 0):
        super().__init__(raw, path)
        _check_depth(depth, path)
        self.items = [parse_arg(item, f"{path}.{index}" if path else str(index), depth + 1)
                      for index, item in enumerate(raw)]

    def __iter__(self) -> Iterator[Arg]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Arg:
        return self.items[i]


class MappingArg(Arg):
    """A JSON object without a ``type`` key (a dict argument); values are Args."""

    kind = "mapping"
    __slots__ = ("items",)

    def __init__(self, raw: dict, path: str = "", depth: int = 0):
        super().__init__(raw, path)
        _check_depth(depth, path)
        self.items = {key: parse_arg(item, f"{path}.{key}" if path else str(key), depth + 1)
                      for key, item in raw.items()}

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, k: str) -> Arg:
        return self.items[k]

    def keys(self):
        return self.items.keys()

    def values(self):
        return self.items.values()


class UnknownArg(Arg):
    """Anything else (kept verbatim: the unknown-field rule)."""

    kind = "unknown"
    __slots__ = ()


_SCALAR_TYPES = {"int", "float", "bool", "str", "complex"}


#: arguments nested deeper than this are refused (hostile input; real records nest a few levels):
#: a DocumentError instead of a RecursionError in every reader of the Arg tree
MAX_ARG_DEPTH = 64


def _check_depth(depth: int, path: str) -> None:
    if depth > MAX_ARG_DEPTH:
        raise DocumentError(f"argument {path[:60]}...: nested deeper than {MAX_ARG_DEPTH} levels")


#: a tensor entry's ``type`` prefix -> the framework that wrote it (``mindtorch`` runs on MindSpore)
_FRAMEWORK_OF_TYPE = (("torch.", "pytorch"), ("mindspore.", "mindspore"), ("mindtorch.", "mindspore"))


def infer_framework(data: dict, limit: int = 64) -> Optional[tuple]:
    """(framework, why) from the tensor entries of the first ``limit`` records of a document's
    ``data``, as the real tool does for a dump without a top-level ``framework`` key (every dump
    before 2025-02): ``("mindspore", "entry type mindspore.Tensor")``. None when no entry names a
    framework (no tensor, or only ``numpy.ndarray``)."""
    for i, rec in enumerate(data.values()):
        if i >= limit:
            break
        try:
            found = tensor_entries(rec)
        except DocumentError:
            continue
        for _path, entry in found:
            type_name = entry.get("type")
            for prefix, framework in _FRAMEWORK_OF_TYPE:
                if isinstance(type_name, str) and type_name.startswith(prefix):
                    return framework, f"entry type {type_name}"
    return None


def tensor_entries(value: Any, path: str = "", *, bounded: bool = True) -> list:
    """[(argument path, entry)] of every tensor entry in a raw JSON value, depth first in document
    order: the one leaf walker over raw records (objects without ``type`` and arrays are walked
    into; other typed values are leaves). ``bounded``: a DocumentError past MAX_ARG_DEPTH."""
    out: list = []
    _walk_entries(value, path, out, 0, MAX_ARG_DEPTH if bounded else None)
    return out


def _walk_entries(value: Any, path: str, out: list, depth: int, limit: Optional[int]) -> None:
    """Scalars are passed over where they are met (no call, no path made for them): only an
    object or an array can hold a tensor entry."""
    if not isinstance(value, (dict, list)):
        return
    if limit is not None and depth > limit:
        _check_depth(depth, path)
    if isinstance(value, dict):
        type_name = value.get("type")
        if type_name is None:
            for key, item in value.items():
                if isinstance(item, (dict, list)):
                    _walk_entries(item, f"{path}.{key}" if path else str(key), out, depth + 1, limit)
        elif isinstance(type_name, str) and (type_name in TENSOR_TYPES or "dtype" in value and "shape" in value):
            out.append((path, value))  # is_tensor_entry, inline
    else:
        for index, item in enumerate(value):
            if isinstance(item, (dict, list)):
                _walk_entries(item, f"{path}.{index}" if path else str(index), out, depth + 1, limit)


def parse_arg(raw: Any, path: str = "", depth: int = 0) -> Arg:
    """Classify one JSON argument value (``depth``: how deep it is nested, bounded by MAX_ARG_DEPTH)."""
    if raw is None:
        return NoneArg(raw, path)
    if isinstance(raw, list):
        return SequenceArg(raw, path, depth)
    if isinstance(raw, dict):
        type_name = raw.get("type")
        if type_name is None:
            return MappingArg(raw, path, depth)
        if not isinstance(type_name, str):
            return UnknownArg(raw, path)
        if is_tensor_entry(raw):
            return TensorArg(raw, path)
        if type_name in _SCALAR_TYPES:
            return ScalarArg(raw, path)
        if type_name == "slice":
            return SliceArg(raw, path)
        if type_name == "ellipsis":
            return EllipsisArg(raw, path)
        if "value" in raw or "format" in raw:
            return TypedValueArg(raw, path)
        return UnknownArg(raw, path)
    return UnknownArg(raw, path)


def iter_tensors(arg: Arg) -> Iterator[TensorArg]:
    """Every tensor entry inside ``arg``, depth first, in order."""
    if isinstance(arg, TensorArg):
        yield arg
    elif isinstance(arg, (SequenceArg, MappingArg)):
        items = arg.items.values() if isinstance(arg, MappingArg) else arg.items
        for a in items:
            yield from iter_tensors(a)


def data_names(raw: Any, *, bounded: bool = True) -> list:
    """The ``data_name`` strings of the tensor entries in a raw JSON value, in order (the files a
    record being written refers to; :meth:`Record.data_names` reads a record's sections)."""
    return [entry["data_name"] for _, entry in tensor_entries(raw, bounded=bounded)
            if isinstance(entry.get("data_name"), str)]


# Sections of a record, in the order the real tool writes them.
FORWARD_SECTIONS = ("input_args", "input_kwargs", "output", "parameters")
BACKWARD_SECTIONS = ("input", "output")


@dataclass
class Record:
    """One entry of dump.json ``data`` (or debug.json ``data``)."""

    name: str
    raw: Any
    seq: int = -1  # position in the document (execution order)

    def __post_init__(self) -> None:
        self._parsed: Optional[RecordName] = None

    @property
    def parsed(self) -> RecordName:
        if self._parsed is None:
            self._parsed = read_record_name(self.name)  # tolerant: kind 'unknown' outside the grammar
        return self._parsed

    kind = property(lambda self: self.parsed.kind)
    api_type = property(lambda self: self.parsed.prefix)
    api_name = property(lambda self: self.parsed.api_name)
    call_index = property(lambda self: self.parsed.call_index)
    direction = property(lambda self: self.parsed.direction)

    def section(self, key: str) -> Optional[Arg]:
        if not isinstance(self.raw, dict) or key not in self.raw:
            return None
        return parse_arg(self.raw[key], key)

    @property
    def input_args(self) -> list[Arg]:
        section = self.section("input_args")
        return list(section) if isinstance(section, SequenceArg) else []

    @property
    def input_kwargs(self) -> dict[str, Arg]:
        section = self.section("input_kwargs")
        return dict(section.items) if isinstance(section, MappingArg) else {}

    @property
    def input(self) -> list[Arg]:
        section = self.section("input")
        return list(section) if isinstance(section, SequenceArg) else []

    @property
    def output(self) -> list[Arg]:
        section = self.section("output")
        if isinstance(section, SequenceArg):
            return list(section)
        return [] if section is None else [section]

    @property
    def parameters(self) -> dict[str, Arg]:
        if self.kind == "parameters_grad":
            section = parse_arg(self.raw, "") if isinstance(self.raw, dict) else None
        else:
            section = self.section("parameters")
        return dict(section.items) if isinstance(section, MappingArg) else {}

    def args(self) -> Iterator[Arg]:
        """Every top-level section value of the record as Args (with their paths)."""
        if self.kind == "parameters_grad" or self.kind == "debug":
            yield parse_arg(self.raw, "")
            return
        if isinstance(self.raw, dict):
            for key, value in self.raw.items():
                yield parse_arg(value, key)

    def tensors(self) -> Iterator[TensorArg]:
        for arg in self.args():
            yield from iter_tensors(arg)

    def data_names(self) -> list[str]:
        return [tensor.data_name for tensor in self.tensors() if isinstance(tensor.data_name, str)]

    def to_json(self) -> Any:
        return self.raw

    def check(self, file: Optional[str] = None) -> None:
        """Validate what readers rely on; raise DocumentError naming the JSON path."""
        loc = f'$.data["{self.name}"]'
        parse_record_name(self.name, strict=False)  # validation reports a name outside the grammar
        if self.kind in ("api", "module") and not isinstance(self.raw, dict):
            raise DocumentError(f"record must be an object, got {type(self.raw).__name__}", file=file, location=loc)
        for tensor in self.tensors():
            _check_tensor(tensor, file, f"{loc}.{tensor.path}")


#: the largest element count a shape may declare (int64, as the index and the frameworks hold it)
MAX_NUMEL = (1 << 63) - 1


def is_valid_shape(shape: Any) -> bool:
    """A list of integers >= 0 (no bools, no floats) whose product fits int64."""
    if not isinstance(shape, (list, tuple)):
        return False
    count = 1
    for dim in shape:
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 0 or dim > MAX_NUMEL:
            return False
        count *= dim
    return count <= MAX_NUMEL


def _check_tensor(tensor: TensorArg, file: Optional[str], loc: str) -> None:
    raw = tensor.raw
    if not isinstance(raw.get("dtype"), str):
        raise DocumentError("tensor entry needs a string 'dtype'", file=file, location=loc)
    shape = raw.get("shape")
    if not is_valid_shape(shape):
        raise DocumentError(f"tensor 'shape' must be a list of non-negative integers whose product fits int64, "
                            f"got {str(shape)[:80]}", file=file, location=loc)
    for key in _STAT_KEYS:
        item = raw.get(key)
        if item is not None and not isinstance(item, (int, float, bool)):
            raise DocumentError(f"'{key}' must be a number, a boolean or null, got {item!r}", file=file, location=loc)
    dn = raw.get("data_name")
    if dn is not None:
        if not isinstance(dn, str):
            raise DocumentError("'data_name' must be a string", file=file, location=loc)
        try:
            check_file_name(dn)
        except Exception as exc:  # noqa: BLE001 - any naming failure is one DocumentError at this location
            raise DocumentError(str(exc), file=file, location=loc) from None
    md5 = raw.get("md5")
    # a string; msprobe 26.x xor mode writes a 0-d float tensor's value itself (a number)
    if md5 is not None and (isinstance(md5, bool) or not isinstance(md5, (str, int, float))):
        raise DocumentError(f"'md5' must be a string (or a number), got {md5!r}", file=file, location=loc)
    rg = raw.get("requires_grad")
    if rg is not None and not isinstance(rg, bool):
        raise DocumentError(f"'requires_grad' must be a boolean or null, got {rg!r}", file=file, location=loc)


def tensor_entry(
    type_: str,
    dtype: str,
    shape: Union[list, tuple],
    stats: Optional[tuple] = None,
    requires_grad: Optional[bool] = None,
    *,
    md5: Optional[str] = None,
    data_name: Optional[str] = None,
    stats_keys: bool = True,
) -> dict:
    """Build a tensor entry with the real tool's key order:
    type, dtype, shape, Max, Min, Mean, Norm, requires_grad, then md5 or data_name."""
    entry: dict = {"type": type_, "dtype": dtype, "shape": list(shape)}
    if stats_keys:
        mx, mn, mean, norm = stats if stats is not None else (None, None, None, None)
        entry["Max"], entry["Min"], entry["Mean"], entry["Norm"] = mx, mn, mean, norm
    if requires_grad is not None:
        entry["requires_grad"] = requires_grad
    if md5 is not None:
        entry["md5"] = md5
    if data_name is not None:
        entry["data_name"] = data_name
    return entry


def typed_value(type_: str, value: Any, key: str = "value") -> dict:
    """``{"type": T, "value": V}`` (``key="format"`` for 8.x memory_format)."""
    return {"type": type_, key: value}
