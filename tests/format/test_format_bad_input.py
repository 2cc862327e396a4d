"""Hostile and broken input gives typed errors (never a crash, never a silent success)."""
from __future__ import annotations

import json
import shutil

import pytest
from _fmt_support import GOLDEN, DirStore, open_dump

from msprobe.errors import DocumentError, FormatError, MsprobeError, NameFormatError, UnsafePathError
from msprobe.format.documents import (
    MAX_JSON_DEPTH,
    ConstructDocument,
    DebugDocument,
    DumpDocument,
    StackDocument,
    dumps_json,
    loads_json,
)
from msprobe.format.layout import read_mapping
from msprobe.format.naming import parse_record_name
from msprobe.readers.validate import validate_store

API = "Functional.relu.0.forward"
GOOD = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None,
        "data": {API: {"input_args": [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2],
                                       "Max": 1.0, "Min": 0.0, "Mean": 0.5, "Norm": 1.0,
                                       "requires_grad": False}],
                       "input_kwargs": {}, "output": []}}}
GOOD_TEXT = dumps_json(GOOD)


@pytest.mark.parametrize("cut", [1, 10, len(GOOD_TEXT) // 2, len(GOOD_TEXT) - 1], ids=["1", "10", "half", "last"])
def test_truncated_json(cut):
    with pytest.raises(DocumentError, match="truncated|invalid") as info:
        DumpDocument.loads(GOOD_TEXT[:cut].encode(), file="step0/rank/dump.json")
    assert info.value.file == "step0/rank/dump.json"


@pytest.mark.parametrize("text", ["", "   ", "{", "[1,", '{"data": {}', "nul", "{'data': {}}", '{"data": {},}'],
                         ids=["empty", "blank", "open-brace", "open-list", "unclosed", "bare-word", "single-quotes",
                              "trailing-comma"])
def test_not_json(text):
    with pytest.raises(DocumentError):
        DumpDocument.loads(text, file="dump.json")


@pytest.mark.parametrize("cls", [DumpDocument, DebugDocument, StackDocument, ConstructDocument],
                         ids=lambda c: c.__name__)
@pytest.mark.parametrize("value", ["[]", '"text"', "3", "null", "true"], ids=["list", "str", "int", "null", "bool"])
def test_top_level_must_be_an_object(cls, value):
    with pytest.raises(DocumentError) as info:
        cls.loads(value, file="x.json")
    assert info.value.location == "$"


def test_duplicate_top_level_key():
    text = '{"data": {}, "data": {"%s": {}}}' % API
    with pytest.raises(DocumentError, match="duplicate key 'data'"):
        DumpDocument.loads(text, file="dump.json")


def test_duplicate_record_name():
    text = GOOD_TEXT.replace('"data": {', '"data": {\n  "%s": {},' % API)
    assert text.count(f'"{API}"') == 2
    with pytest.raises(DocumentError, match="duplicate key"):
        DumpDocument.loads(text, file="dump.json")


def test_duplicate_key_inside_a_tensor_entry():
    text = GOOD_TEXT.replace('"Max": 1.0,', '"Max": 1.0,\n "Max": 2.0,')
    with pytest.raises(DocumentError, match="duplicate key 'Max'"):
        DumpDocument.loads(text, file="dump.json")


@pytest.mark.parametrize("cls", [StackDocument, ConstructDocument], ids=lambda c: c.__name__)
def test_duplicate_keys_in_other_documents(cls):
    with pytest.raises(DocumentError, match="duplicate"):
        cls.loads('{"0": null, "0": null}', file="x.json")


def test_wrong_types_name_the_json_path():
    bad = json.loads(GOOD_TEXT)
    bad["data"][API]["input_args"][0]["shape"] = "2"
    with pytest.raises(DocumentError) as info:
        DumpDocument.loads(json.dumps(bad), file="r/dump.json")
    assert info.value.location == f'$.data["{API}"].input_args.0'
    assert str(info.value).startswith(f'r/dump.json:$.data["{API}"].input_args.0: ')


@pytest.mark.parametrize("name", ["Functional/relu.0.forward", "../../etc/passwd.0.debug", "Module..x.Linear.forward.0",
                                  "..\\x.0.debug", "/abs.0.debug"],
                         ids=["slash", "traversal", "dotdot", "backslash", "absolute"])
def test_record_names_with_separators_or_dotdot(name):
    with pytest.raises(NameFormatError):
        parse_record_name(name)
    doc = {"data": {name: {}}}
    with pytest.raises(DocumentError) as info:
        DumpDocument.loads(json.dumps(doc), file="dump.json")
    assert info.value.location == f'$.data["{name}"]'


@pytest.mark.parametrize("dn", ["../" + API + ".input.0.pt", "/tmp/x.pt", "a/b.pt", "..", "C:x.pt", "..\\x.pt"],
                         ids=["parent", "absolute", "subdir", "dotdot", "drive", "backslash"])
def test_data_name_outside_dump_tensor_data(dn):
    bad = json.loads(GOOD_TEXT)
    bad["data"][API]["input_args"][0]["data_name"] = dn
    with pytest.raises(DocumentError, match="unsafe file name|drive"):
        DumpDocument.loads(json.dumps(bad), file="dump.json")
    with pytest.raises(UnsafePathError):
        from msprobe.format.naming import check_file_name

        check_file_name(dn)


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 5000, 200000], ids=["limit+1", "5000", "200000"])
def test_deep_nesting_is_refused(depth):
    text = '{"data": {"x.0.debug": ' + "[" * depth + "]" * depth + "}}"
    with pytest.raises(DocumentError, match="nested"):
        DumpDocument.loads(text, file="debug.json")


def test_nesting_within_the_limit_is_fine():
    depth = MAX_JSON_DEPTH - 4
    text = '{"data": {"x.0.debug": ' + "[" * depth + "]" * depth + "}}"
    DumpDocument.loads(text)


def test_brackets_inside_strings_do_not_count_as_nesting():
    text = json.dumps({"data": {}, "note": "[" * 1000 + '\\"{' * 100})
    assert loads_json(text)["note"].startswith("[[[")


@pytest.mark.parametrize("data", [b'{"data": {}, "x": "\xff"}', b'{"data": {"\xc3\x28": {}}}', b"\xfe\xff{}"],
                         ids=["invalid-byte", "bad-sequence", "utf16-bom"])
def test_non_utf8_is_refused(data):
    with pytest.raises(DocumentError, match="not UTF-8") as info:
        DumpDocument.loads(data, file="dump.json")
    assert info.value.file == "dump.json"


def test_utf8_bom_and_non_ascii_are_fine():
    doc = DumpDocument.loads("\ufeff" + json.dumps({"data": {}, "note": "\u8bad\u7ec3"}, ensure_ascii=False))
    assert doc.raw["note"] == "\u8bad\u7ec3"
    # written back ASCII-only, like the real tool
    assert doc.dumps().isascii() and "\\u8bad" in doc.dumps()


def test_nan_and_infinity_tokens_are_accepted():
    text = GOOD_TEXT.replace('"Max": 1.0', '"Max": NaN').replace('"Min": 0.0', '"Min": -Infinity')
    doc = DumpDocument.loads(text)
    assert doc.dumps() == text


def test_every_error_is_typed():
    for exc in (DocumentError, NameFormatError, UnsafePathError):
        assert issubclass(exc, FormatError) and issubclass(exc, MsprobeError) and issubclass(exc, ValueError)


def test_non_string_record_name_parse():
    with pytest.raises(NameFormatError):
        parse_record_name(12)  # type: ignore[arg-type]


# ---------------------------------------------------------------- whole dumps


@pytest.fixture
def golden_copy(tmp_path):
    dst = tmp_path / "dump"
    shutil.copytree(GOLDEN / "tensor-mindspore", dst)
    return dst


def _problems(path):
    report = validate_store(open_dump(path))
    return report, [str(p) for p in report.errors]


def test_copy_of_golden_is_valid(golden_copy):
    report, errors = _problems(golden_copy)
    assert report.ok, errors


def test_truncated_dump_json_is_reported(golden_copy):
    p = golden_copy / "step0/rank0/dump.json"
    p.write_bytes(p.read_bytes()[:200])
    report, errors = _problems(golden_copy)
    assert not report.ok and any("dump.json" in e and "truncated" in e for e in errors)


def test_missing_tensor_file_is_reported(golden_copy):
    name = "Functional.relu.0.forward.output.0.npy"
    (golden_copy / "step0/rank0/dump_tensor_data" / name).unlink()
    report, errors = _problems(golden_copy)
    assert not report.ok
    assert any(name in e and '$.data["Functional.relu.0.forward"].output.0' in e for e in errors), errors


def test_missing_mapped_tensor_file_is_reported(golden_copy):
    (golden_copy / "step0/rank0/dump_tensor_data" / ("%032d.npy" % 1)).unlink()
    report, errors = _problems(golden_copy)
    assert not report.ok and any("has no file" in e for e in errors)


def test_orphan_tensor_file_is_a_warning(golden_copy):
    (golden_copy / "step0/rank0/dump_tensor_data/Functional.relu.9.forward.input.0.npy").write_bytes(b"x")
    report, errors = _problems(golden_copy)
    assert report.ok and any("named by no record" in str(p) for p in report.problems)


def test_data_name_with_dotdot_is_reported(golden_copy):
    p = golden_copy / "step0/rank0/dump.json"
    p.write_text(p.read_text().replace('"data_name": "Functional.relu.0.forward.input.0.npy"',
                                       '"data_name": "../../escape.npy"'))
    report, errors = _problems(golden_copy)
    assert not report.ok and any("unsafe file name" in e for e in errors)


def test_missing_documents_are_reported(golden_copy):
    (golden_copy / "step0/rank0/dump.json").unlink()
    report, errors = _problems(golden_copy)
    assert not report.ok and any("missing dump.json" in e for e in errors)


def test_empty_directory_is_not_a_dump(tmp_path):
    report, errors = _problems(tmp_path)
    assert not report.ok and any("no dump found" in e for e in errors)


@pytest.mark.parametrize("marker,message", [
    ("{", "truncated"), ('{"dialect": "msprobe-lake"}', "format_version"),
    ('{"format_version": "2.0", "dialect": "msprobe-lake"}', "not supported"),
], ids=["truncated", "no-version", "major-2"])
def test_bad_marker_is_reported(golden_copy, marker, message):
    (golden_copy / "step0/rank0/msprobe_lake.json").write_text(marker)
    report, errors = _problems(golden_copy)
    assert not report.ok and any("msprobe_lake.json" in e and message in e for e in errors), errors


def test_future_minor_marker_is_accepted(golden_copy):
    p = golden_copy / "step0/rank0/msprobe_lake.json"
    p.write_text(p.read_text().replace('"1.0"', '"1.9"'))
    report, errors = _problems(golden_copy)
    assert report.ok, errors


def test_missing_marker_is_fine(golden_copy):
    (golden_copy / "step0/rank0/msprobe_lake.json").unlink()
    report, errors = _problems(golden_copy)
    assert report.ok, errors


def test_debug_json_with_api_record_is_reported(tmp_path):
    d = tmp_path / "step0/rank"
    d.mkdir(parents=True)
    (d / "debug.json").write_text(json.dumps({"task": "statistics", "level": "debug", "data": {API: {}}}))
    report, errors = _problems(tmp_path)
    assert not report.ok and any("not a debug record" in e for e in errors)


@pytest.mark.parametrize("rows,expected", [
    ("%s.npy,%s\n" % ("1" * 32, "long.name.npy"), {"long.name.npy": "1" * 32 + ".npy"}),
    ("%s,%s.npy\n" % ("long.name.npy", "2" * 32), {"long.name.npy": "2" * 32 + ".npy"}),
    ("original,converted\n%s.pt,%s\n" % ("3" * 32, "a.pt"), {"a.pt": "3" * 32 + ".pt"}),
    ("\n,\nonly-one-column\n", {}),
], ids=["real-order", "reverse-order", "header", "junk"])
def test_read_mapping(rows, expected):
    assert read_mapping(rows.encode()) == expected


def test_dir_store_adapter_reads_like_a_store(golden_copy):
    store = DirStore(golden_copy)
    assert "step0" in store.list_dir("")
    assert store.exists("step0/rank0/dump.json")
    assert validate_store(store).ok
