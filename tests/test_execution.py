"""msprobe.execution (issue 22): the one layer that spreads work (in this process, a process
pool, Dask), used by compare and the lake, reporting to one progress reporter."""
from __future__ import annotations

import ast
import io
import os
import pathlib
from dataclasses import dataclass

import pytest

import msprobe
from msprobe.errors import ConfigError
from msprobe.execution import Executor, star
from msprobe.progress import Progress


@dataclass(frozen=True)
class Job:
    n: int
    fail: bool = False


def square(job: Job) -> tuple:
    if job.fail:
        raise ValueError(f"job {job.n} failed")
    return job.n * job.n, os.getpid()


def add(a: int, b: int) -> int:
    return a + b


def _progress() -> Progress:
    return Progress(None, "t", enabled=True, stream=io.StringIO())


def test_in_process_and_pool_give_results_in_job_order():
    jobs = [Job(i) for i in range(7)]
    with Executor() as ex:
        prog = _progress()
        got = ex.map(square, jobs, progress=prog, weight=lambda j: j.n)
        assert [r for r, _ in got] == [i * i for i in range(7)] and {p for _, p in got} == {os.getpid()}
        assert ex.last == "in-process" and prog.n == sum(range(7))
    with Executor(processes=3) as ex:
        assert ex.backend(1) == "in-process" and ex.backend(2) == "processes"
        prog = _progress()
        got = ex.map(square, jobs, progress=prog)
        assert [r for r, _ in got] == [i * i for i in range(7)]
        assert os.getpid() not in {p for _, p in got} and ex.last == "processes" and prog.n == 7
        assert ex.map(star(add), [(1, 2), (3, 4)]) == [3, 7]


def test_a_failed_job_raises_in_the_caller():
    with Executor(processes=2) as ex, pytest.raises(ValueError, match="job 3 failed"):
        ex.map(square, [Job(i, fail=i == 3) for i in range(6)])
    with pytest.raises(ConfigError):
        Executor(processes=0)
    with pytest.raises(ConfigError):
        Executor(local_cluster="sometimes")


def test_dask_client():
    distributed = pytest.importorskip("distributed")
    with distributed.Client(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=":0") as client:
        ex = Executor(client, processes=4)
        prog = _progress()
        assert [r for r, _ in ex.map(square, [Job(i) for i in range(5)], progress=prog)] == [0, 1, 4, 9, 16]
        assert ex.last == "client" and ex.backend(1) == "dask" and prog.n == 5
        with pytest.raises(ValueError, match="job 2 failed"):
            ex.map(square, [Job(i, fail=i == 2) for i in range(4)], progress=_progress())
        ex.close()
        assert client.status == "running"  # a given client is the caller's to close


def test_only_the_execution_layer_launches_work():
    """No other module starts a process pool or maps over a Dask client (run_ut's own worker
    processes, with per-API timeouts and crash isolation, are not a pool of tasks)."""
    pkg = pathlib.Path(msprobe.__file__).parent
    found = []
    for path in sorted(pkg.rglob("*.py")):
        if path.name == "execution.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = (node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None)
            if name in ("ProcessPoolExecutor", "LocalCluster", "as_completed"):
                found.append(f"{path.relative_to(pkg)}:{node.lineno} {name}")
    assert not found, found
    assert not (pkg / "lake" / "_dask.py").exists()


def test_no_module_level_mutable_state():
    tree = ast.parse((pathlib.Path(msprobe.__file__).parent / "execution.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign):
            assert isinstance(node.value, (ast.Constant, ast.List)) and all(
                isinstance(t, ast.Name) and t.id.isupper() or t.id == "__all__" for t in node.targets), ast.dump(node)
