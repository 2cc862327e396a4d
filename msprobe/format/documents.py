"""The JSON documents of a rank directory: dump.json (and debug.json), stack.json, construct.json.

Parsing is strict about what readers rely on and tolerant of what they do not
know: unknown keys are kept (and written back in place); duplicate keys,
truncated JSON, wrong types and unsafe names are :class:`DocumentError`\\ s
naming the file and the JSON path.
"""
from __future__ import annotations

import json
import math
from typing import Any, Callable, Iterator, Optional, TypeVar, Union

from msprobe.errors import DocumentError, FormatError, NameFormatError, RecordNotFoundError
from msprobe.format.fragments import HEADER_KEYS, not_a_document, read_fragment
from msprobe.format.model import Record

__all__ = [
    "DUMP_JSON",
    "DEBUG_JSON",
    "STACK_JSON",
    "CONSTRUCT_JSON",
    "MAX_JSON_DEPTH",
    "loads_json",
    "dumps_json",
    "dumps_records_json",
    "encode_document",
    "encode_documents",
    "DumpDocument",
    "DebugDocument",
    "StackDocument",
    "ConstructDocument",
    "SIDE_DOCUMENTS",
]

DUMP_JSON = "dump.json"
DEBUG_JSON = "debug.json"
STACK_JSON = "stack.json"
CONSTRUCT_JSON = "construct.json"
#: Nesting deeper than this is refused (hostile input; real dumps stay far below).
MAX_JSON_DEPTH = 64

_TOP_KEYS = ("task", "level", "framework", "dump_data_dir", "data")


def _no_duplicates(pairs: list) -> dict:
    data = dict(pairs)
    if len(data) != len(pairs):
        seen: set = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return data


class _DuplicateKey(Exception):
    pass


def _depth_ok(text: str, limit: int) -> Optional[int]:
    """Return the offset where nesting exceeds ``limit`` (strings skipped), else None."""
    depth = 0
    in_str = esc = False
    for index, c in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "[{":
            depth += 1
            if depth > limit:
                return index
        elif c in "]}":
            depth -= 1
    return None


def loads_json(data: Union[bytes, str], file: Optional[str] = None) -> Any:
    """Parse JSON as the real tool writes it (NaN/Infinity allowed), refusing duplicate keys,
    bad UTF-8 and excessive nesting, with a :class:`DocumentError` naming ``file``."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DocumentError(f"not UTF-8 at byte {exc.start}", file=file) from None
    else:
        text = data
    if text.startswith("\ufeff"):
        text = text[1:]
    if len(text) < (1 << 20):  # cheap enough on small documents; large ones rely on RecursionError
        where = _depth_ok(text, MAX_JSON_DEPTH)
        if where is not None:
            raise DocumentError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels (at offset {where})", file=file)
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as exc:
        raise DocumentError(f"duplicate key {exc.args[0]!r}", file=file) from None
    except json.JSONDecodeError as exc:
        what = "truncated JSON" if exc.pos >= len(text.rstrip()) else "invalid JSON"
        raise DocumentError(f"{what}: {exc.msg} at line {exc.lineno} column {exc.colno}", file=file) from None
    except RecursionError:
        raise DocumentError("JSON nested too deeply", file=file) from None


def dumps_json(obj: Any) -> str:
    """Serialize exactly like the real tool (``json.dump(obj, f, indent=1)``): indent 1,
    non-ASCII escaped as ``\\uXXXX``, NaN/Infinity as JSON extensions, no trailing newline."""
    return json.dumps(obj, indent=1)


_COMPACT = json.JSONEncoder(separators=(", ", ": "))


def dumps_records_json(head: dict, data_key: str = "data", encoded: Optional[dict] = None) -> str:
    """The writer's fast layout: top-level keys one per line, then one record per line.

    The same JSON value as :func:`dumps_json` (any JSON parser reads both), at C speed,
    and a dump.json that ``grep`` can search record by record. ``encoded``: record name ->
    (the record object, its JSON text) made already (the producer's journal lines), used for
    a record that is still that object.
    """
    enc = _COMPACT.encode
    parts = ["{"]
    items = list(head.items())
    for index, (key, value) in enumerate(items):
        comma = "" if index == len(items) - 1 else ","
        if key == data_key and isinstance(value, dict) and value:
            parts.append(f" {enc(key)}: {{")
            if encoded:
                parts.append(",\n".join(f"  {enc(name)}: {_text(encoded.get(name), rec, enc)}"
                                         for name, rec in value.items()))
            else:
                parts.append(",\n".join(f"  {enc(name)}: {enc(rec)}" for name, rec in value.items()))
            parts.append(" }" + comma)
        else:
            parts.append(f" {enc(key)}: {enc(value)}{comma}")
    parts.append("}")
    return "\n".join(parts)


def _text(done: Optional[tuple], rec: Any, enc: Callable[[Any], str]) -> str:
    return done[1] if done is not None and done[0] is rec else enc(rec)


def _unwrap(text: str) -> bytes:
    """``{"_": {...}}`` laid out by dumps_records_json -> the inner object, same layout."""
    lines = text.split("\n")
    if lines[1] == ' "_": {}':
        return b"{}"
    inner = ["{"] + lines[2:-2] + ["}"]
    return "\n".join(inner).encode("utf-8")


def encode_document(doc: dict, encoded: Optional[dict] = None) -> bytes:
    """dump.json (or debug.json) as the producer writes it (:func:`dumps_records_json`)."""
    return dumps_records_json(doc, encoded=encoded).encode("utf-8")


def compact_json(obj: Any) -> str:
    """``obj``'s JSON text as the producer's layout writes each value (one line: ", " and ": ")."""
    return _COMPACT.encode(obj)


def encode_stack_entries(entries: list) -> bytes:
    """stack.json's bytes in the producer's layout (as :func:`encode_documents` writes a stack dict)
    from (stack id, its names, :func:`compact_json` of its lines) each, in the document's order: a
    stack's lines encoded once per process, not once a step."""
    if not entries:
        return b"{}"
    enc = _COMPACT.encode
    return ("{\n" + ",\n".join(f"  {enc(key)}: [{enc(names)}, {lines}]" for key, names, lines in entries)
            + "\n}").encode("utf-8")


def encode_documents(doc: dict, *, debug: bool, stack: Optional[dict], construct: Optional[dict],
                     records_layout: bool = True, encoded: Optional[dict] = None,
                     stack_bytes: Optional[bytes] = None) -> list:
    """[(file name, bytes)] of a rank directory's documents, the one writer of the producer's
    publish and of recovery: the document first (debug.json when ``debug``, without stack.json
    and construct.json), then stack.json and construct.json. ``records_layout``: one record per
    line (the producer, spec 8.4 and 20 item 13); else ``indent=1`` (crash recovery, spec 8.4).
    ``encoded``: the records' JSON texts made already (see :func:`dumps_records_json`); ``stack_bytes``:
    stack.json made already (:func:`encode_stack_entries`, the producer's layout), instead of ``stack``."""
    def encode(obj: dict) -> bytes:
        if not records_layout:
            return dumps_json(obj).encode("utf-8")
        return _unwrap(dumps_records_json({"_": obj}, "_"))

    out = [(DEBUG_JSON if debug else DUMP_JSON, encode_document(doc, encoded) if records_layout else encode(doc))]
    if not debug:
        out.append((STACK_JSON, stack_bytes if stack_bytes is not None and records_layout else encode(stack or {})))
        out.append((CONSTRUCT_JSON, encode(construct or {})))
    return out


def _require_object(obj: Any, file: Optional[str], location: str = "$") -> dict:
    if not isinstance(obj, dict):
        raise DocumentError(f"expected a JSON object, got {type(obj).__name__}", file=file, location=location)
    return obj


class _JsonDocument:
    """What the three documents share: the parsed object (``raw``), the file it came from, strict
    loading (a JSON object, validated unless asked not to) and writing back."""

    def __init__(self, raw: dict, file: Optional[str] = None):
        self.raw = raw
        self.file = file

    @classmethod
    def loads(cls: type[_Doc], data: Union[bytes, str], file: Optional[str] = None, *, validate: bool = True) -> _Doc:
        doc = cls(_require_object(loads_json(data, file), file), file)
        if validate:
            doc.validate()
        return doc

    def dumps(self) -> str:
        return dumps_json(self.raw)

    def validate(self) -> None:
        raise NotImplementedError


_Doc = TypeVar("_Doc", bound=_JsonDocument)


class DumpDocument(_JsonDocument):
    """dump.json (or debug.json): ``{"task", "level", "framework", "dump_data_dir", "data", ...}``.

    ``raw`` is the parsed object itself, so unknown keys survive a round trip.
    """

    @classmethod
    def new(cls, task: Optional[str], level: Optional[str], framework: Optional[str],
            dump_data_dir: Optional[str] = None, data: Optional[dict] = None, **extra: Any) -> "DumpDocument":
        """A document with no records; ``task``/``level``/``framework`` are None while not known yet
        (a rank whose dump has not written its document)."""
        raw = {"task": task, "level": level, "framework": framework, "dump_data_dir": dump_data_dir,
               "data": data if data is not None else {}}
        raw.update(extra)
        return cls(raw)

    task = property(lambda self: self.raw.get("task"))
    level = property(lambda self: self.raw.get("level"))
    framework = property(lambda self: self.raw.get("framework"))
    dump_data_dir = property(lambda self: self.raw.get("dump_data_dir"))

    @property
    def data(self) -> dict:
        d = self.raw.get("data")
        return d if isinstance(d, dict) else {}

    def __len__(self) -> int:
        return len(self.data)

    def __contains__(self, name: str) -> bool:
        return name in self.data

    def names(self) -> list[str]:
        return list(self.data)

    def record(self, name: str) -> Record:
        names = self.data
        if name not in names:
            raise RecordNotFoundError(f"no record {name!r} in {self.file or 'the document'}")
        return Record(name, names[name], list(names).index(name))

    def records(self) -> Iterator[Record]:
        for index, (name, raw) in enumerate(self.data.items()):
            yield Record(name, raw, index)

    def add(self, name: str, raw: Any) -> None:
        self.raw.setdefault("data", {})[name] = raw

    def validate(self) -> None:
        """Raise a DocumentError (file + JSON path) on the first problem; see :meth:`problems`."""
        for p in self.problems(first_only=True):
            raise p

    def problems(self, *, first_only: bool = False) -> Iterator[FormatError]:
        f = self.file
        raw = self.raw
        for key in ("task", "level", "framework"):
            if key in raw and raw[key] is not None and not isinstance(raw[key], str):
                yield DocumentError(f"'{key}' must be a string", file=f, location=f"$.{key}")
                if first_only:
                    return
        dd = raw.get("dump_data_dir")
        if dd is not None and not isinstance(dd, str):
            yield DocumentError("'dump_data_dir' must be a string or null", file=f, location="$.dump_data_dir")
            if first_only:
                return
        yield from self._header_problems()
        if "data" not in raw:
            fragment = read_fragment(raw)
            if fragment is None and not any(key in raw for key in HEADER_KEYS):
                yield not_a_document(raw, f)  # what the readers say of it too
                return
            what = (f": this is an {fragment.kind}, which ls/show/compare/run_ut read as forward API records, "
                    "not a dump.json") if fragment else ""
            yield DocumentError(f"missing 'data'{what}", file=f, location="$")
            return
        if not isinstance(raw["data"], dict):
            yield DocumentError("'data' must be an object", file=f, location="$.data")
            return
        debug_only = self._debug_only()
        for rec in self.records():
            try:
                rec.check(f)
                if debug_only and rec.kind != "debug":
                    raise NameFormatError(f"record {rec.name!r} is not a debug record "
                                          "('{name}.{n}.debug'), as level 'debug' requires")
            except NameFormatError as exc:
                yield DocumentError(exc.message, file=f, location=f'$.data["{rec.name}"]')
                if first_only:
                    return
            except FormatError as exc:
                yield exc
                if first_only:
                    return


    def _header_problems(self) -> Iterator[FormatError]:
        return iter(())

    def _debug_only(self) -> bool:
        return self.raw.get("level") == "debug"


class DebugDocument(DumpDocument):
    """debug.json (``PrecisionDebugger.save`` at level debug): like dump.json, but ``level``
    must be ``"debug"`` and every record name a debug name (``{name}.{n}.debug``)."""

    def _header_problems(self) -> Iterator[FormatError]:
        if self.raw.get("level") != "debug":
            yield DocumentError(f"debug.json needs \"level\": \"debug\", got {self.raw.get('level')!r}",
                                file=self.file, location="$.level")

    def _debug_only(self) -> bool:
        return True


class StackDocument(_JsonDocument):
    """stack.json: ``{"<id>": [[record names...], [frame strings...]]}``.

    Older dialects map a record name straight to its frame list; both are read.
    """

    def __init__(self, raw: dict, file: Optional[str] = None):
        super().__init__(raw, file)
        self._index: Optional[dict] = None

    def _entries(self) -> Iterator[tuple[str, list, Any]]:
        for key, value in self.raw.items():
            if (isinstance(value, list) and len(value) == 2 and isinstance(value[0], list)
                    and isinstance(value[1], list) and all(isinstance(name, str) for name in value[0])):
                yield key, value[0], value[1]
            else:  # name -> frames form
                yield key, [key], value

    def validate(self) -> None:
        """``[[names], [frames]]`` (8.x/26.x): both lists of strings; otherwise the legacy
        form: a list of frame strings (a string or null is tolerated)."""
        for key, value in self.raw.items():
            loc = f'$["{key}"]'
            if isinstance(value, list) and len(value) == 2 and isinstance(value[0], list):
                if not all(isinstance(name, str) for name in value[0]):
                    raise DocumentError("record names must be strings", file=self.file, location=f"{loc}.0")
                frames, floc = value[1], f"{loc}.1"
            elif value is None or isinstance(value, str):
                continue  # legacy, tolerated
            else:
                frames, floc = value, loc
            if not isinstance(frames, list) or not all(isinstance(fr, str) for fr in frames):
                raise DocumentError("stack frames must be a list of strings", file=self.file, location=floc)

    def stack_of(self, record_name: str) -> Optional[list]:
        return self.frames_index().get(record_name)

    def frames_index(self) -> dict:
        """{record name: its frames list} (what :meth:`stack_of` reads one name at a time); the
        records of one entry share one list. Made once; not to be changed by the caller."""
        if self._index is None:
            self._index = {}
            for _key, names, frames in self._entries():
                for name in names:
                    self._index[name] = frames
        return self._index

    def ids_of(self) -> dict:
        """record name -> stack id."""
        out = {}
        for key, names, _ in self._entries():
            for name in names:
                out[name] = key
        return out


class ConstructDocument(_JsonDocument):
    """construct.json: ``{"<record>": "<parent record>" | null}`` (``{}`` at L1)."""

    def validate(self) -> None:
        for key, value in self.raw.items():
            if value is not None and not isinstance(value, (str, dict, list)):
                raise DocumentError("parent must be a record name or null", file=self.file, location=f'$["{key}"]')

    def parent(self, name: str) -> Optional[str]:
        value = self.raw.get(name)
        return value if isinstance(value, str) else None

    def children(self, name: str) -> list[str]:
        return [key for key, value in self.raw.items() if value == name]


#: the documents of a rank directory beside dump.json (or debug.json), by file name
SIDE_DOCUMENTS: dict[str, type[_JsonDocument]] = {STACK_JSON: StackDocument, CONSTRUCT_JSON: ConstructDocument}


def is_nan(x: Any) -> bool:
    return isinstance(x, float) and math.isnan(x)
