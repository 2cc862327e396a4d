"""The whole flow through a backend written only in the tests (tests/backends/test_backends_counting.py's
CountingStore: a dict behind the Store ABC, no file system, no fsspec): dump -> read -> index ->
lake -> compare, with no fallback to a local path (the store has none) and its counters showing
that it served every stage."""
from __future__ import annotations

import threading
from collections import Counter

import pytest

from msprobe.backends import register_store
from tests.backends.test_backends_counting import CountingStore

OBJECTS: dict = {}
COUNTS: Counter = Counter()
LOCK = threading.Lock()


def _open_counting(url: str, options: dict, *, read_only: bool, create: bool) -> CountingStore:
    assert not options
    return CountingStore(OBJECTS, url.split("://", 1)[1].strip("/"), read_only=read_only, counts=COUNTS, lock=LOCK)


register_store("counting", _open_counting)


def _served(stage) -> Counter:
    before = Counter(COUNTS)
    stage()
    return COUNTS - before


def _train(url: str, seed: int) -> None:
    import torch

    from msprobe.pytorch import PrecisionDebugger

    torch.manual_seed(seed)
    PrecisionDebugger._reset()
    dbg = PrecisionDebugger(dump_path=url, task="statistics", level="L1")
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    dbg.start(m)
    m(torch.ones(2, 4)).sum().backward()
    dbg.stop()
    dbg.step()
    PrecisionDebugger._reset()


def test_dump_read_index_lake_compare_through_a_test_only_backend(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    import msprobe.readers
    from msprobe.backends import LocalStore

    def no_local(*args, **kwargs):
        raise AssertionError("a local store was opened: the flow left the test-only backend")

    monkeypatch.setattr(LocalStore, "__init__", no_local)
    wrote = _served(lambda: [_train(f"counting://lake/run_{name}", seed) for name, seed in (("a", 1), ("b", 2))])
    assert wrote["put"] > 0, wrote
    assert any(key.startswith("lake/run_a/step0/") and key.endswith("dump.json") for key in OBJECTS), sorted(OBJECTS)

    names: list = []
    read = _served(lambda: names.extend(record.name for record in msprobe.readers.open("counting://lake/run_a")))
    assert names and read["get"] + read["get_range"] + read["open_read"] > 0, read

    from msprobe.cli import main

    indexed = _served(lambda: [main(["index", f"counting://lake/run_{name}"]) for name in "ab"])
    assert indexed["put"] > 0, indexed
    assert any("/.msprobe_index/" in key or key.endswith(".parquet") for key in OBJECTS if key.startswith("lake/run_a/")), (
        sorted(OBJECTS))

    pytest.importorskip("duckdb")
    import msprobe.lake

    result: dict = {}

    def lake() -> None:
        with msprobe.lake.open("counting://lake", local=False) as opened:
            result["runs"] = sorted(set(opened.catalog["run"]))
            result["diverge"] = opened.diverge("run_a", "run_b")

    asked = _served(lake)
    assert asked["get"] + asked["list_dir"] + asked["list_prefix"] > 0, asked
    assert result["diverge"]["first_divergence"] is not None, result
    assert result["runs"] == ["run_a", "run_b"], result
    assert asked["put"] > 0, asked  # the lake's own catalog went into the store too

    out = tmp_path / "cmp"
    compared = _served(lambda: result.setdefault("rc", main(["compare", "counting://lake/run_a/step0",
                                                             "counting://lake/run_b/step0", "-o", str(out), "--no-plot"])))
    assert result["rc"] == 0 and compared["get"] + compared["get_range"] > 0, compared
    assert any(out.rglob("*.csv")) or any(out.rglob("*.xlsx")), list(out.rglob("*"))
