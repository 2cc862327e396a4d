"""FSDP2 (``fully_shard``) on 2 gloo ranks under our dumper (spec/PRODUCER.md §20 item 42): training is
never broken by the dump (its sharded parameters are DTensors, no memory of their own: the statistics
read used to raise inside the module's forward hook), the parameters are written as the gathered full
tensors (shape and statistics the same on every rank, as 26.2.0 writes them), and the differences
left are said in one warning at start(model)."""
import json
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def test_fsdp2_trains_and_writes_full_parameters(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"task": "statistics", "dump_path": str(tmp_path / "dump"), "rank": [], "step": [],
                               "level": "mix", "statistics": {"scope": [], "list": [], "data_mode": ["all"],
                                                              "summary_mode": "statistics"}}))
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, os.path.join(HERE, "_fsdp2_child.py"), str(cfg)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "FSDP2 (fully_shard)" in out.stderr and "item 42" in out.stderr
    params = {}
    for step in (0, 1):
        for rank in (0, 1):
            data = json.loads((tmp_path / "dump" / f"step{step}" / f"rank{rank}" / "dump.json").read_text())["data"]
            rec = data["Module.0.FSDPLinear.forward.0"]
            weight = rec["parameters"]["weight"]
            assert weight["shape"] == [16, 8] and all(weight[k] is not None for k in ("Max", "Min", "Mean", "Norm"))
            params[(step, rank)] = weight
    for step in (0, 1):  # the full tensor's statistics: the same on both ranks
        assert params[(step, 0)] == params[(step, 1)]
    assert params[(0, 0)] != params[(1, 0)]  # SGD changed the weight between the steps


def test_a_tensor_without_memory_gets_null_statistics():
    from msprobe.dumpers.pytorch._encode import _stat_handle

    t = torch.ones(4, 4)
    t.untyped_storage().resize_(0)  # what FSDP does to a resharded parameter's unsharded copy
    assert _stat_handle(t)[1] == {"Max": None, "Min": None, "Mean": None, "Norm": None}
