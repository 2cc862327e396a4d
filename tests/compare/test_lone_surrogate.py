"""A string argument holding a lone surrogate: ``"x\\ud800y"`` in dump.json is valid JSON (json.dumps writes it so
for a Python string such as a path decoded with surrogateescape), but json.loads gives a string no UTF-8 text can
hold. Compare then died with a UnicodeEncodeError traceback writing its CSV (statistics mode) or making the
argument's CRC-32 (md5 mode). The readers now give such a string as the document spells it (the surrogate as its
``\\udXXX`` escape text): compare writes its rows, both sides alike, and the other strings are untouched."""
from __future__ import annotations

import csv
import json
import os
import zlib

import pytest

from msprobe.compare import compare
from msprobe.readers._source import parse_document

LONE = "x\ud800y"
SHOWN = "x\\ud800y"  # the escape's text, as dump.json holds it


def _tensor(md5: bool) -> dict:
    leaf = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": 1.0, "Min": 0.0, "Mean": 0.5,
            "Norm": 1.0, "requires_grad": False}
    if md5:
        leaf["md5"] = "0badf00d"
    return leaf


def _dump(root, task: str) -> str:
    data = {"Torch.add.0.forward": {"input_args": [_tensor(task == "md5"), {"type": "str", "value": LONE}],
                                    "input_kwargs": {"name\udc80": {"type": "str", "value": "caf\u00e9 \U0001f600"}},
                                    "output": [_tensor(task == "md5")]}}
    doc = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "data": data}
    text = json.dumps(doc, indent=1)  # ensure_ascii: the lone surrogates as their escapes
    assert "\\ud800" in text and "\\udc80" in text
    rank = root / "step0" / "rank0"
    rank.mkdir(parents=True)
    (rank / "dump.json").write_text(text, encoding="ascii")
    return str(root / "step0")


def test_a_lone_surrogate_is_read_as_its_escape_and_nothing_else_changes():
    doc = {"task": "statistics", "data": {"r": {"input_args": [{"type": "str", "value": LONE}, {"type": "str",
           "value": "caf\u00e9 \U0001f600"}], "k\udc80": 1}}}
    read = parse_document(json.dumps(doc).encode(), "dump.json")
    record = read.data["r"] if hasattr(read, "data") else read["data"]["r"]
    assert record["input_args"][0]["value"] == SHOWN
    assert record["input_args"][1]["value"] == "caf\u00e9 \U0001f600"  # a surrogate pair is a character: kept
    assert "k\\udc80" in record


@pytest.mark.parametrize("task", ["statistics", "md5"])
def test_compare_writes_rows_for_a_lone_surrogate(tmp_path, task):
    target, bench = _dump(tmp_path / "t", task), _dump(tmp_path / "b", task)
    out = str(tmp_path / "out")
    compare(target, bench, out, plot=False, progress=False, **({"mode": "md5"} if task == "md5" else {}))
    [name] = [n for n in os.listdir(out) if n.endswith(".csv")]
    with open(os.path.join(out, name), encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f))
    rows = rows[1:]  # past the header
    [row] = [r for r in rows if r[0].endswith("input.1")]
    if task == "md5":
        crc = f"{zlib.crc32(SHOWN.encode()):08x}"
        assert crc in row, row
    else:
        assert row.count(SHOWN) >= 4, row
    assert any("name\\udc80" in r[0] for r in rows), [r[0] for r in rows]
    assert len(rows) == 4, [r[0] for r in rows]  # two tensors, the string, the keyword
