"""compare from the Parquet index: a rank directory's leaf table (``index/compare/leaves.parquet``).

``msprobe index`` writes, beside ``index/records.parquet``, the table compare's engine reads of a
document (spec/FORMAT.md 18.4): one row per leaf as compare walks it (:func:`record_leaves`, in
that order), a placeholder row for a record without one, with what the CSV shows of the leaf (its
dtype, shape and requires_grad texts, its four statistics with their JSON types, its md5 text),
and on each record's first row the record's JSON (read only for the records compare must walk
whole: the origin search's departing records, communication calls, the first records' mode).

A compare whose two rank directories both hold an up-to-date table (its ``doc_size`` and
``doc_mtime`` those of the document now; no live journal) reads them instead of the documents
(:func:`indexed_side`); a stale one is said (:class:`~msprobe.index.StaleIndexWarning`) and the
document read. The engine then plans the rows over stand-in records (each leaf a ``{"type": i}``
that the C planner walks to the same suffixes) and takes each leaf's columns from the table by
``i``: the same CSV bytes and summary as from the document (tests/compare/test_compare_index.py).
"""
from __future__ import annotations

import json
import logging
import operator
import os
import weakref
from typing import Any, Optional

from msprobe.compare._rows import record_leaves
from msprobe.compare._scanned import NamedRecords, scanned_side
from msprobe.errors import FormatError, require
from msprobe.format.layout import INDEX_DIR, join_key
from msprobe.format.model import TENSOR_TYPES
from msprobe.format.native import leafwalk
from msprobe.format.stats import STAT_COLUMNS, STAT_KEYS
from msprobe.index import doc_stat, stale_reason, warn_stale

__all__ = ["COMPARE_LEAVES", "COMPARE_LEAVES_VERSION", "indexed_side", "IndexedSide", "IndexedRecords"]

log = logging.getLogger("msprobe.compare")

#: the leaf table of a rank directory, relative to it (not a part of ``index/records.parquet``'s dataset)
COMPARE_LEAVES = f"{INDEX_DIR}/compare/leaves.parquet"
#: the key of IndexedSide.columns holding the statistics as float64 arrays (Leaves._finish_from_source)
NUMBERS = "#numbers"
#: the table's version (its metadata ``msprobe_lake.compare_leaves_version``); another is not read
COMPARE_LEAVES_VERSION = "2"
#: MSPROBE_LAKE_COMPARE_INDEX=0: compare reads the documents even where an index is there
ENV = "MSPROBE_LAKE_COMPARE_INDEX"
_FLOAT_STATS = STAT_COLUMNS  # the table's statistic columns: the index's names ("max", ...)


def _flat(name: str) -> bool:
    """Whether record_leaves walks the record whole, its leaves' suffixes from its root (a
    parameters_grad or debug record), rather than by its io keys."""
    return ".parameters_grad" in name or name.endswith(".debug")


def _walk_all(data: dict) -> tuple:
    """(names, starts, suffixes, ios, leaves) of every record (the C walk, or record_leaves)."""
    walker = leafwalk()
    got = walker.leaves(data, False, TENSOR_TYPES) if walker is not None else None
    if got is not None:
        return got
    names: list = []
    starts: list = []
    suffixes: list = []
    ios: list = []
    leaves: list = []
    for name, raw in data.items():
        names.append(name)
        starts.append(len(leaves))
        for suffix, leaf, io in record_leaves(name, raw):
            suffixes.append(suffix)
            ios.append(io)
            leaves.append(leaf)
    starts.append(len(leaves))
    return names, starts, suffixes, ios, leaves


def _rests(names: list, starts: list, suffixes: list, ios: list, native: bool = True) -> list:
    """Each leaf's key in its stand-in record's group (:func:`stand_in_records`): the suffix less
    its io for an api or module record (None: the leaf is the io's value itself), the suffix for
    a parameters_grad or debug record (None: the debug record's value is the leaf itself). The C
    ``rests`` where it is there (``native``), this code the reference."""
    walker = leafwalk() if native else None
    got = walker.rests(names, starts, suffixes, ios) if walker is not None else None
    if got is not None:
        return got
    rests: list = []
    for position, name in enumerate(names):
        start, stop = starts[position], starts[position + 1]
        if _flat(name):
            rests.extend(None if suffix == "" and stop - start == 1 and name.endswith(".debug") else suffix
                         for suffix in suffixes[start:stop])
        else:
            rests.extend(None if suffix == io else suffix[len(io) + 1:]
                         for suffix, io in zip(suffixes[start:stop], ios[start:stop]))
    return rests


def stand_in_records(names: list, rec: Any, ios: list, rests: list, native: bool = True) -> Optional[dict]:
    """{record: a stand-in record} whose leaves record_leaves walks to the leaves' suffixes and ios
    (the table's order), leaf ``i`` a ``{"type": i}``: an api or module record's leaves grouped by
    io (``{io: {rest: leaf}}``, or ``{io: leaf}``), a parameters_grad or debug record's flat
    (``{rest: leaf}``, or the leaf). ``rec``: each leaf's record position (numpy); None where the
    leaves cannot be laid out that way. The C ``stand_ins`` where it is there (``native``), this
    code the reference (tests/compare/test_compare_index.py holds the two equal)."""
    import numpy as np

    out: dict = {name: {} for name in names}
    count = len(rests)
    if not count:
        return out
    io_column = np.array(ios, dtype=object)
    cut = np.flatnonzero(np.concatenate(([True], (rec[1:] != rec[:-1]) | (io_column[1:] != io_column[:-1]))))
    bounds = cut.tolist() + [count]
    flat = {name for name in names if ".parameters_grad" in name or name.endswith(".debug")}
    walker = leafwalk() if native else None
    if walker is not None:
        return walker.stand_ins(names, rec[cut].tolist(), bounds, ios, rests, flat)
    stand = [{"type": i} for i in range(count)]
    bare = {position for position, rest in enumerate(rests) if rest is None}  # the value itself is the leaf
    for group_rec, start, stop in zip(rec[cut].tolist(), bounds, bounds[1:]):
        name = names[group_rec]
        record = out[name]
        if name not in flat:
            io = ios[start]
            if io in record:
                return None  # an io's leaves apart from each other (the walk would join them)
            if start in bare:
                if stop - start != 1:
                    return None
                record[io] = stand[start]
            else:
                group = record[io] = dict(zip(rests[start:stop], stand[start:stop]))
                if len(group) != stop - start:
                    return None
            continue
        if start in bare:
            if stop - start != 1 or record:
                return None
            out[name] = stand[start]
            continue
        size = len(record) if record.__class__ is dict and "type" not in record else -1
        record.update(zip(rests[start:stop], stand[start:stop]))
        if size < 0 or len(record) != size + stop - start:
            return None
    if not bare <= set(bounds):
        return None  # a bare leaf inside a group
    return out


def _walks_the_same(stand_ins: dict, suffixes: list, ios: list) -> bool:
    names, starts, got_suffixes, got_ios, leaves = _walk_all(stand_ins)
    return (got_suffixes == suffixes and got_ios == ios
            and list(map(operator.itemgetter("type"), leaves)) == list(range(len(leaves))))


class IndexedRecords(NamedRecords):
    """A rank's records (``data``) read from its leaf table: the names at once, a record's JSON
    parsed when it is asked for."""

    def __init__(self, names: list, raws: Any, meta: Optional[dict] = None) -> None:
        super().__init__(names)
        meta = meta or {}
        #: what compare would otherwise read of the first records: their framework (infer_framework's,
        #: "" for none; None: not known, a table without it) and whether their first tensor holds a CRC-32 beside its statistics
        framework = meta.get("framework")
        self.framework = "" if framework == "none" else framework
        self.has_md5 = {"1": True, "0": False}.get(str(meta.get("has_md5")))
        self._raws = raws  # record position -> its JSON text

    def __getitem__(self, name: Any) -> Any:
        got = self._parsed.get(name)
        if got is None:
            got = self._parsed[name] = json.loads(self._raws[self._position[name]])
        return got


# ---------------------------------------------------------------- the table's columns as numpy, from Arrow's buffers
# (pyarrow's own conversions, to_numpy and to_pylist, import pandas: a second or more on a loaded machine)

def _valid(array: Any) -> Any:
    """The array's validity as a numpy bool array."""
    import numpy as np

    if array.null_count == 0:
        return np.ones(len(array), dtype=bool)
    bits = np.frombuffer(array.buffers()[0], dtype=np.uint8)
    return np.unpackbits(bits, bitorder="little")[array.offset:array.offset + len(array)].astype(bool)


def _fixed(array: Any, dtype: Any) -> Any:
    import numpy as np

    return np.frombuffer(array.buffers()[1], dtype=dtype)[array.offset:array.offset + len(array)]


def _bools(array: Any) -> Any:
    import numpy as np

    bits = np.frombuffer(array.buffers()[1], dtype=np.uint8)
    return np.unpackbits(bits, bitorder="little")[array.offset:array.offset + len(array)].astype(bool)


def _plain_strings(array: Any) -> list:
    """The values of a string array as a list (None where null)."""
    import numpy as np

    buffers = array.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int32)[array.offset:array.offset + len(array) + 1].tolist()
    data = buffers[2].to_pybytes() if buffers[2] is not None else b""
    try:
        text: Any = data.decode("ascii")  # byte offsets are character offsets
    except UnicodeDecodeError:
        text = None
    if array.null_count > len(array) // 2:  # mostly null (stats_json): the others alone
        out: list = [None] * len(array)
        for position in np.flatnonzero(_valid(array)).tolist():
            out[position] = data[offsets[position]:offsets[position + 1]].decode("utf-8")
        return out
    if text is not None:
        out = [text[start:stop] for start, stop in zip(offsets, offsets[1:])]
    else:
        out = [data[start:stop].decode("utf-8") for start, stop in zip(offsets, offsets[1:])]
    if array.null_count:
        for position in np.flatnonzero(~_valid(array)).tolist():
            out[position] = None
    return out


def _strings(column: Any) -> Any:
    """A (dictionary-encoded or plain) string column as a numpy object array (None where null)."""
    import numpy as np
    import pyarrow as pa

    parts = []
    for array in column.chunks:
        if pa.types.is_null(array.type):
            parts.append(np.array([None] * len(array), dtype=object))
        elif pa.types.is_dictionary(array.type):
            values = np.array(_plain_strings(array.dictionary) + [None], dtype=object)
            indices = _fixed(array.indices, np.int32).astype(np.int64)
            if array.null_count:
                indices = np.where(_valid(array), indices, len(values) - 1)
            parts.append(values[indices])
        else:
            parts.append(np.array(_plain_strings(array), dtype=object))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=object)


def _numbers(column: Any, dtype: Any) -> tuple:
    """(values, validity) of a fixed-width or boolean column as numpy arrays."""
    import numpy as np

    if not column.chunks:
        return np.zeros(0, dtype=dtype), np.zeros(0, dtype=bool)
    values = [(_bools(array) if dtype is bool else _fixed(array, dtype)) for array in column.chunks]
    return np.concatenate(values), np.concatenate([_valid(array) for array in column.chunks])


def _present(column: Any) -> Any:
    """Where an object array is not None."""
    return column != None  # numpy: elementwise


class _LazyColumns(dict):
    """A leaf table's columns by name: those read at once given, the others (md5, data_name: what
    only md5 mode or a NaN/Inf entry reads) read from the file on first use."""

    def __init__(self, parquet_file: Any, leaf_rows: Any) -> None:
        super().__init__()
        self._file, self._rows = parquet_file, leaf_rows

    def __missing__(self, column: str) -> Any:
        got = self[column] = _strings(self._file.read(columns=[column]).column(column))[self._rows]
        return got

    def one(self, column: str, leaf: int) -> Any:
        """The value of one leaf's cell (a string column read, not decoded, where it is not yet)."""
        if column in self:
            return self[column][leaf]
        import pyarrow as pa

        arrays = self.__dict__.setdefault("_arrays", {})
        array = arrays.get(column)
        if array is None:
            array = arrays[column] = self._file.read(columns=[column]).column(column).combine_chunks()
        row = int(self._rows[leaf])
        if pa.types.is_null(array.type) or not _valid(array)[row]:
            return None
        return _plain_strings(array.slice(row, 1))[0]


class _LazyRaws:
    """Each record's JSON text (the ``raw`` column, read from the file on first use)."""

    def __init__(self, parquet_file: Any, firsts: Any) -> None:
        self._file, self._firsts = parquet_file, firsts
        self._data: Optional[memoryview] = None
        self._offsets: Any = None

    def __getitem__(self, position: int) -> str:
        import numpy as np

        if self._data is None:
            array = self._file.read(columns=["raw"]).column("raw").combine_chunks()
            buffers = array.buffers()
            self._offsets = np.frombuffer(buffers[1], dtype=np.int32)[array.offset:array.offset + len(array) + 1]
            self._data = memoryview(buffers[2]) if buffers[2] is not None else memoryview(b"")
        row = int(self._firsts[position])
        return str(self._data[int(self._offsets[row]):int(self._offsets[row + 1])], "utf-8")


class IndexedSide:
    """One rank's leaf table as compare reads it: ``records`` (:class:`IndexedRecords`), the side
    already walked that the C planner takes (``walked``: {record: position}, the int64 bytes of each
    position's first leaf and the end, each leaf's suffix and io: the table's own, its leaves their
    numbers), the stand-in records a walk of them gives the same (``stand_ins``, laid out on first
    use) and each leaf's columns by leaf number."""

    def __init__(self, parquet_file: Any, meta: dict) -> None:
        import numpy as np

        self.task = meta.get("task")
        table = parquet_file.read(columns=_READ)
        rec, _ = _numbers(table.column("rec"), np.int32)
        firsts = np.flatnonzero(np.diff(rec, prepend=-1) != 0) if len(rec) else np.zeros(0, dtype=np.int64)
        names = _strings(table.column("record"))[firsts].tolist()
        self.records = IndexedRecords(names, _LazyRaws(parquet_file, firsts), meta)
        ios = _strings(table.column("io"))
        leaf_rows = np.flatnonzero(_present(ios))
        self._file, self._names, self._leaf_rec, self._ios = parquet_file, names, rec[leaf_rows], ios[leaf_rows].tolist()
        self._leaf_rows = leaf_rows
        self._stand_ins: Any = False  # not laid out yet
        # each record position's first leaf (a record without one: its next's), and the end
        bounds = np.searchsorted(self._leaf_rec, np.arange(len(names) + 1)).astype(np.int64)
        self.walked = ({name: position for position, name in enumerate(names)}, bounds.tobytes(),
                       _strings(table.column("suffix"))[leaf_rows].tolist(), self._ios)
        self.columns = _LazyColumns(parquet_file, leaf_rows)
        self.columns.update((column, _strings(table.column(column))[leaf_rows])
                            for column in ("dtype", "shape", "requires_grad"))
        self.columns["tensor"] = _numbers(table.column("tensor"), bool)[0][leaf_rows]
        #: each statistic as number_columns reads its values (float64, 0 where no number; where a float, a
        #: number, a str), from the float64 column and the few leaves whose statistics are of other JSON types
        numbers = self.columns[NUMBERS] = {}
        for key, column in zip(STAT_KEYS, _FLOAT_STATS):
            values, valid = _numbers(table.column(column), np.float64)
            values, valid = values[leaf_rows], valid[leaf_rows]
            objects = values.astype(object)
            objects[~valid] = None
            self.columns[key] = objects
            numbers[key] = (np.where(valid, values, 0.0), valid, valid.copy(), np.zeros(len(valid), dtype=bool))
        typed = _strings(table.column("stats_json"))[leaf_rows]
        for row in np.flatnonzero(_present(typed)).tolist():
            for key, value in zip(STAT_KEYS, json.loads(typed[row])):
                self.columns[key][row] = value
                number, is_float, is_number, is_text = numbers[key]
                kind = value.__class__
                is_float[row], is_number[row], is_text[row] = kind is float, kind is float or kind is int, kind is str
                number[row] = 0.0
                if is_number[row]:
                    try:
                        number[row] = float(value)
                    except OverflowError:  # an int beyond a float's range: no number here (number_columns)
                        is_number[row] = False

    @property
    def stand_ins(self) -> Optional[dict]:
        """The stand-in records of the table (:func:`stand_in_records`; its ``rest`` column read
        then), or None where its leaves cannot be laid out that way."""
        if self._stand_ins is False:
            rests = _strings(self._file.read(columns=["rest"]).column("rest"))[self._leaf_rows].tolist()
            self._stand_ins = stand_in_records(self._names, self._leaf_rec, self._ios, rests)
        return self._stand_ins


#: the leaf table's string columns read dictionary-encoded (few distinct values: no string made per row)
_DICTIONARY = ["record", "io", "rest", "dtype", "shape", "requires_grad"]
#: the columns compare reads at once (``md5``, ``data_name`` and ``raw`` when they are asked for, ``rest``
#: where the stand-in records are laid out: the planner takes each leaf's suffix and io as they are)
_READ = ["rec", "record", "io", "suffix", "tensor", "dtype", "shape", "requires_grad", *_FLOAT_STATS, "stats_json"]
_COLUMNS = [*_READ, "rest", "md5", "data_name", "raw"]
#: the string columns read as dictionaries (the suffixes repeat: "input.0", "output.0"...)
_READ_DICTIONARY = [*_DICTIONARY, "suffix"]


def open_leaf_table(data: bytes, where: str) -> Any:
    """A leaf table's bytes as a pyarrow ParquetFile (its footer checked first: IndexBombError);
    ``.read(columns=_READ)`` reads what compare needs, without pyarrow's pandas import."""
    import io

    from msprobe.index.files import check_index_footer

    require("pyarrow", "parquet")
    import pyarrow.parquet as pq

    try:
        parquet_file = pq.ParquetFile(io.BytesIO(data))
        check_index_footer(parquet_file.metadata, len(data), where)
        names = set(parquet_file.schema_arrow.names)
        if set(_COLUMNS) <= names:  # (else another version's table: its metadata says so)
            parquet_file = pq.ParquetFile(io.BytesIO(data), read_dictionary=_READ_DICTIONARY)
    except (OSError, ValueError, KeyError) as exc:  # pyarrow's errors: not a Parquet file
        raise FormatError(f"{where}: not a readable compare leaf table: {exc}") from None
    return parquet_file


def _fresh_table(source: Any) -> Optional[Any]:
    """The up-to-date leaf table of a rank directory (pyarrow), or None (no table, another
    version, a live journal, the document changed since: said with a StaleIndexWarning)."""
    if os.environ.get(ENV, "1") == "0" or not callable(getattr(source, "has_journal", None)) \
            or getattr(source, "index_only", False) or not getattr(source, "doc_name", None):
        return None
    key = join_key(source.prefix, COMPARE_LEAVES)
    store = source.store
    try:
        if not store.exists(key) or source.has_journal():
            return None
        data = store.get(key)
    except (OSError, ValueError):
        return None
    from msprobe.index.files import decode_metadata

    try:
        parquet_file = open_leaf_table(data, f"{source.url}/{COMPARE_LEAVES}")
    except FormatError as exc:  # (written atomically but not fsync'ed: a power loss may leave it empty)
        warn_stale(source.url, f"its compare leaf table cannot be read ({exc})",
                   "compare reads the document instead of its leaf table")
        return None
    meta = decode_metadata(parquet_file.schema_arrow.metadata or {})
    if meta.get("compare_leaves_version") != COMPARE_LEAVES_VERSION:
        warn_stale(source.url, f"its compare leaf table is of version {meta.get('compare_leaves_version')!r}, "
                               f"this msprobe reads {COMPARE_LEAVES_VERSION!r}",
                   "compare reads the document instead of its leaf table")
        return None
    size, mtime = doc_stat(store, source.doc_key)
    reason = stale_reason(meta, size, mtime, local=bool(getattr(store, "exact_mtimes", False)))
    if reason is None and (meta.get("doc_size") is None or meta.get("doc_mtime") is None
                           or size is None or mtime is None):  # no telling whether it covers the document
        log.info("%s: compare reads the document: its leaf table cannot be checked against it", source.url)
        return None
    if reason is not None:
        warn_stale(source.url, reason, "compare reads the document instead of its leaf table")
        return None
    return parquet_file, meta


def indexed_side(source: Any) -> Optional[Any]:
    """The source's :class:`IndexedSide` (read once, kept until :func:`forget`), else the
    :class:`msprobe.compare._scanned.ScannedSide` of its document's bytes, or None."""
    try:
        return _SIDES[source]
    except (KeyError, TypeError):
        pass
    found = _fresh_table(source)
    side: Any = None
    if found is not None:
        table, meta = found
        try:
            side = IndexedSide(table, meta)
        except (OSError, ValueError) as exc:  # pyarrow's errors: a column chunk that does not decode
            warn_stale(source.url, f"its compare leaf table cannot be read ({exc})",
                       "compare reads the document instead of its leaf table")
            side = None
    if side is None:  # the document's bytes read by the C scanner (msprobe.compare._scanned), where it takes them
        side = scanned_side(source)
    try:
        _SIDES[source] = side
    except TypeError:  # a source that takes no weak reference: read again next time
        pass
    return side


def forget(source: Any) -> None:
    """Drop the source's :class:`IndexedSide` (bounds memory over many rank pairs)."""
    try:
        _SIDES.pop(source, None)
    except TypeError:
        pass


#: source -> its IndexedSide or None, while the source lives
_SIDES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

def records(source: Any) -> Any:
    """A source's records for compare: from its up-to-date leaf table, else its document."""
    from msprobe.readers import records_of

    side = indexed_side(source)
    return side.records if side is not None else records_of(source)


def task(source: Any) -> Optional[str]:
    """A source's ``task`` for compare: from its up-to-date leaf table, else its document."""
    from msprobe.readers import task_of

    side = indexed_side(source)
    return side.task if side is not None else task_of(source)
