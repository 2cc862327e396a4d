"""Record files without the ``data`` wrapper: API-info fragments (spec/FORMAT.md 9.5).

Two kinds of file hold records but no dump.json header: run_ut's API-info files
(``{"Functional.relu.0.forward": {"input_args": ..., ...}}``, what ``-api_info`` takes
per API) and 2023's api_accuracy_checker ``forward_info`` files
(``{"Functional*silu*0": {"args": [...], "kwargs": {...}}}``). Both are read as what
they are: forward API records that run_ut can replay, the 2023 names and sections
rewritten into today's grammar (``Functional.silu.0.forward``, ``input_args``,
``input_kwargs``). A header-less object that is neither is not a dump document
(:func:`not_a_document` says why), never a dump of 0 records.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

from msprobe.errors import DocumentError
from msprobe.format.naming import is_record_name

__all__ = ["Fragment", "read_fragment", "not_a_document", "HEADER_KEYS", "LEGACY_NAME_RE"]

#: the keys of a dump.json header: a document with any of them is a dump document, not a fragment
HEADER_KEYS = ("task", "level", "framework", "dump_data_dir", "data")
#: 2023 api_accuracy_checker's API names: ``Prefix*api*N``
LEGACY_NAME_RE = re.compile(r"^(?P<prefix>[A-Za-z_][A-Za-z0-9_]*)\*(?P<api>[^*/\\\s]+)\*(?P<n>\d+)$")
_SECTIONS = frozenset({"input_args", "input_kwargs", "output", "input", "parameters", "is_recompute"})
_LEGACY_SECTIONS = {"args": "input_args", "kwargs": "input_kwargs", "output": "output"}

FRAGMENT_RECORDS = "api-info fragment (records without the 'data' wrapper)"
FRAGMENT_2023 = "api-info fragment of 2023's api_accuracy_checker ('Prefix*api*N' names, args/kwargs)"


@dataclass(frozen=True)
class Fragment:
    """The records of a fragment in today's grammar, and what kind of file it was."""

    records: dict
    kind: str  # FRAGMENT_RECORDS or FRAGMENT_2023

    def document(self) -> dict:
        """A dump.json object holding the records (level L1: API records only), with
        ``"fragment"`` naming what was read."""
        return {"task": None, "level": "L1", "framework": None, "dump_data_dir": None,
                "data": self.records, "fragment": self.kind}


def _legacy_record(value: dict) -> Optional[dict]:
    if not set(value) <= set(_LEGACY_SECTIONS):
        return None
    return {_LEGACY_SECTIONS[key]: section for key, section in value.items()}


def _one(name: Any, value: Any) -> Optional[tuple]:
    """(name, record, is_2023) in today's grammar, or None when this is not an API-info entry."""
    if not isinstance(name, str) or not isinstance(value, dict) or not value:
        return None
    legacy = LEGACY_NAME_RE.match(name)
    if legacy:
        rec = _legacy_record(value)
        if rec is None:
            return None
        return f"{legacy.group('prefix')}.{legacy.group('api')}.{legacy.group('n')}.forward", rec, True
    if set(value) <= _SECTIONS and is_record_name(name, strict=False):
        return name, value, False
    return None


def read_fragment(raw: Any) -> Optional[Fragment]:
    """The fragment ``raw`` is (an object with no dump.json header whose every member is an
    API-info entry), or None."""
    if not isinstance(raw, dict) or not raw or any(key in raw for key in HEADER_KEYS):
        return None
    records: dict = {}
    legacy = False
    for name, value in raw.items():
        one = _one(name, value)
        if one is None:
            return None
        records[one[0]] = one[1]
        legacy = legacy or one[2]
    return Fragment(records, FRAGMENT_2023 if legacy else FRAGMENT_RECORDS)


def not_a_document(raw: dict, file: Optional[str]) -> DocumentError:
    """The one-line error for a JSON object that has no dump.json header and is no fragment."""
    keys = ", ".join(repr(key) for key in list(raw)[:4]) + (", ..." if len(raw) > 4 else "")
    held = f"its keys are {keys}" if raw else "it is an empty object"
    return DocumentError(f"not an msprobe dump document: no 'data' object and no header (task, level, framework), "
                         f"and {held}, not API records (an API-info fragment maps names like "
                         f"'Functional.relu.0.forward' to input_args/input_kwargs/output)", file=file, location="$")
