"""msprobe compare on a real Dask cluster (LocalCluster, worker processes) and on the S3 server:
rank pairs as Dask tasks that open their dumps from URLs; progress on stderr."""
from __future__ import annotations

import csv
import json
import os
import shutil

import pytest

from msprobe.cli import main
from msprobe.compare import compare

pytest.importorskip("distributed")
HERE = os.path.dirname(os.path.abspath(__file__))
STATS = os.path.join(os.path.dirname(HERE), "fixtures", "real", "ms26", "L1_statistics", "step0")
RANKS = 4
DIVERGE = (2, "Functional.linear.0.forward")  # planted in the target: rank 2, this record


@pytest.fixture(scope="module")
def cluster():
    from distributed import LocalCluster

    c = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    try:
        yield c
    finally:
        c.close()


def _four_ranks(root: str) -> tuple:
    """(target step0, bench step0) of 4 ranks each, made of the real 26.2.0 L1 statistics dump;
    the bench is a copy except a planted divergence in the target's rank 2."""
    (proc,) = os.listdir(STATS)
    with open(os.path.join(STATS, proc, "dump.json"), encoding="utf-8") as f:
        doc = json.load(f)
    out = []
    for side in ("target", "bench"):
        step = os.path.join(root, side, "step0")
        for r in range(RANKS):
            d = os.path.join(step, f"rank{r}")
            shutil.copytree(os.path.join(STATS, proc), d)
            if side == "target" and r == DIVERGE[0]:
                planted = json.loads(json.dumps(doc))
                planted["data"][DIVERGE[1]]["output"][0]["Norm"] *= 1.5
                with open(os.path.join(d, "dump.json"), "w", encoding="utf-8") as f:
                    json.dump(planted, f, indent=1)
        out.append(step)
    return tuple(out)


def _csvs(out: str) -> dict:
    res = {}
    for f in sorted(os.listdir(out)):
        if f.endswith(".csv"):
            with open(os.path.join(out, f), encoding="utf-8") as fh:
                res[f] = list(csv.reader(fh))
    return res


def test_dask_client_matches_in_process(tmp_path, cluster, capsys):
    from distributed import Client

    target, bench = _four_ranks(str(tmp_path))
    ref = compare(target, bench, str(tmp_path / "ref"), plot=False, timestamp="T", progress=False)
    with Client(cluster) as client:
        s = compare(target, bench, str(tmp_path / "dask"), plot=False, timestamp="T", client=client,
                    progress=True)
    err = capsys.readouterr().err
    assert "compare" in err and "4/4" in err and "rank pairs" in err
    assert s["backend"] == "dask" and ref["backend"] == "in-process"
    assert [p["rank_dir"] for p in s["pairs"]] == [f"rank{r}" for r in range(RANKS)]
    assert _csvs(str(tmp_path / "dask")) == _csvs(str(tmp_path / "ref"))
    assert len(_csvs(str(tmp_path / "ref"))) == RANKS
    fd = s["first_divergence"]
    assert (fd["rank"], fd["record"]) == DIVERGE and fd == ref["first_divergence"]
    assert s["pairs"][0]["results"] == ref["pairs"][0]["results"]


def test_cli_scheduler_address(tmp_path, cluster, capsys):
    target, bench = _four_ranks(str(tmp_path))
    out = str(tmp_path / "o")
    assert main(["compare", "-tp", target, "-gp", bench, "-o", out, "--no-plot", "--progress",
                 "--scheduler", cluster.scheduler_address]) == 0
    text = capsys.readouterr()
    assert "(statistics, dask)" in text.out
    assert f"error enters at: {DIVERGE[1]} output.0 (output, 50% off the bench); step 0, rank{DIVERGE[0]}," in text.out
    assert "4/4" in text.err and "rank pairs" in text.err
    assert len(_csvs(out)) == RANKS


@pytest.mark.s3
def test_dask_on_s3_dumps(tmp_path, cluster, s3_server, s3_bucket_url):
    """4-rank dump pair in the S3 server; the workers open it from the URL and write the results
    back to the bucket (no shared file system between client and workers is needed)."""
    from distributed import Client

    from msprobe.backends import open_store
    from tests.conftest_s3 import s3_storage_options

    target, bench = _four_ranks(str(tmp_path))
    opts = s3_storage_options(s3_server, picklable=True)
    store = open_store(s3_bucket_url, opts)
    for side, root in (("t", target), ("b", bench)):
        for dirpath, _, files in os.walk(root):
            for f in files:
                rel = os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/")
                with open(os.path.join(dirpath, f), "rb") as fh:
                    store.put(f"{side}/step0/{rel}", fh.read())
    ref = compare(target, bench, str(tmp_path / "ref"), plot=False, timestamp="T", progress=False)
    out_url = f"{s3_bucket_url}/result"
    with Client(cluster) as client:
        s = compare(f"{s3_bucket_url}/t/step0", f"{s3_bucket_url}/b/step0", out_url, plot=False, timestamp="T",
                    client=client, storage_options=opts, progress=False)
    assert s["summary_file"] == f"{out_url}/summary.json"
    assert all(p["files"][0].startswith(out_url + "/compare_result_rank") for p in s["pairs"])
    res = open_store(out_url, opts)
    got = {}
    for name in sorted(res.list_prefix("")):
        if name.endswith(".csv"):
            got[name] = list(csv.reader(res.get(name).decode().splitlines()))
    assert got == _csvs(str(tmp_path / "ref"))
    assert json.loads(res.get("summary.json"))["first_divergence"]["rank"] == DIVERGE[0]
    assert s["first_divergence"]["row"] == ref["first_divergence"]["row"]


def test_same_rows_in_process_pool_and_threaded_dask_worker(tmp_path):
    """No per-pair state at module level: one Dask worker running 4 compare tasks at once in its
    threads (the ``dask worker`` default), a process pool and the plain loop write the same rows
    (it used to fail with ``KeyError: 'data_n'`` when a thread cleared another's state)."""
    from distributed import Client, LocalCluster

    target, bench = _four_ranks(str(tmp_path))
    ref = compare(target, bench, str(tmp_path / "ref"), plot=False, timestamp="T", progress=False)
    pool = compare(target, bench, str(tmp_path / "pool"), plot=False, timestamp="T", progress=False, workers=4)
    assert pool["backend"] == "processes"
    with LocalCluster(n_workers=1, threads_per_worker=4, processes=True, dashboard_address=":0") as lc, \
            Client(lc) as client:
        for i in range(3):  # several rounds: the four tasks overlap in the worker's threads
            s = compare(target, bench, str(tmp_path / f"dask{i}"), plot=False, timestamp="T", client=client,
                        progress=False)
            assert _csvs(str(tmp_path / f"dask{i}")) == _csvs(str(tmp_path / "ref"))
            assert [p["results"] for p in s["pairs"]] == [p["results"] for p in ref["pairs"]]
    assert _csvs(str(tmp_path / "pool")) == _csvs(str(tmp_path / "ref"))
    assert s["first_divergence"] == ref["first_divergence"] == pool["first_divergence"]
    assert ref["first_divergence"]["rank"] == DIVERGE[0]


def test_concurrent_pairs_in_threads_keep_their_rows(tmp_path):
    """Rank pairs compared at once in the threads of one process (what a multi-threaded Dask
    worker does), with a tiny GIL switch interval so that the threads interleave often: every
    round writes the rows of the plain loop (module-level per-pair state mixed pairs up)."""
    import sys
    from concurrent.futures import ThreadPoolExecutor

    from msprobe.compare._core import PairJob, _pair_task

    target, bench = _four_ranks(str(tmp_path))
    ref = compare(target, bench, str(tmp_path / "ref"), plot=False, timestamp="T", progress=False)
    expected = _csvs(str(tmp_path / "ref"))
    kw = {"mode": "statistics", "ts": "T", "multi_step": False, "xlsx": False, "structural": "auto"}
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with ThreadPoolExecutor(RANKS) as ex:
            for i in range(30):
                out = str(tmp_path / f"t{i}")
                futs = [ex.submit(_pair_task, PairJob(f"{target}/rank{r}", f"{bench}/rank{r}", None, out, kw))
                        for r in range(RANKS)]
                got = [f.result() for f in futs]
                assert _csvs(out) == expected, f"round {i}"
                assert [g["results"] for g in got] == [p["results"] for p in ref["pairs"]]
    finally:
        sys.setswitchinterval(old)
