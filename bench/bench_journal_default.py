"""Step time of a statistics dump with journal_flush ARG (JSON: null = the default, a record per
write() locally; 64 = the old default), best of 4 steps of 20 iterations of 8 x Linear(64)+GELU.

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD python bench/bench_journal_default.py null
"""
import json
import sys
import tempfile
import time

import torch
import torch.nn as nn

from msprobe.pytorch import PrecisionDebugger

jf = json.loads(sys.argv[1])
torch.manual_seed(0)
model = nn.Sequential(*[m for _ in range(8) for m in (nn.Linear(64, 64), nn.GELU())])
d = tempfile.mkdtemp()
dbg = PrecisionDebugger(task="statistics", level="L1", dump_path=d, journal_flush=jf)
best = 1e9
for step in range(4):
    t = time.perf_counter()
    dbg.start()
    for _ in range(20):
        model(torch.randn(16, 64)).sum().backward()
    dbg.stop(); dbg.step()
    best = min(best, time.perf_counter() - t)
print(jf, "records/step", len(json.load(open(f"{d}/step0/rank/dump.json"))["data"]), "best step s", round(best, 3))
