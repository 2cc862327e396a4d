"""spec/ stands alone: spec/check/ holds a reader and a writer written from spec/FORMAT.md only
(they import nothing of msprobe). Their reading of every vector, golden and committed real dump
equals the package's, and the package reads and validates what the independent writer writes
(every dialect, both frameworks, every summary mode, tensor dumps, debug dumps, a crash journal).
The vectors made by spec/vectors/generate_package.py are reproduced byte for byte."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _fmt_support import SPEC

import msprobe.readers as mr
from msprobe.backends import open_store
from msprobe.dumpers.recover import recover_store
from msprobe.format.dialects import detect_dialect
from msprobe.format.stats import reference_stats, stats_equal
from msprobe.readers.validate import validate_store

ROOT = SPEC.parent
CHECK = SPEC / "check"
sys.path.insert(0, str(CHECK))
import reader as R  # noqa: E402
import writer as W  # noqa: E402

REAL = ROOT / "tests" / "fixtures" / "real"
REAL_ROOTS = sorted(str(p) for sub in ("ms8", "ms26", "ms26_mindspore", "zoo26") for p in (REAL / sub).iterdir()
                    if p.is_dir() and not p.name.startswith("_"))
GOLDENS = sorted(str(p) for p in (SPEC / "golden").iterdir() if p.is_dir())
VEC = SPEC / "vectors"
COLS = ["step", "rank", "rank_dir", "split", "seq", "record", "kind", "api_type", "api_name", "call_index",
        "direction", "io", "arg_path", "type", "dtype", "shape", "max", "min", "mean", "norm", "md5",
        "requires_grad", "data_name", "location", "stack_id", "parent"]


def test_the_checker_imports_nothing_of_msprobe():
    for f in CHECK.glob("*.py"):
        text = f.read_text(encoding="utf-8")
        assert "import msprobe" not in text and "from msprobe" not in text, f


def test_the_checker_knows_the_statistics_of_the_format(tmp_path):
    """The checker is written from the spec alone, so it cannot read format.stats.STATISTICS: this test
    holds its statistics to the table (a statistic added to STATISTICS fails here until the spec and the
    checker learn it), in the reader and in the entries the writer writes."""
    from msprobe.format.stats import STAT_KEYS

    assert tuple(R.STAT_KEYS) == STAT_KEYS
    x = np.array([1.0, -2.0, 0.5], dtype=np.float32)
    (rdir,) = W.write_dump(str(tmp_path), [W.Call("api", "Torch.relu", "forward", 0,
                                                  {"input_args": [x], "input_kwargs": {}, "output": [x]})])
    with open(os.path.join(rdir, "dump.json"), encoding="utf-8") as f:
        entry = json.load(f)["data"]["Torch.relu.0.forward"]["input_args"][0]
    assert [key for key in entry if key in STAT_KEYS] == list(STAT_KEYS) and entry["Max"] == 1.0, entry


def _norm(v):
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    if isinstance(v, list):
        return tuple(v)
    return v


def _key(r):
    return (str(r["split"]), -1 if r["step"] is None else r["step"], str(r["rank_dir"]), r["seq"], str(r["arg_path"]))


def package_rows(path: str) -> tuple:
    d = mr.open(path)
    return d, sorted(({c: _norm(r.get(c)) for c in COLS} for r in d.to_arrow().to_pylist()), key=_key)


def checker_rows(path: str) -> tuple:
    d = R.Dump(path)
    rows = [r for r in d.rows() if r["arg_path"] is not None]
    return d, sorted(({c: _norm(r.get(c)) for c in COLS} for r in rows), key=_key)


def assert_same_reading(path: str, tensors: bool = True) -> int:
    """The checker's rows (spec section 18), dialect and rank directories equal the package's;
    every tensor file loads to the same values. Returns the rows compared."""
    pd_, a = package_rows(path)
    cd, b = checker_rows(path)
    assert cd.dialect == pd_.dialect, path
    assert [(r.split, r.step, r.rank, r.rank_dir) for r in cd.rank_dirs] == \
        [(s.split, s.step, s.rank, s.rank_dir) for s in pd_.sources], path
    assert len(a) == len(b), (path, len(a), len(b))
    for x, y in zip(a, b):
        for c in COLS:
            vx, vy = x[c], y[c]
            if c in ("max", "min", "mean", "norm") and isinstance(vx, float) and isinstance(vy, float):
                assert vx == vy or abs(vx - vy) <= 1e-12 * max(1.0, abs(vx)), (path, x["record"], c, vx, vy)
            else:
                assert vx == vy, (path, x["record"], x["arg_path"], c, vx, vy)
    if tensors:
        for rd in cd.rank_dirs:
            for name, value in (rd.data or {}).items():
                for path_, t in R.tensor_leaves(value):
                    if not isinstance(t.get("data_name"), str):
                        continue
                    ours = rd.load(t)
                    rec = pd_.record(name, step=rd.step, rank=rd.rank_dir, split=rd.split)
                    theirs = np.asarray(rec.tensor(".".join(path_)).load("numpy"))
                    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, (path, t["data_name"])
                    assert np.array_equal(ours, theirs, equal_nan=ours.dtype.kind in "fc"), (path, t["data_name"])
    return len(a)


@pytest.mark.parametrize("path", GOLDENS, ids=os.path.basename)
def test_goldens_read_the_same(path):
    assert assert_same_reading(path) > 0


def test_every_committed_real_dump_reads_the_same():
    assert len(REAL_ROOTS) >= 70
    rows = sum(assert_same_reading(p) for p in REAL_ROOTS)
    assert rows > 5000


def test_goldens_expected_values():
    """Each golden's expected.json: the checker recomputes the statistics and CRC-32 from the values
    (spec section 15) and finds them in the dump; tensor files load to the values."""
    checked = 0
    for g in GOLDENS:
        exp = json.loads(Path(g, "expected.json").read_text())
        if "record" not in exp["tensors"][0]:
            continue  # zarr-pytorch: test_zarr_golden_is_a_zarr_store
        (rd,) = R.Dump(g).rank_dirs
        entries = {(name, ".".join(p)): t for name, v in rd.data.items() for p, t in R.tensor_leaves(v)}
        dialect = exp.get("dialect") or "msprobe-lake"
        for t in exp["tensors"]:
            entry = entries[(t["record"], t["path"])]
            a = np.array(t["values"], dtype=t["numpy_dtype"]).reshape(t["shape"])
            got = R.stats(a, t["dtype"], dialect, exp["framework"])
            for k, v in zip(R.STAT_KEYS, got):
                assert R.stats_equal(v, t[k]) and R.stats_equal(v, entry.get(k)), (g, t["record"], k, v, t[k])
            assert R.crc32_hex(R.element_bytes(a, t["dtype"])) == t["crc32"], (g, t["record"])
            if "md5" in entry:
                assert entry["md5"] == t["crc32"]
            if t.get("data_name"):
                assert np.array_equal(rd.load(entry), a), (g, t["data_name"])
            checked += 1
    assert checked >= 10


def test_validity_vectors():
    for kind, ok in (("valid", True), ("invalid", False)):
        for f in sorted((VEC / kind).glob("*.json")):
            doc_kind = f.name.split("--", 1)[0]
            try:
                problems = R.VALIDATORS[doc_kind](R.load_json(f.read_bytes()))
            except R.FormatError as exc:
                problems = [str(exc)]
            assert (not problems) == ok, (f.name, problems)


def test_name_vectors():
    names = json.loads((VEC / "names.json").read_text())
    for case in names["record_names"]["valid"]:
        got = R.parse_record_name(case["name"], strict=True)
        for k in ("kind", "prefix", "api_name", "class_name", "call_index", "direction"):
            assert got[k] == case[k], (case, k, got[k])
    for case in names["record_names"]["invalid"]:
        with pytest.raises(R.FormatError):
            R.parse_record_name(case["name"], strict=True)
    for case in names["data_names"]["valid"]:
        for record in (None, case["record"]):
            got = R.parse_data_name(case["name"], record)
            assert (got["record"], got["io"], got["path"], got["ext"]) == \
                (case["record"], case["io"], case["path"], case["ext"]), case
    for case in names["data_names"]["invalid"]:
        with pytest.raises(R.FormatError):
            R.parse_data_name(case["name"])


def test_statistics_vectors():
    cases = json.loads((VEC / "statistics.json").read_text())["cases"]
    assert any(c["dtype"] == "float16" for c in cases) and any(c["dtype"] == "bfloat16" for c in cases)
    for c in cases:
        if c["dtype"].startswith("complex"):
            a = np.array([complex(*v) for v in c["values"]], dtype=c["dtype"]).reshape(c["shape"])
        else:
            a = np.array(c["values"], dtype="float32" if c["dtype"] == "bfloat16" else c["dtype"]).reshape(c["shape"])
        for key, want in c["stats"].items():
            framework, dialect = key.split("/")
            got = R.stats(a, c["dtype"], dialect, framework)
            for g, w in zip(got, want):
                assert type(g) is type(w) or (isinstance(g, float) and isinstance(w, float)), (c["label"], key, g, w)
                assert R.stats_equal(g, w) and (g == w or g != g or w is None), (c["label"], key, got, want)
        assert R.crc32_hex(R.element_bytes(a, c["dtype"])) == c["bytes_crc32"], c["label"]
        if a.ndim and a.size:
            assert R.xor_md5(a, c["dtype"]) == c["bytes_xor"], c["label"]


def test_dialect_vectors():
    for c in json.loads((VEC / "dialects.json").read_text())["cases"]:
        doc = None if c.get("header") is None else {**c["header"], "data": c["data"]}
        assert R.detect_dialect(c["rank_dirs"], c["data"], c["marker"], doc) == c["dialect"], c["label"]
        assert detect_dialect(c["rank_dirs"], c["data"], c["marker"], doc) == c["dialect"], c["label"]


def test_layout_vectors():
    base = VEC / "layouts"
    for lay in json.loads((base / "layouts.json").read_text())["layouts"]:
        d = R.Dump(str(base / lay["path"]))
        assert [{"split": r.split, "step": r.step, "rank": r.rank, "rank_dir": r.rank_dir} for r in d.rank_dirs] \
            == lay["rank_dirs"], lay["path"]
        assert d.dialect == lay["dialect"], lay["path"]
        assert d.kernel == lay["kernel_dumps"], lay["path"]
        assert_same_reading(str(base / lay["path"])) if lay["rank_dirs"] else None


def test_journal_vectors(tmp_path):
    base = VEC / "journal"
    exp = json.loads((base / "expected.json").read_text())
    for name in ("crashed", "live"):
        d = R.Dump(str(base / name))
        (rd,) = d.rank_dirs
        assert list(rd.data) == exp[name]["records"], name
        assert rd.data == exp[name]["data"], name
        assert_same_reading(str(base / name))
    rd = R.Dump(str(base / "crashed")).rank_dirs[0]
    ours = R.replay_documents(str(Path(rd.path, ".journal")), rd.marker)
    for doc in ours.values():
        doc.pop("dump_data_dir", None)
    assert ours == exp["crashed"]["replay"]


def test_zarr_golden_is_a_zarr_store():
    exp = json.loads((SPEC / "golden" / "zarr-pytorch" / "expected.json").read_text())
    (rd,) = R.Dump(str(SPEC / "golden" / "zarr-pytorch")).rank_dirs
    assert rd.zarr and rd.manifest()["complete"] is True
    entries = {t["data_name"]: t for v in rd.data.values() for _, t in R.tensor_leaves(v) if t.get("data_name")}
    for t in exp["tensors"]:
        got = rd.load(entries[t["data_name"]])
        assert list(got.shape) == t["shape"]
        assert np.array_equal(got.reshape(-1).astype(np.float64), np.array(t["values"], dtype=np.float64))
    assert len({t["payload"] for t in exp["tensors"]}) < len(exp["tensors"])  # a shared payload
    report = validate_store(open_store(str(SPEC / "golden" / "zarr-pytorch"), read_only=True, create=False),
                            tensors=True)
    assert report.ok and report.tensors_loaded == len(exp["tensors"]), [str(p) for p in report.problems]


# ------------------------------------------------------------------ the independent writer

def _calls() -> list:
    x = np.arange(6, dtype=np.float32).reshape(2, 3) / 8 - 0.25
    w = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    i = np.array([1, 2, 3, -4], dtype=np.int64)
    st = ["File /t/train.py, line 3, in forward, \n y = f(x)", "File /t/train.py, line 9, in <module>, \n main()"]
    C = W.Call
    return [
        C("module", "Module.fc.Linear", "forward", 0,
          {"input_args": [x], "input_kwargs": {}, "output": [x @ w.T], "parameters": {"weight": w}}, stack=st),
        C("api", "Functional.linear", "forward", 0,
          {"input_args": [x, w, None], "input_kwargs": {"scale": 0.5, "flag": True}, "output": [x @ w.T]},
          parent="Module.fc.Linear.forward.0", stack=st),
        C("api", "Tensor.sum", "forward", 0,
          {"input_args": [i], "input_kwargs": {"dim": slice(None, 2)}, "output": [np.array(i.sum())]},
          parent="Module.fc.Linear.forward.0", stack=st),
        C("api", "Torch.cat", "forward", 0,
          {"input_args": [[np.zeros((0, 4), np.float32), np.ones((1, 4), np.float16)]], "input_kwargs": {},
           "output": [np.ones((1, 4), np.float16), np.array(True), W.BF16(np.array([0.5, 1.5, -2.0], np.float32))]}),
        C("api", "Functional." + "very_long_name_" * 20, "forward", 0,
          {"input_args": [x], "input_kwargs": {}, "output": [x]}),
        C("api", "Functional.linear", "backward", 0, {"input": [x @ w.T], "output": [x, None]},
          parent="Module.fc.Linear.backward.0"),
        C("module", "Module.fc.Linear", "backward", 0, {"input": [x @ w.T], "output": [x]}),
        C("parameters_grad", "Module.fc.Linear", None, 0, {"weight": w * 0.1}),
    ]


def _debug_calls() -> list:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    C = W.Call
    return [C("debug", "logits", None, 0, x), C("debug", "info", None, 0, {"n_tok": np.array([3, 4]),
                                                                           "flag": np.array(True)}),
            C("debug", "logits_grad", None, 0, x * 2), C("debug", "items", None, 0, [x, (np.array([1, 2]), None), 3])]


WRITER_CASES = [dict(dialect=d, framework=f, task=t, mode=m, level="mix")
                for d in ("msprobe-8", "msprobe-26", "msprobe-lake") for f in ("pytorch", "mindspore")
                for t, m in (("statistics", "statistics"), ("statistics", "md5"), ("statistics", "xor"),
                             ("tensor", "statistics"))] + [
    dict(dialect="msprobe-lake", framework="pytorch", task="tensor", mode="statistics", level="debug"),
    dict(dialect="msprobe-26", framework="mindspore", task="tensor", mode="md5", level="debug"),
    dict(dialect="msprobe-lake", framework="pytorch", task="tensor", mode="statistics", level="mix", zarr=True),
    dict(dialect="msprobe-lake", framework="mindspore", task="tensor", mode="xor", level="L1", zarr=True)]


@pytest.mark.parametrize("case", WRITER_CASES, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_the_package_reads_and_validates_what_the_independent_writer_writes(tmp_path, case):
    root = str(tmp_path / "dump")
    ranks = (0, 1) if case["dialect"] == "msprobe-8" else (None,)
    W.write_dump(root, _debug_calls() if case["level"] == "debug" else _calls(), steps=(0, 1), ranks=ranks, **case)
    report = validate_store(open_store(root, read_only=True, create=False), tensors=True)
    assert report.ok, [(p.file, p.location, p.message) for p in report.errors]
    assert report.dialects == {case["dialect"]}
    assert R.validate(root) == []
    assert assert_same_reading(root) > 0
    d = mr.open(root)
    assert d.dialect == case["dialect"]
    assert {r.summary_mode() for r in R.Dump(root).rank_dirs} == {case["mode"]}
    if case["task"] == "tensor" and case["mode"] != "xor":  # the writer's statistics are the package's
        checked = 0
        for rd in R.Dump(root).rank_dirs:
            for v in rd.data.values():
                for _, t in R.tensor_leaves(v):
                    if isinstance(t.get("data_name"), str):
                        want = reference_stats(rd.load(t), dialect=case["dialect"], framework=case["framework"],
                                               logical_dtype=R.logical_dtype(t["dtype"]))
                        got = tuple(t[k] for k in R.STAT_KEYS)
                        assert all(stats_equal(g, w, rtol=0, atol=0) for g, w in zip(got, want)), (t, want)
                        checked += 1
        assert checked >= 10
    if case.get("zarr"):  # every payload was loaded from the store the checker wrote (spec section 21)
        assert all(r.zarr for r in R.Dump(root).rank_dirs) and report.tensors_loaded >= 10


def test_the_package_recovers_what_the_independent_writer_journals(tmp_path):
    root = str(tmp_path / "dump")
    W.write_dump(root, _calls(), dialect="msprobe-lake", level="mix", journal_only=True)
    assert_same_reading(root)  # read live, from the journal
    rd = R.Dump(root).rank_dirs[0]
    ours = R.replay_documents(str(Path(rd.path, ".journal")), rd.marker)
    recover_store(open_store(root, read_only=False, create=False))
    report = validate_store(open_store(root, read_only=True, create=False), tensors=True)
    assert report.ok, [(p.file, p.message) for p in report.errors]
    for name, doc in ours.items():
        theirs = json.loads(Path(rd.path, name).read_text())
        if name == "dump.json":
            assert theirs["data"] == doc["data"]
        else:
            assert theirs == doc, name


def test_generated_vectors_are_reproduced(tmp_path):
    out = tmp_path / "spec"
    subprocess.run([sys.executable, str(VEC / "generate_package.py"), "--out", str(out)], check=True,
                   cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, timeout=300)
    for rel in ("vectors/statistics.json", "vectors/dialects.json", "vectors/layouts", "vectors/journal",
                "golden/zarr-pytorch"):
        a, b = SPEC / rel, out / rel
        files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file()) if a.is_dir() else [None]
        files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file()) if b.is_dir() else [None]
        assert files_a == files_b, rel
        for f in files_a:
            pa, pb = (a / f, b / f) if f is not None else (a, b)
            assert pa.read_bytes() == pb.read_bytes(), f"{rel}/{f}: generated files differ from the committed ones"


def test_the_real_dumps_show_what_the_spec_says_readers_must_tolerate():
    """The tolerances of spec/FORMAT.md are what the committed real-tool dumps hold (figures of issue 33)."""
    recompute_before_output = recompute_last_in_modules = backward_down = forward_down = 0
    spawn_ends = construct_keys_not_records = zero_d_int_max = 0
    for root in REAL_ROOTS:
        for rd in R.Dump(root).rank_dirs:
            data = rd.data or {}
            last: dict = {}
            for name, rec in data.items():
                f = R.parse_record_name(name)
                if isinstance(rec, dict) and "is_recompute" in rec:  # 9.2
                    keys = list(rec)
                    if f["kind"] == "api" and "output" in keys and keys.index("is_recompute") < keys.index("output"):
                        recompute_before_output += 1
                    if f["kind"] == "module" and keys[-1] == "is_recompute":
                        recompute_last_in_modules += 1
                if f["kind"] in ("api", "module"):  # 9.3
                    key = (f["prefix"], f["api_name"], f["class_name"], f["direction"])
                    if key in last and f["call_index"] < last[key]:
                        backward_down += f["direction"] == "backward"
                        forward_down += f["direction"] == "forward"
                    last[key] = f["call_index"]
                for _, t in R.tensor_leaves(rec):  # table 4.1
                    if R.detect_dialect([rd.rank_dir], data, None) == "msprobe-8" and t["shape"] == [] and \
                            str(t["dtype"]).startswith("torch.int") and type(t.get("Max")) is int:
                        zero_d_int_max += 1
            for v in (rd.stack or {}).values():  # 11.1
                if isinstance(v, list) and len(v) == 2 and v[1] and "in spawn_main" in v[1][-1]:
                    spawn_ends += 1
            construct_keys_not_records += sum(1 for k in (rd.construct or {}) if k not in data)  # 12
    assert forward_down == 0
    assert recompute_before_output >= 350 and recompute_last_in_modules >= 30
    assert backward_down >= 100
    assert spawn_ends >= 30
    assert construct_keys_not_records >= 300
    assert zero_d_int_max >= 20
