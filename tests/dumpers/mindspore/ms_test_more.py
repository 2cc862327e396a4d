"""More documented MindSpore dumper features (runs in the MindSpore venv, see ms_venv.py):
overflow_check, summary_mode xor/md5, collectives on a real 2-worker CPU cluster,
register_custom_api/restore_custom_api, set_init_step, token_range, dump_error_info.log, and a
dump to s3://."""
from __future__ import annotations

import json
import os
import sys
import types
import zlib

import mindspore
import mindspore.numpy as mnp
import numpy as np
import pytest
from mindspore import Tensor, mint, nn, ops
from ms_common import (
    pynative,  # noqa: F401 - the fixture
    run_cluster,
)
from ms_common import read_doc as _doc

import msprobe.readers
from msprobe.errors import ConfigError
from msprobe.format.stats import xor64
from msprobe.mindspore import PrecisionDebugger

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


pytestmark = pytest.mark.usefixtures("pynative")




def _config(tmp_path, **cfg) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def _f32(*values) -> Tensor:
    return Tensor(np.array(values, np.float32))


# ------------------------------------------------------------------------------ overflow_check
@pytest.mark.parametrize("nums, want", [
    (1, ["Tensor.__truediv__.0.forward"]),
    (2, ["Tensor.__truediv__.0.forward", "MintFunctional.relu.0.forward"]),
    (-1, ["Tensor.__truediv__.0.forward", "MintFunctional.relu.0.forward", "MintFunctional.relu.1.forward",
          "Mint.isfinite.0.forward"]),
])
def test_overflow_check_l1_keeps_only_overflowing_apis(tmp_path, nums, want):
    root = str(tmp_path / "d")
    dbg = PrecisionDebugger(config_path=_config(tmp_path, task="overflow_check", dump_path=root, level="L1",
                                                overflow_check={"overflow_nums": nums}))
    x = _f32(1.0, 2.0, 3.0)
    dbg.start()
    mint.exp(x)  # finite: not dumped
    y = x / _f32(0.0, 1.0, 0.0)  # [inf, 2, inf]
    mint.nn.functional.relu(y)
    mint.add(x, 1.0)  # finite again
    mint.nn.functional.relu(y)
    mint.isfinite(y)  # a Bool output, but its input holds Inf
    dbg.stop()
    dbg.step()
    doc = _doc(root)
    assert doc["task"] == "overflow_check"
    data = doc["data"]
    assert list(data) == want
    out = data["Tensor.__truediv__.0.forward"]["output"][0]
    assert out["Max"] == float("inf") and out["Min"] == 2.0 and out["dtype"] == "Float32"
    # the overflowing APIs' inputs and outputs are saved (docs: overflow_check dumps them), nothing else
    files = os.listdir(os.path.join(root, "step0", "rank", "dump_tensor_data"))
    assert files and all(f.endswith(".npy") and any(f.startswith(w + ".") for w in want) for f in files), files


class Boom(nn.Cell):
    def construct(self, x):
        return x * 1e30 * 1e30  # float32 overflow: Inf


class OverflowNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(3, 3)
        self.boom = Boom()
        self.act = nn.ReLU()

    def construct(self, x):
        return self.act(self.boom(self.fc(x)))


def test_overflow_check_l0_keeps_only_overflowing_cells(tmp_path):
    root = str(tmp_path / "d")
    net = OverflowNet()
    net.fc.weight.set_data(Tensor(np.eye(3, dtype=np.float32)))
    net.fc.bias.set_data(Tensor(np.zeros(3, np.float32)))
    dbg = PrecisionDebugger(config_path=_config(tmp_path, task="overflow_check", dump_path=root, level="L0",
                                                overflow_check={"overflow_nums": 1}))
    dbg.start(model=net)
    out = net(_f32(1.0, 2.0, 3.0).reshape(1, 3))
    dbg.stop()
    dbg.step()
    assert np.isinf(out.asnumpy()).all()
    data = _doc(root)["data"]
    # fc is finite; boom is the first overflow; with overflow_nums 1 act (Inf in, Inf out) is not checked
    assert list(data) == ["Cell.boom.Boom.forward.0"]
    rec = data["Cell.boom.Boom.forward.0"]
    assert rec["input_args"][0]["Max"] == 3.0 and rec["output"][0]["Max"] == float("inf")


class PrimBoom(nn.Cell):
    def __init__(self):
        super().__init__()
        self.mul = ops.Mul()

    def construct(self, x):
        return mint.exp(self.mul(x, 1e30))  # Mul is finite (1e30), exp overflows


def test_overflow_check_l1_primitive_ops(tmp_path):
    """Primitive ops are checked too (spec/PRODUCER.md §20 item 21): here the overflow is in mint.exp."""
    root = str(tmp_path / "d")
    net = PrimBoom()
    dbg = PrecisionDebugger(config_path=_config(tmp_path, task="overflow_check", dump_path=root, level="L1",
                                                overflow_check={"overflow_nums": -1}))
    dbg.start(model=net)
    net(_f32(1.0, -1.0))
    net.mul(_f32(1e30), 1e30)  # a Primitive call that overflows (1e60 in float32)
    dbg.stop()
    dbg.step()
    data = _doc(root)["data"]
    assert list(data) == ["Mint.exp.0.forward", "Primitive.mul.Mul.1.forward"]
    assert data["Mint.exp.0.forward"]["output"][0]["Min"] == 0.0
    assert data["Primitive.mul.Mul.1.forward"]["output"][0]["Max"] == float("inf")


def test_overflow_check_backward(tmp_path):
    """An Inf that appears only in a gradient: the backward record is the one dumped."""
    root = str(tmp_path / "d")
    dbg = PrecisionDebugger(config_path=_config(tmp_path, task="overflow_check", dump_path=root, level="L1",
                                                overflow_check={"overflow_nums": -1}))

    def f(x):
        return mint.sqrt(x).sum()  # d/dx sqrt(x) = inf at 0

    grad_fn = mindspore.grad(f)
    dbg.start()
    g = grad_fn(_f32(0.0, 4.0))
    dbg.stop()
    dbg.step()
    assert np.isinf(g.asnumpy()[0])
    data = _doc(root)["data"]
    assert list(data) == ["Mint.sqrt.0.backward"]
    assert data["Mint.sqrt.0.backward"]["output"][0]["Max"] == float("inf")


# ------------------------------------------------------------------------------ summary_mode
def _one_call(tmp_path, mode, *tensors):
    root = str(tmp_path / mode)
    PrecisionDebugger._reset()
    dbg = PrecisionDebugger(config_path=_config(tmp_path, task="statistics", dump_path=root, level="L1",
                                                statistics={"summary_mode": mode}))
    dbg.start()
    for t in tensors:
        mint.add(t, t)
    dbg.stop()
    dbg.step()
    return root, _doc(root)["data"]


def test_summary_mode_xor_md5_statistics(tmp_path):
    a = Tensor(np.array([[1.5, -2.0, 3.25], [0.0, -0.5, 8.0]], np.float32))
    b = Tensor(np.array([1.0, -2.5, 3.140625], np.float32)).astype(mindspore.bfloat16)
    c = Tensor(np.array([7, -3, 2**20], np.int32))
    s = Tensor(np.float32(2.5))  # 0-d
    tensors = (a, b, c, s)
    raw = [a.asnumpy(), b.view(mindspore.int16).asnumpy(), c.asnumpy()]

    root, xor = _one_call(tmp_path, "xor", *tensors)
    entries = [xor[f"Mint.add.{i}.forward"]["input_args"][0] for i in range(4)]
    for e, r in zip(entries, raw):
        assert e["md5"] == f"0x{xor64(np.ascontiguousarray(r)) & (2**64 - 1):016x}"
        assert "Max" not in e and "Norm" not in e  # xor replaces the statistics
    assert entries[1]["dtype"] == "BFloat16"
    assert entries[3]["md5"] == 2.5  # a 0-d float: its value, as msprobe 26 writes it
    assert entries[0]["md5"] != xor["Mint.add.0.forward"]["output"][0]["md5"]  # 2a differs from a
    rec = msprobe.readers.open(root).record("Mint.add.0.forward")
    assert rec.input_args[0].md5 == entries[0]["md5"]

    _, md5 = _one_call(tmp_path, "md5", *tensors)
    entries = [md5[f"Mint.add.{i}.forward"]["input_args"][0] for i in range(3)]
    for e, r in zip(entries, raw):
        assert e["md5"] == f"{zlib.crc32(np.ascontiguousarray(r).tobytes()) & 0xFFFFFFFF:08x}"
    assert entries[0]["Max"] == 8.0 and entries[1]["Max"] == pytest.approx(3.140625)  # md5 keeps the statistics

    _, stats = _one_call(tmp_path, "statistics", *tensors)
    e = stats["Mint.add.0.forward"]["input_args"][0]
    assert "md5" not in e and e["Min"] == -2.0 and e["Mean"] == pytest.approx(10.25 / 6)

    PrecisionDebugger._reset()
    with pytest.raises(ConfigError, match="summary_mode"):
        PrecisionDebugger(config_path=_config(tmp_path, task="statistics", dump_path=root, level="L1",
                                              statistics={"summary_mode": "sha1"}))


# ------------------------------------------------------------------------------ collectives
def test_collectives_on_a_two_worker_cpu_cluster(tmp_path):
    """mint.distributed and communication.comm_func on a real MindSpore CPU cluster (scheduler +
    2 workers on 127.0.0.1, the framework's mccl backend)."""
    root = str(tmp_path / "d")
    run_cluster(sys.executable, os.path.join(HERE, "ms_comm_worker.py"), [root], str(tmp_path))
    results = [json.load(open(f"{root}.result{r}.json", encoding="utf-8")) for r in (0, 1)]
    dump = msprobe.readers.open(root)
    assert sorted(dump.ranks) == [0, 1]
    for r, res in enumerate(results):
        assert res["world"] == 2 and res["all_reduce"] == [3.0, 6.0] and res["broadcast"] == [5.0, 7.0]
        assert res["all_reduce_async"] == [3.0, 3.0]
        data = _doc(root, rank=f"rank{r}")["data"]
        names = [n for n in data if "Distributed." in n]
        assert not [n for n in data if n.endswith(".backward")]  # collectives are forward-only
        assert names[:5] == ["MintDistributed.all_reduce.0.forward", "MintDistributed.broadcast.0.forward",
                             "MintDistributed.all_reduce.1.forward",  # (barrier: no tensors, not wrapped)
                             "MintDistributed.all_gather.0.forward", "Distributed.broadcast.0.forward"], names
        # in-place collectives: input = before the call (this rank's), output = the arguments after it
        ar = data["MintDistributed.all_reduce.0.forward"]
        assert ar["input_args"][0]["Max"] == 2.0 * (r + 1) and ar["output"][0]["Max"] == 6.0
        bc = data["MintDistributed.broadcast.0.forward"]
        assert bc["input_args"][0]["Max"] == 7.0 * (r + 1) and bc["output"][0]["Min"] == 5.0
        assert bc["output"][1] == {"type": "int", "value": 0}
        ar_async = data["MintDistributed.all_reduce.1.forward"]
        assert ar_async["input_kwargs"]["async_op"] == {"type": "bool", "value": True}
        assert ar_async["output"][0]["Max"] == 3.0 and ar_async["input_args"][0]["Max"] == float(r + 1)
        assert res["all_gather"] == [[1.0, -1.0], [2.0, -2.0]]
        ag = data["MintDistributed.all_gather.0.forward"]  # the list: zeros before, gathered after
        assert [e["Max"] for e in ag["input_args"][0]] == [0.0, 0.0]
        assert [e["Max"] for e in ag["output"][0]] == [1.0, 2.0] and ag["output"][1]["Min"] == -1.0 * (r + 1)
        cb = data["Distributed.broadcast.0.forward"]  # comm_func returns a new tensor: the output
        assert cb["input_args"][0]["Max"] == 3.0 * (r + 1) and cb["output"][0]["Max"] == 3.0
        assert res["comm_broadcast"] == [3.0]
        if "comm_all_reduce_error" in res:  # no CPU kernel for comm_func.all_reduce in MindSpore 2.10.0:
            assert "InnerCommAllReduce" in res["comm_all_reduce_error"], res  # the error reaches the caller
            # (read by the dump's statistics first, it is raised to the script, not swallowed)
            assert data["Distributed.all_reduce.0.forward"]["input_args"][0]["Max"] == 1.0
        else:  # the kernel may also fail without a word (CPU wheel): the dump holds what the caller got
            rec = data["Distributed.all_reduce.0.forward"]
            assert rec["input_args"][0]["Max"] == 1.0, (rec, res)
            assert rec["output"][0]["Max"] == max(res["comm_all_reduce"]), (rec, res)


def test_ops_communication_writes_its_arguments_while_mindspore_says_in_place():
    """``mindspore.ops.communication`` calls write into their arguments unless ``set_comm_ops_inplace(False)``
    (asked at each call): the record's output is then the arguments after the call, else the value returned
    (as for ``communication.comm_func``); ``mint.distributed``'s always write in place."""
    from mindspore.ops.communication import set_comm_ops_inplace

    from msprobe.dumpers.mindspore._dumper import _mutates, _writes_arguments

    assert _writes_arguments("Communication.all_reduce") and _mutates("Communication.all_reduce")
    assert _writes_arguments("MintDistributed.all_reduce") and not _writes_arguments("Distributed.all_reduce")
    set_comm_ops_inplace(False, ["all_reduce"])
    try:
        assert not _writes_arguments("Communication.all_reduce") and not _mutates("Communication.all_reduce")
        assert _writes_arguments("Communication.broadcast")
    finally:
        set_comm_ops_inplace(True, ["all_reduce"])
    assert _writes_arguments("Communication.all_reduce")


# ------------------------------------------------------------------------------ custom APIs
def test_register_and_restore_custom_api(tmp_path):
    root = str(tmp_path / "d")
    mylib = types.ModuleType("mylib")

    def scale(x, k):
        return mint.mul(x, k)  # an inner listed API: not recorded on its own

    mylib.scale = scale
    orig_dot = mnp.dot
    dbg = PrecisionDebugger(task="statistics", dump_path=root, level="L1")
    dbg.register_custom_api(mylib, "scale")  # default prefix: the package name
    dbg.register_custom_api(mnp, "dot", "MsNumpy")  # mindspore.numpy: not wrapped by default
    x = _f32(1.0, -2.0)
    dbg.start()
    assert mnp.dot is not orig_dot
    mylib.scale(x, 3.0)
    mnp.dot(x, x)
    dbg.restore_custom_api(mnp, "dot")
    assert mnp.dot is orig_dot
    mnp.dot(x, x)  # restored: not recorded as MsNumpy.dot
    dbg.stop()
    dbg.step()
    data = _doc(root)["data"]
    names = list(data)
    assert names[:2] == ["mylib.scale.0.forward", "MsNumpy.dot.0.forward"]  # inner APIs not recorded
    # after restore_custom_api mnp.dot is plain again: only the listed APIs it calls are recorded
    assert names[2:] and not [n for n in names[2:] if n.startswith(("MsNumpy.", "mylib."))], names
    assert data["mylib.scale.0.forward"]["output"][0]["Min"] == -6.0
    assert data["mylib.scale.0.forward"]["input_args"][1] == {"type": "float", "value": 3.0}
    assert data["MsNumpy.dot.0.forward"]["output"][0]["Max"] == 5.0
    assert msprobe.readers.open(root).record("mylib.scale.0.forward").name == "mylib.scale.0.forward"
    PrecisionDebugger._reset()  # closing the debugger puts the registered originals back
    assert mylib.scale is scale and mnp.dot is orig_dot


def test_register_custom_api_bad_input(tmp_path):
    dbg = PrecisionDebugger(task="statistics", dump_path=str(tmp_path / "d"), level="L1")
    with pytest.raises(ConfigError, match="no_such_api"):
        dbg.register_custom_api(ops, "no_such_api")
    with pytest.raises(ConfigError, match="api_prefix"):
        dbg.register_custom_api(mnp, "dot", 3)


# ------------------------------------------------------------------------------ steps and tokens
def test_set_init_step(tmp_path):
    root = str(tmp_path / "d")
    dbg = PrecisionDebugger(task="statistics", dump_path=root, level="L1", step=[4, 5])
    dbg.set_init_step(3)
    for i in range(3):  # steps 3, 4, 5: 3 is not in "step"
        dbg.start()
        mint.add(_f32(float(i)), 1.0)
        dbg.stop()
        dbg.step()
    assert sorted(os.listdir(root)) == ["step4", "step5"]
    assert _doc(root, 4)["data"]["Mint.add.0.forward"]["input_args"][0]["Max"] == 1.0
    assert _doc(root, 5)["data"]["Mint.add.0.forward"]["input_args"][0]["Max"] == 2.0
    with pytest.raises(ConfigError):
        dbg.set_init_step(-1)


@pytest.mark.parametrize("initial_epoch, want", [(0, [0, 1, 2, 3]), (1, [2, 3, 4, 5])])
def test_msprobe_init_step_numbers_a_resumed_model_train(tmp_path, initial_epoch, want):
    """MsprobeInitStep: the dump of a run resumed at epoch 1 (2 batches per epoch) starts at step2."""
    import mindspore.dataset as ds
    from mindspore.train import Model

    from msprobe.mindspore import MsprobeInitStep, MsprobeStep

    root = str(tmp_path / "d")
    net = nn.SequentialCell([nn.Dense(4, 2)])  # L0 records the sub-Cells: the Dense
    dbg = PrecisionDebugger(task="statistics", dump_path=root, level="L0", model=net)
    data = ds.NumpySlicesDataset({"x": np.arange(16, dtype=np.float32).reshape(4, 4),
                                  "y": np.zeros((4, 2), np.float32)}, shuffle=False).batch(2)
    model = Model(net, loss_fn=nn.MSELoss(), optimizer=nn.SGD(net.trainable_params(), 0.01))
    model.train(initial_epoch + 2, data, callbacks=[MsprobeInitStep(), MsprobeStep(dbg)], dataset_sink_mode=False,
                initial_epoch=initial_epoch)
    assert sorted(os.listdir(root)) == [f"step{s}" for s in want]
    # each epoch feeds batch 0 (rows 0-1 of x, max 7) then batch 1 (max 15): the numbering follows
    for s, batch_max in zip(want, [7.0, 15.0] * 2):
        maxes = {a["Max"] for k, v in _doc(root, s)["data"].items() if ".forward" in k
                 for a in v.get("input_args", []) if isinstance(a, dict) and a.get("shape") == [2, 4]}
        assert batch_max in maxes and not maxes - {batch_max}, (s, maxes)


class Decoder(nn.Cell):
    def __init__(self):
        super().__init__()
        self.proj = nn.Dense(2, 2)

    def construct(self, x):
        return mint.add(self.proj(x), x)


def test_token_range(tmp_path):
    """start(model, token_range=[1, 3]): only the model's 2nd to 4th forward passes (inclusive) are dumped."""
    root = str(tmp_path / "d")
    net = Decoder()
    dbg = PrecisionDebugger(task="statistics", dump_path=root, level="mix")
    dbg.start(model=net, token_range=[1, 3])
    for token in range(5):
        net(Tensor(np.full((1, 2), float(token), np.float32)))
    dbg.stop()
    dbg.step()
    data = _doc(root)["data"]
    adds = sorted(n for n in data if n.startswith("Mint.add."))
    assert adds == ["Mint.add.0.forward", "Mint.add.1.forward", "Mint.add.2.forward"]
    assert [data[n]["input_args"][1]["Max"] for n in adds] == [1.0, 2.0, 3.0]  # tokens 1, 2, 3
    cells = [n for n in data if n.startswith("Cell.proj.")]
    assert cells == ["Cell.proj.Dense.forward.0", "Cell.proj.Dense.forward.1", "Cell.proj.Dense.forward.2"]
    assert data["Cell.proj.Dense.forward.0"]["input_args"][0]["Max"] == 1.0
    PrecisionDebugger._reset()
    dbg = PrecisionDebugger(task="statistics", dump_path=root, level="L1")
    with pytest.raises(ConfigError, match="model"):
        dbg.start(token_range=[1, 3])
    with pytest.raises(ConfigError, match="token_range"):
        dbg.start(model=net, token_range=[3, 1])


# ------------------------------------------------------------------------------ dump_error_info.log
def test_dump_error_info_log_only_when_writes_fail(tmp_path):
    """The docs: dump_error_info.log exists only when the tool hit an error. A rank dir whose
    dump_tensor_data is a file: each .npy write fails, is named in the log, and dump.json is still written."""
    ok, bad = str(tmp_path / "ok"), str(tmp_path / "bad")
    os.makedirs(os.path.join(bad, "step0", "rank"))
    with open(os.path.join(bad, "step0", "rank", "dump_tensor_data"), "w") as f:
        f.write("in the way")
    for root in (ok, bad):
        PrecisionDebugger._reset()
        dbg = PrecisionDebugger(task="tensor", dump_path=root, level="L1")
        dbg.start()
        mint.add(_f32(1.0, 2.0), 1.0)
        dbg.stop()
        dbg.step()
    assert not os.path.exists(os.path.join(ok, "step0", "rank", "dump_error_info.log"))
    with open(os.path.join(bad, "step0", "rank", "dump_error_info.log"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    names = sorted(line.split("\t")[1].rsplit("/", 1)[1] for line in lines)
    assert names == ["Mint.add.0.forward.input.0.npy", "Mint.add.0.forward.output.0.npy"], lines
    rec = _doc(bad)["data"]["Mint.add.0.forward"]  # the statistics are still there
    assert rec["output"][0]["Max"] == 3.0 and rec["output"][0]["data_name"] == "Mint.add.0.forward.output.0.npy"


# ------------------------------------------------------------------------------ s3
S3_ENDPOINT = os.environ.get("MSPROBE_TEST_S3_ENDPOINT")
S3_URL = os.environ.get("MSPROBE_TEST_S3_URL")


@pytest.mark.skipif(not (S3_ENDPOINT and S3_URL), reason="run by test_mindspore.py with its moto S3 server")
def test_dump_to_s3(tmp_path):
    """A tensor dump straight to s3:// (s3fs, the outer test's moto server), read back by msprobe.readers."""
    url = f"{S3_URL}/ms-run"
    options = {"client_kwargs": {"endpoint_url": S3_ENDPOINT}, "key": "testing", "secret": "testing",
               "skip_instance_cache": True}
    net = Decoder()
    dbg = PrecisionDebugger(task="tensor", dump_path=url, level="mix", storage_options=options)
    x = Tensor(np.array([[1.0, -3.0]], np.float32))
    for _ in range(2):
        dbg.start(model=net)
        out = net(x)
        dbg.stop()
        dbg.step()
    dump = msprobe.readers.open(url, storage_options=options)
    assert dump.steps == [0, 1]
    recs = list(dump.records(step=1))
    names = [r.name for r in recs]
    assert names == ["Primitive.shape_op.Shape.0.forward", "Primitive.matmul.MatMul.0.forward",
                     "Primitive.bias_add.BiasAdd.0.forward", "Cell.proj.Dense.forward.0", "Mint.add.0.forward"]
    add = dump.record("Mint.add.0.forward", step=1)
    assert add.output[0].max == pytest.approx(float(out.asnumpy().max()), rel=1e-6)
    loaded = [t for io, t in add.tensors() if io == "output"][0].load("numpy")
    np.testing.assert_array_equal(loaded, out.asnumpy())


# ------------------------------------------------- model code as libraries write it (issue 26)
class _KeepsOps(nn.Cell):
    """An op kept in an attribute at __init__ (as transformers-style code does), and a Cell returning a
    namedtuple."""

    NT = __import__("collections").namedtuple("NT", "a b")

    def __init__(self):
        super().__init__()
        self.act = ops.gelu
        self.act2 = __import__("functools").partial(ops.silu)

    def construct(self, x):
        return self.NT(self.act(x), self.act2(x))


class _Holder(nn.Cell):
    def __init__(self):
        super().__init__()
        self.inner = _KeepsOps()

    def construct(self, x):
        o = self.inner(x)
        return o[0].sum() + o[1].sum()


def test_ops_kept_in_attributes_are_recorded_when_the_cell_is_built_after_the_debugger(tmp_path):
    root = str(tmp_path / "d")
    dbg = PrecisionDebugger(config_path=_config(tmp_path, task="statistics", dump_path=root, level="mix",
                                                statistics={"summary_mode": "statistics"}))
    net = _Holder()  # after the debugger: its attributes hold the wrappers (26.2.0's timing)
    x = _f32(1.0, -2.0, 3.0)
    net(x)  # before start(): neither recorded nor counted
    dbg.start(model=net)
    net(x)
    dbg.stop()
    dbg.step()
    data = _doc(root)["data"]
    assert "Functional.gelu.0.forward" in data and "Functional.silu.0.forward" in data, sorted(data)
    assert "Functional.gelu.1.forward" not in data
    # a namedtuple output is written by field, not as a list (26.2.0)
    out = data["Cell.inner._KeepsOps.forward.0"]["output"]
    assert isinstance(out, dict) and list(out) == ["a", "b"], out
