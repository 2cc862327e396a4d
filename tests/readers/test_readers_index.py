"""The Parquet side index: built from dumps, answers without dump.json, forms a lake; the CLI."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from readers_synth import debug_dump, mindspore_dump, torch_dump
from readers_synth import debugger_dump as _dump_run

import msprobe.readers as readers
from msprobe.cli import main as cli
from msprobe.readers.index import INDEX_VERSION, build_index, read_index_metadata, write_rank_index

pa = pytest.importorskip("pyarrow")
pd = pytest.importorskip("pandas")
pytest.importorskip("torch")


@pytest.fixture(scope="module")
def _dist_template(tmp_path_factory):
    root = tmp_path_factory.mktemp("tmpl") / "runA"
    writers = torch_dump(str(root), dialect="msprobe-26", steps=(0, 1), ranks=(0, 1), n_extra=3)
    return root, writers


@pytest.fixture
def dist(tmp_path, _dist_template):
    import shutil

    src, writers = _dist_template
    root = tmp_path / "runA"
    shutil.copytree(src, root)
    for w in writers.values():  # point the writers at the copy
        w.dir = str(root / os.path.relpath(w.dir, src))
    return root, writers


def _count_parses(monkeypatch):
    import msprobe.readers._source as source

    calls = []
    orig = source.parse_document
    monkeypatch.setattr(source, "parse_document", lambda data, file: calls.append(file) or orig(data, file))
    return calls


def test_index_equals_json_and_needs_no_json(dist, monkeypatch):
    root, writers = dist
    ref = readers.open(str(root), engine="msprobe").to_pandas()
    written = build_index(str(root))
    assert len(written) == 4 and all(w.endswith("/index/records.parquet") for w in written)
    calls = _count_parses(monkeypatch)
    d = readers.open(str(root))
    assert d.engine == "index"
    got = d.to_pandas()
    pd.testing.assert_frame_equal(got, ref)
    names = [r.name for r in d.records(step=1, rank=1)]
    assert names == list(writers[(1, "rank1")].data)  # records without tensors are in the index too
    assert [r.name for r in d.records(kind="parameters_grad", rank=0)] == ["Module.fc.Linear.parameters_grad.0"] * 2
    rec = d.record("Functional.linear.0.forward", step=0, rank=1)
    assert (rec.kind, rec.api_type, rec.api_name, rec.call_index, rec.direction) == (
        "api", "Functional", "linear", 0, "forward")
    assert rec.parent_name == "Module.fc.Linear.forward.0" and rec.stack_id == "0"
    assert (d.framework, d.task, d.level, d.dialect) == ("pytorch", "tensor", "mix", "msprobe-26")
    assert d.count() == sum(len(w.data) for w in writers.values())
    import pyarrow.compute as pc

    big = d.to_pandas(filter=pc.field("norm") > 3.0, columns=["record", "norm"])
    assert len(big) == int((ref["norm"] > 3.0).sum()) and (big["norm"] > 3.0).all()
    assert calls == []  # not one dump.json parsed
    # digests are light; the full record is read on demand
    assert rec.input_args[0].dtype == "torch.float32"
    assert len(calls) == 1


def test_index_works_without_dump_json(dist):
    root, writers = dist
    build_index(str(root))
    for (step, rd) in writers:
        os.remove(root / f"step{step}" / rd / "dump.json")
    d = readers.open(str(root))
    assert len(d.to_pandas()) > 0
    assert len(d.records(step=0, rank=0, name="Tensor.__add__.*")) == 3
    assert d.find_anomalies(norm_above=1e9).empty


def test_anomalies(tmp_path):
    root = tmp_path / "nan"
    torch_dump(str(root), dialect="msprobe-26", task="statistics")
    p = root / "step0" / "proc4242" / "dump.json"
    doc = json.loads(p.read_text())
    doc["data"]["Torch.sum.0.forward"]["output"][0]["Max"] = float("nan")
    doc["data"]["Functional.linear.0.forward"]["output"][0]["Min"] = float("-inf")
    p.write_text(json.dumps(doc))
    for engine_first in (False, True):
        if engine_first:
            build_index(str(root))
        d = readers.open(str(root))
        assert d.engine == ("index" if engine_first else "msprobe")
        a = d.find_anomalies()
        assert set(a["record"]) == {"Torch.sum.0.forward", "Functional.linear.0.forward"}
        assert a["has_nan"].sum() == 1 and a["has_inf"].sum() == 1
        assert set(d.find_anomalies(norm_above=0.0)["record"]) >= set(a["record"])


def test_lake_of_runs(tmp_path, dist):
    root, _ = dist
    other = tmp_path / "runB"
    torch_dump(str(other), dialect="msprobe-8", steps=(0,))
    lake = tmp_path / "lake"
    build_index(str(root), out=str(lake))
    build_index(str(other), out=str(lake), run="B")
    keys = sorted(str(p.relative_to(lake)) for p in lake.rglob("*.parquet") if p.name != "_compact.parquet")
    assert sorted(str(p.relative_to(lake)) for p in lake.rglob("_compact.parquet")) == [
        "run=B/_compact.parquet", "run=runA/_compact.parquet"]
    assert keys == ["run=B/step=0/rank=rank/records.parquet", "run=runA/step=0/rank=0/records.parquet",
                    "run=runA/step=0/rank=1/records.parquet", "run=runA/step=1/rank=0/records.parquet",
                    "run=runA/step=1/rank=1/records.parquet"]
    md = read_index_metadata(readers.open(str(lake)).store, keys[0])
    assert md["index_version"] == INDEX_VERSION and md["format_version"] == "1.0"
    assert md["source"].endswith("runB/step0/rank") and md["dialect"] == "msprobe-8"
    d = readers.open(str(lake))
    assert d.engine == "index" and d.runs == ["B", "runA"]
    df = d.to_pandas()
    assert set(df["run"]) == {"B", "runA"}
    ref = pd.concat([readers.open(str(other), run="B").to_pandas(), readers.open(str(root)).to_pandas()],
                    ignore_index=True)
    pd.testing.assert_frame_equal(df, ref)
    # the lake is one pyarrow dataset
    import pyarrow.dataset as pads

    ds = pads.dataset(str(lake), format="parquet")  # pyarrow skips _compact.parquet ('_' prefix)
    assert ds.count_rows(filter=pads.field("io").is_valid()) == len(df)
    # records and tensors reach back into the dumps
    rec = d.record("Functional.linear.0.forward", step=0, rank=None, run="B")
    assert rec.input_args[0].load().shape == (3, 4)
    assert rec.parent.name == "Module.fc.Linear.forward.0"


def test_write_rank_index_for_dumpers(tmp_path):
    """What a dumper calls at publish: plain dicts, through a backends store."""
    from msprobe.backends import open_store

    w = torch_dump(str(tmp_path / "d"), dialect="msprobe-8")[(0, "rank")]
    store = open_store(str(tmp_path / "d"))
    doc = json.loads((tmp_path / "d/step0/rank/dump.json").read_text())
    stack = json.loads((tmp_path / "d/step0/rank/stack.json").read_text())
    construct = json.loads((tmp_path / "d/step0/rank/construct.json").read_text())
    key = write_rank_index(store, "step0/rank", doc, step=0, rank=None, stack=stack, construct=construct)
    assert key == "step0/rank/index/records.parquet"
    d = readers.open(str(tmp_path / "d"))
    assert d.engine == "index"
    assert [r.name for r in d.records()] == list(w.data)
    pd.testing.assert_frame_equal(d.to_pandas(), readers.open(str(tmp_path / "d"), engine="msprobe").to_pandas())


def test_index_of_other_dialects(tmp_path):
    mindspore_dump(str(tmp_path / "ms"))
    debug_dump(str(tmp_path / "dbg"))
    for name in ("ms", "dbg"):
        ref = readers.open(str(tmp_path / name)).to_pandas()
        build_index(str(tmp_path / name))
        d = readers.open(str(tmp_path / name))
        assert d.engine == "index"
        pd.testing.assert_frame_equal(d.to_pandas(), ref)


def test_index_parts_and_mixed(dist):
    """Rank directories without an index are read from dump.json; index/part-N.parquet is read too."""
    root, writers = dist
    ref = readers.open(str(root)).to_pandas()
    build_index(str(root))
    os.rename(root / "step0/rank0/index/records.parquet", root / "step0/rank0/index/part-0.parquet")
    for f in (root / "step1/rank1/index").iterdir():
        f.unlink()
    d = readers.open(str(root))
    assert [s.use_index for s in d.sources] == [True, True, True, False]
    pd.testing.assert_frame_equal(d.to_pandas(), ref)


def test_refresh_drops_index_for_live_journal(dist):
    root, writers = dist
    build_index(str(root))
    d = readers.open(str(root), engine="index")
    n = d.count(step=0, rank=0)
    rank = root / "step0" / "rank0"
    (rank / ".journal").mkdir()
    stack = {"stack_id": 7, "frames": ["File x.py, line 1, in f, \n y"]}
    line = {"name": "Tensor.__mul__.0.forward", "record": {"input_args": [], "input_kwargs": {}, "output": []},
            "parent": None, "stack_id": 7}
    (rank / ".journal" / "000001.jsonl").write_text(
        json.dumps(stack) + "\n" + json.dumps(line) + "\n" + '{"name": "torn')
    d.refresh()
    recs = d.records(step=0, rank=0)
    assert len(recs) == n + 1 and recs[-1].name == "Tensor.__mul__.0.forward"
    assert recs[-1].stack == ["File x.py, line 1, in f, \n y"] and recs[-1].stack_id == "7"
    assert recs[-1].source.live


# -- CLI -----------------------------------------------------------------------------------------------

def test_cli_ls_show_index(dist, tmp_path, capsys):
    root, writers = dist
    assert cli(["ls", str(root)]) == 0
    out = capsys.readouterr().out
    assert "dialect msprobe-26" in out and "task tensor" in out and "rank0" in out
    n = len(writers[(0, "rank0")].data)
    assert f"{4 * n} records" in out
    assert cli(["show", str(root), "Functional.linear.0.forward", "--step", "0", "--rank", "1"]) == 0
    out = capsys.readouterr().out
    assert "input_args.0" in out and "max=" in out and "parent: Module.fc.Linear.forward.0" in out
    assert "File train.py, line 10" in out
    assert cli(["show", str(root), "Functional.linear.0.forward"]) == 1
    assert "pass --step N and/or --rank R" in capsys.readouterr().err
    assert cli(["show", str(root), "Torch.sum.0.forward", "--step", "1", "--rank", "rank0", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown == {"Torch.sum.0.forward": writers[(1, "rank0")].data["Torch.sum.0.forward"]}
    assert cli(["index", str(root), "--progress"]) == 0
    cap = capsys.readouterr()
    # stderr is not a terminal here: progress lines, no \r bar (and none at all without --progress)
    assert "indexed 4 rank dir(s)" in cap.out and "index: 4/4 rank dirs [100%]" in cap.err and "\r" not in cap.err
    assert cli(["ls", str(root), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["engine"] == "index" and {r["source"] for r in s["rank_dirs"]} == {"index"}
    lake = tmp_path / "lake2"
    assert cli(["index", str(root), "--out", str(lake), "--run", "r1", "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    assert cli(["ls", str(lake)]) == 0
    assert "4 rank dir(s)" in capsys.readouterr().out
    assert cli(["ls", str(tmp_path / "nothing-here")]) == 1
    assert cli(["ls", str(tmp_path)]) == 1
    assert "Engines:" in capsys.readouterr().err


def test_tensor_roundtrip_through_index(dist):
    root, writers = dist
    build_index(str(root))
    d = readers.open(str(root))
    for rec in d.records(step=1, rank=0):
        for io, t in rec.tensors():
            if t.data_name:
                np.testing.assert_array_equal(t.load(), writers[(1, "rank0")].tensors[t.data_name])


def test_lake_compaction(tmp_path, dist):
    from msprobe.readers.index import COMPACT_FILE, compact_index

    root, _ = dist
    lake = tmp_path / "lake"
    build_index(str(root), out=str(lake), run="A")
    assert (lake / "run=A" / COMPACT_FILE).exists()
    ref = readers.open(str(root), run="A").to_pandas()
    d = readers.open(str(lake))
    assert list(d.compacts) == ["run=A/_compact.parquet"] and len(d.sources) == 4
    pd.testing.assert_frame_equal(d.to_pandas(), ref)
    pd.testing.assert_frame_equal(d.to_pandas(step=1).reset_index(drop=True),
                                  ref[ref["step"] == 1].reset_index(drop=True))  # a subset: per-file reads
    assert d.count() == len(readers.open(str(root)).records())
    # re-indexing a run drops its compaction; files it would not cover are read as usual
    build_index(str(root), out=str(lake), run="A", compact=False)
    assert not (lake / "run=A" / COMPACT_FILE).exists()
    pd.testing.assert_frame_equal(readers.open(str(lake)).to_pandas(), ref)
    compact_index(str(lake))
    # a compaction that no longer covers what is listed is ignored
    os.remove(lake / "run=A" / "step=1" / "rank=1" / "records.parquet")
    d = readers.open(str(lake))
    assert d.compacts == {}
    assert len(d.to_pandas()) == len(ref[~((ref["step"] == 1) & (ref["rank"] == 1))])


def test_run_compaction_streamed_or_read_back(tmp_path, dist):
    """build_index streams the run's compaction from the tables it builds when they are all of
    the run's files: the same bytes as compact_index reading them back; with other files in
    the run (skip_existing kept them), it reads them all, as before."""
    from msprobe.readers.index import COMPACT_FILE, compact_index

    root, _ = dist
    lake = tmp_path / "lake"
    build_index(str(root), out=str(lake), run="A")
    compacted = lake / "run=A" / COMPACT_FILE
    streamed = compacted.read_bytes()
    compacted.unlink()
    compact_index(str(lake))
    assert compacted.read_bytes() == streamed
    ref = readers.open(str(lake)).to_pandas()
    os.remove(lake / "run=A" / "step=1" / "rank=0" / "records.parquet")
    assert len(build_index(str(root), out=str(lake), run="A", skip_existing=True)) == 4
    assert json.loads(read_index_metadata(readers.open(str(lake)).store, f"run=A/{COMPACT_FILE}")["covers"]) == [
        "step=0/rank=0/records.parquet", "step=0/rank=1/records.parquet", "step=1/rank=0/records.parquet",
        "step=1/rank=1/records.parquet"]
    d = readers.open(str(lake))
    assert list(d.compacts) == [f"run=A/{COMPACT_FILE}"]
    pd.testing.assert_frame_equal(d.to_pandas(), ref)


def test_stale_index_after_redump_is_ignored(tmp_path):
    """A re-dump into the same path leaves the old index behind: it covers another document
    (size, mtime), so readers ignore it with a StaleIndexWarning and read dump.json."""
    from msprobe.readers.index import StaleIndexWarning

    root = tmp_path / "run"
    _dump_run(root, layers=2, index=True)
    rank = root / "step0" / "rank"
    meta = read_index_metadata(readers.open(str(root)).store, "step0/rank/index/records.parquet")
    st = os.stat(rank / "dump.json")
    assert (meta["doc_size"], meta["doc_mtime"]) == (st.st_size, st.st_mtime)  # what it covers
    old = readers.open(str(root)).count()
    _dump_run(root, layers=5, nan=True)  # same path, no index written this time
    assert (rank / "index" / "records.parquet").exists()
    n_doc = len(json.loads((rank / "dump.json").read_text())["data"])
    assert n_doc > old
    with pytest.warns(StaleIndexWarning, match="stale Parquet index"):
        d = readers.open(str(root))
        assert d.count() == n_doc
    assert not d.find_anomalies().empty
    # an index lake built from the first dump: its file is stale too
    _dump_run(tmp_path / "run2", layers=2)
    lake = tmp_path / "lake"
    build_index(str(tmp_path / "run2"), out=str(lake), run="r")
    assert readers.open(str(lake)).count() == old
    _dump_run(tmp_path / "run2", layers=5, nan=True)
    with pytest.warns(StaleIndexWarning):
        d = readers.open(str(lake))
        assert d.count() == n_doc and not d.find_anomalies().empty
    # build_index(skip_existing=True) rebuilds what is stale, keeps what holds
    build_index(str(root), skip_existing=True)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", StaleIndexWarning)
        d = readers.open(str(root))
        assert d.engine == "index" and d.count() == n_doc
        assert [r["source"] for r in d.summary()["rank_dirs"]] == ["index"]
    # same size, rewritten later (a re-dump of the same shape): the time tells
    doc = (rank / "dump.json").read_bytes()
    (rank / "dump.json").write_bytes(doc.replace(b'"Max": ', b'"Max":', 1) + b" ")
    with pytest.warns(StaleIndexWarning, match="modified after"):
        assert readers.open(str(root)).summary()["rank_dirs"][0]["source"] == "dump.json"
