"""The main job: dump a real training run of a small transformer and read it back.

``python -m msprobe demo [--dump-path URL] [--task statistics|tensor] [--level mix|L1|L0] [--steps N]``
trains a tiny GPT-like model for a few steps under ``PrecisionDebugger``, then
validates the dump against the spec and summarizes it through ``msprobe.readers``.
"""
from __future__ import annotations

import math
import time
from typing import Optional

import msprobe.readers
from msprobe.backends import open_store
from msprobe.errors import MissingDependencyError, require
from msprobe.format.nonfinite import NonFiniteTracker, describe
from msprobe.format.stats import NORM
from msprobe.pytorch import PrecisionDebugger, seed_all
from msprobe.readers.validate import validate_store


def build_model(vocab: int = 100, hidden: int = 32, heads: int = 2, layers: int = 2, seq: int = 16):
    import torch
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(hidden)
            self.attn = nn.MultiheadAttention(hidden, heads, batch_first=True)
            self.ln2 = nn.LayerNorm(hidden)
            self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

        def forward(self, x, mask):
            normed = self.ln1(x)
            attended, _ = self.attn(normed, normed, normed, attn_mask=mask, need_weights=False)
            x = x + attended
            return x + self.mlp(self.ln2(x))

    class TinyGPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, hidden)
            self.pos = nn.Embedding(seq, hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(hidden)
            self.head = nn.Linear(hidden, vocab)

        def forward(self, ids):
            length = ids.shape[1]
            mask = torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)
            x = self.tok(ids) + self.pos(torch.arange(length))
            for block in self.blocks:
                x = block(x, mask)
            return self.head(self.ln_f(x))

    return TinyGPT()


def run_demo(dump_path: str = "./demo_dump", task: str = "statistics", level: str = "mix", steps: int = 3,
             storage_options: Optional[dict] = None, quiet: bool = False) -> dict:
    """Train, dump, validate and read back; needs only the ``torch`` extra (the tabular read-back
    through ``to_pandas()`` runs when the ``parquet`` extra is installed, and says so when not)."""
    torch = require("torch", "torch")
    import torch.nn.functional as F

    say = (lambda *arg: None) if quiet else print
    seed_all(1234)
    model = build_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dbg = PrecisionDebugger(task=task, level=level, dump_path=dump_path, storage_options=storage_options)
    say(f"training {steps} steps of a tiny GPT under PrecisionDebugger(task={task!r}, level={level!r}) "
        f"-> {dump_path}")
    t0 = time.perf_counter()
    losses = []
    for step in range(steps):
        ids = torch.randint(0, 100, (4, 16))
        dbg.start(model)
        logits = model(ids)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, 100), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        dbg.stop()
        dbg.step()
        losses.append(loss.item())
        say(f"  step {step}: loss {losses[-1]:.4f}")
    dbg.dumper.close()
    elapsed = time.perf_counter() - t0

    report = validate_store(open_store(dump_path, storage_options=storage_options, read_only=True, create=False))
    say(report.summary())
    doc = msprobe.readers.open(dump_path, storage_options=storage_options)
    n_tensors, nonfinite, first, outputs = _walk_records(doc)
    ranks = ("one process (no torch.distributed rank: rank directory 'rank')" if doc.ranks == [None]
             else ", ".join("-" if r is None else str(r) for r in doc.ranks))
    say(f"read back: steps {doc.steps}, ranks {ranks}, framework {doc.framework}, task {doc.task}, level {doc.level}; "
        f"{doc.count()} records, {n_tensors} tensors")
    say(f"non-finite values: {describe(nonfinite)}")
    for kind in ("nan", "inf"):
        if first[kind] is not None:
            say(f"  first {'NaN' if kind == 'nan' else '+/-Inf'}: step {first[kind][0]} {first[kind][1]} {first[kind][2]}")
    if outputs:
        say(f"largest forward outputs by {NORM.key}:")
        for norm, step, name, path, shape in sorted(outputs, key=lambda o: -o[0])[:3]:
            say(f"  step {step} {name} {path}: shape {shape} {NORM.key} {norm:.4g}")
    rows = None
    try:
        df = doc.to_pandas()
    except MissingDependencyError:
        say("table read-back (to_pandas, the Parquet index) skipped: pip install 'msprobe-lake[parquet]' adds it")
    else:
        rows = len(df)
        say(f"to_pandas(): {rows} rows, one per tensor argument")
    rec = doc.record("Functional.linear.0.forward", step=0)
    tensor = rec.input_args[0]
    say(f"Functional.linear.0.forward input 0: dtype {tensor.dtype}, shape {list(tensor.shape)}, "
        f"Max {tensor.max:.4g}, Min {tensor.min:.4g}, parent {rec.parent_name or '-'}")
    if task == "tensor":
        arr = tensor.load()
        assert math.isclose(float(arr.max()), tensor.max, rel_tol=1e-6)
        say(f"  loaded its tensor from storage: max {float(arr.max()):.4g} (matches the record)")
    say(f"done in {elapsed:.1f}s (dump) — valid: {report.ok}")
    say("next:")
    for line in next_commands(dump_path):
        say(f"  {line}")
    return {"ok": report.ok, "records": doc.count(), "tensors": n_tensors, "rows": rows, "losses": losses,
            "nonfinite": nonfinite}


def next_commands(dump_path: str) -> list:
    """The commands a user runs next on the demo's dump (printed at its end)."""
    import shlex

    p, m = shlex.quote(dump_path), _msprobe_command()
    return [f"{m} ls {p}                      # steps, ranks, record counts",
            f"{m} ls {p} --records --step 0   # the record names",
            f"{m} show {p} 'Module.head*' --step 0   # records by glob, with statistics",
            f"{m} compare {p} {p} -o ./cmp    # compare two dumps (here: the dump with itself)"]


def _msprobe_command() -> str:
    """How to call this installation's ``msprobe``: its name when the PATH finds this one, else
    its path (``.venv/bin/msprobe`` after ``scripts/demo.sh``)."""
    import os
    import shutil
    import sys

    mine = os.path.join(os.path.dirname(sys.executable), "msprobe")
    if not os.path.exists(mine):
        return "msprobe"
    found = shutil.which("msprobe")
    if found is not None and os.path.realpath(found) == os.path.realpath(mine):
        return "msprobe"
    rel = os.path.relpath(mine)
    return rel if not rel.startswith("..") else mine


def _walk_records(doc) -> tuple:
    """(tensor count, {"nan"/"inf"/"masked": tensors}, first NaN / first Inf, finite forward outputs)
    from the records themselves (no pandas needed)."""
    counts = {"nan": 0, "inf": 0, "masked": 0}
    first: dict = {"nan": None, "inf": None}
    outputs = []
    n_tensors = 0
    trackers: dict = {}
    for rec in doc.iter_records():  # in execution order within each (run, step, rank directory)
        tracker = trackers.setdefault((rec.source.run, rec.step, rec.rank_dir, rec.source.split), NonFiniteTracker())
        tracker.record(rec.name)
        for io, tensor in rec.tensors():
            n_tensors += 1
            kind = tracker.see(io, tensor.path, (tensor.max, tensor.min, tensor.mean, tensor.norm), tensor.dtype,
                               tensor.shape)
            if kind in first and first[kind] is None:
                first[kind] = (rec.step, rec.name, tensor.path)
            if (io == "output" and rec.direction == "forward" and isinstance(tensor.norm, float)
                    and math.isfinite(tensor.norm)):
                outputs.append((tensor.norm, rec.step, rec.name, tensor.path, list(tensor.shape)))
    for tracker in trackers.values():
        for k, v in tracker.counts.items():
            counts[k] += v
    return n_tensors, counts, first, outputs
