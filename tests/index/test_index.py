"""msprobe.index (issue 22): the Parquet index is its own package below the readers, and one
streaming compactor makes both the readers' per-run and the lake's per-step compactions."""
from __future__ import annotations

import ast
import os
import pathlib
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lake"))
import lake_synth as S

import msprobe
import msprobe.lake
from msprobe.errors import FormatError
from msprobe.index import compact

INDEX_PKG = pathlib.Path(msprobe.__file__).parent / "index"
ABOVE = ("msprobe.readers", "msprobe.dumpers", "msprobe.online", "msprobe.compare", "msprobe.run_ut",
         "msprobe.lake", "msprobe.cli", "msprobe.pytorch", "msprobe.mindspore")


def test_index_imports_nothing_above_it():
    """Every import of msprobe/index/, those inside functions included."""
    bad = []
    for path in sorted(INDEX_PKG.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{path.name}:{node.lineno} {n}" for n in names if n.startswith(ABOVE)]
    assert not bad, bad


def _meta(path) -> dict:
    md = pq.read_metadata(str(path)).metadata or {}
    return {k.decode(): v.decode() for k, v in md.items() if k.startswith(b"msprobe_lake.")}


@pytest.fixture(scope="module")
def lake_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("idx"))
    S.make_lake(root, runs=("run_a",), steps=2, ranks=3)
    msprobe.lake.open(root, local=True)
    return pathlib.Path(root)


def test_one_compactor_for_runs_and_steps(lake_root, monkeypatch):
    """The readers' run compaction of the lake's index files holds the rows of the lake's own
    step compactions, in the same order, with the same kind of metadata; written in row groups
    of ROW_GROUP_ROWS (streamed, not one table in memory)."""
    index = lake_root / "_lake" / "index"
    steps = sorted(index.glob("run=run_a/step=*/_compact.parquet"))
    assert len(steps) == 2
    monkeypatch.setattr(compact, "ROW_GROUP_ROWS", 8)
    assert compact.compact_index(str(index), runs=["run_a"]) == ["run=run_a/_compact.parquet"]
    run_file = index / "run=run_a" / "_compact.parquet"
    whole = pq.read_table(str(run_file))
    parts = pa.concat_tables([pq.read_table(str(p)).replace_schema_metadata(None) for p in steps])
    assert whole.replace_schema_metadata(None).equals(parts)
    assert pq.ParquetFile(str(run_file)).metadata.num_row_groups >= whole.num_rows // 8 > 1
    run_meta, step_meta = _meta(run_file), _meta(steps[0])
    assert set(run_meta) == set(step_meta), set(run_meta) ^ set(step_meta)
    assert {"msprobe_lake.task", "msprobe_lake.framework", "msprobe_lake.covers"} <= set(run_meta)
    assert int(run_meta["msprobe_lake.records"]) == sum(int(_meta(p)["msprobe_lake.records"]) for p in steps)
    assert "msprobe_lake.rank" not in run_meta and "msprobe_lake.doc_mtime" not in run_meta


def test_a_failed_compaction_leaves_nothing(lake_root, tmp_path, monkeypatch):
    """An unreadable input stops the compaction with a typed error: no file is written, the
    temporary one is gone. The temporary files go to this test's own TMPDIR (never the shared /tmp,
    where other workers' compactions come and go)."""
    import tempfile

    from msprobe.backends import open_store

    own_tmp = tmp_path / "tmp"
    own_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(own_tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    store = open_store(str(lake_root / "_lake" / "index"))
    keys = sorted(k for k in store.list_prefix("run=run_a") if k.endswith("records.parquet"))
    writer = compact.CompactWriter(store, "run=run_a/_probe.parquet")  # the temporary file is made there
    assert [n for n in os.listdir(own_tmp) if n.startswith(".msprobe-compact-")]
    writer.abort()
    assert os.listdir(own_tmp) == []
    store.put("run=run_a/step=0/rank=9/records.parquet", b"not parquet")
    try:
        with pytest.raises(FormatError, match="not a readable index file"):
            compact.compact_files(store, "run=run_a/_broken.parquet",
                                  keys + ["run=run_a/step=0/rank=9/records.parquet"])
        assert not store.exists("run=run_a/_broken.parquet")
        assert os.listdir(own_tmp) == []
    finally:
        store.delete("run=run_a/step=0/rank=9/records.parquet")
