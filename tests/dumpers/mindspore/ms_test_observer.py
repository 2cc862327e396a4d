"""Observe without changing, MindSpore (issue 40, spec/PRODUCER.md §20 item 43): the three models of
ms_observer_models.py (RMSNorm-like Cells whose input also feeds a residual, Dropout on, BatchNorm),
3 steps in PyNative mode on CPU, one CPU kernel thread, fixed seeds, each run a fresh process: each
step's loss and gradients and every parameter's bytes after the last step, with our dumper at L0,
L1 and mix (statistics) and mix with md5 and tensor, compared bitwise with a run without it.

Where the dump changes the training, it is the documented exception: at L0 and mix with the backward
dumped, MindSpore's Cell backward hooks route a Cell's inputs and outputs through an identity node,
and the RMSNorm model's residual input then gets its gradient summed in another order; start() says
so (a RuntimeWarning naming the level). Every other run must be bitwise the run without the dumper."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from ms_common import ROOT
from ms_observer_models import MODELS, differences

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = [("L0", "statistics"), ("L1", "statistics"), ("mix", "statistics"), ("mix", "md5"), ("mix", "tensor")]
# (model, level) whose gradients MindSpore's Cell backward hooks sum in another order (measured): the
# case the start() warning and spec/PRODUCER.md §20 item 43 describe
REROUTED = {("rmsnorm", "L0"), ("rmsnorm", "mix")}
WARNING = "records the Cells' backward through MindSpore's Cell backward hooks"
_BASE: dict = {}


def _run(tmp_path, model: str, level=None, task: str = "statistics", data_mode: str = "all") -> tuple:
    """(fingerprint, stderr) of one fresh training process."""
    cmd = [sys.executable, os.path.join(HERE, "ms_observer_models.py"), "--model", model]
    if level:
        cmd += ["--level", level, "--task", task, "--dump-path", str(tmp_path / "dump"), "--data-mode", data_mode]
    env = dict(os.environ, PYTHONPATH=ROOT, GLOG_v="3", OMP_NUM_THREADS="1")
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def _base(tmp_path_factory, model: str) -> dict:
    if model not in _BASE:
        _BASE[model] = _run(tmp_path_factory.mktemp(f"base_{model}"), model)[0]
    return _BASE[model]


@pytest.mark.parametrize("model", MODELS)
def test_two_runs_without_a_tool_agree(tmp_path, tmp_path_factory, model):
    """The premise: the runs are deterministic (one CPU kernel thread), so a difference is the dumper's."""
    base = _base(tmp_path_factory, model)
    again = _run(tmp_path, model)[0]
    assert again == base, differences(base, again)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("level,task", CONFIGS, ids=[f"{lv}-{t}" for lv, t in CONFIGS])
def test_dumper_changes_no_bit_of_the_training(tmp_path, tmp_path_factory, model, level, task):
    base = _base(tmp_path_factory, model)
    run, err = _run(tmp_path, model, level, task)
    assert any((tmp_path / "dump").rglob("dump.json")), "the run dumped nothing"
    assert (WARNING in err) == (level != "L1"), err[-2000:]  # L0/mix hook the Cells' backward: said at start()
    if (model, level) in REROUTED:
        # the documented exception; the first loss comes before any gradient and stays the same
        assert run["losses"][0] == base["losses"][0]
        assert run != base, "the Cell hooks no longer change the training: drop the warning and item 43's exception"
        return
    assert run == base, differences(base, run)


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_forward_only_cell_dump_changes_no_bit(tmp_path, tmp_path_factory, level):
    """With data_mode ['forward'] no Cell backward hook is registered: the RMSNorm model is bitwise the
    run without the dumper, and start() warns of nothing."""
    base = _base(tmp_path_factory, "rmsnorm")
    run, err = _run(tmp_path, "rmsnorm", level, data_mode="forward")
    assert any((tmp_path / "dump").rglob("dump.json")), "the run dumped nothing"
    assert WARNING not in err, err[-2000:]
    assert run == base, differences(base, run)
