"""RecordFilter's answers asked at every record (issue 51): a dump with no scope, list, data_mode direction or
overflow gating answers ``wanted`` from ``on`` alone, and ``io`` from data_mode's answers made once; each
answer is the one the questions asked one by one give."""
from __future__ import annotations

import itertools

import pytest

from msprobe.dumpers.config import DumpConfig
from msprobe.dumpers.record_filter import RecordFilter

NAMES = ["Torch.add.0.forward", "Torch.add.0.backward", "Module.fc.Linear.forward.0", "Module.fc.Linear.backward.3",
         "Module.fc.Linear.parameters_grad", "Functional.relu.2.forward", "x.0.debug"]
CONFIGS = [
    {},
    {"level": "mix"},
    {"scope": ["Torch.add.0.forward", "Functional.relu.2.forward"]},
    {"list": ["relu"]},
    {"list": ["relu"], "level": "mix"},
    {"data_mode": ["forward"]},
    {"data_mode": ["backward"]},
    {"data_mode": ["input"]},
    {"data_mode": ["output"]},
    {"data_mode": ["forward", "output"]},
    {"task": "overflow_check"},
]


def _asked_one_by_one(f: RecordFilter, name: str, on: bool) -> bool:
    """``wanted``'s answer from its questions (the code before the shortcut), a fresh filter's scope state."""
    if not on or f.overflow_done or not f.in_token_range() or not f.in_scope(name) or not f.direction_on(name):
        return False
    return f.listed(name) or (f.config.level == "mix" and f.inside_listed_module())


@pytest.mark.parametrize("options", CONFIGS, ids=[str(c) for c in CONFIGS])
def test_answers_are_those_of_the_questions(options: dict) -> None:
    for name, on, token_range in itertools.product(NAMES, (True, False), (None, [0, 0])):
        f, g = RecordFilter(DumpConfig(**options), [], []), RecordFilter(DumpConfig(**options), [], [])
        if token_range is not None:
            f.set_token_range(object(), token_range)
            g.set_token_range(object(), token_range)
        assert f.wanted(name, on) == _asked_one_by_one(g, name, on), (options, name, on, token_range)
        assert f.scope_state == g.scope_state
    f = RecordFilter(DumpConfig(**options), [], [])
    config = f.config
    for direction in ("forward", "backward", "other"):
        enabled = config.forward_enabled if direction == "forward" else config.backward_enabled
        assert f.io(direction) == (enabled and config.input_enabled, enabled and config.output_enabled)


def test_a_plain_dump_does_not_ask_each_filter(monkeypatch) -> None:
    """No scope, list, direction or overflow gating: ``wanted`` is ``on``, ``io`` known, without the
    questions (each a method call, asked for every record before)."""
    f = RecordFilter(DumpConfig(), [], [])

    def asked(*_args):
        raise AssertionError("asked")

    for question in ("in_token_range", "in_scope", "direction_on", "listed", "inside_listed_module", "_io_of"):
        monkeypatch.setattr(f, question, asked)
    assert f.wanted("Torch.add.0.forward", True) is True
    assert f.wanted("Torch.add.0.backward", False) is False
    assert f.wants_all()
    assert f.io("forward") == (True, True) and f.io("backward") == (True, True)


@pytest.mark.parametrize("options", [{"scope": ["a", "b"]}, {"list": ["relu"]}, {"data_mode": ["forward"]},
                                     {"task": "overflow_check"}])
def test_a_filtered_dump_asks(options: dict) -> None:
    f = RecordFilter(DumpConfig(**options), [], [])
    assert not f.wants_all()
    f = RecordFilter(DumpConfig(), [], [])
    f.set_token_range(object(), [1, 2])
    assert not f.wants_all()  # (token_range: the forward calls of the root model counted)
    assert f.wanted("Torch.add.0.forward", True) is False
