"""The Parquet side index: one file per (step, rank), one row per tensor-like argument.

Default location: ``<rank dir>/index/records.parquet``. With ``out=URL`` the files go
to ``<out>/run=<run>/[split=<split>/]step=<N>/rank=<R>/records.parquet`` (``R`` is
the rank number, or the rank directory's name for ``rank``/``proc<pid>``), so the
indexes of many dumps form one pyarrow dataset (``msprobe.readers.open(out)``).

Columns are :data:`msprobe.index.rows.COLUMNS` (``run, step, rank, rank_dir,
split, seq, record, kind, api_type, api_name, call_index, direction, io, arg_path,
type, dtype, shape, numel, max, min, mean, norm, md5, has_nan, has_inf,
requires_grad, data_name, location, stack_id, parent``). A record without any
tensor keeps one row whose ``io`` is null, so every record is in the index.
``location`` is the payload's key relative to the rank directory. The Parquet
key-value metadata holds ``msprobe_lake.index_version``, ``msprobe_lake.format_version``
and what the reader needs without dump.json (task, level, framework, dialect, run,
step, rank, rank_dir, split, source URL, record count) and what it covers: the size
(``doc_size``) and modification time (``doc_mtime``) of the document it was built from.
An index whose document no longer has that size and time (a re-dump into the same path)
is stale: readers and the lake ignore it, with a :class:`StaleIndexWarning`, and read
(or re-index) the document instead.
"""
from __future__ import annotations

import io
import json
import logging
import re
import warnings
from typing import Any, Callable, Iterable, Optional

from msprobe.backends import Store, mtime_of
from msprobe.errors import FormatError, MsprobeError, require
from msprobe.format.documents import DumpDocument, StackDocument
from msprobe.format.layout import FORMAT_VERSION, INDEX_DIR, join_key, parse_rank_dir
from msprobe.format.protocols import ReadableStore
from msprobe.index.rows import rank_table

__all__ = [
    "partition_value",
    "INDEX_VERSION",
    "INDEX_FILE",
    "META_PREFIX",
    "COMPACT_FILE",
    "StaleIndexWarning",
    "rank_index_table",
    "table_bytes",
    "write_rank_index",
    "read_index_metadata",
    "decode_metadata",
    "read_index_table",
    "read_index_bytes",
    "decode_strings",
    "STRING_COLUMNS",
    "IndexBombError",
    "check_index_file",
    "check_index_footer",
    "check_decoded_strings",
    "decode_limit",
    "read_compactions",
    "concat_tables",
    "partition_key",
    "parse_partition_path",
    "partition_order",
    "doc_stat",
    "mtime_of",
    "stale_reason",
    "warn_stale",
]

log = logging.getLogger("msprobe.readers")


class StaleIndexWarning(UserWarning):
    """A Parquet index no longer describes its document (re-dumped since): it is not used."""


INDEX_VERSION = "1.0"
META_PREFIX = "msprobe_lake."
#: A run's partitions merged into one file (``<out>/run=<run>/_compact.parquet``): same rows,
#: far fewer files to open. Its metadata lists the files it covers (``covers``); readers use
#: it only while every one of them is still listed, and read files it does not cover as usual.
COMPACT_FILE = "_compact.parquet"
#: The index file of a rank directory, relative to it.
INDEX_FILE = f"{INDEX_DIR}/records.parquet"
_SAFE_RE = re.compile(r"[^A-Za-z0-9._\-]+")


def _pyarrow() -> Any:
    return require("pyarrow", "parquet")


def _parquet() -> Any:
    _pyarrow()
    import pyarrow.parquet as pq

    return pq


def _as_doc(doc: Any) -> Any:
    return doc if isinstance(doc, DumpDocument) else DumpDocument(doc if isinstance(doc, dict) else {})


def _stack_ids(stack: Any) -> Optional[dict]:
    if stack is None:
        return None
    stack_doc = stack if isinstance(stack, StackDocument) else StackDocument(stack)
    return stack_doc.ids_of()


def _parents(construct: Any) -> Optional[dict]:
    if construct is None:
        return None
    return construct.raw if hasattr(construct, "raw") else dict(construct)


def doc_stat(store: ReadableStore, key: str) -> tuple:
    """(size, mtime) of a document, (None, None) when it cannot be told: the store's
    :meth:`~msprobe.backends.Store.stat` (a local ``os.stat``, an object store's Last-Modified)."""
    try:
        return store.stat(key)
    except (OSError, MsprobeError, KeyError, ValueError):
        return None, None


def stale_reason(meta: dict, size: Optional[int], mtime: Optional[float], *, local: bool = True) -> Optional[str]:
    """Why an index whose metadata is ``meta`` no longer covers a document of ``size`` bytes
    modified at ``mtime`` (None: it still does, or it cannot be told). Object stores' times
    are compared to the second (listings and HEAD round differently)."""
    old_size, old_mtime = meta.get("doc_size"), meta.get("doc_mtime")
    if old_size is not None and size is not None and int(old_size) != int(size):
        return f"the document has {size} bytes, the index was built from {old_size}"
    if old_mtime is not None and mtime is not None and abs(float(old_mtime) - float(mtime)) > (0.0 if local else 1.0):
        return "the document was modified after the index was built"
    return None


def warn_stale(where: str, reason: str, instead: str = "reading the document instead") -> None:
    msg = f"stale Parquet index {where}: {reason}; {instead}"
    log.info(msg)  # (said once, by the warning: a WARNING record would print it again without a logging set-up)
    warnings.warn(msg, StaleIndexWarning, stacklevel=3)


def rank_index_table(doc: Any, *, step: Optional[int], rank: Optional[int], rank_dir: str,
                     split: Optional[str] = None, run: Optional[str] = None, stack: Any = None,
                     construct: Any = None, mapping: Optional[dict] = None, source: Optional[str] = None,
                     dialect: Optional[str] = None, doc_name: Optional[str] = None,
                     doc_size: Optional[int] = None, locations: Optional[dict] = None,
                     doc_mtime: Optional[float] = None) -> Any:
    """The index table (pyarrow) of one rank's document, metadata included.

    ``doc``: a DumpDocument or the dump.json object; ``stack``/``construct``: a
    StackDocument/ConstructDocument or their JSON objects (or None). ``doc_size`` and
    ``doc_mtime``: what the index covers (see :func:`stale_reason`)."""
    doc = _as_doc(doc)
    data = doc.data
    meta = {
        "index_version": INDEX_VERSION, "format_version": FORMAT_VERSION,
        "task": doc.task, "level": doc.level, "framework": doc.framework, "dialect": dialect,
        "run": run, "step": step, "rank": rank, "rank_dir": rank_dir, "split": split, "source": source,
        "records": len(data), "doc": doc_name, "doc_size": doc_size,
        "doc_mtime": None if doc_mtime is None else repr(float(doc_mtime)),
    }
    return rank_table(data, (run, step, rank, rank_dir, split), stack_ids=_stack_ids(stack),
                      parents=_parents(construct), mapping=mapping, locations=locations,
                      metadata={META_PREFIX + key: "" if value is None else value for key, value in meta.items()})


def table_bytes(table: Any) -> bytes:
    """An index file's bytes: LZ4 (the Parquet codec LZ4_RAW) and plain strings, which write in
    half the CPU of zstd and dictionaries for a file ~5 % larger (900 rows: 48 KB, 45 KB with
    those); column statistics for readers' filters. Compactions keep zstd (read many times)."""
    parquet = _parquet()
    buf = io.BytesIO()
    parquet.write_table(table, buf, compression="lz4", use_dictionary=False, write_statistics=True)
    return buf.getvalue()


def write_rank_index(store: Store, rank_prefix: str, doc: Any, *, step: Optional[int], rank: Optional[int],
                     rank_dir: Optional[str] = None, split: Optional[str] = None, run: Optional[str] = None,
                     stack: Any = None, construct: Any = None, mapping: Optional[dict] = None,
                     dialect: Optional[str] = None, key: Optional[str] = None, doc_name: str = "dump.json",
                     doc_size: Optional[int] = None, source: Optional[str] = None,
                     locations: Optional[dict] = None, doc_mtime: Optional[float] = None,
                     written: Optional[Callable[[str, Any], None]] = None) -> str:
    """Write the index of one rank through ``store`` (``store.put``, atomic) and return its key.
    ``written``: called with the key and the table once it is written (a compaction streams it).

    ``doc`` is the rank's :class:`~msprobe.format.documents.DumpDocument` or the dump.json
    object; ``stack`` and ``construct`` its StackDocument / ConstructDocument or their JSON
    objects, when there are any. The key defaults to ``<rank_prefix>/index/records.parquet``.
    This is what a dumper calls at publish time (``dialect`` defaults to the marker's
    ``msprobe-lake`` only when given). Without ``key``, ``doc_size`` and ``doc_mtime``, they are
    taken from ``<rank_prefix>/<doc_name>`` as it is now (the document is published first).
    """
    if key is None and doc_size is None and doc_mtime is None:
        doc_size, doc_mtime = doc_stat(store, join_key(rank_prefix, doc_name))
    rank_dir = rank_dir or (rank_prefix.rstrip("/").rsplit("/", 1)[-1] if rank_prefix else "rank")
    if source is None:
        source = f"{store.url.rstrip('/')}/{rank_prefix}" if rank_prefix else store.url
    table = rank_index_table(doc, step=step, rank=rank, rank_dir=rank_dir, split=split, run=run, stack=stack,
                             construct=construct, mapping=mapping, source=source, dialect=dialect,
                             doc_name=doc_name, doc_size=doc_size, locations=locations, doc_mtime=doc_mtime)
    key = key or join_key(rank_prefix, INDEX_FILE)
    store.put(key, table_bytes(table))
    if written is not None:
        written(key, table)
    return key


def partition_key(run: Optional[str], step: Optional[int], rank: Optional[int], rank_dir: str,
                  split: Optional[str] = None) -> str:
    """``run=<run>/[split=<s>/]step=<N>/rank=<R>/records.parquet`` (hive style)."""
    parts = []
    if run:
        parts.append(f"run={partition_value(run)}")
    if split:
        parts.append(f"split={partition_value(split)}")
    parts.append(f"step={step if step is not None else 'none'}")
    parts.append(f"rank={rank if rank is not None else partition_value(rank_dir)}")
    return "/".join(parts) + "/records.parquet"


def parse_partition_path(key: str) -> dict:
    """``run=a/step=0/rank=3/records.parquet`` -> {'run': 'a', 'step': 0, 'rank': 3, ...}."""
    out: dict = {}
    for part in key.split("/")[:-1]:
        if "=" in part:
            name, value = part.split("=", 1)
            out[name] = value
    if "step" in out:
        out["step"] = int(out["step"]) if out["step"].isdigit() else None
    if "rank" in out:
        rank_name = out["rank"]
        if rank_name.isdigit():
            out["rank"], out["rank_dir"] = int(rank_name), f"rank{rank_name}"
        else:
            parsed = parse_rank_dir(rank_name)
            out["rank"], out["rank_dir"] = (parsed.rank if parsed else None), rank_name
    return out


def partition_order(key: str) -> tuple:
    """The order readers list a partition's index file in: run, split, step, rank (numerically,
    single-process directories first), rank directory name."""
    fields = parse_partition_path(key)
    step, rank = fields.get("step"), fields.get("rank")
    return (fields.get("run") or "", fields.get("split") or "", -1 if step is None else step,
            -1 if rank is None else rank, fields.get("rank_dir") or key.rsplit("/", 1)[0])


def partition_value(value: str) -> str:
    """A run, split or rank directory name as a Hive partition value (unsafe characters as ``_``)."""
    safe = _SAFE_RE.sub("_", str(value)).strip(".") or "_"
    return safe


def read_index_metadata(store: ReadableStore, key: str) -> dict:
    """The msprobe key-value metadata of an index file (prefix stripped; typed step/rank/records)."""
    parquet = _parquet()
    with store.open_read(key) as file:
        metadata = parquet.read_metadata(file).metadata or {}
    return _decode_meta(metadata)


def decode_metadata(metadata: dict) -> dict:
    """The msprobe key-value metadata of a Parquet schema (prefix stripped; typed step/rank/records)."""
    return _decode_meta(metadata)


def _decode_meta(metadata: dict) -> dict:
    out: dict = {}
    for key, value in metadata.items():
        key = key.decode() if isinstance(key, bytes) else key
        if not key.startswith(META_PREFIX):
            continue
        value = value.decode() if isinstance(value, bytes) else value
        out[key[len(META_PREFIX):]] = value if value != "" else None
    for key in ("step", "rank", "records", "doc_size"):
        if out.get(key) is not None:
            try:
                out[key] = int(out[key])
            except ValueError:
                out[key] = None
    if out.get("doc_mtime") is not None:
        try:
            out["doc_mtime"] = float(out["doc_mtime"])
        except ValueError:
            out["doc_mtime"] = None
    return out


class IndexBombError(FormatError):
    """An index file that would inflate far beyond its size (a Parquet bomb): refused from its
    footer, or from its dictionaries before the strings are decoded."""


#: What an index file may inflate to: this floor, or this many times its size. An honest index
#: (names, numbers, zstd) decodes to about 10x its bytes.
DECODE_FLOOR = 64 << 20
DECODE_RATIO = 64
STRING_COLUMNS = ("run", "rank_dir", "split", "record", "kind", "api_type", "api_name", "direction", "io",
                  "arg_path", "type", "dtype", "md5", "data_name", "location", "stack_id", "parent")


def decode_limit(size: int) -> int:
    """The most bytes index files of ``size`` bytes in all may decode to."""
    return max(DECODE_FLOOR, DECODE_RATIO * max(int(size), 0))


def check_index_footer(md: Any, size: int, where: str) -> int:
    """Refuse an index whose footer declares more decoded bytes than :func:`decode_limit` allows
    (each column chunk counts its uncompressed bytes, at least 8 per row: a run-length encoded
    column of a billion rows costs a few bytes on disk). Returns the estimate."""
    est = 0
    for group_index in range(md.num_row_groups):
        group = md.row_group(group_index)
        for column_index in range(group.num_columns):
            est += max(int(group.column(column_index).total_uncompressed_size), 8 * int(group.num_rows))
    if est > decode_limit(size):
        raise IndexBombError(f"{where}: the index file ({size} bytes) declares {md.num_rows} rows and "
                             f"{est} bytes decoded, over the limit of {decode_limit(size)}: refused (a Parquet bomb?)")
    return est


def check_decoded_strings(table: Any, limit: int, where: str) -> None:
    """A table read with its string columns dictionary-encoded: refuse it before decoding when
    the strings its rows reference add up to more than ``limit`` bytes (a few huge dictionary
    values referenced by many rows)."""
    pyarrow = _pyarrow()
    import pyarrow.compute as pc
    total = 0
    for name in table.column_names:
        col = table.column(name)
        if not pyarrow.types.is_dictionary(col.type):
            continue
        for chunk in col.chunks:
            if len(chunk) == 0 or len(chunk.dictionary) == 0:
                continue
            lengths = pc.binary_length(chunk.dictionary)
            total += int(pc.sum(pc.take(lengths, chunk.indices.fill_null(0))).as_py() or 0)
            if total > limit:
                raise IndexBombError(f"{where}: the index's strings decode to more than {limit} bytes: refused "
                                     "(a Parquet bomb?)")


def decode_strings(table: Any) -> Any:
    """Dictionary-encoded string columns back to plain strings (the index's schema)."""
    pyarrow = _pyarrow()
    fields = [pyarrow.field(field.name, field.type.value_type) if pyarrow.types.is_dictionary(field.type) else field
              for field in table.schema]
    return table.cast(pyarrow.schema(fields, metadata=table.schema.metadata))


def check_index_file(store: ReadableStore, key: str) -> int:
    """:func:`check_index_footer` of an index file read by another engine (DuckDB); its size."""
    parquet = _parquet()
    with store.open_read(key) as file:
        size = file.seek(0, 2)
        file.seek(0)
        check_index_footer(parquet.read_metadata(file), size, key)
    return size


def read_index_table(store: ReadableStore, key: str, columns: Optional[list] = None, filter: Any = None) -> Any:  # noqa: A002
    """Read one index file through ``store``, bounded: its footer and its dictionaries are
    checked (:class:`IndexBombError`) before anything is inflated or decoded."""
    data = store.get(key)
    return read_index_bytes(data, key, columns=columns, filter=filter)


def read_index_bytes(data: bytes, where: str, columns: Optional[list] = None, filter: Any = None) -> Any:  # noqa: A002
    """:func:`read_index_table` of an index file's bytes."""
    parquet = _parquet()
    try:
        parquet_file = parquet.ParquetFile(io.BytesIO(data))
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors: not a Parquet file
        raise FormatError(f"{where}: not a readable index file: {exc}") from None
    check_index_footer(parquet_file.metadata, len(data), where)
    names = parquet_file.schema_arrow.names
    strings = [column for column in STRING_COLUMNS if column in names and (columns is None or column in columns)]
    table = parquet.read_table(io.BytesIO(data), columns=columns, filters=filter, read_dictionary=strings)
    check_decoded_strings(table, decode_limit(len(data)), where)
    return decode_strings(table)




def read_compactions(store: ReadableStore, keys: list) -> dict:
    """compact key -> the keys it covers, for the compacted files that still hold (every file
    they cover is among ``keys``)."""
    present = set(keys)
    out = {}
    for key in keys:
        if key.rsplit("/", 1)[-1] != COMPACT_FILE:
            continue
        parquet = _parquet()
        with store.open_read(key) as file:
            metadata = parquet.read_metadata(file).metadata or {}
        raw = metadata.get((META_PREFIX + "covers").encode())
        try:
            rel = json.loads(raw) if raw else []
        except ValueError:
            continue
        prefix = key[: -len(COMPACT_FILE)]
        covered = tuple(prefix + name for name in rel)
        if covered and all(covered_key in present for covered_key in covered):
            out[key] = covered
    return out


def concat_tables(tables: Iterable[Any]) -> Any:
    """Concatenate tables of the same columns (schema metadata dropped)."""
    pyarrow = _pyarrow()
    tables = [table.replace_schema_metadata(None) for table in tables]
    return pyarrow.concat_tables(tables)
