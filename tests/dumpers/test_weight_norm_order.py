"""A weight-normed Conv1d (torch.nn.utils.parametrizations.weight_norm, as wav2vec2's positional conv):
the order of ``_WeightNorm``'s backward record, the ``ParametrizationList``'s ``parameters_grad`` and the
entries in it (spec/PRODUCER.md §20 item 43). ``_WeightNorm`` gets the parameters ``original0`` (g) and
``original1`` (v) as inputs: 26.2.0's identity node on them runs between the weight norm's node (whose
edges go v first, g second) and their gradient accumulation, so it writes the backward record first and
accumulates g before v; ours, observing the unchanged graph, writes them in that order too. Compared
live with 26.2.0 (its venv) and, without it, with the order measured there.
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import zoo_compare as zoo  # noqa: E402

SCRIPT = '''
import json, os, sys
import torch
from torch import nn
from msprobe.pytorch import PrecisionDebugger

out = sys.argv[1]
cfg = os.path.join(out, "config.json")
with open(cfg, "w") as f:
    json.dump({"task": "statistics", "dump_path": out, "level": "mix", "rank": [], "step": [],
               "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"}}, f)
dbg = PrecisionDebugger(config_path=cfg)
torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(5, 5)  # the conv's input needs a gradient, as in wav2vec2's encoder
        self.conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 4, 3, padding=1), name="weight", dim=2)

    def forward(self, x):
        return torch.relu(self.conv(self.proj(x)))


net = Net()
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for _ in range(2):
    dbg.start(net)
    net(torch.randn(2, 4, 5)).sum().backward()
    opt.step()
    opt.zero_grad()
    dbg.stop()
    dbg.step()
'''

PREFIX = "Module.conv.parametrizations.weight."
#: the backward records and parameters_grad entries of each step, as 26.2.0 writes them (measured)
MEASURED = [
    ("Module.conv.ParametrizedConv1d.parameters_grad", ["bias"]),
    (PREFIX + "ParametrizationList.backward.0", None),
    (PREFIX + "0._WeightNorm.backward.0", None),
    (PREFIX + "ParametrizationList.parameters_grad", ["original0", "original1"]),
    ("Module.conv.ParametrizedConv1d.backward.0", None),  # (its input's identity node is older)
]


def _run(python: str, out: str, ours: bool) -> list:
    os.makedirs(out)
    script = os.path.join(out, "wn.py")
    with open(script, "w") as f:
        f.write(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(OMP_NUM_THREADS="1")
    if ours:
        env["PYTHONPATH"] = ROOT
    done = subprocess.run([python, script, out], cwd=out, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = []
    for step in ("step0", "step1"):
        (path,) = glob.glob(os.path.join(out, step, "*", "dump.json"))
        with open(path) as f:
            steps.append(json.load(f)["data"])
    return steps


def _name(name: str) -> str:
    """26.2.0 numbers a parameters_grad record (``.parameters_grad.0``), ours does not (FORMAT §12)."""
    head, sep, tail = name.rpartition(".parameters_grad.")
    return head + ".parameters_grad" if sep and tail.isdigit() else name


def _backward(data: dict) -> list:
    """The conv's module backward and parameters_grad records, in order (parameters_grad: with entries)."""
    return [(_name(k), list(v) if "parameters_grad" in k else None) for k, v in data.items()
            if k.startswith("Module.conv.") and ("parameters_grad" in k or ".backward." in k)]


def _stats(value, path=""):
    """Every statistic of a record, by its place in it."""
    if isinstance(value, dict):
        if "Max" in value:
            yield path, [value.get(k) for k in ("Max", "Min", "Mean", "Norm")]
            return
        for key, each in value.items():
            yield from _stats(each, f"{path}.{key}")
    elif isinstance(value, list):
        for i, each in enumerate(value):
            yield from _stats(each, f"{path}.{i}")


def test_weight_norm_backward_order_as_measured_on_26(tmp_path):
    for data in _run(sys.executable, str(tmp_path / "ours"), ours=True):
        assert _backward(data) == MEASURED, list(data)


@pytest.mark.real_tool
def test_weight_norm_backward_order_as_live_26(tmp_path, real_tool):
    real = _run(real_tool, str(tmp_path / "real"), ours=False)
    ours = _run(sys.executable, str(tmp_path / "ours"), ours=True)
    backward_seen = False
    for theirs, mine in zip(real, ours):
        assert [_name(k) for k in mine] == [_name(k) for k in theirs]
        assert _backward(mine) == _backward(theirs)
        # from the first backward record on, 26.2.0's gradients are its own reordered sums (spec/PRODUCER.md §20 item
        # 43 (d)): of the values only what no summation order changes (null, NaN, inf or finite)
        perturbed = zoo.reached("mix", theirs, backward_seen)
        backward_seen = any(perturbed.values())
        for name, rec in theirs.items():
            want, got = dict(_stats(rec)), dict(_stats(mine[_name(name)]))
            assert list(got) == list(want), name
            for place, values in want.items():
                if perturbed[name]:
                    assert list(map(zoo.value_class, got[place])) == list(map(zoo.value_class, values)), (name, place)
                else:
                    assert got[place] == pytest.approx(values, rel=1e-5, abs=1e-6), (name, place)
