"""Dumps of the real msprobe (26.2.0 and 8.1.1, tests/fixtures/real) and the golden dumps
(spec/golden): the reader agrees with the documents, the tensor files and the stacks.

Every check reads the JSON with plain ``json.load`` as the reference, so nothing here
trusts the reader's own parsing. Scenario directories that are not there are skipped.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

import msprobe.readers as readers
from msprobe.errors import UnknownDialectError

pd = pytest.importorskip("pandas")
pytest.importorskip("pyarrow")

HERE = Path(__file__).resolve().parent
REAL = Path(os.environ.get("MSPROBE_READERS_REAL_ROOT", HERE.parent / "fixtures" / "real"))
GOLDEN = HERE.parent.parent / "spec" / "golden"


def _scenarios() -> list:
    out = []
    for tool in ("ms26", "ms8"):
        base = REAL / tool
        if not base.is_dir():
            continue
        for sc in sorted(base.iterdir()):
            if sc.is_dir() and not sc.name.startswith(("_", ".")) and any(sc.rglob("*.json")):
                out.append(pytest.param(sc, id=f"{tool}-{sc.name}"))
    return out or [pytest.param(None, marks=pytest.mark.skip(reason=f"no real-tool fixtures under {REAL}"))]


def _documents(root: Path) -> dict:
    """(step, rank_dir, split) -> (doc path, parsed JSON), found with os.walk."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in ("dump.json", "debug.json"):
            if name in files:
                p = Path(dirpath)
                split = next((s for s in ("graph", "pynative") if s in p.relative_to(root).parts), None)
                step = int(p.parent.name[4:]) if p.parent.name.startswith("step") else None
                with open(p / name) as f:
                    out[(step, p.name, split)] = (p, json.load(f))
    return out


def _node(raw, path: str):
    node = raw
    for part in path.split(".") if path else []:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def _same_stat(got, want) -> bool:
    if want is None:
        return got is None or (isinstance(got, float) and math.isnan(got))
    if isinstance(want, float) and math.isnan(want):
        return isinstance(got, float) and math.isnan(got)
    return float(got) == float(want)


def _check_dump(root: Path, *, load_tensors: bool = True) -> int:
    docs = _documents(root)
    try:
        d = readers.open(str(root))
    except UnknownDialectError:
        assert not any(doc["data"] for _, doc in docs.values())
        pytest.skip("no dump.json with records")
    assert d.engine == "msprobe"
    # record counts and order equal the documents
    assert len(d.sources) == len(docs)
    for src in d.sources:
        path, doc = docs[(src.step, src.rank_dir, src.split)]
        recs = d.records(step=src.step, rank=src.rank_dir, split=src.split)
        assert [r.name for r in recs] == list(doc["data"]), path
        assert (d.framework, d.task, d.level) == (doc["framework"], doc["task"], doc["level"])
    # every statistic of the table equals the JSON
    df = d.to_pandas()
    n_rows = 0
    for row in df.itertuples(index=False):
        split = row.split if isinstance(row.split, str) else None
        step = None if row.step is pd.NA else int(row.step)
        _, doc = docs[(step, row.rank_dir, split)]
        raw = doc["data"][row.record]
        entry = _node(raw, row.arg_path)
        assert entry["dtype"] == row.dtype and tuple(entry["shape"]) == row.shape
        for col, key in (("max", "Max"), ("min", "Min"), ("mean", "Mean"), ("norm", "Norm")):
            assert _same_stat(getattr(row, col), entry.get(key)), (row.record, row.arg_path, col)
        want_md5 = entry.get("md5")  # 26.x xor mode writes a float for 0-d tensors: kept as JSON text
        want_md5 = want_md5 if isinstance(want_md5, str) or want_md5 is None else json.dumps(want_md5)
        assert (row.md5 if isinstance(row.md5, str) else None) == want_md5
        assert (row.data_name if isinstance(row.data_name, str) else None) == entry.get("data_name")
        n_rows += 1
    n_entries = sum(1 for s in d.sources for r in d.records(step=s.step, rank=s.rank_dir, split=s.split)
                    for _ in r.tensors())
    assert n_rows == n_entries
    # stacks and parents resolve
    for src in d.sources:
        path, doc = docs[(src.step, src.rank_dir, src.split)]
        stack_path, construct_path = path / "stack.json", path / "construct.json"
        stack = json.loads(stack_path.read_text()) if stack_path.exists() else {}
        construct = json.loads(construct_path.read_text()) if construct_path.exists() else {}
        frames = {}
        for sid, value in stack.items():
            if isinstance(value, list) and len(value) == 2 and isinstance(value[0], list):
                for name in value[0]:
                    frames[name] = (sid, value[1])
        for rec in d.records(step=src.step, rank=src.rank_dir, split=src.split):
            if rec.name in frames:
                assert rec.stack_id == frames[rec.name][0] and rec.stack == frames[rec.name][1]
            parent = construct.get(rec.name)
            assert rec.parent_name == (parent if isinstance(parent, str) else None)
            if isinstance(parent, str) and parent in doc["data"]:
                assert rec.parent.name == parent and rec in rec.parent.children
    # every tensor loads and equals torch.load of its file
    n_files = 0
    zarr_loaded: dict = {}
    if load_tensors:
        torch = pytest.importorskip("torch")
        for rec in d.records():
            for io, t in rec.tensors():
                if not t.data_name:
                    continue
                key = t.key
                local = os.path.join(root, *key.split("/"))
                if "#" in key:  # a payload of the rank's Zarr store (spec 21): checked against the golden's values
                    a = t.load()
                    assert list(a.shape) == list(t.shape)
                    zarr_loaded[t.data_name] = a
                elif key.endswith(".pt"):
                    ref = torch.load(local, weights_only=True, map_location="cpu")
                    got = t.load(framework="torch")
                    assert got.dtype == ref.dtype and torch.equal(torch.nan_to_num(got), torch.nan_to_num(ref))
                    a = t.load()
                    assert a.shape == tuple(ref.shape)
                else:
                    ref = np.load(local, allow_pickle=False)
                    np.testing.assert_array_equal(t.load(), ref)
                n_files += 1
    expected = root / "expected.json"
    if zarr_loaded and expected.exists():
        want = {t["data_name"]: t for t in json.loads(expected.read_text()).get("tensors") or [] if "data_name" in t}
        assert set(want) == set(zarr_loaded), "every Zarr payload of the golden has its declared values"
        for name, a in zarr_loaded.items():
            assert list(a.shape) == want[name]["shape"]
            np.testing.assert_array_equal(a.reshape(-1), np.array(want[name]["values"], dtype=a.dtype))
    return n_files


@pytest.mark.parametrize("scenario", _scenarios())
def test_real_fixture(scenario, tmp_path):
    n_files = _check_dump(scenario)
    if "tensor" in scenario.name and "debug" not in scenario.name:
        assert n_files > 0
    # the index answers the same table
    from msprobe.readers.index import build_index

    build_index(str(scenario), out=str(tmp_path / "lake"))
    ref = readers.open(str(scenario)).to_pandas()
    got = readers.open(str(tmp_path / "lake")).to_pandas()
    pd.testing.assert_frame_equal(got, ref)


def _goldens() -> list:
    if not GOLDEN.is_dir():
        return [pytest.param(None, marks=pytest.mark.skip(reason="no spec/golden"))]
    return [pytest.param(p, id=p.name) for p in sorted(GOLDEN.iterdir()) if (p / "expected.json").exists()]


@pytest.mark.parametrize("golden", _goldens())
def test_golden(golden):
    expected = json.loads((golden / "expected.json").read_text())
    _check_dump(golden)
    d = readers.open(str(golden))
    assert d.framework == expected.get("framework", d.framework)
    if "records" in expected and isinstance(expected["records"], int):
        assert d.count() == expected["records"]
    if "record_names" in expected:
        assert [r.name for r in d.records()] == expected["record_names"]
    if expected.get("dialect"):
        assert d.dialect == expected["dialect"]
    for t in [t for t in expected.get("tensors") or [] if "record" in t]:  # Zarr goldens name data_name: _check_dump
        rec = d.record(t["record"])
        arg = rec.tensor(t["path"])
        assert arg.dtype == t["dtype"] and list(arg.shape) == t["shape"]
        if "values" in t and arg.data_name:
            np.testing.assert_array_equal(arg.load(), np.array(t["values"], dtype=t.get("numpy_dtype")))
