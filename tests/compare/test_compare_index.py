"""compare from the index (issue 48 item 2): the leaf tables ``msprobe index`` writes
(``index/compare/leaves.parquet``) give the same CSV bytes and summary.json as the documents.

Each case copies a pair of dumps, indexes both, and compares them twice from the same place: once
with ``MSPROBE_LAKE_COMPARE_INDEX=0`` (the documents) and once from the leaf tables (the documents'
``records_of`` then never called, so nothing parses a dump.json), and requires equal outputs. A stale
table (the document rewritten, or only touched) is never used: it is said and the document read.
"""
from __future__ import annotations

import copy
import glob
import json
import os
import shutil
import warnings

import pytest

import msprobe.compare._core as core
from msprobe.compare import compare, write_compare_leaves
from msprobe.index import StaleIndexWarning
from msprobe.readers._source import RankSource
from msprobe.readers.index import build_index
from tests.compare.test_compare_columnar import REAL_PAIRS, TS, _f, _outputs, mutated_pair


def _indexed_copy(tmp_path, name: str, step_dir: str) -> str:
    """A copy of the dump whose step (or rank) directory is ``step_dir``, indexed with its leaf tables."""
    root = str(tmp_path / name)
    shutil.copytree(step_dir, root)
    build_index(root, leaf_tables=write_compare_leaves)
    assert glob.glob(os.path.join(root, "**", "compare", "leaves.parquet"), recursive=True)
    return root


def _no_documents(monkeypatch) -> None:
    def refuse(source):
        raise AssertionError(f"compare read {source.url}'s document: its leaf table was not used")

    monkeypatch.setattr(core, "records_of", refuse)
    monkeypatch.setattr(RankSource, "document", refuse)


def _same_from_index(tmp_path, monkeypatch, target: str, bench: str, *, documents: bool = False, **kw) -> dict:
    """Compare ``target`` with ``bench`` from their documents and from their leaf tables; the
    outputs must be equal (``documents``: the second run may read documents too: tensor mode)."""
    runs = {}
    for how in ("json", "index"):
        out = str(tmp_path / f"out_{how}")
        shutil.rmtree(out, ignore_errors=True)
        with monkeypatch.context() as patch:
            if how == "json":
                patch.setenv("MSPROBE_LAKE_COMPARE_INDEX", "0")
            elif not documents:
                _no_documents(patch)
            compare(target, bench, out, timestamp=TS, plot=False, progress=False, **kw)
        runs[how] = {name: value.replace(out.encode(), b"OUT") for name, value in _outputs(out).items()}
    a, b = runs["json"], runs["index"]
    assert sorted(a) == sorted(b) and any(name.endswith(".csv") for name in a)
    for name in a:
        assert a[name] == b[name], f"{name} differs between the document and the index"
    return a


#: REAL_PAIRS of the engine's byte-identity tests, one of each kind (26.x, md5, mix against L0, 8.x,
#: two ranks across dialects, MindSpore, the zoo) but tensor mode (below)
INDEX_PAIRS = [REAL_PAIRS[i] for i in (0, 1, 3, 5, 8, 10, 13)]


@pytest.mark.parametrize("target,bench", INDEX_PAIRS, ids=[f"{a}-vs-{b}" for a, b in INDEX_PAIRS])
def test_real_fixtures_same_bytes_from_the_index(tmp_path, monkeypatch, target, bench):
    t, b = _f(*target.split("/"), "step0"), _f(*bench.split("/"), "step0")
    if not (os.path.isdir(t) and os.path.isdir(b)):
        t, b = _f(*target.split("/")), _f(*bench.split("/"))
    _same_from_index(tmp_path, monkeypatch, _indexed_copy(tmp_path, "t", t), _indexed_copy(tmp_path, "b", b))


def test_tensor_mode_reads_the_documents_and_writes_the_same(tmp_path, monkeypatch):
    t = _indexed_copy(tmp_path, "t", _f("ms26", "L1_tensor", "step0"))
    b = _indexed_copy(tmp_path, "b", _f("ms26", "L1_tensor_perturbed", "step0"))
    _same_from_index(tmp_path, monkeypatch, t, b, documents=True)


@pytest.mark.parametrize("fixture,seed", [("ms26/L1_statistics", 1), ("ms26/L1_md5", 2), ("ms8/L1_statistics", 3)])
def test_mutated_dumps_same_bytes_from_the_index(tmp_path, monkeypatch, fixture, seed):
    t, b = mutated_pair(tmp_path / "mutated", fixture, seed)
    t, b = _indexed_copy(tmp_path, "t", t), _indexed_copy(tmp_path, "b", b)
    got = _same_from_index(tmp_path, monkeypatch, t, b)
    assert b"error" in next(v for k, v in got.items() if k.endswith(".csv"))
    _same_from_index(tmp_path, monkeypatch, t, b, fuzzy=True, structural=True, threshold=0.001)


def _tensor(**kw) -> dict:
    entry = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 3], "Max": 1.5, "Min": -0.5,
             "Mean": 0.25, "Norm": 2.0, "requires_grad": True}
    entry.update(kw)
    return entry


def _every_leaf_kind(side: str) -> dict:
    """A document whose records hold every kind of leaf compare shows (and a few odd layouts)."""
    nan, inf = float("nan"), float("inf")
    moved = 1.0 if side == "t" else 1.25
    data = {
        "Functional.linear.0.forward": {
            "input_args": [_tensor(), _tensor(Norm=moved), [_tensor(dtype="torch.int64", Max=7, Min=0, Mean=3.5, Norm=9.1),
                                                            None, {"type": "int", "value": 3}]],
            "input_kwargs": {"bias": None, "alpha": {"type": "float", "value": nan if side == "t" else 0.5},
                             "inplace": {"type": "bool", "value": side == "t"}, "mode": {"type": "str", "value": "sum"},
                             "index": {"type": "slice", "value": [1, None, 2]},
                             "dims": [{"type": "int", "value": 0}, {"type": "int", "value": -1}],
                             "dt": {"type": "torch.dtype", "value": "torch.float16"},
                             "ell": {"type": "ellipsis", "value": "..."}, "empty": {}, "nothing": []},
            "output": [_tensor(Max=inf, Min=-inf, Mean=nan, Norm=inf), _tensor(dtype="torch.bool", Max=True, Min=False,
                                                                               Mean=None, Norm=None)],
        },
        "Tensor.__getitem__.0.forward": {"input_args": [_tensor(shape=[]), {"type": "int", "value": 10 ** 30}],
                                         "input_kwargs": {}, "output": _tensor(Max="1.5e3", Min="nan")},
        "Module.layer.Linear.forward.0": {"input_args": [_tensor()], "input_kwargs": {},
                                          "parameters": {"weight": _tensor(), "bias": _tensor(Norm=moved)},
                                          "output": [_tensor()]},
        "Module.layer.Linear.parameters_grad": {"weight": [_tensor()], "bias": _tensor(Max=moved), "0.w": None},
        "Tensor.empty_args.0.forward": {"input_args": [], "input_kwargs": {}, "output": []},
        "Distributed.all_reduce.0.forward": {"input_args": [_tensor(Max=moved)],
                                             "input_kwargs": {"group": {"type": "list", "value": [0, 1]},
                                                              "op": {"type": "str", "value": "SUM"}},
                                             "output": [_tensor()]},
        "Tensor.add.0.backward": {"input": [_tensor()], "output": [_tensor(requires_grad=False), None]},
        "mean.0.debug": _tensor(Mean=moved),
        "x.1.debug": {"a": _tensor(), "b": [{"type": "int", "value": 1}, None]},
    }
    if side == "b":
        data["Tensor.only_bench.0.forward"] = {"input_args": [_tensor()], "output": [_tensor(Max=nan)]}
    else:
        data["Tensor.only_target.0.forward"] = {"input_args": [_tensor(), None], "output": [_tensor()]}
    return {"task": "statistics", "level": "mix", "framework": "pytorch", "dump_data_dir": None, "data": data}


def _write_doc(root: str, doc: dict) -> str:
    rank = os.path.join(root, "step0", "rank0")
    os.makedirs(rank)
    with open(os.path.join(rank, "dump.json"), "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1)
    return os.path.join(root, "step0")


def test_every_leaf_kind_same_bytes_from_the_index(tmp_path, monkeypatch):
    t = _write_doc(str(tmp_path / "t"), _every_leaf_kind("t"))
    b = _write_doc(str(tmp_path / "b"), _every_leaf_kind("b"))
    for side in (t, b):
        build_index(side, leaf_tables=write_compare_leaves)
    got = _same_from_index(tmp_path, monkeypatch, t, b)
    csv = next(v for k, v in got.items() if k.endswith(".csv")).decode()
    for text in ("<class 'int'>", "<class 'float'>", "<class 'bool'>", "<class 'str'>", "slice", "torch.int64",
                 "Functional.linear.0.forward.input.alpha", "parameters_grad.bias", "mean.0.debug", "x.1.debug.b.0",
                 "Tensor.only_bench.0.forward.output.0", "1000000000000000000000000000000"):
        assert text in csv, text


def test_a_stale_leaf_table_is_never_used(tmp_path, monkeypatch):
    t = _write_doc(str(tmp_path / "t"), _every_leaf_kind("t"))
    b = _write_doc(str(tmp_path / "b"), _every_leaf_kind("b"))
    for side in (t, b):
        build_index(side, leaf_tables=write_compare_leaves)
    doc_path = os.path.join(t, "rank0", "dump.json")
    changed = _every_leaf_kind("t")
    changed["data"]["Functional.linear.0.forward"]["output"][0]["Max"] = 42.0  # a re-dump into the same path
    with open(doc_path, "w", encoding="utf-8") as fh:
        json.dump(changed, fh, indent=1)
    expected = str(tmp_path / "expected")
    monkeypatch.setenv("MSPROBE_LAKE_COMPARE_INDEX", "0")
    compare(t, b, expected, timestamp=TS, plot=False, progress=False)
    monkeypatch.delenv("MSPROBE_LAKE_COMPARE_INDEX")
    for touch_only in (False, True):
        if touch_only:  # the same bytes, a later time: the table cannot tell it holds them
            build_index(t, leaf_tables=write_compare_leaves)
            stat = os.stat(doc_path)
            os.utime(doc_path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2_000_000_000))
        out = str(tmp_path / f"out{touch_only}")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compare(t, b, out, timestamp=TS, plot=False, progress=False)
        assert any(issubclass(w.category, StaleIndexWarning) and "rank0" in str(w.message)
                   and "instead of its leaf table" in str(w.message) for w in caught)
        got = _outputs(out)
        want = _outputs(expected)
        for name in want:
            if name.endswith(".csv"):
                assert got[name] == want[name]
        assert b"42.0" in next(v for k, v in got.items() if k.endswith(".csv"))


def test_an_index_without_a_leaf_table_reads_that_document_alone(tmp_path, monkeypatch):
    t = _write_doc(str(tmp_path / "t"), _every_leaf_kind("t"))
    b = _write_doc(str(tmp_path / "b"), copy.deepcopy(_every_leaf_kind("b")))
    build_index(t)  # the records' index only (as a dumper writes it at publish, or an older msprobe)
    build_index(b, leaf_tables=write_compare_leaves)
    assert not glob.glob(os.path.join(t, "**", "leaves.parquet"), recursive=True)
    read = []
    real = RankSource.document

    def document(source):
        read.append(source.rank_dir if "/t/" in source.url else "bench")
        return real(source)

    monkeypatch.setattr(RankSource, "document", document)
    _same_from_index(tmp_path, monkeypatch, t, b, documents=True)  # the same outputs
    read.clear()
    with monkeypatch.context() as patch:
        patch.setattr(core, "records_of", lambda source: real(source).data if "/t/" in source.url else
                      pytest.fail("the indexed bench's document was read"))
        compare(t, b, str(tmp_path / "mixed"), timestamp=TS, plot=False, progress=False)
    assert read and "bench" not in read  # the target's document alone


def test_a_leaf_table_of_another_version_is_not_read(tmp_path, monkeypatch):
    import msprobe.compare._leaftable as leaftable

    t = _write_doc(str(tmp_path / "t"), _every_leaf_kind("t"))
    b = _write_doc(str(tmp_path / "b"), _every_leaf_kind("b"))
    with monkeypatch.context() as patch:
        patch.setattr(leaftable, "COMPARE_LEAVES_VERSION", "0")  # as an older msprobe wrote it
        build_index(t, leaf_tables=write_compare_leaves)
    build_index(b, leaf_tables=write_compare_leaves)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _same_from_index(tmp_path, monkeypatch, t, b, documents=True)
    assert any(issubclass(w.category, StaleIndexWarning) and "of version '0'" in str(w.message) for w in caught)


@pytest.mark.parametrize("damage", ["empty", "torn"])
def test_an_unreadable_leaf_table_is_said_and_the_document_read(tmp_path, monkeypatch, damage):
    """The index is written atomically but not fsync'ed (derived data): a power loss may leave a
    leaf table empty or torn. compare says so and reads that document, with the same outputs."""
    t = _write_doc(str(tmp_path / "t"), _every_leaf_kind("t"))
    b = _write_doc(str(tmp_path / "b"), _every_leaf_kind("b"))
    for side in (t, b):
        build_index(side, leaf_tables=write_compare_leaves)
    table = os.path.join(t, "rank0", "index", "compare", "leaves.parquet")
    with open(table, "rb") as fh:
        data = fh.read()
    stat = os.stat(table)
    with open(table, "wb") as fh:
        # a torn file keeps its footer (pyarrow opens it) but not the column chunks it points to
        fh.write(b"" if damage == "empty" else b"PAR1" + bytes(len(data) - 8 - len(data) // 2) + data[-len(data) // 2:])
    os.utime(table, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _same_from_index(tmp_path, monkeypatch, t, b, documents=True)
    assert any(issubclass(w.category, StaleIndexWarning) and "cannot be read" in str(w.message)
               and "rank0" in str(w.message) for w in caught)


def test_msprobe_index_writes_atomically_without_fsync(tmp_path, monkeypatch):
    """The index files (derived from the documents) are renamed into place but not fsync'ed one by one."""
    t = _write_doc(str(tmp_path / "t"), _every_leaf_kind("t"))
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real(fd))
    build_index(t, leaf_tables=write_compare_leaves)
    assert os.path.exists(os.path.join(t, "rank0", "index", "records.parquet"))
    assert os.path.exists(os.path.join(t, "rank0", "index", "compare", "leaves.parquet"))
    assert not synced
    assert not [name for name in os.listdir(os.path.join(t, "rank0", "index")) if name.startswith(".")]


def test_stand_in_records_in_c_and_python_agree():
    import numpy as np

    from msprobe.compare._indexed import _rests, _walk_all, stand_in_records
    from msprobe.format.native import leafwalk

    assert leafwalk() is not None, "the C leaf walk is needed (built on first use; MSPROBE_LAKE_NATIVE=0 unset)"
    data = _every_leaf_kind("t")["data"]
    names, starts, suffixes, ios, _ = _walk_all(data)
    rec = np.repeat(np.arange(len(names)), np.diff(starts))
    rests = _rests(names, starts, suffixes, ios)
    c, python = (stand_in_records(names, rec, ios, rests, native) for native in (True, False))
    assert c == python and c is not None and c["mean.0.debug"] == {"type": starts[names.index("mean.0.debug")]}
    apart = ios[:]  # an io's leaves apart from each other: input, output, input
    first = starts[0]
    apart[first], apart[first + 1], apart[first + 2] = "input", "output", "input"
    bad_rests = rests[:]
    bad_rests[first + 1] = None  # a bare leaf inside a group
    for bad_ios, bad in ((apart, rests), (ios, bad_rests)):
        assert stand_in_records(names, rec, bad_ios, bad, True) is None
        assert stand_in_records(names, rec, bad_ios, bad, False) is None


def test_leaf_table_in_c_and_python_agree(monkeypatch):
    """The leaf table from the C walk (its rests, the scalars' CRC texts, the columns' Arrow
    buffers) equals the one the Python code makes with the C module set aside, on every fixture
    document and on every leaf kind; the C ``rests`` declines what it does not take."""
    import pyarrow as pa

    import msprobe.compare._indexed as indexed
    import msprobe.compare._leaftable as leaftable
    import msprobe.compare._plan as plan
    import msprobe.index.columns as columns
    from msprobe.format.native import leafwalk
    from tests._dump_docs import fixture_data

    walker = leafwalk()
    assert walker is not None, "the C leaf walk is needed (built on first use; MSPROBE_LAKE_NATIVE=0 unset)"
    documents = [("every leaf kind", _every_leaf_kind("t")["data"])] + list(fixture_data())
    for path, data in documents:
        native = leaftable.compare_leaf_table(data, {"doc_size": 1})
        names, starts, suffixes, ios, _ = indexed._walk_all(data)
        assert walker.rests(names, starts, suffixes, ios) == indexed._rests(names, starts, suffixes, ios, False), path
        with monkeypatch.context() as patch:
            for module in (indexed, plan, columns):
                patch.setattr(module, "leafwalk", lambda: None)
            python = leaftable.compare_leaf_table(data, {"doc_size": 1})
        assert (native is None) == (python is None), path
        if native is not None:
            assert isinstance(native, pa.Table)
            assert repr((native.schema, native.to_pylist())) == repr((python.schema, python.to_pylist())), path
    names, starts, suffixes, ios, _ = indexed._walk_all(_every_leaf_kind("t")["data"])
    assert walker.rests(names, starts, suffixes, [None] * len(ios)) is None  # an api record's leaf without its io
    assert walker.rests(names, starts[:-1] + [len(suffixes) - 1], suffixes, ios) is None  # a leaf of no record


def test_the_planner_takes_the_table_as_walked_no_stand_ins(tmp_path, monkeypatch):
    """From the index, the C planner takes each side as its table holds it walked (suffixes, ios,
    the leaves' numbers): no stand-in record is laid out, and no number_columns pass is made over
    statistics the table holds as floats; the outputs are the same bytes. The real fixtures here
    include statistics of other JSON types (their columns then go through number_columns)."""
    import msprobe.compare._indexed as indexed
    import msprobe.compare._plan as plan

    def no_stand_ins(*args, **kw):
        raise AssertionError("stand-in records laid out")

    t = _indexed_copy(tmp_path, "t", _f(*REAL_PAIRS[0][0].split("/"), "step0"))
    b = _indexed_copy(tmp_path, "b", _f(*REAL_PAIRS[0][1].split("/"), "step0"))
    counted = []
    real = plan.number_columns
    monkeypatch.setattr(plan, "number_columns", lambda values: counted.append(len(values)) or real(values))
    monkeypatch.setattr(indexed, "stand_in_records", no_stand_ins)
    # the documents parsed (not scanned: msprobe.compare._scanned gives its own number columns too)
    monkeypatch.setenv("MSPROBE_LAKE_COMPARE_SCAN", "0")
    _same_from_index(tmp_path, monkeypatch, t, b)
    from_json = len(counted)
    counted.clear()
    compare(t, b, str(tmp_path / "again"), timestamp=TS, plot=False, progress=False)
    assert from_json and not counted  # the documents' statistics went through number_columns, the tables' did not


def test_the_tables_statistics_read_as_number_columns_reads_them(tmp_path):
    """IndexedSide's statistics as float64 columns and masks (NUMBERS) are number_columns' answer over
    the values: floats, NaN/inf, null, ints (one beyond a float's range), bools, strings."""
    import numpy as np

    from msprobe.compare._floattext import number_columns
    from msprobe.compare._indexed import NUMBERS, indexed_side
    from msprobe.readers import open as open_dump

    roots = [_write_doc(str(tmp_path / side), _every_leaf_kind(side)) for side in ("t", "b")]
    roots += [_indexed_copy(tmp_path, f"real{i}", _f(*pair.split("/"), "step0")) for i, pair in enumerate(REAL_PAIRS[0])]
    for root in roots[:2]:
        build_index(root, leaf_tables=write_compare_leaves)
    for root in roots:
        side = indexed_side(open_dump(root).sources[0])
        assert side is not None, root
        for key in ("Max", "Min", "Mean", "Norm"):
            want = number_columns(side.columns[key].tolist())
            got = side.columns[NUMBERS][key]
            for a, b in zip(got, want):
                assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True), (root, key)


def test_a_walked_side_plans_as_its_stand_ins():
    """plan_block over a leaf table's walked side gives the rows it gives over its stand-in records
    (leaves: their numbers, not the stand-ins' ``type``), and declines a malformed walked side."""
    import numpy as np

    from msprobe.compare._indexed import _rests, _walk_all, stand_in_records
    from msprobe.format.model import TENSOR_TYPES
    from msprobe.format.native import leafwalk
    from tests._dump_docs import fixture_data

    walker = leafwalk()
    assert walker is not None, "the C leaf walk is needed (built on first use; MSPROBE_LAKE_NATIVE=0 unset)"
    checked = 0
    for path, data in [("every leaf kind", _every_leaf_kind("t")["data"])] + list(fixture_data()):
        names, starts, suffixes, ios, _ = _walk_all(data)
        rec = np.repeat(np.arange(len(names)), np.diff(starts))
        stand = stand_in_records(names, rec, ios, _rests(names, starts, suffixes, ios))
        if stand is None:
            continue
        walked = ({name: i for i, name in enumerate(names)}, np.asarray(starts, dtype=np.int64).tobytes(), suffixes, ios)
        pairs = [(name, name) for name in names[::2]] + [(name, None) for name in names[1::2]]
        for bench in (stand, walked):
            by_stand = walker.plan_block(stand, bench, pairs, 0, len(pairs), [], False, TENSOR_TYPES)
            by_walk = walker.plan_block(walked, bench, pairs, 0, len(pairs), [], False, TENSOR_TYPES)
            assert by_stand is not None and by_walk is not None, path
            numbered = [[leaf["type"] if isinstance(leaf, dict) else leaf for leaf in got[i]] for got in (by_stand, by_walk)
                        for i in (0, 3)]
            assert numbered[0] == numbered[2] and numbered[1] == numbered[3], path
            assert by_stand[1:3] + by_stand[4:] == by_walk[1:3] + by_walk[4:], path
        checked += 1
    assert checked > 10
    names = list(_every_leaf_kind("t")["data"])
    pairs = [(names[0], None)]
    for bad in (({names[0]: 0}, np.array([0, 99], dtype=np.int64).tobytes(), ["a"], ["input"]),
                ({names[0]: 5}, np.array([0, 1], dtype=np.int64).tobytes(), ["a"], ["input"]),
                ({names[0]: 0}, b"\x00" * 3, ["a"], ["input"]),
                ({names[0]: 0}, np.array([0, 1], dtype=np.int64).tobytes(), ["a"], []),
                ({names[0]: 0}, np.array([0, 1], dtype=np.int64).tobytes(), ["a"])):
        assert walker.plan_block(bad, {}, pairs, 0, 1, None, False, TENSOR_TYPES) is None, bad
    with pytest.raises(KeyError):
        walker.plan_block(({}, np.array([0], dtype=np.int64).tobytes(), [], []), {}, pairs, 0, 1, None, False,
                          TENSOR_TYPES)


def test_the_layout_check_is_kept_per_document_shape(monkeypatch):
    """Whether a document's leaves lay out as stand-ins is checked once per shape of document (its
    names, leaf counts, suffixes and ios: the ranks of a step share them) and the answer kept, for
    a document that lays out and for one that does not; a name holding the digest's separator is
    checked every time; a table of the same shape but other values is that document's own."""
    import msprobe.compare._leaftable as leaftable

    calls = []
    real = leaftable.stand_in_records
    monkeypatch.setattr(leaftable, "stand_in_records", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setattr(leaftable, "_LAID_OUT", {})
    good = _every_leaf_kind("t")["data"]
    bad = dict(good, **{"Functional.list.0.forward": [_tensor()]})  # neither an object nor a debug value
    odd = dict(good, **{"Functional.nul\x00.0.forward": {"output": [_tensor()]}})
    for _ in range(2):
        assert leaftable.compare_leaf_table(good) is not None
        assert leaftable.compare_leaf_table(bad) is None
    assert len(calls) == 2
    for _ in range(2):
        assert leaftable.compare_leaf_table(odd) is not None
    assert len(calls) == 4
    changed = copy.deepcopy(good)
    changed["mean.0.debug"]["Mean"] = 123.5  # the same shape, another value
    changed["Functional.linear.0.forward"]["input_kwargs"]["mode"]["value"] = "mean"
    other = leaftable.compare_leaf_table(changed)
    assert len(calls) == 4
    monkeypatch.setattr(leaftable, "_LAID_OUT", {})
    want = leaftable.compare_leaf_table(changed)
    assert len(calls) == 5 and repr(other.to_pylist()) == repr(want.to_pylist())
    assert repr(want.to_pylist()) != repr(leaftable.compare_leaf_table(good).to_pylist())
