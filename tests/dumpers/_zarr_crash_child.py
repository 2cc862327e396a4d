"""A tensor-mode Zarr tensor-store dump killed with SIGKILL mid-step.

Run as a script: ``DUMP_PATH [STORAGE_OPTIONS_JSON]``.

The shards of the first six layers are stored; the last layers' and ``x * 2``'s payloads
are still buffered (journaled records, incomplete payloads) when the process dies."""
import json
import os
import signal
import sys

import torch
import torch.nn as nn

from msprobe.pytorch import PrecisionDebugger

torch.manual_seed(0)
model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(8)])
opts = json.loads(sys.argv[2]) if len(sys.argv) > 2 else None
dbg = PrecisionDebugger(task="tensor", level="L1", dump_path=sys.argv[1], tensor_store="zarr", tensor_shard_mb=1,
                        journal_flush=1, storage_options=opts)
dbg.start(model)
x = torch.randn(64, 256)
for i, layer in enumerate(model):
    x = layer(x)
    if i == 5:
        dbg.dumper.session.tensor_store.wait()  # the shards of the first layers are stored
y = x * 2  # accepted, still buffered when the process dies
dbg.dumper.session.flush_journal()
os.kill(os.getpid(), signal.SIGKILL)
