"""compare's cells as numbers and as text: a column of dumped values read as float64 arrays with
type masks (:func:`number_columns`), and float64 arrays written as ``repr`` writes each value
(orjson's shortest round-trip writer where it agrees, :func:`_reprs`), as percentages and as the
CSV's cells of the statistics (:func:`_texts`)."""
from __future__ import annotations

import re
from itertools import repeat
from typing import Any

__all__ = ["number_columns", "FloatCells"]

#: type codes of :func:`number_columns`: 0 float, 1 int, 3 str, 2 anything else (bool, None...)
_CODES = {float: 0, int: 1, str: 3}


def number_columns(values: list) -> tuple:
    """(float64 array with 0 where a value is not an int/float, mask of float-class values,
    mask of int/float-class values, mask of strings); bools and strings are not numbers here."""
    import numpy as np

    count = len(values)
    if count and set(map(type, values)) == {float}:  # the common column: floats only
        every = np.ones(count, dtype=bool)
        return np.array(values, dtype=np.float64), every, every.copy(), np.zeros(count, dtype=bool)
    codes = np.fromiter(map(_CODES.get, map(type, values), repeat(2)), np.int8, count)
    is_float = codes == 0
    is_number = codes < 2
    is_text = codes == 3
    numbers = values if is_number.all() else [v if code < 2 else 0.0 for v, code in zip(values, codes.tolist())]
    try:
        return np.array(numbers, dtype=np.float64), is_float, is_number, is_text
    except OverflowError:  # an int beyond a float's range: that one is no number here (the scalar diff reads it)
        pass
    out = np.zeros(count, dtype=np.float64)
    for position in np.flatnonzero(is_number).tolist():
        try:
            out[position] = float(values[position])
        except OverflowError:
            is_number[position] = False
    return out, is_float, is_number, is_text


def _nonfinite_float(numbers: tuple) -> Any:
    """Mask of the values that are float NaN/+-inf, from their :func:`number_columns`."""
    import numpy as np

    return numbers[1] & ~np.isfinite(numbers[0])


def _inf_or_nan(values: list, numbers: tuple) -> Any:
    """Float NaN/inf, or the strings ``inf``/``-inf``/``nan`` (any case, spaces around)."""
    import numpy as np

    out = _nonfinite_float(numbers)
    for position in np.flatnonzero(numbers[3]).tolist():
        if values[position].strip().lower() in ("inf", "-inf", "nan"):
            out[position] = True
    return out


#: orjson's float writer (shortest round-trip digits, as repr) for float64 arrays, or False where
#: it is not installed or does not write :data:`_FLOAT_PROBES` as repr does; None: not looked up yet
_FLOAT_WRITER: Any = None
#: values whose text orjson must give as repr does for its writer to be used
_FLOAT_PROBES = (0.0, -0.0, 1.0, -1.5, 0.1, 1e-4, 0.00012345678901234567, 123456789.0, 1e15, 9999999999999998.0,
                 2.0 ** 53, 3.141592653589793, 1.7976931348623157e15, 5e-3, 1 / 3, 1e16, -2.5e+20, 1.7976931348623157e308,
                 9.99e-06, 1e-07, -1.2345e-10, 5e-324, 2.2250738585072014e-308)
#: a one-digit negative exponent in orjson's text (``1e-7``), which repr writes with two (``1e-07``)
_ONE_DIGIT_EXPONENT = re.compile(r"e-([1-9])(?=[,\]])")


def _float_writer() -> Any:
    global _FLOAT_WRITER
    if _FLOAT_WRITER is None:
        _FLOAT_WRITER = False
        try:
            import numpy as np
            import orjson
        except ImportError:
            return False

        def write(array: Any) -> list:
            text = orjson.dumps(array, option=orjson.OPT_SERIALIZE_NUMPY).decode("ascii")
            if "e-" not in text:
                return text[1:-1].split(",")
            texts = text[1:-1].split(",")
            with np.errstate(invalid="ignore"):
                small = np.flatnonzero(np.abs(array) < 1e-4).tolist()  # NaN is not: orjson writes null
            scientific = 0
            for position in small:  # the one-digit negative exponents, among the values below 1e-4
                cell = texts[position]
                if "e-" in cell:
                    scientific += 1
                    if cell[-2] == "-":
                        texts[position] = cell[:-1] + "0" + cell[-1]
            if scientific != text.count("e-"):  # a negative exponent elsewhere: the pattern decides
                return _ONE_DIGIT_EXPONENT.sub(r"e-0\1", text)[1:-1].split(",")
            return texts

        probes = np.array(_FLOAT_PROBES, dtype=np.float64)
        if write(probes) == list(map(repr, _FLOAT_PROBES)):
            _FLOAT_WRITER = write
    return _FLOAT_WRITER


def _native_texts(array: Any, suffix: str) -> Any:
    """:func:`_reprs` (each text followed by ``suffix``) in one C pass over orjson's text of a
    contiguous float64 ``array`` (``_leafwalk.float_texts``); None where there is no extension."""
    import orjson

    from msprobe.format.native import leafwalk

    native = leafwalk()
    if native is None:
        return None
    return native.float_texts(orjson.dumps(array, option=orjson.OPT_SERIALIZE_NUMPY), array, suffix)


def _reprs(array: Any, suffix: str = "") -> list:
    """``repr`` of each value of a float64 array (what str() of the Python float prints) through
    orjson's writer (the same shortest round-trip digits, about 5x faster): repr and orjson lay
    them out alike but for the one-digit negative exponents orjson writes (``1e-7``: put back to
    ``1e-07``) and 1e-5 <= |x| < 1e-4 (positional for orjson, scientific for repr); those and
    NaN/inf (orjson writes null) take repr."""
    import numpy as np

    write = _float_writer()
    if not write or len(array) == 0:
        texts = list(map(repr, array.tolist()))
        return [text + suffix for text in texts] if suffix else texts
    array = np.ascontiguousarray(array, dtype=np.float64)
    texts = _native_texts(array, suffix)
    if texts is not None:
        return texts
    texts = _python_reprs(array, write)
    return [text + suffix for text in texts] if suffix else texts


def _python_reprs(array: Any, write: Any) -> list:
    """:func:`_reprs` of a contiguous float64 array, in Python over orjson's cells."""
    import numpy as np

    magnitude = np.abs(array)
    with np.errstate(invalid="ignore"):
        band = np.flatnonzero((magnitude >= 1e-5) & (magnitude < 1e-4))
    texts = write(array)
    for position in band.tolist():  # orjson's 0.0000ddd as repr's d.ddde-05: the same digits
        cell = texts[position]
        digits = cell[7:] if cell[0] == "-" else cell[6:]
        if cell[6 if cell[0] == "-" else 5] != "0" or not cell.startswith(("0.0000", "-0.0000")) or not digits:
            texts[position] = repr(float(array[position]))
            continue
        texts[position] = (("-" if cell[0] == "-" else "") + digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
                           + "e-05")
    nonfinite = np.flatnonzero(~np.isfinite(array))
    for position, value in zip(nonfinite.tolist(), array[nonfinite].tolist()):
        texts[position] = repr(value)
    return texts


class FloatCells:
    """A CSV column of float cells not yet written as text: row r holds ``overrides[r]`` (a str),
    or where that is None ``repr(values[r]) + suffix``. The C CSV writer writes the floats straight
    from orjson's text (``_leafwalk.csv_rows``' tuple columns), without a str per cell;
    :meth:`tolist` gives the texts (the Python writer, the xlsx, a row read alone)."""

    __slots__ = ("values", "suffix", "overrides")

    def __init__(self, values: Any, suffix: str, overrides: list) -> None:
        import numpy as np

        self.values = np.ascontiguousarray(values, dtype=np.float64)
        self.suffix = suffix
        self.overrides = overrides

    def __len__(self) -> int:
        return len(self.overrides)

    def __getitem__(self, row: int) -> str:
        cell = self.overrides[row]
        return repr(float(self.values[row])) + self.suffix if cell is None else cell

    def tolist(self) -> list:
        texts = _reprs(self.values, self.suffix)
        return [text if cell is None else cell for text, cell in zip(texts, self.overrides)]

    def csv_column(self) -> tuple:
        """The column as csv_rows takes it: (orjson's text of the values, the values, suffix, overrides)."""
        import orjson

        return orjson.dumps(self.values, option=orjson.OPT_SERIALIZE_NUMPY), self.values, self.suffix, self.overrides


def lazy_cells() -> bool:
    """Whether columns of :class:`FloatCells` are written in C (the extension is there and orjson
    writes floats as repr does, :func:`_float_writer`)."""
    from msprobe.format.native import leafwalk

    return leafwalk() is not None and bool(_float_writer())


def _percents(array: Any) -> list:
    """``f"{x}%"`` of each value of a float64 array."""
    return _reprs(array, "%")


def _texts(values: list, numbers: tuple) -> list:
    """``str`` of each value of a leaf column (its :func:`number_columns` ``numbers``): the float
    values through :func:`_reprs`, the others (ints, strings, None, bools) one at a time."""
    import numpy as np

    is_float = numbers[1]
    if not len(values) or not is_float.any():
        return list(map(str, values))
    texts = _reprs(numbers[0])
    for position in np.flatnonzero(~is_float).tolist():
        texts[position] = str(values[position])
    return texts
