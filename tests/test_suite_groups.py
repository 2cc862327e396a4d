"""The suite's own scheduling (scripts/test.sh: ``pytest -n 2 --dist loadgroup``): the tests of one
``xdist_group`` run on one worker, so a module fixture marked that way (test_layouts_megatron.py's 38
gloo runs, the sigkill campaign's shared places) is built once. pytest 9 stopped reading the id that
pytest-xdist 3.8 rewrites for the group; tests/conftest.py carries it over."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_group_runs_on_one_worker(tmp_path):
    probe = tmp_path / "workers.txt"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider",
                          os.path.join("tests", "_xdist_group_probe.py")],
                         cwd=ROOT, env=dict(os.environ, MSPROBE_GROUP_PROBE=str(probe)), capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "12 passed" in run.stdout, run.stdout[-2000:]
    workers = probe.read_text().split()
    assert len(workers) == 1 and workers[0].startswith("gw"), workers  # built once, on one xdist worker
