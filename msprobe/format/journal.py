"""The crash journal's lines (spec/FORMAT.md section 17): the entry types, their encoding and
the one decoder and replay every consumer uses.

The producer (``dumpers.session``) encodes its lines here; the reader (``readers``, a dump being
written) and recovery (``dumpers.recover``, a killed one) decode and replay them here, so the
spec's validity rules are applied once:

* a line that is not JSON (torn, or nested too deeply), or not a JSON object, is ignored;
* a **stack** has ``frames`` (an array) and no ``name``: ``{"stack_id": id, "frames": [...]}``;
* a **record** has a string ``name`` and a ``record`` key, plus ``parent`` (levels L0 and mix),
  and ``stack_id`` or inline ``stack`` frames;
* anything else (neither form) is ignored; unknown keys are ignored.

Reading the segments (numeric order, torn last lines) is the storage layer's
(``backends.read_journal``); this module works on the lines it yields.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Union

__all__ = ["NO_PARENT", "StackLine", "RecordLine", "encode_stack", "encode_record", "encode_record_text",
           "record_text", "decode_line", "Replay"]


class _NoParent:
    """The ``parent`` key is absent (levels other than L0 and mix): not the same as ``null``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NO_PARENT"


NO_PARENT: Any = _NoParent()


@dataclass(frozen=True)
class StackLine:
    """``{"stack_id": id, "frames": [...]}``: frames written once, named by records' ``stack_id``."""

    stack_id: str  #: the id as a string (``str()`` of what was written: ``0`` and ``"0"`` are one id)
    frames: list


@dataclass(frozen=True)
class RecordLine:
    """``{"name": ..., "record": ...}`` with its optional ``parent``, ``stack_id`` and inline ``stack``."""

    name: str
    record: Any
    parent: Any = NO_PARENT  #: NO_PARENT when the line has no ``parent`` key
    stack: Any = None  #: the inline ``stack`` value as written (frames when it is a list), None when absent
    stack_id: Optional[str] = None

    @property
    def has_parent(self) -> bool:
        return self.parent is not NO_PARENT


Entry = Union[StackLine, RecordLine]


def encode_stack(stack_id: Any, frames: list, text: Optional[Callable[[Any], str]] = None) -> bytes:
    """One stack line (without its newline); ``text``: a function giving :data:`record_text`'s JSON
    (the dumper's faster one), json's by default."""
    return (text or record_text)({"stack_id": stack_id, "frames": frames}).encode("utf-8")


def encode_record(name: str, record: Any, *, parent: Any = NO_PARENT, stack_id: Any = None) -> bytes:
    """One record line (without its newline); ``parent`` is written when given (``None`` included)."""
    entry: dict = {"name": name, "record": record}
    if parent is not NO_PARENT:
        entry["parent"] = parent
    if stack_id is not None:
        entry["stack_id"] = stack_id
    return json.dumps(entry).encode("utf-8")


#: a record's JSON text as ``json.dumps`` writes it (and as dump.json's one-record lines hold it)
record_text = json.JSONEncoder(separators=(", ", ": ")).encode
_str_text = json.encoder.encode_basestring_ascii  # (what json.dumps writes for a str)


def encode_record_text(name: str, text: str, *, parent: Any = NO_PARENT, stack_id: Any = None) -> bytes:
    """:func:`encode_record` of a record whose JSON is ``text`` (``record_text(record)``), byte for byte."""
    parts = ['{"name": ', _str_text(name), ', "record": ', text]
    if parent is not NO_PARENT:
        parts += [', "parent": ', _str_text(parent) if isinstance(parent, str) else
                  "null" if parent is None else record_text(parent)]
    if stack_id is not None:
        parts += [', "stack_id": ', str(stack_id) if type(stack_id) is int else record_text(stack_id)]
    parts.append("}")
    return "".join(parts).encode("utf-8")


def decode_line(line: Union[bytes, str]) -> Optional[Entry]:
    """The entry of one complete journal line, or None for a line the spec says to ignore."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):  # torn, not UTF-8, or nested too deeply (hostile)
        return None
    if not isinstance(obj, dict):
        return None
    if "frames" in obj and "name" not in obj:
        frames = obj["frames"]
        return StackLine(str(obj.get("stack_id")), frames) if isinstance(frames, list) else None
    name = obj.get("name")
    if not isinstance(name, str) or "record" not in obj:
        return None
    sid = obj.get("stack_id")
    return RecordLine(name, obj["record"], obj.get("parent", NO_PARENT), obj.get("stack"),
                      None if sid is None else str(sid))


class Replay:
    """The records of a journal, replayed in order (spec 17): a later line with the same name
    replaces the earlier one's value, parent and stack and keeps the first line's position.

    ``records`` (name -> value, in journal order), ``parents`` (the records whose lines had a
    ``parent``), ``stacks`` (name -> frames, inline or by ``stack_id``; resolved by
    :meth:`finish`) and ``stack_ids`` (name -> the journal stack id it used)."""

    def __init__(self) -> None:
        self.records: dict = {}
        self.parents: dict = {}
        self.stack_ids: dict = {}
        self.stacks: dict = {}
        self._inline: dict = {}
        self._frames_of: dict = {}

    def add(self, entry: Entry) -> None:
        if isinstance(entry, StackLine):
            self._frames_of[entry.stack_id] = entry.frames
            return
        name = entry.name
        self.records[name] = entry.record
        if entry.has_parent:
            self.parents[name] = entry.parent
        if isinstance(entry.stack, list):
            self._inline[name] = entry.stack
            self.stack_ids.pop(name, None)
        elif entry.stack_id is not None:
            self.stack_ids[name] = entry.stack_id
            self._inline.pop(name, None)

    def drop(self, name: str) -> None:
        """Forget a record (recovery drops those whose tensors are missing)."""
        for d in (self.records, self.parents, self.stack_ids, self._inline, self.stacks):
            d.pop(name, None)

    def finish(self) -> "Replay":
        """Resolve each record's frames (a stack line may come after the record that names it)."""
        self.stacks = {}
        for name in self.records:
            frames = self._inline.get(name)
            if frames is None and name in self.stack_ids:
                frames = self._frames_of.get(self.stack_ids[name])
            if frames is not None:
                self.stacks[name] = frames
        return self

    @classmethod
    def of(cls, lines: Iterable[Union[bytes, str]]) -> "Replay":
        """Decode and replay ``lines`` (ignored lines skipped)."""
        replay = cls()
        for line in lines:
            entry = decode_line(line)
            if entry is not None:
                replay.add(entry)
        return replay.finish()

    def stack_groups(self) -> dict:
        """stack.json of the replayed records: the distinct frame lists numbered ``"0"``, ``"1"``...
        in order of first use, each ``[[names], frames]`` (spec 11.1)."""
        groups: dict = {}
        for name in self.records:
            frames = self.stacks.get(name)
            if frames is not None:
                groups.setdefault(tuple(frames), []).append(name)
        return {str(i): [names, list(frames)] for i, (frames, names) in enumerate(groups.items())}
