"""The compiled one-pass statistics and CRC-32 (msprobe/dumpers/_fastpath.c) against the reference
definitions (msprobe/format/stats.py) and against the pure-torch path they replace, with the SIMD
kernels and with the portable ones; the first-use build; ``MSPROBE_LAKE_NATIVE=0``."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from msprobe.dumpers import fastpath  # noqa: E402
from msprobe.format.stats import reference_stats  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def fast():
    mod = fastpath.native()
    assert mod is not None, "the extension neither installed nor buildable here (is a C compiler present?)"
    return mod


@pytest.fixture(params=["simd", "portable"])
def kernels(request, fast):
    before = fast.SIMD
    fast.set_simd(request.param == "simd")
    yield fast
    fast.set_simd(bool(before))


def _close(a, b, rtol=1e-6):
    if a is None or b is None or isinstance(a, bool) or isinstance(b, bool):
        return a is b if a is None or b is None else (type(a) is type(b) and a == b)
    if isinstance(b, int):
        return type(a) is int and a == b
    if np.isnan(b):
        return bool(np.isnan(a))
    if np.isinf(b):
        return a == b
    return abs(a - b) <= rtol * abs(b) + 1e-300


def _check(fast, t: torch.Tensor):
    name = str(t.dtype).replace("torch.", "")
    got = fast.stats(t.data_ptr(), t.numel(), fastpath.DTYPE_CODES[name])
    if t.dtype == torch.bfloat16:
        ref = reference_stats(t.float().numpy(), logical_dtype="bfloat16")
    else:
        ref = reference_stats(t.numpy())
    assert all(_close(g, r) for g, r in zip(got, ref)), (name, t.numel(), got, ref)
    return got


SIZES = [1, 2, 7, 8, 15, 16, 17, 31, 33, 255, 1000, 4099, 70001]
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_float_stats_equal_the_reference(kernels, dtype):
    g = torch.Generator().manual_seed(0)
    for n in SIZES:
        x = (torch.randn(n, generator=g, dtype=torch.float64) * 3 + 0.25).to(dtype)
        _check(kernels, x)
        if n < 2:
            continue
        # the extreme in the tail (the part after the last full SIMD round) and in the first element
        y = x.clone()
        y[-1] = 100
        y[0] = -100
        assert _check(kernels, y)[:2] == (100.0, -100.0)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_nan_and_inf(kernels, dtype):
    for n in (5, 16, 40, 1001):
        for pos in (0, n // 2, n - 1):
            x = torch.linspace(-2, 3, n, dtype=torch.float64).to(dtype)
            x[pos] = float("nan")
            got = _check(kernels, x)
            assert all(np.isnan(v) for v in got if v is not None)
            x = torch.linspace(-2, 3, n, dtype=torch.float64).to(dtype)
            x[pos] = float("inf")
            x[(pos + 1) % n] = float("-inf")
            got = _check(kernels, x)  # Max inf, Min -inf, Mean NaN (inf - inf), Norm inf
            assert got[0] == float("inf") and got[1] == float("-inf")


def test_low_precision_rounding_and_overflow(kernels):
    # float16: Norm and Mean over 65504 overflow to inf after the float64 accumulation, as the reference
    big = torch.full((300,), 60000.0, dtype=torch.float16)
    assert _check(kernels, big)[3] == float("inf")
    # subnormal float16 values survive the half -> float conversion
    tiny = torch.tensor([6e-8, 1e-5, -3e-6] * 11, dtype=torch.float16)
    _check(kernels, tiny)
    # bfloat16 keeps float32's range: a mean rounded to bfloat16
    b = torch.tensor([1e30, 3e30, -2e29] * 7, dtype=torch.bfloat16)
    _check(kernels, b)


@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_int_stats(kernels, dtype):
    info = torch.iinfo(dtype)
    for n in SIZES:
        x = torch.randint(info.min, info.max, (n,), dtype=dtype, generator=torch.Generator().manual_seed(n))
        got = _check(kernels, x)
        assert type(got[0]) is int and got[2:] == (None, None)
    x = torch.tensor([info.min, 0, info.max] * 9, dtype=dtype)
    assert _check(kernels, x)[:2] == (info.max, info.min)


def test_bool_stats(kernels):
    for vals in ([True] * 20, [False] * 20, [False] * 19 + [True], [True] * 19 + [False]):
        x = torch.tensor(vals)
        assert _check(kernels, x) == (any(vals), all(vals), None, None)


def _strided_views():
    g = torch.Generator().manual_seed(11)
    qkv = torch.randn(2, 16, 3 * 40, generator=g)
    q = qkv.split(40, dim=2)[1].reshape(2, 16, 4, 10).transpose(1, 2)  # the attention's head split
    base = torch.randn(33, 70, generator=g)
    return [
        q, base.t(), base[:, 5:61], base[3:30:2, 8:], base.t()[10:40], torch.randn(6, 5, 40, generator=g).permute(2, 0, 1),
        torch.as_strided(torch.randn(300, generator=g), (20, 16), (7, 1)),  # overlapping rows
        base.bfloat16()[:, 5:61], base.half()[::3, :], (base * 50).to(torch.int32)[:, 10:30],
        (base > 0)[:, 9:50], torch.randn(4, 3, 5, 32, generator=g)[:, 1:, :, 2:],
    ]


def test_strided_layouts_equal_the_reference(kernels):
    from msprobe.dumpers.pytorch import _encode

    taken = 0
    for t in _strided_views():
        assert not t.is_contiguous()
        runs = _encode._runs(t)
        assert runs is not None, (t.shape, t.stride())
        name = str(t.dtype).replace("torch.", "")
        code = fastpath.DTYPE_CODES[name]
        got = kernels.stats(t.data_ptr(), t.numel(), code) if not runs[1] else \
            kernels.stats_runs(t.data_ptr(), code, *runs)
        c = t.contiguous()
        ref = reference_stats(c.float().numpy() if t.dtype == torch.bfloat16 else c.numpy(),
                              logical_dtype="bfloat16" if t.dtype == torch.bfloat16 else None)
        assert all(_close(a, b) for a, b in zip(got, ref)), (tuple(t.shape), t.stride(), got, ref)
        taken += bool(runs[1])
    assert taken >= 8  # most of them are runs, not blocks


def test_layouts_left_to_torch():
    from msprobe.dumpers.pytorch import _encode

    x = torch.randn(10, 20)
    assert _encode._runs(x[:, ::2]) is None  # no unit stride
    assert _encode._runs(torch.randn(5, 1).expand(5, 30)) is None  # stride 0 innermost
    assert _encode._runs(x[:, 3:8]) is None  # runs of 5: torch's reductions
    assert _encode._runs(x.t()) == (200, (), ())  # a transpose is one block


def test_crc32_combine_equals_zlib_of_the_concatenation(fast):
    rng = np.random.default_rng(3)
    for la, lb in [(0, 0), (0, 5), (5, 0), (1, 1), (3, 1000), (1000, 65537), (17, 1 << 20)]:
        a = rng.integers(0, 256, la, dtype=np.uint8).tobytes()
        b = rng.integers(0, 256, lb, dtype=np.uint8).tobytes()
        assert fast.crc32_combine(zlib.crc32(a), zlib.crc32(b), lb) == zlib.crc32(a + b), (la, lb)
    with pytest.raises(ValueError):
        fast.crc32_combine(0, 0, -1)


def test_crc32_equals_zlib(kernels):
    rng = np.random.default_rng(1)
    buf = rng.integers(0, 256, 300_000, dtype=np.uint8)
    for n in (0, 1, 15, 16, 63, 64, 65, 127, 128, 129, 1000, 65536, 70001, 300_000):
        for off in (0, 1, 7):
            b = buf[off:off + n]
            assert kernels.crc32(b.ctypes.data, len(b)) == zlib.crc32(b), (n, off)
            assert kernels.crc32(b.ctypes.data, len(b), 0xDEADBEEF) == zlib.crc32(b, 0xDEADBEEF), (n, off)


def test_bad_arguments_are_refused(fast):
    with pytest.raises(ValueError):
        fast.stats(0, 10, 0)
    with pytest.raises(ValueError):
        fast.stats(torch.zeros(2).data_ptr(), 2, 99)
    with pytest.raises(ValueError):
        fast.crc32(0, 10)
    with pytest.raises(TypeError):
        fast.stats(1, 2)
    x = torch.zeros(8)
    with pytest.raises(ValueError):
        fast.stats_runs(x.data_ptr(), 0, 8, (), ())
    with pytest.raises(ValueError):
        fast.stats_runs(x.data_ptr(), 0, 4, (2, 0), (4, 1))
    with pytest.raises(TypeError):
        fast.stats_runs(x.data_ptr(), 0, 4, [2], [4])


# ------------------------------------------------------------------ the dumper's encoder


def _encoder_values(tensors, native: bool):
    from msprobe.dumpers.pytorch import _encode

    saved = _encode._FAST
    _encode._FAST = _encode._fast() if native else None
    try:
        out = []
        for t in tensors:
            h = _encode._stat_handle(t)
            v = dict(_encode.fetch_stats([h])[0])
            v["md5"] = _encode._crc32_hex(t)
            out.append(v)
        return out
    finally:
        _encode._FAST = saved


def _tensors():
    g = torch.Generator().manual_seed(3)
    base = torch.randn(64, 33, generator=g)
    return [
        base, base.t(), base[:, 3:9], base[5], base.reshape(-1)[10:], base.half(), base.bfloat16(),
        base.double(), (base * 50).to(torch.int32), base > 0, torch.tensor(2.5), torch.tensor(-3),
        torch.zeros(0, 4), torch.randn(5, 3, generator=g, dtype=torch.complex64),
        torch.tensor([1.0, float("nan"), 2.0]), torch.tensor([float("inf"), 1.0, float("-inf")]),
        torch.randn(3, 100_000, generator=g), torch.arange(24, dtype=torch.int64).reshape(2, 3, 4)[:, 1],
        *_strided_views(),
    ]


def test_encoder_values_equal_the_torch_path(fast):
    ts = _tensors()
    fast_vals, torch_vals = _encoder_values(ts, True), _encoder_values(ts, False)
    for t, a, b in zip(ts, fast_vals, torch_vals):
        assert a.keys() == b.keys()
        assert a["md5"] == b["md5"], t.dtype
        for k in ("Max", "Min", "Mean", "Norm"):
            # the torch path accumulates float32 in float32: equal within the format's 1e-5
            assert _close(a[k], b[k], rtol=1e-5), (t.dtype, tuple(t.shape), k, a[k], b[k])


def test_encoder_takes_the_one_pass_kernel(fast, monkeypatch):
    """A contiguous float32 CPU tensor is not given to torch's reductions when the kernel is there."""
    from msprobe.dumpers.pytorch import _encode

    monkeypatch.setattr(_encode, "_FAST", fast)
    calls = []
    monkeypatch.setattr(torch, "aminmax", lambda *a, **k: calls.append(a) or (_ for _ in ()).throw(AssertionError))
    h = _encode._stat_handle(torch.randn(10, 10))
    assert h.kind == _encode._K_DONE and not calls
    assert _encode._stat_handle(torch.randn(10, 10).t()).kind == _encode._K_DONE and not calls  # a block
    assert _encode._stat_handle(torch.randn(10, 40)[:, 3:30]).kind == _encode._K_DONE and not calls  # runs
    with pytest.raises(AssertionError):  # a layout without unit-stride runs still is
        _encode._stat_handle(torch.randn(10, 10)[:, ::2])


def test_kernel_taken_in_a_fresh_process_given_only_the_module(fast):
    """The dtype codes are known at import: a process whose first tensor meets a preset module (no
    earlier _fast() call) still takes the kernel (the test above once passed only after other tests)."""
    code = ("import torch; from msprobe.dumpers import fastpath; from msprobe.dumpers.pytorch import _encode; "
            "_encode._FAST = fastpath.native(); "
            "torch.aminmax = None; "
            "print(_encode._stat_handle(torch.randn(10, 10))[0] == _encode._K_DONE)")
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "True"


# ------------------------------------------------------------------ loading and the fallback


def test_native_disabled_by_env(tmp_path):
    code = ("import json, torch; from msprobe.dumpers import fastpath; from msprobe.dumpers.pytorch import _encode; "
            "h = _encode._stat_handle(torch.arange(6.0)); "
            "print(json.dumps([fastpath.native() is None, _encode.fetch_stats([h])[0], _encode._crc32_hex(torch.arange(6.0))]))")
    out = {}
    for flag in ("0", "1"):
        env = dict(os.environ, PYTHONPATH=ROOT, MSPROBE_LAKE_NATIVE=flag)
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        out[flag] = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["0"][0] is True and out["1"][0] is False
    assert out["0"][1] == out["1"][1] == {"Max": 5.0, "Min": 0.0, "Mean": 2.5, "Norm": 7.416198253631592}
    assert out["0"][2] == out["1"][2] == f"{zlib.crc32(np.arange(6, dtype=np.float32).tobytes()):08x}"


def test_first_use_build_in_the_cache(tmp_path, monkeypatch):
    cc = sysconfig.get_config_var("CC") or "cc"
    if shutil.which(cc.split()[0]) is None:
        pytest.skip(f"no C compiler ({cc}) on this machine: the first-use build cannot run")
    monkeypatch.setenv("MSPROBE_LAKE_CACHE", str(tmp_path))
    mod = fastpath._built_in_cache()
    assert mod is not None and mod.VERSION == fastpath.VERSION
    built = list((tmp_path / "native").glob("_fastpath-*"))
    assert [p for p in built if not p.name.endswith(".lock")], built
    x = torch.arange(10, dtype=torch.float32)
    assert mod.stats(x.data_ptr(), 10, 0) == (9.0, 0.0, 4.5, pytest.approx(16.881943016134134, rel=1e-7))
    # a second call finds the built file (no compile: no compiler needed any more)
    monkeypatch.setenv("CC", "/nonexistent-cc")
    assert fastpath._built_in_cache() is not None


def test_no_compiler_means_fallback(tmp_path, monkeypatch):
    monkeypatch.setenv("MSPROBE_LAKE_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "/nonexistent-cc")
    assert fastpath._built_in_cache() is None


# ------------------------------------------------------------------ CUDA: the fused Triton reduction

_FUSED_CASES = """
import json, sys, torch
from msprobe.dumpers.pytorch import _cuda_stats, _encode
from msprobe.format.stats import reference_stats, stats_equal
assert _cuda_stats.available()
_cuda_stats.MAX_PROGRAMS = 3  # more blocks than programs: the strided loop and the partials fold
g = torch.Generator().manual_seed(5)
cases = []
for dtype in (torch.float32, torch.float16, torch.bfloat16):
    for n in (1, 7, 1024, 1025, 5000):
        cases.append((torch.randn(n, generator=g) * 3 + 0.5).to(dtype))
    x = torch.randn(3000, generator=g).to(dtype); x[1700] = float("nan"); cases.append(x)
    x = torch.randn(3000, generator=g).to(dtype); x[5] = float("inf"); x[2999] = float("-inf"); cases.append(x)
cases.append(torch.full((2100,), 60000.0, dtype=torch.float16))  # Norm overflows float16: inf
handles = [_encode.StatHandle(_encode._K_FUSED, _cuda_stats.raw(t), 4, t.dtype) for t in cases]
got = _encode.fetch_stats(handles)
bad = []
for t, v in zip(cases, got):
    ref = reference_stats(t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy(),
                          logical_dtype="bfloat16" if t.dtype == torch.bfloat16 else None)
    vals = (v["Max"], v["Min"], v["Mean"], v["Norm"])
    if not all(stats_equal(a, b, rtol=1e-6, atol=0) for a, b in zip(vals, ref)):
        bad.append([str(t.dtype), t.numel(), vals, ref])
print(json.dumps({"n": len(cases), "bad": bad}))
"""


def test_cuda_fused_kernel_in_the_triton_interpreter():
    """The Triton kernels on CPU tensors (TRITON_INTERPRET=1), through fetch_stats' batched rounding,
    against the reference. Triton comes from $MSPROBE_TEST_TRITON_PATH, else from a folder the test
    installs once into the cache (torch's CPU wheel ships none; the test fails, never skips, when it
    cannot). Unmeasured on a GPU here."""
    from tests._realtool import triton_path

    extra = os.environ.get("MSPROBE_TEST_TRITON_PATH") or triton_path()
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(p for p in (ROOT, extra) if p))
    probe = subprocess.run([sys.executable, "-c", "import triton"], env=env, capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr[-2000:]
    r = subprocess.run([sys.executable, "-c", _FUSED_CASES], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["n"] == 22 and out["bad"] == [], out["bad"]


def test_fused_handles_round_and_batch_per_dtype():
    """fetch_stats on fused handles (here made by torch in float64 on the CPU, as the kernel leaves
    them on the device): one group per dtype, Mean/Norm rounded to it, md5 extras kept."""
    from msprobe.dumpers.pytorch import _encode

    g = torch.Generator().manual_seed(9)
    ts = [torch.randn(n, generator=g).to(dt) for dt in (torch.float32, torch.float16, torch.bfloat16)
          for n in (3, 100)]

    def emulate(t):
        d = t.double()
        return torch.stack([d.max(), d.min(), d.mean(), d.norm()])

    hs = [_encode.StatHandle(_encode._K_FUSED, emulate(t), 4, t.dtype) for t in ts]
    hs[0] = hs[0]._replace(extra={"md5": "0000abcd"})
    got = _encode.fetch_stats(hs)
    for t, v in zip(ts, got):
        ref = reference_stats(t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy(),
                              logical_dtype="bfloat16" if t.dtype == torch.bfloat16 else None)
        assert all(_close(a, b) for a, b in zip((v["Max"], v["Min"], v["Mean"], v["Norm"]), ref)), (t.dtype, v, ref)
    assert got[0]["md5"] == "0000abcd"


def _random_value(rng, depth=0):
    import math
    import struct

    kind = rng.randrange(10 if depth < 4 else 6)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.choice([0, -1, 7, 2**63 - 1, -2**63, rng.randrange(-10**12, 10**12)])
    if kind in (2, 3):
        while True:
            v = rng.choice([struct.unpack("f", struct.pack("I", rng.getrandbits(32)))[0],
                            struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0],
                            rng.gauss(0, 1) * 10.0 ** rng.randint(-30, 30), float(rng.randint(-10**6, 10**6)),
                            rng.choice([0.0, -0.0, 1e-4, 1e-5, 9.999e-5, 1e16, 1e15, 5e-324, 1e308])])
            if math.isfinite(v):
                return v
    if kind in (4, 5):
        alphabet = "ab:,\" \\/\n\t\x00\x1f\x7f\x80é€\U0001F600{}[]-0.1e"
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(8)))
    if kind in (6, 7):
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(5))]
    if kind == 8:
        return tuple(_random_value(rng, depth + 1) for _ in range(rng.randrange(3)))
    return {str(_random_value(rng, 5)): _random_value(rng, depth + 1) for _ in range(rng.randrange(5))}


def test_record_json_is_json_dumps_byte_for_byte(fast):
    """The C record encoder (orjson's text respaced) gives exactly json.dumps(separators=(", ", ": "))'s
    text for every plain record, and None (the json module then) for what it does not take."""
    import random

    import orjson  # (the [fast] extra: in the test install)

    from msprobe.format.journal import record_text

    rng = random.Random(30)
    for _ in range(20000):
        value = {"input_args": [_random_value(rng) for _ in range(3)], "output": _random_value(rng)}
        got = fast.record_json(value, orjson.dumps)
        assert got == record_text(value), value
    deep: list = [1]
    for _ in range(70):
        deep = [deep]
    for value in (float("nan"), [float("inf")], {"a": -float("inf")}, {1: 2}, [2**64], [-(2**63) - 1], {"s": "\ud800"},
                  deep, object(), {"x": {1, 2}}, np.float32(1.5), 3j):
        assert fast.record_json(value, orjson.dumps) is None, value
    # the dumper's function takes json's path for those, with json's answer
    text = fastpath.record_text_function()
    assert text({"Max": float("nan"), "Min": float("-inf")}) == '{"Max": NaN, "Min": -Infinity}'
    assert text({"a": [1, 2.5e-07]}) == '{"a": [1, 2.5e-07]}'


# ------------------------------------------------------------------ a tensor's whole entry in one call


def _entry_tensors():
    g = torch.Generator().manual_seed(5)
    base = torch.randn(64, 33, generator=g) * 100
    leaf = torch.randn(8, 4, generator=g).requires_grad_(True)
    neg = torch.randn(4, 4, generator=g)._neg_view()
    return [
        base, base[3:], base[5], base.t(), base[:, 3:9], base.half(), base.bfloat16(), base.double(),
        (base * 50).to(torch.int8), (base * 50).to(torch.uint8), (base * 50).to(torch.int16),
        (base * 50).to(torch.int32), (base * 50).to(torch.int64), base > 0, torch.tensor(2.5), torch.zeros(0, 4),
        torch.randn(5, 3, generator=g, dtype=torch.complex64), torch.tensor([1.0, float("nan"), 2.0]),
        torch.tensor([float("inf"), 1.0, float("-inf")]), torch.full((10,), 3e38), torch.randn(3, 70_001, generator=g),
        leaf, leaf * 2, torch.nn.Parameter(base.clone()), neg, torch.tensor([7]),
        # 0-d: the value itself (a negative Norm), each kernel dtype
        torch.tensor(-2.5), torch.tensor(float("nan")), torch.tensor(-3.25, dtype=torch.float16),
        torch.tensor(1e-40, dtype=torch.bfloat16), torch.tensor(-7, dtype=torch.int64), torch.tensor(True),
        torch.tensor(200, dtype=torch.uint8), torch.tensor(-1.5, dtype=torch.float64), base[2, 3],
        # attention's views: a 4-d transpose, its 3-d narrow, a gather of runs, an expand, a column
        base.reshape(2, 32, 3, 11).transpose(1, 2), base.reshape(2, 32, 33)[:, 4:20], base[:, ::2],
        torch.randn(1, 5, generator=g).expand(9, 5), base[:, 7], base.reshape(4, 16, 33).permute(2, 0, 1),
    ]


@pytest.mark.parametrize("mode", ["statistics", "md5"])
def test_tensor_entry_is_the_python_entry(kernels, mode):
    """The C path of a CPU tensor's entry (``tensor_entry``: attribute reads, the statistics cache, the
    kernels, the entry) gives the Python path's entry byte for byte, key order included, for every
    tensor it takes (and declines the others: the Python path then), and fills the statistics cache
    with the same keys, so either path hits what the other stored."""
    from msprobe.dumpers.pytorch import _encode
    from msprobe.dumpers.session._documents import PendingStats

    def encoder(native: bool):
        e = _encode.Encoder(None, save_tensors=False, summary_mode=mode, tensor_list=[])
        if not native:
            e._entry_ctx = False
        return e

    def made(enc, t):  # the entry as the record holds it once its pending statistics are fetched
        entry = enc.tensor(t, "x", False)
        pending = PendingStats()
        pending.extend(enc.take_stats())
        pending.resolve(_encode.fetch_stats)
        return entry

    native, python = encoder(True), encoder(False)
    taken = 0
    for t in _entry_tensors():
        for _ in range(2):  # computed, then from the cache
            a, b = made(native, t), made(python, t)
            assert json.dumps(a) == json.dumps(b), (t.dtype, tuple(t.shape), a, b)
        taken += kernels.tensor_entry(t, native._entry_ctx) is not None
    # (all but the empty, negated, complex ones and four layouts without runs of 8 unit-stride elements; md5:
    # no non-contiguous one)
    assert taken == (30 if mode == "md5" else 34), taken
    assert list(native.cache.entries) == list(python.cache.entries)
    mixed = encoder(True)  # stored by one path, found by the other
    t = torch.randn(6, 6)
    stored = mixed.tensor(t, "x", False)
    mixed._entry_ctx = False
    assert mixed.cache.get(t) is not None and mixed.tensor(t, "x", False) == stored


def test_tensor_entry_declines_what_it_does_not_make(fast):
    from msprobe.dumpers.pytorch import _encode

    e = _encode.Encoder(None, save_tensors=False, summary_mode="statistics", tensor_list=[])
    e.tensor(torch.ones(2), "x", False)
    ctx = e._entry_ctx
    assert fast.tensor_entry(torch.ones(3, 3), ctx)["Max"] == 1.0
    assert fast.tensor_entry(torch.tensor(-2.0), ctx)["Norm"] == -2.0  # (a 0-d tensor's statistics: its value)
    assert fast.tensor_entry(torch.ones(12, 12).t(), ctx)["Max"] == 1.0  # (a transpose: unit-stride runs)
    for t in (torch.ones(12, 12)[:, ::2], torch.zeros(0), torch.ones(2, dtype=torch.complex64),
              torch.ones(2, device="meta"), torch.ones(2)._neg_view(), "not a tensor"):
        assert fast.tensor_entry(t, ctx) is None, t
    with pytest.raises(TypeError):
        fast.tensor_entry(torch.ones(2), ())


def test_tensor_entry_reads_strides_past_the_api_wrappers(fast, monkeypatch):
    """A strided tensor's strides are read through ``torch._C.TensorBase.stride``: ``torch.Tensor.stride``,
    which the API wrappers replace (support_wrap_ops.yaml lists it), is not called by the entry (each call
    went through a Python wrapper, 94 a step at opheavy size), and the entry is the same."""
    from msprobe.dumpers.pytorch import _encode

    e = _encode.Encoder(None, save_tensors=False, summary_mode="statistics", tensor_list=[])
    e.tensor(torch.ones(2), "x", False)
    ctx = e._entry_ctx
    t = torch.arange(144.0).reshape(12, 12).t()
    expected = fast.tensor_entry(t.clone().t().contiguous().t(), ctx)  # (another tensor: not the cache's)
    calls = []
    stride = torch.Tensor.stride

    def wrapped(self, *args, **kwargs):
        calls.append(1)
        return stride(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "stride", wrapped)
    assert fast.tensor_entry(t, ctx) == expected and expected is not None
    assert calls == []


# ------------------------------------------------------------------ a record's stack


def test_capture_stack_is_the_python_walk(fast):
    """The C walk of the calling thread's frames gives the Python walk's (filename, lineno, name) tuples:
    from the same frame, the package's files and ``<string>`` left out (here also this test's file,
    named as a second prefix), at any depth, through exec'd code."""
    from msprobe.dumpers import stacks

    def grab(native):
        stacks._NATIVE[0] = native
        return stacks.capture_stack()

    def site(depth):
        if depth:
            return site(depth - 1)
        both = [grab(n) for n in (fast.capture_stack, False)]  # (one line: the same frames)
        here = (stacks._PKG_DIRS[0], os.path.dirname(os.path.abspath(__file__)))
        return both, fast.capture_stack(0, here), stacks.walk_stack(sys._getframe(0)), here

    saved = stacks._NATIVE[0]
    try:
        for depth in (0, 3, 40):
            scope = {"site": site, "depth": depth}
            exec("out = site(depth)", scope)  # a "<string>" frame in the stack
            (native, python), filtered, walked, here = scope["out"]
            assert native == python and len(native) > depth and not any(f[0] == "<string>" for f in native)
            assert any(f[2] == "site" for f in native)
            assert [f for f in walked if not f[0].startswith(here)] == list(filtered)
            assert not any(f[2] == "site" for f in filtered) and filtered
    finally:
        stacks._NATIVE[0] = saved
    with pytest.raises(TypeError):
        fast.capture_stack(0, "not a tuple")


# ------------------------------------------------------------------ a call's argument lists in one call


def _argument_lists():
    """Positional lists of what calls pass: tensors of each kind (those tensor_entry declines too), scalars,
    nested lists and tuples, and values only the Python path encodes (torch.Size, dtypes, slices, a
    namedtuple, a dict, a list nested past the C walk's depth) beside C ones."""
    import collections

    g = torch.Generator().manual_seed(8)
    base = torch.randn(16, 9, generator=g)
    pair = collections.namedtuple("pair", "a b")
    deep: list = [base]
    for _ in range(10):
        deep = [deep]
    return [
        (base, base[2:], 2.5, 3, True, None, "x"),
        (base.t(), [base, 1, (2.0, None)], (base[0], False)),
        (torch.zeros(0, 3), base._neg_view(), torch.ones(2, dtype=torch.complex64), torch.tensor(4.0)),
        (base.shape, torch.float32, slice(1, None), pair(base, 2), {"k": base}, Ellipsis, 1 + 2j),
        (deep, [base[:, ::3], base], ("s\n\"", -7, 2**70), torch.nn.Parameter(base.clone())),
        (),
    ]


@pytest.mark.parametrize("mode", ["statistics", "md5"])
def test_encode_values_is_the_python_encoding(kernels, mode):
    """``encode_values``, the C encoding of a call's whole argument list (and keyword dict, and tuple
    output), gives the Python path's entries byte for byte, key order included: the values it takes
    itself and those it hands back to ``encode`` at their ``<prefix>.<key>`` (the names a saved tensor
    would get), in argument order; the lists and entries it makes are left out of the collector's walks."""
    import gc

    from msprobe.dumpers.pytorch import _encode
    from msprobe.dumpers.pytorch._values import is_sequence
    from msprobe.dumpers.session._documents import PendingStats

    def encoder(native: bool):
        e = _encode.Encoder(None, save_tensors=False, summary_mode=mode, tensor_list=[])
        if not native:
            e._entry_ctx = False
        return e

    def resolved(enc, value):
        pending = PendingStats()
        pending.extend(enc.take_stats())
        pending.resolve(_encode.fetch_stats)
        return json.dumps(value)

    native, python = encoder(True), encoder(False)
    prefixes: list = []
    real_encode = native.encode

    def spy(value, prefix, save, depth=0):
        prefixes.append(prefix)
        return real_encode(value, prefix, save, depth)

    native.encode = spy
    for args in _argument_lists():
        for _ in range(2):  # computed, then from the statistics cache
            prefixes.clear()
            a = native.encode_list(args, "Torch.f.0.forward.input", False)
            assert isinstance(a, list)
            handed = [p for p in prefixes if p.count(".") == 5]  # (the top-level ones: nested calls recurse)
            b = python.encode_list(args, "Torch.f.0.forward.input", False)
            assert resolved(native, a) == resolved(python, b), args
            for index in range(len(args)):  # a value the C path took is not encoded again in Python
                assert handed.count(f"Torch.f.0.forward.input.{index}") <= 1
            kwargs = {f"k{i}": v for i, v in enumerate(args)}
            a = native.encode_map(kwargs, "Torch.f.0.forward.kwargs", False)
            b = python.encode_map(kwargs, "Torch.f.0.forward.kwargs", False)
            assert list(a) == list(kwargs) and resolved(native, a) == resolved(python, b)
            for out in (args, args[0] if args else None, list(args)):
                a = native.encode_output(out, "Torch.f.0.forward.output", False, is_sequence=is_sequence)
                b = python.encode_output(out, "Torch.f.0.forward.output", False, is_sequence=is_sequence)
                assert resolved(native, a) == resolved(python, b), out
    # the C path took the plain ones itself (nothing handed back) and left its lists untracked
    prefixes.clear()
    made = native.encode_list(_argument_lists()[0], "p", False)
    assert prefixes == [] and not gc.is_tracked(made) and not any(gc.is_tracked(e) for e in made)
    prefixes.clear()
    native.encode_list(_argument_lists()[3], "p", False)
    # each of these through encode, at its name (nested ones recurse there)
    assert [p for p in prefixes if p.count(".") == 1] == [f"p.{i}" for i in range(7)]
    # saving tensors, or checking overflows, is the Python path's
    assert native._native_ctx(True) is False
    native.check_overflow = True
    assert native._native_ctx(False) is False


def test_encode_values_refuses_a_bad_context(fast):
    with pytest.raises(TypeError):
        fast.encode_values([1], (), lambda v, p, k: None, "p")


def test_untrack_leaves_only_cycle_free_records(fast):
    """``untrack`` takes a record out of the collector's walks only where it holds dicts, lists and tuples
    of atomic values; anything else keeps the containers on its path tracked (their cycles stay collectable)."""
    import gc

    rec = {"input_args": [{"type": "int", "value": 1}, [1.5, "a", None]], "output": [{"shape": [2, 3]}], "t": (1, [2])}
    assert gc.is_tracked(rec) and fast.untrack(rec) is True
    assert not gc.is_tracked(rec) and not gc.is_tracked(rec["input_args"]) and not gc.is_tracked(rec["t"][1])
    assert rec == {"input_args": [{"type": "int", "value": 1}, [1.5, "a", None]], "output": [{"shape": [2, 3]}],
                   "t": (1, [2])}

    class Held:
        pass

    holder = Held()
    rec = {"a": [1, 2], "b": [holder]}
    assert fast.untrack(rec) is False
    assert gc.is_tracked(rec) and gc.is_tracked(rec["b"]) and not gc.is_tracked(rec["a"])
    cycle: list = []
    cycle.append(cycle)
    assert fast.untrack(cycle) is False or not gc.is_tracked(cycle)  # (deep self-reference: depth-bounded)
    assert fast.untrack(5) is True and fast.untrack(Held()) is False


def test_journal_line_is_the_python_line(fast):
    """``journal_line`` gives ``record_text``'s text and ``encode_record_text``'s line around it byte for
    byte (parent written or not, None or a name; a stack id or none), and None where the Python path
    must make them (names needing escapes, a record json.dumps alone writes, a stack id not an int)."""
    import random

    import orjson

    from msprobe.format.journal import NO_PARENT, encode_record_text, record_text

    rng = random.Random(51)
    names = ["Torch.add.0.forward", "Module.layers.0.Linear.forward.3", "", "Tensor.__add__.12.backward"]
    for _ in range(3000):
        record = {"input_args": [_random_value(rng) for _ in range(2)], "output": _random_value(rng)}
        name = rng.choice(names)
        parent = rng.choice([None, "Module.a.forward.0", "optimizer"])
        with_parent = rng.random() < 0.5
        stack_id = rng.choice([None, 0, 7, 123456])
        got = fast.journal_line(record, orjson.dumps, name, parent, with_parent, stack_id)
        text = record_text(record)
        line = encode_record_text(name, text, parent=parent if with_parent else NO_PARENT, stack_id=stack_id)
        assert got == (text, line), (record, name, parent, with_parent, stack_id)
    plain = {"output": [1]}
    for name, parent, stack_id, record in (("a\"b", None, None, plain), ("é", None, None, plain), ("a", "p\n", None, plain),
                                           ("a", None, "3", plain), ("a", None, None, {"x": float("nan")})):
        assert fast.journal_line(record, orjson.dumps, name, parent, True, stack_id) is None
    # the pipeline's function gives what the Python pair gives, also where the C call declines
    line_of = fastpath.journal_line_function()
    assert line_of(plain, "x", None, True, 2) == ('{"output": [1]}', b'{"name": "x", "record": {"output": [1]}, '
                                                                    b'"parent": null, "stack_id": 2}')
