"""Observe without changing, MindSpore (issues 40 and 46, spec/PRODUCER.md §20 item 43): the three models
of ms_observer_models.py (RMSNorm-like Cells whose input also feeds a residual, Dropout on, BatchNorm),
3 steps in PyNative mode on CPU, one CPU kernel thread, fixed seeds, each run a fresh process: each
step's loss and gradients and every parameter's bytes after the last step, with our dumper at L0,
L1 and mix (statistics) and mix with md5 and tensor, compared bitwise with a run without it: every run
must be bitwise the run without the dumper.

The Cells' backward is observed through MindSpore's autograd graph (msprobe/dumpers/mindspore/_observer.py),
not through MindSpore's Cell backward hooks, which route a Cell's inputs and outputs through an identity
node: the dumper keeps those hooks only for a MindSpore without the graph in Python (``--cell-hooks``
forces them here), and there the RMSNorm model's residual input gets its gradient summed in another
order, as start() says (a RuntimeWarning naming the level). The records of both ways agree (names,
order, parents; statistics on the format's tolerance at step 0)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from ms_common import ROOT, diff_values
from ms_observer_models import MODELS, differences

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = [("L0", "statistics"), ("L1", "statistics"), ("mix", "statistics"), ("mix", "md5"), ("mix", "tensor")]
WARNING = "records the Cells' backward through MindSpore's Cell backward hooks"
_BASE: dict = {}


def _run(tmp_path, model: str, level=None, task: str = "statistics", data_mode: str = "all",
         cell_hooks: bool = False) -> tuple:
    """(fingerprint, stderr) of one fresh training process (``cell_hooks``: the dumper records the Cells'
    backward through MindSpore's Cell backward hooks)."""
    cmd = [sys.executable, os.path.join(HERE, "ms_observer_models.py"), "--model", model]
    if level:
        cmd += ["--level", level, "--task", task, "--dump-path", str(tmp_path / "dump"), "--data-mode", data_mode]
    if cell_hooks:
        cmd.append("--cell-hooks")
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
    assert WARNING not in err, err[-2000:]  # no identity node: nothing to warn of
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


def _records(root, doc: str = "dump.json") -> dict:
    """step -> dump.json's data (or construct.json) of a dump."""
    out = {}
    for path in sorted(root.rglob(doc)):
        step = next(p for p in path.parts if p.startswith("step"))
        data = json.loads(path.read_text(encoding="utf-8"))
        out[step] = data["data"] if doc == "dump.json" else data
    return out


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_cell_hooks_reroute_and_the_observer_records_what_they_record(tmp_path, tmp_path_factory, level):
    """MindSpore's Cell backward hooks (the dumper's way on a MindSpore without the autograd graph in
    Python, 26.2.0's way) change the RMSNorm model's training and warn at start(); the observer's records
    are theirs: the same records in the same order in every step, and at step 0 (before the changed sums
    reach a parameter) the same values on the format's tolerance."""
    base = _base(tmp_path_factory, "rmsnorm")
    (tmp_path / "hooks").mkdir()
    (tmp_path / "observed").mkdir()
    hooked, err = _run(tmp_path / "hooks", "rmsnorm", level, cell_hooks=True)
    assert WARNING in err, err[-2000:]
    assert hooked["losses"][0] == base["losses"][0]  # the first loss comes before any gradient
    assert hooked != base, "MindSpore's Cell hooks no longer change the training: item 43 says they do"
    run, _ = _run(tmp_path / "observed", "rmsnorm", level)
    assert run == base, differences(base, run)
    ours, theirs = _records(tmp_path / "observed" / "dump"), _records(tmp_path / "hooks" / "dump")
    assert sorted(ours) == sorted(theirs) == ["step0", "step1", "step2"]
    for step in ours:
        assert list(ours[step]) == list(theirs[step]), step
    parents = _records(tmp_path / "observed" / "dump", "construct.json")
    assert parents == _records(tmp_path / "hooks" / "dump", "construct.json")
    backward = [name for name in ours["step0"] if ".backward." in name and name.startswith("Cell.")]
    assert len(backward) >= 8, backward
    assert diff_values(ours["step0"], theirs["step0"], float_checksums=False) == []
