"""Ranks of one gloo process group (127.0.0.1) dump into one root at once: a shared local
directory (8 ranks) and the S3 server (fewer ranks: every journal flush is a PUT). Every
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

from tests.conftest_s3 import s3_storage_options  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_train_child.py")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(world, url, opts, extra):
    port = _free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, PYTHONPATH=ROOT, WORLD_SIZE=str(world), RANK=str(rank), MASTER_PORT=str(port),
                   MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, CHILD, url, "statistics", "1", json.dumps(opts),
                                       json.dumps(extra)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      env=env, text=True))
    out = []
    for p in procs:
        o, e = p.communicate(timeout=240)
        out.append((p.returncode, o, e))
    return out


def _snapshot(store):
    return {k: hashlib.md5(store.get(k)).hexdigest() for k in store.list_prefix("")}


def _check_root(store, world):
    from msprobe.format.validate import validate_store

    import msprobe.readers

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


@pytest.mark.parametrize("where,world", [("local", 8), pytest.param("s3", 2, marks=pytest.mark.s3)])
def test_ranks_share_one_root_then_refuse(where, world, tmp_path, request, figures):
    from msprobe.backends import open_store

    if where == "s3":
        s3_server = request.getfixturevalue("s3_server")
        url = request.getfixturevalue("s3_bucket_url") + "/shared"
        opts = s3_storage_options(s3_server, picklable=True)
    else:
        url, opts = str(tmp_path / "shared"), {}
    results = _run_ranks(world, url, opts, {"iters": 1})
    for rc, out, err in results:
        assert rc == 0 and "DONE" in out, err[-2000:]
    store = open_store(url, storage_options=opts or None, read_only=True)
    readers, n = _check_root(store, world)
    d = readers.open(url, storage_options=opts or None)
    assert d.count() == n * world
    before = _snapshot(store)
    again = _run_ranks(world, url, opts, {"iters": 1, "run_dir_policy": "refuse"})
    refused = sum(rc == 3 and "REFUSED" in out for rc, out, _ in again)
    assert refused == world, [(rc, out[-300:], err[-300:]) for rc, out, err in again]
    assert _snapshot(open_store(url, storage_options=opts or None, read_only=True)) == before
    figures[f"concurrency {where}"] = {"ranks": world, "records_per_rank": n, "second_run_refused": refused,
                                       "objects_unchanged": len(before)}
