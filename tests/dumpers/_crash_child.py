"""A training run that the crash tests kill with SIGKILL (run as a script).

``DUMP_PATH TASK STEPS STORAGE_OPTIONS_JSON [EXTRA_CONFIG_JSON [PAUSE_AT_JSON]]``. With
``PAUSE_AT = [step, n]``, the child stops after the ``n``-th record of step ``step`` is added, waits
until at least one record of that (unfinished) step is in its crash journal, prints
``JOURNALED <step> <records journaled>`` and sleeps: the parent kills it at that reported point,
whatever the machine's speed. The writer threads (tensor files, Zarr shards) go on meanwhile.
"""
import json
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from msprobe.pytorch import PrecisionDebugger, seed_all


def pause_after(session, step: int, n: int) -> None:
    """Hold the training thread after the ``n``-th record of step ``step`` once one record of that
    step is journaled; say so on stdout (see the module docstring)."""
    add_record = session.add_record
    added = [0]

    def hooked(*args, **kwargs):
        add_record(*args, **kwargs)
        if session.current_step != step:
            return
        added[0] += 1
        if added[0] < n:
            return
        deadline = time.monotonic() + 120
        while session.records_journaled == 0:
            if time.monotonic() > deadline:
                print(f"NOTHING JOURNALED in step {step} after {n} records", flush=True)
                sys.exit(3)
            time.sleep(0.002)
        print(f"JOURNALED {step} {session.records_journaled}", flush=True)
        while True:
            time.sleep(60)

    session.add_record = hooked


def main():
    dump_path, task, steps, storage_options = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
    extra = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}  # more config (e.g. the Zarr tensor store)
    seed_all(3)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16), nn.LayerNorm(16), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dbg = PrecisionDebugger(task=task, level="mix", dump_path=dump_path, storage_options=storage_options or None,
                            journal_flush=1, **extra)
    if len(sys.argv) > 6:
        pause_after(dbg.dumper.session, *json.loads(sys.argv[6]))
    print("READY", flush=True)
    for step in range(steps):
        x = torch.randn(8, 16)
        dbg.start(model)
        for _ in range(5):
            y = model(x)
            loss = F.cross_entropy(y, torch.zeros(8, dtype=torch.long))
            loss.backward()
        opt.step()
        opt.zero_grad()
        dbg.stop()
        dbg.step()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
