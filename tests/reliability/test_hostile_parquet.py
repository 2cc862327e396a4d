"""Parquet index bombs: index files of a few KiB that would inflate to gigabytes (a huge
dictionary value referenced by many rows, a run-length encoded column of ten million rows).
The readers, the compaction and the lake refuse them from the footer or from the dictionaries,
before inflating, with a typed one-line error; the dump's records stay readable from dump.json."""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("torch")

from tests.reliability._bombs import cli_measured, run_measured

BOUND_MIB = 200
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("pq") / "dump")
    script = ("import torch\nfrom msprobe.pytorch import PrecisionDebugger\n"
              f"dbg = PrecisionDebugger(task='statistics', dump_path={root!r}, level='L1')\n"
              "m = torch.nn.Linear(4, 3)\n"
              "dbg.start(); m(torch.ones(2, 4)).sum().backward(); dbg.stop(); dbg.step()\n")
    env = dict(os.environ, PYTHONPATH=ROOT)
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=300)
    subprocess.run([sys.executable, "-m", "msprobe", "index", root], check=True, env=env, timeout=300)
    (index,) = glob.glob(os.path.join(root, "step0", "*", "index", "records.parquet"))
    return root, index


def _bomb(index: str, kind: str) -> int:
    """Rewrite ``index`` as a bomb of ``kind`` in a child process (building it costs memory, and a
    child's peak RSS starts from its parent's: the measured commands must start small); its size."""
    code = f"from tests.reliability._bombs import write_parquet_bomb; write_parquet_bomb({index!r}, {kind!r})"
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ, PYTHONPATH=ROOT), timeout=300)
    return os.path.getsize(index)


@pytest.mark.parametrize("kind", ["dict", "strings", "rows"])
def test_index_bombs_are_refused_before_inflating(indexed, tmp_path, kind, figures):
    pristine, _ = indexed
    root = str(tmp_path / "dump")
    shutil.copytree(pristine, root)
    (index,) = glob.glob(os.path.join(root, "step0", "*", "index", "records.parquet"))
    size = _bomb(index, kind)
    assert size < 1 << 20, size
    body = ("import msprobe.readers\n"
            "    from msprobe.index.files import IndexBombError\n"
            f"    d = msprobe.readers.open({root!r}, engine='index')\n"
            "    try:\n"
            "        t = d.to_arrow()\n"
            "        print('READ', t.num_rows, t.nbytes)\n"
            "    except IndexBombError as exc:\n"
            "        print('REFUSED', exc)")
    rc, out, err, grown = run_measured(body)
    assert rc == 0, err[-3000:]
    assert "REFUSED" in out and "Parquet bomb" in out, out
    assert grown < BOUND_MIB, grown
    figures.setdefault("bomb_peak_mib", {})[f"parquet_{kind}/reader"] = grown.figure()
    # the lake reads the index files it built (from dump.json); a bomb there is refused from its
    # footer before DuckDB reads it ('strings' passes the footer: DuckDB is not asked for them here)
    # (a dump as the lake's root is only read: the lake's own files go to --lake-dir)
    lake_dir = str(tmp_path / "lake_dir")
    argv = ["lake", "sql", root, "SELECT count(*) AS n FROM lake_records", "--lake-dir", lake_dir]
    rc, out, err, _ = cli_measured(argv, preimport="")
    assert rc == 0, err[-2000:]
    (own,) = glob.glob(os.path.join(lake_dir, "index", "**", "records.parquet"), recursive=True)
    _bomb(own, kind)
    rc, out, err, grown = cli_measured(argv, preimport="")
    assert "Traceback" not in err, err[-3000:]
    if kind != "strings":
        assert rc != 0 and "Parquet bomb" in err and len(err.strip().splitlines()) <= 3, (rc, err[-2000:])
    assert grown < BOUND_MIB, grown
    figures.setdefault("bomb_peak_mib", {})[f"parquet_{kind}/lake_sql"] = grown.figure()
    # the document is intact: the records are read from dump.json
    import msprobe.readers

    assert msprobe.readers.open(root, engine="msprobe").count() == msprobe.readers.open(pristine).count()


def test_compaction_refuses_a_bomb(indexed, tmp_path):
    from msprobe.backends import open_store
    from msprobe.index.compact import compact_files
    from msprobe.index.files import IndexBombError

    _, index = indexed
    bomb = str(tmp_path / "records.parquet")
    shutil.copy(index, bomb)
    _bomb(bomb, "dict")
    store = open_store(str(tmp_path))
    with pytest.raises(IndexBombError, match="Parquet bomb"):
        compact_files(store, "_compact.parquet", ["records.parquet"])
    assert not os.path.exists(tmp_path / "_compact.parquet")
