"""find_origin passes over the records the engine's columns clear (msprobe/compare/_quiet.py): the
records it leaves out are records where no leaf departs, and the origin is the same with and without.

Seeded dumps plant what a departure branches on: statistics a little and far off, NaN/Inf on one
side, a dtype or shape change, a scalar argument changed, int/None/str/bool statistics, a record the
bench repeats a suffix of, a target record repeating one, records only one side has; each check runs
over every record (the superset property) and over the whole compare (the answer).
"""
from __future__ import annotations

import copy
import random

import pytest

from msprobe.compare import _core, _origin
from msprobe.compare._columnar import columnar_pair
from msprobe.compare._match import match_records
from msprobe.compare._plan import PairContext
from msprobe.compare._rows import record_leaves
from msprobe.format.native import leafwalk


def _tensor(rng: random.Random, grad: bool = True) -> dict:
    top = rng.uniform(0.5, 3.0)
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4, 8], "Max": top, "Min": -top,
            "Mean": rng.uniform(-0.1, 0.1), "Norm": top * 5, "requires_grad": grad}


def _doc(rng: random.Random, count: int) -> dict:
    data = {}
    for i in range(count):
        data[f"Functional.linear.{i}.forward"] = {"input_args": [_tensor(rng), _tensor(rng)],
                                                  "input_kwargs": {"alpha": {"type": "float", "value": 1.0}},
                                                  "output": [_tensor(rng, False)]}
        data[f"Tensor.add.{i}.forward"] = {"input_args": [copy.deepcopy(data[f"Functional.linear.{i}.forward"]
                                                                        ["output"][0]), _tensor(rng)],
                                           "output": [_tensor(rng, False)]}
    return data


def _mutate(rng: random.Random, bench: dict, plant: str) -> None:
    names = list(bench)
    name = names[rng.randrange(5, len(names))]
    record = bench[name]
    leaf = record["output"][0] if rng.random() < 0.5 else record["input_args"][rng.randrange(2)]
    if plant == "small":
        leaf["Max"] *= 1 + 5e-5
    elif plant == "large":
        leaf["Norm"] *= 1.05
    elif plant == "nan":
        leaf["Mean"] = float("nan")
    elif plant == "dtype":
        leaf["dtype"] = "torch.float16"
    elif plant == "shape":
        leaf["shape"] = [8, 4]
    elif plant == "scalar" and "input_kwargs" in record:
        record["input_kwargs"]["alpha"]["value"] = 2.0
    elif plant == "odd":
        leaf["Max"], leaf["Min"], leaf["Mean"] = 3, None, "1.5"
    elif plant == "bool":
        leaf["Min"] = True
    elif plant == "repeat":
        record["repeat"] = [leaf, copy.deepcopy(leaf)]
        record["repeat"][1]["Norm"] *= 2
    elif plant == "missing":
        del bench[name]
    elif plant == "extra":
        bench[f"Torch.relu.{len(names)}.forward"] = {"input_args": [copy.deepcopy(leaf)], "output": [leaf]}


PLANTS = ["none", "small", "large", "nan", "dtype", "shape", "scalar", "odd", "bool", "repeat", "missing", "extra"]


class _Source:
    rank = 0
    report = None

    def frames_of(self, name):
        return None


def _pair(seed: int, plants: list) -> tuple:
    rng = random.Random(seed)
    target = _doc(rng, 40)
    bench = copy.deepcopy(target)
    for plant in plants:
        if plant != "none":
            _mutate(rng, bench, plant)
    if "repeat" in plants:  # the target repeats a suffix too
        name = next(iter(target))
        target[name]["repeat"] = [target[name]["output"][0], target[name]["output"][0]]
    return target, bench


@pytest.mark.parametrize("seed", range(24))
def test_the_records_left_out_do_not_depart_and_the_origin_is_the_same(seed, tmp_path):
    assert leafwalk() is not None, ("msprobe.format._leafwalk could not be built (a C compiler is needed; "
                                    "MSPROBE_LAKE_NATIVE=0 must not be set for this test)")
    rng = random.Random(seed)
    plants = [PLANTS[seed % len(PLANTS)]] + rng.sample(PLANTS, 2)
    target, bench = _pair(seed, plants)
    pairs, rest, _ = match_records(target, bench, {}, {}, "auto")
    for mode in ("statistics", "tensor"):
        context = PairContext(target_data=target, bench_data=bench, pairs=pairs, rest=rest, target_source=_Source(),
                              bench_source=_Source(), mode=mode)
        path = tmp_path / f"{mode}.csv"
        path.write_text("")
        columnar_pair(context, str(path))
        departing = context.departing
        assert departing is not None
        tensor_task = mode == "tensor"
        for index, (name, other) in enumerate(pairs):
            if other is None or index in departing:
                continue
            bench_leaves = {suffix: leaf for suffix, leaf, _ in record_leaves(other, bench[other], tensor_task)}
            inputs, outputs = _origin._departures(record_leaves(name, target[name], tensor_task), bench_leaves, False)
            assert not any(size > _origin.ORIGIN_THRESHOLD or note for *_, size, note in inputs + outputs), (name, plants)
        args = (target, bench, pairs, rest, mode)
        assert _origin.find_origin(*args, rank=0, departing=departing) == _origin.find_origin(*args, rank=0), plants


def test_compare_walks_fewer_records_for_the_same_answer(tmp_path, monkeypatch):
    """Over a healthy pair the walk looks at no record's leaves at all (every record is cleared)."""
    import json
    import os

    assert leafwalk() is not None, ("msprobe.format._leafwalk could not be built (a C compiler is needed; "
                                    "MSPROBE_LAKE_NATIVE=0 must not be set for this test)")

    target, bench = _pair(3, ["none"])
    for side, data in (("t", target), ("b", bench)):
        os.makedirs(tmp_path / side / "rank0")
        (tmp_path / side / "rank0" / "dump.json").write_text(json.dumps({"task": "statistics", "level": "L1",
                                                                         "framework": "pytorch", "data": data}))
    walked: list = []
    real = _origin._departures
    monkeypatch.setattr(_origin, "_departures", lambda *a, **k: walked.append(1) or real(*a, **k))
    got = _core.compare(str(tmp_path / "t"), str(tmp_path / "b"), str(tmp_path / "out"), plot=False, progress=False)
    assert got["origin"] is None and walked == []


def test_produced_by_all_equals_the_walk_per_record():
    """The signatures find_origin adds for the records it passed over, from one C walk per side
    (``produced_by_all``), equal the Python walk's per record on every fixture document paired with
    itself and with a perturbed copy (comm records' buffers, parameters_grad, debug records included)."""
    from tests._dump_docs import fixture_data

    assert leafwalk() is not None, "msprobe.format._leafwalk could not be built (a C compiler and Python's headers)"
    rng = random.Random(5)
    checked = 0
    for _, data in fixture_data():
        bench = copy.deepcopy(data)
        names = list(data)
        for name in names[::3]:
            bench.pop(name)
        pairs = [(name, name) for name in names if name in bench]
        for tensor_task in (False, True):
            for rank in (None, 0, 1):
                want = [signature for pair in pairs
                        for signature in _origin._produced_by(data, bench, pair, tensor_task, rank)]
                assert _origin.produced_by_all(data, bench, pairs, tensor_task, rank) == want
        checked += len(pairs)
    doc = _doc(rng, 40)
    pairs = [(name, name) for name in doc]
    want = [s for pair in pairs for s in _origin._produced_by(doc, doc, pair, False, None)]
    assert want and _origin.produced_by_all(doc, doc, pairs, False, None) == want
    assert checked > 100
