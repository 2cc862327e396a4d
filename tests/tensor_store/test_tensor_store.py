"""The Zarr tensor store (tensor_store: "zarr", spec section 21): round trips, dedup, crash safety, convert."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
zarr = pytest.importorskip("zarr")
pytest.importorskip("numcodecs")

from msprobe.backends import open_store  # noqa: E402
from msprobe.dumpers.config import load_config  # noqa: E402
from msprobe.errors import ConfigError, StorageError  # noqa: E402
from msprobe.tensor_store import IncompleteTensorError, ZarrTensorReader, ZarrTensorWriter, parse_location  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cases() -> dict:
    g = torch.Generator().manual_seed(7)
    base = torch.randn(6, 8, generator=g)
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-40, 3.5])
    return {
        "float32": torch.randn(5, 7, generator=g),
        "float64": torch.randn(3, 4, generator=g, dtype=torch.float64),
        "float16": torch.randn(9, generator=g).half(),
        "bfloat16": torch.randn(4, 5, generator=g).to(torch.bfloat16),
        "bf16_special": special.to(torch.bfloat16),
        "f32_special": special,
        "int8": torch.randint(-128, 127, (17,), generator=g, dtype=torch.int8),
        "int16": torch.randint(-30000, 30000, (3, 3), generator=g, dtype=torch.int16),
        "int32": torch.randint(-2**31, 2**31 - 1, (6,), generator=g, dtype=torch.int32),
        "int64": torch.randint(-2**62, 2**62, (2, 3), generator=g, dtype=torch.int64),
        "uint8": torch.randint(0, 255, (11,), generator=g, dtype=torch.uint8),
        "bool": torch.rand(13, generator=g) > 0.5,
        "complex64": torch.randn(3, 2, generator=g, dtype=torch.complex64),
        "zero_d": torch.tensor(2.5),
        "zero_d_int": torch.tensor(-3, dtype=torch.int64),
        "empty": torch.zeros(0, 3),
        "empty_bf16": torch.zeros(2, 0, dtype=torch.bfloat16),
        "non_contiguous": base.t(),
        "view_slice": base[1:4, ::3],
        "view_reshape": base.view(48),
        "conj": torch.randn(4, generator=g, dtype=torch.complex64).conj(),
        "float8": torch.randn(6, generator=g).to(torch.float8_e4m3fn),
    }


def _same(a, b) -> bool:
    """Bit-exact equality (NaN and -0.0 included)."""
    a = a.resolve_conj().contiguous()
    b = b.resolve_conj().contiguous()
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    return a.reshape(-1).view(torch.uint8).tolist() == b.reshape(-1).view(torch.uint8).tolist()


def _dump(url, cases, storage_options=None, **cfg):
    """Encode every case through the PyTorch dumper's encoder (as tensor mode does) and publish."""
    from msprobe.dumpers.pytorch._dumper import TorchDumper

    config = load_config(task="tensor", dump_path=url, level="L1", tensor_store="zarr", index=True,
                         storage_options=storage_options, **cfg)
    d = TorchDumper(config)
    for i, (name, t) in enumerate(cases.items()):
        rec = f"Tensor.case_{name}.{i}.forward"
        entry = d.encoder.tensor(t, f"{rec}.input.0", True)
        d.session.add_record(rec, {"input_args": [entry], "input_kwargs": {}, "output": []})
    d.session.publish(final=True)
    d.session.close()
    return d


def _check_round_trip(url, cases, storage_options=None):
    import msprobe.readers

    dump = msprobe.readers.open(url, storage_options=storage_options)
    got = {}
    for rec in dump.records():
        for _, t in rec.tensors():
            got[rec.name.split(".")[1][len("case_"):]] = t
    assert set(got) == set(cases)
    for name, t in cases.items():
        ref = got[name]
        assert ref.data_name == f"{ref.record.name}.input.0.pt"
        loaded = ref.load("torch")
        assert _same(loaded, t), name
        if t.dtype in (torch.bfloat16,):
            np_val = ref.load()  # numpy: bf16 widened exactly
            assert np_val.dtype == np.float32 and np_val.shape == tuple(t.shape)
            assert np.array_equal(np_val, t.float().numpy(), equal_nan=True)
    return dump


def test_round_trip_every_dtype_local(tmp_path):
    cases = _cases()
    url = str(tmp_path / "dump")
    _dump(url, cases)
    _check_round_trip(url, cases)
    rank = tmp_path / "dump" / "step0" / "rank"
    assert not (rank / "dump_tensor_data").exists()
    doc = json.loads((rank / "dump.json").read_text())
    names = [e["data_name"] for r in doc["data"].values() for e in r["input_args"]]
    assert all(n.endswith(".input.0.pt") for n in names) and len(names) == len(cases)
    assert json.loads((rank / "msprobe_lake.json").read_text())["tensor_format"] == "zarr"
    # any Zarr v3 reader: zarr-python reads the same elements through the index location column
    import pyarrow.parquet as pq

    idx = pq.read_table(rank / "index" / "records.parquet", columns=["data_name", "location", "dtype"]).to_pylist()
    group = zarr.open_group(str(rank / "tensors.zarr"), mode="r")
    manifest = group.attrs["msprobe_lake"]
    assert manifest["complete"] is True
    for row in idx:
        name = row["data_name"].split(".")[1][len("case_"):]
        array, start, count = parse_location(row["location"])
        arr = group[array]
        assert arr.attrs["msprobe_lake"]["logical_dtype"] == array
        bits = arr[start:start + count]
        t = cases[name].resolve_conj().contiguous()
        want = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else np.zeros(0, np.uint8)
        assert bits.tobytes() == want.tobytes(), name
    # validate accepts the store as the tensors' home
    from msprobe.readers.validate import validate_store

    report = validate_store(open_store(url), "")
    assert not [p for p in report.problems if p.severity == "error"], report.problems


@pytest.mark.s3
def test_round_trip_every_dtype_s3(s3_server, s3_bucket_url):
    from tests.conftest_s3 import s3_storage_options

    opts = s3_storage_options(s3_server)
    url = f"{s3_bucket_url}/zarr_run"
    cases = _cases()
    _dump(url, cases, storage_options=opts)
    _check_round_trip(url, cases, storage_options=opts)


@pytest.mark.s3
def test_one_tensor_costs_two_range_requests_on_s3(s3_server, s3_bucket_url):
    """A cold read: the shard index, then one run of chunks; a warm read: one request."""
    from tests.conftest_s3 import FaultProxy, s3_storage_options

    opts = s3_storage_options(s3_server)
    url = f"{s3_bucket_url}/reqs"
    g = torch.Generator().manual_seed(1)
    cases = {f"t{i}": torch.randn(50_000 + i, generator=g) for i in range(12)}  # ~2.4 MB, several chunks each
    w = ZarrTensorWriter(open_store(url, storage_options=opts), "step0/rank", shard_bytes=8 << 20)
    for n, t in cases.items():
        b = t.numpy().tobytes()
        w.add(n, "float32", tuple(t.shape), lambda b=b: b, len(b))
    w.close()
    proxy = FaultProxy(s3_server, rate=0.0).start()
    try:
        popts = s3_storage_options(proxy.endpoint)
        r = ZarrTensorReader(open_store(url, storage_options=popts, read_only=True), "step0/rank")
        before = proxy.requests
        got = r.load("t5", "torch")
        cold = proxy.requests - before
        before = proxy.requests
        got2 = r.load("t6", "torch")
        warm = proxy.requests - before
    finally:
        proxy.stop()
    assert torch.equal(got, cases["t5"]) and torch.equal(got2, cases["t6"])
    assert cold <= 2 and warm == 1, (cold, warm)


def test_dedup_identity_content_and_never_differing_bytes(tmp_path):
    x = torch.randn(64, 32)
    y = x.clone()  # same bytes, other memory: content dedup
    z = x.clone()
    z.view(-1)[5] += 1  # one element differs
    w_int = x.view(torch.int32)  # same bits, other dtype: never merged (other array)
    cases = {"x": x, "x_again": x, "y": y, "z": z, "x_flat": x.view(-1), "x_t": x.t(), "w_int": w_int}
    _dump(str(tmp_path / "d"), cases)
    x.add_(1.0)  # after the dump: must not matter
    r = ZarrTensorReader(open_store(str(tmp_path / "d")), "step0/rank")
    locs = r.locations()
    by = {n.split(".")[1][len("case_"):]: loc for n, loc in locs.items()}
    assert by["x"] == by["x_again"] == by["y"] == by["x_flat"]  # identity and content dedup
    assert by["z"] != by["x"] and by["x_t"] != by["x"] and by["w_int"] != by["x"]
    import msprobe.readers

    for rec in msprobe.readers.open(str(tmp_path / "d")).records():
        for _, t in rec.tensors():
            name = rec.name.split(".")[1][len("case_"):]
            want = {"x": x - 1.0, "x_again": x - 1.0, "y": y, "z": z, "x_flat": (x - 1.0).view(-1),
                    "x_t": (x - 1.0).t(), "w_int": (x - 1.0).view(torch.int32)}[name]
            if name in ("x", "x_again", "x_flat", "x_t", "w_int"):
                want = y.view(-1).reshape(want.shape) if name != "x_t" else y.t()
                if name == "w_int":
                    want = y.view(torch.int32)
            assert _same(t.load("torch"), want), name


def test_in_place_write_between_saves_is_not_merged(tmp_path):
    from msprobe.dumpers.pytorch._dumper import TorchDumper

    config = load_config(task="tensor", dump_path=str(tmp_path / "d"), level="L1", tensor_store="zarr")
    d = TorchDumper(config)
    t = torch.ones(100)
    e1 = d.encoder.tensor(t, "Tensor.a.0.forward.input.0", True)
    t.mul_(3)  # bumps the version: the same memory no longer holds the same bytes
    e2 = d.encoder.tensor(t, "Tensor.a.0.forward.output.0", True)
    d.session.add_record("Tensor.a.0.forward", {"input_args": [e1], "input_kwargs": {}, "output": [e2]})
    d.session.publish(final=True)
    d.session.close()
    r = ZarrTensorReader(open_store(str(tmp_path / "d")), "step0/rank")
    assert torch.equal(r.load(e1["data_name"], "torch"), torch.ones(100))
    assert torch.equal(r.load(e2["data_name"], "torch"), torch.full((100,), 3.0))


def test_random_payloads_never_merge_differing_bytes(tmp_path):
    rng = np.random.default_rng(3)
    store = open_store(str(tmp_path / "s"), create=True)
    w = ZarrTensorWriter(store, "step0/rank", shard_bytes=1 << 14, chunk_bytes=1 << 10)
    pool = [rng.integers(0, 3, size=int(rng.integers(0, 300)), dtype=np.int16) for _ in range(10)]
    want = {}
    for i in range(200):
        a = pool[int(rng.integers(0, len(pool)))].copy()
        if rng.random() < 0.3 and a.size:
            a[int(rng.integers(0, a.size))] ^= 1  # a near-duplicate
        want[f"n{i}.pt"] = a
        w.add(f"n{i}.pt", "int16", a.shape, lambda a=a: a.tobytes(), a.nbytes)
    w.close()
    assert w.summary.payloads < 200  # something was deduplicated
    r = ZarrTensorReader(store, "step0/rank")
    for n, a in want.items():
        assert np.array_equal(r.load(n), a), n


@pytest.mark.parametrize("compression", ["lz4", "zstd", "zstd-byteshuffle", "none"])
def test_payloads_spanning_shards_and_padding(tmp_path, compression):
    store = open_store(str(tmp_path / "s"), create=True)
    w = ZarrTensorWriter(store, "r", shard_bytes=4096, chunk_bytes=1024, compression=compression)
    g = torch.Generator().manual_seed(0)
    ts = {f"a{i}": torch.randn(int(n), generator=g) for i, n in enumerate([100, 900, 3000, 5, 1030, 2048])}
    for n, t in ts.items():
        b = t.numpy().tobytes()
        w.add(n, "float32", tuple(t.shape), lambda b=b: b, len(b))
    w.close()
    r = ZarrTensorReader(store, "r")
    for n, t in ts.items():
        assert torch.equal(r.load(n, "torch"), t), n
    arr = zarr.open_group(store.local_path("r/tensors.zarr"), mode="r")["float32"]
    for n, loc in r.locations().items():
        _, s, c = parse_location(loc)
        assert np.array_equal(arr[s:s + c], ts[n].numpy())


_CRASH_CHILD = r"""
import os, signal, sys, numpy as np
from msprobe.backends import open_store
from msprobe.tensor_store import ZarrTensorWriter
w = ZarrTensorWriter(open_store(sys.argv[1], create=True), "step0/rank", shard_bytes=1 << 14, chunk_bytes=1 << 10)
for i in range(40):
    a = np.arange(i * 1000, i * 1000 + 700, dtype=np.float32)
    w.add(f"t{i}.pt", "float32", a.shape, lambda a=a: a.tobytes(), a.nbytes)
    if i == 29:
        w.wait()  # the shards holding t0..t~28 are stored
print("KILL", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_crash_mid_step_complete_payloads_readable_partial_reported(tmp_path):
    url = str(tmp_path / "crash")
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, "-c", _CRASH_CHILD, url], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == -9, p.stderr
    r = ZarrTensorReader(open_store(url), "step0/rank")
    assert not r.complete
    done = [n for n in (f"t{i}.pt" for i in range(40)) if n in r]
    assert len(done) >= 20
    for n in done:
        i = int(n[1:-3])
        assert np.array_equal(r.load(n), np.arange(i * 1000, i * 1000 + 700, dtype=np.float32))
    assert "t39.pt" not in r
    with pytest.raises(IncompleteTensorError):
        r.load("t39.pt")


def test_failed_shard_write_is_reported_not_returned(tmp_path):
    store = open_store(str(tmp_path / "s"), create=True)

    class Flaky:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, k):
            return getattr(self.inner, k)

        def put(self, key, data, **kw):
            if key.endswith("/c/1"):
                raise StorageError(f"injected failure for {key}")
            return self.inner.put(key, data, **kw)

    w = ZarrTensorWriter(Flaky(store), "r", shard_bytes=4096, chunk_bytes=1024, retries=0)
    for i in range(6):
        a = np.full(700, i, dtype=np.float32)
        w.add(f"t{i}.pt", "float32", a.shape, lambda a=a: a.tobytes(), a.nbytes)
    with pytest.raises(StorageError):
        w.close()
    r = ZarrTensorReader(store, "r")
    assert not r.complete
    assert np.array_equal(r.load("t0.pt"), np.zeros(700, np.float32))
    missing = [f"t{i}.pt" for i in range(6) if f"t{i}.pt" not in r]
    assert missing
    for n in missing:
        with pytest.raises(IncompleteTensorError):
            r.load(n)


def test_convert_both_ways(tmp_path):
    import msprobe.readers
    from msprobe.cli import main

    cases = {k: v for k, v in _cases().items() if k != "float8"}
    zdump = str(tmp_path / "z")
    _dump(zdump, cases)
    assert main(["convert", zdump, "--to", "classic", "--out", str(tmp_path / "c")]) == 0
    rank = tmp_path / "c" / "step0" / "rank"
    assert (rank / "dump_tensor_data").is_dir() and not (rank / "tensors.zarr").exists()
    files = os.listdir(rank / "dump_tensor_data")
    assert len(files) == len(cases)
    for f in files:  # plain tensor files, loadable with weights_only
        torch.load(rank / "dump_tensor_data" / f, weights_only=True)
    _check_round_trip(str(tmp_path / "c"), cases)
    assert main(["convert", str(tmp_path / "c"), "--to", "zarr"]) == 0  # in place
    assert not (rank / "dump_tensor_data").exists() and (rank / "tensors.zarr").is_dir()
    _check_round_trip(str(tmp_path / "c"), cases)
    dump = msprobe.readers.open(str(tmp_path / "c"))
    assert dump is not None


def test_config_errors():
    with pytest.raises(ConfigError):
        load_config(task="tensor", tensor_store="hdf5")
    with pytest.raises(ConfigError):
        load_config(task="tensor", tensor_store="zarr", tensor_compression="gzip")
    with pytest.raises(ConfigError):
        load_config(task="tensor", tensor_store="zarr", tensor_shard_mb=0)


def test_training_loop_dump_is_readable(tmp_path):
    """The real dumper on a small model: every data name of dump.json loads from the store."""
    import torch.nn as nn

    import msprobe.readers
    from msprobe.pytorch import PrecisionDebugger

    PrecisionDebugger._reset()
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        dbg = PrecisionDebugger(task="tensor", level="mix", dump_path=str(tmp_path / "t"), tensor_store="zarr")
        for _ in range(2):
            dbg.start(model)
            model(torch.randn(4, 8)).sum().backward()
            dbg.stop()
            dbg.step()
    finally:
        PrecisionDebugger._reset()
    n = 0
    for rec in msprobe.readers.open(str(tmp_path / "t")).records():
        for _, t in rec.tensors():
            if t.data_name:
                v = t.load("torch")
                assert list(v.shape) == list(t.shape)
                n += 1
    assert n > 20
    r = ZarrTensorReader(open_store(str(tmp_path / "t")), "step0/rank")
    assert r.complete and len(set(r.locations().values())) < len(r.names())  # dedup happened


def test_unsupported_tensor_is_noted_not_fatal(tmp_path):
    from msprobe.dumpers.pytorch._dumper import TorchDumper

    config = load_config(task="tensor", dump_path=str(tmp_path / "d"), level="L1", tensor_store="zarr")
    d = TorchDumper(config)
    sparse = torch.eye(3).to_sparse()
    e = d.encoder.tensor(sparse, "Tensor.s.0.forward.input.0", True)
    ok = d.encoder.tensor(torch.ones(2), "Tensor.s.0.forward.input.1", True)
    assert "data_name" not in e and ok["data_name"].endswith(".pt")
    d.session.add_record("Tensor.s.0.forward", {"input_args": [e, ok], "input_kwargs": {}, "output": []})
    d.session.publish(final=True)
    d.session.close()
    assert any("tensor store" in x for x in d.session.errors)
    r = ZarrTensorReader(open_store(str(tmp_path / "d")), "step0/rank")
    assert torch.equal(r.load(ok["data_name"], "torch"), torch.ones(2))


_DUMPER_CRASH_CHILD = os.path.join(ROOT, "tests", "dumpers", "_zarr_crash_child.py")


def test_dumper_killed_mid_step_reads_complete_reports_partial(tmp_path):
    import msprobe.readers

    url = str(tmp_path / "killed")
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, _DUMPER_CRASH_CHILD, url], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == -9, p.stderr
    loaded = incomplete = 0
    for rec in msprobe.readers.open(url).records():  # the records come from the crash journal
        for _, t in rec.tensors():
            if not t.data_name:
                continue
            try:
                v = t.load("torch")
            except IncompleteTensorError:
                incomplete += 1
                continue
            assert list(v.shape) == list(t.shape) and v.dtype == torch.float32
            loaded += 1
    assert loaded > 0 and incomplete > 0, (loaded, incomplete)


def test_name_of_a_stored_payload_is_durable_without_a_new_shard(tmp_path):
    """A name added for a payload already stored (dedup'd) reaches the manifest journal once the
    packer is idle, so crash recovery (which reads that journal) keeps its record."""
    store = open_store(str(tmp_path / "d"))
    w = ZarrTensorWriter(store, "step0/rank", compression="none", shard_bytes=4096, chunk_bytes=1024)
    data = np.arange(1024, dtype="<f4").tobytes()  # exactly one shard: stored at once
    w.add("a", "float32", (1024,), lambda: data, len(data))
    w.wait()
    w.add("b", "float32", (32, 32), lambda: data, len(data))  # same bytes: dedup'd by content
    w.add("c", "float32", (1024,), lambda: data, len(data), same_as="a")  # same memory
    w.wait()
    r = ZarrTensorReader(open_store(str(tmp_path / "d"), read_only=True), "step0/rank")  # no checkpoint yet
    assert not r.complete and {"a", "b", "c"} <= set(r.names())
    assert np.array_equal(r.load("b"), np.arange(1024, dtype="<f4").reshape(32, 32))
    w.close()


def test_large_payloads_through_pool_buffers_round_trip(tmp_path):
    """Payloads of 1 MiB and more are copied into the pool's buffers, which go back (and are reused
    by later payloads) once nothing refers to their bytes: 24 large tensors, with shards of 4 MiB,
    one source overwritten in place after each save, a content duplicate and a bf16 one, all read
    back exactly, and the buffers back in the pool once the store is closed."""
    import gc

    from msprobe.dumpers.pytorch import _ptfile

    _ptfile.POOL.clear()
    g = torch.Generator().manual_seed(3)
    src = torch.empty(300_000)  # 1.2 MB, rewritten for every case
    cases = {}
    from msprobe.dumpers.pytorch._dumper import TorchDumper

    config = load_config(task="tensor", dump_path=str(tmp_path / "d"), level="L1", tensor_store="zarr",
                         tensor_shard_mb=4)
    d = TorchDumper(config)
    for i in range(24):
        src.copy_(torch.randn(300_000, generator=g))
        if i == 7:
            src.copy_(cases["c3"])  # the same bytes as an earlier payload: content dedup
        t = src.bfloat16() if i == 11 else src
        cases[f"c{i}"] = t.clone()
        rec = f"Tensor.case_c{i}.{i}.forward"
        entry = d.encoder.tensor(t, f"{rec}.input.0", True)
        src.fill_(float("nan"))  # the model overwrites it: the dump holds the copy
        d.session.add_record(rec, {"input_args": [entry], "input_kwargs": {}, "output": []})
    d.session.publish(final=True)
    d.session.close()
    gc.collect()
    assert _ptfile.POOL.idle > 0  # given back
    _check_round_trip(str(tmp_path / "d"), cases)
    _ptfile.POOL.clear()
