"""The tests every framework adapter passes (msprobe/dumpers/adapter.py's contract, both ways),
shipped beside :class:`~msprobe.testing.StoreTests` for adapters written elsewhere, as zarr's
``StoreTests`` for its stores: a framework's test module subclasses :class:`AdapterTests` and says
how to make its dumper, its tensors and its calls::

    from msprobe.testing import AdapterTests

    class TestMyAdapter(AdapterTests):
        framework = "myframework"
        collective_key = "Distributed.all_reduce"
        plain_key = "Functional.relu"
        def make_dumper(self, config): ...
        def tensor(self, values): ...
        ...

PyTorch runs it in tests/dumpers/test_adapter.py, MindSpore in its venv
(tests/dumpers/mindspore/ms_test_adapter.py). The suite imports no framework itself: it works
through the subclass and the real framework's dumper (its encoder, API wrappers, guard, session),
never a stand-in. Needs pytest and numpy; ``import msprobe`` never imports this module.
"""
from __future__ import annotations

import glob
import inspect
import json
import math
import os
from typing import Any, Callable

import numpy as np
import pytest

from msprobe.dumpers import control
from msprobe.dumpers.adapter import FrameworkAdapter
from msprobe.dumpers.config import DumpConfig
from msprobe.dumpers.session import PendingStats
from msprobe.format.stats import MAX, MEAN, MIN, NORM


class AdapterTests:
    """Subclass it (a ``Test...`` class) and fill in what follows."""

    framework: str = ""  # the name the dumper writes in dump.json
    collective_key: str = ""  # an API key the framework's dumper takes for a communication call
    plain_key: str = ""  # an API key of an ordinary (not communication) call

    def make_dumper(self, config: DumpConfig) -> Any:
        raise NotImplementedError

    def tensor(self, values: Any) -> Any:
        """A float32 tensor of ``values`` (a list, or a number: 0-d)."""
        raise NotImplementedError

    def to_numpy(self, t: Any) -> np.ndarray:
        raise NotImplementedError

    def relu(self, x: Any) -> Any:
        """A call of the framework's ``relu`` through its public API (the one the wrappers replace)."""
        raise NotImplementedError

    def assign(self, t: Any, value: float) -> None:
        """Write ``value`` into every element of ``t`` in place."""
        raise NotImplementedError

    def grad_of(self, fn: Callable[[Any], Any], x: Any) -> Any:
        """The gradient of ``fn(x).sum()`` with respect to ``x``."""
        raise NotImplementedError

    # ------------------------------------------------------------------ helpers
    @pytest.fixture
    def dumper(self, tmp_path):
        d = self.make_dumper(DumpConfig(task="statistics", level="L1", dump_path=str(tmp_path / "dump")))
        try:
            yield d
        finally:
            d.close()

    @staticmethod
    def dump_json(dumper: Any, step: int = 0) -> dict:
        found = glob.glob(os.path.join(dumper.config.dump_path, f"step{step}", "*", "dump.json"))
        assert len(found) == 1, found
        with open(found[0], encoding="utf-8") as f:
            return json.load(f)

    @staticmethod
    def named(data: dict, part: str, suffix: str) -> list:
        return [name for name in data if part in name and name.endswith(suffix)]

    # ------------------------------------------------------------------ the contract
    def test_declares_its_collaborators(self, dumper):
        """The adapter names its encoder, patcher, guard, statistics fetch and rank; the core is built of them."""
        assert isinstance(dumper, FrameworkAdapter)
        core = dumper.core
        assert dumper.framework == self.framework and dumper.session.framework == self.framework
        assert type(core.encoder()) is dumper.encoder_cls and type(core.patcher()) is dumper.patcher_cls
        assert core.guard is dumper.guard
        assert dumper.session.fetch_stats is dumper.fetch_stats
        assert dumper.get_rank() is None and core.rank() is None  # no distributed job here
        assert core.patcher().installed  # L1: the wrappers go in with the dumper, pass-through until start()

    def test_what_a_collective_is(self, dumper):
        assert dumper.is_collective(self.collective_key)
        assert not dumper.is_collective(self.plain_key)

    def test_stat_handles_are_typed_and_fetched(self, dumper):
        """The encoder returns what it made: the entries, and the statistics it has not computed yet
        as ``(entry, handle)`` pairs (``take_stats``) whose handles are small typed objects (not probed
        tuples); an entry not among them has its statistics already (a synchronous path, as PyTorch's C
        entry of a CPU tensor); once the adapter's fetch resolves the handles, every entry holds the
        values numpy computes."""
        self.check_stat_handles(dumper)

    def check_stat_handles(self, dumper: Any) -> list:
        """The check of :meth:`test_stat_handles_are_typed_and_fetched`; returns the pairs made (an
        adapter with more than one path checks each: tests/dumpers/test_adapter.py)."""
        values: list = [[1.5, -2.0, 4.0, 0.25], 3.0]
        encoder = dumper.core.encoder()
        encoder.take_stats()
        entries = [encoder.encode(self.tensor(v), f"Case.{i}.forward.input.0", False)
                   for i, v in enumerate(values)]
        made = encoder.take_stats()
        assert encoder.take_stats() == []
        assert all(any(entry is mine for mine in entries) for entry, _ in made)
        waiting = [entry for entry, _ in made]
        for entry in entries:
            assert any(entry is w for w in waiting) or entry.get(MAX.key) is not None, entry
        for _, handle in made:
            assert type(handle) is not tuple and hasattr(type(handle), "_fields"), type(handle)
        pending = PendingStats()
        pending.extend(made)
        pending.resolve(dumper.fetch_stats)
        for entry, v in zip(entries, values):
            a = np.asarray(v, dtype=np.float32)
            assert entry[MAX.key] == a.max() and entry[MIN.key] == a.min()
            assert math.isclose(entry[MEAN.key], float(a.mean()), rel_tol=1e-6)
            assert math.isclose(entry[NORM.key], float(np.linalg.norm(a)), rel_tol=1e-6)
        return made

    # ------------------------------------------------------------------ recording an API call
    def test_records_an_api_call_through_the_wrappers(self, dumper):
        x = self.tensor([1.0, -2.0, 3.0])
        self.relu(x)  # before start(): passed through, not counted
        assert not dumper.session.api_counts
        dumper.start()
        out = self.relu(x)
        assert not dumper.guard.inside  # the core gave the guard back
        dumper.stop()
        assert list(self.to_numpy(out)) == [1.0, 0.0, 3.0]
        data = self.dump_json(dumper)["data"]
        names = self.named(data, ".relu.", ".forward")
        assert len(names) == 1, list(data)
        rec = data[names[0]]
        assert rec["input_args"][0][MIN.key] == -2.0 and rec["output"][0][MIN.key] == 0.0
        assert rec["output"][0][MAX.key] == 3.0

    def test_collective_outputs_are_its_arguments_after_the_call(self, dumper):
        """A communication call: its inputs as they were, its outputs its arguments after the call."""
        x = self.tensor([1.0, 2.0])
        dumper.start()
        result = dumper.on_api(lambda t: self.assign(t, 7.0), self.collective_key, (x,), {})
        dumper.stop()
        assert result is None
        data = self.dump_json(dumper)["data"]
        (name,) = [n for n in data if n.endswith(".forward")]
        rec = data[name]
        assert name.startswith(self.collective_key + ".")
        assert rec["input_args"][0][MAX.key] == 2.0
        assert [entry[MAX.key] for entry in rec["output"]] == [7.0]

    def test_api_backward_recorded(self, dumper):
        x = self.tensor([1.0, -2.0, 3.0])
        dumper.start()
        grad = self.grad_of(self.relu, x)
        dumper.stop()
        assert list(self.to_numpy(grad)) == [1.0, 0.0, 1.0]
        data = self.dump_json(dumper)["data"]
        names = self.named(data, ".relu.", ".backward")
        assert len(names) == 1, list(data)
        rec = data[names[0]]
        assert rec["input"][0][MAX.key] == 1.0  # the gradient of relu's output
        assert rec["output"][0][MIN.key] == 0.0 and rec["output"][0][MAX.key] == 1.0  # of its input

    # ------------------------------------------------------------------ stopping
    def test_stop_publishes_and_turns_off(self, dumper):
        dumper.start()
        assert dumper.enabled and dumper.guard.on
        self.relu(self.tensor([0.5]))
        dumper.stop()
        assert not dumper.enabled and not dumper.guard.on
        first = self.dump_json(dumper)
        assert self.named(first["data"], ".relu.", ".forward")
        self.relu(self.tensor([0.5]))  # after stop(): not recorded
        dumper.stop()  # a second stop() changes nothing
        assert self.dump_json(dumper) == first

    # ------------------------------------------------------------------ the reverse contract
    def test_the_core_hands_each_record_its_statistics_once(self, dumper):
        """What the encoder made for a record goes to the session with the record (nothing is left
        with the encoder), and dump.json's statistics are the values of the call."""
        encoder = dumper.core.encoder()
        dumper.start()
        self.relu(self.tensor([1.0, -2.0, 3.0]))
        assert encoder.take_stats() == []  # handed over with the record
        dumper.stop()
        rec = self.dump_json(dumper)["data"][self.named(self.dump_json(dumper)["data"], ".relu.", ".forward")[0]]
        assert rec["input_args"][0][MAX.key] == 3.0 and rec["output"][0][MIN.key] == 0.0

    def test_the_adapter_asks_the_core_through_its_methods(self, dumper):
        """Through start, an API call and its backward, stop and step, nothing outside the core's own
        classes (msprobe/dumpers/control.py, records.py) reads or writes the core's private state (its
        session, stacks, sets, filter, flags: the ``_`` attributes): the adapter asks the core's public
        methods."""
        core = dumper.core
        home = {os.path.abspath(inspect.getfile(cls)) for cls in type(core).__mro__ if cls is not object}
        assert os.path.abspath(control.__file__) in home
        reached: list = []

        def outside(name: str, how: str) -> None:
            if name.startswith("_") and not name.startswith("__"):
                frame = inspect.currentframe()
                caller = frame.f_back.f_back if frame is not None and frame.f_back is not None else None
                where = os.path.abspath(caller.f_code.co_filename) if caller is not None else "?"
                if where not in home:
                    reached.append(f"{name} {how} {where}:{caller.f_lineno if caller is not None else 0}")

        class Watched(type(core)):
            def __getattribute__(self, name: str) -> Any:
                outside(name, "read from")
                return object.__getattribute__(self, name)

            def __setattr__(self, name: str, value: Any) -> None:
                outside(name, "set from")
                object.__setattr__(self, name, value)

        core.__class__ = Watched
        try:
            dumper.start()
            x = self.tensor([1.0, -2.0, 3.0])
            self.relu(x)
            self.grad_of(self.relu, x)
            dumper.stop()
            dumper.step()
        finally:
            core.__class__ = Watched.__mro__[1]
        assert not reached, reached
        assert self.dump_json(dumper)["data"]
