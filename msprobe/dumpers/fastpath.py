"""The compiled fast path of the dumpers: one-pass statistics and CRC-32 (``_fastpath.c``).

``native()`` returns the extension module, or None when it is not available:

* built at install (``pip install``, ``scripts/bootstrap.sh``: setuptools ``ext-modules``,
  optional, so an install without a compiler still succeeds), else
* built at first use with the C compiler Python was built with, into
  ``~/.cache/msprobe-lake/native/`` (``$MSPROBE_LAKE_CACHE`` overrides the root), once per
  source version and interpreter, atomically (a lock and a rename: concurrent processes are safe);
* ``MSPROBE_LAKE_NATIVE=0`` forces the pure torch / numpy code (the reference), and so does a
  failed build (no compiler, no Python headers): the values are the same within the format's
  tolerance (tests/dumpers/test_fastpath.py checks both paths).
"""
from __future__ import annotations

import os
from typing import Any, Optional

from msprobe.format import native as native_modules

__all__ = ["native", "DTYPE_CODES", "disabled", "journal_line_function", "record_text_function", "untrack_function"]

#: the C module's FASTPATH_VERSION this Python code expects
VERSION = 8
#: dtype name (torch's / numpy's spelling) -> the C dtype code
DTYPE_CODES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3, "int8": 4, "uint8": 5, "int16": 6,
               "int32": 7, "int64": 8, "bool": 9}

_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_fastpath.c")
_state: dict = {}


def disabled() -> bool:
    return native_modules.disabled()


def native() -> Optional[Any]:
    """The loaded extension (None: use the fallback). Decided once per process."""
    if "mod" not in _state:
        _state["mod"] = None if disabled() else (native_modules.load("msprobe.dumpers._fastpath", _SRC, VERSION))
    return _state["mod"]


def _built_in_cache() -> Optional[Any]:
    return native_modules.built_in_cache("msprobe.dumpers._fastpath", _SRC, VERSION)


def _over_orjson(name: str) -> Optional[tuple]:
    """(the C function ``name``, orjson's ``dumps``) when both are there, else None."""
    mod = native()
    fast = getattr(mod, name, None) if mod is not None else None
    if fast is None:
        return None
    try:
        import orjson  # the [fast] extra
    except ImportError:
        return None
    return fast, orjson.dumps


def record_text_function() -> Any:
    """``record -> its JSON text`` exactly as :data:`msprobe.format.journal.record_text` (``json.dumps``
    with ``", "``/``": "``) writes it: through the C ``record_json`` over orjson's encoder (its float
    digits, ~6x faster on a record of statistics) when both are there, else (and for any record the C
    side declines: NaN/Infinity, other types, huge ints) the json module itself."""
    from msprobe.format.journal import record_text

    found = _over_orjson("record_json")
    if found is None:
        return record_text
    fast, dumps = found

    def text(record: Any) -> str:
        out = fast(record, dumps)
        return out if out is not None else record_text(record)

    return text


def journal_line_function() -> Any:
    """``(record, name, parent, with_parent, stack_id) -> (text, line)`` or None: a record's JSON text as
    :func:`record_text_function`'s gives it and its journal line as ``format.journal.encode_record_text``
    makes it around that text, in one C call (``journal_line``, over orjson's encoder); None where it
    declines (the caller then takes those two), or None for the function where the C path is not there."""
    found = _over_orjson("journal_line")
    if found is None:
        return None
    fast, dumps = found

    def line(record: Any, name: str, parent: Any, with_parent: bool, stack_id: Any) -> Any:
        return fast(record, dumps, name, parent, with_parent, stack_id)

    return line


def untrack_function() -> Any:
    """``untrack(obj)``: a record made of dicts, lists and tuples of atomic values leaves the garbage
    collector's walks (it holds no reference cycle; the records of a step live until its end and each
    collection of their generation walked them), or None without the C path."""
    mod = native()
    return getattr(mod, "untrack", None) if mod is not None else None
