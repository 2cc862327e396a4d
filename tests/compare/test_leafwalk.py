"""The C leaf walk (msprobe/format/_leafwalk.c) against the Python code it stands in for.

``leaves`` against :func:`msprobe.compare._rows.record_leaves`, ``plan_block`` (through
:func:`msprobe.compare._plan.plan_rows`) against the Python planner, and ``leaf_fields`` against
``Leaves.finish`` without it: on every dump.json of the tests' fixtures (both tensor_task values)
and on records built to reach each branch (parameters_grad, debug, kwargs tensors, is_recompute,
parameters before outputs, nested lists and objects, duplicate suffixes, bench leaves no target
leaf takes, bench-only records, scalars, null, slices, ellipsis, odd statistics). The module is
built here on first use (a C compiler is part of the test set-up): a machine that cannot build it
fails, it does not skip.
"""
from __future__ import annotations

import pytest

from msprobe.compare import _plan
from msprobe.compare._plan import PairContext, plan_rows
from msprobe.compare._rows import record_leaves
from msprobe.format.model import TENSOR_TYPES
from msprobe.format.native import leafwalk
from tests._dump_docs import fixture_data


@pytest.fixture(scope="module")
def walker():
    mod = leafwalk()
    assert mod is not None, ("msprobe.format._leafwalk is neither installed nor built in the cache: a C compiler "
                             "and Python's headers are needed (MSPROBE_LAKE_NATIVE=0 must not be set for this test)")
    return mod


def _tensor(value: float, **extra) -> dict:
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 3], "Max": value, "Min": -value,
            "Mean": value / 2, "Norm": value * 3, "requires_grad": True, **extra}


#: records that reach every branch of record_leaves and of the planner
CRAFTED = {
    "Functional.linear.0.forward": {
        "input_args": [_tensor(1.0), [_tensor(2.0), None, {"a": _tensor(3.0), "b": 7}], 5, "text"],
        "input_kwargs": {"alpha": {"type": "float", "value": 1.5}, "w": _tensor(4.0, data_name="w.pt"),
                         "none": None, "flag": {"type": "bool", "value": True}},
        "is_recompute": False,
        "output": [_tensor(5.0), {"type": "slice", "value": [1, 2, None]}, {"type": "ellipsis", "value": "..."}],
        "parameters": {"weight": _tensor(6.0), "bias": None},
    },
    "Module.layer.Linear.forward.0": {
        "output": _tensor(7.0), "input": [[[_tensor(8.0)]]], "extra": {"k": [_tensor(9.0), {"type": "int", "value": 3}]},
    },
    "Module.layer.Linear.parameters_grad": {"weight": [_tensor(10.0)], "bias": [_tensor(11.0), _tensor(12.0)],
                                            "scale": None},
    "save.debug": {"x": _tensor(13.0), "y": [1, {"type": "str", "value": "s"}]},
    "raw.debug.0": [_tensor(14.0), None],
    "odd.record": None,
    "Tensor.add.0.forward": {"input_args": [_tensor(float("nan")), _tensor(float("inf"))], "output": [
        {"type": "torch.Tensor", "dtype": "torch.int64", "shape": [], "Max": 3, "Min": 10 ** 30, "Mean": None,
         "Norm": "7", "requires_grad": 1, "md5": 12345},
        {"type": "torch.Tensor", "dtype": "torch.bool", "shape": [True, 2.5], "Max": True, "Min": False,
         "Mean": None, "Norm": None, "md5": "00ab12cd", "data_name": ""}]},
    "Distributed.all_reduce.0.forward": {"input_args": [_tensor(1.0)], "output": [_tensor(1.0), _tensor(1.0)]},
}


def _bench_of(target: dict) -> dict:
    """A bench with the same records, some leaves dropped, duplicated, renamed or added."""
    bench = {name: raw for name, raw in target.items()}
    bench["Functional.linear.0.forward"] = dict(target["Functional.linear.0.forward"],
                                                input_kwargs={"alpha": {"type": "float", "value": 2.5},
                                                              "extra": _tensor(1.0)})
    bench["Module.layer.Linear.forward.0"] = {"output": [_tensor(7.5), _tensor(7.5)], "input": [[[_tensor(8.0)]]]}
    bench["Tensor.add.0.forward"] = {"input_args": [_tensor(1.0), _tensor(1.0)], "input": [_tensor(2.0)],
                                     "output": [_tensor(3.0)]}
    bench["Bench.only.0.forward"] = {"input_args": [_tensor(2.0), None], "output": [_tensor(float("nan"))]}
    bench["Bench.only.1.forward"] = {"output": [{"type": "int", "value": 4}]}
    return bench


def _python_leaves(data: dict, tensor_task: bool) -> list:
    return [(name, record_leaves(name, raw, tensor_task)) for name, raw in data.items()]


def _c_leaves(walker, data: dict, tensor_task: bool) -> list:
    names, starts, suffixes, ios, leaves = walker.leaves(data, tensor_task, TENSOR_TYPES)
    return [(name, list(zip(suffixes[starts[i]:starts[i + 1]], leaves[starts[i]:starts[i + 1]],
                            ios[starts[i]:starts[i + 1]]))) for i, name in enumerate(names)]


@pytest.mark.parametrize("tensor_task", [False, True])
def test_leaves_equal_record_leaves_on_crafted_records(walker, tensor_task):
    got = _c_leaves(walker, CRAFTED, tensor_task)
    assert got == _python_leaves(CRAFTED, tensor_task)
    # identity too: the leaves are the document's own objects
    assert all(a is b for (_, mine), (_, ref) in zip(got, _python_leaves(CRAFTED, tensor_task))
               for (_, a, _), (_, b, _) in zip(mine, ref))


def test_leaves_equal_record_leaves_on_every_fixture(walker):
    for path, data in fixture_data():
        for tensor_task in (False, True):
            assert _c_leaves(walker, data, tensor_task) == _python_leaves(data, tensor_task), path


def test_leaves_declines_what_it_does_not_take(walker):
    assert walker.leaves({"a.0.forward": {"input_args": [{1: "x"}]}}, False, TENSOR_TYPES) is None
    deep: list = []
    node = deep
    for _ in range(2000):
        node.append([])
        node = node[0]
    assert walker.leaves({"a.0.forward": {"input_args": deep}}, False, TENSOR_TYPES) is None


class _Source:
    rank = 0

    def frames_of(self, name: str):
        return [f"File model.py, line {len(name)}, in forward"] if "linear" in name else None


def _plans(monkeypatch, target: dict, bench: dict, pairs: list, rest: list, mode: str) -> tuple:
    """(the C planner's plan, the Python planner's) of every block, and the bench epochs they leave."""
    context = PairContext(target_data=target, bench_data=bench, pairs=pairs, rest=rest, target_source=_Source(),
                          bench_source=_Source(), mode=mode)
    out = []
    for native in (True, False):
        if not native:
            monkeypatch.setattr(_plan, "leafwalk", lambda: None)
        state = {"bench_epoch": (-1, None)}
        plans = [plan_rows(context, start, min(start + 3, len(pairs)), start + 3 >= len(pairs), state)
                 for start in range(0, len(pairs), 3)]
        assert all((plan.native is not None) == native for plan in plans)
        out.append((plans, state))
    return out[0], out[1]


def _as_lists(plan) -> dict:
    return {key: [int(v) if hasattr(v, "item") else v for v in getattr(plan, key)] for key in
            ("row_target", "row_bench", "row_name", "row_bench_name", "row_stack", "row_group", "group_ignore",
             "group_index", "group_name", "group_bench")}


@pytest.mark.parametrize("mode", ["statistics", "md5", "tensor"])
def test_plan_equals_the_python_planner(walker, monkeypatch, mode):
    target = dict(CRAFTED)
    target["Functional.linear.1.forward"] = CRAFTED["Functional.linear.0.forward"]
    bench = _bench_of(CRAFTED)
    names = list(target)
    pairs = [(name, name if name in bench else None) for name in names]
    pairs[-1] = (names[-1], "Functional.linear.0.forward")  # one bench record paired twice
    pairs[1] = (names[1], None)  # unmatched
    rest = ["Bench.only.0.forward", "Bench.only.1.forward", "Module.layer.Linear.forward.0"]
    (native, native_state), (python, python_state) = _plans(monkeypatch, target, bench, pairs, rest, mode)
    assert native_state == python_state
    assert len(native) == len(python) > 1
    for mine, ref in zip(native, python):
        assert _as_lists(mine) == _as_lists(ref)
        assert [leaf for leaf in mine.target.leaf] == ref.target.leaf
        assert mine.bench.leaf == ref.bench.leaf
        for side in ("target", "bench"):
            leaves = getattr(mine, side)
            flagged = [True] * len(leaves.leaf)
            assert mine.seen(side, flagged) == ref.seen(side, flagged)
            some = [position % 2 == 0 for position in range(len(leaves.leaf))]
            assert mine.seen(side, some) == ref.seen(side, some)
        for side in ("target", "bench"):
            mine_leaves, ref_leaves = getattr(mine, side), getattr(ref, side)
            monkeypatch.setattr(_plan, "leafwalk", leafwalk)
            mine_leaves.finish(mode)
            monkeypatch.setattr(_plan, "leafwalk", lambda: None)
            ref_leaves.finish(mode)
            for field in ("tensor", "dtype", "shape", "requires_grad", "md5", "data_name"):
                assert getattr(mine_leaves, field) == getattr(ref_leaves, field), (side, field)
            assert mine_leaves.statistics == ref_leaves.statistics or _same_with_nan(mine_leaves.statistics,
                                                                                     ref_leaves.statistics)


def _same_with_nan(a: dict, b: dict) -> bool:
    return all(len(a[key]) == len(b[key]) and all(x is y or x == y for x, y in zip(a[key], b[key])) for key in a)


def test_plan_declines_to_the_python_planner(walker, monkeypatch):
    target = {"a.0.forward": {"input_args": [{1: _tensor(1.0)}]}}
    context = PairContext(target_data=target, bench_data=target, pairs=[("a.0.forward", "a.0.forward")], rest=[],
                          target_source=_Source(), bench_source=_Source(), mode="statistics")
    plan = plan_rows(context, 0, 1, True, {"bench_epoch": (-1, None)})
    assert plan.native is None and plan.row_name == ["a.0.forward.input.0.1"]


_TEXTS = [b"", b"1234567890123456789", b"123456789012345678", b"[1234567890123456789.5]", b"[12345678901234567890e3]",
          b'{"a": -12345678901234567890}', b'{"a":"x 12345678901234567890"}', b'{"a":"x12345678901234567890"}',
          b"[1,\n12345678901234567890]", b"[NaN, Infinity, -Infinity, --Infinity, NaNaN, InfinityNaN]",
          b'{"NaN": "Infinity", "x": [-Infinity]}', b"12345678901234567890", b"\t1234567890123456789012",
          b"[0.12345678901234567890123]", b":12345678901234567890E", b"Infinit NaNa -Infinit"]


def test_fastjson_scans_equal_the_python_ones(walker):
    import random

    from msprobe.format import fastjson

    rng = random.Random(7)
    pieces = [b"1", b"0", b"9" * 10, b" ", b"\n", b":", b",", b"[", b"-", b".", b"e", b"E", b'"', b"a", b"NaN",
              b"Infinity", b"-Infinity", b"{", b"}", b"]"]
    texts = _TEXTS + [b"".join(rng.choice(pieces) for _ in range(rng.randrange(1, 40))) for _ in range(3000)]
    for text in texts:
        assert walker.has_long_integer(text) == fastjson._has_long_integer(text), text
        marks = 1 if fastjson._has_long_integer(text) else 2 if b"NaN" in text or b"Infinity" in text else 0
        assert walker.document_marks(text) == marks, text
        assert walker.with_stand_ins(text) == fastjson._with_stand_ins(text), text


def test_restore_nonfinite_puts_back_every_stand_in_or_declines(walker):
    from msprobe.format.fastjson import _NONFINITE_VALUES

    doc = {"a": ["\x00N", {"b": "\x00I", "c": ["\x00-I", "x"]}], "d": "\x00N", "e": 1}
    assert walker.restore_nonfinite(doc, _NONFINITE_VALUES) == 4
    assert doc["a"][0] is _NONFINITE_VALUES["\x00N"] and doc["a"][1]["c"][0] == float("-inf")
    assert doc["a"][1]["b"] == float("inf") and doc["a"][1]["c"][1] == "x"
    assert walker.restore_nonfinite({"x": {"\x00N": 1}}, _NONFINITE_VALUES) is None


def test_csv_rows_equal_the_python_writer(walker, tmp_path, monkeypatch):
    from msprobe.compare import _write

    columns = [["a", "b,c", 'say "hi"', "multi\nline", "cr\rhere", "", "ünïcödé, ok", "ok"],
               ["1.5", "-inf", "nan", "N/A", '"', ",", "x" * 300, "日本"]]
    native, python = tmp_path / "native.csv", tmp_path / "python.csv"
    _write.write_columns(str(native), columns)
    monkeypatch.setattr(_write, "leafwalk", lambda: None)
    _write.write_columns(str(python), columns)
    assert native.read_bytes() == python.read_bytes()
    assert walker.csv_rows([["a", 1]]) is None  # a cell that is no str: the Python writer decides
    assert walker.csv_rows([["a", "b"], ["c"]]) is None


def test_csv_rows_grow_past_their_first_guess(walker, tmp_path, monkeypatch):
    """Rows far longer than the writer's first estimate of a row (its buffer grows) and many short
    ones: the same bytes as the Python writer."""
    from msprobe.compare import _write

    columns = [["x" * 5000 + str(k) for k in range(50)] + ["a"] * 2000,
               [f'"{k}",' * 400 for k in range(50)] + ["b,"] * 2000]
    native, python = tmp_path / "native.csv", tmp_path / "python.csv"
    _write.write_columns(str(native), columns)
    monkeypatch.setattr(_write, "leafwalk", lambda: None)
    _write.write_columns(str(python), columns)
    assert native.read_bytes() == python.read_bytes()


def test_csv_rows_float_columns_write_what_the_texts_would(walker, tmp_path, monkeypatch):
    """A FloatCells column (floats written by the C writer from orjson's text, overrides as given)
    gives the bytes of its texts written as a list of str: every magnitude, NaN/inf, -0.0, the
    1e-5..1e-4 band, one-digit exponents, a % suffix, overrides that need quoting; a text that does
    not line up with the values is declined (the Python writer then takes the texts)."""
    import numpy as np

    from msprobe.compare import _write
    from msprobe.compare._floattext import FloatCells

    rng = np.random.default_rng(34)
    count = 5000
    values = rng.standard_normal(count) * 10.0 ** rng.integers(-330, 308, count)
    values[:12] = [0.0, -0.0, np.nan, np.inf, -np.inf, 1e-5, -1.5e-5, 9.99e-05, 1e-7, 5e-324, 1e16, 1e22]
    overrides = [None] * count
    for k, text in zip(rng.integers(0, count, 40).tolist(), ["N/A", "0", "nan", 'a "b", c', "x\ny", "inf"] * 7):
        overrides[k] = text
    names = [f"row.{k}" for k in range(count)]
    columns = [names, FloatCells(values, "", overrides), FloatCells(values[::-1], "%", overrides[::-1]), names]
    lazy, texts = tmp_path / "lazy.csv", tmp_path / "texts.csv"
    _write.write_columns(str(lazy), columns)
    _write.write_columns(str(texts), [column.tolist() if isinstance(column, FloatCells) else column
                                      for column in columns])
    assert lazy.read_bytes() == texts.read_bytes()
    want = [repr(value) for value in values.tolist()]
    assert columns[1].tolist() == [want[k] if overrides[k] is None else overrides[k] for k in range(count)]
    assert columns[2][0] == (overrides[-1] if overrides[-1] is not None else repr(float(values[-1])) + "%")
    column = columns[1].csv_column()
    short = column[0][:column[0].rindex(b",")] + b"]"  # the last cell left out
    assert walker.csv_rows([names, (short, *column[1:])]) is None
    assert walker.csv_rows([names, (column[0], column[1], "", overrides[:-1])]) is None  # an override short
    monkeypatch.setattr(_write, "leafwalk", lambda: None)
    python = tmp_path / "python.csv"
    _write.write_columns(str(python), columns)
    assert python.read_bytes() == texts.read_bytes()
