"""``msprobe ... | head``: a reader that goes away ends every command quietly (status 141, as a
process killed by SIGPIPE), never with a BrokenPipeError traceback.

Each command runs with stdout on a real pipe whose read end is already closed, so its first
write fails (the worst case of ``| head -1``); one shell pipeline checks the usual case.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
REAL = os.path.join(HERE, "fixtures", "real", "ms26")
STATS = os.path.join(REAL, "L1_statistics")
PERT = os.path.join(REAL, "L1_statistics_perturbed")
RECORD = "Functional.linear.0.forward"


@pytest.fixture(scope="module")
def lake_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("lake")
    shutil.copytree(STATS, root / "run_a")
    shutil.copytree(PERT, root / "run_b")
    return str(root)


def _closed_pipe_run(args: list, cwd: str) -> subprocess.CompletedProcess:
    r, w = os.pipe()
    os.close(r)  # the reader is gone before the command writes anything
    try:
        env = dict(os.environ, PYTHONPATH=ROOT)
        return subprocess.run([sys.executable, "-m", "msprobe", *args], stdout=w, stderr=subprocess.PIPE, text=True,
                              env=env, cwd=cwd, timeout=300)
    finally:
        os.close(w)


COMMANDS = {
    "help": ["--help"],
    "validate": ["validate", STATS],
    "ls": ["ls", STATS],
    "show": ["show", STATS, RECORD, "--step", "0"],
    "compare": ["compare", os.path.join(STATS, "step0"), os.path.join(PERT, "step0"), "-o", "{tmp}/cmp", "--no-plot"],
    "compare_json": ["compare", os.path.join(STATS, "step0"), os.path.join(PERT, "step0"), "-o", "{tmp}/cmp2",
                     "--no-plot", "--json"],
    "lake_ls": ["lake", "ls", "{lake}", "--no-cluster"],
    "lake_sql": ["lake", "sql", "{lake}", "SELECT run, record, arg_path FROM lake", "--no-cluster"],
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_closed_stdout_ends_quietly(name, tmp_path, lake_root):
    if name.startswith("lake"):
        pytest.importorskip("duckdb")
        pytest.importorskip("pyarrow")
    args = [a.format(tmp=tmp_path, lake=lake_root) for a in COMMANDS[name]]
    r = _closed_pipe_run(args, str(tmp_path))
    assert "Traceback" not in r.stderr and "BrokenPipeError" not in r.stderr, r.stderr[-2000:]
    assert r.returncode in (0, 141), (r.returncode, r.stderr[-2000:])
    if name != "help":  # argparse's help printer swallows write errors itself
        assert r.returncode == 141


def test_pipe_to_head(tmp_path, lake_root):
    pytest.importorskip("duckdb")
    cmd = (f"{sys.executable} -m msprobe lake sql {lake_root} 'SELECT * FROM lake, range(20)' --no-cluster"
           " | head -n 2")
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, cwd=str(tmp_path), timeout=300,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0
    assert len(r.stdout.splitlines()) == 2
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr[-2000:]
