"""Storage faults during a tensor dump to s3:// (the FaultProxy of tests/conftest_s3.py):
transient faults are retried away (0 tensors lost or corrupted); permanent ones are recorded
(session errors, dump_error_info.log naming every object not written) without crashing
training, unless strict=True."""
from __future__ import annotations

import errno
import json
import os
import re
import zlib

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("s3fs")

from msprobe.errors import MsprobeError, StorageError  # noqa: E402
from msprobe.pytorch import PrecisionDebugger  # noqa: E402
from tests.conftest_s3 import s3_storage_options  # noqa: E402
from tests.reliability._model import train  # noqa: E402

pytestmark = [pytest.mark.s3, pytest.mark.usefixtures("fresh_debugger")]


def _dbg(path, **kw):
    return PrecisionDebugger(task="tensor", level="mix", dump_path=path, **kw)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    PrecisionDebugger._reset()
    path = str(tmp_path_factory.mktemp("ref") / "d")
    train(_dbg(path))
    PrecisionDebugger._reset()
    out = {}
    for step in (0, 1):
        rank = os.path.join(path, f"step{step}", "rank")
        with open(os.path.join(rank, "dump.json")) as f:
            data = json.load(f)["data"]
        tensors = {}
        for fn in os.listdir(os.path.join(rank, "dump_tensor_data")):
            t = torch.load(os.path.join(rank, "dump_tensor_data", fn), weights_only=True)
            tensors[fn] = zlib.crc32(t.contiguous().numpy().tobytes())
        out[step] = (data, tensors)
    return out


def _tensor_names(data):
    from msprobe.format.model import Record

    return {dn for name, raw in data.items() for dn in Record(name, raw).data_names()}


def test_transient_faults_lose_nothing(s3_server, s3_bucket_url, s3_fault_proxy, reference, figures):
    import io

    import msprobe.readers
    from msprobe.backends import open_store
    from msprobe.readers.validate import validate_store

    s3_fault_proxy.rate, s3_fault_proxy.hold = 0.10, 0.3
    url = f"{s3_bucket_url}/faulty"
    opts = s3_storage_options(s3_fault_proxy.endpoint, config_kwargs={"read_timeout": 2, "connect_timeout": 2})
    dbg = _dbg(url, storage_options=opts)
    train(dbg, steps=1)
    assert dbg.dumper.session.errors == []
    PrecisionDebugger._reset()
    faults = dict(s3_fault_proxy.counts)
    s3_fault_proxy.rate = 0.0
    direct = s3_storage_options(s3_server)
    store = open_store(url, storage_options=direct, read_only=True)
    assert validate_store(store).ok
    lost = corrupted = checked = 0
    for step, (ref_data, ref_tensors) in list(reference.items())[:1]:
        data = json.loads(store.get(f"step{step}/rank/dump.json"))["data"]
        assert list(data) == list(ref_data)
        for n in data:
            assert data[n] == ref_data[n], n
        names = set(store.list_dir(f"step{step}/rank/dump_tensor_data"))
        assert not [n for n in names if n not in ref_tensors], "a temporary or stray object is visible"
        for fn, crc in ref_tensors.items():
            checked += 1
            if fn not in names:
                lost += 1
                continue
            t = torch.load(io.BytesIO(store.get(f"step{step}/rank/dump_tensor_data/{fn}")), weights_only=True)
            corrupted += zlib.crc32(t.contiguous().numpy().tobytes()) != crc
    d = msprobe.readers.open(url, storage_options=direct)
    d.record("Functional.linear.0.forward", step=0).input_args[0].load()
    figures["storage faults 10%"] = {"requests": faults.get("requests", 0),
                                     "faults": sum(v for k, v in faults.items() if k not in ("requests", "deny")),
                                     "by_kind": {k: v for k, v in faults.items() if k != "requests"},
                                     "tensors_checked": checked, "lost": lost, "corrupted": corrupted}
    assert faults.get("requests", 0) > 50 and sum(v for k, v in faults.items() if k != "requests") >= 10
    assert lost == 0 and corrupted == 0


class _LocalFaults:
    """Seeded transient faults in ~``rate`` of local file writes, after half the bytes: an
    NFS-style timeout (ETIMEDOUT), EAGAIN. Counts requests and faults by kind. (A full disk is
    not transient: test_failing_storage.py fills a real tmpfs.)"""

    KINDS = ("ETIMEDOUT", "EAGAIN")

    def __init__(self, rate, seed):
        import collections
        import random
        import threading

        self.rate, self.rng, self.lock = rate, random.Random(seed), threading.Lock()
        self.counts = collections.Counter()

    def write(self, fd, data, real, where):
        import errno

        with self.lock:
            self.counts[f"requests_{where}"] += 1
            kind = self.rng.choice(self.KINDS) if self.rng.random() < self.rate else None
            if kind:
                self.counts[kind] += 1
        if kind:
            view = memoryview(data).cast("B")
            os.write(fd, view[: len(view) // 2])
            raise OSError(getattr(errno, kind), os.strerror(getattr(errno, kind)))
        return real(fd, data)


def test_local_disk_faults_lose_nothing(tmp_path, reference, figures, monkeypatch):
    """~10% of the local file writes of a tensor dump fail (tensor files, documents, marker:
    LocalStore; journal lines: Journal), after half their bytes: with retries, 0 tensors lost or
    corrupted (CRC32 against the reference), documents equal, nothing temporary visible."""
    import msprobe.backends._journal as journal_mod
    import msprobe.backends._local as local_mod
    from msprobe.backends import open_store
    from msprobe.readers.validate import validate_store

    faults = _LocalFaults(0.10, seed=12)
    real_write_all = local_mod._write_all
    monkeypatch.setattr(local_mod, "_write_all", lambda fd, view: faults.write(fd, view, real_write_all, "files"))

    class FaultyOS:  # the journal's os module: its appends fail too
        def __getattr__(self, name):
            return getattr(os, name)

        def write(self, fd, data):
            return faults.write(fd, data, os.write, "journal")

        def posix_fallocate(self, fd, offset, length):  # no mapped window: the journal writes, and meets the faults
            raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(journal_mod, "os", FaultyOS())
    path = str(tmp_path / "d")
    dbg = _dbg(path, journal_flush=1)  # a journal write per record: the journal meets faults too
    train(dbg, steps=1)
    errors = list(dbg.dumper.session.errors)
    PrecisionDebugger._reset()
    monkeypatch.undo()
    assert errors == []
    store = open_store(path, read_only=True)
    assert validate_store(store).ok
    ref_data, ref_tensors = reference[0]
    rank = os.path.join(path, "step0", "rank")
    with open(os.path.join(rank, "dump.json")) as f:
        data = json.load(f)["data"]
    assert data == ref_data and list(data) == list(ref_data)
    names = set(os.listdir(os.path.join(rank, "dump_tensor_data")))
    assert names == set(ref_tensors), "a temporary or stray file is visible, or a tensor is missing"
    lost = len(set(ref_tensors) - names)
    corrupted = 0
    for fn, crc in ref_tensors.items():
        t = torch.load(os.path.join(rank, "dump_tensor_data", fn), weights_only=True)
        corrupted += zlib.crc32(t.contiguous().numpy().tobytes()) != crc
    assert not [n for n in os.listdir(rank) if n.startswith(".") and n != ".journal"]
    counts = dict(faults.counts)
    injected = sum(counts.get(k, 0) for k in _LocalFaults.KINDS)
    figures["local disk faults 10%"] = {"requests": counts.get("requests_files", 0) + counts.get("requests_journal", 0),
                                        "journal_writes": counts.get("requests_journal", 0), "faults": injected,
                                        "by_kind": {k: counts.get(k, 0) for k in _LocalFaults.KINDS},
                                        "tensors_checked": len(ref_tensors), "lost": lost, "corrupted": corrupted}
    assert injected >= 10 and counts.get("ETIMEDOUT", 0) >= 3 and counts.get("requests_journal", 0) >= 2  # journal writes are batched: fewer on a fast machine
    assert lost == 0 and corrupted == 0


def test_a_gradient_rewritten_by_a_second_backward_keeps_its_last_value(tmp_path, reference, monkeypatch):
    """Two backward passes in a step (gradient accumulation) write each ``parameters_grad`` file twice;
    the first write of the last layer's two times out (after 0.2 s, half its bytes written) and is retried
    while the second is written by a free worker: every file must hold the accumulated gradient dump.json describes (before, the first
    write's retry landed last: the race behind test_local_disk_faults_lose_nothing's rare corruption)."""
    import errno

    import msprobe.backends._local as local_mod

    real_write_all, failed = local_mod._write_all, set()

    def write_all(fd, view):
        name = os.readlink(f"/proc/self/fd/{fd}")
        key = os.path.basename(name).split(".msprobe-tmp-")[0]
        if "Module.4.Linear.parameters_grad" in key and key not in failed:
            failed.add(key)
            os.write(fd, memoryview(view).cast("B")[: len(view) // 2])
            import time

            time.sleep(0.2)
            raise OSError(errno.ETIMEDOUT, os.strerror(errno.ETIMEDOUT))
        return real_write_all(fd, view)

    monkeypatch.setattr(local_mod, "_write_all", write_all)
    path = str(tmp_path / "d")
    dbg = _dbg(path)
    train(dbg, steps=1)
    errors = list(dbg.dumper.session.errors)
    PrecisionDebugger._reset()
    monkeypatch.undo()
    assert errors == [] and len(failed) == 2, (errors, failed)
    rank = os.path.join(path, "step0", "rank")
    ref_data, ref_tensors = reference[0]
    with open(os.path.join(rank, "dump.json")) as f:
        assert json.load(f)["data"] == ref_data
    wrong = []
    for fn, crc in sorted(ref_tensors.items()):
        t = torch.load(os.path.join(rank, "dump_tensor_data", fn), weights_only=True)
        if zlib.crc32(t.contiguous().numpy().tobytes()) != crc:
            wrong.append(fn)
    assert wrong == []


def test_denied_tensor_writes_are_logged_not_fatal(s3_server, s3_bucket_url, s3_fault_proxy, reference, figures):
    from msprobe.backends import open_store

    s3_fault_proxy.deny = re.compile(r"dump_tensor_data/")
    url = f"{s3_bucket_url}/denied"
    dbg = _dbg(url, storage_options=s3_storage_options(s3_fault_proxy.endpoint))
    train(dbg, steps=1)  # a storage error never crashes training (strict=False)
    errors = list(dbg.dumper.session.errors)
    PrecisionDebugger._reset()
    assert errors and all("could not be written" in e or "AccessDenied" in e or "Permission" in e for e in errors)
    store = open_store(url, storage_options=s3_storage_options(s3_server), read_only=True)
    missing_total = 0
    for step, (ref_data, _) in list(reference.items())[:1]:
        log = store.get(f"step{step}/rank/dump_error_info.log").decode()
        logged = {line.split("\t")[1].rsplit("/", 1)[-1] for line in log.splitlines() if line.strip()}
        written = set(store.list_dir(f"step{step}/rank/dump_tensor_data")) if store.exists(
            f"step{step}/rank/dump_tensor_data") else set()
        not_written = _tensor_names(ref_data) - written
        assert not_written and not_written <= logged, sorted(not_written - logged)[:5]
        missing_total += len(not_written)
        marker = json.loads(store.get(f"step{step}/rank/msprobe_lake.json"))
        assert marker["complete"] is False
    figures["storage permanent 403 on tensors"] = {"objects_not_written": missing_total,
                                                   "named_in_dump_error_info_log": missing_total,
                                                   "training_crashed": False}


def test_denied_with_strict_raises(s3_bucket_url, s3_fault_proxy):
    s3_fault_proxy.deny = re.compile(r"dump_tensor_data/")
    dbg = _dbg(f"{s3_bucket_url}/strict", storage_options=s3_storage_options(s3_fault_proxy.endpoint), strict=True)
    with pytest.raises(StorageError) as info:
        train(dbg, steps=1, iters=1)
    assert isinstance(info.value, MsprobeError)
    assert "dump_tensor_data/" in str(info.value)


def test_bucket_deleted_mid_run_is_not_fatal(s3_server, s3_bucket_url, _s3_admin_fs, tmp_path):
    """The bucket disappears after step 0: steps 1.. fail to write; training goes on and the
    failure is recorded at step() (session.errors), never raised (strict=False)."""
    url = f"{s3_bucket_url}/gone"
    dbg = _dbg(url, storage_options=s3_storage_options(s3_server))
    calls = {"n": 0}
    orig_step = PrecisionDebugger.step.__func__

    def step(cls):
        orig_step(cls)
        calls["n"] += 1
        if calls["n"] == 1:
            bucket = s3_bucket_url[5:]
            _s3_admin_fs.rm(bucket, recursive=True)
            _s3_admin_fs.invalidate_cache()
            assert not _s3_admin_fs.exists(bucket)

    dbg.step = step.__get__(PrecisionDebugger)
    train(dbg, steps=2, iters=1)
    errors = list(dbg.dumper.session.errors)
    assert errors, "the lost bucket went unnoticed"
    assert any("NoSuchBucket" in e or "not exist" in e or "Not" in e for e in errors), errors
