"""``msprobe convert PATH --to classic|zarr [--out URL]``: between ``dump_tensor_data/`` files and
the Zarr tensor store, in either direction, rank directory by rank directory.

Everything else of a rank directory (dump.json, stack.json, construct.json, mapping.csv,
the marker, the error log) is copied byte for byte, except that dump.json's
``dump_data_dir`` and the marker's ``tensor_store`` name the new form and a Parquet index,
when there is one, is rebuilt with the new ``location`` column. Without ``--out`` the
conversion happens in place: the new form is written completely first, then the old
one is deleted.
"""
from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any, Optional

from msprobe.backends import Store, open_store
from msprobe.errors import ConfigError, UnknownDialectError
from msprobe.format.documents import encode_document
from msprobe.format.dtypes import numpy_dtype
from msprobe.format.layout import (
    INDEX_DIR,
    JOURNAL_DIR,
    MAPPING_CSV,
    MARKER_FILE,
    STORE_DIR,
    TENSOR_DIR,
    RankLocation,
    data_dir_url,
    discover,
    encode_mapping,
    join_key,
)
from msprobe.format.marker import with_tensor_format
from msprobe.format.naming import converted_file_name, needs_mapping
from msprobe.format.protocols import ReadableStore
from msprobe.index import write_rank_index
from msprobe.readers import DumpRecord, RankSource
from msprobe.tensor_store import ZarrTensorWriter

__all__ = ["convert", "convert_rank", "RankJob", "ToZarr", "ToClassic"]

TARGETS = ("classic", "zarr")


def _torch_bytes(tensor: Any) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(tensor.contiguous(), buf)
    return buf.getvalue()


def _payload(value: Any) -> tuple:
    """(logical dtype, shape, raw little-endian bytes) of a loaded tensor (torch or numpy)."""
    import numpy as np

    if isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        array = array.astype(array.dtype.newbyteorder("<"), copy=False)
        return array.dtype.name, tuple(array.shape), array.reshape(-1).view(np.uint8).tobytes()
    tensor = value.detach().cpu().resolve_conj().resolve_neg().contiguous()
    from msprobe.dumpers.pytorch import tensor_bytes

    return str(tensor.dtype).replace("torch.", "", 1), tuple(tensor.shape), bytes(tensor_bytes(tensor))


def _rank_files(store: ReadableStore, prefix: str, skip: set) -> list:
    out = []
    for key in store.list_prefix(prefix):
        rel = key[len(prefix):].lstrip("/") if prefix else key
        top = rel.split("/", 1)[0]
        if top in skip:
            continue
        out.append(rel)
    return out


def _rewrite_doc(raw: bytes, data_dir: Optional[str]) -> bytes:
    doc = json.loads(raw)
    if isinstance(doc, dict) and "dump_data_dir" in doc:
        doc["dump_data_dir"] = data_dir
        return encode_document(doc)
    return raw


@dataclass(frozen=True)
class RankJob:
    """One rank directory to convert: read from ``source``, written to ``destination`` (the same
    store when ``in_place``); ``names``: what its directory holds."""

    source: Store
    destination: Store
    loc: RankLocation
    names: frozenset
    in_place: bool

    @property
    def prefix(self) -> str:
        return self.loc.prefix.strip("/")


class ToZarr:
    """``dump_tensor_data/`` files into the Zarr tensor store (``shard_mb``, ``compression``)."""

    name = "zarr"
    reads, writes = TENSOR_DIR, STORE_DIR

    def __init__(self, shard_mb: int, compression: str):
        self.shard_mb = shard_mb
        self.compression = compression

    def write_tensors(self, job: RankJob, source: RankSource, doc: Any) -> tuple:
        """(tensors written, {data name: location} for the index)."""
        writer = ZarrTensorWriter(job.destination, job.prefix, compression=self.compression,
                                  shard_bytes=self.shard_mb << 20)
        seen = set()
        for rec_name, raw in doc.data.items():
            record = DumpRecord(rec_name, 0, source, raw=raw)  # the document is already parsed
            for _, tensor in record.tensors():
                data_name = tensor.data_name
                if not isinstance(data_name, str) or data_name in seen:
                    continue
                seen.add(data_name)
                value = tensor.load("torch" if data_name.endswith(".pt") else "numpy") \
                    if not _is_raw_non_numpy(tensor) else tensor.load("torch")
                logical, shape, data = _payload(value)
                writer.add(data_name, logical, shape, lambda body=data: body, len(data))  # type: ignore[misc]
        writer.close()
        return len(seen), writer.locations()

    @staticmethod
    def keeps(key: str, prefix: str) -> bool:
        """Whether an old-form key survives an in-place conversion."""
        return False


class ToClassic:
    """The Zarr tensor store into ``dump_tensor_data/`` files (with mapping.csv where names need it)."""

    name = "classic"
    reads, writes = STORE_DIR, TENSOR_DIR

    def write_tensors(self, job: RankJob, source: RankSource, doc: Any) -> tuple:
        reader = source.tensor_store()
        mapping = {}
        count = 0
        for data_name in reader.names():
            tensor = reader.load(data_name, "torch")
            file_name = data_name
            if needs_mapping(data_name):
                file_name = converted_file_name(data_name)
                mapping[data_name] = file_name
            if data_name.endswith(".npy"):
                import numpy as np

                buffer = io.BytesIO()
                np.save(buffer, reader.load(data_name, "numpy"), allow_pickle=False)
                body = buffer.getvalue()
            else:
                body = _torch_bytes(tensor)
            job.destination.put(join_key(job.prefix, TENSOR_DIR, file_name), body)
            count += 1
        if mapping:
            job.destination.put(join_key(job.prefix, TENSOR_DIR, MAPPING_CSV), encode_mapping(mapping))
        return count, None

    @staticmethod
    def keeps(key: str, prefix: str) -> bool:
        return key.startswith(join_key(prefix, TENSOR_DIR) + "/")


def _copy_as_is(job: RankJob) -> None:
    """A rank directory with nothing to convert, copied to another store as it is."""
    if job.in_place:
        return
    for rel in _rank_files(job.source, job.prefix, {JOURNAL_DIR}):
        job.destination.put(join_key(job.prefix, rel), job.source.get(join_key(job.prefix, rel)))


def _copy_rank(job: RankJob, strategy: Any) -> None:
    """Everything of the rank directory but its tensors, byte for byte (in place: only what
    changes), dump.json's ``dump_data_dir`` and the marker's ``tensor_store`` naming the new form."""
    data_dir = data_dir_url(job.destination, join_key(job.prefix, strategy.writes))
    for rel in _rank_files(job.source, job.prefix, {TENSOR_DIR, STORE_DIR, JOURNAL_DIR, INDEX_DIR}):
        rewritten = rel in ("dump.json", "debug.json", MARKER_FILE)
        if job.in_place and not rewritten:
            continue
        body = job.source.get(join_key(job.prefix, rel))
        if rel in ("dump.json", "debug.json"):
            body = _rewrite_doc(body, data_dir)
        elif rel == MARKER_FILE:
            body = with_tensor_format(body, strategy.name == "zarr")
        job.destination.put(join_key(job.prefix, rel), body)


def _drop_old_form(job: RankJob, strategy: Any) -> None:
    """In place, once the new form is complete: delete the old one (no empty directory left)."""
    old = strategy.reads
    for key in job.source.list_prefix(join_key(job.prefix, old)):
        if not strategy.keeps(key, job.prefix):
            job.source.delete(key)
    job.source.remove_empty_dirs(join_key(job.prefix, old))


def convert_rank(job: RankJob, strategy: Any) -> Optional[int]:
    """Convert one rank directory with ``strategy`` (:class:`ToZarr` or :class:`ToClassic`):
    the tensors converted, or None when it holds none of the old form (copied as it is)."""
    if strategy.reads not in job.names:
        _copy_as_is(job)
        return None
    source = RankSource(job.source, job.loc)
    doc = source.document()
    count, locations = strategy.write_tensors(job, source, doc)
    _copy_rank(job, strategy)
    if INDEX_DIR in job.names:
        write_rank_index(job.destination, job.prefix, doc, step=job.loc.step, rank=job.loc.rank,
                         rank_dir=job.loc.rank_dir, stack=source.stack(), construct=source.construct(),
                         locations=locations)
    if job.in_place:
        _drop_old_form(job, strategy)
    return count


def convert(path: Any, to: str, out: Any = None, *, storage_options: Optional[dict] = None,
            out_storage_options: Optional[dict] = None, shard_mb: int = 128, compression: str = "zstd",
            progress: Any = None) -> dict:
    """Convert every rank directory of the dump at ``path``; returns counters."""
    if to not in TARGETS:
        raise ConfigError(f"convert --to {to!r}; valid: {list(TARGETS)}")
    strategy = ToZarr(shard_mb, compression) if to == "zarr" else ToClassic()
    source = open_store(path, storage_options)
    destination = open_store(out, out_storage_options if out_storage_options is not None else storage_options,
                             create=True) if out is not None else source
    stats = {"rank_dirs": 0, "tensors": 0, "converted_rank_dirs": 0}
    locs = discover(source, "")
    if not locs:
        raise UnknownDialectError(f"{source.url}: no rank directory found to convert (it holds "
                                  f"{', '.join(sorted(source.list_dir(''))[:8]) or 'nothing'}); expected step<N>/, "
                                  "rank/, rank<N>/, proc<pid>/ with dump.json")
    for loc in locs:
        stats["rank_dirs"] += 1
        names = frozenset(source.list_dir(loc.prefix.strip("/")))
        count = convert_rank(RankJob(source, destination, loc, names, out is None), strategy)
        if count is None:
            continue
        stats["tensors"] += count
        stats["converted_rank_dirs"] += 1
        if callable(progress):
            progress(stats["converted_rank_dirs"], len(locs), loc.prefix)
    if not stats["converted_rank_dirs"]:  # nothing to convert: still, a document it cannot read is an error
        RankSource(source, locs[0]).document()
    return stats


def _is_raw_non_numpy(tensor: Any) -> bool:
    return numpy_dtype(tensor.dtype) is None
