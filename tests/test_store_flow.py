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


# -- every where-is-it question goes to the store (issue 50 item 2) ------------------------------------

def _stat(mx: float = 1.0) -> dict:
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4, 4], "Max": mx, "Min": -1.0, "Mean": 0.0,
            "Norm": 1.0, "requires_grad": False}


def _put_dump(prefix: str, scale: float = 1.0) -> None:
    """A one-rank statistics dump written straight into the counting store at ``prefix``."""
    import json

    data = {"Torch.matmul.0.forward": {"input_args": [_stat(), _stat()], "input_kwargs": {}, "output": [_stat(scale)]},
            "Functional.relu.0.forward": {"input_args": [_stat(scale)], "input_kwargs": {"inplace": False},
                                          "output": [_stat(scale)]}}
    doc = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "data": data}
    with LOCK:
        OBJECTS[f"{prefix}/step0/rank/dump.json"] = json.dumps(doc).encode()
        OBJECTS[f"{prefix}/step0/rank/stack.json"] = b"{}"
        OBJECTS[f"{prefix}/step0/rank/construct.json"] = b"{}"


def _local_files(where) -> list:
    return sorted(str(path.relative_to(where)) for path in where.rglob("*"))


def test_compare_output_goes_into_a_registered_store(tmp_path, monkeypatch):
    """compare -o counting://...: the CSV and summary.json are the store's objects, nothing is
    written under the working directory, and summary_file names the store's URL."""
    from msprobe.cli import main
    from msprobe.compare import compare

    _put_dump("cmpflow/a")
    _put_dump("cmpflow/b", scale=3.0)
    monkeypatch.chdir(tmp_path)
    assert main(["compare", "counting://cmpflow/a/step0", "counting://cmpflow/b/step0", "-o", "counting://cmpflow/out",
                 "--no-plot"]) == 0
    written = sorted(key for key in OBJECTS if key.startswith("cmpflow/out/"))
    assert "cmpflow/out/summary.json" in written and any(key.endswith(".csv") for key in written), written
    summary = compare("counting://cmpflow/a/step0", "counting://cmpflow/b/step0", "counting://cmpflow/out2", plot=False)
    assert summary["summary_file"] == "counting://cmpflow/out2/summary.json", summary["summary_file"]
    assert "cmpflow/out2/summary.json" in OBJECTS
    assert _local_files(tmp_path) == []


def test_run_ut_reads_and_writes_through_a_registered_store(tmp_path, monkeypatch):
    """run_ut of a dump in the counting store, -o and the error data in the store too: its two
    CSVs are published there (today's code wrote them into a local directory named
    'counting:'), the summary names their URLs, and nothing is left under the working directory."""
    pytest.importorskip("torch")
    from msprobe.run_ut import run_ut

    _put_dump("utflow/run")
    monkeypatch.chdir(tmp_path)
    summary = run_ut("counting://utflow/run/step0/rank/dump.json", "counting://utflow/out", workers=0, progress=False,
                     save_error_data_flag=True)
    assert summary["checked"] == 2, summary
    for key in ("result_csv", "details_csv"):
        assert summary[key].startswith("counting://utflow/out/"), summary[key]
        assert summary[key][len("counting://"):] in OBJECTS, (summary[key], sorted(OBJECTS))
    assert summary["error_data"].startswith("counting://utflow/out/ut_error_data"), summary["error_data"]
    assert _local_files(tmp_path) == []


def test_lake_sql_and_its_own_files_in_a_registered_store(tmp_path, monkeypatch):
    """A lake over a counting root, its own files in another counting prefix (lake_dir, the
    root's options): DuckDB reads the index through the store (no local path, no httpfs)."""
    pytest.importorskip("duckdb")
    import msprobe.lake

    _put_dump("lakeflow/root/run_a")
    _put_dump("lakeflow/root/run_b", scale=2.0)
    monkeypatch.chdir(tmp_path)
    with msprobe.lake.open("counting://lakeflow/root", local=False, lake_dir="counting://lakeflow/own") as lake:
        assert sorted(set(lake.catalog["run"])) == ["run_a", "run_b"]
        rows = lake.sql("SELECT run, count(*) AS n FROM lake GROUP BY run ORDER BY run")
        assert list(rows["run"]) == ["run_a", "run_b"] and all(rows["n"] > 0)
        assert lake.sql_engine == "pyarrow"
    assert any(key.startswith("lakeflow/own/") for key in OBJECTS)
    assert not any(key.startswith("lakeflow/root/_lake/") for key in OBJECTS)
    assert _local_files(tmp_path) == []
