"""compare's leaf table of a rank directory (``index/compare/leaves.parquet``, spec/FORMAT.md 18),
written by ``msprobe index`` beside ``index/records.parquet``: :func:`compare_leaf_table` makes it
from a document's ``data`` (the leaves as compare walks them, :mod:`msprobe.compare._indexed`
reads them back as stand-in records), :func:`write_compare_leaves` writes it.

Its columns are laid out in C where the C module is there (the walk, the rests, the leaves' texts,
the Arrow buffers: :mod:`msprobe.index.columns`); the Python code is the fallback and the
reference (tests/compare/test_compare_index.py holds the two equal).
"""
from __future__ import annotations

import json
import threading
from typing import Any, Callable, Optional

from msprobe.compare._indexed import (
    _DICTIONARY,
    _FLOAT_STATS,
    COMPARE_LEAVES,
    COMPARE_LEAVES_VERSION,
    _rests,
    _walk_all,
    _walks_the_same,
    stand_in_records,
)
from msprobe.errors import require
from msprobe.format.layout import join_key
from msprobe.format.stats import STAT_KEYS
from msprobe.index import META_PREFIX
from msprobe.index.columns import column as arrow_column
from msprobe.index.columns import int_array

__all__ = ["compare_leaf_table", "write_compare_leaves"]

_FLOAT_OR_NONE = {float, type(None)}
_STR_OR_NONE = {str, type(None)}


def _lays_out(names: list, starts: list, suffixes: list, ios: list, rests: list) -> bool:
    """Whether a document's leaves lay out as stand-in records that compare's walk takes back to
    the same suffixes and ios (:func:`stand_in_records`, :func:`_walks_the_same`). The answer
    depends on the records' names, leaf counts, suffixes and ios alone, which the ranks of a step
    share: it is kept for the last few documents by a digest of those (a name or suffix holding
    the separator is checked every time)."""
    import hashlib

    import numpy as np

    texts_of_ios = ios if set(map(type, ios)) <= {str} else [io if io.__class__ is str else "\x02" for io in ios]
    all_ios = "\x00".join(texts_of_ios)
    texts = "\x00".join(names) + "\x01" + "\x00".join(suffixes) + "\x01" + all_ios
    exact = texts.count("\x00") + texts.count("\x01") == max(len(names) - 1, 0) + 2 * max(len(suffixes) - 1, 0) + 2
    if texts_of_ios is not ios:  # a null io written as \x02: no io may hold it
        all_ios = "".join(io for io in ios if io.__class__ is str)
    key = None
    if exact and "\x02" not in all_ios:
        digest = hashlib.blake2b(texts.encode("utf-8", "surrogatepass"), digest_size=20)
        digest.update(np.asarray(starts, dtype=np.int64).tobytes())
        key = digest.digest()
        with _LAID_OUT_LOCK:
            if key in _LAID_OUT:
                return _LAID_OUT[key]
    leaf_rec = np.repeat(np.arange(len(names)), np.diff(starts))
    stand_ins = stand_in_records(names, leaf_rec, ios, rests)
    laid_out = stand_ins is not None and _walks_the_same(stand_ins, suffixes, ios)
    if key is not None:
        with _LAID_OUT_LOCK:
            _LAID_OUT[key] = laid_out
            while len(_LAID_OUT) > 8:
                _LAID_OUT.pop(next(iter(_LAID_OUT)))
    return laid_out


#: :func:`_lays_out`'s answers by digest (the last 8 documents of distinct records)
_LAID_OUT: dict = {}
_LAID_OUT_LOCK = threading.Lock()


def _record_jsons(data: dict, names: list) -> list:
    """The records' JSON: orjson's where it is the record's (it writes NaN and +-Infinity as null and
    refuses integers beyond 64 bits: those, and any text holding null, through json)."""
    dumps: Optional[Callable] = None
    try:
        import orjson

        dumps = orjson.dumps
    except ImportError:
        pass
    out: list = []
    for name in names:
        record = data[name]
        if dumps is not None:
            try:
                text = dumps(record)
            except TypeError:  # orjson.JSONEncodeError is a TypeError
                text = b"null"
            if b"null" not in text:
                out.append(text.decode("utf-8"))
                continue
        out.append(json.dumps(record, separators=(",", ":"), ensure_ascii=False))
    return out


def _json_typed(statistics: list, floats: list) -> list:
    """Per leaf, None where its four statistics are floats or null, else the JSON array of them
    (``floats``: per statistic, whether its column holds floats and nulls only)."""
    mixed = [position for position, only_floats in enumerate(floats) if not only_floats]
    typed: list = [None] * (len(statistics[0]) if statistics else 0)
    if not mixed:
        return typed
    for leaf, values in enumerate(zip(*statistics)):
        if not all(value is None or value.__class__ is float for value in values):
            typed[leaf] = json.dumps(list(values))
    return typed


def compare_leaf_table(data: dict, metadata: Optional[dict] = None) -> Optional[Any]:
    """The leaf table (pyarrow) of a document's ``data``, or None where its records' leaves cannot
    be laid out as stand-ins (compare then reads the document)."""
    import numpy as np

    from msprobe.compare._plan import Leaves

    pa = require("pyarrow", "parquet")
    names, starts, suffixes, ios, leaf_list = _walk_all(data)
    rests = _rests(names, starts, suffixes, ios)
    if not _lays_out(names, starts, suffixes, ios, rests):
        return None
    leaves = Leaves()
    leaves.leaf = list(leaf_list)
    leaves.finish("md5")
    statistics = [leaves.statistics[key] for key in STAT_KEYS]
    only_floats = [set(map(type, column)) <= _FLOAT_OR_NONE for column in statistics]
    floats = [column if pure else [value if value is None or value.__class__ is float else None for value in column]
              for column, pure in zip(statistics, only_floats)]
    typed = _json_typed(statistics, only_floats)
    data_names = [leaf.get("data_name") if leaf.__class__ is dict else None for leaf in leaf_list]
    if not set(map(type, data_names)) <= _STR_OR_NONE:
        data_names = [name if isinstance(name, str) else None for name in data_names]
    # one row per leaf, a placeholder row (no suffix) for a record without one; each record's JSON on its first row
    counts = np.diff(starts)
    rows_of = np.maximum(counts, 1)
    rec = np.repeat(np.arange(len(names)), rows_of)
    first = np.concatenate(([0], np.cumsum(rows_of)[:-1])).astype(np.int64) if len(names) else np.zeros(0, np.int64)
    row_leaf = np.full(len(rec), -1, dtype=np.int64)
    with_leaves = np.flatnonzero(counts > 0)
    if len(with_leaves):
        row_leaf[np.repeat(first[with_leaves], counts[with_leaves]) +
                 (np.arange(len(leaf_list)) - np.repeat(np.asarray(starts[:-1])[with_leaves], counts[with_leaves]))] = \
            np.arange(len(leaf_list))
    index = None if len(row_leaf) == len(leaf_list) else row_leaf.tobytes()  # None: the rows are the leaves
    raw_at = np.full(len(rec), -1, dtype=np.int64)
    raw_at[first] = np.arange(len(names))
    string = pa.string()
    columns = {
        "rec": int_array(rec, pa.int32()), "record": arrow_column(names, string, rec.astype(np.int64).tobytes()),
        **{key: arrow_column(values, string, index) for key, values in (("io", ios), ("suffix", suffixes), ("rest", rests))},
        "tensor": arrow_column(leaves.tensor, pa.bool_(), index),
        **{key: arrow_column(getattr(leaves, key), string, index) for key in ("dtype", "shape", "requires_grad")},
        **{key: arrow_column(values, pa.float64(), index) for key, values in zip(_FLOAT_STATS, floats)},
        "stats_json": arrow_column(typed, string, index), "md5": arrow_column(leaves.md5, string, index),
        "data_name": arrow_column(data_names, string, index),
        "raw": arrow_column(_record_jsons(data, names), string, raw_at.tobytes()),
    }
    meta = {f"{META_PREFIX}compare_leaves_version": COMPARE_LEAVES_VERSION}
    meta.update({f"{META_PREFIX}{key}": "" if value is None else str(value) for key, value in (metadata or {}).items()})
    return pa.Table.from_arrays(list(columns.values()), names=list(columns)).replace_schema_metadata(meta)


def write_compare_leaves(store: Any, prefix: str, doc: Any, doc_size: Optional[int], doc_mtime: Optional[float],
                         task: Optional[str] = None) -> Optional[str]:
    """Write a rank directory's leaf table (:data:`COMPARE_LEAVES`) through ``store``; its key, or
    None where the document's records cannot be laid out (an older table there is removed)."""
    key = join_key(prefix, COMPARE_LEAVES)
    data = doc.data if hasattr(doc, "data") else doc.get("data", {})
    task = task if task is not None else (doc.task if hasattr(doc, "task") else doc.get("task"))
    from msprobe.compare._rows import _has_md5
    from msprobe.format.model import infer_framework

    framework = infer_framework(data)
    table = compare_leaf_table(data, {"doc_size": doc_size, "doc_mtime": None if doc_mtime is None else
                                      repr(float(doc_mtime)), "task": task, "records": len(data),
                                      "framework": framework[0] if framework else "none",
                                      "has_md5": "1" if _has_md5(data) else "0"})
    if table is None:
        if store.exists(key):
            store.delete(key)
        return None
    store.put(key, _table_bytes(table))
    return key


def _table_bytes(table: Any) -> bytes:
    """The leaf table as Parquet bytes: dictionaries for the columns of few values, the records'
    JSON (most of the bytes) in zstd, the other columns in LZ4 (LZ4_RAW: a quarter of the CPU of
    zstd for them, 80 KB where zstd made 74 for 300 records), no column statistics (nobody filters
    on them)."""
    import io

    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression={name: "zstd" if name == "raw" else "lz4" for name in table.column_names},
                   write_statistics=False, use_dictionary=_DICTIONARY)
    return buffer.getvalue()
