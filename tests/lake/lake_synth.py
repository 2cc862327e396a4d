"""A small lake of data-parallel statistics dumps with planted answers.

Runs ``run_a``, ``run_b``, ``run_c`` x steps x ranks, written with the readers' synthetic
DumpWriter (msprobe 26.x layout, statistics computed from the arrays):

* the same weights on every rank of a step (data parallel), inputs that differ per rank,
  parameter gradients equal on every rank (after the all-reduce);
* ``run_b`` is ``run_a`` except from step ``DIV_STEP`` on: rank ``DIV_RANK``'s
  ``DIV_RECORD`` output is scaled (the planted divergence; a later record diverges on
  another rank of that step too, and every rank diverges in the step after);
* ``run_c`` holds a NaN at (``NAN_STEP``, ``NAN_RANK``, ``NAN_RECORD``) and again later,
  and an Inf at (``INF_STEP``, ``INF_RANK``, ``INF_RECORD``);
* ``run_a`` and ``run_b``: rank ``DIS_RANK``'s ``DIS_RECORD`` weight gradient in step
  ``DIS_STEP`` differs from the other ranks' (the planted rank disagreement).
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "readers"))
from readers_synth import DumpWriter

RUNS = ("run_a", "run_b", "run_c")
LAYERS = 6
DIV_STEP, DIV_RANK, DIV_RECORD = 2, 5, "Functional.linear.3.forward"
DIV_LATER_RANK, DIV_LATER_RECORD = 1, "Functional.linear.5.forward"
NAN_STEP, NAN_RANK, NAN_RECORD = 1, 3, "Functional.gelu.4.forward"
INF_STEP, INF_RANK, INF_RECORD = 3, 6, "Functional.linear.1.forward"
DIS_STEP, DIS_RANK, DIS_RECORD = 1, 6, "Module.layers.2.Linear.parameters_grad.0"
TREND_RECORD = "Module.layers.0.Linear.parameters_grad.0"


def trend_value(step: int) -> float:
    """The planted Norm of TREND_RECORD's weight gradient at ``step`` (every rank, every run)."""
    return 10.0 / (step + 1)


def _rank(path: str, run: str, step: int, rank: int) -> None:
    w = DumpWriter(path, task="statistics", level="mix")
    rng_x = np.random.default_rng(1000 * step + rank)
    x = rng_x.standard_normal((4, 8)).astype(np.float32)
    grads = []
    for i in range(LAYERS):
        wt = np.random.default_rng(100 * step + i).standard_normal((8, 8)).astype(np.float32)
        lin = f"Functional.linear.{i}.forward"
        y = x @ wt.T
        out = y
        if run == "run_b" and ((step == DIV_STEP and ((rank == DIV_RANK and lin == DIV_RECORD)
                                                      or (rank == DIV_LATER_RANK and lin == DIV_LATER_RECORD)))
                               or (step == DIV_STEP + 1 and i == 0)):
            out = y * 1.5
        if run == "run_c" and step == INF_STEP and rank == INF_RANK and lin == INF_RECORD:
            out = y.copy()
            out[0, 0] = np.inf
        mod = f"Module.layers.{i}.Linear.forward.0"
        w.add(lin, {"input_args": [w.tensor(x, None), w.tensor(wt, None, True)], "input_kwargs": {},
                    "output": [w.tensor(out, None, True)]}, parent=mod)
        gname = f"Functional.gelu.{i}.forward"
        g = np.tanh(out)
        if run == "run_c" and rank == NAN_RANK and gname == NAN_RECORD and step in (NAN_STEP, NAN_STEP + 1):
            g = g.copy()
            g[1, 2] = np.nan
        w.add(gname, {"input_args": [w.tensor(out, None, True)], "input_kwargs": {},
                      "output": [w.tensor(g, None, True)]}, parent=mod)
        w.add(mod, {"input_args": [w.tensor(x, None)], "input_kwargs": {}, "output": [w.tensor(g, None, True)]},
              parent=None)
        x = g
        gw = np.random.default_rng(7000 + 100 * step + i).standard_normal((8, 8)).astype(np.float32)
        if i == 0:
            gw = gw / np.linalg.norm(gw) * trend_value(step)
        grads.append((i, gw))
    for i, gw in reversed(grads):
        pg = f"Module.layers.{i}.Linear.parameters_grad.0"
        if run in ("run_a", "run_b") and step == DIS_STEP and rank == DIS_RANK and pg == DIS_RECORD:
            gw = gw * 1.01
        w.add(pg, {"weight": [w.tensor(gw, None)], "bias": [w.tensor(gw.sum(0), None)]})
    w.write()


def make_lake(root: str, *, runs=RUNS, steps: int = 4, ranks: int = 8) -> str:
    for run in runs:
        for step in range(steps):
            for rank in range(ranks):
                _rank(os.path.join(root, run, f"step{step}", f"rank{rank}"), run, step, rank)
    return root
