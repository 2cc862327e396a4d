"""The Zarr v3 tensor store of a rank directory: names, dtypes, array metadata and shards.

Layout (spec/FORMAT.md section 21)::

    <rank dir>/tensors.zarr/zarr.json          group; attributes.msprobe_lake = manifest
    <rank dir>/tensors.zarr/<dtype>/zarr.json  one 1-D array per logical dtype
    <rank dir>/tensors.zarr/<dtype>/c/<k>      shard k (sharding_indexed, index at the end)
    <rank dir>/tensors.zarr/.manifest/*.jsonl  the manifest journal while the step is written

Shards are built here, not by zarr-python, so the writer knows every byte offset and
publishes each shard as one atomic object through the backends; any Zarr v3 reader
decodes them (tests check zarr-python does).
"""
from __future__ import annotations

import json
import struct
from typing import Any, Callable, Optional

import numpy as np

from msprobe.errors import FormatError
from msprobe.format.layout import STORE_DIR

__all__ = [
    "STORE_DIR", "MANIFEST_DIR", "LAYOUT_VERSION", "CODECS", "storage_dtype", "array_metadata",
    "encode_shard", "encode_shard_pieces", "decode_index", "shard_key", "location", "parse_location",
]

MANIFEST_DIR = ".manifest"
LAYOUT_VERSION = "1.0"
#: tensor_compression values -> the blosc configuration of the inner chunks (None: no compressor)
CODECS = {
    "zstd": {"cname": "zstd", "clevel": 1, "shuffle": "bitshuffle"},
    "zstd-byteshuffle": {"cname": "zstd", "clevel": 1, "shuffle": "shuffle"},
    "lz4": {"cname": "lz4", "clevel": 5, "shuffle": "shuffle"},
    "none": None,
}
_MISSING = 0xFFFFFFFFFFFFFFFF

#: logical dtypes numpy lacks -> the unsigned integer array that holds their bits
_BITS = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}
_NON_NUMPY_SIZES = {
    "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1, "hifloat8": 1, "complex32": 4,
}
_NATIVE = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
           "float16", "float32", "float64", "complex64", "complex128"}


def storage_dtype(logical: str) -> np.dtype:
    """The numpy dtype of the array that stores ``logical`` (its bits for bf16, float8, complex32)."""
    if logical in _NATIVE:
        return np.dtype(logical)
    size = _NON_NUMPY_SIZES.get(logical)
    if size is None:
        raise FormatError(f"tensor store: dtype {logical!r} is not supported")
    return np.dtype(_BITS[size])


def _fill(dt: np.dtype) -> Any:
    if dt.kind == "b":
        return False
    if dt.kind == "c":
        return [0.0, 0.0]
    if dt.kind == "f":
        return 0.0
    return 0


def _bytes_codec(dt: np.dtype) -> dict:
    return {"name": "bytes"} if dt.itemsize == 1 else {"name": "bytes", "configuration": {"endian": "little"}}


def array_metadata(logical: str, length: int, shard_elems: int, chunk_elems: int, codec: Optional[str],
                   attributes: Optional[dict] = None) -> bytes:
    """zarr.json of the 1-D array holding every payload of dtype ``logical``."""
    dt = storage_dtype(logical)
    inner = [_bytes_codec(dt)]
    cfg = CODECS[codec or "none"]
    if cfg is not None:
        inner.append({"name": "blosc", "configuration": {"typesize": dt.itemsize, "cname": cfg["cname"],
                                                          "clevel": cfg["clevel"], "shuffle": cfg["shuffle"],
                                                          "blocksize": 0}})
    attrs = {"msprobe_lake": {"logical_dtype": logical, "storage_dtype": dt.name,
                              "layout_version": LAYOUT_VERSION}}
    attrs.update(attributes or {})
    meta = {
        "zarr_format": 3, "node_type": "array", "shape": [int(length)], "data_type": dt.name,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [int(shard_elems)]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": _fill(dt),
        "codecs": [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": [int(chunk_elems)], "codecs": inner,
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
            "index_location": "end"}}],
        "attributes": attrs, "storage_transformers": [],
    }
    return json.dumps(meta, indent=1).encode("utf-8")


def group_metadata(attributes: dict) -> bytes:
    return json.dumps({"zarr_format": 3, "node_type": "group", "attributes": attributes},
                      separators=(",", ":")).encode("utf-8")


def shard_key(array: str, k: int) -> str:
    return f"{STORE_DIR}/{array}/c/{k}"


def location(array: str, start: int, count: int) -> str:
    """The index's ``location`` of a payload: ``tensors.zarr/<array>#<start>:<stop>`` (elements)."""
    return f"{STORE_DIR}/{array}#{start}:{start + count}"


def parse_location(loc: str) -> Optional[tuple]:
    if not loc.startswith(STORE_DIR + "/") or "#" not in loc:
        return None
    path, _, rng = loc.partition("#")
    a, _, b = rng.partition(":")
    return path[len(STORE_DIR) + 1:], int(a), int(b) - int(a)


def _crc32c(data: bytes) -> int:
    import google_crc32c

    return int(google_crc32c.value(bytes(data)))


def _compressor(codec: Optional[str]) -> Any:
    cfg = CODECS[codec or "none"]
    if cfg is None:
        return None
    from numcodecs import Blosc

    shuffles = {"shuffle": Blosc.SHUFFLE, "bitshuffle": Blosc.BITSHUFFLE, "noshuffle": Blosc.NOSHUFFLE}
    shuffle = shuffles[str(cfg["shuffle"])]
    return Blosc(cname=cfg["cname"], clevel=cfg["clevel"], shuffle=shuffle)


def encode_shard(data: np.ndarray, chunk_elems: int, chunks_per_shard: int, codec: Optional[str]) -> memoryview:
    """One shard object from the shard's elements ``data`` (1-D, at most a whole shard; the last
    inner chunk is padded with zeros, chunks past ``data`` are left out of the index as missing)."""
    data = np.ascontiguousarray(data).astype(data.dtype.newbyteorder("<"), copy=False)
    return encode_shard_pieces([data.data.cast("B")], data.dtype, chunk_elems, chunks_per_shard, codec)


def aligned_buffer(size: int) -> np.ndarray:
    """A uint8 array of ``size`` bytes starting on a 4096-byte boundary."""
    raw = np.empty(size + 4095, dtype=np.uint8)
    first = -raw.ctypes.data % 4096
    return raw[first:first + size]


def encode_shard_pieces(pieces: list, dtype: np.dtype, chunk_elems: int, chunks_per_shard: int,
                        codec: Optional[str], alloc: Optional[Callable[[int], np.ndarray]] = None) -> memoryview:
    """:func:`encode_shard` of the bytes of ``pieces`` (byte memoryviews, in order, whole elements
    of ``dtype`` together) without joining them first: an inner chunk inside one piece is encoded
    from it as it is, one across pieces from a copy of its bytes. The object is returned in a
    writable buffer starting on a 4096-byte boundary (a local store writes it with O_DIRECT):
    ``alloc(size)``'s (a page-aligned uint8 array of at least ``size`` bytes: a reused one) or a new one."""
    comp = _compressor(codec)
    dt = np.dtype(dtype).newbyteorder("<")
    chunk_bytes = chunk_elems * dt.itemsize
    total = sum(len(p) for p in pieces)
    index = np.full((chunks_per_shard, 2), _MISSING, dtype="<u8")
    parts: list = []
    offset = 0
    pi = po = 0  # the piece and the offset in it where the next chunk starts
    for c in range(chunks_per_shard):
        lo = c * chunk_bytes
        if lo >= total:
            break
        need = min(chunk_bytes, total - lo)
        while len(pieces[pi]) == po:
            pi, po = pi + 1, 0
        piece = pieces[pi]
        if len(piece) - po >= need:
            raw: Any = piece[po:po + need]
            po += need
        else:
            raw, got = bytearray(need), 0
            while got < need:
                while len(pieces[pi]) == po:
                    pi, po = pi + 1, 0
                take = min(len(pieces[pi]) - po, need - got)
                raw[got:got + take] = pieces[pi][po:po + take]
                got, po = got + take, po + take
        chunk = np.frombuffer(raw, dtype=dt)
        if need < chunk_bytes:
            pad = np.zeros(chunk_elems, dtype=dt)
            pad[:len(chunk)] = chunk
            chunk = pad
        enc = comp.encode(chunk) if comp is not None else chunk.data.cast("B")
        parts.append(enc)
        index[c] = (offset, len(enc))
        offset += len(enc)
    ib = index.tobytes()
    parts.append(ib)
    parts.append(struct.pack("<I", _crc32c(ib)))
    size = offset + len(ib) + 4
    out = (alloc or aligned_buffer)(size)[:size]
    pos = 0
    for part in parts:
        n = len(part)
        out[pos:pos + n] = np.frombuffer(part, dtype=np.uint8)
        pos += n
    return out.data


def index_nbytes(chunks_per_shard: int) -> int:
    return chunks_per_shard * 16 + 4


def decode_index(raw: bytes, chunks_per_shard: int, where: str) -> np.ndarray:
    """The (offset, nbytes) rows of a shard index; a CRC mismatch is a FormatError."""
    if len(raw) != index_nbytes(chunks_per_shard):
        raise FormatError(f"{where}: shard index of {len(raw)} bytes, expected {index_nbytes(chunks_per_shard)}")
    body, crc = raw[:-4], struct.unpack("<I", raw[-4:])[0]
    if _crc32c(body) != crc:
        raise FormatError(f"{where}: shard index CRC32C mismatch (corrupt shard)")
    return np.frombuffer(body, dtype="<u8").reshape(chunks_per_shard, 2)


#: c-blosc's worst-case frame overhead (BLOSC_MAX_OVERHEAD)
BLOSC_MAX_OVERHEAD = 16


def max_encoded_nbytes(raw_nbytes: int, compressed: bool) -> int:
    """The most bytes an inner chunk of ``raw_nbytes`` may take in a shard."""
    return raw_nbytes + BLOSC_MAX_OVERHEAD if compressed else raw_nbytes


def decode_chunk(raw: bytes, dt: np.dtype, chunk_elems: int, compressed: bool) -> np.ndarray:
    want = chunk_elems * dt.itemsize
    if compressed:  # a blosc frame describes itself (codec, shuffle, typesize)
        from numcodecs import Blosc

        # what the frame says it inflates to is checked before inflating (a blosc bomb of 39 KB
        # would otherwise allocate its declared size, up to 2 GiB per chunk)
        if len(raw) < BLOSC_MAX_OVERHEAD:
            raise FormatError(f"inner chunk of {len(raw)} bytes is too short for a blosc frame")
        nbytes, _, cbytes = struct.unpack_from("<III", raw, 4)  # header: 4 flag bytes, nbytes, blocksize, cbytes
        if nbytes != want or cbytes != len(raw):
            raise FormatError(f"inner chunk: its blosc frame declares {nbytes} bytes ({cbytes} compressed) but the "
                              f"chunk holds {want} bytes in {len(raw)}; refused before decompressing (corrupt or "
                              "hostile shard)")
        try:
            out = Blosc().decode(raw)
        except Exception as exc:  # noqa: BLE001
            raise FormatError(f"inner chunk: blosc cannot decode it ({type(exc).__name__}: {exc})") from None
    else:
        out = raw
    arr = np.frombuffer(out, dtype=dt.newbyteorder("<"))
    if arr.size != chunk_elems:
        raise FormatError(f"decoded chunk holds {arr.size} elements, expected {chunk_elems}")
    return arr
