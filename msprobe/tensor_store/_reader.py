"""Reading payloads back from a rank's ``tensors.zarr``: the manifest, then range reads.

A cold read of one tensor costs two range requests (the shard index, then the run of
inner chunks holding the payload); the index is cached, so later reads from the same
shard cost one. Payloads that are not complete (a crash mid-step, a failed shard) are
reported by :class:`IncompleteTensorError`, never returned.
"""
from __future__ import annotations

import hashlib
import json
import math
import threading
from typing import Any, Optional

import numpy as np

from msprobe.backends import read_journal
from msprobe.errors import (
    FormatError,
    MissingDependencyError,
    StorageNotFoundError,
    TensorLoadError,
)
from msprobe.format.dtypes import canonical_dtype
from msprobe.format.layout import join_key
from msprobe.format.protocols import ReadableStore
from msprobe.tensor_store._layout import (
    _MISSING,
    MANIFEST_DIR,
    STORE_DIR,
    decode_chunk,
    decode_index,
    index_nbytes,
    location,
    max_encoded_nbytes,
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
    except (ValueError, RecursionError) as exc:
        raise FormatError(f"{where}: not JSON ({type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(obj, dict) or obj.get("zarr_format") != 3:
        raise FormatError(f"{where}: not Zarr v3 metadata")
    return obj


#: a shard has at most this many inner chunks (its index is read in one request)
MAX_CHUNKS_PER_SHARD = 1 << 20


#: no offset, size or count in a tensor store comes near this (8 PiB); larger ones are corrupt
MAX_STORE_INT = 1 << 53


def _int(v: Any, what: str, where: str, minimum: int = 0) -> int:
    """``v`` as an int in ``minimum..MAX_STORE_INT``; anything else (a float, a string, null, NaN,
    a bool, 2**64) is a FormatError."""
    if not isinstance(v, int) or isinstance(v, bool) or not minimum <= v <= MAX_STORE_INT:
        raise FormatError(f"{where}: {what} is {str(v)[:80]!r}, not an integer in {minimum}..2**53")
    return v


def _layout(shard: Any, chunk: Any, where: str) -> tuple:
    """(shard elements, chunk elements, chunks per shard) checked: chunk >= 1 dividing shard."""
    shard, chunk = _int(shard, "shard_elements", where, 1), _int(chunk, "chunk_elements", where, 1)
    if shard % chunk or shard // chunk > MAX_CHUNKS_PER_SHARD:
        raise FormatError(f"{where}: shard of {shard} elements is not a whole number (at most "
                          f"{MAX_CHUNKS_PER_SHARD}) of {chunk}-element chunks")
    return shard, chunk, shard // chunk


def _parse_manifest(m: dict, where: str) -> tuple:
    """(arrays, shards, payloads, tensors, incomplete) of a manifest, every field type-checked."""
    arrays = m.get("arrays") or {}
    if not isinstance(arrays, dict):
        raise FormatError(f"{where}: manifest arrays is not an object")
    shards: dict = {}
    layouts: dict = {}
    for a, info in arrays.items():
        if not isinstance(info, dict):
            raise FormatError(f"{where}: manifest arrays[{a!r}] is not an object")
        sh = info.get("shards") or {}
        if not isinstance(sh, dict):
            raise FormatError(f"{where}: manifest arrays[{a!r}].shards is not an object")
        shards[a] = {_int(int(k) if isinstance(k, str) and k.isdigit() else k, f"arrays[{a!r}] shard number",
                          where): _int(v, f"arrays[{a!r}].shards[{k!r}] (bytes)", where)
                     for k, v in sh.items()}
        if "shard_elements" in info or "chunk_elements" in info:
            shard, chunk, cps = _layout(info.get("shard_elements"), info.get("chunk_elements"),
                                        f"{where}: arrays[{a!r}]")
            dt = storage_dtype(a)
            if dt.name != info.get("storage_dtype", dt.name):
                raise FormatError(f"{where}: arrays[{a!r}].storage_dtype {info.get('storage_dtype')!r} "
                                  f"does not hold {a}")
            layouts[a] = {"shard": shard, "chunk": chunk, "cps": cps, "dt": dt, "logical": a,
                          "codec": "blosc" if info.get("compressed", True) else None}
    raw_payloads = m.get("payloads") or []
    if not isinstance(raw_payloads, list):
        raise FormatError(f"{where}: manifest payloads is not a list")
    payloads = {}
    for i, p in enumerate(raw_payloads):
        if p:
            payloads[i] = _payload(p, f"{where}: payloads[{i}]")
    raw_tensors = m.get("tensors") or {}
    if not isinstance(raw_tensors, dict):
        raise FormatError(f"{where}: manifest tensors is not an object")
    tensors = {dn: _tensor_entry(v, f"{where}: tensors[{dn!r}]") for dn, v in raw_tensors.items()}
    incomplete = m.get("incomplete") or []
    if not isinstance(incomplete, list) or not all(isinstance(x, str) for x in incomplete):
        raise FormatError(f"{where}: manifest incomplete is not a list of names")
    return layouts, shards, payloads, tensors, set(incomplete)


def _payload(p: Any, where: str) -> tuple:
    if not isinstance(p, (list, tuple)) or len(p) not in (3, 4) or not isinstance(p[0], str):
        raise FormatError(f"{where}: not [array, start, count, sha256]")
    sha = p[3] if len(p) == 4 else None
    if sha is not None and not isinstance(sha, str):
        raise FormatError(f"{where}: sha256 is not a string")
    return p[0], _int(p[1], "start", where), _int(p[2], "count", where), sha


def _tensor_entry(v: Any, where: str) -> tuple:
    if not isinstance(v, (list, tuple)) or len(v) != 2 or not isinstance(v[1], (list, tuple)):
        raise FormatError(f"{where}: not [payload, shape]")
    return _int(v[0], "payload", where), tuple(_int(d, "shape dimension", where) for d in v[1])


class ZarrTensorReader:
    """The tensor store of one rank directory (``prefix`` in ``store``)."""

    def __init__(self, store: ReadableStore, prefix: str) -> None:
        self.store = store
        self.prefix = prefix.strip("/")
        self._lock = threading.Lock()
        self._arrays: dict = {}
        self._indexes: dict = {}
        self._load_manifest()

    def _k(self, *parts: str) -> str:
        return join_key(self.prefix, *parts)

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
        self._arrays, self.shards, self.payloads, self.tensors, self.incomplete = _parse_manifest(m, where)
        if not self.complete:
            self._replay_journal()
        self.incomplete -= set(self.tensors)

    def _replay_journal(self) -> None:
        names_waiting: dict = {}
        where = self._k(STORE_DIR, MANIFEST_DIR)
        for line in read_journal(self.store, where, on_truncated=lambda k, b: None):
            try:
                e = json.loads(line)
            except (ValueError, RecursionError):
                continue  # a torn or hostile line: the payloads it would name stay incomplete
            if not isinstance(e, dict):
                continue
            try:
                if "shard" in e:
                    a, k, size = e["shard"]
                    self.shards.setdefault(str(a), {})[_int(k, "shard", where)] = _int(size, "shard size", where)
                elif "payload" in e and "array" in e:
                    self.payloads[_int(e["payload"], "payload", where)] = _payload(
                        [e["array"], e.get("start"), e.get("count"), e.get("sha256")], where)
                elif "name" in e and isinstance(e["name"], str):
                    names_waiting[e["name"]] = _tensor_entry([e.get("payload"), e.get("shape")], where)
                elif "pending" in e and isinstance(e["pending"], str):
                    self.incomplete.add(e["pending"])
            except (FormatError, TypeError, ValueError):
                continue
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
                shard = obj["chunk_grid"]["configuration"]["chunk_shape"][0]
                sh = obj["codecs"][0]
                if sh["name"] != "sharding_indexed":
                    raise KeyError("sharding_indexed")
                chunk = sh["configuration"]["chunk_shape"][0]
                inner = sh["configuration"]["codecs"]
                codec = None
                for c in inner[1:]:
                    if c["name"] != "blosc":
                        raise KeyError(c["name"])
                    codec = "blosc"
                logical = obj["attributes"]["msprobe_lake"]["logical_dtype"]
            except (KeyError, TypeError, IndexError, AttributeError) as exc:
                raise FormatError(f"{where}: not a tensor-store array ({type(exc).__name__}: {exc})") from None
            shard, chunk, cps = _layout(shard, chunk, where)
            if not isinstance(logical, str):
                raise FormatError(f"{where}: logical_dtype is not a string")
            dt = storage_dtype(logical)
            if dt.name != obj.get("data_type"):
                raise FormatError(f"{where}: data_type {obj.get('data_type')!r} does not hold {logical}")
            meta = {"shard": shard, "chunk": chunk, "cps": cps, "codec": codec, "dt": dt, "logical": logical}
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
        if size < n:
            raise FormatError(f"{key}: the manifest says the shard has {size} bytes, less than its {n}-byte index")
        raw = self.store.get_range(key, size - n, size)
        idx = decode_index(raw, meta["cps"], key)
        # every stored chunk must lie inside the shard's data and be no larger than a chunk can encode to
        # (plain ints: offsets near 2**64 would wrap in uint64 arithmetic)
        most = max_encoded_nbytes(meta["chunk"] * meta["dt"].itemsize, meta["codec"] is not None)
        for c, (off, nb) in enumerate(idx.tolist()):
            if off == _MISSING and nb == _MISSING:
                continue
            if nb > most or off + nb > size - n:
                raise FormatError(f"{key}: shard index entry {c} (offset {off}, {nb} bytes) lies outside the "
                                  f"{size - n} data bytes of the shard or exceeds the {most} bytes a chunk "
                                  "encodes to (corrupt shard)")
        with self._lock:
            self._indexes[(name, k)] = idx
        return idx

    def read_bits(self, data_name: str) -> tuple:
        """(logical dtype, shape, numpy array of the storage dtype, flat) of ``data_name``."""
        logical, shape, a, start, count, sha = self.info(data_name)
        meta = self._array(a)
        dt = meta["dt"]
        if math.prod(shape) != count:
            raise TensorLoadError(f"{data_name}: the tensor store gives it shape {list(shape)} but {count} "
                                  "elements (corrupt manifest)")
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
        if sha and hashlib.sha256(memoryview(np.ascontiguousarray(flat)).cast("B")).hexdigest()[:len(sha)] != sha:  # type: ignore[arg-type]
            raise TensorLoadError(f"{data_name}: the stored bytes do not match their SHA-256 (corrupt store)")
        return logical, shape, flat

    def _read_in_shard(self, a: str, k: int, meta: dict, lo: int, hi: int) -> np.ndarray:
        idx = self._index(a, k, meta)
        c0, c1 = lo // meta["chunk"], (hi - 1) // meta["chunk"]
        rows = idx[c0:c1 + 1]
        key = self._k(shard_key(a, k))
        if (rows[:, 0] == _MISSING).any():
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
        logical, stored_shape = self.info(data_name)[:2]  # checked against the record before reading
        if shape is not None and tuple(int(d) for d in shape) != tuple(stored_shape):
            raise TensorLoadError(f"record {record!r}: {data_name}: stored shape {list(stored_shape)} differs "
                                  f"from the record's {list(shape)}")
        if dtype is not None and canonical_dtype(dtype) not in (None, logical):
            raise TensorLoadError(f"record {record!r}: {data_name}: stored dtype {logical} differs from the "
                                  f"record's {dtype}")
        logical, stored_shape, flat = self.read_bits(data_name)
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
