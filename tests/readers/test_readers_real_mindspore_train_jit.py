"""The real tool's MindSpore Model.train + MsprobeStep and jit dumps
(tests/fixtures/real/ms26_mindspore/{train,jit_bc}_*, mindstudio-probe 26.2.0 with mindspore 2.10.0
on CPU, made by tests/fixtures/real/scripts/ms_run_train_jit.py) through the format code and
msprobe.readers: they validate, their documents round-trip byte for byte, every record name parses,
and the reader gives their steps, records in file order, construct parents, stacks and statistics,
including the numpy-array arguments of Tensor.from_numpy. Reads the committed files only."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import msprobe.readers
from msprobe.backends import open_store
from msprobe.format.documents import ConstructDocument, DumpDocument, StackDocument
from msprobe.format.layout import parse_rank_dir
from msprobe.format.naming import parse_record_name
from msprobe.readers.validate import validate_store

BASE = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "ms26_mindspore"
CASES = {  # fixture -> steps written, records per step
    "train_L1_statistics": ([0, 1], [23, 21]),
    "train_L0_statistics": ([0, 1], [8, 8]),
    "train_mix_statistics": ([0, 1], [31, 29]),
    "train_api_L1_statistics": ([0, 1], [12, 10]),
    "jit_bc_L1_statistics": ([0], [27]),
    "jit_bc_L0_statistics": ([0], [8]),
    "jit_bc_mix_statistics": ([0], [38]),
}
DOCS = {"dump.json": DumpDocument, "stack.json": StackDocument, "construct.json": ConstructDocument}


def _rank_dirs(case: str) -> list:
    return sorted(p.parent for p in (BASE / case).rglob("dump.json") if parse_rank_dir(p.parent.name) is not None)


def _data(case: str, step: int) -> dict:
    (rank,) = [r for r in _rank_dirs(case) if r.parent.name == f"step{step}"]
    return json.loads((rank / "dump.json").read_bytes())["data"]


@pytest.mark.parametrize("case", list(CASES))
def test_validates_and_round_trips(case):
    report = validate_store(open_store(str(BASE / case), read_only=True))
    assert report.ok, "\n".join(str(p) for p in report.errors)
    ranks = _rank_dirs(case)
    assert len(ranks) == len(CASES[case][0])
    for rank in ranks:
        for fname, cls in DOCS.items():
            raw = (rank / fname).read_bytes()
            assert cls.loads(raw, file=str(rank / fname)).dumps().encode("utf-8") == raw
        doc = DumpDocument.loads((rank / "dump.json").read_bytes())
        assert doc.framework == "mindspore"
        for rec in doc.records():
            assert parse_record_name(rec.name).format() == rec.name


@pytest.mark.parametrize("case", list(CASES))
def test_reader_steps_records_and_parents(case):
    steps, counts = CASES[case]
    d = msprobe.readers.open(str(BASE / case))
    assert d.framework == "mindspore"
    assert d.steps == steps
    assert d.count() == sum(counts)
    for step, n in zip(steps, counts):
        recs = d.records(step=step)
        assert [r.name for r in recs] == list(_data(case, step))
        assert len(recs) == n
    if case == "train_mix_statistics":
        by_name = {r.name: r for r in d.records(step=1)}
        assert by_name["Primitive.conv2d.Conv2D.0.forward"].parent.name == "Cell.conv.Conv2d.forward.0"
        assert by_name["Cell.fc.Dense.forward.0"].parameters["weight"].shape == (3, 32)
        assert by_name["Cell.fc.Dense.forward.0"].stack  # stack.json frames reach the record
    if case == "jit_bc_mix_statistics":
        by_name = {r.name: r for r in d.records()}
        assert by_name["Cell.block.fc.Dense.forward.0"].parent.name == "Cell.block.JitBlock.forward.0"
        assert by_name["Functional.relu.0.forward"].parent.name == "Cell.block.JitBlock.forward.0"


def test_numpy_array_arguments_of_from_numpy():
    """Tensor.from_numpy's argument is a numpy array: "type": "numpy.ndarray", numpy dtype names."""
    d = msprobe.readers.open(str(BASE / "train_L1_statistics"))
    recs = {r.name: r for r in d.records(step=0)}
    x = recs["Tensor.from_numpy.0.forward"]
    arg, out = x.input_args[0], x.output[0]
    assert arg.raw["type"] == "numpy.ndarray" and arg.raw["dtype"] == "float32"
    assert out.raw["type"] == "mindspore.Tensor" and out.raw["dtype"] == "Float32"
    assert list(arg.shape) == list(out.shape) == [2, 1, 4, 4]
    assert arg.raw["Max"] == pytest.approx(out.raw["Max"]) and arg.raw["Min"] == pytest.approx(out.raw["Min"])
    y = recs["Tensor.from_numpy.1.forward"].input_args[0]
    assert y.raw["dtype"] == "int32" and y.raw["Max"] == 1 and y.raw["Mean"] == 0.5
