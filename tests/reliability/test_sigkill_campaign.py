"""SIGKILL campaign: a seeded training run under the PyTorch dumper (statistics and tensor,
local and s3:// on the local S3 server, the default journal settings) is killed at a seeded random point
of its own reported progress (right after its READY line, or right after its k-th MARK line: the end
of a forward or of a backward), never after a number of seconds, so the kill points do not depend on the
machine's speed;
``msprobe recover`` (the CLI) rebuilds the documents, ``msprobe validate`` passes, and what
was recovered is a prefix of a complete reference run of the same script, with equal values.

CI runs 20 kills (7 statistics + 7 tensor locally, 3 + 3 on s3); MSPROBE_CRASH_SCALE=N runs N times as
many (the figures in docs/reliability.md). Trials run in
children forked from one server process that imported torch once (``--serve``).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("s3fs")

from tests.conftest_s3 import s3_storage_options  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_train_child.py")
#: trials per mode; CI: 7 + 7 local, 3 + 3 on s3 = 20 kills. MSPROBE_CRASH_SCALE=N multiplies them.
SCALE = int(os.environ.get("MSPROBE_CRASH_SCALE", "1"))
#: the default journal_window: on object stores a record completed longer ago than this (plus
#: the time of one PUT) is journaled
WINDOW = 1.0 + 0.5
MODES = [("statistics", "local"), ("tensor", "local"), ("statistics", "s3"), ("tensor", "s3")]
TRIALS = {"local": 7 * SCALE, "s3": 3 * SCALE}
#: (steps, training iterations per step): two steps locally (a kill can hit a step's publish and
#: journal deletion); each journal flush is one PUT on s3, so the s3 runs are shorter, but long
#: enough (128 records) for a flush of 64 records before their end
SHAPE = {"local": (2, 2), "s3": (1, 4)}


def _argv(url, task, where, opts):
    steps, iters = SHAPE[where]
    return [url, task, str(steps), json.dumps(opts), json.dumps({"iters": iters})]


class Server:
    def __init__(self):
        env = dict(os.environ, PYTHONPATH=ROOT)
        self.p = subprocess.Popen([sys.executable, CHILD, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  env=env, text=True, bufsize=1)

    def run(self, progress, argv, kill_at=None, then=None):
        """Run one training; with ``kill_at`` (-1: after READY, k: after the k-th MARK, from 0)
        SIGKILL it as soon as its progress file reports that point and ``then()`` (if given) is
        true. Returns (exit code, READY->DONE seconds, [(step, n, wall time)] marks, wall time of
        the kill or None)."""
        self.p.stdin.write(json.dumps([progress] + argv) + "\n")
        self.p.stdin.flush()
        pid = int(self.p.stdout.readline().split()[1])
        t0 = time.monotonic()
        while not _lines(progress) or _lines(progress)[0] != "READY":
            assert time.monotonic() - t0 < 60, "child never got ready"
            time.sleep(0.01)
        ready = time.monotonic()
        killed_at = None
        if kill_at is not None:
            while True:
                lines = _lines(progress)
                if "DONE" in lines:
                    break
                if sum(ln.startswith("MARK ") and len(ln.split()) == 4 for ln in lines) > kill_at and \
                        (then is None or then()):
                    break
                assert time.monotonic() - ready < 300, f"the child never reported MARK {kill_at}: {lines[-3:]}"
                time.sleep(0.002 if then is None else 0.02)
            killed_at = time.time()
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        line = self.p.stdout.readline().split()
        assert line[:2] == ["EXIT", str(pid)], line
        marks = [(int(x.split()[1]), int(x.split()[2]), float(x.split()[3])) for x in _lines(progress)
                 if x.startswith("MARK ") and len(x.split()) == 4]
        return int(line[2]), time.monotonic() - ready, marks, killed_at

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=30)


def _lines(path):
    try:
        with open(path) as f:
            return [ln for ln in f.read().split("\n") if ln]  # a last line without newline is kept too
    except FileNotFoundError:
        return []


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.close()


@pytest.fixture(scope="module")
def bucket(s3_server, _s3_admin_fs):
    import uuid

    name = f"crash-{uuid.uuid4().hex[:12]}"
    _s3_admin_fs.mkdir(name)
    return f"s3://{name}"


def _something_journaled(url, opts, where) -> bool:
    """A record of some step is in a journal of the store: locally a journal line (tensor mode
    journals a record once its files are written); on s3 a journal segment of step 0 (the s3 runs
    have one step; one segment per flush, every journal_window seconds or 64 records; one LIST)."""
    from msprobe.errors import StorageNotFoundError

    try:
        store = _store(url, opts or None)
        if where == "s3":
            return bool(store.list_dir("step0/rank/.journal"))
        return any(_journaled(store).values())
    except (StorageNotFoundError, FileNotFoundError):
        return False


def _store(url, opts):
    from msprobe.backends import open_store

    return open_store(url, storage_options=opts, create=False)


def _docs(store):
    """{step: data dict} of every published rank dir (single rank: 'rank')."""
    out = {}
    for d in store.list_dir(""):
        if d.startswith("step") and store.exists(f"{d}/rank/dump.json"):
            out[int(d[4:])] = json.loads(store.get(f"{d}/rank/dump.json"))["data"]
    return out


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, "-m", "msprobe", *args], capture_output=True, text=True, env=env, timeout=120)
    assert "Traceback" not in p.stderr, p.stderr
    return p


@pytest.fixture(scope="module")
def references(server, tmp_path_factory, s3_server, bucket):
    """The complete run of each mode (made when a worker first needs it: pytest-xdist runs the
    local and the s3 group on different workers)."""
    refs = {}
    base = tmp_path_factory.mktemp("refs")

    def get(task, where):
        if (task, where) not in refs:
            opts = s3_storage_options(s3_server, picklable=True) if where == "s3" else {}
            url = f"{bucket}/ref-{task}" if where == "s3" else str(base / f"ref-{task}")
            rc, took, marks, _ = server.run(str(base / f"{task}-{where}.progress"), _argv(url, task, where, opts))
            assert rc == 0
            refs[(task, where)] = (_docs(_store(url, opts or None)), took, len(marks))
        return refs[(task, where)]

    return get


def _journaled(store):
    """{step: {record names}} read from the journals a kill left, before recovery consumes them."""
    from msprobe.backends import read_journal

    out = {}
    for d in store.list_dir(""):
        if d.startswith("step") and ".journal" in store.list_dir(f"{d}/rank"):
            names = out.setdefault(int(d[4:]), set())
            for line in read_journal(store, f"{d}/rank/.journal", on_truncated=lambda k, b: None):
                entry = json.loads(line)
                if "name" in entry:
                    names.add(entry["name"])
    return out


def _recover(url, opt_args, subprocess_cli):
    """``msprobe recover``: as a subprocess (the installed entry point) or in process (same code)."""
    from msprobe.cli import main as cli_main

    if subprocess_cli:
        r = _cli("recover", url, *opt_args)
        assert r.returncode == 0, r.stderr
        return r.stdout
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert cli_main(["recover", url, *opt_args]) == 0
    return buf.getvalue()


@pytest.mark.s3
@pytest.mark.parametrize("task,where", [pytest.param(t, w, id=f"{t}-{w}", marks=pytest.mark.xdist_group(f"sigkill-{w}"))
                                        for t, w in MODES])
def test_sigkill_campaign(server, references, tmp_path, s3_server, bucket, task, where, figures):
    import msprobe.readers
    from msprobe.cli import main as cli_main
    from msprobe.errors import StorageNotFoundError

    ref_docs, _, ref_marks = references(task, where)
    opts = s3_storage_options(s3_server, picklable=True) if where == "s3" else {}
    opt_args = ["--storage-options", json.dumps(opts)] if opts else []
    fig = figures.setdefault(f"sigkill {task} {where}", {
        "trials": 0, "killed": 0, "finished_before_kill": 0, "records_reference": 0, "records_journaled": 0,
        "records_recovered": 0, "journaled_lost": 0, "records_completed_before_kill": 0, "completed_lost": 0, "completed_lost_within_window": 0,
        "tensor_in_flight_at_kill": 0, "dropped_missing_tensor": 0, "not_yet_produced": 0,
        "truncated_journal_lines": 0, "nothing_journaled_yet": 0, "seconds_training": 0.0, "seconds_checking": 0.0})
    for trial in range(TRIALS[where]):
        t_run = time.monotonic()
        rng = random.Random(f"{task}-{where}-{trial}")
        kill_at = rng.randrange(ref_marks)  # after one of the reference's MARKs (records exist then)
        url = f"{bucket}/t{trial}-{task}-{os.getpid()}-{rng.getrandbits(32)}" if where == "s3" else str(tmp_path / f"t{trial}")
        rc, _, marks, killed_at = server.run(str(tmp_path / f"t{trial}.progress"), _argv(url, task, where, opts),
                                  kill_at=kill_at,
                                  then=lambda: _something_journaled(url, opts, where))
        fig["trials"] += 1
        t_check = time.monotonic()
        fig["seconds_training"] = round(fig["seconds_training"] + t_check - t_run, 1)
        fig["records_reference"] += sum(len(v) for v in ref_docs.values())
        if rc == 0:
            fig["finished_before_kill"] += 1
        else:
            assert rc == -signal.SIGKILL, rc
            fig["killed"] += 1
        try:
            store = _store(url, opts or None)
        except StorageNotFoundError:
            raise AssertionError(f"trial {trial}: no dump at {url} after MARK {kill_at}") from None
        journaled = _journaled(store)  # what the last journal flush before the kill made durable
        # the kill came after a MARK, once a record was in a journal
        assert any(journaled.values()) or _docs(store), f"trial {trial}: nothing journaled at MARK {kill_at}"
        out = _recover(url, opt_args, subprocess_cli=trial == 0)
        dropped = truncated = 0
        for line in out.splitlines():
            if "records recovered" in line:
                truncated += int(line.split(" records recovered, ")[1].split()[0])
                dropped += int(line.split("skipped, ")[1].split()[0])
        fig["truncated_journal_lines"] += truncated
        # a journaled record always has its tensor files (tensor mode journals a record only
        # once the writer has published them): recovery never drops one
        assert dropped == 0, out
        fig["dropped_missing_tensor"] += dropped
        assert cli_main(["validate", url, "--quiet", *opt_args]) == 0, _cli("validate", url, *opt_args).stderr
        got = _docs(store)  # list_dir does not cache: it sees what recover wrote
        last_step, last_n = marks[-1][:2] if marks else (0, 0)
        # object stores: what was completed more than the journal window before the kill
        old_marks = [m for m in marks if killed_at is None or m[2] < killed_at - WINDOW] if where == "s3" else marks
        old_step, old_n = old_marks[-1][:2] if old_marks else (0, 0)
        for step, names in journaled.items():
            fig["records_journaled"] += len(names)
            lost = sorted(names - set(got.get(step, {})))
            fig["journaled_lost"] += len(lost)
            assert not lost, (step, lost)  # every record of the last journal flush is recovered
        completed = 0
        for step, data in got.items():
            ref = ref_docs[step]
            # the recovered records are the reference's, in the reference's order, with equal values
            assert list(data) == [n for n in ref if n in data]
            for n, v in data.items():
                if not n.endswith(".parameters_grad"):
                    assert v == ref[n], (step, n)
            # no hole: the journal is in execution order, so every record before the last one
            # recovered is there too
            names = [n for n in ref if not n.endswith(".parameters_grad")]
            last = max((i for i, n in enumerate(names) if n in data), default=-1)
            holes = [n for n in names[: last + 1] if n not in data]
            assert not holes, holes
            fig["records_recovered"] += len(data)
        for step in range(last_step + 1):
            ref = ref_docs[step]
            must = list(ref) if step < last_step else list(ref)[:last_n]
            missing = [n for n in must if n not in got.get(step, {})]
            completed += len(must)
            if task == "statistics":
                old_must = list(ref) if step < old_step else list(ref)[:old_n] if step == old_step else []
                late = [n for n in missing if n not in old_must]
                # local: every completed call is there; s3: every call completed before the window
                assert len(late) == len(missing), (step, [n for n in missing if n in old_must])
                assert where == "s3" or not missing, (step, missing)
                fig["completed_lost"] += len(missing)
                fig["completed_lost_within_window"] += len(late)
                for n in missing:  # how long before the kill the lost call had completed
                    i = list(ref).index(n)
                    done = min((m[2] for m in marks if m[0] == step and m[1] > i), default=None)
                    if done is not None and killed_at is not None:
                        fig["max_lost_age_s"] = round(max(fig.get("max_lost_age_s", 0.0), killed_at - done), 3)
            else:  # completed calls whose tensor files were still being written at the kill
                fig["tensor_in_flight_at_kill"] += len(missing)
        for step in range(last_step):
            assert step in got, f"step {step} completed before the kill but is missing"
        fig["records_completed_before_kill"] += completed
        fig["not_yet_produced"] += sum(len(v) for v in ref_docs.values()) - sum(len(v) for v in got.values())
        # no partially written tensor under its final name: every visible tensor file loads completely
        if task == "tensor":
            for step in got:
                prefix = f"step{step}/rank/dump_tensor_data"
                for fn in store.list_dir(prefix):
                    assert fn.endswith(".pt") and not fn.startswith("."), fn
                    torch.load(io.BytesIO(store.get(f"{prefix}/{fn}")), weights_only=True)
        # the readers open the recovered dump and load its tensors
        d = msprobe.readers.open(url, storage_options=opts or None)
        assert d.count() == sum(len(v) for v in got.values())
        if task == "tensor":
            for step, data in got.items():
                for n in list(data)[:3]:
                    rec = d.record(n, step=step)
                    if rec.input_args:
                        rec.input_args[0].load()
        fig["seconds_checking"] = round(fig["seconds_checking"] + time.monotonic() - t_check, 1)
