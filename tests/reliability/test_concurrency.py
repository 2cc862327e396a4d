"""Ranks of one gloo process group (127.0.0.1) dump into one root at once: a shared local
directory and the S3 server, 8 ranks each (forked from one process that imported torch). Every
rank<R> dir is complete and valid; a second run into the same root with
run_dir_policy="refuse" is refused on every rank and clobbers nothing."""
from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from tests.conftest_s3 import s3_storage_options

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_train_child.py")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(world, url, opts, extra, out_dir):
    """WORLD ranks at once, forked from one process that imported torch (see _train_child --ranks);
    returns [(exit status, stdout, stderr)] by rank."""
    port = _free_port()
    os.makedirs(out_dir, exist_ok=True)
    for fn in os.listdir(out_dir):
        os.unlink(os.path.join(out_dir, fn))
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, CHILD, "--ranks", str(world), str(port), out_dir, url, "statistics", "1",
                        json.dumps(opts), json.dumps(extra)], capture_output=True, text=True, env=env, timeout=300)
    rcs = {int(r): int(c) for _, r, c in (line.split() for line in p.stdout.splitlines() if line.startswith("RC "))}
    assert sorted(rcs) == list(range(world)), (p.stdout, p.stderr[-2000:])

    def read(name):
        path = os.path.join(out_dir, name)
        return open(path).read() if os.path.exists(path) else ""

    return [(rcs[r], read(f"rank{r}.out"), read(f"rank{r}.err")) for r in range(world)]


def _snapshot(store):
    return {k: hashlib.md5(store.get(k)).hexdigest() for k in store.list_prefix("")}


def _check_root(store, world):
    import msprobe.readers
    from msprobe.readers.validate import validate_store

    report = validate_store(store)
    assert report.ok, [str(p) for p in report.errors][:5]
    names = set(store.list_dir("step0"))
    assert names >= {f"rank{r}" for r in range(world)}, names
    counts = set()
    for r in range(world):
        data = json.loads(store.get(f"step0/rank{r}/dump.json"))["data"]
        marker = json.loads(store.get(f"step0/rank{r}/msprobe_lake.json"))
        assert marker["rank"] == r and marker["complete"] and marker["records"] == len(data)
        assert not store.list_prefix(f"step0/rank{r}/.journal")
        counts.add(len(data))
    assert len(counts) == 1, counts  # same seeded script on every rank
    return msprobe.readers, counts.pop()


@pytest.mark.parametrize("where,world", [("local", 8), pytest.param("s3", 8, marks=pytest.mark.s3)])
def test_ranks_share_one_root_then_refuse(where, world, tmp_path, request, figures):
    from msprobe.backends import open_store

    if where == "s3":
        s3_server = request.getfixturevalue("s3_server")
        url = request.getfixturevalue("s3_bucket_url") + "/shared"
        opts = s3_storage_options(s3_server, picklable=True)
    else:
        url, opts = str(tmp_path / "shared"), {}
    # s3: a journal flush every 8 records (each flush is a PUT; the journal is not what is tested here)
    extra = {"iters": 1, **({"journal_flush": 8} if where == "s3" else {})}
    results = _run_ranks(world, url, opts, extra, str(tmp_path / "out"))
    for rc, out, err in results:
        assert rc == 0 and "DONE" in out, err[-2000:]
    store = open_store(url, storage_options=opts or None, read_only=True)
    readers, n = _check_root(store, world)
    d = readers.open(url, storage_options=opts or None)
    assert d.count() == n * world
    before = _snapshot(store)
    again = _run_ranks(world, url, opts, {**extra, "run_dir_policy": "refuse"}, str(tmp_path / "out"))
    refused = sum(rc == 3 and "REFUSED" in out for rc, out, _ in again)
    assert refused == world, [(rc, out[-300:], err[-300:]) for rc, out, err in again]
    assert _snapshot(open_store(url, storage_options=opts or None, read_only=True)) == before
    figures[f"concurrency {where}"] = {"ranks": world, "records_per_rank": n, "second_run_refused": refused,
                                       "objects_unchanged": len(before)}
