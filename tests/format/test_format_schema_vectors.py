"""spec/vectors/{valid,invalid}/*.json through the JSON Schemas and the reference
implementation: both must accept the valid documents and reject the invalid ones."""
from __future__ import annotations

import json

import pytest
from _fmt_support import SCHEMA_FILES, SPEC, VECTORS

from msprobe.errors import DocumentError
from msprobe.format.documents import ConstructDocument, DebugDocument, DumpDocument, StackDocument, loads_json
from msprobe.format.layout import validate_marker

VALID = sorted((VECTORS / "valid").glob("*.json"))
INVALID = sorted((VECTORS / "invalid").glob("*.json"))


def _kind(path):
    return path.name.split("--", 1)[0]


def _code_validate(kind: str, data: bytes, file: str):
    """The reference implementation's check of one document (raises DocumentError)."""
    if kind == "dump":
        return DumpDocument.loads(data, file=file)
    if kind == "debug":
        return DebugDocument.loads(data, file=file)
    if kind == "stack":
        return StackDocument.loads(data, file=file)
    if kind == "construct":
        return ConstructDocument.loads(data, file=file)
    if kind == "msprobe_lake":
        return validate_marker(loads_json(data, file), file)
    raise AssertionError(f"unknown vector kind {kind!r}")


def test_vectors_exist_for_every_document_kind():
    for kinds in ({_kind(p) for p in VALID}, {_kind(p) for p in INVALID}):
        assert kinds == set(SCHEMA_FILES)
    assert len(VALID) >= 50 and len(INVALID) >= 60


@pytest.mark.parametrize("name", sorted(SCHEMA_FILES.values()))
def test_schemas_are_valid_draft_2020_12(name):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((SPEC / "schemas" / name).read_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    assert name in (SPEC / "schemas" / "README.md").read_text()


@pytest.mark.parametrize("path", VALID, ids=[p.stem for p in VALID])
def test_valid_vector_is_accepted(path, schema_validators):
    data = path.read_bytes()
    errors = [e.message for e in schema_validators[_kind(path)].iter_errors(json.loads(data))]
    assert errors == [], "schema rejects a valid vector"
    _code_validate(_kind(path), data, str(path))


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_invalid_vector_is_rejected(path, schema_validators):
    data = path.read_bytes()
    assert list(schema_validators[_kind(path)].iter_errors(json.loads(data))), "schema accepts an invalid vector"
    with pytest.raises(DocumentError) as info:
        _code_validate(_kind(path), data, str(path))
    err = info.value
    assert err.file == str(path)
    assert err.location and err.location.startswith("$"), f"no JSON path in {err}"
    assert str(path) in str(err) and err.location in str(err)


@pytest.mark.parametrize("path", [p for p in VALID if _kind(p) != "msprobe_lake"],
                         ids=[p.stem for p in VALID if _kind(p) != "msprobe_lake"])
def test_valid_vector_round_trips_byte_for_byte(path):
    text = path.read_text(encoding="utf-8")
    assert _code_validate(_kind(path), text.encode(), str(path)).dumps() == text


@pytest.mark.parametrize("path", [p for p in VALID if _kind(p) in ("dump", "debug")],
                         ids=[p.stem for p in VALID if _kind(p) in ("dump", "debug")])
def test_valid_records_parse_into_the_model(path):
    doc = _code_validate(_kind(path), path.read_bytes(), str(path))
    for rec in doc.records():
        list(rec.args())
        for t in rec.tensors():
            assert isinstance(t.dtype, str) and isinstance(t.shape, tuple)


def test_examples_are_valid(schema_validators):
    examples = sorted((SPEC / "examples").glob("*.json"))
    assert examples
    for path in examples:
        kind = next(k for k in sorted(SCHEMA_FILES, key=len, reverse=True) if path.name.startswith(k))
        doc = json.loads(path.read_bytes())
        assert not list(schema_validators[kind].iter_errors(doc)), path.name
        _code_validate(kind, path.read_bytes(), str(path))


# ---------------------------------------------------------------- names through the schema

_NAMES = json.loads((VECTORS / "names.json").read_text())
_ALL_RECORD_NAMES = [c["name"] for c in _NAMES["record_names"]["valid"] + _NAMES["record_names"]["invalid"]]
_ALL_DATA_NAMES = [c["name"] for c in _NAMES["data_names"]["valid"] + _NAMES["data_names"]["invalid"]]


@pytest.mark.parametrize("name", _ALL_RECORD_NAMES, ids=[repr(n)[1:-1] or "<empty>" for n in _ALL_RECORD_NAMES])
def test_schema_record_names_agree_with_the_grammar(name, schema_validators):
    """dump.schema.json's record-name patterns accept exactly the non-strict grammar."""
    from msprobe.format.naming import is_record_name

    schema_ok = not list(schema_validators["dump"].iter_errors({"data": {name: {}}}))
    assert schema_ok == is_record_name(name, strict=False)


@pytest.mark.parametrize("name", _ALL_DATA_NAMES, ids=[repr(n)[1:-1] or "<empty>" for n in _ALL_DATA_NAMES])
def test_schema_data_names_agree_with_check_file_name(name, schema_validators):
    """dump.schema.json accepts a data_name exactly when it is a safe file name."""
    from msprobe.errors import UnsafePathError
    from msprobe.format.naming import check_file_name

    doc = {"data": {"x.0.debug": {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [], "data_name": name}}}
    schema_ok = not list(schema_validators["dump"].iter_errors(doc))
    try:
        check_file_name(name)
        safe = True
    except UnsafePathError:
        safe = False
    assert schema_ok == safe
