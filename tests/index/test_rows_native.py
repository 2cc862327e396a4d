"""The index's rows from the C walk (``index_rows`` of msprobe/format/_leafwalk.c) equal the Python
code's (:func:`msprobe.index.rows.rank_rows` with the walk set aside), cell for cell and type for
type: on every dump.json of the tests' fixtures (with and without placeholders, a subset of names,
stack ids and parents) and on records built to reach each branch (statistics that are ints, huge
ints, strings, bools, NaN/inf; shapes that are invalid, huge or hold a zero; non-string md5; nested
arguments; parameters_grad and debug records; a record past the depth limit, which the Python code
refuses). The module is built on first use: a machine that cannot build it fails."""
from __future__ import annotations

import math

import pytest

from msprobe.errors import DocumentError
from msprobe.format.native import leafwalk
from msprobe.index import columns, rows
from tests._dump_docs import fixture_data


def _entry(**extra) -> dict:
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 3], "Max": 1.5, "Min": -1.5,
            "Mean": 0.25, "Norm": 3.0, "requires_grad": False, "md5": "0a1b2c3d", **extra}


CRAFTED = {
    "Functional.linear.0.forward": {
        "input_args": [_entry(), [_entry(Max=3, Min=10 ** 400, Mean=-(10 ** 400), Norm=True)],
                       {"k": _entry(Max="nan", Min="1e3", Mean="x", Norm=None)}, 5, None],
        "input_kwargs": {"alpha": {"type": "float", "value": 1.0}, "w": _entry(data_name="w.pt")},
        "output": [_entry(Max=float("nan"), Min=float("-inf"), shape=[2 ** 40, 2 ** 40]),
                   _entry(shape=[2 ** 62, 4, 0], md5=12345), _entry(shape=[True, 2]), _entry(shape=[-1]),
                   _entry(shape=(2, 3)), _entry(dtype=7, requires_grad=1, md5=[1, 2]), {"type": "x", "value": 1}],
    },
    "Module.layer.Linear.parameters_grad": {"weight": [_entry()], "bias": [_entry(data_name="")]},
    "save.debug": {"x": _entry(), "y": [1, {"z": _entry()}]},
    "Tensor.add.0.forward": {"input_args": [1, 2], "output": None},
    "Distributed.all_reduce.0.forward": {"": [_entry()], "input_args": [{"type": "mindspore.Tensor", "Max": 1}]},
    "odd.record": [_entry(), [[_entry()]]],
}


@pytest.fixture(scope="module")
def walker():
    mod = leafwalk()
    assert mod is not None, "msprobe.format._leafwalk could not be built (a C compiler and Python's headers)"
    return mod


def _same(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _both(monkeypatch, data: dict, **kw) -> tuple:
    native = rows.rank_rows(data, run="r", step=0, rank=1, rank_dir="rank1", **kw)
    with monkeypatch.context() as patch:
        patch.setattr(rows, "leafwalk", lambda: None)
        python = rows.rank_rows(data, run="r", step=0, rank=1, rank_dir="rank1", **kw)
    return native, python


def _assert_same(native: dict, python: dict, where: str) -> None:
    assert list(native) == list(python)
    for column in python:
        assert _same(native[column], python[column]), (where, column, native[column][:5], python[column][:5])


@pytest.mark.parametrize("placeholders", [False, True])
def test_crafted_records(walker, monkeypatch, placeholders):
    assert rows._native_rows(CRAFTED, None, placeholders) is not None
    native, python = _both(monkeypatch, CRAFTED, placeholders=placeholders,
                           stack_ids={"Functional.linear.0.forward": "s1"}, parents={"save.debug": "Module.x"},
                           mapping={"w.pt": "w_0.pt"})
    _assert_same(native, python, "crafted")
    native, python = _both(monkeypatch, CRAFTED, placeholders=placeholders, names=["save.debug", "odd.record"],
                           locations={"w.pt": "tensors/w.pt"})
    _assert_same(native, python, "crafted names")


def test_every_fixture_document(walker, monkeypatch):
    for path, data in fixture_data():
        for placeholders in (False, True):
            native, python = _both(monkeypatch, data, placeholders=placeholders)
            _assert_same(native, python, path)


def test_past_the_depth_limit_the_python_code_refuses(walker):
    deep: dict = _entry()
    for _ in range(80):
        deep = {"a": deep}
    data = {"Functional.x.0.forward": {"input_args": [deep]}}
    assert rows._native_rows(data, None, True) is None
    with pytest.raises(DocumentError):
        rows.rank_rows(data, run=None, step=0, rank=0, rank_dir="rank0")


def _cells(table) -> str:
    """A table's rows as text (NaN equal to NaN), its schema beside them."""
    return repr((table.schema, table.to_pylist()))


def test_index_table_laid_out_in_c_equals_pyarrows_conversion(walker, monkeypatch):
    """:func:`rows.rank_table` (each column's buffers from the C ``arrow_column``) gives the table
    pyarrow converts from the Python code's lists, schema and metadata included."""
    import pyarrow as pa

    documents = [("crafted", CRAFTED)] + list(fixture_data())
    for path, data in documents:
        kw = {"stack_ids": {"Functional.linear.0.forward": "s1"}, "parents": {"save.debug": "Module.x"},
              "mapping": {"w.pt": "w_0.pt"}} if path == "crafted" else {}
        where = ("r", 3, 1, "rank1", "s")
        native = rows.rank_table(data, where, metadata={"k": "v"}, **kw)
        with monkeypatch.context() as patch:
            patch.setattr(rows, "leafwalk", lambda: None)
            patch.setattr(columns, "leafwalk", lambda: None)
            python = rows.rank_rows(data, run="r", step=3, rank=1, rank_dir="rank1", split="s", placeholders=True,
                                    **kw)
        expected = pa.Table.from_pydict(python, schema=rows.arrow_schema().with_metadata({"k": "v"}))
        assert _cells(native) == _cells(expected), path
        assert native.schema.metadata == expected.schema.metadata


@pytest.mark.parametrize("arrow_type, values", [
    ("string", ["a", None, "", "ünï", "x" * 300, None]),
    ("float64", [1.5, None, float("nan"), float("-inf"), 3, -(2 ** 53), 0.0]),
    ("int64", [0, None, -1, 2 ** 63 - 1, -(2 ** 63)]),
    ("bool", [True, None, False, True, True, False, False, False, True, None]),
    ("shape", [[2, 3], None, [], [2 ** 40, 1], [0]]),
])
def test_arrow_column_equals_pyarrows_conversion(walker, arrow_type, values):
    """The C layout of a column, with and without a row index (nulls where it is -1), is the array
    pyarrow converts; empty columns too."""
    import numpy as np
    import pyarrow as pa

    kind = pa.list_(pa.int64()) if arrow_type == "shape" else pa.type_for_alias(arrow_type)
    assert walker.arrow_column(values, columns._kind(pa, kind), None) is not None
    for index in (None, np.array([len(values) - 1, -1, 0, 0, 2, -1, 1], np.int64), np.zeros(0, np.int64)):
        raw = None if index is None else index.tobytes()
        got = columns.column(values, kind, raw)
        want = columns.column(values, kind, raw, native=False)
        got.validate(full=True)
        assert got.type == want.type and repr(got.to_pylist()) == repr(want.to_pylist()), index
        assert got.null_count == want.null_count
    assert columns.column([], kind).to_pylist() == []


@pytest.mark.parametrize("arrow_type, values", [
    ("string", ["a", 1]), ("float64", [1.0, "1"]), ("float64", [True]), ("float64", [10 ** 400]), ("float64", [2 ** 53 + 1]),
    ("int64", [1, 2 ** 63]), ("int64", [1.0]), ("bool", [1]), ("shape", [[1, None]]), ("shape", [(1, 2)]),
    ("string", ["\ud800"]),
])
def test_arrow_column_declines_to_pyarrow(walker, arrow_type, values):
    """A value the C layout does not take: None from it, and the column is pyarrow's (the same
    array, or the same error)."""
    import pyarrow as pa

    kind = pa.list_(pa.int64()) if arrow_type == "shape" else pa.type_for_alias(arrow_type)
    assert walker.arrow_column(values, columns._kind(pa, kind), None) is None
    try:
        want = repr(pa.array(values, kind).to_pylist())
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
        with pytest.raises(type(exc)):
            columns.column(values, kind)
        return
    assert repr(columns.column(values, kind).to_pylist()) == want
