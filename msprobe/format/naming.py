"""The naming grammar of msprobe dumps, in one place.

Record names (keys of ``dump.json``'s ``data``) come in four kinds:

* **api**: ``{Prefix}.{api}.{n}.{forward|backward}``, e.g. ``Functional.linear.0.forward``,
  ``Tensor.__add__.3.backward``, ``Primitive.conv2d.Conv2D.0.forward`` (MindSpore
  primitives carry their class), ``Aten.add.Tensor.0.forward`` (aten overloads).
* **module**: ``{Module|Cell}[.{list index}].{path}.{Class}.{forward|backward}.{n}``,
  e.g. ``Module.layers.0.attn.Linear.forward.1``.
* **parameters_grad**: ``{Module|Cell}.{path}.{Class}.parameters_grad`` (msprobe 8.x) or
  with a trailing count ``...parameters_grad.{n}`` (msprobe 26.x).
* **debug**: ``{name}.{n}.debug`` and ``{name}_grad.{n}.debug`` (``save()`` at level debug).

Data names (files under ``dump_tensor_data``) are a record name followed by the
argument path and an extension: ``{record}.{input|output|kwargs.{k}|parameters.{p}}.{i}[.{j}...]{.pt|.npy}``.

Everything is parsed into fields and formatted back byte-for-byte.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from msprobe.errors import NameFormatError, UnsafePathError

__all__ = [
    "printable",
    "API_PREFIXES",
    "PYTORCH_API_PREFIXES",
    "MINDSPORE_API_PREFIXES",
    "MODULE_PREFIXES",
    "API_NAME_RE",
    "MODULE_NAME_RE",
    "PARAMS_GRAD_NAME_RE",
    "DEBUG_NAME_RE",
    "DATA_NAME_RE",
    "MAX_FILE_NAME_LENGTH",
    "RecordName",
    "DataName",
    "parse_record_name",
    "is_record_name",
    "read_record_name",
    "parse_data_name",
    "check_file_name",
    "needs_mapping",
    "converted_file_name",
    "register_prefix",
]

PYTORCH_API_PREFIXES = ("Tensor", "Torch", "Functional", "NPU", "VF", "Aten", "Distributed", "MindSpeed")
MINDSPORE_API_PREFIXES = (
    "Tensor", "Functional", "Primitive", "Mint", "MintFunctional", "MintDistributed", "Distributed", "Jit",
    "Communication",
)
# Mutable on purpose: register_prefix() adds custom prefixes (register_custom_api with api_prefix).
API_PREFIXES: set[str] = set(PYTORCH_API_PREFIXES) | set(MINDSPORE_API_PREFIXES)
MODULE_PREFIXES = ("Module", "Cell")
DIRECTIONS = ("forward", "backward")

#: File names longer than this are replaced by a 32-digit name recorded in mapping.csv.
MAX_FILE_NAME_LENGTH = 255

_SEG = r"[^./\\\s]+"  # one dotted segment: no dot, separator or whitespace
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"

#: ``{Prefix}.{api}.{n}.{forward|backward}``; ``api`` may hold dots (Primitive class, aten overload).
API_NAME_RE = re.compile(
    rf"^(?P<prefix>{_IDENT})\.(?P<api>{_SEG}(?:\.{_SEG})*?)\.(?P<n>\d+)\.(?P<direction>forward|backward)$"
)
#: ``{Module|Cell}.{path}.{Class}.{forward|backward}.{n}``; ``path`` may hold dots.
MODULE_NAME_RE = re.compile(
    rf"^(?P<prefix>Module|Cell)\.(?P<path>{_SEG}(?:\.{_SEG})*?)\.(?P<cls>{_IDENT})\.(?P<direction>forward|backward)\.(?P<n>\d+)$"
)
#: ``{Module|Cell}.{path}.{Class}.parameters_grad[.{n}]``.
PARAMS_GRAD_NAME_RE = re.compile(
    rf"^(?P<prefix>Module|Cell)\.(?P<path>{_SEG}(?:\.{_SEG})*?)\.(?P<cls>{_IDENT})\.parameters_grad(?:\.(?P<n>\d+))?$"
)
#: ``{name}.{n}.debug``; a gradient of a saved variable is ``{name}_grad.{n}.debug``.
DEBUG_NAME_RE = re.compile(r"^(?P<name>[^/\\\x00]+?)\.(?P<n>\d+)\.debug$")

_RECORD_END = (
    r"(?:\d+\.(?:forward|backward)"  # api
    r"|(?:forward|backward)\.\d+"  # module
    r"|parameters_grad(?:\.\d+)?"  # parameters_grad (8.x / 26.x)
    r"|\d+\.debug)"  # debug
)
#: A data name, split at the end of its record name.
DATA_NAME_RE = re.compile(rf"^(?P<record>.+?\.{_RECORD_END})(?:\.(?P<rest>.+?))?\.(?P<ext>pt|npy)$")


def register_prefix(prefix: str) -> None:
    """Accept ``prefix`` as an API prefix (custom APIs registered by the user)."""
    if not re.fullmatch(_IDENT, prefix) or prefix in MODULE_PREFIXES:
        raise NameFormatError(f"invalid API prefix {prefix!r}: must be an identifier other than Module/Cell")
    API_PREFIXES.add(prefix)


@dataclass(frozen=True)
class RecordName:
    """A record name parsed into its fields. ``str(rn)`` gives the name back byte-for-byte."""

    kind: str  # 'api' | 'module' | 'parameters_grad' | 'debug' | 'unknown' (read_record_name: outside the grammar)
    prefix: str  # api_type: 'Functional', 'Module', 'Cell', ... ('' for debug)
    api_name: str  # api: 'linear'; module/parameters_grad: the module path; debug: the saved name
    call_index: Optional[int]  # the call count; None for 8.x parameters_grad
    direction: Optional[str]  # 'forward' | 'backward' | None
    class_name: Optional[str] = None  # module class, or the MindSpore primitive class
    is_grad: bool = False  # debug: the '{name}_grad' form
    raw: str = field(default="", compare=False)

    def __str__(self) -> str:
        return self.raw or self.format()

    @property
    def module_path(self) -> Optional[str]:
        return self.api_name if self.kind in ("module", "parameters_grad") else None

    def format(self) -> str:
        """Serialize the fields (independent of ``raw``)."""
        if self.kind == "api":
            api = f"{self.api_name}.{self.class_name}" if self.class_name else self.api_name
            return f"{self.prefix}.{api}.{self.call_index}.{self.direction}"
        if self.kind == "module":
            return f"{self.prefix}.{self.api_name}.{self.class_name}.{self.direction}.{self.call_index}"
        if self.kind == "parameters_grad":
            base = f"{self.prefix}.{self.api_name}.{self.class_name}.parameters_grad"
            return base if self.call_index is None else f"{base}.{self.call_index}"
        if self.kind == "debug":
            name = f"{self.api_name}_grad" if self.is_grad else self.api_name
            return f"{name}.{self.call_index}.debug"
        if self.kind == "unknown":
            return self.api_name
        raise NameFormatError(f"unknown record kind {self.kind!r}")

    @property
    def forward_name(self) -> str:
        """The forward twin of a backward record name (itself for others)."""
        if self.direction != "backward":
            return str(self)
        if self.kind == "api":
            return str(self)[: -len("backward")] + "forward"
        base = str(self)[: -len(f"backward.{self.call_index}")]
        return f"{base}forward.{self.call_index}"


def _bad_segment(name: str) -> Optional[str]:
    if not name:
        return "empty name"
    if "/" in name or "\\" in name or "\x00" in name:
        return "contains a path separator or NUL"
    if name.startswith(".") or name.endswith(".") or ".." in name:
        return "empty dotted segment"
    if any(char in name for char in "\r\n\t"):
        return "contains a control character"
    return None


def parse_record_name(name: str, *, strict: bool = True) -> RecordName:
    """Parse a record name (a key of dump.json ``data`` or debug.json ``data``).

    With ``strict`` (default), an API prefix must be a known or registered one.
    Raises :class:`NameFormatError` when the name follows no rule of the grammar.
    """
    if not isinstance(name, str):
        raise NameFormatError(f"record name must be a string, got {type(name).__name__}")
    why = _bad_segment(name)
    if why:
        raise NameFormatError(f"invalid record name {name!r}: {why}")
    match = DEBUG_NAME_RE.match(name)
    if match:
        base = match.group("name")
        is_grad = base.endswith("_grad")
        return RecordName("debug", "", base[: -len("_grad")] if is_grad else base, int(match.group("n")), None,
                          None, is_grad, name)
    match = PARAMS_GRAD_NAME_RE.match(name)
    if match:
        n = match.group("n")
        return RecordName("parameters_grad", match.group("prefix"), match.group("path"), None if n is None else int(n),
                          None, match.group("cls"), False, name)
    match = MODULE_NAME_RE.match(name)
    if match:
        return RecordName("module", match.group("prefix"), match.group("path"), int(match.group("n")),
                          match.group("direction"), match.group("cls"), False, name)
    match = API_NAME_RE.match(name)
    if match and match.group("prefix") not in MODULE_PREFIXES:
        prefix, api = match.group("prefix"), match.group("api")
        if strict and prefix not in API_PREFIXES:
            raise NameFormatError(f"invalid record name {name!r}: unknown API prefix {prefix!r} "
                                  f"(known: {', '.join(sorted(API_PREFIXES))})")
        cls = None
        if prefix == "Primitive" and "." in api:
            api, cls = api.split(".", 1)
        return RecordName("api", prefix, api, int(match.group("n")), match.group("direction"), cls, False, name)
    raise NameFormatError(f"invalid record name {name!r}: matches no rule of the naming grammar "
                          "(api, module, parameters_grad or debug)")


def read_record_name(name: str) -> RecordName:
    """The readers' one tolerant rule: :func:`parse_record_name` without ``strict``, and a name
    outside the grammar (``api``, ``Module``, ``matmul.backward``) is a record of kind
    ``"unknown"`` (its whole name as ``api_name``, no prefix, call index or direction) instead
    of a :class:`NameFormatError`. ``ls``, ``show``, the index, compare and
    ``DumpRecord.parsed`` all read names through it; ``validate`` reports such names."""
    try:
        return parse_record_name(name, strict=False)
    except NameFormatError:
        return RecordName("unknown", "", str(name), None, None, None, False, str(name))


def is_record_name(name: str, *, strict: bool = True) -> bool:
    try:
        parse_record_name(name, strict=strict)
    except NameFormatError:
        return False
    return True


@dataclass(frozen=True)
class DataName:
    """A tensor file name split into its record, argument path and extension."""

    record: str
    io: Optional[str]  # 'input' | 'output' | 'kwargs' | 'parameters' | None (parameters_grad / debug)
    path: tuple[str, ...]  # the remaining dotted segments (indices, kwarg or parameter names)
    ext: str  # 'pt' | 'npy'
    raw: str = field(default="", compare=False)

    def __str__(self) -> str:
        return self.raw or self.format()

    def format(self) -> str:
        parts = [self.record]
        if self.io:
            parts.append(self.io)
        parts.extend(self.path)
        return ".".join(parts) + "." + self.ext


_IO_WORDS = ("input", "output", "kwargs", "parameters")


def parse_data_name(data_name: str, record: Optional[str] = None) -> DataName:
    """Split a ``data_name``; pass ``record`` when known (it removes any ambiguity)."""
    check_file_name(data_name)
    if record is not None:
        if not data_name.startswith(record + "."):
            raise NameFormatError(f"data name {data_name!r} does not start with its record name {record!r}")
        match = re.match(r"^(?:\.(?P<rest>.+?))?\.(?P<ext>pt|npy)$", data_name[len(record):])
        if not match:
            raise NameFormatError(f"data name {data_name!r} has no .pt/.npy extension")
        rest, ext = match.group("rest"), match.group("ext")
    else:
        match = DATA_NAME_RE.match(data_name)
        if not match:
            raise NameFormatError(f"invalid data name {data_name!r}: no record name followed by .pt/.npy")
        record, rest, ext = match.group("record"), match.group("rest"), match.group("ext")
    segs = tuple(rest.split(".")) if rest else ()
    io = None
    if segs and segs[0] in _IO_WORDS:
        io, segs = segs[0], segs[1:]
    return DataName(record, io, segs, ext, data_name)


def check_file_name(name: str) -> str:
    """Reject names that could escape ``dump_tensor_data`` (``..``, separators, absolute, NUL)."""
    if not isinstance(name, str) or not name:
        raise UnsafePathError(f"file name must be a non-empty string, got {name!r}")
    if "/" in name or "\\" in name or "\x00" in name or name in (".", "..") or name.startswith(".."):
        raise UnsafePathError(f"unsafe file name {name!r}: it must name a file inside dump_tensor_data")
    if re.match(r"^[A-Za-z]:", name):
        raise UnsafePathError(f"unsafe file name {name!r}: drive-qualified")
    return name


def converted_file_name(data_name: str) -> str:
    """A random 32-digit file name with ``data_name``'s extension, for a name longer than
    MAX_FILE_NAME_LENGTH (recorded in mapping.csv, spec/FORMAT.md 7.3)."""
    import secrets

    return "".join(str(secrets.randbelow(10)) for _ in range(32)) + "." + data_name.rsplit(".", 1)[-1]


def needs_mapping(file_name: str) -> bool:
    """True when a file name exceeds 255 characters and must be renamed via mapping.csv."""
    return len(file_name) > MAX_FILE_NAME_LENGTH


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` safe for a terminal: control characters (ESC sequences, CR, BEL, bidi controls, and
    newlines unless ``keep_newlines``) written as ``\\xNN``/``\\uNNNN`` escapes, so a hostile record
    name cannot move the cursor, clear the screen or fake output lines."""
    if text.isprintable():
        return text
    out = []
    for char in text:
        if char.isprintable() or (keep_newlines and char in "\n\t"):
            out.append(char)
        else:
            out.append(char.encode("unicode_escape").decode("ascii") if ord(char) > 0xFF or char in "\t\n\r"
                       else f"\\x{ord(char):02x}")
    return "".join(out)
