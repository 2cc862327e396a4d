"""Static graph (GRAPH_MODE) L0 through dump points, and the graph/ + pynative/ split of jit Cells
(runs in the MindSpore venv, see ms_venv.py)."""
from __future__ import annotations

import json
import os
import warnings

import mindspore
import numpy as np
import pytest
from mindspore import Tensor, nn
from ms_common import diff_values
from ms_common import read_doc as _doc

from msprobe.errors import ConfigError
from msprobe.mindspore import MsprobeStep, PrecisionDebugger

CELLS = ("conv.Conv2d", "relu.ReLU", "flat.Flatten", "fc.Dense")


@pytest.fixture(autouse=True)
def reset():
    PrecisionDebugger._reset()
    yield
    PrecisionDebugger._reset()
    mindspore.set_context(mode=mindspore.PYNATIVE_MODE)


def _set_mode(graph: bool):
    mindspore.set_context(mode=mindspore.GRAPH_MODE if graph else mindspore.PYNATIVE_MODE, device_target="CPU")




class ConvNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, has_bias=True, weight_init="normal")
        self.relu = nn.ReLU()
        self.flat = nn.Flatten()
        self.fc = nn.Dense(2 * 4 * 4, 3)

    def construct(self, x):
        return self.fc(self.flat(self.relu(self.conv(x))))


def _nets(n):
    """``n`` ConvNets holding the same parameter values."""
    mindspore.set_seed(3)
    nets = [ConvNet() for _ in range(n)]
    for other in nets[1:]:
        for p, q in zip(nets[0].get_parameters(), other.get_parameters()):
            q.set_data(Tensor(p.asnumpy()))
    return nets


def _data():
    rng = np.random.default_rng(5)
    return (Tensor(rng.standard_normal((2, 1, 4, 4)).astype(np.float32)),
            Tensor(rng.standard_normal((2, 3)).astype(np.float32)))


def _train(net, root, graph, steps=2, task="statistics", level="L0"):
    """The documented loop: start(model), a value_and_grad + SGD step, step()."""
    _set_mode(graph)
    x, y = _data()
    loss_fn = nn.MSELoss()
    opt = nn.SGD(net.trainable_params(), 0.1)

    def forward(a, b):
        return loss_fn(net(a), b)

    grad_fn = mindspore.value_and_grad(forward, None, opt.parameters)
    dbg = PrecisionDebugger(task=task, dump_path=root, level=level)
    with warnings.catch_warnings():
        # the documented order: no "compiled before" nor "no Cell dumped" warning (PyNative's Cell backward
        # hooks are said at start(), PRODUCER.md §20 item 43: not this test's matter)
        warnings.filterwarnings("error", message="msprobe: (the|no) Cell")
        for _ in range(steps):
            dbg.start(net)
            _, grads = grad_fn(x, y)
            opt(grads)
            dbg.stop()
            dbg.step()
    PrecisionDebugger._reset()


def test_graph_l0_matches_pynative_l0(tmp_path):
    pyn, grf = _nets(2)
    _train(pyn, str(tmp_path / "p"), graph=False)
    _train(grf, str(tmp_path / "g"), graph=True)
    for step in (0, 1):
        g, p = _doc(str(tmp_path / "g"), step), _doc(str(tmp_path / "p"), step)
        assert g["framework"] == "mindspore" and g["level"] == "L0"
        gd, pd = g["data"], p["data"]
        want = [f"Cell.{c}.{d}.0" for d in ("forward", "backward") for c in CELLS]
        want += ["Cell.conv.Conv2d.parameters_grad", "Cell.fc.Dense.parameters_grad"]
        assert sorted(gd) == sorted(want), list(gd)
        assert sorted(pd) == sorted(gd)
        for name in gd:
            g_rec, p_rec = gd[name], pd[name]
            if name.endswith("parameters_grad"):  # keys in gradient arrival order, which differs
                g_rec, p_rec = dict(sorted(g_rec.items())), dict(sorted(p_rec.items()))
            assert diff_values(g_rec, p_rec, name) == [], name
        # records carry values: forward inputs/outputs/parameters, backward gradients of outputs/inputs
        fc = gd["Cell.fc.Dense.forward.0"]
        assert set(fc["parameters"]) == {"weight", "bias"} and fc["output"][0]["shape"] == [2, 3]
        assert gd["Cell.relu.ReLU.backward.0"]["input"][0]["Norm"] > 0
        assert gd["Cell.conv.Conv2d.backward.0"]["output"] == [None]  # the data needs no gradient
        gc = _doc(str(tmp_path / "g"), step, "construct.json")
        assert gc == {k: v for k, v in _doc(str(tmp_path / "p"), step, "construct.json").items() if k in gd}
    # the parameters changed between the steps (SGD ran): step 1's statistics are step 1's
    w0 = _doc(str(tmp_path / "g"), 0)["data"]["Cell.fc.Dense.forward.0"]["parameters"]["weight"]["Norm"]
    w1 = _doc(str(tmp_path / "g"), 1)["data"]["Cell.fc.Dense.forward.0"]["parameters"]["weight"]["Norm"]
    assert w0 != w1


def test_graph_top_cell_called_directly_and_stop_before_the_gradient_call(tmp_path):
    """``net(x)`` compiled as the graph's top Cell (an evaluation loop) is dumped; a gradient call
    after stop() is a new compiled call (forward and backward in one graph): it is not recorded."""
    root = str(tmp_path / "d")
    (net,) = _nets(1)
    _set_mode(True)
    x, y = _data()
    loss_fn = nn.MSELoss()

    def forward(a, b):
        return loss_fn(net(a), b)

    grad_fn = mindspore.value_and_grad(forward, None, net.trainable_params())
    dbg = PrecisionDebugger(task="statistics", dump_path=root, level="L0")
    outs = []
    for _ in range(2):
        dbg.start(net)
        outs.append(net(x).asnumpy())
        dbg.stop()
        grad_fn(x, y)
        dbg.step()
    PrecisionDebugger._reset()
    for step in (0, 1):
        data = _doc(root, step)["data"]
        assert sorted(data) == sorted(f"Cell.{c}.forward.0" for c in CELLS), list(data)
        out = data["Cell.fc.Dense.forward.0"]["output"][0]
        assert out["Max"] == pytest.approx(float(outs[step].max()), rel=1e-6)


class Pair(nn.Cell):
    def construct(self, a, b, c=None):
        return a + b, a * c


class EdgeNet(nn.Cell):
    """Two tensor inputs and a keyword argument, a tuple output, a Cell called twice."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(4, 4)
        self.act = nn.ReLU()
        self.pair = Pair()

    def construct(self, x):
        h = self.act(self.fc(x))
        s, p = self.pair(h, x, c=x)
        return self.act(s + p)


def _edge_run(root, graph):
    _set_mode(graph)
    mindspore.set_seed(4)
    net = EdgeNet()
    x = Tensor(np.random.default_rng(2).standard_normal((2, 4)).astype(np.float32))

    def forward(a):
        return net(a).sum()

    grad_fn = mindspore.value_and_grad(forward, None, net.trainable_params())
    cfg = root + ".config.json"
    with open(cfg, "w", encoding="utf-8") as f:
        json.dump({"task": "statistics", "dump_path": root, "level": "L0", "statistics": {"summary_mode": "md5"}}, f)
    dbg = PrecisionDebugger(config_path=cfg)
    dbg.start(net)
    grad_fn(x)
    dbg.stop()
    dbg.step()
    PrecisionDebugger._reset()


def test_graph_l0_call_counts_tuples_and_keywords(tmp_path):
    _edge_run(str(tmp_path / "p"), graph=False)
    _edge_run(str(tmp_path / "g"), graph=True)
    gd, pd = _doc(str(tmp_path / "g"))["data"], _doc(str(tmp_path / "p"))["data"]
    assert sorted(gd) == sorted(pd)
    assert {"Cell.act.ReLU.forward.1", "Cell.act.ReLU.backward.1"} <= set(gd)
    assert len(gd["Cell.fc.Dense.forward.0"]["output"][0]["md5"]) == 8  # summary_mode md5: CRC-32 as well
    pair = gd["Cell.pair.Pair.forward.0"]
    assert len(pair["input_args"]) == 2 and len(pair["output"]) == 2
    # known differences: keyword arguments pass undumped; the graph prunes the gradient of x
    assert pair["input_kwargs"] == {} and list(pd["Cell.pair.Pair.forward.0"]["input_kwargs"]) == ["c"]
    bw = gd["Cell.pair.Pair.backward.0"]
    assert bw["output"][0] is not None and bw["output"][1] is None
    for name in gd:
        g_rec, p_rec = gd[name], pd[name]
        if name == "Cell.pair.Pair.forward.0":
            g_rec, p_rec = dict(g_rec, input_kwargs=None), dict(p_rec, input_kwargs=None)
        if name == "Cell.pair.Pair.backward.0":
            g_rec, p_rec = dict(g_rec, output=g_rec["output"][:1]), dict(p_rec, output=p_rec["output"][:1])
        if name.endswith("parameters_grad"):
            g_rec, p_rec = dict(sorted(g_rec.items())), dict(sorted(p_rec.items()))
        assert diff_values(g_rec, p_rec, name) == [], name
    assert _doc(str(tmp_path / "g"), name="construct.json") == _doc(str(tmp_path / "p"), name="construct.json")


def test_graph_model_train_with_msprobe_step(tmp_path):
    import mindspore.dataset as ds
    from mindspore.train import Model

    import msprobe.readers

    _set_mode(True)
    root = str(tmp_path / "d")
    (net,) = _nets(1)
    rng = np.random.default_rng(1)
    data = ds.NumpySlicesDataset({"x": rng.standard_normal((4, 1, 4, 4)).astype(np.float32),
                                  "y": rng.standard_normal((4, 3)).astype(np.float32)}, shuffle=False).batch(2)
    dbg = PrecisionDebugger(task="statistics", dump_path=root, level="L0")
    dbg.start(net)  # the docs: before Model is created
    model = Model(net, loss_fn=nn.MSELoss(), optimizer=nn.SGD(net.trainable_params(), 0.01))
    model.train(1, data, callbacks=[MsprobeStep(dbg)], dataset_sink_mode=False)
    assert sorted(os.listdir(root)) == ["step0", "step1"]
    d = msprobe.readers.open(root)
    for s in (0, 1):
        names = list(_doc(root, s)["data"])
        assert sorted(names) == sorted([f"Cell.{c}.{k}.0" for k in ("forward", "backward") for c in CELLS]
                                       + ["Cell.conv.Conv2d.parameters_grad", "Cell.fc.Dense.parameters_grad"]), names
        assert d.record("Cell.fc.Dense.forward.0", step=s).output[0].shape == (2, 3)
    x0 = _doc(root, 0)["data"]["Cell.conv.Conv2d.forward.0"]["input_args"][0]["Max"]
    x1 = _doc(root, 1)["data"]["Cell.conv.Conv2d.forward.0"]["input_args"][0]["Max"]
    assert x0 != x1  # each step dumps its own batch


def test_graph_tensor_task_writes_npy(tmp_path):
    import msprobe.readers

    root = str(tmp_path / "t")
    (net,) = _nets(1)
    _train(net, root, graph=True, steps=1, task="tensor")
    data = _doc(root)["data"]
    files = sorted(os.listdir(os.path.join(root, "step0", "rank", "dump_tensor_data")))
    assert "Cell.conv.Conv2d.forward.0.parameters.weight.npy" in files
    assert "Cell.fc.Dense.backward.0.input.0.npy" in files
    for name in ("Cell.fc.Dense.forward.0", "Cell.relu.ReLU.backward.0"):
        rec = data[name]
        entry = (rec.get("output") or rec["input"])[0]
        arr = np.load(os.path.join(root, "step0", "rank", "dump_tensor_data", entry["data_name"]),
                      allow_pickle=False)
        assert list(arr.shape) == entry["shape"] and arr.dtype == np.float32
        assert float(arr.max()) == pytest.approx(entry["Max"], rel=1e-6)
    d = msprobe.readers.open(root)
    out = [t for io, t in d.record("Cell.fc.Dense.forward.0").tensors() if io == "output"][0]
    assert out.load("numpy").shape == (2, 3)


def test_graph_mode_other_levels_are_typed_errors(tmp_path):
    _set_mode(True)
    (net,) = _nets(1)
    for level in ("L1", "mix"):
        dbg = PrecisionDebugger(task="statistics", dump_path=str(tmp_path / level), level=level)
        with pytest.raises(ConfigError, match="GRAPH_MODE.*PYNATIVE_MODE"):
            dbg.start(net)
        PrecisionDebugger._reset()
    dbg = PrecisionDebugger(task="statistics", dump_path=str(tmp_path / "tr"), level="L0")
    with pytest.raises(ConfigError, match="token_range"):
        dbg.start(net, token_range=[0, 1])
    PrecisionDebugger._reset()
    with pytest.raises(ConfigError, match="Ascend"):
        PrecisionDebugger(task="statistics", dump_path=str(tmp_path / "l2"), level="L2")


def test_graph_mode_l0_off_cpu_is_a_typed_error(tmp_path, monkeypatch):
    """The points are pyfunc ops (CPU); another device_target gets a clear error, not a broken graph."""
    from msprobe.dumpers.mindspore import _dumper

    _set_mode(True)
    (net,) = _nets(1)
    dbg = PrecisionDebugger(task="statistics", dump_path=str(tmp_path / "a"), level="L0")
    monkeypatch.setattr(_dumper, "_device_target", lambda: "Ascend")
    with pytest.raises(ConfigError, match="CPU only.*'Ascend'"):
        dbg.start(net)


def test_graph_compiled_before_start_is_said(tmp_path):
    """PRODUCER.md §23.2: a graph compiled before start(model) has no dump points. A Cell called before
    start is said at start (its compile cache); a function compiled before (value_and_grad here)
    is said at stop, when no point ran in the dumped step; the dump is empty either way."""
    _set_mode(True)
    net, other = _nets(2)
    x, y = _data()
    net(x)  # compiled without points
    dbg = PrecisionDebugger(task="statistics", dump_path=str(tmp_path / "a"), level="L0")
    with pytest.warns(RuntimeWarning, match=r"Cell ConvNet was compiled .*before debugger\.start\(model\)"):
        dbg.start(net)
    net(x)
    with pytest.warns(RuntimeWarning, match="no Cell of the model was dumped") as got:
        dbg.stop()
    assert got[0].filename == __file__  # points at the caller
    dbg.step()
    assert not os.path.exists(tmp_path / "a" / "step0" / "rank" / "dump.json")
    PrecisionDebugger._reset()

    loss_fn = nn.MSELoss()

    def forward(a, b):
        return loss_fn(other(a), b)

    grad_fn = mindspore.value_and_grad(forward, None, other.trainable_params())
    grad_fn(x, y)  # the step before start
    dbg = PrecisionDebugger(task="statistics", dump_path=str(tmp_path / "b"), level="L0")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        dbg.start(other)  # the Cell itself was never called: nothing to say yet
    grad_fn(x, y)
    with pytest.warns(RuntimeWarning, match=r"no Cell of the model was dumped in step 0 .*Cell\.conv\.Conv2d.*"
                                            r"call debugger\.start\(model\) before"):
        dbg.stop()
    dbg.step()
    dbg.start(other)
    grad_fn(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        dbg.stop()  # said once
    dbg.step()
    assert not any(os.path.exists(tmp_path / "b" / f"step{s}" / "rank" / "dump.json") for s in (0, 1))


# ------------------------------------------------------------------ jit Cells in PyNative mode
class Block(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(8, 8)
        self.act = nn.ReLU()

    @mindspore.jit
    def construct(self, x):
        return self.act(self.fc(x))


class JitNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.inp = nn.Dense(4, 8)
        self.block = Block()
        self.out = nn.Dense(8, 2)

    def construct(self, x):
        return self.out(self.block(self.inp(x)))


def _jit_run(root, level):
    _set_mode(False)
    mindspore.set_seed(2)
    net = JitNet()
    x = Tensor(np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32))

    def forward(a):
        return net(a).sum()

    grad_fn = mindspore.value_and_grad(forward, None, net.trainable_params())
    dbg = PrecisionDebugger(task="statistics", dump_path=root, level=level)
    for _ in range(2):
        dbg.start(net)
        grad_fn(x)
        dbg.stop()
        dbg.step()
    PrecisionDebugger._reset()
    return net, x


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_jit_cell_split_layout(tmp_path, level):
    import msprobe.readers
    from msprobe.backends import open_store
    from msprobe.readers.validate import validate_store

    root = str(tmp_path / level)
    net, x = _jit_run(root, level)
    assert sorted(os.listdir(root)) == ["graph", "pynative"]
    jit_cells = ("block.Block", "block.fc.Dense", "block.act.ReLU")
    for s in (0, 1):
        g = _doc(root, s, split="graph")["data"]
        assert sorted(g) == sorted([f"Cell.{c}.{k}.0" for c in jit_cells for k in ("forward", "backward")]
                                   + ["Cell.block.fc.Dense.parameters_grad"]), list(g)
        p = _doc(root, s, split="pynative")["data"]
        assert not any(n.startswith("Cell.block.") for n in p)
        for c in ("inp.Dense", "out.Dense"):
            assert f"Cell.{c}.forward.0" in p and f"Cell.{c}.backward.0" in p
        if level == "mix":  # the jit call itself, as an API, with the PyNative data
            assert "Jit.Block.0.forward" in p and "Jit.Block.0.backward" in p
        gc = _doc(root, s, "construct.json", split="graph")
        assert gc["Cell.block.fc.Dense.forward.0"] == "Cell.block.Block.forward.0"
        assert gc["Cell.block.act.ReLU.backward.0"] == "Cell.block.Block.backward.0"
    # the values inside the graph are the Cells' real values
    g = _doc(root, 0, split="graph")["data"]
    inner = net.block.act(net.block.fc(net.inp(x)))  # no optimizer ran: the parameters are unchanged
    assert g["Cell.block.Block.forward.0"]["output"][0]["Max"] == pytest.approx(float(inner.max()), rel=1e-5)
    # one reader for the whole root: the two splits as sources
    d = msprobe.readers.open(root)
    assert {s.split for s in d.sources} == {"graph", "pynative"}
    assert d.record("Cell.block.fc.Dense.forward.0", step=1, split="graph").name == "Cell.block.fc.Dense.forward.0"
    with pytest.raises(Exception):
        d.record("Cell.block.fc.Dense.forward.0", split="pynative")
    graph_only = msprobe.readers.open(os.path.join(root, "graph"))  # a split root opens alone too
    assert graph_only.steps == [0, 1] and graph_only.record("Cell.block.Block.forward.0", step=0)
    report = validate_store(open_store(root))  # what `msprobe validate ROOT` runs
    assert report.ok, report.summary()
    assert sorted((r.split, r.step) for r in report.ranks) == [("graph", 0), ("graph", 1), ("pynative", 0),
                                                               ("pynative", 1)]
    from msprobe.cli import main

    assert main(["validate", "--quiet", root]) == 0


def test_jit_cell_l1_keeps_single_layout(tmp_path):
    root = str(tmp_path / "l1")
    _jit_run(root, "L1")
    assert sorted(os.listdir(root)) == ["step0", "step1"]
    names = list(_doc(root)["data"])
    assert "Jit.Block.0.forward" in names and "Jit.Block.0.backward" in names


def _jit_steps(root, steps, init_step=None, step_list=None, late=False):
    """``steps`` training steps of JitNet at mix; ``set_init_step(init_step)`` before the first
    ``start`` or (``late``) between it and the step's run."""
    _set_mode(False)
    mindspore.set_seed(2)
    net = JitNet()
    x = Tensor(np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32))
    grad_fn = mindspore.value_and_grad(lambda a: net(a).sum(), None, net.trainable_params())
    cfg = {"task": "statistics", "dump_path": root, "level": "mix"}
    if step_list is not None:
        cfg["step"] = step_list
    with open(root + ".json", "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    dbg = PrecisionDebugger(config_path=root + ".json")
    if init_step is not None and not late:
        PrecisionDebugger.set_init_step(init_step)
    for i in range(steps):
        dbg.start(net)
        if late and i == 0:
            PrecisionDebugger.set_init_step(init_step)
        grad_fn(x)
        dbg.stop()
        dbg.step()
    PrecisionDebugger._reset()


@pytest.mark.parametrize("init_step,step_list,steps,late,want", [
    (2, None, 2, False, [2, 3]), (None, [1], 3, False, [1]), (1, [2], 2, False, [2]), (3, None, 1, True, [3])])
def test_jit_split_init_step_and_step_filter(tmp_path, init_step, step_list, steps, late, want):
    """set_init_step (before the first start, or after it as a callback may) and the step list
    number and select the graph/ and pynative/ steps alike."""
    import msprobe.readers

    root = str(tmp_path / "d")
    _jit_steps(root, steps, init_step, step_list, late)
    for split in ("graph", "pynative"):
        assert sorted(os.listdir(os.path.join(root, split))) == [f"step{s}" for s in want], split
    for s in want:
        assert "Cell.block.Block.forward.0" in _doc(root, s, split="graph")["data"]
        assert "Jit.Block.0.forward" in _doc(root, s, split="pynative")["data"]
    d = msprobe.readers.open(root)
    assert d.steps == want
    for s in want:
        assert d.record("Cell.block.fc.Dense.forward.0", step=s, split="graph")
        assert d.record("Cell.inp.Dense.forward.0", step=s, split="pynative")
