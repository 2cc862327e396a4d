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
import os
from typing import Any, Optional

from msprobe.backends import open_store
from msprobe.errors import ConfigError, MsprobeError
from msprobe.format.documents import encode_document
from msprobe.format.dtypes import numpy_dtype
from msprobe.format.layout import (
    INDEX_DIR,
    JOURNAL_DIR,
    MAPPING_CSV,
    MARKER_FILE,
    STORE_DIR,
    TENSOR_DIR,
    data_dir_url,
    discover,
    encode_mapping,
    join_key,
)
from msprobe.format.marker import with_tensor_format
from msprobe.format.naming import converted_file_name, needs_mapping
from msprobe.format.protocols import ReadableStore
from msprobe.index import write_rank_index
from msprobe.readers._record import DumpRecord
from msprobe.readers._source import RankSource
from msprobe.tensor_store._writer import ZarrTensorWriter

__all__ = ["convert"]

TARGETS = ("classic", "zarr")


def _torch_bytes(t: Any) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(t.contiguous(), buf)
    return buf.getvalue()


def _payload(value: Any) -> tuple:
    """(logical dtype, shape, raw little-endian bytes) of a loaded tensor (torch or numpy)."""
    import numpy as np

    if isinstance(value, np.ndarray):
        a = np.ascontiguousarray(value)
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        return a.dtype.name, tuple(a.shape), a.reshape(-1).view(np.uint8).tobytes()
    t = value.detach().cpu().resolve_conj().resolve_neg().contiguous()
    from msprobe.dumpers.pytorch._encode import tensor_bytes

    return str(t.dtype).replace("torch.", "", 1), tuple(t.shape), bytes(tensor_bytes(t))


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


def convert(path: Any, to: str, out: Any = None, *, storage_options: Optional[dict] = None,
            out_storage_options: Optional[dict] = None, shard_mb: int = 128, compression: str = "zstd",
            progress: Any = None) -> dict:
    """Convert every rank directory of the dump at ``path``; returns counters."""
    if to not in TARGETS:
        raise ConfigError(f"convert --to {to!r}; valid: {list(TARGETS)}")
    src_store = open_store(path, storage_options)
    dst_store = open_store(out, out_storage_options if out_storage_options is not None else storage_options,
                           create=True) if out is not None else src_store
    in_place = out is None
    stats = {"rank_dirs": 0, "tensors": 0, "converted_rank_dirs": 0}
    locs = discover(src_store, "")
    if not locs:
        raise MsprobeError(f"{src_store.url}: no rank directory (dump.json) found to convert")
    for loc in locs:
        stats["rank_dirs"] += 1
        prefix = loc.prefix.strip("/")
        names = set(src_store.list_dir(prefix))
        src = RankSource(src_store, loc)
        has_zarr, has_files = STORE_DIR in names, TENSOR_DIR in names
        if (to == "zarr" and not has_files) or (to == "classic" and not has_zarr):
            if not in_place:  # nothing to convert: copied as it is
                for rel in _rank_files(src_store, prefix, {JOURNAL_DIR}):
                    dst_store.put(join_key(prefix, rel), src_store.get(join_key(prefix, rel)))
            continue
        doc = src.document()
        data_names = []
        for rec_name, raw in doc.data.items():
            rec = DumpRecord(rec_name, 0, src, raw=raw)  # the document is already parsed
            for _, t in rec.tensors():
                if isinstance(t.data_name, str):
                    data_names.append((t, rec_name))
        locations: Optional[dict] = None
        if to == "zarr":
            w = ZarrTensorWriter(dst_store, prefix, compression=compression, shard_bytes=shard_mb << 20)
            seen = set()
            for t, _ in data_names:
                if t.data_name in seen:
                    continue
                seen.add(t.data_name)
                value = t.load("torch" if t.data_name.endswith(".pt") else "numpy") \
                    if not _is_raw_non_numpy(t) else t.load("torch")
                logical, shape, data = _payload(value)
                w.add(t.data_name, logical, shape, lambda d=data: d, len(data))  # type: ignore[misc]
                stats["tensors"] += 1
            w.close()
            locations = w.locations()
            skip = {TENSOR_DIR, STORE_DIR, JOURNAL_DIR, INDEX_DIR}
            new_dir = STORE_DIR
        else:
            reader = src.tensor_store()
            mapping = {}
            for dn in reader.names():
                t = reader.load(dn, "torch")
                fname = dn
                if needs_mapping(dn):
                    fname = converted_file_name(dn)
                    mapping[dn] = fname
                if dn.endswith(".npy"):
                    import numpy as np

                    buf = io.BytesIO()
                    np.save(buf, reader.load(dn, "numpy"), allow_pickle=False)
                    body = buf.getvalue()
                else:
                    body = _torch_bytes(t)
                dst_store.put(join_key(prefix, TENSOR_DIR, fname), body)
                stats["tensors"] += 1
            if mapping:
                dst_store.put(join_key(prefix, TENSOR_DIR, MAPPING_CSV), encode_mapping(mapping))
            skip = {TENSOR_DIR, STORE_DIR, JOURNAL_DIR, INDEX_DIR}
            new_dir = TENSOR_DIR
        data_dir = data_dir_url(dst_store, join_key(prefix, new_dir))
        for rel in _rank_files(src_store, prefix, skip):
            body = src_store.get(join_key(prefix, rel))
            if rel in ("dump.json", "debug.json"):
                body = _rewrite_doc(body, data_dir)
            elif rel == MARKER_FILE:
                body = with_tensor_format(body, to == "zarr")
            if in_place and rel not in ("dump.json", "debug.json", MARKER_FILE):
                continue
            dst_store.put(join_key(prefix, rel), body)
        if INDEX_DIR in names:
            write_rank_index(dst_store, prefix, doc, step=loc.step, rank=loc.rank, rank_dir=loc.rank_dir,
                             stack=src.stack(), construct=src.construct(), locations=locations)
        if in_place:  # the new form is complete: drop the old one
            old = TENSOR_DIR if to == "zarr" else STORE_DIR
            for key in src_store.list_prefix(join_key(prefix, old)):
                if to == "classic" and key.startswith(join_key(prefix, TENSOR_DIR) + "/"):
                    continue
                src_store.delete(key)
            if getattr(src_store, "is_local", False):  # no empty directory left behind
                import shutil

                path = src_store.local_path(join_key(prefix, old))
                if path and not any(files for _, _, files in os.walk(path)):
                    shutil.rmtree(path, ignore_errors=True)
        stats["converted_rank_dirs"] += 1
        if callable(progress):
            progress(stats["converted_rank_dirs"], len(locs), loc.prefix)
    return stats


def _is_raw_non_numpy(t: Any) -> bool:
    return numpy_dtype(t.dtype) is None
