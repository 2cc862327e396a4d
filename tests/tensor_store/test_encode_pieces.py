"""encode_shard_pieces: a shard encoded from the payloads' pieces as they are (no join) is byte for
byte the shard encoded from their joined bytes (the layout of spec/FORMAT.md section 21 is
unchanged), and it comes in a page-aligned writable buffer (written with O_DIRECT)."""
from __future__ import annotations

import random
import struct

import numpy as np
import pytest

from msprobe.backends._local import _address
from msprobe.tensor_store._layout import _MISSING, _compressor, _crc32c, encode_shard, encode_shard_pieces


def _reference(data: np.ndarray, chunk_elems: int, chunks_per_shard: int, codec) -> bytes:
    """encode_shard as it was (one joined array, b"".join of the encoded chunks)."""
    comp = _compressor(codec)
    parts = []
    index = np.full((chunks_per_shard, 2), _MISSING, dtype="<u8")
    offset = 0
    n = len(data)
    for c in range(chunks_per_shard):
        lo = c * chunk_elems
        if lo >= n:
            break
        chunk = data[lo:lo + chunk_elems]
        if len(chunk) < chunk_elems:
            pad = np.zeros(chunk_elems, dtype=data.dtype)
            pad[:len(chunk)] = chunk
            chunk = pad
        chunk = np.ascontiguousarray(chunk).astype(chunk.dtype.newbyteorder("<"), copy=False)
        enc = bytes(comp.encode(chunk)) if comp is not None else chunk.tobytes()
        parts.append(enc)
        index[c] = (offset, len(enc))
        offset += len(enc)
    ib = index.tobytes()
    parts.append(ib)
    parts.append(struct.pack("<I", _crc32c(ib)))
    return b"".join(parts)


def _split(raw: bytes, isz: int, rng: random.Random) -> list:
    """``raw`` cut at random element boundaries (empty pieces too)."""
    cuts = sorted(rng.randrange(0, len(raw) // isz + 1) * isz for _ in range(rng.randrange(0, 12)))
    bounds = [0, *cuts, len(raw)]
    return [memoryview(raw)[a:b] for a, b in zip(bounds, bounds[1:])]


@pytest.mark.parametrize("codec", ["lz4", "zstd", "none"])
@pytest.mark.parametrize("dtype", ["<f4", "<u2", "|b1", "<i8"])
def test_pieces_encode_to_the_joined_shard(codec, dtype):
    rng = random.Random(hash((codec, dtype)) & 0xFFFF)
    dt = np.dtype(dtype)
    for _ in range(8):
        chunk_elems, cps = rng.choice([16, 64, 1000]), rng.choice([1, 3, 8])
        n = rng.randrange(1, chunk_elems * cps + 1)
        data = (np.random.default_rng(rng.randrange(1 << 30)).standard_normal(n) * 50).astype(dt)
        if rng.random() < 0.5:
            data[: n // 2] = 0  # compressible
        raw = data.tobytes()
        want = _reference(data, chunk_elems, cps, codec)
        got = encode_shard_pieces(_split(raw, dt.itemsize, rng), dt, chunk_elems, cps, codec)
        assert bytes(got) == want
        assert not got.readonly and _address(got) % 4096 == 0
        assert bytes(encode_shard(data, chunk_elems, cps, codec)) == want
