"""Failing storage never stalls training or loses a dump silently (issue 19, items 1-3).

Real faults only: an unwritable path, an S3 endpoint without credentials or where nothing
listens, a moto server stopped in the middle of a run, a 3 MiB tmpfs that fills up.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
import warnings

import pytest

torch = pytest.importorskip("torch")

from msprobe.errors import StorageError  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUTAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_outage_child.py")

pytestmark = pytest.mark.usefixtures("fresh_debugger")


def _train(dbg, steps=2, iters=4, width=64):
    import torch.nn as nn

    torch.manual_seed(0)
    model = nn.Linear(width, width)
    times = []
    for _ in range(steps):
        t = time.monotonic()
        dbg.start(model)
        for _ in range(iters):
            model(torch.randn(8, width)).sum().backward()
        dbg.stop()
        dbg.step()
        times.append(time.monotonic() - t)
    return times


# -- item 1: silent loss --------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/proc/forbidden/x", "/dev/null/x"])
def test_unwritable_local_path_fails_at_debugger(fresh_debugger, path):
    with pytest.raises(StorageError, match=re.escape(f"dump_path {path} is not writable")) as info:
        fresh_debugger(task="statistics", dump_path=path)
    assert "\n" not in str(info.value) and ("No such file" in str(info.value) or "not a directory" in str(info.value))
    assert not os.path.exists("/proc/forbidden")


def test_probe_leaves_nothing_behind(fresh_debugger, tmp_path):
    fresh_debugger(task="statistics", dump_path=str(tmp_path / "not" / "yet"))
    assert os.listdir(tmp_path) == []  # the probe directory is gone, the dump dir is made when written


@pytest.mark.s3
def test_s3_without_credentials_fails_at_debugger(fresh_debugger, s3_server, s3_bucket_url, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SECURITY_TOKEN", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    opts = {"client_kwargs": {"endpoint_url": s3_server}, "skip_instance_cache": True}
    with pytest.raises(StorageError, match=rf"dump_path {s3_bucket_url}/run is not writable: .*NoCredentials"):
        fresh_debugger(task="statistics", dump_path=f"{s3_bucket_url}/run", storage_options=opts)


@pytest.mark.s3
def test_missing_bucket_fails_at_debugger(fresh_debugger, s3_server):
    from tests.conftest_s3 import s3_storage_options

    url = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/run"
    with pytest.raises(StorageError, match=rf"dump_path {url} is not writable: .*bucket does not exist"):
        fresh_debugger(task="statistics", dump_path=url, storage_options=s3_storage_options(s3_server))


@pytest.mark.s3
def test_denied_writes_are_said_once_and_counted(fresh_debugger, s3_server, s3_bucket_url, s3_fault_proxy, caplog):
    """Every tensor PUT gets 403: one warning (logging and warnings) at the first failure, the
    count of objects not written at the end, every one of them in dump_error_info.log."""
    from msprobe.backends import open_store
    from msprobe.dumpers.session import StorageFailureWarning
    from tests.conftest_s3 import s3_storage_options

    s3_fault_proxy.deny = re.compile(r"dump_tensor_data/")
    url = f"{s3_bucket_url}/denied"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        dbg = fresh_debugger(task="tensor", level="L1", dump_path=url,
                             storage_options=s3_storage_options(s3_fault_proxy.endpoint))
        _train(dbg, steps=2)
        session = dbg.dumper.session
        fresh_debugger._reset()
    ours = [str(w.message) for w in seen if issubclass(w.category, StorageFailureWarning)]
    assert len(ours) == 2, ours  # the first failure, and the summary at the end
    assert "could not write" in ours[0] and "dump_tensor_data/" in ours[0] and "Access Denied" in ours[0]
    n = session.objects_not_written
    assert n == s3_fault_proxy.counts["deny"] and n >= 16
    assert ours[1].startswith(f"msprobe: {n} object(s) of the dump could not be written to {url}")
    logged = [r.getMessage() for r in caplog.records if r.name == "msprobe.dump" and r.levelname == "WARNING"]
    assert logged == ours
    store = open_store(url, storage_options=s3_storage_options(s3_server), read_only=True)
    lines = []
    for step in (0, 1):
        lines += store.get(f"step{step}/rank/dump_error_info.log").decode().splitlines()
    assert len(lines) == n and all("\tdump_tensor_data/" not in ln and "/dump_tensor_data/" in ln for ln in lines)


# -- item 2: stalls -------------------------------------------------------------------------

def _outage(mode, steps, stop_after, extra):
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONWARNINGS="default")
    p = subprocess.run([sys.executable, OUTAGE, mode, str(steps), str(stop_after), json.dumps(extra)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


@pytest.mark.s3
def test_refused_connections_fail_at_debugger_within_the_deadline(figures):
    out, err = _outage("refuse", 1, 0, {"storage_timeout": 3})
    assert out["init_error"].startswith("StorageError: dump_path s3://outage/run is not writable")
    assert "Could not connect" in out["init_error"]
    assert out["init_s"] < 3 + 2, out  # one deadline, retries included (it was 148 s for one stop())
    assert "never retrieved" not in err and "Traceback" not in err
    figures["refused connections at PrecisionDebugger(), storage_timeout=3"] = {"seconds": round(out["init_s"], 2)}


@pytest.mark.s3
@pytest.mark.parametrize("mode", ["stop", "hang"])
def test_outage_mid_run_bounds_every_step(figures, mode):
    """The moto server is stopped (or stops answering) before step 2 of 6: no step takes much
    more than one deadline, the failure is said once, the count at the end; no
    unretrieved-task tracebacks."""
    deadline = 3
    out, err = _outage(mode, 6, 2, {"storage_timeout": deadline})
    steps = out["steps"]
    assert max(steps[2:]) < deadline + 3, steps
    assert sum(steps[3:]) < deadline + 3, steps  # the breaker: later steps do not wait again
    assert out["not_written"] > 0 and out["close_s"] < deadline + 1
    assert err.count("msprobe: could not write") == 2, err[-3000:]  # logging + warnings, once each
    assert err.count(f"msprobe: {out['not_written']} object(s) of the dump could not be written") == 2
    assert "never retrieved" not in err and "Traceback" not in err, err[-3000:]
    figures[f"outage ({mode}) mid-run, storage_timeout=3"] = {"step_seconds": [round(s, 2) for s in steps],
                                                         "objects_not_written": out["not_written"]}


# -- item 3: disk full -----------------------------------------------------------------------

@pytest.fixture
def tmpfs_3m(tmp_path):
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {p.stderr.strip()}")
    try:
        yield str(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_stops_tensors_keeps_records(fresh_debugger, tmpfs_3m, tmp_path, figures):
    """A tensor dump into a 3 MiB tmpfs: ENOSPC is not retried (training is not slowed down),
    tensor files stop, every record of every step is still in dump.json, said once."""
    from msprobe.backends import open_store
    from msprobe.dumpers.session import StorageFailureWarning
    from msprobe.readers.validate import validate_store

    ref = fresh_debugger(task="tensor", level="L1", dump_path=str(tmp_path / "ref"))
    ref_times = _train(ref, steps=3, iters=8, width=256)
    fresh_debugger._reset()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        dbg = fresh_debugger(task="tensor", level="L1", dump_path=f"{tmpfs_3m}/d")
        times = _train(dbg, steps=3, iters=8, width=256)
        session = dbg.dumper.session
        fresh_debugger._reset()
    ours = [str(w.message) for w in seen if issubclass(w.category, StorageFailureWarning)]
    assert len(ours) == 2 and "the disk is full" in ours[0] and "No space left" in ours[0], ours
    assert session.tensors_off and session.objects_not_written > 0
    assert sum(times) < 3 * sum(ref_times) + 3, (times, ref_times)  # no ENOSPC retries
    for step in range(3):
        with open(tmp_path / "ref" / f"step{step}" / "rank" / "dump.json") as f:
            want = json.load(f)["data"]
        with open(f"{tmpfs_3m}/d/step{step}/rank/dump.json") as f:
            got = json.load(f)["data"]
        assert list(got) == list(want)  # every record, in order
        with open(f"{tmpfs_3m}/d/step{step}/rank/msprobe_lake.json") as f:
            assert json.load(f)["complete"] is False
    report = validate_store(open_store(f"{tmpfs_3m}/d", read_only=True))
    missing = [p for p in report.errors if "has no file" in p.message]
    assert missing and len(missing) == len(report.errors)  # the files not written, nothing else
    figures["3 MiB tmpfs, tensor dump"] = {"seconds": round(sum(times), 2), "reference_seconds": round(sum(ref_times), 2),
                                          "records_kept": report.records, "tensor_files_not_written": len(missing)}


def test_probe_while_another_rank_makes_the_dump_path(fresh_debugger, tmp_path, monkeypatch):
    """Ranks share one dump_path: a rank's probe must accept the directory that another rank's
    process makes between the probe's two looks at it (once: 'exists and is not a directory',
    which failed a 4-rank launch). The other rank is a real process, run at that very moment."""
    path = str(tmp_path / "run" / "tp2pp2")
    real_isdir = os.path.isdir
    made = []

    def isdir_then_other_rank(p):
        answer = real_isdir(p)
        if os.path.abspath(p) == path and not made:
            subprocess.run([sys.executable, "-c", f"import os; os.makedirs({path!r})"], check=True)
            made.append(p)
        return answer

    monkeypatch.setattr(os.path, "isdir", isdir_then_other_rank)
    fresh_debugger(task="statistics", dump_path=path)
    monkeypatch.undo()
    assert made and os.path.isdir(path) and os.listdir(path) == []
