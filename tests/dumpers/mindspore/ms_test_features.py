"""MindSpore dumper features beyond the fixtures (runs in the MindSpore venv, see ms_venv.py)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest


def test_package_imports_under_numpy_1():
    import importlib

    assert np.__version__ < "2"
    for mod in ("msprobe", "msprobe.format", "msprobe.backends", "msprobe.readers", "msprobe.dumpers.session",
                "msprobe.compare", "msprobe.cli", "msprobe.mindspore", "msprobe.mindspore.common.utils"):
        importlib.import_module(mod)
    from msprobe.mindspore import MsprobeStep, PrecisionDebugger, seed_all  # noqa: F401
    from msprobe.mindspore.common.utils import MsprobeStep as Step2

    assert Step2 is MsprobeStep


# ---------------------------------------------------------------------------------------------
import mindspore  # noqa: E402
from mindspore import Tensor, mint, nn, ops  # noqa: E402
from ms_common import pynative  # noqa: E402,F401 - the fixture
from ms_common import read_doc as _doc  # noqa: E402

from msprobe.errors import ConfigError  # noqa: E402
from msprobe.mindspore import MsprobeStep, PrecisionDebugger, seed_all  # noqa: E402

pytestmark = pytest.mark.usefixtures("pynative")




class Small(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(4, 8)
        self.act = nn.ReLU()
        self.fc2 = nn.Dense(8, 2)

    def construct(self, x):
        return self.fc2(self.act(self.fc1(x)))


def test_bf16_tensor_lossless_and_statistics(tmp_path):
    import msprobe.readers
    from msprobe.format.stats import reference_stats

    root = str(tmp_path / "d")
    dbg = PrecisionDebugger(task="tensor", dump_path=root, level="L1")
    vals = np.array([[1.0, -2.5, 3.140625], [0.0078125, 1e-3, -7.0]], dtype=np.float32)
    x = Tensor(vals).astype(mindspore.bfloat16)
    dbg.start()
    y = mint.add(x, 1.0)
    dbg.stop()
    dbg.step()
    rec = _doc(root)["data"]["Mint.add.0.forward"]
    entry = rec["input_args"][0]
    assert entry["type"] == "mindspore.Tensor" and entry["dtype"] == "BFloat16" and entry["shape"] == [2, 3]
    bf = x.astype(mindspore.float32).asnumpy()
    want = reference_stats(bf, framework="mindspore", logical_dtype="bfloat16")
    assert [entry[k] for k in ("Max", "Min", "Mean", "Norm")] == pytest.approx(list(want), rel=1e-6)
    # the file holds the raw bfloat16 bits; the reader decodes them by the record's dtype and shape
    path = os.path.join(root, "step0", "rank", "dump_tensor_data", entry["data_name"])
    with open(path, "rb") as f:
        raw = f.read()
    assert raw == x.view(mindspore.int16).asnumpy().tobytes()
    r = msprobe.readers.open(root).record("Mint.add.0.forward")
    loaded = {p: t.load("numpy") for _, t in r.tensors() for p in [t.path]}
    np.testing.assert_array_equal(loaded[next(iter(loaded))], bf)
    out = [t for io, t in r.tensors() if io == "output"][0].load("numpy")
    np.testing.assert_array_equal(out, y.astype(mindspore.float32).asnumpy())


def test_md5_and_int_bool_entries(tmp_path):
    import zlib

    root = str(tmp_path / "d")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"task": "statistics", "dump_path": root, "level": "L1",
                               "statistics": {"summary_mode": "md5"}}))
    dbg = PrecisionDebugger(config_path=str(cfg))
    a = Tensor(np.arange(6, dtype=np.int32).reshape(2, 3))
    dbg.start()
    mint.eq(a, 2)
    dbg.stop()
    dbg.step()
    rec = _doc(root)["data"]["Mint.eq.0.forward"]
    ia, out = rec["input_args"][0], rec["output"][0]
    assert ia["dtype"] == "Int32" and ia["Max"] == 5.0 and ia["Mean"] == 2.5  # MindSpore: ints as float32
    assert ia["md5"] == f"{zlib.crc32(a.asnumpy().tobytes()) & 0xFFFFFFFF:08x}"
    assert out["dtype"] == "Bool" and out["Max"] is True and out["Min"] is False
    assert rec["input_args"][1] == {"type": "int", "value": 2}


def test_msprobe_step_with_model_train(tmp_path):
    import mindspore.dataset as ds
    from mindspore.train import Model

    seed_all(7)
    root = str(tmp_path / "d")
    net = Small()
    dbg = PrecisionDebugger(task="statistics", dump_path=root, level="mix", model=net, step=[0, 2])
    data = ds.NumpySlicesDataset({"x": np.random.randn(6, 4).astype(np.float32),
                                  "y": np.random.randn(6, 2).astype(np.float32)}, shuffle=False).batch(2)
    model = Model(net, loss_fn=nn.MSELoss(), optimizer=nn.SGD(net.trainable_params(), 0.01))
    model.train(1, data, callbacks=[MsprobeStep(dbg)], dataset_sink_mode=False)
    steps = sorted(os.listdir(root))
    assert steps == ["step0", "step2"]  # step 1 is not in "step": not written
    for s in (0, 2):
        data_ = _doc(root, s)["data"]
        names = list(data_)
        for cell in ("fc1.Dense", "act.ReLU", "fc2.Dense"):
            assert f"Cell.{cell}.forward.0" in names and f"Cell.{cell}.backward.0" in names, names
        assert "Cell.fc1.Dense.parameters_grad" in names
        assert any(n.startswith("Primitive.matmul.MatMul.") and n.endswith(".backward") for n in names)
        construct = _doc(root, s, "construct.json")
        assert construct["Primitive.matmul.MatMul.0.forward"] == "Cell.fc1.Dense.forward.0"
        assert construct["Cell.fc1.Dense.backward.0"] is None


def test_seed_all_and_rm_dropout():
    seed_all(123, mode=False, rm_dropout=True)
    a = ops.standard_normal((3,)).asnumpy()
    r = np.random.rand()
    seed_all(123)
    np.testing.assert_array_equal(ops.standard_normal((3,)).asnumpy(), a)
    assert np.random.rand() == r
    x = Tensor(np.ones((4, 4), np.float32))
    np.testing.assert_array_equal(mint.nn.functional.dropout(x, p=0.9, training=True).asnumpy(), x.asnumpy())
    out, mask = ops.Dropout(keep_prob=0.1)(x)
    np.testing.assert_array_equal(out.asnumpy(), x.asnumpy())
    np.testing.assert_array_equal(mint.nn.Dropout(p=0.9)(x).asnumpy(), x.asnumpy())
    with pytest.raises(ConfigError):
        seed_all(-1)


def test_debug_save(tmp_path):
    root = str(tmp_path / "d")
    dbg = PrecisionDebugger(task="statistics", dump_path=root, level="debug")
    x = Tensor(np.array([1.0, 2.0, 3.0], np.float32))
    dbg.start()
    PrecisionDebugger.save(x, "act")
    PrecisionDebugger.save({"a": x * 2, "n": 3}, "act")
    dbg.stop()
    dbg.step()
    doc = _doc(root, name="debug.json")
    assert doc["framework"] == "mindspore" and doc["level"] == "debug"
    assert doc["data"]["act.0.debug"]["Max"] == 3.0
    assert doc["data"]["act.1.debug"]["a"]["Norm"] == pytest.approx(2 * np.sqrt(14), rel=1e-6)
    assert doc["data"]["act.1.debug"]["n"] == {"type": "int", "value": 3}


def test_graph_mode_and_l2_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="Ascend"):
        PrecisionDebugger(task="statistics", dump_path=str(tmp_path / "a"), level="L2")
    PrecisionDebugger._reset()
    dbg = PrecisionDebugger(task="statistics", dump_path=str(tmp_path / "b"), level="L1")
    mindspore.set_context(mode=mindspore.GRAPH_MODE)
    with pytest.raises(ConfigError, match="PYNATIVE_MODE"):
        dbg.start()


def test_l0_needs_a_cell(tmp_path):
    dbg = PrecisionDebugger(task="statistics", dump_path=str(tmp_path / "a"), level="L0")
    with pytest.raises(ConfigError, match="model"):
        dbg.start()
    with pytest.raises(ConfigError, match="nn.Cell"):
        dbg.start(model=object())


def test_dump_through_an_fsspec_store():
    """Everything goes through msprobe.backends: an fsspec memory:// root works like a local one."""
    import msprobe.readers

    url = "memory://ms-dump-test/run"
    dbg = PrecisionDebugger(task="tensor", dump_path=url, level="L1")
    x = Tensor(np.array([[1.0, -1.0]], np.float32))
    dbg.start()
    ops.relu(x)
    dbg.stop()
    dbg.step()
    r = msprobe.readers.open(url).record("Functional.relu.0.forward")
    out = [t for io, t in r.tensors() if io == "output"][0]
    np.testing.assert_array_equal(out.load("numpy"), np.array([[1.0, 0.0]], np.float32))


def test_uninstall_restores_apis(tmp_path):
    orig_add, orig_mul = mint.add, Tensor.__mul__
    dbg = PrecisionDebugger(task="statistics", dump_path=str(tmp_path / "a"), level="L1")
    dbg.start()
    assert mint.add is not orig_add
    dbg.stop()
    PrecisionDebugger._reset()
    assert mint.add is orig_add and Tensor.__mul__ is orig_mul


class JitBlock(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(4, 4)

    @mindspore.jit
    def construct(self, x):
        return ops.relu(self.fc(x)) * 2


@mindspore.jit
def jit_add(x, y):
    return mint.add(x, y)


def test_jit_cells_and_functions_recorded_as_jit(tmp_path):
    root = str(tmp_path / "d")
    net = JitBlock()
    x = Tensor(np.ones((2, 4), np.float32))

    def fwd(x):
        return jit_add(net(x), x).sum()

    grad_fn = mindspore.value_and_grad(fwd, None, net.trainable_params())
    want, want_grads = grad_fn(x)
    dbg = PrecisionDebugger(task="statistics", dump_path=root, level="L1")
    dbg.start(model=net)
    got, got_grads = grad_fn(x)
    dbg.stop()
    dbg.step()
    assert float(got.asnumpy()) == float(want.asnumpy())  # the dump does not change the computation
    for a, b in zip(got_grads, want_grads):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())
    data = _doc(root)["data"]
    assert list(data) == ["Jit.JitBlock.0.forward", "Jit.jit_add.0.forward", "Tensor.sum.0.forward",
                          "Tensor.sum.0.backward", "Jit.jit_add.0.backward", "Jit.JitBlock.0.backward"]
    out = net(x).asnumpy()
    fwd_rec = data["Jit.JitBlock.0.forward"]
    assert fwd_rec["output"][0]["Max"] == pytest.approx(float(out.max()), rel=1e-6)
    assert len(fwd_rec["input_args"]) == 1  # the Cell itself is not an argument
    assert data["Jit.jit_add.0.backward"]["input"][0]["shape"] == [2, 4]
