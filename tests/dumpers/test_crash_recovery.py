"""A run killed with SIGKILL leaves a journal from which the documents are rebuilt."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading

import pytest

from msprobe.backends import open_store
from msprobe.dumpers.recover import recover_store
from msprobe.readers.validate import validate_store

CHILD = os.path.join(os.path.dirname(__file__), "_crash_child.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def run_child(dump_path, task, steps, kill_at=None, storage_options=None, extra=None):
    """Run the child to its end, or with ``kill_at = (step, n)`` SIGKILL it at the point it reports:
    after the ``n``-th record of step ``step``, once a record of that unfinished step is journaled
    (tests/dumpers/_crash_child.py). Returns the child's exit code and, when killed, how many
    records of that step it reported journaled."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    args = [sys.executable, CHILD, dump_path, task, str(steps), json.dumps(storage_options or {}),
            json.dumps(extra or {})]
    if kill_at is None:
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        return 0, None
    p = subprocess.Popen(args + [json.dumps(list(kill_at))], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         env=env, text=True)
    watchdog = threading.Timer(300, p.kill)  # a child that never reports fails the test, it does not hang it
    watchdog.start()
    lines = []
    try:
        for line in p.stdout:
            lines.append(line)
            if line.startswith("JOURNALED "):
                p.send_signal(signal.SIGKILL)
                break
    finally:
        watchdog.cancel()
    p.wait(timeout=60)
    p.stdout.close()
    assert lines and lines[-1].startswith("JOURNALED "), "".join(lines)[-3000:]
    return p.returncode, int(lines[-1].split()[2])


def records(path, step):
    with open(os.path.join(path, f"step{step}", "rank", "dump.json")) as f:
        return json.load(f)["data"]


def kill_point(reference, rng):
    """A random (step, n): the step killed, and after how many of its records (the complete run has them)."""
    step = rng.randrange(3)
    return step, rng.randint(1, len(records(reference, step)))


def kill_and_recover(path, kill_at, extra=None):
    """Run the child (tensor task, 3 steps), SIGKILL it at ``kill_at`` (a record of that step
    journaled), recover: the killed step is rebuilt (every record journaled before the kill is
    recovered, or counted as dropped when its Zarr payload was not stored), the finished ones are
    left intact. Returns the recovery results."""
    from msprobe.backends import read_journal

    rc, reported = run_child(path, "tensor", 3, kill_at=kill_at, extra=extra)
    assert rc == -signal.SIGKILL, rc
    store = open_store(path)
    names = {json.loads(line).get("name") for line in read_journal(store, f"step{kill_at[0]}/rank/.journal")} - {None}
    assert reported >= 1 and names, (reported, names)
    results = recover_store(store)
    assert [r.rank_prefix for r in results] == [f"step{kill_at[0]}/rank"], results
    r = results[0]
    assert r.written and r.records + len(r.dropped_missing_tensor) == len(names), (len(names), r.summary())
    for step in range(kill_at[0]):  # published before the kill
        assert records(path, step)
    return results


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    ref = str(tmp_path_factory.mktemp("ref"))
    run_child(ref, "tensor", 3)
    return ref


@pytest.mark.parametrize("trial", range(4))
def test_sigkill_then_recover(tmp_path, reference, trial):
    rng = random.Random(trial)
    path = str(tmp_path / "d")
    results = kill_and_recover(path, kill_point(reference, rng))
    assert not results[0].dropped_missing_tensor and results[0].records > 0  # a journaled record has its files
    report = validate_store(open_store(path, read_only=True))
    assert report.ok, [str(p) for p in report.errors]
    for r in results:
        step = int(r.rank_prefix.split("/")[0][4:])
        got = records(path, step)
        ref = records(reference, step)
        names = list(got)
        # what was recovered is what the complete run wrote first, in order, with the same values
        ref_names = [n for n in ref if n in got or not n.endswith(".parameters_grad")]
        assert names == [n for n in ref_names if n in got]
        assert all(n in ref for n in names)
        for n in names:
            if not n.endswith("parameters_grad"):
                assert got[n] == ref[n], n
        # no partial tensor file is visible under a final name
        tdir = os.path.join(path, r.rank_prefix, "dump_tensor_data")
        import torch

        for fn in os.listdir(tdir) if os.path.isdir(tdir) else []:
            assert not fn.startswith(".") and fn.endswith(".pt"), fn
            torch.load(os.path.join(tdir, fn), weights_only=True)  # complete, loadable
    import msprobe.readers

    d = msprobe.readers.open(path)
    assert d.count() == sum(len(records(path, s)) for s in d.steps)


def test_journal_round_trip_without_kill(tmp_path):
    path = str(tmp_path / "d")
    run_child(path, "statistics", 1)
    doc = records(path, 0)
    # the documents were published and the journal removed
    assert not os.listdir(os.path.join(path, "step0", "rank", ".journal")) if os.path.isdir(
        os.path.join(path, "step0", "rank", ".journal")) else True
    assert "Functional.linear.0.forward" in doc and "Module.0.Linear.forward.4" in doc


# ---------------------------------------------------------------- Zarr tensor store (spec section 21.5)
ZARR_CHILD = os.path.join(os.path.dirname(__file__), "_zarr_crash_child.py")


def _zarr_reader(path, rank_prefix):
    from msprobe.tensor_store import ZarrTensorReader

    return ZarrTensorReader(open_store(path, read_only=True), rank_prefix)


def _check_recovered_zarr(path, results):
    """validate passes, every recovered record's data_names are complete in the store and load."""
    import msprobe.readers
    from msprobe.format.model import Record

    report = validate_store(open_store(path, read_only=True))
    assert report.ok, [str(p) for p in report.errors]
    loaded = 0
    for r in results:
        doc = records(path, int(r.rank_prefix.split("/")[0][4:]))
        assert len(doc) == r.records
        reader = _zarr_reader(path, r.rank_prefix)
        for name, raw in doc.items():
            assert all(dn in reader for dn in Record(name, raw).data_names()), name
    d = msprobe.readers.open(path)
    assert d.count() == sum(len(records(path, s)) for s in d.steps)  # recovered steps and published ones
    for rec in d.records():
        for _, t in rec.tensors():
            if t.data_name:
                v = t.load("torch")
                assert list(v.shape) == list(t.shape)
                loaded += 1
    return loaded


def test_zarr_sigkill_mid_step_then_recover(tmp_path):
    """Records whose payloads are complete in the store's manifest are recovered; the others are
    dropped and counted; validate and the readers accept the result."""
    from msprobe.format.model import Record

    path = str(tmp_path / "killed")
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, ZARR_CHILD, path], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == -9, p.stderr
    # what the journal holds, and which of its data names the store's manifest says are complete
    from msprobe.backends import read_journal

    store = open_store(path)
    journaled = {}
    for line in read_journal(store, "step0/rank/.journal"):
        e = json.loads(line)
        if "name" in e:
            journaled[e["name"]] = e["record"]
    reader = _zarr_reader(path, "step0/rank")
    complete = [n for n, raw in journaled.items() if all(dn in reader for dn in Record(n, raw).data_names())]
    assert complete and len(complete) < len(journaled), (len(complete), len(journaled))

    results = recover_store(store)
    assert len(results) == 1 and results[0].written
    r = results[0]
    assert r.records == len(complete)  # 0 lost: every journaled record whose payloads are stored
    assert sorted(r.dropped_missing_tensor) == sorted(set(journaled) - set(complete))
    assert f"{len(journaled) - len(complete)} record(s) dropped" in r.summary()
    assert list(records(path, 0)) == complete  # in execution order
    assert _check_recovered_zarr(path, results) > 0


@pytest.mark.parametrize("trial", range(3))
def test_zarr_sigkill_random_point_then_recover(tmp_path, reference, trial):
    rng = random.Random(100 + trial)
    path = str(tmp_path / "d")
    results = kill_and_recover(path, kill_point(reference, rng), extra={"tensor_store": "zarr", "tensor_shard_mb": 1})
    _check_recovered_zarr(path, results)


def test_zarr_sigkill_mid_step_then_recover_s3(s3_server, s3_bucket_url):
    """The same on s3:// (moto): recovery reads the store's manifest journal segments there."""
    import msprobe.readers
    from tests.conftest_s3 import s3_storage_options

    opts = s3_storage_options(s3_server)
    url = f"{s3_bucket_url}/zarr_killed"
    env = dict(os.environ, PYTHONPATH=ROOT)
    child_opts = json.dumps(s3_storage_options(s3_server, picklable=True))
    p = subprocess.run([sys.executable, ZARR_CHILD, url, child_opts], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == -9, p.stderr
    results = recover_store(open_store(url, storage_options=opts))
    assert len(results) == 1 and results[0].records > 0 and results[0].dropped_missing_tensor, results
    store = open_store(url, storage_options=opts, read_only=True)
    report = validate_store(store)
    assert report.ok, [str(p) for p in report.errors]
    doc = json.loads(store.get("step0/rank/dump.json"))
    assert doc["dump_data_dir"].endswith("step0/rank/tensors.zarr") and len(doc["data"]) == results[0].records
    d = msprobe.readers.open(url, storage_options=opts)
    loaded = sum(1 for rec in d.records() for _, t in rec.tensors() if t.data_name and t.load("torch") is not None)
    assert d.count() == results[0].records and loaded > 0


def test_tensor_files_without_journal_get_empty_documents(tmp_path, reference):
    """Killed after the unfinished step's first tensor files were published, before its first record
    was journaled (no journal yet): recovery writes that step's documents, with no record, and keeps
    the files; the finished step is left as it was."""
    import shutil

    path = str(tmp_path / "d")
    shutil.copytree(os.path.join(reference, "step0"), os.path.join(path, "step0"))
    tdir = os.path.join(path, "step1", "rank", "dump_tensor_data")
    os.makedirs(tdir)
    src = os.path.join(reference, "step1", "rank", "dump_tensor_data")
    first = sorted(os.listdir(src))[0]
    shutil.copy(os.path.join(src, first), tdir)
    results = recover_store(open_store(path))
    assert [(r.rank_prefix, r.records, r.written) for r in results] == [("step1/rank", 0, True)]
    assert records(path, 1) == {} and records(path, 0) == records(reference, 0)
    assert os.listdir(tdir) == [first]
    report = validate_store(open_store(path, read_only=True))
    assert report.ok, [str(p) for p in report.errors]


SELF_KILL = os.path.join(os.path.dirname(__file__), "_self_kill_child.py")


def _self_kill(path, mode, opts=None):
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, SELF_KILL, path, mode, *([json.dumps(opts)] if opts else [])], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    return p.stdout


def test_zarr_default_shard_loses_only_the_window(tmp_path):
    """With the default 128 MiB shard a killed step used to lose every payload (the shard was
    never cut); now a partly filled shard is published after journal_window seconds: every call
    completed before the window is recovered with its tensors."""
    path = str(tmp_path / "d")
    before = json.loads(_self_kill(path, "zarr-window").strip().splitlines()[-1])
    results = recover_store(open_store(path))
    assert len(results) == 1 and results[0].written
    got = records(path, 0)
    assert before and set(before) <= set(got), sorted(set(before) - set(got))
    assert _check_recovered_zarr(path, results) > 0
    report = validate_store(open_store(path, read_only=True))
    assert report.ok, [str(p) for p in report.errors]


def test_killed_after_stop_recovers_to_a_valid_dump(tmp_path):
    """stop() published the documents (and the marker with their CRC32), the kill came before
    step(): recover rewrites the documents and the marker's CRC32 with them; validate passes."""
    path = str(tmp_path / "d")
    _self_kill(path, "after-stop")
    results = recover_store(open_store(path))
    assert len(results) == 1 and results[0].written and results[0].records > 0
    report = validate_store(open_store(path, read_only=True))
    assert report.ok, [str(p) for p in report.errors]
