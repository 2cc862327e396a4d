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


def _write_square(folder: str, n: int) -> dict:
    path = os.path.join(folder, f"square{n}.txt")
    with open(path, "w", encoding="ascii") as handle:
        handle.write(str(n * n))
    return {"files": [path]}


def _files(result: dict) -> list:
    return result["files"]


def test_outbox_writes_in_place_where_seen_and_ships_elsewhere(tmp_path):
    """A job that sees the caller's folder writes there; one that does not (its outbox's token is
    in no marker there: another machine) ships its files back, and the caller writes them."""
    from msprobe.execution import Outbox, ship

    out = str(tmp_path / "out")
    with Outbox.opened(out) as box:
        assert os.path.isfile(box.marker) and box.visible()
        here = ship(box, lambda folder: _write_square(folder, 3), _files)
        assert here.files == {} and here.value["files"] == [os.path.join(out, "square3.txt")]
        elsewhere = Outbox(box.path, box.where, "a-token-no-marker-holds")
        assert not elsewhere.visible()
        shipped = ship(elsewhere, lambda folder: _write_square(folder, 4), _files)
        assert shipped.files == {"square4.txt": b"16"} and not shipped.value["files"][0].startswith(out)
        assert not os.path.exists(shipped.value["files"][0])  # the stand-in folder is gone
        assert not os.path.exists(os.path.join(out, "square4.txt"))
        box.receive(shipped)
        assert box.name(shipped.value["files"][0]) == os.path.join(out, "square4.txt")
    assert sorted(os.listdir(out)) == ["square3.txt", "square4.txt"]  # the marker removed
    with open(os.path.join(out, "square4.txt"), encoding="ascii") as handle:
        assert handle.read() == "16"


def test_sink_sees_each_result_as_its_job_finishes():
    seen: list = []
    for ex in (Executor(), Executor(processes=2)):
        seen.clear()
        with ex:
            got = ex.map(square, [Job(i) for i in range(4)], sink=lambda result: seen.append(result[0]) or -result[0])
        assert got == [0, -1, -4, -9] and sorted(seen) == [0, 1, 4, 9]


@pytest.mark.parametrize("name", ["StorageError", "StorageNotFoundError", "StoragePermissionError",
                                  "StorageTransientError", "UnsafePathError", "ConfigError"])
def test_errors_survive_the_pickling_dask_sends_them_back_with(name):
    """A task's error reaches the Dask client pickled through tblib: it must come back as itself
    (ValueError.__new__ refused the errors that are OSErrors too, and the client got a bare
    Exception that the CLI could not report in one line)."""
    import pickle

    import msprobe.errors

    pickling_support = pytest.importorskip("tblib.pickling_support")
    cls = getattr(msprobe.errors, name)
    error = cls("gone")
    pickling_support.install(error)
    got = pickle.loads(pickle.dumps(error))
    assert type(got) is cls and got.args == ("gone",) and str(got) == "gone"
