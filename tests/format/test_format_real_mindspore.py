"""The real tool's MindSpore dumps (tests/fixtures/real/ms26_mindspore/*, written by
mindstudio-probe 26.2.0 with mindspore 2.10.0 on CPU) against the format code and the
readers: every scenario validates, every document round-trips byte for byte, every
record name parses, the reader opens it as a MindSpore dump, and the saved .npy
tensors reproduce their record's Max. Reads the committed files only (no mindspore)."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

import msprobe.readers
from msprobe.backends import open_store
from msprobe.format.documents import ConstructDocument, DumpDocument, StackDocument
from msprobe.format.layout import parse_rank_dir
from msprobe.format.naming import parse_record_name
from msprobe.readers.validate import validate_store

BASE = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "ms26_mindspore"
EXPECTED = ["L0_statistics", "L1_md5", "L1_statistics", "L1_tensor", "mix_statistics"]
DOC_CLASSES = {"dump.json": DumpDocument, "stack.json": StackDocument, "construct.json": ConstructDocument}
SCENARIOS = [BASE / s for s in EXPECTED]


def _rank_dirs(scenario: Path) -> list:
    return sorted(p.parent for p in scenario.rglob("dump.json") if parse_rank_dir(p.parent.name) is not None)


def test_all_scenarios_present():
    assert [s.name for s in SCENARIOS if _rank_dirs(s)] == EXPECTED


@pytest.mark.parametrize("scenario", SCENARIOS, ids=EXPECTED)
def test_scenario_validates(scenario):
    report = validate_store(open_store(str(scenario), read_only=True))
    assert report.ok, "\n".join(str(p) for p in report.errors)
    assert report.records > 0


@pytest.mark.parametrize("scenario", SCENARIOS, ids=EXPECTED)
def test_documents_round_trip_byte_for_byte(scenario):
    n = 0
    for rank in _rank_dirs(scenario):
        for fname, cls in DOC_CLASSES.items():
            path = rank / fname
            raw = path.read_bytes()
            assert cls.loads(raw, file=str(path)).dumps().encode("utf-8") == raw, path
            n += 1
    assert n == 3 * len(_rank_dirs(scenario))


@pytest.mark.parametrize("scenario", SCENARIOS, ids=EXPECTED)
def test_record_names_parse(scenario):
    for rank in _rank_dirs(scenario):
        doc = DumpDocument.loads((rank / "dump.json").read_bytes())
        assert doc.framework == "mindspore"
        for rec in doc.records():
            assert parse_record_name(rec.name).format() == rec.name
        for name in StackDocument.loads((rank / "stack.json").read_bytes()).ids_of():
            parse_record_name(name)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=EXPECTED)
def test_reader_opens_as_mindspore(scenario):
    import json

    d = msprobe.readers.open(str(scenario))
    assert d.framework == "mindspore"
    assert d.steps == [0]
    want = sum(len(json.loads((r / "dump.json").read_bytes())["data"]) for r in _rank_dirs(scenario))
    assert d.count() == want
    assert len(d.records()) == want


def test_tensor_npy_files_match_their_records():
    d = msprobe.readers.open(str(BASE / "L1_tensor"))
    checked = 0
    first = d.records()[0]
    a0 = first.input_args[0].load()  # the documented access path
    assert float(a0.max()) == pytest.approx(float(first.input_args[0].raw["Max"]), rel=1e-5)
    for rec in d.records():
        for _io, t in rec.tensors():
            if not isinstance(t.data_name, str):
                continue
            assert t.data_name.endswith(".npy")
            a = t.load()
            assert list(a.shape) == list(t.shape)
            assert math.isclose(float(a.max()), float(t.raw["Max"]), rel_tol=1e-5, abs_tol=1e-12), \
                (rec.name, t.path)
            checked += 1
    npy = list((BASE / "L1_tensor").rglob("*.npy"))
    assert checked == len(npy) > 0
