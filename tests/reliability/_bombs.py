"""Hostile files built for real by the hostile-input tests: decompression bombs, corrupt
Zarr shards, deep JSON. Each is small on disk and would cost a lot once inflated."""
from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_ZEROS = bytes(16 << 20)


def _pickled_int(n: int) -> bytes:
    if n < 256:
        return b"K" + bytes([n])
    if n < 65536:
        return b"M" + struct.pack("<H", n)
    return b"J" + struct.pack("<i", n)


class _ZeroDeflater:
    """A deflate stream of zeros made of one repeated full-flush block (deflating 1 GiB takes
    seconds; identical input after a full flush deflates to identical bytes)."""

    _block: dict = {}

    def compress(self, data: bytes) -> bytes:
        assert not any(data[:64]), "zeros only"
        n = len(data)
        if n not in self._block:
            import zlib

            c = zlib.compressobj(9, zlib.DEFLATED, -15)
            self._block[n] = c.compress(bytes(n)) + c.flush(zlib.Z_FULL_FLUSH)
        return self._block[n]

    def flush(self) -> bytes:
        return b"\x03\x00"  # an empty final fixed-Huffman block


def write_pt_bomb(path: str, shape: tuple, storage_bytes: int = 1 << 30) -> int:
    """A torch zip file holding a tensor of ``shape`` (float32) whose storage declares
    ``storage_bytes``: the storage entry is deflated zeros, so the file stays ~1/1000 of that.
    torch.save never compresses; torch.load (miniz) inflates such an entry all the same."""
    import torch

    buf = io.BytesIO()
    torch.save(torch.zeros(shape), buf)
    src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    numel = 1
    for d in shape:
        numel *= d
    with zipfile.ZipFile(path, "w", compresslevel=1) as out:
        for info in src.infolist():
            body = src.read(info.filename)
            if info.filename.endswith("/data.pkl"):
                old = b"cpuq\x04" + _pickled_int(numel)
                assert body.count(old) == 1, "unexpected data.pkl layout"
                body = body.replace(old, b"cpuq\x04" + _pickled_int(storage_bytes // 4))
            if info.filename.endswith("/data/0"):
                zi = zipfile.ZipInfo(info.filename, date_time=info.date_time)
                zi.compress_type = zipfile.ZIP_DEFLATED
                with out.open(zi, "w", force_zip64=False) as f:
                    f._compressor = _ZeroDeflater()  # zipfile still computes the CRC and the sizes
                    left = storage_bytes
                    while left:
                        n = min(left, len(_ZEROS))
                        f.write(_ZEROS[:n])
                        left -= n
            else:
                out.writestr(info.filename, body, compress_type=zipfile.ZIP_STORED)
    return os.path.getsize(path)


_PEAK = """
import resource, runpy, sys
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
sys.argv = {argv!r}
code = 0
try:
    {body}
except SystemExit as exc:
    code = exc.code if isinstance(exc.code, int) else 1
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print("PEAK_KIB", before, peak, flush=True)
sys.exit(code)
"""


class Peak(float):
    """Peak RSS growth in MiB over the state before the measured statement; ``.peak`` is the
    process's whole peak RSS in MiB."""

    def __new__(cls, grown: float, peak: float = None):
        obj = super().__new__(cls, grown)
        obj.peak = peak
        return obj

    def figure(self) -> dict:
        return {"growth_mib": round(float(self), 1), "peak_rss_mib": round(self.peak or 0, 1)}


def run_measured(body: str, argv: list = (), timeout: float = 300, env: dict = None) -> tuple:
    """Run python ``body`` (one statement) in a fresh interpreter; (returncode, stdout, stderr,
    peak RSS growth in MiB over the interpreter's state just before ``body``)."""
    code = _PEAK.format(argv=list(argv), body=body)
    e = dict(os.environ, PYTHONPATH=ROOT, **(env or {}))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=e)
    grown = peak_mib = None
    for line in p.stdout.splitlines():
        if line.startswith("PEAK_KIB"):
            _, before, peak = line.split()
            grown, peak_mib = (int(peak) - int(before)) / 1024, int(peak) / 1024
    return p.returncode, p.stdout, p.stderr, Peak(grown if grown is not None else float("nan"), peak_mib)


def cli_measured(argv: list, timeout: float = 300, preimport: str = "torch") -> tuple:
    """``python -m msprobe ARGV`` with the peak RSS growth after importing ``preimport``."""
    pre = f"import {preimport}; " if preimport else ""
    return run_measured(f"{pre}import msprobe.cli as _c; sys.exit(_c.main(sys.argv[1:]))",
                        ["msprobe", *argv], timeout=timeout)


# ----------------------------------------------------------------------------- Zarr shards
#: inner chunks per float32 shard of the tensor store's defaults (33554432-element shards, 65536-element chunks)
CPS_FLOAT32 = 512

def read_shard(path: str, chunks_per_shard: int) -> tuple:
    """(list of the inner chunks' bytes or None, index rows) of a sharding_indexed shard file."""
    import numpy as np

    with open(path, "rb") as f:
        data = f.read()
    n = chunks_per_shard * 16 + 4
    rows = [tuple(int(x) for x in r) for r in np.frombuffer(data[-n:-4], dtype="<u8").reshape(-1, 2)]
    chunks = [None if off == 0xFFFFFFFFFFFFFFFF else data[off:off + size] for off, size in rows]
    return chunks, rows


def write_shard(path: str, chunks: list, rows: list = None) -> None:
    """A shard file from inner chunks (None: missing); ``rows`` overrides the index (with a valid CRC)."""
    import google_crc32c
    import numpy as np

    body, index, off = [], [], 0
    for c in chunks:
        if c is None:
            index.append((0xFFFFFFFFFFFFFFFF, 0xFFFFFFFFFFFFFFFF))
        else:
            index.append((off, len(c)))
            body.append(c)
            off += len(c)
    ib = np.array(rows if rows is not None else index, dtype="<u8").tobytes()
    with open(path, "wb") as f:
        f.write(b"".join(body) + ib + struct.pack("<I", google_crc32c.value(ib)))


def blosc_bomb(nbytes: int = 1 << 30) -> bytes:
    """A real blosc frame of ``nbytes`` zeros (a few tens of KB)."""
    import numpy as np
    from numcodecs import Blosc

    return bytes(Blosc(cname="zstd", clevel=9, shuffle=Blosc.NOSHUFFLE).encode(np.zeros(nbytes, dtype=np.uint8)))


# ----------------------------------------------------------------------------- Parquet index
def write_parquet_bomb(index: str, kind: str) -> None:
    """Rewrite the index file ``index`` as a Parquet bomb: ``dict`` (one 100 MiB dictionary value
    referenced by 20 rows), ``strings`` (40 MiB, 20 rows: within the footer's limit, 800 MiB
    decoded), ``rows`` (10M run-length encoded rows of two columns). A few KiB each on disk."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pq.read_table(index)
    if kind == "rows":  # 10M rows, two columns, run-length encoded: a few KiB
        n = 10_000_000
        codes = pa.array(np.zeros(n, np.int32))
        bt = pa.table({"record": pa.DictionaryArray.from_arrays(codes, pa.array(["Torch.sum.0.forward"])),
                       "seq": pa.nulls(n, pa.int64())})
    else:  # strings: one dictionary value referenced by every row
        value_mib, n = (100, 20) if kind == "dict" else (40, 20)
        big = pa.array(["Torch.x" + "A" * (value_mib << 20) + ".0.forward"])
        cols = {}
        for f in t.schema:
            if f.name == "record":
                cols[f.name] = pa.DictionaryArray.from_arrays(pa.array([0] * n, pa.int32()), big)
            else:
                cols[f.name] = pa.concat_arrays([t.column(f.name).combine_chunks().slice(0, 1)] * n)
        bt = pa.table(cols)
    pq.write_table(bt.replace_schema_metadata(t.schema.metadata), index, compression="zstd")
