"""A run killed with SIGKILL leaves a journal from which the documents are rebuilt."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")

from msprobe.backends import open_store  # noqa: E402
from msprobe.dumpers.recover import recover_store  # noqa: E402
from msprobe.format.validate import validate_store  # noqa: E402

CHILD = os.path.join(os.path.dirname(__file__), "_crash_child.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def run_child(dump_path, task, steps, kill_after=None, storage_options=None):
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.Popen([sys.executable, CHILD, dump_path, task, str(steps), json.dumps(storage_options or {})],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    assert p.stdout.readline().strip() == "READY"
    if kill_after is None:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        return None
    time.sleep(kill_after)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=60)
    return p.returncode


def records(path, step):
    with open(os.path.join(path, f"step{step}", "rank", "dump.json")) as f:
        return json.load(f)["data"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    ref = str(tmp_path_factory.mktemp("ref"))
    run_child(ref, "tensor", 3)
    return ref


@pytest.mark.parametrize("trial", range(4))
def test_sigkill_then_recover(tmp_path, reference, trial):
    rng = random.Random(trial)
    path = str(tmp_path / "d")
    rc = run_child(path, "tensor", 3, kill_after=rng.uniform(0.3, 2.5))
    if rc == 0:
        pytest.skip("the run finished before the kill")
    if not os.path.isdir(path):
        pytest.skip("killed before the dump directory existed")
    store = open_store(path)
    results = recover_store(store)
    if not results:  # tensor mode journals a record once its files are written: none was yet
        assert not any("dump.json" in k for k in store.list_prefix(""))
        pytest.skip("killed before the first record was journaled")
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
