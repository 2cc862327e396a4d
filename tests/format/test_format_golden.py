"""The golden dumps of spec/golden/: valid, round-trip byte for byte, and their statistics,
values and checksums agree with expected.json and with msprobe/format/stats.py."""
from __future__ import annotations

import filecmp
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from _fmt_support import GOLDEN, SPEC, VECTORS, open_dump

from msprobe.format.dialects import detect_dialect
from msprobe.format.documents import ConstructDocument, DebugDocument, DumpDocument, StackDocument
from msprobe.format.layout import read_mapping
from msprobe.format.naming import parse_record_name
from msprobe.format.stats import crc32_hex, reference_stats, stats_equal
from msprobe.readers.validate import validate_store

#: the goldens of generate.py; zarr-pytorch (a Zarr store, made with the package by generate_package.py)
#: is checked by tests/format/test_spec_check.py
GOLDENS = sorted(p.name for p in GOLDEN.iterdir() if (p / "expected.json").exists() and p.name != "zarr-pytorch")
DOC_CLASSES = {"dump.json": DumpDocument, "debug.json": DebugDocument, "stack.json": StackDocument,
               "construct.json": ConstructDocument}


def expected(name):
    return json.loads((GOLDEN / name / "expected.json").read_text())


def test_three_goldens():
    assert GOLDENS == ["debug-md5-pytorch", "statistics-pytorch", "tensor-mindspore"]


@pytest.mark.parametrize("name", GOLDENS)
def test_golden_validates(name):
    exp = expected(name)
    report = validate_store(open_dump(GOLDEN / name))
    assert report.ok, [str(p) for p in report.problems]
    assert [p for p in report.problems if p.severity == "warning"] == []
    assert report.records == exp["records"]
    assert report.tensor_files == len(exp["tensor_files"])
    assert report.dialects == {exp["dialect"]}


@pytest.mark.parametrize("name", GOLDENS)
def test_golden_documents_round_trip(name):
    rank = GOLDEN / name / expected(name)["rank_dirs"][0]
    for fname, cls in DOC_CLASSES.items():
        if (rank / fname).exists():
            text = (rank / fname).read_text(encoding="ascii")
            assert cls.loads(text.encode(), file=fname).dumps() == text


@pytest.mark.parametrize("name", GOLDENS)
def test_golden_marker_and_names(name):
    exp = expected(name)
    rank = GOLDEN / name / exp["rank_dirs"][0]
    marker = json.loads((rank / "msprobe_lake.json").read_text())
    assert marker["format_version"] == exp["format_version"] == "1.0"
    doc = DumpDocument.loads((GOLDEN / name / exp["document"]).read_bytes())
    assert doc.names() == exp["record_names"]
    for n in doc.names():
        assert parse_record_name(n).format() == n
    assert detect_dialect([rank.name], doc.data, marker) == "msprobe-lake"


def _lookup(record_raw, path: str):
    node = record_raw
    for part in [p for p in path.split(".") if p]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


@pytest.mark.parametrize("name", GOLDENS)
def test_golden_json_matches_expected_values(name):
    exp = expected(name)
    doc = DumpDocument.loads((GOLDEN / name / exp["document"]).read_bytes())
    assert exp["tensors"]
    for t in exp["tensors"]:
        entry = _lookup(doc.data[t["record"]], t["path"])
        assert entry["dtype"] == t["dtype"] and entry["shape"] == t["shape"]
        for key in ("Max", "Min", "Mean", "Norm"):
            assert stats_equal(entry[key], t[key], rtol=0, atol=0), (t["record"], t["path"], key)
        if "md5" in entry:
            assert entry["md5"] == t["crc32"]
        assert entry.get("data_name") == t["data_name"]


@pytest.mark.parametrize("name", GOLDENS)
def test_reference_stats_reproduce_golden(name):
    exp = expected(name)
    for t in exp["tensors"]:
        a = np.array(t["values"], dtype=t["numpy_dtype"]).reshape(t["shape"])
        got = reference_stats(a, dialect=exp["dialect"], framework=exp["framework"])
        want = (t["Max"], t["Min"], t["Mean"], t["Norm"])
        for g, w, key in zip(got, want, ("Max", "Min", "Mean", "Norm")):
            assert stats_equal(g, w, rtol=1e-6), (t["record"], t["path"], key, g, w)
        assert crc32_hex(np.ascontiguousarray(a)) == t["crc32"]


def test_golden_tensor_files_hold_the_expected_values():
    exp = expected("tensor-mindspore")
    rank = GOLDEN / "tensor-mindspore" / exp["rank_dirs"][0]
    mapping = read_mapping((rank / "dump_tensor_data/mapping.csv").read_bytes())
    assert mapping == exp["mapping"] and len(next(iter(mapping))) > 255
    assert sorted(os.listdir(rank / "dump_tensor_data")) == sorted(exp["tensor_files"] + ["mapping.csv"])
    for t in exp["tensors"]:
        fname = mapping.get(t["data_name"], t["data_name"])
        a = np.load(rank / "dump_tensor_data" / fname, allow_pickle=False)
        assert a.dtype.name == t["numpy_dtype"] and list(a.shape) == t["shape"]
        assert a.tolist() == t["values"]
        got = reference_stats(a, framework="mindspore")
        doc_entry = (t["Max"], t["Min"], t["Mean"], t["Norm"])
        assert all(stats_equal(g, w, rtol=1e-6) for g, w in zip(got, doc_entry))


def test_statistics_golden_covers_the_rules():
    tensors = expected("statistics-pytorch")["tensors"]
    kinds = {(t["numpy_dtype"], len(t["shape"]) == 0, 0 in t["shape"]) for t in tensors}
    assert {("int64", False, False), ("bool", False, False), ("float32", True, False), ("float32", False, True),
            ("float16", False, False), ("float64", False, False)} <= kinds
    assert any(isinstance(t["Max"], float) and math.isnan(t["Max"]) for t in tensors)


def test_generator_reproduces_committed_outputs(tmp_path):
    out = tmp_path / "spec"
    subprocess.run([sys.executable, str(VECTORS / "generate.py"), "--out", str(out)], check=True,
                   capture_output=True, timeout=60)
    for sub in ("vectors/valid", "vectors/invalid"):
        _same_tree(SPEC / sub, out / sub)
    made = sorted(p.name for p in (out / "golden").iterdir())
    for name in made:
        _same_tree(SPEC / "golden" / name, out / "golden" / name)
    # the other goldens are made with the package by generate_package.py (tests/format/test_spec_check.py)
    assert sorted(p.name for p in (SPEC / "golden").iterdir()) == sorted(made + ["zarr-pytorch"])
    assert (out / "vectors/names.json").read_bytes() == (VECTORS / "names.json").read_bytes()


def _same_tree(a, b):
    files_a = sorted(p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file())
    assert files_a == files_b, f"{a}: generated files differ from the committed ones"
    for rel in files_a:
        assert filecmp.cmp(a / rel, b / rel, shallow=False), f"{a / rel} differs from the generator's output"
