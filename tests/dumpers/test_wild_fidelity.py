"""The five ways Hugging Face model code made our dumps differ from 26.2.0's (issue 26), each on a
small model of its own (the real tool's behaviour measured on transformers 5.23 models, see
tests/dumpers/test_wild_zoo.py, which runs both tools live):

1. an API kept in a module attribute at __init__ (``self.act = F.gelu``, ``functools.partial``)
   is recorded when the model is built after ``PrecisionDebugger(...)``; built before, a warning;
2. a module returning a dict / ModelOutput / namedtuple gets its backward record, its forward
   output written by field (a dataclass's every field; a namedtuple not wrapped in a list);
3. a module backward record holds one gradient per tensor that needs one (outputs through
   tuples, lists and dicts; positional inputs), and a tensor that needed no gradient stays so;
4. an integer tensor of shape [1] has Mean/Norm null (only a 0-d tensor gets its value);
5. a torch.device is written "cpu:None" (type, colon, index).
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from msprobe.pytorch import PrecisionDebugger  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_debugger")


def debugger(tmp_path, level="mix"):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"task": "statistics", "dump_path": str(tmp_path), "level": level,
                               "statistics": {"summary_mode": "statistics"}}))
    return PrecisionDebugger(config_path=str(cfg))


def dump(tmp_path, dbg, model, body):
    dbg.start(model)
    body()
    dbg.stop()
    dbg.step()
    with open(os.path.join(tmp_path, "step0", "rank", "dump.json")) as f:
        return json.load(f)["data"]


class Act(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.act = F.gelu  # transformers' GELUActivation keeps the function, as ACT2FN does
        self.act2 = functools.partial(F.silu, inplace=False)

    def forward(self, x):
        return self.act2(self.act(self.lin(x)))


def test_api_kept_in_an_attribute_is_recorded_when_built_after_the_debugger(tmp_path):
    dbg = debugger(tmp_path)
    net = Act()  # after the debugger, as msprobe's docs show
    net(torch.randn(2, 4))  # wrapped from the debugger's creation, but not dumped nor counted before start()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn about
        data = dump(tmp_path, dbg, net, lambda: net(torch.randn(2, 4, requires_grad=True)).sum().backward())
    for name in ("Functional.gelu.0.forward", "Functional.gelu.0.backward", "Functional.silu.0.forward"):
        assert name in data, sorted(data)
    assert "Functional.gelu.1.forward" not in data


def test_api_captured_before_the_debugger_is_named_in_a_warning(tmp_path):
    net = Act()  # before the debugger: its attributes hold the unwrapped functions
    dbg = debugger(tmp_path)
    with pytest.warns(UserWarning, match=r"act \(Functional\.gelu\).*act2 \(Functional\.silu\)"):
        data = dump(tmp_path, dbg, net, lambda: net(torch.randn(2, 4)).sum())
    assert "Functional.gelu.0.forward" not in data and "Functional.linear.0.forward" in data


NT = collections.namedtuple("NT", "a b")


@dataclasses.dataclass
class DC:
    a: torch.Tensor
    b: object = None


class Out(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.kind = kind

    def forward(self, x):
        h = self.lin(x)
        if self.kind == "dict":
            return {"a": h, "none": None, "ids": torch.ones(2, dtype=torch.long), "b": h * 2}
        if self.kind == "namedtuple":
            return NT(h, h * 3)
        if self.kind == "dataclass":
            return DC(h, 1)
        if self.kind == "modeloutput":
            return MO(a=h, c=h * 4)
        if self.kind == "tuple":
            return (h, torch.ones(2, 4), h * 5)  # a float tensor that needs no gradient
        return [h, [h * 6, torch.ones(3)]]


try:
    from transformers.utils import ModelOutput

    @dataclasses.dataclass
    class MO(ModelOutput):
        a: torch.Tensor = None
        b: torch.Tensor = None
        c: torch.Tensor = None
except ImportError:  # transformers is a test dependency (pyproject's test extra): the test fails without it
    MO = None


def _tensors(out):
    if isinstance(out, torch.Tensor):
        return [out] if out.requires_grad else []
    if isinstance(out, DC):
        return _tensors(out.a)
    if isinstance(out, dict):
        return [t for v in out.values() for t in _tensors(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in _tensors(v)]
    return []


#: kind -> (the forward record's "output", the backward record's "input" length or None: no record)
EXPECTED = {
    "dict": ([{"a": "T", "none": None, "ids": "T", "b": "T"}], 2),
    "namedtuple": ({"a": "T", "b": "T"}, 2),
    "dataclass": ([{"a": "T", "b": {"type": "int", "value": 1}}], None),  # 26.2.0 hooks no dataclass
    "modeloutput": ([{"a": "T", "b": None, "c": "T"}], 2),
    "tuple": (["T", "T", "T"], 2),
    "list": ([["T", ["T", "T"]]], 2),
}


def _shape(v):
    if isinstance(v, dict) and v.get("type") == "torch.Tensor":
        return "T"
    if isinstance(v, dict) and "type" in v:
        return v
    if isinstance(v, dict):
        return {k: _shape(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_shape(x) for x in v]
    return v


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_module_outputs_and_their_backward_record(tmp_path, kind):
    assert MO is not None, "transformers is missing: pip install -c constraints/ci.txt -e .[test]"
    dbg = debugger(tmp_path)
    net = nn.ModuleDict({"out": Out(kind)})  # the root module has no record: a child does

    def body():
        out = net["out"](torch.randn(2, 4))
        sum(t.sum() for t in _tensors(out)).backward()

    data = dump(tmp_path, dbg, net, body)
    want_out, n_grads = EXPECTED[kind]
    assert _shape(data["Module.out.Out.forward.0"]["output"]) == want_out
    if n_grads is None:
        assert "Module.out.Out.backward.0" not in data and "Module.out.lin.Linear.backward.0" in data
    else:
        rec = data["Module.out.Out.backward.0"]
        assert len(rec["input"]) == n_grads and all(e is not None for e in rec["input"]), rec
        # each output's gradient is what the users outside the module sent (26.2.0's identity node on the
        # outputs): ones, also for h, which the module uses for its other output too (not 1 + 2, 3, 4...)
        assert [(e["Max"], e["Min"]) for e in rec["input"]] == [(1.0, 1.0)] * n_grads, rec
        assert rec["output"] == []  # the input needs no gradient
        names = list(data)  # written where 26.2.0's identity node runs: before the module's own nodes' records
        assert names.index("Module.out.Out.backward.0") < names.index("Module.out.lin.Linear.backward.0")


class Reused(nn.Module):
    """An output the module uses for its other output too: (h, h * 5)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        return h, h * 5


#: (input needs a gradient, h used outside) -> the record's gradient of h (its Max; None: no record entry),
#: as 26.2.0 writes it (measured: Max 1.5 for 1.5 * h.sum() outside, where h's whole gradient is 14.0)
REUSED = {(False, True): 1.5, (True, True): 1.5, (False, False): None, (True, False): None}


@pytest.mark.parametrize("x_grad, h_outside", sorted(REUSED))
def test_an_output_used_inside_the_module_gets_its_outside_gradient(tmp_path, x_grad, h_outside):
    dbg = debugger(tmp_path)
    torch.manual_seed(0)
    net = nn.ModuleDict({"m": Reused()})

    def body():
        h, h5 = net["m"](torch.randn(2, 4, requires_grad=x_grad))
        (h.sum() * 1.5 + h5.sum() * 2.5 if h_outside else h5.sum() * 2.5).backward()

    data = dump(tmp_path, dbg, net, body)
    rec = data["Module.m.Reused.backward.0"]
    first, second = rec["input"]
    want = REUSED[(x_grad, h_outside)]
    assert (first if first is None else first["Max"]) == want, rec
    assert second["Max"] == second["Min"] == 2.5
    assert len(rec["output"]) == (1 if x_grad else 0)
    inner = data["Module.m.lin.Linear.backward.0"]["input"][0]
    assert inner["Max"] == (14.0 if h_outside else 12.5)  # the Linear's output: its whole gradient


class Block(nn.Module):
    """T5Block-like: hands a position bias along beside the hidden states."""

    def __init__(self, first):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.first = first

    def forward(self, h, bias, cross_bias):
        if self.first:
            cross_bias = torch.zeros(1, 4)  # needs no gradient (T5's cross-attention bias)
        return self.lin(h) + bias + cross_bias, bias, cross_bias


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(True), Block(False)])
        self.bias = nn.Parameter(torch.randn(1, 4))

    def forward(self, h):
        bias, cross = self.bias * 1.0, None
        for b in self.blocks:
            h, bias, cross = b(h, bias, cross)
        return h


def test_several_outputs_one_gradient_per_tensor_needing_one(tmp_path):
    dbg = debugger(tmp_path)
    net = Stack()
    data = dump(tmp_path, dbg, net, lambda: net(torch.randn(2, 4, requires_grad=True)).sum().backward())
    fwd = data["Module.blocks.1.Block.forward.0"]
    # the bias that needed no gradient still needs none after passing our hooks
    assert fwd["input_args"][2]["requires_grad"] is False and fwd["output"][2]["requires_grad"] is False
    bwd = data["Module.blocks.1.Block.backward.0"]
    assert len(bwd["input"]) == 2 and bwd["input"][1] is None  # h, bias (unused after the last block)
    assert [e["shape"] for e in bwd["output"]] == [[2, 4], [1, 4]]  # positional inputs needing a gradient
    first = data["Module.blocks.0.Block.backward.0"]
    assert len(first["input"]) == 2 and len(first["output"]) == 2  # cross_bias: None in, no gradient out


def test_one_element_integer_tensor_statistics(tmp_path):
    dbg = debugger(tmp_path, level="L1")

    def body():
        s = torch.tensor(5)
        v = s.unsqueeze(0)  # [1]-shaped view of the 0-d tensor
        torch.isin(v, torch.tensor([1, 5]))

    data = dump(tmp_path, dbg, None, body)
    out = data["Tensor.unsqueeze.0.forward"]
    assert (out["input_args"][0]["Mean"], out["input_args"][0]["Norm"]) == (5, 5)  # 0-d: the value
    assert out["output"][0]["shape"] == [1] and out["output"][0]["Max"] == 5
    assert (out["output"][0]["Mean"], out["output"][0]["Norm"]) == (None, None)
    isin = data["Torch.isin.0.forward"]["input_args"][0]
    assert (isin["Mean"], isin["Norm"]) == (None, None)


def test_device_is_type_colon_index(tmp_path):
    dbg = debugger(tmp_path, level="L1")
    data = dump(tmp_path, dbg, None, lambda: (torch.arange(3, device=torch.device("cpu")),
                                              torch.arange(2, device="cpu")))
    assert data["Torch.arange.0.forward"]["input_kwargs"]["device"] == {"type": "torch.device", "value": "cpu:None"}
    # a device given as a string is written as given
    assert data["Torch.arange.1.forward"]["input_kwargs"]["device"] == {"type": "str", "value": "cpu"}


def test_float32_mean_overflows_as_torch_sums(tmp_path):
    dbg = debugger(tmp_path, level="L1")
    lo = torch.finfo(torch.float32).min
    data = dump(tmp_path, dbg, None, lambda: torch.where(torch.tensor([True, False, False, True] * 4),
                                                          torch.zeros(16), torch.full((16,), lo)))
    out = data["Torch.where.0.forward"]["output"][0]
    assert out["Mean"] == float("-inf") and out["Min"] == lo  # T5's mask: 26.2.0 writes -inf


def test_a_compiled_model_is_refused_with_a_config_error(tmp_path):
    """26.2.0 fails inside start() (TypeError: M does not support len()); ours said nothing and crashed in
    TorchDynamo's tracing of the wrappers at the first call: now a typed error before anything runs."""
    from msprobe.errors import ConfigError

    dbg = debugger(tmp_path)
    net = nn.Linear(4, 4)
    with pytest.raises(ConfigError, match=r"torch.compile'd model.*_orig_mod"):
        dbg.start(torch.compile(net))


def test_keyword_tensor_files_are_named_kwargs(tmp_path):
    """26.2.0 (and spec/FORMAT.md's file names) name a keyword argument's tensor file
    ``<record>.kwargs.<key>.pt`` (T5's attention mask, a module's ``encoder_hidden_states=``)."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"task": "tensor", "dump_path": str(tmp_path), "level": "L1"}))
    dbg = PrecisionDebugger(config_path=str(cfg))
    dump(tmp_path, dbg, None, lambda: F.scaled_dot_product_attention(
        torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), attn_mask=torch.zeros(3, 3)))
    files = os.listdir(os.path.join(tmp_path, "step0", "rank", "dump_tensor_data"))
    assert "Functional.scaled_dot_product_attention.0.forward.kwargs.attn_mask.pt" in files, sorted(files)
