"""compare's leaf columns straight from dump.json's bytes (msprobe/format/_docscan.c, issue 48 item 1)
against the parsed path they stand in for.

The scanner must give, on every document it takes, exactly what the parsed document gives compare:
the records' names and each record (parsed from its bytes), the leaves walked as compare walks the
records (each record's first leaf, each leaf's suffix and io, in that order), and per leaf the cells
``Leaves.finish`` makes (tensor flag, dtype / shape / requires_grad texts, the four statistics of
the same types and values, md5 text, data_name) with their ``number_columns``. On bytes it does not
fully take (malformed, truncated, mutated, escapes, duplicate keys, long integers, deep nesting...)
it answers None, never an error nor another answer, and compare parses the document as before: the
CSVs and summary.json are the same with the scanner and without it (``MSPROBE_LAKE_COMPARE_SCAN=0``).
The module is built here on first use (a C compiler is part of the test set-up): a machine that
cannot build it fails, it does not skip.
"""
from __future__ import annotations

import json
import math
import os
import random
import shutil

import numpy as np
import pytest

from msprobe.compare import _indexed, compare
from msprobe.compare._floattext import number_columns
from msprobe.compare._indexed import _walk_all
from msprobe.compare._plan import Leaves
from msprobe.compare._scanned import ENV, ScannedSide, _SpanRecords, scan_columns
from msprobe.format.fastjson import loads_json_bytes
from msprobe.format.native import docscan
from msprobe.format.stats import STAT_KEYS
from tests._dump_docs import DOCS
from tests.compare.test_compare_columnar import REAL_PAIRS, TS, _f, _outputs
from tests.compare.test_leafwalk import CRAFTED, _bench_of


@pytest.fixture(scope="module", autouse=True)
def scanner():
    mod = docscan()
    assert mod is not None, ("msprobe.format._docscan is neither installed nor built in the cache: a C compiler "
                             "and Python's headers are needed (MSPROBE_LAKE_NATIVE=0 must not be set for this test)")
    return mod


def _canonical(value):
    """A value with its floats as (type, repr): NaN equal to NaN, -0.0 apart from 0.0, 1 apart from 1.0 and True."""
    if isinstance(value, dict):
        return ("dict", [(key, _canonical(item)) for key, item in value.items()])
    if isinstance(value, list):
        return ("list", [_canonical(item) for item in value])
    return (type(value).__name__, repr(value))


def _document(data: dict, **header) -> bytes:
    doc = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None, **header, "data": data}
    return json.dumps(doc, indent=1).encode()


def _short_integers(data: dict) -> dict:
    """``data`` with its integers beyond 18 digits (the scanner leaves those to the parsed path) cut short."""
    return json.loads(json.dumps(data), parse_int=lambda text: int(text[:15]))


def _reference(data: bytes):
    """What the parsed path gives compare of a document: (task, names, per leaf in walk order its
    suffix, io and cells), or None where the document is not a plain dump document."""
    try:
        doc = loads_json_bytes(data[3:] if data[:3] == b"\xef\xbb\xbf" else data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), dict):
        return None
    records = doc["data"]
    names, starts, suffixes, ios, leaf_list = _walk_all(records)
    leaves = Leaves()
    leaves.leaf = list(leaf_list)
    leaves.finish("md5")
    cells = []
    for position, leaf in enumerate(leaf_list):
        data_name = leaf.get("data_name") if isinstance(leaf, dict) else None
        cells.append((suffixes[position], ios[position], leaves.tensor[position], leaves.dtype[position],
                      leaves.shape[position], leaves.requires_grad[position],
                      *[_canonical(leaves.statistics[key][position]) for key in STAT_KEYS],
                      leaves.md5[position], data_name if isinstance(data_name, str) else None))
    return doc.get("task"), names, records, cells, list(starts)


def _scanned(data: bytes):
    got = scan_columns(data)
    if got is None:
        return None
    task, names, spans, walked, columns = got
    positions, bounds, suffixes, ios = walked
    assert positions == {name: position for position, name in enumerate(names)}
    starts = np.frombuffer(bounds, dtype=np.int64).tolist()
    assert len(starts) == len(names) + 1 and starts[0] == 0 and starts == sorted(starts)
    assert starts[-1] == len(suffixes) == len(ios) == len(columns["dtype"])
    cells = []
    for number in range(len(suffixes)):  # the leaves numbered in the walk's order
        cells.append((suffixes[number], ios[number], columns["tensor"][number], columns["dtype"][number],
                      columns["shape"][number], columns["requires_grad"][number],
                      *[_canonical(columns[key][number]) for key in STAT_KEYS],
                      columns.md5_texts()[number], columns["data_name"][number]))
    for key in STAT_KEYS:  # the statistics' numbers as number_columns reads the values
        for got_array, want in zip(columns.numbers[key], number_columns(columns[key])):
            assert got_array.dtype == want.dtype and got_array.tobytes() == want.tobytes(), key
    return task, names, _SpanRecords(names, data, spans, plain=not columns.nonfinite), cells, starts


def _check(data: bytes, *, taken: bool = False) -> bool:
    """The scanner's answer on ``data`` equals the parsed path's, or is None; whether it took them."""
    got = _scanned(data)
    if taken:
        assert got is not None, "the scanner declined a plain document"
    if got is None:
        return False
    want = _reference(data)
    assert want is not None, "the scanner took bytes the parsed path refuses"
    task, names, raws, cells, starts = got
    want_task, want_names, want_records, want_cells, want_starts = want
    assert (task, names, starts) == (want_task, want_names, want_starts)
    for name in names:  # each record parsed from its bytes alone, as the whole document's parse gives it
        assert _canonical(raws[name]) == _canonical(want_records[name]), name
    assert cells == want_cells
    return True


def test_every_fixture_document_scans_as_it_parses():
    taken = 0
    for path in DOCS + [os.path.join(os.path.dirname(DOCS[0]).split("tests")[0], "spec", "golden",
                                     "statistics-pytorch", "step0", "rank0", "dump.json")]:
        if not os.path.exists(path):
            continue
        with open(path, "rb") as handle:
            data = handle.read()
        try:
            taken += _check(data)
        except AssertionError as exc:
            raise AssertionError(f"{path}: {exc}") from exc
    assert taken >= len(DOCS) * 3 // 4, f"the scanner took {taken} of {len(DOCS)} fixture documents"


def test_crafted_records_reach_every_branch():
    # scalars of each type, null leaves, slices and ellipses (left to Python), parameters before
    # outputs, parameters_grad, debug records, odd statistics, NaN/inf, an empty shape, md5 and data_name
    assert scan_columns(_document(CRAFTED)) is None  # its 10**30: a long integer, left to the parsed path
    _check(_document(CRAFTED))
    crafted = _short_integers(CRAFTED)
    assert _check(_document(crafted), taken=True)
    assert _check(_document(_bench_of(crafted)), taken=True)
    assert _check(_document({}), taken=True)
    tensor = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": 1.0, "Min": 0.0, "Mean": 0.5,
              "Norm": 1.0}
    assert _check(_document({  # parameters of any value put the outputs last; a list of one parameter gradient
        "Module.a.forward.0": {"output": [tensor, None], "input_args": [tensor], "parameters": None},
        "Module.b.forward.0": {"output": tensor, "parameters": {"w": tensor}, "input": [[tensor], []], "x": {}},
        "Module.b.parameters_grad": {"w": [tensor], "v": [[tensor]], "u": []},
        "null.record": None, "list.record": [None, 3, {"k": tensor}]}), taken=True)
    assert _check(_document({"a.0.forward": {"input_args": [{"type": "torch.Tensor", "dtype": "torch.float16",
                                                              "shape": list(range(20)), "Max": -0.0, "Min": 1e300,
                                                              "Mean": 5e-324, "Norm": -1.5e-7}]}}), taken=True)
    assert _check(b'\xef\xbb\xbf' + _document({"x.0.forward": {"output": [None, {}, [], {"type": "int", "value": 7}]}}),
                  taken=True)


def test_floats_read_as_float_reads_them():
    rng = random.Random(48)
    texts = []
    for _ in range(20000):
        bits = rng.getrandbits(64)
        value = np.array([bits], dtype=np.uint64).view(np.float64)[0]
        if math.isfinite(value):
            texts.append(repr(float(value)))
        texts.append(repr(rng.uniform(-1, 1) * 10.0 ** rng.randint(-30, 30)))
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 24)))
        cut = rng.randint(1, len(digits))
        texts.append(f"{'-' if rng.random() < 0.5 else ''}{int(digits[:cut])}.{digits[cut:] or '0'}"
                     f"{'e' + str(rng.randint(-40, 40)) if rng.random() < 0.3 else ''}")
    leaves = ",".join('{"type":"torch.Tensor","dtype":"d","shape":[],"Max":%s,"Min":0.5,"Mean":1E2,"Norm":-0.0}'
                      % text for text in texts)
    got = scan_columns(b'{"task":"statistics","data":{"a.0.forward":{"input_args":[%s]}}}' % leaves.encode())
    assert got is not None
    want = np.array([float(text) for text in texts])
    assert got[4].numbers["Max"][0].tobytes() == want.tobytes()
    assert [repr(value) for value in got[4]["Max"]] == [repr(value) for value in want.tolist()]


@pytest.mark.parametrize("bad", [
    b"", b"[]", b"{}", b"null", b'{"data": []}', b'{"task": "x"}', b'{"other": 1, "dat": {}}',
    b'{"task": "statistics", "data": {}} trailing', b'{"task": "statistics", "data": {},}',
    b'{"task": "statistics", "data": {"a": 1, "a": 2}}',
    b'{"task": "statistics", "data": {"a.0.forward": {"input_args": [1], "input_args": [2]}}}',
    b'{"task": "statistics", "data": {"a.0.forward": {"input_args": [{"type": "int", "value": 12345678901234567890}]}}}',
    b'{"task": "statistics", "data": {"a.0.forward": {"input_args": [{"type": "int", "value": -0}]}}}',
    b'{"task": "statistics", "data": {"a\\u0041.0.forward": {}}}',
    b'{"task": "statistics", "data": {"a.0.forward": {"input_args": [{"type": "int", "value": 01}]}}}',
    b'{"task": "statistics", "data": {"a.0.forward": {"input_args": [{"type": "str", "value": "\x01"}]}}}',
    b'{"task": "statistics", "data": {"a.0.forward": {"input_args": [{"type": "str", "value": "\xff"}]}}}',
    b'{"task": "statistics", "data": {"a.0.forward": {"input_args": [{"type": "str", "value": "\xed\xa0\x80"}]}}}',
    b'{"task": "statistics", "data": {"a.0.forward": {"input_args": [{"type": "float", "value": 1.}]}}}',
    b'{"task": "statistics", "data": {"a.0.forward": {"input_args": [{"type": "float", "value": .5}]}}}',
    b'{"task": "statistics", "data": {"a.0.forward": {"input_args": [{"type": "float", "value": +1}]}}}',
    b'{"task": "statistics", "data": {"a.0.forward": {"input_args": [{"type": "float", "value": nan}]}}}',
    b'{"task": 7, "data": {}}', b'{"task": "statistics", "task": "md5", "data": {}}',
    b'{"task": "statistics", "data": {"a.0.forward": {"input_args": [' + b"[" * 5000 + b"]" * 5000 + b"]}}}",
    b'{"task": "statistics", "data": {"a.0.forward": {"input_args": [' + b"[" * 5000,
])
def test_bytes_it_does_not_take_answer_none(bad):
    assert scan_columns(bad) is None
    _check(bad)


def test_truncated_and_mutated_documents_never_answer_otherwise():
    data = _document(_bench_of(_short_integers(CRAFTED)))
    assert _check(data, taken=True)
    for cut in range(0, len(data) - 1, 7):  # every prefix: invalid JSON (the scanner says None)
        assert scan_columns(data[:cut]) is None, cut
    rng = random.Random(4848)
    taken = 0
    for _ in range(1500):
        mutated = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            mutated[rng.randrange(len(mutated))] = rng.choice(b'{}[]":,0123456789.eE-+ \\nulltrueNaInfy\x00\xff\xc3')
        taken += _check(bytes(mutated))
    assert taken > 0  # some mutations keep a document (a digit for a digit): those are read the same


def _step_copy(tmp_path, name: str, fixture: str) -> str:
    source = _f(*fixture.split("/"), "step0")
    if not os.path.isdir(source):
        source = _f(*fixture.split("/"))
    root = str(tmp_path / name)
    shutil.copytree(source, root)
    return root


def _same_with_and_without(tmp_path, monkeypatch, target: str, bench: str, every: bool = True, **kw) -> None:
    """Compare twice: the documents parsed (MSPROBE_LAKE_COMPARE_SCAN=0), then scanned (and the
    scanner must be what read them: every document, or one where not ``every``); the outputs byte
    for byte equal."""
    runs = {}
    scanned = []
    real_side = _indexed.indexed_side

    def spy(source):
        side = real_side(source)
        scanned.append(isinstance(side, ScannedSide))
        return side

    for how in ("parsed", "scanned"):
        out = str(tmp_path / f"out_{how}")
        with monkeypatch.context() as patch:
            if how == "parsed":
                patch.setenv(ENV, "0")
            else:
                patch.setattr(_indexed, "indexed_side", spy)
            compare(target, bench, out, timestamp=TS, plot=False, progress=False, **kw)
        runs[how] = {name: value.replace(out.encode(), b"OUT") for name, value in _outputs(out).items()}
    assert runs["parsed"] == runs["scanned"]
    assert any(name.endswith(".csv") for name in runs["parsed"])
    assert scanned and (all(scanned) if every else any(scanned)), "compare did not read the documents through the scanner"


#: the byte-identity pairs in statistics and md5 mode (tensor mode parses the documents)
SCAN_PAIRS = [REAL_PAIRS[i] for i in (0, 1, 3, 4, 5, 8, 10, 11)]


@pytest.mark.parametrize("target,bench", SCAN_PAIRS, ids=[f"{a}-vs-{b}" for a, b in SCAN_PAIRS])
def test_compare_writes_the_same_bytes_from_the_scanner(tmp_path, monkeypatch, target, bench):
    _same_with_and_without(tmp_path, monkeypatch, _step_copy(tmp_path, "t", target), _step_copy(tmp_path, "b", bench))


def _crafted_dump(tmp_path, name: str, data: dict, task: str) -> str:
    rank = tmp_path / name / "step0" / "rank0"
    rank.mkdir(parents=True)
    (rank / "dump.json").write_bytes(_document(data, task=task))
    return str(tmp_path / name / "step0")


@pytest.mark.parametrize("task", ["statistics", "md5"])
def test_compare_of_crafted_records_the_same_from_the_scanner(tmp_path, monkeypatch, task):
    target = dict(CRAFTED)  # (its long integer leaves the target to the parsed path: the bench is scanned)
    bench = _bench_of(_short_integers(CRAFTED))
    if task == "md5":  # md5 mode: both sides' tensors hold a CRC-32 beside their statistics
        for data in (target, bench):
            for name, raw in list(data.items()):
                data[name] = json.loads(json.dumps(raw).replace('"requires_grad"', '"md5": "0badf00d", "requires_grad"'))
    _same_with_and_without(tmp_path, monkeypatch, _crafted_dump(tmp_path, "t", target, task),
                           _crafted_dump(tmp_path, "b", bench, task), every=False)
