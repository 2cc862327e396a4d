"""A kill while the journal of a published step is being deleted leaves some of its segments;
recovery must keep the complete documents instead of rebuilding them from the leftovers."""
from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("torch")

from msprobe.backends import open_store
from msprobe.dumpers.recover import recover_store
from msprobe.pytorch import PrecisionDebugger
from msprobe.readers.validate import validate_store
from tests.reliability._model import train

pytestmark = pytest.mark.usefixtures("fresh_debugger")


def test_leftover_segments_of_a_published_step_are_stale(tmp_path):
    path = str(tmp_path / "d")
    train(PrecisionDebugger(task="statistics", level="mix", dump_path=path, journal_flush=1), steps=1)
    rank = os.path.join(path, "step0", "rank")
    with open(os.path.join(rank, "dump.json"), "rb") as f:
        published = f.read()
    data = json.loads(published)["data"]
    assert json.load(open(os.path.join(rank, "msprobe_lake.json")))["final"] is True
    # what a kill during the deletion leaves: the last segments (here: the last record's line)
    name = list(data)[-1]
    os.makedirs(os.path.join(rank, ".journal"), exist_ok=True)
    with open(os.path.join(rank, ".journal", "000250.jsonl"), "w") as f:
        f.write(json.dumps({"name": name, "record": data[name]}) + "\n")
    results = recover_store(open_store(path))
    assert [r.stale_journal for r in results] == [True]
    with open(os.path.join(rank, "dump.json"), "rb") as f:
        assert f.read() == published
    assert not os.listdir(os.path.join(rank, ".journal"))
    assert validate_store(open_store(path, read_only=True)).ok


def test_a_new_run_journal_in_a_finished_dir_is_recovered(tmp_path):
    """run_dir_policy='overwrite': a second run's journal in a dir whose marker says final
    is not mistaken for stale leftovers (the new run drops the old final marker)."""
    path = str(tmp_path / "d")
    train(PrecisionDebugger(task="statistics", level="mix", dump_path=path, journal_flush=1), steps=1)
    PrecisionDebugger._reset()
    dbg = PrecisionDebugger(task="statistics", level="mix", dump_path=path, journal_flush=1)
    import torch

    dbg.start()
    torch.ones(3).add(1)
    # "killed" here: nothing published by this run, its journal holds one record
    rank = os.path.join(path, "step0", "rank")
    assert not os.path.exists(os.path.join(rank, "msprobe_lake.json"))
    dbg.dumper.enabled = False
    dbg.dumper.patcher.uninstall()
    results = recover_store(open_store(path))
    assert [r.stale_journal for r in results] == [False] and results[0].records >= 1
    data = json.load(open(os.path.join(rank, "dump.json")))["data"]
    assert "Torch.add.0.forward" in data or "Tensor.add.0.forward" in data
    dbg.dumper.session._dirty = False
    dbg.dumper.session._journal = None
