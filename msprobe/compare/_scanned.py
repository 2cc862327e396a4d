"""compare's side of a rank directory read straight from its dump.json's bytes (issue 48 item 1).

The C scanner (``msprobe.format._docscan``, see its source) reads the document once and gives
what compare's engine reads of a leaf table (:class:`msprobe.compare._indexed.IndexedSide`): the
side walked as the C planner takes it (each leaf's suffix and io, the leaves numbered in the walk's
order), each leaf's cells as columns
(dtype, shape and requires_grad texts, the four statistics, their float64 values and types, md5
text, data_name) and the records themselves, each parsed only when it is asked for (from its
bytes). No Python object is made per JSON value, and none is freed afterwards.

Anything the scanner does not fully take (malformed JSON, escapes where a text is used, duplicate
keys, long integers, deep nesting, a journal, another dialect's document...) leaves the side to
the parsed path (:func:`msprobe.readers.records_of`): the same answers, the same errors.
``MSPROBE_LAKE_COMPARE_SCAN=0`` turns the scanner off (tests/compare/test_docscan.py holds the
two equal).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Iterator, Optional

from msprobe.format.native import docscan
from msprobe.format.stats import STAT_KEYS

__all__ = ["ScannedSide", "ScannedColumns", "NamedRecords", "scanned_side", "scan_columns", "ENV"]

#: MSPROBE_LAKE_COMPARE_SCAN=0: compare parses the documents (the scanner not used)
ENV = "MSPROBE_LAKE_COMPARE_SCAN"


class NamedRecords(Mapping):
    """A rank's records (``data``) by name, each parsed only when it is asked for (the subclass's
    ``__getitem__``): the names at once. ``framework`` and ``has_md5``: what compare would otherwise
    read of the first records, where the source knows it (None: read them)."""

    framework: Optional[str] = None
    has_md5: Optional[bool] = None

    def __init__(self, names: list) -> None:
        self._names = names
        self._position = {name: position for position, name in enumerate(names)}
        self._parsed: dict = {}

    def __contains__(self, name: object) -> bool:
        return name in self._position

    def __iter__(self) -> Iterator:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


class _SpanRecords(NamedRecords):
    """A document's records by name, each parsed from its bytes when it is asked for (as the
    document's parse would give it: :func:`msprobe.format.fastjson.loads_json_bytes`)."""

    def __init__(self, names: list, data: bytes, spans: Any, plain: bool = False) -> None:
        super().__init__(names)
        self._data = memoryview(data)
        self._spans = spans.tolist()  # [start, end] per record
        self._loads: Any = None
        if plain:  # no NaN/Infinity token and no long integer (the scanner took none): orjson's objects are json's
            try:
                import orjson

                self._loads = orjson.loads
            except ImportError:
                pass

    def __getitem__(self, name: Any) -> Any:
        got = self._parsed.get(name)
        if got is None:
            start, end = self._spans[self._position[name]]
            if self._loads is not None:
                got = self._loads(self._data[start:end])
            else:
                from msprobe.format.fastjson import loads_json_bytes

                got = loads_json_bytes(bytes(self._data[start:end]))
            self._parsed[name] = got
        return got


class ScannedSide:
    """One rank's document as compare reads it from the scanner: ``task``, ``records``, the side
    ``walked`` as the C planner takes it and each leaf's ``columns`` by leaf number (the attributes
    of :class:`msprobe.compare._indexed.IndexedSide`; no stand-in records)."""

    stand_ins = None

    def __init__(self, task: Any, records: Any, walked: tuple, columns: dict) -> None:
        self.task = task
        self.records = records
        self.walked = walked
        self.columns = columns


class ScannedColumns(dict):
    """A scanned document's leaf columns by name, as lists by leaf number (``numbers``: per statistic
    its :func:`~msprobe.compare._floattext.number_columns` tuple in :attr:`numbers`); :meth:`take` fills a
    :class:`~msprobe.compare._plan.Leaves` with the cells of the leaves it names. ``header``: (key,
    start, end) of each top-level member of the document but ``data``; ``nonfinite``: whether the
    document holds a NaN or +-Infinity token."""

    header: list = []
    nonfinite = True
    numbers: dict = {}

    def take(self, leaves: Any, mode: str) -> None:
        """``leaves``' columns: the cells of its leaves (``leaves.leaf``: their numbers), in that order."""
        import operator

        import numpy as np

        at = np.fromiter(leaves.leaf, dtype=np.int64, count=len(leaves.leaf))  # a walked side's leaves: their numbers
        count = len(at)
        first = int(at[0]) if count else 0
        if not count or (int(at[-1]) - first == count - 1 and bool((np.diff(at) == 1).all())):
            def pick(column: Any) -> Any:  # a run of consecutive leaves (a whole document, a block): a slice
                return column[first:first + count]
        else:
            getter = operator.itemgetter(*at.tolist())

            def pick(column: Any) -> Any:
                if column.__class__ is not list:
                    return column[at]
                return list(getter(column)) if count > 1 else [column[first]]
        leaves.tensor = pick(self["tensor"])
        leaves.dtype, leaves.shape, leaves.requires_grad = (pick(self[key]) for key in ("dtype", "shape",
                                                                                          "requires_grad"))
        leaves.statistics = {key: pick(self[key]) for key in STAT_KEYS}
        leaves.floats = {key: tuple(pick(array) for array in self.numbers[key]) for key in STAT_KEYS}
        leaves.md5 = pick(self.md5_texts()) if mode == "md5" else []
        leaves.data_name = []

    def md5_texts(self) -> list:
        """md5 mode's column: a scalar argument's (None from the scanner) its value's CRC text."""
        texts = self["md5"]
        if None in texts:
            from msprobe.compare._rows import crc_text

            values = self[STAT_KEYS[0]]  # a scalar's value is each of its statistics
            texts = self["md5"] = [crc_text(values[leaf]) if text is None else text for leaf, text in enumerate(texts)]
        return texts


def scan_columns(data: bytes) -> Optional[tuple]:
    """(task, names, spans, walked, columns) of a document's bytes, or None where the scanner is not
    there or does not take them. ``walked``: the side as the C planner takes it walked ({record:
    position}, int64 bytes of each record's first leaf and the end, each leaf's suffix and io, the
    leaves numbered in compare's walk order); ``columns`` (:class:`ScannedColumns`): per leaf number,
    ``tensor`` (bool), ``dtype``, ``shape``, ``requires_grad``, the four statistics (as Leaves.finish
    makes them), ``md5``, ``data_name``; its ``numbers``."""
    scanner = docscan()
    if scanner is None:
        return None
    got = scanner.scan(data)
    if got is None:
        return None
    import numpy as np

    (task, names, spans, bounds, suffixes, ios, tensor, dtype, shape, rg, stats, numbers, codes, md5, data_name,
     odd, header, nonfinite) = got
    positions = {name: position for position, name in enumerate(names)}
    if len(positions) != len(names):
        return None  # a record named twice (json.loads keeps the last): the parsed path
    flags = np.frombuffer(tensor, dtype=np.uint8).astype(bool)
    if odd:  # leaves of another shape: their cells as the parsed path makes them
        flags = flags.copy()
        flags[[entry[0] for entry in odd]] = _fill_odd(data, odd, dtype, shape, rg, stats, md5, data_name)
    columns = ScannedColumns(tensor=flags.tolist(), dtype=dtype, shape=shape, requires_grad=rg, md5=md5,
                             data_name=data_name)
    columns.update(zip(STAT_KEYS, stats))
    if odd:
        from msprobe.compare._floattext import number_columns

        columns.numbers = {key: number_columns(values) for key, values in zip(STAT_KEYS, stats)}
    else:
        out = {}
        for key, values, kinds in zip(STAT_KEYS, numbers, codes):
            code = np.frombuffer(kinds, dtype=np.int8)
            out[key] = (np.frombuffer(values, dtype=np.float64), code == 0, code < 2, code == 3)
        columns.numbers = out
    columns.header, columns.nonfinite = header, nonfinite
    return task, names, np.frombuffer(spans, dtype=np.int64).reshape(-1, 2), (positions, bounds, suffixes, ios), columns


def _fill_odd(data: bytes, odd: list, dtype: list, shape: list, rg: list, stats: list, md5: list,
              data_name: list) -> list:
    """The cells of the leaves the scanner left to Python (``odd``: (leaf, start, end) of each):
    parsed from their bytes and read as :meth:`msprobe.compare._plan.Leaves.finish` reads a leaf;
    their tensor flags."""
    from msprobe.compare._plan import Leaves
    from msprobe.format.fastjson import loads_json_bytes

    leaves = Leaves()
    leaves.leaf = [loads_json_bytes(data[start:end]) for _, start, end in odd]
    leaves.finish("md5")
    for position, (leaf_number, _, _) in enumerate(odd):
        leaf = leaves.leaf[position]
        dtype[leaf_number] = leaves.dtype[position]
        shape[leaf_number] = leaves.shape[position]
        rg[leaf_number] = leaves.requires_grad[position]
        for column, key in zip(stats, STAT_KEYS):
            column[leaf_number] = leaves.statistics[key][position]
        md5[leaf_number] = leaves.md5[position]
        name = leaf.get("data_name") if leaf.__class__ is dict else None
        data_name[leaf_number] = name if isinstance(name, str) else None
    return [bool(flag) for flag in leaves.tensor]


def scanned_side(source: Any) -> Optional[ScannedSide]:
    """The :class:`ScannedSide` of a rank directory's document, or None (no scanner, scanning off,
    no document, a live journal, not a plain rank directory, or bytes the scanner does not take:
    the caller parses the document)."""
    if os.environ.get(ENV, "1") == "0" or docscan() is None:
        return None
    read = getattr(source, "document_bytes", None)  # a rank directory's reader (msprobe.readers.RankSource)
    if read is None:
        return None
    try:
        data = read()
    except Exception:  # noqa: BLE001 - the parsed path reads it again and says what is wrong
        return None
    if data is None:
        return None
    got = scan_columns(data)
    if got is None:
        return None
    task, names, spans, walked, columns = got
    records = _SpanRecords(names, data, spans, plain=not columns.nonfinite)
    attach = getattr(source, "attach_view", None)
    if attach is not None:  # the document's header and records for the reader's own looks (its dialect)
        from msprobe.format.fastjson import loads_json_bytes

        attach({key: loads_json_bytes(data[start:end]) for key, start, end in columns.header}, records)
    return ScannedSide(task, records, walked, columns)
