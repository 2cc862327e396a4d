"""The MindSpore dump docs as tests (seeds 06.data_dump_MindSpore.md, 8.1.1 docs 06, 02 and 28):
each code example and config key/value with the records it must produce (runs in the MindSpore
venv, see ms_venv.py). The PyTorch counterpart is tests/dumpers/test_docs_pytorch.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import mindspore
import numpy as np
import pytest
from mindspore import Tensor, mint, nn
from ms_common import ROOT, pynative, read_doc  # noqa: F401 - the fixture

from msprobe.errors import ConfigError
from msprobe.mindspore import PrecisionDebugger, seed_all

pytestmark = pytest.mark.usefixtures("pynative")


class Network(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(8, 4)
        self.fc2 = nn.Dense(4, 2)

    def construct(self, x):
        return mint.nn.functional.relu(self.fc2(self.fc1(x)))


# what one forward of Network records at L1 (start(model): its Primitives too), and its backward
FWD = ["Primitive.shape_op.Shape.0.forward", "Primitive.matmul.MatMul.0.forward", "Primitive.bias_add.BiasAdd.0.forward",
       "Primitive.shape_op.Shape.1.forward", "Primitive.matmul.MatMul.1.forward", "Primitive.bias_add.BiasAdd.1.forward",
       "MintFunctional.relu.0.forward"]
BWD = ["MintFunctional.relu.0.backward", "Primitive.bias_add.BiasAdd.1.backward", "Primitive.matmul.MatMul.1.backward",
       "Primitive.bias_add.BiasAdd.0.backward", "Primitive.matmul.MatMul.0.backward"]


def config(tmp_path, level="L1", task="statistics", **section) -> str:
    cfg = {"task": task, "dump_path": str(tmp_path / "d"), "rank": [], "step": [], "level": level}
    if section:
        cfg[task] = section
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return str(p)


def names(tmp_path, step=0, doc="dump.json") -> list:
    return list(read_doc(str(tmp_path / "d"), step, doc)["data"])


def train(debugger, net, steps=2, where="after_backward", x=None):
    """7.2.1.1 '未使用 Model 高阶 API': start / forward+backward (ms.value_and_grad) / stop / step;
    ``where``: "after_backward" (the docs), "before_backward" (stop() inside the forward function,
    so before MindSpore runs the backward), "fbde" (forward_backward_dump_end() there instead)."""
    x = Tensor(np.ones((3, 8), np.float32)) if x is None else x

    def forward_fn(data):
        out = net(data)
        if where == "before_backward":
            debugger.stop()
        elif where == "fbde":
            debugger.forward_backward_dump_end()
        return out.sum()

    grad_fn = mindspore.value_and_grad(forward_fn, None, net.trainable_params())
    for _ in range(steps):
        debugger.start(net)
        grad_fn(x)
        debugger.stop()
        debugger.step()


def test_loop_start_stop_step(tmp_path):
    net = Network()
    train(PrecisionDebugger(config_path=config(tmp_path)), net)
    for step in (0, 1):
        assert names(tmp_path, step) == FWD + ["Tensor.sum.0.forward", "Tensor.sum.0.backward"] + BWD


@pytest.mark.parametrize("where", ["before_backward", "fbde"])
def test_stop_before_backward_collects_forward_and_backward(tmp_path, where):
    """6.1.2: stop() before the backward code, step() after it: the forward *and* backward of the
    calls between start and stop (forward_backward_dump_end is documented as the same as stop)."""
    net = Network()
    train(PrecisionDebugger(config_path=config(tmp_path)), net, where=where)
    for step in (0, 1):
        assert names(tmp_path, step) == FWD + BWD  # Tensor.sum ran after stop(): not dumped


def test_stop_before_backward_mix_cells(tmp_path):
    net = Network()
    train(PrecisionDebugger(config_path=config(tmp_path, level="mix")), net, where="before_backward")
    got = names(tmp_path)
    for cell in ("fc1", "fc2"):
        assert f"Cell.{cell}.Dense.forward.0" in got and f"Cell.{cell}.Dense.backward.0" in got
        assert f"Cell.{cell}.Dense.parameters_grad" in got
    assert "Tensor.sum.0.forward" not in got


def test_list_backward_name(tmp_path):
    """02 list: a full backward name ("Torch.relu.3.backward" in the docs' example) dumps that record."""
    net = Network()
    train(PrecisionDebugger(config_path=config(tmp_path, list=["MintFunctional.relu.0.backward"])), net)
    assert names(tmp_path) == ["MintFunctional.relu.0.backward"]


def test_scope_and_list_intersect(tmp_path):
    net = Network()
    cfg = config(tmp_path, scope=["Primitive.matmul.MatMul.0.forward", "MintFunctional.relu.0.forward"], list=["bias_add"])
    train(PrecisionDebugger(config_path=cfg), net)
    assert names(tmp_path) == ["Primitive.bias_add.BiasAdd.0.forward", "Primitive.bias_add.BiasAdd.1.forward"]


def test_mix_scope_ending_at_a_cell_holds_its_inner_apis(tmp_path):
    net = Network()
    train(PrecisionDebugger(config_path=config(tmp_path, level="mix",
                                               scope=["Cell.fc1.Dense.forward.0", "Cell.fc2.Dense.forward.0"])), net)
    got = names(tmp_path)
    assert got == ["Primitive.shape_op.Shape.0.forward", "Primitive.matmul.MatMul.0.forward",
                   "Primitive.bias_add.BiasAdd.0.forward", "Cell.fc1.Dense.forward.0",
                   "Primitive.shape_op.Shape.1.forward", "Primitive.matmul.MatMul.1.forward",
                   "Primitive.bias_add.BiasAdd.1.forward", "Cell.fc2.Dense.forward.0"]
    rec = read_doc(str(tmp_path / "d"))["data"]["Cell.fc2.Dense.forward.0"]
    assert "output" in rec and "parameters" in rec


@pytest.mark.parametrize("mode,want", [(["backward"], "backward"), (["forward"], "forward"),
                                       (["forward", "input"], "forward")])
def test_data_mode_direction(tmp_path, mode, want):
    """data_mode without "forward" writes no forward record (not an empty one), and the reverse."""
    net = Network()
    train(PrecisionDebugger(config_path=config(tmp_path, data_mode=mode)), net)
    data = read_doc(str(tmp_path / "d"))["data"]
    assert data and all(n.endswith("." + want) for n in data), list(data)
    assert all(rec for rec in data.values())
    if "input" in mode:
        assert all("output" not in rec for rec in data.values())


def test_overflow_nums_counts_over_the_run_and_saves_npy(tmp_path):
    """02 overflow_check: after overflow_nums overflows no more detection; the overflowing APIs'
    inputs and outputs are dumped."""
    net = Network()
    x = Tensor(np.ones((3, 8), np.float32))
    x[0, 0] = float("inf")
    cfg = config(tmp_path, task="overflow_check", overflow_nums=3)
    train(PrecisionDebugger(config_path=cfg), net, x=x)
    got = names(tmp_path)
    # Shape's input holds the inf too: it is an overflowing record like the others
    assert got == ["Primitive.shape_op.Shape.0.forward", "Primitive.matmul.MatMul.0.forward",
                   "Primitive.bias_add.BiasAdd.0.forward"]
    assert not os.path.exists(tmp_path / "d" / "step1" / "rank" / "dump.json")  # the 3 were used in step 0
    data = read_doc(str(tmp_path / "d"))["data"]
    files = sorted(os.listdir(tmp_path / "d" / "step0" / "rank" / "dump_tensor_data"))
    named = sorted(e["data_name"] for rec in data.values() for side in ("input_args", "output")
                   for e in rec[side] if isinstance(e, dict) and "data_name" in e)
    assert named == files and "Primitive.matmul.MatMul.0.forward.input.0.npy" in files
    arr = np.load(tmp_path / "d" / "step0" / "rank" / "dump_tensor_data" / "Primitive.matmul.MatMul.0.forward.input.0.npy")
    assert np.isinf(arr[0, 0])


def test_save_backward_writes_grad_record(tmp_path):
    """6.1.5 / 28: save(variable, name, save_backward=True) also writes {name}_grad.{n}.debug."""
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="debug")
    w = Tensor(np.array([1.0, 2.0, 3.0], np.float32))

    def f(x):
        y = x * 3
        PrecisionDebugger.save(y, "y")
        PrecisionDebugger.save({"key1": "value1", "key2": [1, 2]}, "dict_variable", save_backward=False)
        return (y * y).sum()

    mindspore.grad(f)(w)
    dbg.step()
    data = read_doc(str(tmp_path / "d"), name="debug.json")["data"]
    assert list(data) == ["y.0.debug", "y_grad.0.debug", "dict_variable.0.debug"]
    g = data["y_grad.0.debug"]
    assert g["type"] == "mindspore.Tensor" and g["shape"] == [3]
    assert g["Max"] == pytest.approx(18.0) and g["Min"] == pytest.approx(6.0)  # d(y*y)/dy = 2y = 2*3*w


def test_structure_at_l1_is_mix(tmp_path):
    net = Network()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dbg = PrecisionDebugger(config_path=config(tmp_path, task="structure"))
    assert dbg.config.level == "mix" and any("'mix' is used" in str(w.message) for w in caught)
    train(dbg, net, steps=1)
    construct = read_doc(str(tmp_path / "d"), name="construct.json")
    assert construct["Primitive.matmul.MatMul.1.forward"] == "Cell.fc2.Dense.forward.0"
    assert "Cell.fc2.Dense.backward.0" in construct
    assert read_doc(str(tmp_path / "d"))["data"] == {}


@pytest.mark.parametrize("task", ["free_benchmark", "grad_probe", "run_ut", "acc_check"])
def test_tasks_not_run_by_the_debugger_are_refused(tmp_path, task):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"task": task, "dump_path": str(tmp_path / "d"), "level": "L1"}))
    with pytest.raises(ConfigError, match=task):
        PrecisionDebugger(config_path=str(p))


def test_seed_all_documented_defaults(monkeypatch):
    """6.3: seed_all(seed=1234, mode=False, rm_dropout=True); mode: deterministic kernels and
    reduce collectives."""
    monkeypatch.delenv("HCCL_DETERMINISTIC", raising=False)
    seed_all()
    assert os.environ["HCCL_DETERMINISTIC"] == "False" and mindspore.get_context("deterministic") == "OFF"
    drop = mint.nn.Dropout(p=0.5)
    x = Tensor(np.ones((4, 4), np.float32))
    drop.set_train(True)
    assert np.array_equal(drop(x).asnumpy(), x.asnumpy())  # rm_dropout=True by default
    seed_all(7, mode=True)
    try:
        assert os.environ["HCCL_DETERMINISTIC"] == "True" and mindspore.get_context("deterministic") == "ON"
    finally:
        mindspore.set_context(deterministic="OFF")


def test_quick_start_without_step_is_final_at_exit(tmp_path):
    """The dynamic-graph quick start ends with stop() and no step(): the dump is final when the
    process exits (no .journal/, "final": true)."""
    script = tmp_path / "quick.py"
    script.write_text(
        "import numpy as np, mindspore\n"
        "from mindspore import Tensor, mint\n"
        "mindspore.set_context(mode=mindspore.PYNATIVE_MODE, device_target='CPU')\n"
        "from msprobe.mindspore import PrecisionDebugger\n"
        f"debugger = PrecisionDebugger(dump_path={str(tmp_path / 'd')!r}, level='L1')\n"
        "debugger.start()\n"
        "x = Tensor(np.ones((2, 2), np.float32))\n"
        "mint.add(x, x)\n"
        "debugger.stop()\n")
    env = dict(os.environ, PYTHONPATH=ROOT, GLOG_v="3")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rank = tmp_path / "d" / "step0" / "rank"
    assert list(read_doc(str(tmp_path / "d"))["data"]) == ["Mint.add.0.forward"]
    assert json.loads((rank / "msprobe_lake.json").read_text())["final"] is True
    assert not (rank / ".journal").exists()
