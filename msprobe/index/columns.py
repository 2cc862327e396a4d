"""Arrow arrays of Python lists laid out in C, without pyarrow's conversion of Python objects.

:func:`column` hands a list (and, optionally, the row order as int64 bytes: row ``i`` holds
``values[index[i]]``, null where ``index[i] < 0``) to the C ``arrow_column``
(msprobe/format/_leafwalk.c), which writes the Arrow buffers in one pass; pyarrow wraps them
(``Array.from_buffers``). Where the C module is not there (``MSPROBE_LAKE_NATIVE=0``, no compiler)
or declines (a value of another type), the rows are gathered in Python and converted by
``pyarrow.array``, as they always were: the same array, or the same error. Besides the per-value
cost, the buffers keep pyarrow from importing pandas (its conversions do, ~0.3 s of CPU a process).
"""
from __future__ import annotations

from typing import Any, Optional

from msprobe.format.native import leafwalk

__all__ = ["column", "gathered", "int_array"]


def _kind(pa: Any, arrow_type: Any) -> Optional[str]:
    """The C kind of an Arrow type (None: not one the C code lays out)."""
    if arrow_type == pa.string():
        return "s"
    if arrow_type == pa.float64():
        return "d"
    if arrow_type == pa.int64():
        return "q"
    if arrow_type == pa.bool_():
        return "b"
    if arrow_type == pa.list_(pa.int64()):
        return "l"
    return None


def gathered(values: list, index: Optional[bytes]) -> list:
    """The rows of ``values`` picked by ``index`` (see :func:`column`) as a list."""
    if index is None:
        return values
    import numpy as np

    return [values[i] if i >= 0 else None for i in np.frombuffer(index, dtype=np.int64).tolist()]


def column(values: list, arrow_type: Any, index: Optional[bytes] = None, *, native: bool = True) -> Any:
    """The Arrow array of ``values`` (a list) of ``arrow_type``, its rows picked by ``index`` (the
    bytes of int64s, -1 for a null row) when it is given. ``native=False``: pyarrow's conversion
    (the reference the tests hold the C layout equal to)."""
    import pyarrow as pa

    kind = _kind(pa, arrow_type)
    walker = leafwalk() if native and kind is not None else None
    got = walker.arrow_column(values, kind, index) if walker is not None else None
    if got is None:
        return pa.array(gathered(values, index), arrow_type)
    nulls, validity, first, second = got
    count = len(values) if index is None else len(index) // 8
    valid = None if validity is None else pa.py_buffer(validity)
    if kind == "l":
        child = pa.Array.from_buffers(pa.int64(), len(second) // 8, [None, pa.py_buffer(second)])
        return pa.Array.from_buffers(arrow_type, count, [valid, pa.py_buffer(first)], nulls, children=[child])
    buffers = [valid, pa.py_buffer(first)] + ([pa.py_buffer(second)] if kind == "s" else [])
    return pa.Array.from_buffers(arrow_type, count, buffers, nulls)


def int_array(values: Any, arrow_type: Any) -> Any:
    """An int32 or int64 Arrow array of a numpy array of integers, through its buffer."""
    import numpy as np
    import pyarrow as pa

    width = np.int32 if arrow_type == pa.int32() else np.int64
    return pa.Array.from_buffers(arrow_type, len(values), [None, pa.py_buffer(np.ascontiguousarray(values, width))])
