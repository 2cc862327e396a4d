"""Files of every era and files that are no dump (issue 41): fragments, headers without ``framework``,
1.x dumps, names outside the grammar, folders that are nothing, and a server that listens before
it prints its URL. Each case fails on the code before the issue."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import msprobe.readers
from msprobe.errors import DocumentError
from msprobe.format.dialects import detect_dialect
from msprobe.format.stats import reference_stats

ROOT = Path(__file__).resolve().parents[1]


def _t(dtype: str = "torch.float32", shape=(2, 3), **stats) -> dict:
    entry = {"type": "torch.Tensor", "dtype": dtype, "shape": list(shape), "Max": 1.0, "Min": -1.0, "Mean": 0.1,
             "Norm": 2.0, "requires_grad": False}
    entry.update(stats)
    return entry


def _write(folder: Path, obj: dict, name: str = "dump.json") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(obj))
    return folder


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), MSPROBE_LAKE_CACHE=str(cwd / "_cache"))
    return subprocess.run([sys.executable, "-m", "msprobe", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


# -- 1. fragments -------------------------------------------------------------------------------------------------

def test_a_2023_forward_info_fragment_reads_as_forward_api_records(tmp_path):
    _write(tmp_path / "frag", {"Functional*silu*0": {"args": [_t()], "kwargs": {"inplace": False}}})
    dump = msprobe.readers.open(tmp_path / "frag")
    rec = dump.record("Functional.silu.0.forward")
    assert (rec.kind, rec.direction, rec.input_args[0].max) == ("api", "forward", 1.0)
    assert "inplace" in rec.input_kwargs
    summary = dump.summary()
    assert "2023" in summary["fragment"] and summary["rank_dirs"][0]["records"] == 1


def test_a_run_ut_forward_json_fragment_reads_and_validate_says_what_it_is(tmp_path):
    _write(tmp_path / "frag", {"Functional.relu.0.forward": {"input_args": [_t()], "input_kwargs": {},
                                                              "output": [_t(Min=0.0)]}})
    assert [r.name for r in msprobe.readers.open(tmp_path / "frag").records()] == ["Functional.relu.0.forward"]
    r = _cli("validate", "frag", cwd=tmp_path)
    assert r.returncode == 1 and "api-info fragment" in r.stdout + r.stderr


@pytest.mark.parametrize("obj", [{}, {"hello": {"x": 1}}, {"Functional.relu.0.forward": 3}])
def test_a_header_less_object_that_is_no_fragment_is_a_typed_error_not_an_empty_dump(tmp_path, obj):
    _write(tmp_path / "d", obj)
    with pytest.raises(DocumentError, match="not an msprobe dump document"):
        msprobe.readers.open(tmp_path / "d").records()
    for cmd in (["ls", "d"], ["index", "d"], ["compare", "d", "d", "-o", "out"]):
        r = _cli(*cmd, cwd=tmp_path)
        assert r.returncode != 0 and "not an msprobe dump document" in r.stderr, (cmd, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr


# -- 2. report on a folder that is nothing --------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["empty", "junk", "old compare csv"])
def test_report_and_lake_questions_refuse_a_folder_that_is_neither_dump_nor_compare_output(tmp_path, kind):
    pytest.importorskip("duckdb")
    folder = tmp_path / "f"
    folder.mkdir()
    if kind == "junk":
        (folder / "a.txt").write_text("hello")
    elif kind == "old compare csv":
        (folder / "compare_result_20240101.csv").write_text("NPU Name,Bench Name,Result\nx,x,pass\n")
    r = _cli("report", "f", "-o", "r.html", cwd=tmp_path)
    assert r.returncode == 1 and "nothing to show" in r.stderr and not (tmp_path / "r.html").exists()
    assert ("summary.json" in r.stderr) == (kind == "old compare csv")
    r = _cli("lake", "nan", "f", "--no-cluster", cwd=tmp_path)
    assert r.returncode == 1 and "no runs" in r.stderr, r.stdout


# -- 3. framework ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("type_name, framework", [("mindspore.Tensor", "mindspore"), ("torch.Tensor", "pytorch")])
def test_framework_is_inferred_from_entry_types_and_says_so(tmp_path, type_name, framework):
    entry = dict(_t(), type=type_name)
    _write(tmp_path / "d" / "step0" / "rank", {"task": "statistics", "level": "L1", "dump_data_dir": None,
                                               "data": {"Functional.relu.0.forward": {"input_args": [entry]}}})
    dump = msprobe.readers.open(tmp_path / "d")
    assert dump.framework == framework
    assert dump.framework_source == f"inferred from entry type {type_name}"
    r = _cli("ls", "d", cwd=tmp_path)
    assert f"framework {framework} (inferred from entry type {type_name})" in r.stdout


def test_a_declared_framework_wins(tmp_path):
    _write(tmp_path / "d" / "step0" / "rank", {"task": "statistics", "level": "L1", "framework": "mindspore",
                                               "data": {"Functional.relu.0.forward": {"input_args": [_t()]}}})
    dump = msprobe.readers.open(tmp_path / "d")
    assert (dump.framework, dump.framework_source) == ("mindspore", "declared")


# -- 4. the 1.x dialect -------------------------------------------------------------------------------------------------

def _doc_1x() -> dict:
    return {"task": "statistics", "level": "mix", "dump_data_dir": None, "data": {
        "Functional.linear.0.forward": {"input_args": [_t()], "input_kwargs": {}, "output": [_t()]},
        "Module.fc.Linear.forward.0": {"input_args": [_t()], "input_kwargs": {}, "output": [_t()]},
        "Module.fc.Linear.parameters_grad": {"weight": [_t()]},
    }}


def test_a_1x_document_is_the_1x_dialect_not_a_vote(tmp_path):
    doc = _doc_1x()
    assert detect_dialect(["rank"], doc["data"], None, doc) == "msprobe-1"
    assert detect_dialect(["rank"], doc["data"], None) in ("msprobe-8", "msprobe-26")  # the vote, without the header
    with_8 = dict(doc, framework="pytorch")
    assert detect_dialect(["rank"], with_8["data"], None, with_8) != "msprobe-1"
    _write(tmp_path / "d" / "step0" / "rank", doc)
    assert msprobe.readers.open(tmp_path / "d").dialect == "msprobe-1"
    assert "dialect msprobe-1" in _cli("validate", "d", cwd=tmp_path).stdout


def test_1x_statistics_rules_are_8x_float_rules():
    import numpy as np

    ints = np.array([1, 2, 3], dtype=np.int64)
    assert reference_stats(ints, dialect="msprobe-1") == reference_stats(ints, dialect="msprobe-8")
    assert isinstance(reference_stats(ints, dialect="msprobe-1")[0], float)


# -- 5. names outside the grammar ------------------------------------------------------------------------------------

def test_names_outside_the_grammar_read_tolerantly_everywhere(tmp_path):
    data = {name: {"input_args": [_t()]} for name in ("api", "Module", "matmul.backward")}
    _write(tmp_path / "d" / "step0" / "rank", {"task": "statistics", "level": "L1", "framework": "pytorch",
                                               "data": data})
    dump = msprobe.readers.open(tmp_path / "d")
    for rec in dump.records():
        assert rec.kind == "unknown" and rec.parsed.kind == "unknown" and str(rec.parsed) == rec.name
    r = _cli("validate", "d", cwd=tmp_path)
    assert r.returncode == 1 and "naming grammar" in r.stdout + r.stderr  # validate reports what the readers tolerate


# -- 7. the server listens before it prints ---------------------------------------------------------------------------

def test_view_listens_before_it_prints_its_url(tmp_path):
    pytest.importorskip("uvicorn")
    pytest.importorskip("duckdb")
    _write(tmp_path / "d" / "step0" / "rank", {"task": "statistics", "level": "L1", "framework": "pytorch",
                                               "data": {"Functional.relu.0.forward": {"input_args": [_t()]}}})
    env = dict(os.environ, PYTHONPATH=str(ROOT), MSPROBE_LAKE_CACHE=str(tmp_path / "_cache"))
    proc = subprocess.Popen([sys.executable, "-m", "msprobe", "view", "d"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        deadline = time.monotonic() + 240
        while "http://" not in line and time.monotonic() < deadline:
            line = proc.stdout.readline() if proc.stdout else ""
            assert line or proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        url = line[line.index("http://"):].strip()
        with urllib.request.urlopen(url, timeout=60) as resp:  # at once: queued, never refused
            assert resp.status == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
