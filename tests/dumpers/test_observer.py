"""Observe without changing (issue 40, spec/PRODUCER.md §20 item 43): a dumped training run is bitwise the
run without the dumper. Four small models (transformers' Llama and BERT with dropout on, a BatchNorm net
with a user's full backward hook, a small ResNet with in-place ReLU and residuals), 3 steps, one torch
thread, deterministic algorithms, fixed seeds, every level and mode: the losses, each step's gradients,
every parameter's and buffer's bytes and the RNG state equal those of the run without a tool.

Before the module backward was observed (an identity autograd node on a module's inputs and outputs),
Llama and BERT at L0 and mix changed in their last bits; bench/bench_observer.py prints the full table
with 26.2.0 side by side (docs/conformance.md)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import observer_models as om  # noqa: E402

pytest.importorskip("transformers")

CONFIGS = [(level, task) for level in ("L0", "L1", "mix") for task in ("statistics", "md5", "tensor")]
_BASE: dict = {}


def _run(tmp_path, model: str, level=None, task="statistics", seeded=False) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME",)}
    env.update(PYTHONPATH=ROOT, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, os.path.join(ROOT, "bench", "observer_models.py"), "--model", model]
    cmd += ["--seed-all"] if seeded else []
    if level:
        cmd += ["--level", level, "--task", task, "--dump-path", str(tmp_path / "dump")]
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return om.fingerprint_of(out.stdout)


def _base(tmp_path_factory, model: str) -> dict:
    if model not in _BASE:
        _BASE[model] = _run(tmp_path_factory.mktemp(f"base_{model}"), model)
    return _BASE[model]


@pytest.mark.parametrize("model", om.MODELS)
@pytest.mark.parametrize("level,task", CONFIGS, ids=[f"{lv}-{t}" for lv, t in CONFIGS])
def test_dumper_changes_no_bit_of_the_training(tmp_path, tmp_path_factory, model, level, task):
    base = _base(tmp_path_factory, model)
    run = _run(tmp_path, model, level, task)
    assert om.same(base, run), om.differences(base, run)
    dump = tmp_path / "dump"
    assert dump.is_dir() and any(dump.rglob("dump.json")), "the run dumped nothing"


def test_two_runs_without_a_tool_agree(tmp_path, tmp_path_factory):
    """The premise: the runs are deterministic, so any difference is the dumper's."""
    assert om.same(_base(tmp_path_factory, "llama"), _run(tmp_path, "llama"))


@pytest.mark.parametrize("model", ["bert", "llama"])
@pytest.mark.parametrize("level", ["L0", "mix"])
def test_seed_all_then_the_dumper_changes_no_bit(tmp_path, tmp_path_factory, model, level):
    """``seed_all`` (deterministic mode, dropout removed) changes the run by design; the dumper on top of
    it changes nothing more: bitwise the seed_all run without the dumper (BERT has dropout on)."""
    key = f"seeded_{model}"
    if key not in _BASE:
        _BASE[key] = _run(tmp_path_factory.mktemp(key), model, seeded=True)
    run = _run(tmp_path, model, level, seeded=True)
    assert om.same(_BASE[key], run), om.differences(_BASE[key], run)
    assert any((tmp_path / "dump").rglob("dump.json")), "the run dumped nothing"
    if model == "bert":  # the premise: seed_all's dropout removal took effect (the loss is not the plain run's)
        assert _BASE[key]["losses"] != _base(tmp_path_factory, model)["losses"]
