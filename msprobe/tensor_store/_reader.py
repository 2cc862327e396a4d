"""Reading payloads back from a rank's ``tensors.zarr``: the manifest, then range reads.

A cold read of one tensor costs two range requests (the shard index, then the run of
inner chunks holding the payload); the index is cached, so later reads from the same
shard cost one. Payloads that are not complete (a crash mid-step, a failed shard) are
reported by :class:`IncompleteTensorError`, never returned.
"""
from __future__ import annotations

import hashlib
import json
import threading
from typing import Any, Optional

import numpy as np

from msprobe.errors import FormatError, MissingDependencyError, StorageNotFoundError, TensorLoadError
from msprobe.tensor_store._layout import (
    MANIFEST_DIR,
    STORE_DIR,
    decode_chunk,
    decode_index,
    index_nbytes,
    location,
    shard_key,
    storage_dtype,
)

__all__ = ["ZarrTensorReader", "IncompleteTensorError", "has_tensor_store"]


class IncompleteTensorError(TensorLoadError):
    """The payload of this data name was not completely stored (the writer stopped mid-step,
    or a shard write failed): it is reported, never returned."""


def has_tensor_store(names: Any) -> bool:
    return STORE_DIR in names


def _meta_of(raw: bytes, where: str) -> dict:
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        raise FormatError(f"{where}: not JSON ({exc})") from None
    if not isinstance(obj, dict) or obj.get("zarr_format") != 3:
        raise FormatError(f"{where}: not Zarr v3 metadata")
    return obj


class ZarrTensorReader:
    """The tensor store of one rank directory (``prefix`` in ``store``)."""

    def __init__(self, store: Any, prefix: str) -> None:
        self.store = store
        self.prefix = prefix.strip("/")
        self._lock = threading.Lock()
        self._arrays: dict = {}
        self._indexes: dict = {}
        self._load_manifest()

    def _k(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix,) + parts if p)

    # -------------------------------------------------------------- manifest
    def _load_manifest(self) -> None:
        where = self._k(STORE_DIR, "zarr.json")
        try:
            group = _meta_of(self.store.get(where), where)
        except StorageNotFoundError:
            raise TensorLoadError(f"{self.store.url.rstrip('/')}/{where}: no tensor store") from None
        m = (group.get("attributes") or {}).get("msprobe_lake")
        if not isinstance(m, dict):
            raise FormatError(f"{where}: attributes.msprobe_lake (the manifest) is missing")
        self.complete = bool(m.get("complete"))
        self.compression = m.get("compression")
        arrays = m.get("arrays") or {}
        self.shards: dict = {a: {int(k): int(v) for k, v in (info.get("shards") or {}).items()}
                             for a, info in arrays.items()}
        for a, info in arrays.items():  # the layout of each array, so reads need no zarr.json request
            try:
                shard, chunk = int(info["shard_elements"]), int(info["chunk_elements"])
                dt = storage_dtype(a)
                if dt.name != info.get("storage_dtype", dt.name) or shard % chunk:
                    raise ValueError(a)
                self._arrays[a] = {"shard": shard, "chunk": chunk, "cps": shard // chunk, "dt": dt, "logical": a,
                                   "codec": "blosc" if info.get("compressed", True) else None}
            except (KeyError, TypeError, ValueError, FormatError):
                continue  # read from the array's zarr.json instead
        self.payloads: dict = {i: tuple(p) for i, p in enumerate(m.get("payloads") or []) if p}
        self.tensors: dict = {dn: (int(v[0]), tuple(v[1])) for dn, v in (m.get("tensors") or {}).items()}
        self.incomplete: set = set(m.get("incomplete") or [])
        if not self.complete:
            self._replay_journal()
        self.incomplete -= set(self.tensors)

    def _replay_journal(self) -> None:
        from msprobe.backends import read_journal

        names_waiting: dict = {}
        for line in read_journal(self.store, self._k(STORE_DIR, MANIFEST_DIR), on_truncated=lambda k, b: None):
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if "shard" in e:
                a, k, size = e["shard"]
                self.shards.setdefault(a, {})[int(k)] = int(size)
            elif "payload" in e and "array" in e:
                self.payloads[int(e["payload"])] = (e["array"], int(e["start"]), int(e["count"]), e.get("sha256"))
            elif "name" in e:
                names_waiting[e["name"]] = (int(e["payload"]), tuple(e["shape"]))
            elif "pending" in e:
                self.incomplete.add(e["pending"])
        for dn, (pidx, shape) in names_waiting.items():
            if pidx in self.payloads:
                self.tensors[dn] = (pidx, shape)
            else:
                self.incomplete.add(dn)

    # ------------------------------------------------------------------ read
    def __contains__(self, data_name: str) -> bool:
        return data_name in self.tensors

    def names(self) -> list:
        return list(self.tensors)

    def locations(self) -> dict:
        out = {}
        for dn, (pidx, _) in self.tensors.items():
            a, start, count, _ = self.payloads[pidx]
            out[dn] = location(a, start, count)
        return out

    def info(self, data_name: str) -> tuple:
        """(logical dtype, shape, array, start, count, sha256) of a stored data name."""
        if data_name not in self.tensors:
            where = f"{self.store.url.rstrip('/')}/{self._k(STORE_DIR)}"
            if data_name in self.incomplete or not self.complete:
                raise IncompleteTensorError(f"{data_name}: its payload in {where} is incomplete "
                                            "(the writer stopped before its shards were stored)")
            raise TensorLoadError(f"{data_name}: not in the tensor store {where}")
        pidx, shape = self.tensors[data_name]
        a, start, count, sha = self.payloads[pidx]
        return a, shape, a, start, count, sha

    def _array(self, name: str) -> dict:
        meta = self._arrays.get(name)
        if meta is None:
            where = self._k(STORE_DIR, name, "zarr.json")
            obj = _meta_of(self.store.get(where), where)
            try:
                shard = int(obj["chunk_grid"]["configuration"]["chunk_shape"][0])
                sh = obj["codecs"][0]
                if sh["name"] != "sharding_indexed":
                    raise KeyError("sharding_indexed")
                chunk = int(sh["configuration"]["chunk_shape"][0])
                inner = sh["configuration"]["codecs"]
                codec = None
                for c in inner[1:]:
                    if c["name"] != "blosc":
                        raise KeyError(c["name"])
                    codec = "blosc"
                logical = obj["attributes"]["msprobe_lake"]["logical_dtype"]
            except (KeyError, TypeError, IndexError) as exc:
                raise FormatError(f"{where}: not a tensor-store array ({exc})") from None
            dt = storage_dtype(logical)
            if dt.name != obj.get("data_type"):
                raise FormatError(f"{where}: data_type {obj.get('data_type')!r} does not hold {logical}")
            meta = {"shard": shard, "chunk": chunk, "cps": shard // chunk, "codec": codec, "dt": dt,
                    "logical": logical}
            self._arrays[name] = meta
        return meta

    def _index(self, name: str, k: int, meta: dict) -> np.ndarray:
        hit = self._indexes.get((name, k))
        if hit is not None:
            return hit
        size = self.shards.get(name, {}).get(k)
        key = self._k(shard_key(name, k))
        if size is None:
            raise IncompleteTensorError(f"{key}: shard not recorded as stored")
        n = index_nbytes(meta["cps"])
        raw = self.store.get_range(key, size - n, size)
        idx = decode_index(raw, meta["cps"], key)
        with self._lock:
            self._indexes[(name, k)] = idx
        return idx

    def read_bits(self, data_name: str) -> tuple:
        """(logical dtype, shape, numpy array of the storage dtype, flat) of ``data_name``."""
        logical, shape, a, start, count, sha = self.info(data_name)
        meta = self._array(a)
        dt = meta["dt"]
        if count == 0:
            return logical, shape, np.zeros(0, dtype=dt)
        out = []
        pos, end = start, start + count
        while pos < end:
            k = pos // meta["shard"]
            s_end = min(end, (k + 1) * meta["shard"])
            out.append(self._read_in_shard(a, k, meta, pos - k * meta["shard"], s_end - k * meta["shard"]))
            pos = s_end
        flat = out[0] if len(out) == 1 else np.concatenate(out)
        if sha and hashlib.sha256(memoryview(np.ascontiguousarray(flat)).cast("B")).hexdigest()[:len(sha)] != sha:
            raise TensorLoadError(f"{data_name}: the stored bytes do not match their SHA-256 (corrupt store)")
        return logical, shape, flat

    def _read_in_shard(self, a: str, k: int, meta: dict, lo: int, hi: int) -> np.ndarray:
        idx = self._index(a, k, meta)
        c0, c1 = lo // meta["chunk"], (hi - 1) // meta["chunk"]
        rows = idx[c0:c1 + 1]
        key = self._k(shard_key(a, k))
        if (rows[:, 0] == np.iinfo(np.uint64).max).any():
            raise IncompleteTensorError(f"{key}: inner chunks {c0}..{c1} are missing")
        b0 = int(rows[:, 0].min())
        b1 = int((rows[:, 0] + rows[:, 1]).max())
        blob = self.store.get_range(key, b0, b1)  # one request for the run of chunks
        if len(blob) != b1 - b0:
            raise TensorLoadError(f"{key}: truncated shard ({len(blob)} of {b1 - b0} bytes)")
        parts = []
        for off, n in rows:
            parts.append(decode_chunk(blob[int(off) - b0:int(off) - b0 + int(n)], meta["dt"], meta["chunk"],
                                      meta["codec"] is not None))
        flat = parts[0] if len(parts) == 1 else np.concatenate(parts)
        base = c0 * meta["chunk"]
        return flat[lo - base:hi - base]

    def load(self, data_name: str, framework: str = "numpy", *, record: str = "?", dtype: Any = None,
             shape: Optional[tuple] = None) -> Any:
        """The tensor of ``data_name`` (numpy: bf16/float8 widened to float32 exactly; torch: exact)."""
        from msprobe.readers._dtypes import canonical_dtype

        logical, stored_shape, flat = self.read_bits(data_name)
        if shape is not None and tuple(int(d) for d in shape) != tuple(stored_shape):
            raise TensorLoadError(f"record {record!r}: {data_name}: stored shape {list(stored_shape)} differs "
                                  f"from the record's {list(shape)}")
        if dtype is not None and canonical_dtype(dtype) not in (None, logical):
            raise TensorLoadError(f"record {record!r}: {data_name}: stored dtype {logical} differs from the "
                                  f"record's {dtype}")
        bits = flat.reshape(stored_shape)
        if framework == "torch":
            return to_torch(bits, logical)
        if logical == "bfloat16":
            return (bits.astype(np.uint32) << 16).view(np.float32)
        if bits.dtype.name == logical:
            return bits.copy()
        t = to_torch(bits, logical)  # float8 and complex32 widen through torch
        return t.float().numpy() if not t.is_complex() else t.to(_torch().complex64).numpy()


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise MissingDependencyError("this dtype needs torch to decode: pip install 'msprobe-lake[torch]'") from None
    return torch


def to_torch(bits: np.ndarray, logical: str) -> Any:
    torch = _torch()
    t = torch.from_numpy(np.array(bits, copy=True, order="C"))
    if bits.dtype.name == logical:
        return t
    tdt = getattr(torch, logical, None)
    if tdt is None:
        raise TensorLoadError(f"torch has no dtype {logical}")
    signed = {np.dtype("uint16"): torch.int16, np.dtype("uint32"): torch.int32, np.dtype("uint8"): torch.uint8}
    if bits.dtype in signed and bits.dtype != np.dtype("uint8"):
        t = torch.from_numpy(np.array(bits, copy=True, order="C").view(bits.dtype.name.replace("u", "")))
    if t.dim() == 0:
        return t.reshape(1).view(tdt).reshape(())
    return t.view(tdt)
