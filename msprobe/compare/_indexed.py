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
import os
import weakref
from collections.abc import Mapping
from typing import Any, Iterator, Optional

from msprobe.compare._rows import record_leaves
from msprobe.errors import require
from msprobe.format.layout import INDEX_DIR, join_key
from msprobe.format.model import TENSOR_TYPES
from msprobe.format.native import leafwalk
from msprobe.format.stats import STAT_KEYS
from msprobe.index import META_PREFIX, doc_stat, stale_reason, warn_stale

__all__ = ["COMPARE_LEAVES", "COMPARE_LEAVES_VERSION", "compare_leaf_table", "write_compare_leaves",
           "indexed_side", "IndexedSide", "IndexedRecords"]

log = logging.getLogger("msprobe.compare")

#: the leaf table of a rank directory, relative to it (not a part of ``index/records.parquet``'s dataset)
COMPARE_LEAVES = f"{INDEX_DIR}/compare/leaves.parquet"
#: the table's version (its metadata ``msprobe_lake.compare_leaves_version``); another is not read
COMPARE_LEAVES_VERSION = "1"
#: MSPROBE_LAKE_COMPARE_INDEX=0: compare reads the documents even where an index is there
ENV = "MSPROBE_LAKE_COMPARE_INDEX"
_FLOAT_STATS = ("max", "min", "mean", "norm")


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


def stand_in_records(names: list, starts: list, suffixes: list, ios: list) -> Optional[dict]:
    """{record: a stand-in record} whose leaves record_leaves walks to the same suffixes and ios,
    leaf ``i`` a ``{"type": i}``; None where a record's leaves cannot be laid out that way."""
    out: dict = {}
    for position, name in enumerate(names):
        start, stop = starts[position], starts[position + 1]
        record: Any = {}
        if _flat(name):
            if stop - start == 1 and suffixes[start] == "" and name.endswith(".debug"):
                record = {"type": start}
            else:
                for i in range(start, stop):
                    record[suffixes[i]] = {"type": i}
        else:
            last = None
            for i in range(start, stop):
                io, suffix = ios[i], suffixes[i]
                if suffix == io:
                    if io in record:
                        return None
                    record[io] = {"type": i}
                elif suffix.startswith(io + "."):
                    group = record.get(io)
                    if group is None:
                        group = record[io] = {}
                    elif last != io or "type" in group:
                        return None  # an io's leaves apart from each other (the walk would join them)
                    group[suffix[len(io) + 1:]] = {"type": i}
                else:
                    return None
                last = io
        out[name] = record
    return out


def _walks_the_same(stand_ins: dict, suffixes: list, ios: list) -> bool:
    names, starts, got_suffixes, got_ios, leaves = _walk_all(stand_ins)
    return got_suffixes == suffixes and got_ios == ios and [leaf["type"] for leaf in leaves] == list(range(len(leaves)))


def compare_leaf_table(data: dict, metadata: Optional[dict] = None) -> Optional[Any]:
    """The leaf table (pyarrow) of a document's ``data``, or None where its records' leaves cannot
    be laid out as stand-ins (compare then reads the document)."""
    from msprobe.compare._plan import Leaves

    pa = require("pyarrow", "parquet")
    names, starts, suffixes, ios, leaf_list = _walk_all(data)
    stand_ins = stand_in_records(names, starts, suffixes, ios)
    if stand_ins is None or not _walks_the_same(stand_ins, suffixes, ios):
        return None
    leaves = Leaves()
    leaves.leaf = list(leaf_list)
    leaves.finish("md5")
    statistics = [leaves.statistics[key] for key in STAT_KEYS]
    floats = [[value if value is None or value.__class__ is float else None for value in column]
              for column in statistics]
    typed = [None if all(value is None or value.__class__ is float for value in values)
             else json.dumps(list(values)) for values in zip(*statistics)]
    data_names = [leaf.get("data_name") if leaf.__class__ is dict else None for leaf in leaf_list]
    # one row per leaf, a placeholder row (no suffix) for a record without one; each record's JSON on its first row
    rec: list = []
    row_leaf: list = []
    raws: list = []
    for position, name in enumerate(names):
        start, stop = starts[position], starts[position + 1]
        raw = json.dumps(data[name], separators=(",", ":"))
        if start == stop:
            rec.append(position)
            row_leaf.append(-1)
            raws.append(raw)
            continue
        rec.extend([position] * (stop - start))
        row_leaf.extend(range(start, stop))
        raws.extend([raw] + [None] * (stop - start - 1))

    def per_row(column: list) -> list:
        return [column[i] if i >= 0 else None for i in row_leaf]

    columns = {
        "rec": pa.array(rec, pa.int32()), "record": pa.array([names[r] for r in rec], pa.string()),
        "io": per_row(ios), "suffix": per_row(suffixes), "tensor": per_row(leaves.tensor),
        "dtype": per_row(leaves.dtype), "shape": per_row(leaves.shape), "requires_grad": per_row(leaves.requires_grad),
        **{key: pa.array(per_row(column), pa.float64()) for key, column in zip(_FLOAT_STATS, floats)},
        "stats_json": per_row(typed), "md5": per_row(leaves.md5),
        "data_name": per_row([name if isinstance(name, str) else None for name in data_names]), "raw": raws,
    }
    meta = {f"{META_PREFIX}compare_leaves_version": COMPARE_LEAVES_VERSION}
    meta.update({f"{META_PREFIX}{key}": "" if value is None else str(value) for key, value in (metadata or {}).items()})
    table = pa.table({key: value if isinstance(value, pa.Array) else pa.array(value) for key, value in columns.items()})
    return table.replace_schema_metadata(meta)


def write_compare_leaves(store: Any, prefix: str, doc: Any, doc_size: Optional[int], doc_mtime: Optional[float],
                         task: Optional[str] = None) -> Optional[str]:
    """Write a rank directory's leaf table (:data:`COMPARE_LEAVES`) through ``store``; its key, or
    None where the document's records cannot be laid out (an older table there is removed)."""
    from msprobe.index import table_bytes

    key = join_key(prefix, COMPARE_LEAVES)
    data = doc.data if hasattr(doc, "data") else doc.get("data", {})
    task = task if task is not None else (doc.task if hasattr(doc, "task") else doc.get("task"))
    table = compare_leaf_table(data, {"doc_size": doc_size, "doc_mtime": None if doc_mtime is None else
                                      repr(float(doc_mtime)), "task": task, "records": len(data)})
    if table is None:
        if store.exists(key):
            store.delete(key)
        return None
    store.put(key, table_bytes(table))
    return key


class IndexedRecords(Mapping):
    """A rank's records (``data``) read from its leaf table: the names at once, a record's JSON
    parsed when it is asked for."""

    def __init__(self, names: list, raws: Any) -> None:
        self._names = names
        self._position = {name: position for position, name in enumerate(names)}
        self._raws = raws  # a pyarrow array: record position -> its JSON text
        self._parsed: dict = {}

    def __getitem__(self, name: Any) -> Any:
        got = self._parsed.get(name)
        if got is None:
            position = self._position[name]
            got = self._parsed[name] = json.loads(self._raws[position].as_py())
        return got

    def __contains__(self, name: object) -> bool:
        return name in self._position

    def __iter__(self) -> Iterator:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


class IndexedSide:
    """One rank's leaf table as compare reads it: ``records`` (:class:`IndexedRecords`), the
    stand-in records the planner walks and each leaf's columns by leaf number."""

    def __init__(self, table: Any, task: Optional[str]) -> None:
        import numpy as np

        self.task = task
        rec = table.column("rec").to_numpy()
        firsts = np.flatnonzero(np.diff(rec, prepend=-1) != 0) if len(rec) else np.zeros(0, dtype=np.int64)
        names = table.column("record").take(firsts).to_pylist()
        self.records = IndexedRecords(names, table.column("raw").combine_chunks().take(firsts))
        leaf_rows = np.flatnonzero(table.column("suffix").is_valid().to_numpy(zero_copy_only=False))
        leaves = table.take(leaf_rows)
        starts = np.searchsorted(rec[leaf_rows], np.arange(len(names) + 1)).tolist()
        self.stand_ins = stand_in_records(names, starts, leaves.column("suffix").to_pylist(),
                                          leaves.column("io").to_pylist())
        self.columns = {column: np.array(leaves.column(column).to_pylist(), dtype=object)
                        for column in ("dtype", "shape", "requires_grad", "md5", "data_name")}
        self.columns["tensor"] = leaves.column("tensor").to_numpy(zero_copy_only=False)
        statistics = [np.array(leaves.column(key).to_pylist(), dtype=object) for key in _FLOAT_STATS]
        typed = leaves.column("stats_json")
        for row in np.flatnonzero(typed.is_valid().to_numpy(zero_copy_only=False)).tolist():
            for column, value in zip(statistics, json.loads(typed[int(row)].as_py())):
                column[row] = value
        self.columns.update(zip(STAT_KEYS, statistics))


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
    from msprobe.index.files import decode_metadata, read_index_bytes

    table = read_index_bytes(data, f"{source.url}/{COMPARE_LEAVES}")
    meta = decode_metadata(table.schema.metadata or {})
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
    return table, meta


def indexed_side(source: Any) -> Optional[IndexedSide]:
    """The source's :class:`IndexedSide` (read once, kept until :func:`forget`), or None."""
    try:
        return _SIDES[source]
    except (KeyError, TypeError):
        pass
    found = _fresh_table(source)
    side = None
    if found is not None:
        table, meta = found
        side = IndexedSide(table, meta.get("task"))
        if side.stand_ins is None:
            side = None
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
