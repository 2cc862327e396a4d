"""replay_inputs: real tensors when dumped, generated ones (run_ut style) otherwise."""
from __future__ import annotations

import math

import numpy as np
import pytest
from readers_synth import torch_dump

import msprobe.readers as readers
from msprobe.errors import ConfigError, TensorLoadError
from msprobe.readers._replay import generate_tensor

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    base = tmp_path_factory.mktemp("replay")
    torch_dump(str(base / "t"), task="tensor")
    torch_dump(str(base / "s"), task="statistics")
    return readers.open(str(base / "t")), readers.open(str(base / "s"))


def test_real_mode_loads_dumped_tensors(dumps):
    t, _ = dumps
    rec = t.record("Functional.linear.0.forward")
    args, kwargs = rec.replay_inputs(mode="real")
    assert kwargs == {}
    for a, arg in zip(args, rec.input_args):
        assert torch.equal(a, arg.load(framework="torch"))
    out = torch.nn.functional.linear(*args)
    assert torch.allclose(out, rec.output[0].load(framework="torch"), atol=1e-6)


def test_random_mode_follows_the_record(dumps):
    _, s = dumps
    rec = s.record("Functional.linear.0.forward")
    args, _ = rec.replay_inputs(mode="random", seed=0)
    for a, arg in zip(args, rec.input_args):
        assert a.dtype == torch.float32 and tuple(a.shape) == arg.shape
        assert a.min().item() == pytest.approx(arg.min) and a.max().item() == pytest.approx(arg.max)
        assert a.reshape(-1)[0].item() == pytest.approx(arg.min) and a.reshape(-1)[-1].item() == pytest.approx(arg.max)
    again, _ = rec.replay_inputs(mode="random", seed=0)
    assert all(torch.equal(x, y) for x, y in zip(args, again))
    # auto without files = random
    auto, _ = rec.replay_inputs(mode="auto", seed=0)
    assert all(torch.equal(x, y) for x, y in zip(args, auto))
    with pytest.raises(TensorLoadError, match="mode='real'"):
        rec.replay_inputs(mode="real")
    with pytest.raises(ConfigError, match="auto, real, random"):
        rec.replay_inputs(mode="bogus")


def test_non_tensor_arguments_are_decoded(dumps):
    _, s = dumps
    args, kwargs = s.record("Torch.sum.0.forward").replay_inputs(seed=1)
    assert args[0].dtype == torch.int64 and args[0].shape == (5,)
    assert kwargs == {"dim": 0, "dtype": torch.int64}
    args, _ = s.record("Torch.cat.0.forward").replay_inputs(seed=1)
    assert isinstance(args[0], list) and len(args[0]) == 2 and args[1] == 0
    assert torch.cat(*args).shape == (6, 4)
    args, _ = s.record("Tensor.__getitem__.0.forward").replay_inputs(seed=1)
    assert args[1] == [slice(0, 2, None), Ellipsis, None]
    assert args[0][tuple(args[1])].shape == (2, 4, 1)
    args, kwargs = s.record("Tensor.add_.0.forward").replay_inputs(seed=1, need_grad=True)
    assert args[1] == -0.1 and kwargs == {"alpha": None} and args[0].requires_grad
    args, _ = s.record("Torch.isfinite.0.forward").replay_inputs(seed=1)
    assert args[0].dtype == torch.float32


def test_generate_special_values():
    def gen(**entry):
        return generate_tensor({"type": "torch.Tensor", **entry}, gen=None)

    b = gen(dtype="torch.bool", shape=[50], Max=True, Min=False)
    assert b.dtype == torch.bool and b.shape == (50,)
    i = gen(dtype="torch.int32", shape=[100], Max=7, Min=-3, Mean=None, Norm=None)
    assert i.dtype == torch.int32 and int(i.min()) >= -3 and int(i.max()) <= 7
    assert int(i[0]) == -3 and int(i[-1]) == 7
    n = gen(dtype="torch.float16", shape=[2, 2], Max=float("nan"), Min=float("nan"))
    assert n.dtype == torch.float16 and torch.isnan(n).all()
    inf = gen(dtype="torch.float32", shape=[4], Max=float("inf"), Min=-1.0)
    assert math.isinf(inf[0].item()) and inf[-1].item() == -1.0
    bf = gen(dtype="torch.bfloat16", shape=[3, 3], Max=2.0, Min=-2.0)
    assert bf.dtype == torch.bfloat16 and float(bf.max()) <= 2.0
    e = gen(dtype="torch.float32", shape=[0, 3], Max=None, Min=None)
    assert e.shape == (0, 3)
    nan_inside = gen(dtype="torch.float32", shape=[10], Max=float("nan"), Min=0.0, Max_except_inf_nan=1.0,
                     Min_except_inf_nan=0.0)
    assert torch.isnan(nan_inside[1]) and nan_inside[-1].item() == 1.0
    a = generate_tensor({"dtype": "Float32", "shape": [3], "Max": 1.0, "Min": 0.0}, framework="numpy")
    assert isinstance(a, np.ndarray) and a.dtype == np.float32 and a[0] == 0.0 and a[-1] == 1.0


def test_device_without_index_is_decoded():
    """26.2.0 (and our dumper) write a device as type:index, "cpu:None" for one without index."""
    from msprobe.readers._replay import _typed

    assert _typed("torch.device", "cpu:None", "torch") == torch.device("cpu")
    assert _typed("torch.device", "cpu", "torch") == torch.device("cpu")
