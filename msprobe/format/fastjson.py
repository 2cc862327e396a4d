"""A tolerant fast JSON decoder for dump documents: ``json.loads``' objects, NaN and +-Infinity
tokens included (Python's json writes them; JSON has none), through orjson (about 2x faster) where
it gives the same objects.

orjson refuses the non-finite tokens: they are replaced by stand-in strings no document holds
(``"\\u0000N"``...), parsed, and put back as ``json.loads``' own float objects; an integer literal of
19 digits or more, a token inside a string, a stand-in the document did hold, or anything orjson
refuses leaves the decision to ``json.loads``. orjson is optional (imported on first use).
"""
from __future__ import annotations

import json
from json.decoder import NaN, NegInf, PosInf  # type: ignore[attr-defined]
from typing import Any, Optional

from msprobe.format.native import leafwalk

__all__ = ["loads_json_bytes"]


#: the non-finite tokens Python's json writes (JSON has none) and the strings they stand in as
#: for orjson: none holds a token, so the replacements cannot meet each other
_NONFINITE_TOKENS = ((b"-Infinity", b'"\\u0000-I"'), (b"Infinity", b'"\\u0000I"'), (b"NaN", b'"\\u0000N"'))
_NONFINITE_VALUES = {"\x00-I": NegInf, "\x00I": PosInf, "\x00N": NaN}  # json.loads' own objects
#: digits to "0" and the bytes a JSON number may follow (whitespace, ``:``, ``,``, ``[``, the
#: ``-`` sign) to "S", so that an integer literal of 19 digits or more is found by bytes.find
_DIGITS_AND_STARTS = bytes.maketrans(b"0123456789 \t\n\r:,[-", b"0" * 10 + b"S" * 8)
_LONG_RUN = b"0" * 19
_LONG_LITERAL = b"S" + _LONG_RUN


def _has_long_integer(data: bytes) -> bool:
    """Whether ``data`` may hold an integer literal of 19 digits or more (orjson reads one
    beyond 64 bits as a float): a run of 19+ digits after a byte a number may follow (or at
    the start) that is not followed by a fraction or an exponent. A run after ``.`` (a fraction)
    or inside a string after a letter is no integer; one inside a string after a space counts
    (json.loads then decides)."""
    marked = data.translate(_DIGITS_AND_STARTS)
    at = 0 if marked[:19] == _LONG_RUN else marked.find(_LONG_LITERAL)
    while at >= 0:
        end = at + len(_LONG_LITERAL) if marked[at] == 83 else len(_LONG_RUN)  # 83: "S"
        while end < len(marked) and marked[end] == 48:
            end += 1
        if data[end:end + 1] not in (b".", b"e", b"E"):
            return True
        at = marked.find(_LONG_LITERAL, end)
    return False


def _holds_stand_in(obj: Any) -> bool:
    """Whether a parsed container holds a stand-in string: orjson writes its NUL as ``\\u0000``,
    which the document did not hold (:func:`_orjson_loads` checked); True where orjson cannot write it."""
    import orjson

    try:
        return b"\\u0000" in orjson.dumps(obj)
    except (orjson.JSONEncodeError, TypeError):
        return True


#: containers written by orjson at once while looking for stand-ins (few hold one)
_STAND_IN_BATCH = 128


def _located(node: dict, text: bytes, positions: list) -> Optional[list]:
    """The values of ``node`` (a dict parsed from ``text``) whose text holds one of the byte
    ``positions``: each key's JSON text found in ``text`` in order, a value taken to span from
    its key to the next key. None where a key's text is not found (another escaping): the caller
    then looks at every value. A wrong guess (a key's text met earlier, inside a string) only
    misses stand-ins, which the caller's count of restored stand-ins then tells."""
    import bisect

    import orjson

    offsets = []
    at = 0
    for key in node:
        needle = orjson.dumps(key)
        at = text.find(needle, at)
        if at < 0:
            return None
        offsets.append(at)
        at += len(needle)
    values = list(node.values())
    chosen = sorted({bisect.bisect_right(offsets, position) - 1 for position in positions} - {-1})
    return [values[index] for index in chosen]


def _restore_nonfinite(obj: Any, depth: Optional[int] = 1, hint: Optional[tuple] = None) -> Optional[int]:
    """Put NaN/+-Infinity back where orjson parsed their stand-in strings: the top ``depth`` + 1
    levels are read, and of the containers below them only those whose orjson text holds a
    stand-in are walked, all through (a dump's records: writing them is about 5x faster than walking
    them); ``depth=None`` walks everything. With ``hint`` (the parsed text, the stand-ins' byte
    positions in it), the containers below a dict of those levels are instead those whose text
    span holds a stand-in (:func:`_located`, no writing). The count of stand-ins put back, or None
    where a stand-in is a key (a bare token as a key: not JSON), found in every dict that is walked
    (a dict not walked holds no stand-in)."""
    values = _NONFINITE_VALUES
    restored = 0
    stack: list = [(obj, depth)]
    while stack:
        node, level = stack.pop()
        if node.__class__ is dict:
            for key in node:
                if key[:1] == "\x00":
                    return None
            items: Any = node.items()
        else:
            items = enumerate(node)
        unread = []  # the containers below the levels read: looked at through orjson's text
        for key, value in items:
            kind = value.__class__
            if kind is str:
                if value[:1] == "\x00":
                    node[key] = values[value]
                    restored += 1
            elif kind is dict or kind is list:
                if level is None:
                    stack.append((value, None))
                elif level > 0:
                    stack.append((value, level - 1))
                else:
                    unread.append(value)
        if not unread:
            continue
        located = _located(node, *hint) if hint is not None and node.__class__ is dict else None
        if located is not None:
            stack.extend((value, None) for value in located if value.__class__ is dict or value.__class__ is list)
            continue
        for start in range(0, len(unread), _STAND_IN_BATCH):  # a batch's text first, then its members'
            batch = unread[start:start + _STAND_IN_BATCH]
            if _holds_stand_in(batch):
                stack.extend((value, None) for value in batch if _holds_stand_in(value))
    return restored


def _with_stand_ins(data: bytes, positions: Optional[list] = None) -> bytes:
    """``data`` with each NaN/Infinity/-Infinity token replaced by its stand-in string: the tokens
    found by ``bytes.find`` (a dump holds few; ``-Infinity`` is an ``Infinity`` after a ``-``), the
    text copied once (``bytes.replace`` of each token copied it three times). The stand-ins' byte
    positions in the new text are appended to ``positions`` when given."""
    found = []
    for token, stand_in in _NONFINITE_TOKENS[1:]:
        size = len(token)
        at = data.find(token)
        while at >= 0:
            if token == b"Infinity" and at and data[at - 1] == 45:  # "-Infinity"
                found.append((at - 1, size + 1, _NONFINITE_TOKENS[0][1]))
            else:
                found.append((at, size, stand_in))
            at = data.find(token, at + size)
    if not found:
        return data
    found.sort()
    view = memoryview(data)
    pieces: list = []
    end = 0
    shift = 0
    for at, size, stand_in in found:
        pieces.append(view[end:at])
        pieces.append(stand_in)
        if positions is not None:
            positions.append(at + shift)
        shift += len(stand_in) - size
        end = at + size
    pieces.append(view[end:])
    return b"".join(pieces)


def _orjson_loads(data: bytes) -> Any:
    """``data`` parsed by orjson to exactly the objects json.loads gives, or None where orjson
    cannot promise that (not installed, an integer beyond 64 bits, a ``\\u0000`` escape beside
    NaN/Infinity tokens, anything orjson refuses: json.loads then decides)."""
    try:
        import orjson
    except ImportError:
        return None
    native = leafwalk()  # the same checks and stand-ins in C, one pass each
    if native is not None:  # both looks in one pass
        marks = native.document_marks(data)
        if marks == 1:
            return None
        marked = marks == 2
    else:
        if _has_long_integer(data):
            return None
        marked = b"NaN" in data or b"Infinity" in data
    positions: list = []
    if marked:
        if b"\\u0000" in data:  # a stand-in could be a string of the document
            return None
        # a token inside a string breaks that string: orjson refuses
        data = native.with_stand_ins(data) if native is not None else _with_stand_ins(data, positions)
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if marked and native is not None:  # every container walked in C; None: a stand-in key, json.loads decides
        return obj if isinstance(obj, (dict, list)) and native.restore_nonfinite(obj, _NONFINITE_VALUES) is not None \
            else None
    if marked:
        if not isinstance(obj, (dict, list)):
            return None
        restored = _restore_nonfinite(obj, hint=(data, positions))  # the records the stand-ins are in
        if restored is not None and restored < len(positions):  # some elsewhere (a guess missed): look at all
            more = _restore_nonfinite(obj)
            restored = None if more is None else restored + more
        if restored is None:  # a bare token as a key: not JSON, json.loads is to say so
            return None
    return obj


def loads_json_bytes(data: bytes) -> Any:
    """:func:`json.loads` of a document's bytes, NaN and +-Infinity tokens included, through
    orjson (about 2x faster) whenever it gives the same objects; json.loads otherwise."""
    got = _orjson_loads(data)
    if got is None:
        return json.loads(data)
    return got
