"""SIGKILL campaign for the Zarr tensor store (``tensor_store: "zarr"``): kill a tensor-mode
training run at seeded random points, then ``msprobe recover``, and count per trial

* journaled: records in the crash journal the kill left (what the last journal flush made durable);
* durable: those of them whose every data_name the store's manifest (group attributes merged with
  the manifest journal, spec/FORMAT.md 21.5) lists as stored;
* recovered, dropped (recover's report), lost = durable records not recovered (must be 0);
* loaded: tensors of the recovered records that ``msprobe.readers`` loads; validate must pass.

    PYTHONPATH=$PWD python bench/bench_zarr_crash.py [--trials 10] [--seed 0]
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

CHILD = r"""
import sys, torch, torch.nn as nn, torch.nn.functional as F
from msprobe.pytorch import PrecisionDebugger
torch.manual_seed(0)
model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(256, 256), nn.GELU())], nn.Linear(256, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
dbg = PrecisionDebugger(task="tensor", level="mix", dump_path=sys.argv[1], tensor_store="zarr", tensor_shard_mb=1,
                        journal_flush=1)
print("READY", flush=True)
for step in range(4):
    dbg.start(model)
    for _ in range(3):
        loss = F.cross_entropy(model(torch.randn(64, 256)), torch.zeros(64, dtype=torch.long))
        loss.backward()
    opt.step(); opt.zero_grad()
    dbg.stop(); dbg.step()
print("DONE", flush=True)
"""


def trial(path: str, kill_after: float) -> dict:
    import msprobe.readers
    from msprobe.backends import open_store, read_journal
    from msprobe.dumpers.recover import find_journals, recover_store
    from msprobe.format.model import Record
    from msprobe.readers.validate import validate_store
    from msprobe.tensor_store import ZarrTensorReader

    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.Popen([sys.executable, "-c", CHILD, path], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         env=env, text=True)
    assert p.stdout.readline().strip() == "READY"
    time.sleep(kill_after)
    p.send_signal(signal.SIGKILL)
    p.wait()
    row = {"killed": p.returncode == -9, "journaled": 0, "durable": 0, "recovered": 0, "dropped": 0, "lost": 0,
           "loaded": 0, "validate_ok": True}
    if not os.path.isdir(path):
        return row
    store = open_store(path)
    durable: dict = {}
    for rank_prefix in find_journals(store):
        journaled = {}
        for line in read_journal(store, f"{rank_prefix}/.journal", on_truncated=lambda k, b: None):
            e = json.loads(line)
            if "name" in e:
                journaled[e["name"]] = e["record"]
        try:
            names = set(ZarrTensorReader(store, rank_prefix).names())
        except Exception:
            names = set()
        row["journaled"] += len(journaled)
        durable[rank_prefix] = {n for n, raw in journaled.items() if set(Record(n, raw).data_names()) <= names}
        row["durable"] += len(durable[rank_prefix])
    for r in recover_store(store):
        if r.stale_journal:
            continue
        with open(os.path.join(path, r.rank_prefix, "dump.json")) as f:
            got = set(json.load(f)["data"])
        row["recovered"] += r.records
        row["dropped"] += len(r.dropped_missing_tensor)
        row["lost"] += len(durable.get(r.rank_prefix, set()) - got)
    row["validate_ok"] = validate_store(open_store(path, read_only=True)).ok
    for rec in msprobe.readers.open(path).records():
        for _, t in rec.tensors():
            if t.data_name:
                t.load("numpy")
                row["loaded"] += 1
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-delay", type=float, default=6.0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    total: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.trials):
            row = trial(os.path.join(tmp, f"t{i}"), rng.uniform(0.3, args.max_delay))
            print(json.dumps(row), flush=True)
            for k, v in row.items():
                total[k] = total.get(k, 0) + int(v)
    print("total", json.dumps(total))


if __name__ == "__main__":
    main()
