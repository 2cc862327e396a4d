"""The cyclic garbage collector paused while documents are parsed and turned into tables.

Parsing a dump.json allocates hundreds of thousands of containers; the collections they trigger
traverse everything parsed so far (and, once it is old enough, everything alive), though a parsed
document holds no reference cycle. Compare pauses the collector around its pairs
(:mod:`msprobe.compare`), the index build around each rank directory (:mod:`msprobe.index`,
:mod:`msprobe.readers.index`, :mod:`msprobe.lake`).
"""
from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

__all__ = ["gc_paused", "promote_all"]


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector paused: parsing two dump.json documents allocates millions of
    objects, and the collections they trigger (each traversing everything parsed so far) doubled
    the parse and slowed every later allocation. Compare makes no reference cycles worth
    collecting meanwhile; the collector runs again at the end (nested or concurrent uses keep it
    paused until the last one ends)."""
    global _GC_PAUSES
    with _GC_LOCK:
        if _GC_PAUSES == 0:
            _GC_STATE[0] = gc.isenabled()
            gc.disable()
        _GC_PAUSES += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _GC_PAUSES -= 1
            if _GC_PAUSES == 0 and _GC_STATE[0]:
                promote_all()
                gc.enable()


def promote_all() -> None:
    """Every tracked object moved to the oldest generation without a collection: while the
    collector was paused, all the parsed documents' containers stayed in the youngest one, and the
    first collection after :func:`gc.enable` traversed them all (60 ms or more after a
    20,000-record pair). ``gc.freeze`` then ``gc.unfreeze`` does that move; skipped where the
    process froze objects itself (unfreezing would release them)."""
    if gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()


_GC_LOCK = threading.Lock()
_GC_PAUSES = 0
_GC_STATE = [True]
