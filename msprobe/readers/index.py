"""The Parquet side index: one file per (step, rank), one row per tensor-like argument.

Default location: ``<rank dir>/index/records.parquet``. With ``out=URL`` the files go
to ``<out>/run=<run>/[split=<split>/]step=<N>/rank=<R>/records.parquet`` (``R`` is
the rank number, or the rank directory's name for ``rank``/``proc<pid>``), so the
indexes of many dumps form one pyarrow dataset (``msprobe.readers.open(out)``).

Columns are :data:`msprobe.readers._rows.COLUMNS` (``run, step, rank, rank_dir,
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
import os
import re
import warnings
from typing import Any, Iterable, Optional

from msprobe.errors import StorageNotFoundError, require
from msprobe.readers._rows import rank_rows, rows_to_arrow
from msprobe.format.layout import FORMAT_VERSION, join_key
from msprobe.readers._source import INDEX_FILE, RankSource

__all__ = [
    "INDEX_VERSION",
    "INDEX_FILE",
    "META_PREFIX",
    "rank_index_table",
    "write_rank_index",
    "build_index",
    "read_index_metadata",
    "read_index_table",
    "partition_key",
    "compact_index",
    "COMPACT_FILE",
    "StaleIndexWarning",
    "doc_stat",
    "stale_reason",
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
_SAFE_RE = re.compile(r"[^A-Za-z0-9._\-]+")


def _pa() -> Any:
    return require("pyarrow", "parquet")


def _pq() -> Any:
    _pa()
    import pyarrow.parquet as pq

    return pq


def _as_doc(doc: Any) -> Any:
    from msprobe.format.documents import DumpDocument

    return doc if isinstance(doc, DumpDocument) else DumpDocument(doc if isinstance(doc, dict) else {})


def _stack_ids(stack: Any) -> Optional[dict]:
    if stack is None:
        return None
    from msprobe.format.documents import StackDocument

    sd = stack if isinstance(stack, StackDocument) else StackDocument(stack)
    return sd.ids_of()


def _parents(construct: Any) -> Optional[dict]:
    if construct is None:
        return None
    return construct.raw if hasattr(construct, "raw") else dict(construct)


def doc_stat(store: Any, key: str) -> tuple:
    """(size, mtime) of a document, (None, None) when it cannot be told: a local ``os.stat``,
    else the file system's ``info`` (an object store's Last-Modified)."""
    from msprobe.errors import MsprobeError

    local = store.local_path(key) if getattr(store, "is_local", False) else None
    try:
        if local:
            st = os.stat(local)
            return st.st_size, st.st_mtime
        fs, root = getattr(store, "fs", None), getattr(store, "root", None)
        if fs is None:
            return store.size(key), None
        path = f"{root}/{key}" if root else key
        fs.invalidate_cache(path)
        info = fs.info(path)
        return info.get("size"), _mtime_of(info)
    except (OSError, MsprobeError, KeyError, ValueError):
        return None, None


def _mtime_of(info: dict) -> Optional[float]:
    """The modification time in an fsspec ``info``/listing entry (seconds), or None."""
    mt = info.get("LastModified") or info.get("mtime") or info.get("created")
    if hasattr(mt, "timestamp"):
        mt = mt.timestamp()
    return float(mt) if isinstance(mt, (int, float)) and not isinstance(mt, bool) else None


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
    log.warning(msg)
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
    cols = rank_rows(data, run=run, step=step, rank=rank, rank_dir=rank_dir, split=split,
                     stack_ids=_stack_ids(stack), parents=_parents(construct), mapping=mapping, placeholders=True,
                     locations=locations)
    meta = {
        "index_version": INDEX_VERSION, "format_version": FORMAT_VERSION,
        "task": doc.task, "level": doc.level, "framework": doc.framework, "dialect": dialect,
        "run": run, "step": step, "rank": rank, "rank_dir": rank_dir, "split": split, "source": source,
        "records": len(data), "doc": doc_name, "doc_size": doc_size,
        "doc_mtime": None if doc_mtime is None else repr(float(doc_mtime)),
    }
    return rows_to_arrow(cols, {META_PREFIX + k: "" if v is None else v for k, v in meta.items()})


def _table_bytes(table: Any) -> bytes:
    pq = _pq()
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", write_statistics=True)
    return buf.getvalue()


def write_rank_index(store: Any, rank_prefix: str, doc: Any, *, step: Optional[int], rank: Optional[int],
                     rank_dir: Optional[str] = None, split: Optional[str] = None, run: Optional[str] = None,
                     stack: Any = None, construct: Any = None, mapping: Optional[dict] = None,
                     dialect: Optional[str] = None, key: Optional[str] = None, doc_name: str = "dump.json",
                     doc_size: Optional[int] = None, source: Optional[str] = None,
                     locations: Optional[dict] = None, doc_mtime: Optional[float] = None) -> str:
    """Write the index of one rank through ``store`` (``store.put``, atomic) and return its key.

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
    store.put(key, _table_bytes(table))
    return key


def partition_key(run: Optional[str], step: Optional[int], rank: Optional[int], rank_dir: str,
                  split: Optional[str] = None) -> str:
    """``run=<run>/[split=<s>/]step=<N>/rank=<R>/records.parquet`` (hive style)."""
    parts = []
    if run:
        parts.append(f"run={_safe(run)}")
    if split:
        parts.append(f"split={_safe(split)}")
    parts.append(f"step={step if step is not None else 'none'}")
    parts.append(f"rank={rank if rank is not None else _safe(rank_dir)}")
    return "/".join(parts) + "/records.parquet"


def _safe(value: str) -> str:
    s = _SAFE_RE.sub("_", str(value)).strip(".") or "_"
    return s


def read_index_metadata(store: Any, key: str) -> dict:
    """The msprobe key-value metadata of an index file (prefix stripped; typed step/rank/records)."""
    pq = _pq()
    with store.open_read(key) as f:
        md = pq.read_metadata(f).metadata or {}
    return _decode_meta(md)


def _decode_meta(md: dict) -> dict:
    out: dict = {}
    for k, v in md.items():
        k = k.decode() if isinstance(k, bytes) else k
        if not k.startswith(META_PREFIX):
            continue
        v = v.decode() if isinstance(v, bytes) else v
        out[k[len(META_PREFIX):]] = v if v != "" else None
    for k in ("step", "rank", "records", "doc_size"):
        if out.get(k) is not None:
            try:
                out[k] = int(out[k])
            except ValueError:
                out[k] = None
    if out.get("doc_mtime") is not None:
        try:
            out["doc_mtime"] = float(out["doc_mtime"])
        except ValueError:
            out["doc_mtime"] = None
    return out


def read_index_table(store: Any, key: str, columns: Optional[list] = None, filter: Any = None) -> Any:
    """Read one index file through ``store``."""
    pq = _pq()
    data = store.get(key)
    return pq.read_table(io.BytesIO(data), columns=columns, filters=filter)


def build_index(dump_or_path: Any, out: Any = None, *, storage_options: Optional[dict] = None,
                out_storage_options: Optional[dict] = None, run: Optional[str] = None,
                progress: Any = None, skip_existing: bool = False, compact: bool = True) -> list:
    """Build the Parquet index of every rank of a dump; returns the URLs written.

    ``dump_or_path``: a :class:`~msprobe.readers.Dump` or anything ``open()`` takes.
    ``out``: None writes ``<rank dir>/index/records.parquet`` into the dump itself;
    a URL/path (or Store) writes hive partitions there instead. ``run`` names the
    dump in the ``run`` column (default: the dump's directory name). ``progress``:
    True for :class:`msprobe.progress.Progress` on stderr, ``"auto"`` for it when stderr is a
    terminal, or a callable ``(done, total, what)``. With ``out``,
    ``compact=True`` finally merges the run's partitions into ``run=<run>/_compact.parquet``
    (see :func:`compact_index`); the per-(step, rank) files stay.
    """
    from msprobe.readers._api import open as open_dump
    from msprobe.readers._dump import Dump

    _pa()
    dump = dump_or_path if isinstance(dump_or_path, Dump) else open_dump(
        dump_or_path, engine="msprobe", storage_options=storage_options, run=run)
    run = run or dump.run
    from msprobe.readers._store import open_store

    if out is not None:
        out_store = open_store(out, out_storage_options, create=True)
        stale = join_key(f"run={_safe(run)}" if run else "", COMPACT_FILE)
        if out_store.exists(stale):
            out_store.delete(stale)  # the run's files change: its compaction no longer holds
    else:
        out_store = None
        dump_store = dump.store
        if dump_store.read_only:
            dump_store = open_store(dump.url, dump.storage_options or None, read_only=False, create=False)
    sources = [s for s in dump.sources if isinstance(s, RankSource) and not getattr(s, "index_only", False)]
    show = None
    if progress is True or progress == "auto":
        from msprobe.progress import Progress

        show = Progress(len(sources), "index", "rank dirs", enabled=None if progress == "auto" else True)
    written = []
    for i, src in enumerate(sources):
        if out_store is None:
            store, prefix = dump_store, src.prefix
            key = join_key(prefix, INDEX_FILE)
        else:
            store, prefix = out_store, ""
            key = partition_key(run, src.step, src.rank, src.rank_dir, src.split)
        if not (skip_existing and store.exists(key) and _covers(store, key, src)):
            was_loaded = src.loaded
            size, mtime = doc_stat(src.store, src.doc_key) if src.doc_name else (None, None)
            try:
                doc = src.document()
            except StorageNotFoundError:
                continue
            write_rank_index(store, prefix, doc, step=src.step, rank=src.rank, rank_dir=src.rank_dir,
                             split=src.split, run=run, stack=src.stack(), construct=src.construct(),
                             mapping=src.mapping() if src._has_mapping() else None,  # noqa: SLF001
                             dialect=dump.dialect_of(src), key=key, doc_name=src.doc_name or "dump.json",
                             doc_size=src._doc_size if src._doc_size is not None else size,  # noqa: SLF001
                             doc_mtime=mtime, source=src.url, locations=src.tensor_locations())
            if not was_loaded:
                src._reset()  # noqa: SLF001 - bound memory: one document at a time
        written.append(f"{store.url.rstrip('/')}/{key}")
        if show is not None:
            show.update()
        elif callable(progress):
            progress(i + 1, len(sources), src.url)
    if show is not None:
        show.close()
    if out_store is not None and compact and written:
        compact_index(out_store, runs=[run])
    return written


def _covers(store: Any, key: str, src: Any) -> bool:
    """True while the index at ``key`` still covers ``src``'s document (skip_existing)."""
    try:
        meta = read_index_metadata(store, key)
    except (ValueError, OSError):  # a damaged index (MsprobeError and ArrowInvalid are ValueErrors)
        return False
    if not src.doc_name:
        return True
    size, mtime = doc_stat(src.store, src.doc_key)
    reason = stale_reason(meta, size, mtime, local=bool(getattr(src.store, "is_local", False)))
    if reason is not None:
        log.info("re-indexing %s: %s", src.url, reason)
    return reason is None


def _partition_dir(key: str) -> str:
    """The run partition a lake key belongs to ('' without one)."""
    first = key.split("/", 1)[0]
    return first if first.startswith("run=") and "/" in key else ""


def compact_index(out: Any, *, storage_options: Optional[dict] = None, runs: Optional[Iterable] = None) -> list:
    """Merge the per-(step, rank) index files of each run of a lake into one
    ``run=<run>/_compact.parquet`` (row order as a reader lists them). Returns the keys written.

    Opening and scanning hundreds of small files costs more than reading their rows; the
    compacted file is what readers scan while it covers every file of its run.
    """
    from msprobe.readers._source import IndexSource
    from msprobe.readers._store import open_store

    pq = _pq()
    pa = _pa()
    store = out if hasattr(out, "list_prefix") else open_store(out, storage_options, create=True)
    wanted = None if runs is None else {f"run={_safe(r)}" if r else "" for r in runs}
    groups: dict = {}
    for key in store.list_prefix(""):
        if not key.endswith(".parquet") or key.rsplit("/", 1)[-1] == COMPACT_FILE:
            continue
        part = _partition_dir(key)
        if wanted is None or part in wanted:
            groups.setdefault(part, []).append(key)
    written = []
    for part, keys in sorted(groups.items()):
        keys.sort(key=lambda k: IndexSource(store, k).key)
        tables = [pq.read_table(io.BytesIO(store.get(k))) for k in keys]
        meta = dict(tables[0].schema.metadata or {})
        table = pa.concat_tables([t.replace_schema_metadata(None) for t in tables])
        prefix = f"{part}/" if part else ""
        meta[(META_PREFIX + "covers").encode()] = json.dumps([k[len(prefix):] for k in keys]).encode()
        meta[(META_PREFIX + "records").encode()] = str(sum(
            int((t.schema.metadata or {}).get((META_PREFIX + "records").encode(), b"0") or 0) for t in tables)).encode()
        for k in ("step", "rank", "rank_dir", "source", "doc", "doc_size"):
            meta.pop((META_PREFIX + k).encode(), None)
        buf = io.BytesIO()
        pq.write_table(table.replace_schema_metadata(meta), buf, compression="zstd", row_group_size=1 << 16)
        key = join_key(part, COMPACT_FILE)
        store.put(key, buf.getvalue())
        written.append(key)
    return written


def read_compactions(store: Any, keys: list) -> dict:
    """compact key -> the keys it covers, for the compacted files that still hold (every file
    they cover is among ``keys``)."""
    present = set(keys)
    out = {}
    for key in keys:
        if key.rsplit("/", 1)[-1] != COMPACT_FILE:
            continue
        pq = _pq()
        with store.open_read(key) as f:
            md = pq.read_metadata(f).metadata or {}
        raw = md.get((META_PREFIX + "covers").encode())
        try:
            rel = json.loads(raw) if raw else []
        except ValueError:
            continue
        prefix = key[: -len(COMPACT_FILE)]
        covered = tuple(prefix + r for r in rel)
        if covered and all(c in present for c in covered):
            out[key] = covered
    return out


def concat_tables(tables: Iterable[Any]) -> Any:
    """Concatenate tables of the same columns (schema metadata dropped)."""
    pa = _pa()
    tables = [t.replace_schema_metadata(None) for t in tables]
    return pa.concat_tables(tables)
