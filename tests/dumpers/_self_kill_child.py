"""A tensor dump with the default config that SIGKILLs itself (run as a script).

``DUMP_PATH MODE [STORAGE_OPTIONS_JSON]``; MODE:

* ``zarr-window``: the Zarr tensor store with its default shard size: four layers' payloads,
  then an idle pause longer than ``journal_window``, then ``x * 2``, then the kill.
* ``after-stop``: stop() publishes the step's documents, the kill comes before step().
"""
import json
import os
import signal
import sys
import time

import torch
import torch.nn as nn

from msprobe.pytorch import PrecisionDebugger

path, mode = sys.argv[1], sys.argv[2]
opts = json.loads(sys.argv[3]) if len(sys.argv) > 3 else None
torch.manual_seed(0)
model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(4)])
extra = {"tensor_store": "zarr"} if mode == "zarr-window" else {}
dbg = PrecisionDebugger(task="tensor", level="L1", dump_path=path, storage_options=opts, **extra)
dbg.start(model)
x = model(torch.randn(64, 256))
if mode == "zarr-window":
    print(json.dumps(sorted(dbg.dumper.session.data)), flush=True)  # the calls completed before the pause
    time.sleep(dbg.config.journal_window + 1.5)
    y = x * 2
else:
    dbg.stop()
os.kill(os.getpid(), signal.SIGKILL)
