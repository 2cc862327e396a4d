"""msprobe.readers.open over every dialect: layout, records, arguments, tensors, structure, tables."""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from readers_synth import debug_dump, mindspore_dump, torch_dump

import msprobe.readers as readers
from msprobe.errors import ConfigError, RecordNotFoundError, UnknownDialectError

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def _d26_template(tmp_path_factory):
    root = tmp_path_factory.mktemp("tmpl") / "run26"
    return root, torch_dump(str(root), dialect="msprobe-26", steps=(0, 1))


@pytest.fixture
def d26(tmp_path, _d26_template):
    import shutil

    src, writers = _d26_template
    root = tmp_path / "run26"
    shutil.copytree(src, root)
    for w in writers.values():
        w.dir = str(root / os.path.relpath(w.dir, src))
    return root, writers


@pytest.fixture
def d8dist(tmp_path):
    root = tmp_path / "run8"
    writers = torch_dump(str(root), dialect="msprobe-8", steps=(0,), ranks=(0, 1))
    return root, writers


def _stat_eq(table_value, json_value) -> bool:
    if json_value is None:
        return table_value is None or (isinstance(table_value, float) and math.isnan(table_value))
    if isinstance(json_value, float) and math.isnan(json_value):
        return math.isnan(table_value)
    return float(table_value) == float(json_value)


# -- layout ----------------------------------------------------------------------------------

def test_open_26_root(d26):
    root, writers = d26
    d = readers.open(str(root))
    assert d.engine == "msprobe"
    assert d.steps == [0, 1]
    assert d.ranks == [None]
    assert (d.framework, d.task, d.level) == ("pytorch", "tensor", "mix")
    assert d.dialect == "msprobe-26"
    assert d.rank_dirs == [(0, "proc4242"), (1, "proc4242")]


def test_open_8_distributed(d8dist):
    root, writers = d8dist
    d = readers.open(str(root))
    assert d.ranks == [0, 1]
    assert d.dialect == "msprobe-8"
    names = [r.name for r in d.records(step=0, rank=1)]
    assert names == list(writers[(0, "rank1")].data)
    assert "Module.fc.Linear.parameters_grad" in names
    with pytest.raises(readers.AmbiguousRecordError):
        d.record("Functional.linear.0.forward")
    rec = d.record("Functional.linear.0.forward", step=0, rank=1)
    assert rec.rank == 1 and rec.rank_dir == "rank1"


@pytest.mark.parametrize("which", ["step", "rank"])
def test_open_step_and_rank_dirs(d26, which):
    root, writers = d26
    path = root / "step1" if which == "step" else root / "step1" / "proc4242"
    d = readers.open(str(path))
    assert d.steps == [1]
    assert d.rank_dirs == [(1, "proc4242")]
    assert [r.name for r in d.records()] == list(writers[(1, "proc4242")].data)
    assert d.record("Torch.sum.0.forward").step == 1


def test_open_file_url_and_memory(d26):
    root, writers = d26
    d = readers.open("file://" + str(root))
    assert d.steps == [0, 1]
    import fsspec

    fs = fsspec.filesystem("memory")
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            fs.pipe(f"/readers-mem/{os.path.relpath(p, root)}", open(p, "rb").read())
    m = readers.open("memory://readers-mem")
    try:
        rec = m.record("Functional.linear.0.forward", step=0, rank=None)
        np.testing.assert_array_equal(rec.input_args[0].load(),
                                      writers[(0, "proc4242")].tensors["Functional.linear.0.forward.input.0.pt"])
    finally:
        fs.rm("/readers-mem", recursive=True)


def test_not_a_dump(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(UnknownDialectError) as ei:
        readers.open(str(tmp_path))
    msg = str(ei.value)
    assert "'msprobe'" in msg and "'index'" in msg and "notes.txt" in msg


def test_engine_argument(d26):
    root, _ = d26
    assert readers.open(str(root), engine="msprobe").engine == "msprobe"
    assert readers.open(str(root), engine=readers.MsprobeEngine).engine == "msprobe"
    with pytest.raises(ConfigError, match="valid values are index, msprobe"):
        readers.open(str(root), engine="netcdf4")
    assert set(readers.list_engines()) == {"msprobe", "index"}


def test_opening_is_cheap(d26, monkeypatch):
    root, _ = d26
    import msprobe.readers._source as source

    calls = []
    orig = source.parse_document
    monkeypatch.setattr(source, "parse_document", lambda data, file: calls.append(file) or orig(data, file))
    d = readers.open(str(root))
    assert (d.steps, d.ranks) == ([0, 1], [None])
    assert calls == []
    d.records(step=0)
    assert len(calls) == 1  # one rank's document, once
    d.records(step=0)
    assert len(calls) == 1


def test_lazy_imports():
    code = ("import sys, msprobe.readers as r; "
            "print(sorted(m for m in ('torch', 'pyarrow', 'pandas', 's3fs', 'mindspore') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# -- records and arguments --------------------------------------------------------------------------

def test_records_order_and_filters(d26):
    root, writers = d26
    d = readers.open(str(root))
    w = writers[(0, "proc4242")]
    recs = d.records(step=0, rank=None)
    assert [r.name for r in recs] == list(w.data)
    assert [r.seq for r in recs] == list(range(len(w.data)))
    assert len(d.records()) == 2 * len(w.data)
    assert {r.kind for r in d.records(step=0, kind="module")} == {"module"}
    assert [r.name for r in d.records(step=0, kind="parameters_grad")] == ["Module.fc.Linear.parameters_grad.0"]
    assert {r.name for r in d.records(step=0, prefix="Torch")} == {
        "Torch.sum.0.forward", "Torch.isfinite.0.forward", "Torch.cat.0.forward"}
    assert [r.name for r in d.records(step=0, name="Functional.*")] == [
        "Functional.linear.0.forward", "Functional.linear.0.backward"]
    assert [r.name for r in d.records(step=0, name=re.compile(r"linear\.0\.back"))] == ["Functional.linear.0.backward"]
    assert [r.name for r in d.records(step=0, regex=r"^Module\..*backward")] == ["Module.fc.Linear.backward.0"]
    assert {r.direction for r in d.records(step=0, direction="backward")} == {"backward"}
    assert len(d.records(step=0, kind=["api", "module"], direction="forward")) == 7
    assert d.count() == 2 * len(w.data)


def test_record_fields_and_args(d26):
    root, writers = d26
    d = readers.open(str(root))
    w = writers[(0, "proc4242")]
    rec = d.record("Functional.linear.0.forward", step=0, rank=None)
    assert (rec.name, rec.kind, rec.api_type, rec.api_name, rec.call_index, rec.direction) == (
        "Functional.linear.0.forward", "api", "Functional", "linear", 0, "forward")
    assert rec.to_json() == w.data[rec.name]
    arg = rec.input_args[0]
    raw = w.data[rec.name]["input_args"][0]
    assert (arg.dtype, arg.shape, arg.requires_grad, arg.data_name) == (
        "torch.float32", (3, 4), False, "Functional.linear.0.forward.input.0.pt")
    assert arg.stats == {"max": raw["Max"], "min": raw["Min"], "mean": raw["Mean"], "norm": raw["Norm"]}
    assert arg.to_json() == raw
    a = arg.load()
    assert isinstance(a, np.ndarray)
    np.testing.assert_array_equal(a, w.tensors[arg.data_name])
    t = arg.load(framework="torch")
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32
    assert rec.input_kwargs == {}
    assert len(rec.output) == 1
    mod = d.record("Module.fc.Linear.forward.0", step=0)
    assert set(mod.parameters) == {"weight", "bias"}
    np.testing.assert_array_equal(mod.parameters["weight"].load(), w.tensors[mod.parameters["weight"].data_name])
    back = d.record("Functional.linear.0.backward", step=0)
    assert len(back.input) == 1 and len(back.output) == 3
    pg = d.record("Module.fc.Linear.parameters_grad.0", step=1)
    assert pg.kind == "parameters_grad" and pg.call_index == 0
    np.testing.assert_array_equal(pg.parameters["weight"].load(),
                                  writers[(1, "proc4242")].tensors[pg.parameters["weight"].data_name])
    s = d.record("Torch.sum.0.forward", step=0)
    assert s.input_kwargs["dim"].value == 0
    assert s.input_args[0].stats["mean"] is None  # 26.x: integer tensors carry no Mean/Norm
    cat = d.record("Torch.cat.0.forward", step=0)
    assert [t.path for t in cat.input_args[0]] == ["input_args.0.0", "input_args.0.1"]
    with pytest.raises(RecordNotFoundError):
        d.record("Functional.nope.0.forward", step=0)


def test_every_tensor_loads_and_matches(d26):
    root, writers = d26
    d = readers.open(str(root))
    n = 0
    for rec in d.records():
        w = writers[(rec.step, rec.rank_dir)]
        for io, t in rec.tensors():
            if t.data_name:
                np.testing.assert_array_equal(t.load(), w.tensors[t.data_name])
                ref = torch.load(os.path.join(w.dir, "dump_tensor_data", t.data_name), weights_only=True)
                assert torch.equal(t.load(framework="torch"), ref)
                n += 1
    assert n == sum(len(w.tensors) for w in writers.values())


def test_stack_parent_children(d26):
    root, _ = d26
    d = readers.open(str(root))
    rec = d.record("Functional.linear.0.forward", step=0)
    assert rec.stack == readers_frames()
    assert rec.stack_id == "0"
    assert rec.parent.name == "Module.fc.Linear.forward.0"
    assert rec.parent.parent is None
    assert [c.name for c in rec.parent.children] == ["Functional.linear.0.forward"]
    back = d.record("Functional.linear.0.backward", step=0)
    assert back.stack == readers_frames()  # a backward record shows its forward's stack
    assert back.parent_name == "Module.fc.Linear.backward.0"


def readers_frames():
    from readers_synth import FRAMES

    return FRAMES


def test_to_pandas_matches_json(d26):
    root, writers = d26
    d = readers.open(str(root))
    df = d.to_pandas()
    assert list(df.columns) == list(readers.COLUMNS)
    total = 0
    for (step, rd), w in writers.items():
        sub = df[(df["step"] == step) & (df["rank_dir"] == rd)]
        for row in sub.itertuples(index=False):
            raw = w.data[row.record]
            node = raw
            parts = row.arg_path.split(".") if row.arg_path else []
            for p in parts:
                node = node[int(p)] if isinstance(node, list) else node[p]
            assert node["dtype"] == row.dtype and tuple(node["shape"]) == row.shape
            for col, key in (("max", "Max"), ("min", "Min"), ("mean", "Mean"), ("norm", "Norm")):
                assert _stat_eq(getattr(row, col), node.get(key)), (row.record, row.arg_path, col)
            assert (node.get("data_name") or None) == (row.data_name if isinstance(row.data_name, str) else None)
            assert row.numel == int(np.prod(node["shape"]))
        total += len(sub)
        n_tensors = sum(1 for r in d.records(step=step, rank=rd) for _ in r.tensors())
        assert len(sub) == n_tensors
    assert total == len(df)
    assert set(df["io"]) == {"input_args", "input_kwargs", "output", "parameters", "input", "parameters_grad"} - {
        "input_kwargs"}
    sel = d.to_pandas(step=1, columns=["record", "norm"])
    assert list(sel.columns) == ["record", "norm"] and len(sel) == len(df[df["step"] == 1])


def test_refresh_sees_new_steps_and_records(d26, tmp_path):
    root, writers = d26
    d = readers.open(str(root))
    n0 = len(d.records())
    torch_dump(str(root), dialect="msprobe-26", steps=(2,))
    doc_path = root / "step0" / "proc4242" / "dump.json"
    doc = json.loads(doc_path.read_text())
    doc["data"]["Tensor.__mul__.0.forward"] = {"input_args": [], "input_kwargs": {}, "output": []}
    doc_path.write_text(json.dumps(doc, indent=1))
    info = d.refresh()
    assert info == {"new_rank_dirs": 1, "changed_rank_dirs": 1}
    assert d.steps == [0, 1, 2]
    assert len(d.records()) == n0 + 1 + len(writers[(0, "proc4242")].data)
    assert d.record("Tensor.__mul__.0.forward", step=0).kind == "api"
    assert d.update() == {"new_rank_dirs": 0, "changed_rank_dirs": 0}


# -- other dialects ---------------------------------------------------------------------------------

def test_debug_level(tmp_path):
    w = debug_dump(str(tmp_path / "dbg"))
    d = readers.open(str(tmp_path / "dbg"))
    assert d.level == "debug"
    recs = d.records()
    assert [r.name for r in recs] == list(w.data)
    assert {r.kind for r in recs} == {"debug"}
    assert recs[1].api_name == "y_grad"
    assert recs[0].value.dtype == "torch.float32"
    df = d.to_pandas()
    assert list(df["arg_path"]) == ["", "", "n"]
    assert set(df["io"]) == {"debug"}
    assert recs[0].stack is None and recs[0].parent is None


def test_mindspore_graph_pynative(tmp_path):
    writers = mindspore_dump(str(tmp_path / "ms"))
    d = readers.open(str(tmp_path / "ms"))
    assert d.framework == "mindspore"
    assert d.steps == [0] and d.ranks == [0]
    assert {s.split for s in d.sources} == {"graph", "pynative"}
    with pytest.raises(readers.AmbiguousRecordError, match="split="):
        d.record("Cell.dense.Dense.forward.0")
    rec = d.record("Primitive.matmul.MatMul.0.forward", split="graph")
    assert (rec.api_type, rec.api_name, rec.kind) == ("Primitive", "matmul.MatMul", "api")
    w = writers[("graph", 0, "rank0")]
    arg = rec.input_args[0]
    assert arg.dtype == "Float32"
    np.testing.assert_array_equal(arg.load(), w.tensors[arg.data_name])
    assert arg.load(framework="torch").dtype == torch.float32
    assert rec.parent.name == "Cell.dense.Dense.forward.0"
    bf = d.record("Mint.add.0.forward", split="pynative").input_args[0]
    assert bf.dtype == "BFloat16"
    np.testing.assert_array_equal(bf.load(), np.array([[1.5, -2.0], [0.25, 3.0]], dtype=np.float32))
    tb = bf.load(framework="torch")
    assert tb.dtype == torch.bfloat16 and tb.float().tolist() == [[1.5, -2.0], [0.25, 3.0]]
    jit = [r for r in d.records(split="graph") if r.api_type == "Jit"][0]
    t = jit.input_args[0]
    assert len(t.data_name) > 255 and len(t.key.rsplit("/", 1)[-1]) < 60  # resolved through mapping.csv
    np.testing.assert_array_equal(t.load(), w.tensors[t.data_name])
    df = d.to_pandas()
    assert set(df["split"]) == {"graph", "pynative"}
    assert df[df["record"] == jit.name]["location"].iloc[0] == "dump_tensor_data/" + w.mapping[t.data_name]


def test_statistics_and_md5_dumps(tmp_path):
    torch_dump(str(tmp_path / "st"), task="statistics", level="L1")
    d = readers.open(str(tmp_path / "st"))
    rec = d.record("Functional.linear.0.forward")
    assert rec.input_args[0].data_name is None
    assert rec.parent is None and rec.children == []
    from msprobe.errors import TensorLoadError

    with pytest.raises(TensorLoadError, match="no data_name"):
        rec.input_args[0].load()
    torch_dump(str(tmp_path / "m5"), task="md5")
    df = readers.open(str(tmp_path / "m5")).to_pandas()
    assert df["md5"].str.fullmatch(r"[0-9a-f]{8}").all()


def test_rank_order_is_numeric(tmp_path):
    torch_dump(str(tmp_path / "d"), dialect="msprobe-8", ranks=(2, 10), task="statistics", level="L1")
    d = readers.open(str(tmp_path / "d"))
    assert d.ranks == [2, 10]
    assert [s.rank_dir for s in d.sources] == ["rank2", "rank10"]
    assert d.records()[0].rank == 2 and d.records()[-1].rank == 10
    assert list(d.to_pandas()["rank"].unique()) == [2, 10]
    assert d.records(rank=None) == []  # several ranks: None selects none of them
    assert len(d.records(rank="rank10")) == len(d.records(rank=10))


def test_marker_major_version_is_checked(tmp_path):
    torch_dump(str(tmp_path / "d"), dialect="msprobe-8", task="statistics", level="L1")
    (tmp_path / "d" / "step0" / "rank" / "msprobe_lake.json").write_text(
        json.dumps({"format_version": "2.0", "dialect": "msprobe-lake"}))
    d = readers.open(str(tmp_path / "d"))
    with pytest.raises(UnknownDialectError, match="format_version 2.0"):
        d.records()


@pytest.mark.parametrize("text, msg", [
    ('{"task": "x", "data": {"a": ', "truncated JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"data": ' + "[" * 5000 + "]" * 5000 + "}", "nested"),
    ('{"data": {}, "x": NaN}', None),
])
def test_malformed_documents(tmp_path, text, msg):
    from msprobe.errors import DocumentError

    rank = tmp_path / "d" / "step0" / "rank"
    rank.mkdir(parents=True)
    (rank / "dump.json").write_text(text)
    d = readers.open(str(tmp_path / "d"))
    if msg is None:
        assert d.records() == []
        return
    with pytest.raises(DocumentError, match=msg) as ei:
        d.records()
    assert "dump.json" in str(ei.value)
