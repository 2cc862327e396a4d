"""The comparison past 26.2.0's perturbation (tests/dumpers/zoo_compare.py, spec/PRODUCER.md §20 item 43 (d)):
which records it covers, and that it drops the values only, never the structure."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo_compare as zoo
from test_conformance import compare_values

NAMES = ["Functional.linear.0.forward", "Module.fc.Linear.forward.0", "Functional.linear.0.backward",
         "Module.fc.Linear.parameters_grad", "Tensor.add_.0.forward"]


def _entry(**over):
    return dict({"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 3], "Max": 1.5, "Min": -0.5,
                 "Mean": 0.25, "Norm": 2.0, "requires_grad": False, "md5": "0a1b2c3d"}, **over)


def test_reached_from_the_first_backward_record_at_l0_and_mix_only():
    for level in ("L0", "mix"):
        assert list(zoo.reached(level, NAMES).values()) == [False, False, True, True, True]
        assert all(zoo.reached(level, NAMES[:2], before=True).values())  # a later step
    assert not any(zoo.reached("L1", NAMES, before=True).values())  # 26.2.0 perturbs nothing at L1


def _problems(real, ours) -> list:
    found: list = []
    compare_values(zoo.unvalued({"input": [real]}), zoo.unvalued({"input": [ours]}), "r", found, {})
    return found


def test_unvalued_drops_the_values_and_keeps_the_structure():
    assert _problems(_entry(), _entry(Max=1.6, Mean=-0.25, md5="ffffffff")) == []
    assert _problems(_entry(), _entry(shape=[3, 2]))  # shape
    assert _problems(_entry(), _entry(dtype="torch.float64"))  # dtype
    assert _problems(_entry(), _entry(requires_grad=True))  # requires_grad
    assert _problems(_entry(), _entry(Max=float("nan")))  # NaN-ness
    assert _problems(_entry(), _entry(Min=float("-inf")))  # inf-ness
    assert _problems(_entry(), _entry(Mean=None))  # null-ness
    assert _problems(_entry(), None)  # a gradient where the other has none
    # a non-tensor argument keeps its value
    assert _problems({"type": "float", "value": 0.5}, {"type": "float", "value": 0.25})
    assert zoo.values_in({"input": [_entry(), None, {"type": "int", "value": 3}]}) == 5
