"""Classic tensor files written around one copy (msprobe/dumpers/pytorch/_ptfile.py): the same records
as torch.save, loadable by torch.load(weights_only=True) (and with mmap), and a tensor-mode dump
whose files load to the same tensors as the torch.save path's (MSPROBE_LAKE_NATIVE=0)."""
from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import warnings
import zipfile

import pytest

torch = pytest.importorskip("torch")

from msprobe.dumpers.pytorch._ptfile import PtFile, supported  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cases():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 5, generator=g)
    return [
        base, base.t(), base[1:4, ::2], torch.tensor(3.5), torch.tensor(7), torch.zeros(0, 3), base.half(),
        base.bfloat16(), base.double(), base > 0, (base * 9).to(torch.int8), (base * 9).to(torch.uint8),
        (base * 900).to(torch.int16), (base * 9).to(torch.int32), (base * 9).to(torch.int64),
        torch.randn(4, 3, generator=g, dtype=torch.complex64), torch.randn(2, generator=g, dtype=torch.complex64).conj(),
        torch.randn(3, 1, 2, 1, 4, generator=g), torch.nn.Parameter(torch.ones(3)),
    ]


def _torch_save(t):
    b = io.BytesIO()
    torch.save(t.detach().resolve_conj().contiguous().clone(), b)
    return b.getvalue()


@pytest.mark.parametrize("i", range(len(_cases())))
def test_same_records_as_torch_save(i, tmp_path):
    t = _cases()[i]
    assert supported(t)
    ours = bytes(PtFile(t).finish())
    ref = zipfile.ZipFile(io.BytesIO(_torch_save(t)))
    z = zipfile.ZipFile(io.BytesIO(ours))
    assert z.testzip() is None  # every record's CRC-32 checks
    assert sorted(z.namelist()) == sorted(ref.namelist())
    for name in ref.namelist():
        if not name.endswith("serialization_id"):
            assert z.read(name) == ref.read(name), name
    off = z.getinfo("archive/data/0").header_offset
    name_len, extra_len = struct.unpack("<HH", ours[off + 26:off + 30])  # the local header's
    assert (off + 30 + name_len + extra_len) % 64 == 0  # the data is 64-byte aligned, as torch.save's
    loaded = torch.load(io.BytesIO(ours), weights_only=True)
    want = t.detach().resolve_conj()
    assert type(loaded) is torch.Tensor and loaded.dtype == t.dtype and loaded.shape == t.shape
    assert torch.equal(loaded, want)
    p = tmp_path / "x.pt"
    p.write_bytes(ours)
    assert torch.equal(torch.load(p, weights_only=True, mmap=True), want)


def test_the_copy_is_taken_at_once():
    """The file holds the values at the call, not later in-place writes (the model goes on)."""
    t = torch.arange(10.0)
    f = PtFile(t)
    t.add_(100)
    assert torch.equal(torch.load(io.BytesIO(bytes(f.finish())), weights_only=True), torch.arange(10.0))


def test_unsupported_tensors_take_torch_save():
    assert not supported(torch.zeros(3, device="meta"))
    assert not supported(torch.zeros(3, 3).to_sparse())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensors are deprecated in torch, still accepted
        q = torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)
    assert not supported(q)


_DUMP = """
import sys, torch, torch.nn as nn
from msprobe.pytorch import PrecisionDebugger
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(6, 5), nn.GELU(), nn.LayerNorm(5), nn.Linear(5, 2))
dbg = PrecisionDebugger(dump_path=sys.argv[1], level="mix", task="tensor")
dbg.start(m)
x = torch.randn(4, 6)
m(x).sum().backward()
(x.t().contiguous()[1:3] * 2).bfloat16().half()
dbg.stop()
dbg.step()
"""


#: tensors of 1-2.4 MB over three steps: their buffers come from the pool (filled by the step before,
#: or by an earlier tensor of the step) and are written with O_DIRECT
_DUMP_LARGE = """
import sys, torch, torch.nn as nn
from msprobe.dumpers.pytorch import _ptfile
from msprobe.pytorch import PrecisionDebugger
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 600))
dbg = PrecisionDebugger(dump_path=sys.argv[1], level="L1", task="tensor")
for step in range(3):
    dbg.start(m)
    x = torch.randn(1000 - 100 * step, 512) * (step + 1)
    m(x).sum().backward()
    dbg.stop()
    dbg.step()

"""


@pytest.mark.parametrize("script,steps,least", [(_DUMP, 1, 20), (_DUMP_LARGE, 3, 6)], ids=["small", "pooled"])
def test_tensor_dump_files_equal_the_torch_save_path(tmp_path, script, steps, least):
    for step in range(steps):
        roots = {}
        for flag in ("1", "0"):
            root = tmp_path / f"native{flag}"
            if step == 0:
                env = dict(os.environ, PYTHONPATH=ROOT, MSPROBE_LAKE_NATIVE=flag)
                r = subprocess.run([sys.executable, "-c", script, str(root)], env=env, capture_output=True,
                                   text=True, timeout=300)
                assert r.returncode == 0, r.stderr[-3000:]
            roots[flag] = root / f"step{step}" / "rank" / "dump_tensor_data"
        names = sorted(os.listdir(roots["1"]))
        assert len(names) >= least and names == sorted(os.listdir(roots["0"]))
        for n in names:
            a = torch.load(roots["1"] / n, weights_only=True)
            b = torch.load(roots["0"] / n, weights_only=True)
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), n


def test_a_reused_buffer_holds_nothing_of_the_earlier_file():
    """A pooled buffer that held another tensor (here: all 0xFF) gives byte for byte the file that a
    zeroed buffer gives; it is the same memory (the pool's), and it returns on release()."""
    from msprobe.dumpers.pytorch import _ptfile

    pool = _ptfile.POOL
    pool.clear()
    big = torch.randn(700, 1024)  # 2.8 MB
    t = torch.randn(690, 1024)  # 2.83 MB: the same size class
    first = PtFile(big)
    first.finish()
    buf = first._pooled
    first.release()
    assert pool.idle == buf.numel()
    bodies = []
    for fill in (0xFF, 0x00):
        buf.fill_(fill)
        pool.clear()
        pool.give(buf)
        _ptfile._ID[0] = 41  # the same serialization id for both
        f = PtFile(t)
        assert f.buf.data_ptr() == buf.data_ptr()  # reused
        bodies.append(bytes(f.finish()))
        f.release()
        f.release()  # twice: given back once
        assert pool.idle == buf.numel()
    assert bodies[0] == bodies[1]
    got = torch.load(io.BytesIO(bodies[0]), weights_only=True)
    assert torch.equal(got, t)
    pool.clear()


def test_the_pool_keeps_at_most_its_cap():
    from msprobe.dumpers.pytorch._ptfile import _Pool

    pool = _Pool(cap=5 << 20)
    bufs = [pool.take(2 << 20) for _ in range(3)]
    assert all(b.data_ptr() % 4096 == 0 and b.numel() >= 2 << 20 for b in bufs)
    for b in bufs:
        pool.give(b)
    assert pool.idle == 4 << 20  # the third did not fit
    assert pool.take((2 << 20) - 5).data_ptr() in {b.data_ptr() for b in bufs[:2]}
    assert pool.size_class(3 << 20) == 3 << 20 and pool.size_class((3 << 20) + 1) == (3 << 20) + (1 << 18)


@pytest.mark.parametrize("shape,dtype", [((0,), torch.float32), ((3, 5), torch.float32), ((7,), torch.bfloat16),
                                         ((), torch.int64), ((64, 33), torch.float16)])
def test_file_crc_is_the_crc_of_the_file(shape, dtype):
    """The whole file's CRC-32 (the writer's digest in msprobe_lake.json) is made from the data's, without a
    second read: it must equal zlib's CRC-32 of the bytes written."""
    import zlib

    t = torch.randn(shape).to(dtype) if dtype.is_floating_point else torch.randint(-9, 9, shape, dtype=dtype)
    f = PtFile(t)
    body = bytes(f.finish())
    assert f.file_crc == zlib.crc32(body)


@pytest.mark.parametrize("shape,dtype", [((1 << 18,), torch.float32), ((513, 1025), torch.float16),
                                         ((3, 1 << 19), torch.bfloat16)])
def test_large_files_written_direct_load_and_mmap(tmp_path, shape, dtype):
    """A large file's buffer starts on a page boundary, so LocalStore(direct=True) writes it with
    O_DIRECT: the file is byte for byte the buffer, loads (weights_only) and mmaps to the tensor."""
    from msprobe.backends import LocalStore

    t = torch.randn(shape).to(dtype)
    f = PtFile(t)
    assert f.buf.data_ptr() % 4096 == 0
    body = f.finish()
    store = LocalStore(tmp_path, fsync=False, direct=True)
    store.put("x.pt", body)
    assert (tmp_path / "x.pt").read_bytes() == bytes(body)
    for mmap in (False, True):
        got = torch.load(tmp_path / "x.pt", weights_only=True, mmap=mmap)
        assert got.dtype == t.dtype and got.shape == t.shape and torch.equal(got, t)
