"""spec/vectors/names.json through the naming grammar (msprobe/format/naming.py)."""
from __future__ import annotations

import json

import pytest
from _fmt_support import VECTORS

from msprobe.errors import FormatError, NameFormatError, UnsafePathError
from msprobe.format.naming import (
    MAX_FILE_NAME_LENGTH,
    check_file_name,
    is_record_name,
    needs_mapping,
    parse_data_name,
    parse_record_name,
)

NAMES = json.loads((VECTORS / "names.json").read_text())
VALID_RECORDS = NAMES["record_names"]["valid"]
INVALID_RECORDS = NAMES["record_names"]["invalid"]
VALID_DATA = NAMES["data_names"]["valid"]
INVALID_DATA = NAMES["data_names"]["invalid"]


def _id(case):
    return repr(case["name"])[1:-1] or "<empty>"


@pytest.mark.parametrize("case", VALID_RECORDS, ids=[_id(c) for c in VALID_RECORDS])
def test_valid_record_name_parses_and_formats_back(case):
    rn = parse_record_name(case["name"])
    fields = {k: getattr(rn, k) for k in ("kind", "prefix", "api_name", "class_name", "call_index", "direction")}
    assert fields == {k: case[k] for k in fields}
    assert str(rn) == case["name"]
    assert rn.format() == case["name"]  # from the fields alone, not the raw text
    assert is_record_name(case["name"])


@pytest.mark.parametrize("case", INVALID_RECORDS, ids=[_id(c) for c in INVALID_RECORDS])
def test_invalid_record_name_raises(case):
    with pytest.raises(NameFormatError):
        parse_record_name(case["name"])
    assert not is_record_name(case["name"])


def test_unknown_prefix_is_accepted_non_strictly():
    rn = parse_record_name("Bogus.linear.0.forward", strict=False)
    assert (rn.kind, rn.prefix, rn.api_name) == ("api", "Bogus", "linear")


@pytest.mark.parametrize("case", VALID_DATA, ids=[_id(c) for c in VALID_DATA])
def test_valid_data_name_parses_and_formats_back(case):
    dn = parse_data_name(case["name"])
    assert (dn.record, dn.io, list(dn.path), dn.ext) == (case["record"], case["io"], case["path"], case["ext"])
    assert dn.format() == case["name"] and str(dn) == case["name"]
    # with the record known, the split is the same
    dn2 = parse_data_name(case["name"], record=case["record"])
    assert dn2 == dn
    # the record part is itself a valid record name
    assert is_record_name(dn.record)


@pytest.mark.parametrize("case", INVALID_DATA, ids=[_id(c) for c in INVALID_DATA])
def test_invalid_data_name_raises(case):
    with pytest.raises((NameFormatError, UnsafePathError)) as info:
        parse_data_name(case["name"])
    assert isinstance(info.value, FormatError)


def test_data_name_must_start_with_its_record():
    with pytest.raises(NameFormatError):
        parse_data_name("Functional.relu.0.forward.input.0.pt", record="Functional.relu.1.forward")


@pytest.mark.parametrize("name", ["../x.pt", "a/b.pt", "..", ".", "/abs.pt", "a\\b.pt", "C:x.pt", "x\x00.pt", ""],
                         ids=["parent", "subdir", "dotdot", "dot", "absolute", "backslash", "drive", "nul", "empty"])
def test_check_file_name_rejects_paths(name):
    with pytest.raises(UnsafePathError):
        check_file_name(name)


def test_unsafe_path_error_is_a_permission_error():
    with pytest.raises(PermissionError):
        check_file_name("../escape.pt")


def test_long_names_need_mapping():
    assert MAX_FILE_NAME_LENGTH == 255
    assert not needs_mapping("x" * 255)
    assert needs_mapping("x" * 256)


def test_names_json_has_reasons():
    for case in INVALID_RECORDS + INVALID_DATA:
        assert case["reason"]
