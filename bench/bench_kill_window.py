"""Records lost per SIGKILL with the default journal settings, local and s3:// (moto).

A statistics run (one step of ``--iters`` training iterations of the model of
tests/reliability/_train_child.py, the default config) is killed after a seeded random delay;
the records its MARK lines say had completed are compared with those in the journal the kill
left (plus published documents). Prints per store: trials, records completed before the kill,
lost, and the longest time between a lost record's completion and the kill (the window).

    PYTHONPATH=$PWD python bench/bench_kill_window.py [--trials 8] [--iters 30] [--seed 0] [--config JSON]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD = os.path.join(ROOT, "tests", "reliability", "_train_child.py")


def _recorded(store):
    """Record names durable after the kill: published documents and journal lines."""
    from msprobe.backends import read_journal

    names = set()
    if store.exists("step0/rank/dump.json"):
        names |= set(json.loads(store.get("step0/rank/dump.json"))["data"])
    if ".journal" in store.list_dir("step0/rank"):
        for line in read_journal(store, "step0/rank/.journal", on_truncated=lambda k, b: None):
            entry = json.loads(line)
            if "name" in entry:
                names.add(entry["name"])
    return names


def trial(url, opts, iters, delay, progress, extra):
    from msprobe.backends import open_store

    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.Popen([sys.executable, CHILD, url, "statistics", "1", json.dumps(opts), json.dumps({"iters": iters, **extra})],
                         stdout=open(progress, "w"), stderr=subprocess.DEVNULL, env=env)
    while True:
        with open(progress) as f:
            if f.read().startswith("READY"):
                break
        time.sleep(0.01)
    time.sleep(delay)
    killed_at = time.time()
    p.send_signal(signal.SIGKILL)
    p.wait()
    with open(progress) as f:
        marks = [ln.split() for ln in f.read().splitlines() if ln.startswith("MARK ") and len(ln.split()) == 4]
    if not marks:
        return None
    store = open_store(url, storage_options=opts or None)
    got = _recorded(store)
    data_order = []  # completion time of the n-th record: the first MARK whose count exceeds n
    for _, _, n, t in marks:
        while len(data_order) < int(n):
            data_order.append(float(t))
    # the names of the completed records: the reference order is the session's order, which the
    # journal and documents keep; count the completed ones missing from what survived
    completed = len(data_order)
    lost = max(0, completed - len(got))
    window = max((killed_at - data_order[i] for i in range(len(got), completed)), default=0.0)
    return completed, lost, window


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config", default="{}", help="more config as JSON, e.g. '{\"journal_flush\": 64}'")
    args = ap.parse_args()
    sys.path.insert(0, ROOT)
    from tests.conftest_s3 import _DUMMY_ENV, s3_storage_options
    from tests.reliability._outage_child import start_moto

    os.environ.update(_DUMMY_ENV)
    server, endpoint = start_moto("window")
    rng = random.Random(args.seed)
    tmp = tempfile.mkdtemp()
    for where in ("local", "s3"):
        opts = s3_storage_options(endpoint, picklable=True) if where == "s3" else {}
        total = {"trials": 0, "completed": 0, "lost": 0, "max_window_s": 0.0}
        for i in range(args.trials):
            url = f"s3://window/{where}{i}" if where == "s3" else os.path.join(tmp, f"{where}{i}")
            r = trial(url, opts, args.iters, rng.uniform(1.0, 4.0), os.path.join(tmp, f"{where}{i}.progress"),
                      json.loads(args.config))
            if r is None:
                continue
            total["trials"] += 1
            total["completed"] += r[0]
            total["lost"] += r[1]
            total["max_window_s"] = round(max(total["max_window_s"], r[2]), 3)
        print(where, json.dumps(total), flush=True)
    server.stop()


if __name__ == "__main__":
    main()
