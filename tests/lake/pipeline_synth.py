"""A 2-stage pipeline over 2 ranks, as the dumpers write it (statistics, plain dump.json).

Rank 0 runs stage 0 and sends its activation to rank 1, which receives it into an empty
buffer, runs stage 1 and sends the input gradient back; rank 0 receives it and runs its
backward. Per step:

* rank 0: ``Functional.linear.0.forward`` (0), ``Distributed.send.0.forward`` (1),
  ``Distributed.recv.0.forward`` (2), ``Functional.linear.0.backward`` (3);
* rank 1: ``Distributed.recv.0.forward`` (0), ``Functional.linear.1.forward`` (1),
  ``Functional.relu.0.forward`` (2), ``Functional.linear.2.forward`` (3, where the fault is born),
  ``Functional.linear.2.backward`` (4), ``Functional.linear.1.backward`` (5),
  ``Distributed.send.0.forward`` (6).

The receive buffers hold leftover memory before the call (different in every run; a NaN in
rank 1's buffer at step 0), which is never data. ``fault``: None, ``"nan"`` (a NaN born in
rank 1's ``Functional.linear.2.forward`` at :data:`FAULT_STEP`, which reaches rank 0 with the
gradient) or ``"scale"`` (that output x3).
"""
from __future__ import annotations

import json
import os
from typing import Optional

import numpy as np

FAULT_STEP, FAULT_RANK, FAULT_RECORD, FAULT_INDEX = 1, 1, "Functional.linear.2.forward", 3
RECV_RECORD, SEND_RECORD = "Distributed.recv.0.forward", "Distributed.send.0.forward"


def _t(a: np.ndarray) -> dict:
    with np.errstate(all="ignore"):
        stats = [float(a.max()), float(a.min()), float(a.mean()), float(np.sqrt((a.astype(np.float64) ** 2).sum()))]
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": list(a.shape),
            "Max": stats[0], "Min": stats[1], "Mean": stats[2], "Norm": stats[3], "requires_grad": False}


def _int(value: int) -> dict:
    return {"type": "int", "value": value}


def _write(path: str, data: dict) -> None:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "dump.json"), "w") as f:
        json.dump({"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "data": data},
                  f, indent=1)
    for name in ("stack.json", "construct.json"):
        with open(os.path.join(path, name), "w") as f:
            json.dump({}, f)


def _step(run_dir: str, step: int, fault: Optional[str], seed: int) -> None:
    rng = np.random.default_rng(step)
    junk = np.random.default_rng(seed * 100 + step)  # leftover memory: differs between runs
    w0, w1, w2 = (np.random.default_rng(10 + i).standard_normal((8, 8)).astype(np.float32) for i in range(3))
    x = rng.standard_normal((4, 8)).astype(np.float32)
    h = x @ w0.T
    u = h @ w1.T
    r = np.maximum(u, 0)
    y = r @ w2.T
    faulty = fault is not None and step == FAULT_STEP
    if faulty and fault == "nan":
        y = y.copy()
        y[0, 0] = np.nan
    elif faulty and fault == "scale":
        y = y * 3.0
    gy = 2 * y / y.size
    gr = gy @ w2
    gh = (gr * (u > 0)) @ w1
    gx = gh @ w0
    buf1 = junk.standard_normal((4, 8)).astype(np.float32) * 1e30
    if step == 0:
        buf1[1, 1] = np.nan
    buf0 = junk.standard_normal((4, 8)).astype(np.float32) * 1e30
    rank0 = {
        "Functional.linear.0.forward": {"input_args": [_t(x), _t(w0)], "input_kwargs": {}, "output": [_t(h)]},
        SEND_RECORD: {"input_args": [_t(h)], "input_kwargs": {"dst": _int(1)}, "output": [None]},
        RECV_RECORD: {"input_args": [_t(buf0)], "input_kwargs": {"src": _int(1)}, "output": [_t(gh)]},
        "Functional.linear.0.backward": {"input": [_t(gh)], "output": [_t(gx), _t(gh.T @ x)]},
    }
    rank1 = {
        RECV_RECORD: {"input_args": [_t(buf1)], "input_kwargs": {"src": _int(0)}, "output": [_t(h)]},
        "Functional.linear.1.forward": {"input_args": [_t(h), _t(w1)], "input_kwargs": {}, "output": [_t(u)]},
        "Functional.relu.0.forward": {"input_args": [_t(u)], "input_kwargs": {}, "output": [_t(r)]},
        FAULT_RECORD: {"input_args": [_t(r), _t(w2)], "input_kwargs": {}, "output": [_t(y)]},
        "Functional.linear.2.backward": {"input": [_t(gy)], "output": [_t(gr), _t(gy.T @ r)]},
        "Functional.linear.1.backward": {"input": [_t(gr * (u > 0))], "output": [_t(gh), _t((gr * (u > 0)).T @ h)]},
        SEND_RECORD: {"input_args": [_t(gh)], "input_kwargs": {"dst": _int(0)}, "output": [None]},
    }
    _write(os.path.join(run_dir, f"step{step}", "rank0"), rank0)
    _write(os.path.join(run_dir, f"step{step}", "rank1"), rank1)


def make_run(root: str, run: str, fault: Optional[str] = None, steps: int = 3, seed: int = 0) -> str:
    """Write run ``run`` under ``root`` (``steps`` steps x 2 ranks); returns its directory."""
    run_dir = os.path.join(root, run)
    for step in range(steps):
        _step(run_dir, step, fault, seed)
    return run_dir
