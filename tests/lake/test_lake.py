"""msprobe.lake over a generated lake (3 runs x 4 steps x 8 ranks) in a local directory and in
the local S3 server, with a Dask LocalCluster of 2 workers: every question returns the
planted answer."""
from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")
pytest.importorskip("distributed")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lake_synth as S

import msprobe.lake
from msprobe.errors import ConfigError, StorageError
from msprobe.readers.index import StaleIndexWarning

STEPS, RANKS = 4, 8


@pytest.fixture(scope="module")
def dask_client():
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    client = Client(cluster)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


@pytest.fixture(scope="module")
def lake_src(tmp_path_factory):
    """The dumps only (no _lake/): copied for each test that indexes them."""
    root = str(tmp_path_factory.mktemp("lake_src"))
    return S.make_lake(root, steps=STEPS, ranks=RANKS)


def _copy(src: str, dst: str) -> str:
    shutil.copytree(src, dst)
    return dst


def check_answers(lake, tmp_path, full: bool = True) -> None:
    """Every question, against what lake_synth planted (``full``: the dataset API too)."""
    assert sorted(lake.runs) == list(S.RUNS)
    cat = {r["run"]: r for r in lake.catalog_rows}
    for run in S.RUNS:
        c = cat[run]
        assert (c["steps"], c["ranks"], c["rank_dirs"]) == (STEPS, RANKS, STEPS * RANKS)
        assert (c["framework"], c["task"], c["level"], c["dialect"]) == ("pytorch", "statistics", "mix", "msprobe-26")
        assert c["records"] == STEPS * RANKS * S.LAYERS * 4 and c["bytes"] > 0
        assert c["time_start"] <= c["time_end"]
    assert cat["run_c"]["nan_rows"] > 0 and cat["run_a"]["nan_rows"] == 0

    # SQL over the union, and the dataset
    n = lake.sql("SELECT run, step, rank, count(*) AS n FROM lake GROUP BY ALL")
    assert len(n) == len(S.RUNS) * STEPS * RANKS
    assert n["n"].nunique() == 1
    _questions(lake, tmp_path)
    if not full:
        return
    assert lake.count_rows() == int(n["n"].sum())
    sub = lake.filter(run="run_c", step=[1, 2], rank=3).to_pandas(["run", "step", "rank", "record", "has_nan"])
    assert set(zip(sub["run"], sub["step"], sub["rank"])) == {("run_c", 1, 3), ("run_c", 2, 3)}
    assert lake.to_arrow(["run"]).num_rows == lake.count_rows()
    assert lake.sql("SELECT count(*) AS n FROM catalog")["n"][0] == len(S.RUNS)
    assert lake.diverge("run_a", "run_c", step=0)["first"] is None
    assert lake.disagree(rtol=0.05).empty
    with pytest.raises(ConfigError, match="weight.0"):
        lake.trend(S.TREND_RECORD, arg="nope")


def _questions(lake, tmp_path) -> None:
    # first NaN/Inf per run and rank
    fn = lake.first_nan()
    got = {(r.run, r.rank): (r.step, r.record, r.io, bool(r.has_nan), bool(r.has_inf)) for r in fn.itertuples()}
    assert got == {("run_c", S.NAN_RANK): (S.NAN_STEP, S.NAN_RECORD, "output", True, False),
                   ("run_c", S.INF_RANK): (S.INF_STEP, S.INF_RECORD, "output", False, True)}

    # the first divergence of run_b from run_a, over all ranks (compare, as Dask tasks)
    out = tmp_path / "cmp"
    d = lake.diverge("run_a", "run_b", out=str(out))
    f = d["first"]
    assert (f["step"], f["rank"], f["record"]) == (S.DIV_STEP, S.DIV_RANK, S.DIV_RECORD)
    assert f["row"] == S.DIV_RECORD + ".output.0"
    assert [(r["rank"], r["record"]) for r in d["ranks"]] == [(S.DIV_RANK, S.DIV_RECORD),
                                                               (S.DIV_LATER_RANK, S.DIV_LATER_RECORD)]
    assert d["steps_compared"] == list(range(S.DIV_STEP + 1)) and d["pairs_compared"] == RANKS * (S.DIV_STEP + 1)
    assert d["mode"] == "statistics"
    assert os.path.exists(f["files"][0]) and f["files"][0].startswith(str(out))

    # ranks that disagree on a parameter gradient
    dis = lake.disagree()
    got = {(r.run, r.step, r.record, r.rank) for r in dis.itertuples()}
    assert got == {(run, S.DIS_STEP, S.DIS_RECORD, S.DIS_RANK) for run in ("run_a", "run_b")}
    assert set(dis["arg_path"]) == {"weight.0", "bias.0"} and set(dis["disagreeing"]) == {1}
    assert (dis["rel_diff"] - 0.01).abs().max() < 1e-4

    # a record's statistic over steps
    tr = lake.trend(S.TREND_RECORD, arg="weight.0", run="run_a")
    assert tr.attrs["arg"] == "weight.0" and len(tr) == STEPS * RANKS
    for r in tr.itertuples():
        assert r.value == pytest.approx(S.trend_value(r.step), rel=1e-5)


def test_local_lake_with_local_cluster(lake_src, tmp_path, dask_client):
    root = _copy(lake_src, str(tmp_path / "lake"))
    lake = msprobe.lake.open(root, client=dask_client)
    assert lake.stats["indexed"] == len(S.RUNS) * STEPS * RANKS
    assert lake.stats["executor"] == "client"
    assert lake.stats["compacted"] == len(S.RUNS) * STEPS
    check_answers(lake, tmp_path)
    assert lake.sql_engine == "duckdb-parquet"
    # what the dataset reads: one compacted file per (run, step), pruned by partition keys
    assert len(lake.files()) == len(S.RUNS) * STEPS
    import pyarrow.compute as pc

    frags = list(lake.dataset.get_fragments(filter=pc.field("run") == "run_b"))
    assert len(frags) == STEPS
    # a second open reads the manifest: nothing is rebuilt
    again = msprobe.lake.open(root, client=dask_client)
    assert again.stats["indexed"] == 0 and again.stats["compacted"] == 0
    # the index is the readers' index: msprobe.readers opens it as an index lake
    from msprobe.readers import open as open_dump

    d = open_dump(os.path.join(root, "_lake", "index"))
    assert sorted(d.runs) == list(S.RUNS)
    assert d.find_anomalies().shape[0] == lake.sql("SELECT count(*) AS n FROM lake WHERE has_nan OR has_inf")["n"][0]


def test_s3_lake_with_local_cluster(lake_src, tmp_path, dask_client, s3_server, s3_bucket_url):
    import s3fs

    from tests.conftest_s3 import s3_storage_options

    opts = s3_storage_options(s3_server, picklable=True)  # sent to the Dask workers
    fs = s3fs.S3FileSystem(**opts)
    bucket = s3_bucket_url[len("s3://"):]
    files = {}
    for dirpath, _, names in os.walk(lake_src):
        for name in names:
            rel = os.path.relpath(os.path.join(dirpath, name), lake_src).replace(os.sep, "/")
            with open(os.path.join(dirpath, name), "rb") as f:
                files[f"{bucket}/lake/{rel}"] = f.read()
    fs.pipe(files)  # concurrent PUTs
    url = f"{s3_bucket_url}/lake"
    lake = msprobe.lake.open(url, opts, client=dask_client)
    assert lake.stats["indexed"] == len(S.RUNS) * STEPS * RANKS
    check_answers(lake, tmp_path, full=False)
    # DuckDB reads the Parquet where it lies, through httpfs (the pinned duckdb-extension-httpfs
    # package matches the pinned duckdb); the pyarrow fallback only where no matching binary exists
    from msprobe.backends._duckdb import httpfs_file as _httpfs_file

    want = "duckdb-httpfs" if _httpfs_file(lake.duckdb()) else "pyarrow"
    assert lake.sql_engine == want
    if want == "duckdb-httpfs":  # the same answers through the fallback engine
        con = lake.duckdb()
        n_httpfs = con.sql("SELECT count(*) FROM lake_records").fetchone()[0]
        con.register("fallback_ds", lake.dataset)
        assert con.sql("SELECT count(*) FROM fallback_ds").fetchone()[0] == n_httpfs > 0
    fs.invalidate_cache()
    assert fs.exists(f"{bucket}/lake/_lake/catalog.json") and fs.exists(f"{bucket}/lake/_lake/manifest.parquet")
    runs = msprobe.lake.read_catalog(url, opts)
    assert [r["run"] for r in runs] == list(S.RUNS)


def test_refresh_new_and_removed_rank_dirs(lake_src, tmp_path):
    root = _copy(lake_src, str(tmp_path / "lake"))
    shutil.rmtree(os.path.join(root, "run_b"))
    shutil.rmtree(os.path.join(root, "run_c"))
    lake = msprobe.lake.open(root, local=False)
    assert lake.stats["indexed"] == STEPS * RANKS and lake.stats["executor"] == "in-process"
    # a config.json in the run's directory is the catalog's config, persisted for `lake ls`
    with open(os.path.join(root, "run_a", "config.json"), "w") as f:
        json.dump({"task": "statistics", "level": "mix", "dump_path": "./run_a"}, f)
    lake = msprobe.lake.open(root, local=False)
    assert lake.stats["indexed"] == 0
    assert json.loads(msprobe.lake.read_catalog(root)[0]["config"])["dump_path"] == "./run_a"
    # a new step arrives; a rank directory goes away
    S._rank(os.path.join(root, "run_a", f"step{STEPS}", "rank0"), "run_a", STEPS, 0)
    shutil.rmtree(os.path.join(root, "run_a", "step0", "rank7"))
    lake = msprobe.lake.open(root, local=False)
    assert (lake.stats["indexed"], lake.stats["removed"]) == (1, 1)
    assert lake.catalog_rows[0]["steps"] == STEPS + 1 and lake.catalog_rows[0]["rank_dirs"] == STEPS * RANKS
    n = lake.sql("SELECT step, count(DISTINCT rank) AS r FROM lake GROUP BY step ORDER BY step")
    assert n["r"].tolist() == [RANKS - 1] + [RANKS] * (STEPS - 1) + [1]
    assert not os.path.exists(os.path.join(root, "_lake", "index", "run=run_a", "step=0", "rank=7", "records.parquet"))
    # a changed document is re-indexed with refresh="check" only
    path = os.path.join(root, "run_a", "step1", "rank2", "dump.json")
    doc = json.load(open(path))
    doc["data"]["Functional.extra.0.forward"] = {"input_args": [], "input_kwargs": {}, "output": []}
    with open(path, "w") as f:
        json.dump(doc, f)
    with pytest.warns(StaleIndexWarning, match="1 rank dir"):
        lake = msprobe.lake.open(root, local=False)  # the default refresh sees it: another size
    assert (lake.stats["indexed"], lake.stats["stale"]) == (1, 1)
    assert msprobe.lake.open(root, local=False, refresh="check").stats["indexed"] == 0
    assert lake.sql("SELECT count(*) AS n FROM lake_records WHERE record = 'Functional.extra.0.forward'")["n"][0] == 1
    # a lost manifest is rebuilt from the index files' metadata, nothing re-indexed
    os.remove(os.path.join(root, "_lake", "manifest.parquet"))
    lake = msprobe.lake.open(root, local=False)
    assert lake.stats["indexed"] == 0 and lake.stats["recovered"] == STEPS * RANKS
    assert lake.count_rows() > 0
    # a whole step goes away: its rank indexes and its compacted file too
    compact = os.path.join(root, "_lake", "index", "run=run_a", "step=3", "_compact.parquet")
    assert os.path.exists(compact)
    shutil.rmtree(os.path.join(root, "run_a", "step3"))
    lake = msprobe.lake.open(root, local=False)
    assert lake.stats["removed"] == RANKS and not os.path.exists(compact)
    assert 3 not in set(lake.sql("SELECT DISTINCT step FROM lake")["step"])


def test_default_local_cluster_for_big_jobs(lake_src, tmp_path):
    root = _copy(lake_src, str(tmp_path / "lake"))
    shutil.rmtree(os.path.join(root, "run_b"))
    shutil.rmtree(os.path.join(root, "run_c"))
    # 32 rank dirs in tasks of 2: at least LOCAL_CLUSTER_MIN_TASKS tasks start a LocalCluster
    lake = msprobe.lake.open(root, batch=2, workers=1)
    assert lake.stats["executor"] == "local-cluster" and lake.stats["indexed"] == STEPS * RANKS
    assert lake.runner._cluster is None  # closed after the job
    assert lake.first_nan().empty


def test_cli(lake_src, tmp_path, capsys):
    from msprobe.cli import main

    root = _copy(lake_src, str(tmp_path / "lake"))
    assert main(["lake", "index", root, "--no-cluster"]) == 0
    assert "96 rank dir(s): indexed 96" in capsys.readouterr().out
    assert main(["lake", "ls", root, "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert [r["run"] for r in runs] == list(S.RUNS) and runs[0]["ranks"] == RANKS
    assert main(["lake", "ls", root]) == 0
    out = capsys.readouterr().out
    assert "run_c" in out and "msprobe-26" in out
    assert main(["lake", "nan", root, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {(r["run"], r["rank"], r["record"]) for r in rows} == {("run_c", S.NAN_RANK, S.NAN_RECORD),
                                                                   ("run_c", S.INF_RANK, S.INF_RECORD)}
    assert main(["lake", "diverge", root, "run_a", "run_b", "--no-cluster"]) == 0
    out = capsys.readouterr().out
    assert f"first divergence: step {S.DIV_STEP} rank{S.DIV_RANK} record {S.DIV_RECORD}" in out
    assert main(["lake", "disagree", root, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {(r["run"], r["rank"]) for r in rows} == {("run_a", S.DIS_RANK), ("run_b", S.DIS_RANK)}
    png = tmp_path / "trend.png"
    assert main(["lake", "trend", root, S.TREND_RECORD, "--arg", "weight.0", "--plot", str(png), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert len(res["rows"]) == len(S.RUNS) * STEPS * RANKS
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert res["plot"] is None and "pip install matplotlib" in res["plot_note"]
    else:
        assert res["plot"] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["lake", "sql", root, "SELECT run, count(*) AS n FROM lake GROUP BY run ORDER BY run", "--json"]) == 0
    assert [r["run"] for r in json.loads(capsys.readouterr().out)] == list(S.RUNS)
    assert main(["lake", "sql", root, "SELECT nope FROM lake"]) == 1
    assert "SQL error" in capsys.readouterr().err


def test_errors(lake_src, tmp_path, capsys):
    root = _copy(lake_src, str(tmp_path / "lake"))
    shutil.rmtree(os.path.join(root, "run_b"))
    shutil.rmtree(os.path.join(root, "run_c"))
    with pytest.raises(ConfigError, match="refresh"):
        msprobe.lake.open(root, refresh="sometimes")
    lake = msprobe.lake.open(root, local=False)
    with pytest.raises(ConfigError, match="no run 'nope'"):
        lake.diverge("run_a", "nope")
    with pytest.raises(ConfigError, match="stat"):
        lake.disagree(stat="median")
    with pytest.raises(ConfigError, match="unknown column"):
        lake.filter(colour="red")
    with pytest.raises(ConfigError, match="no record"):
        lake.trend("Nothing.like.this")
    empty = tmp_path / "empty"
    empty.mkdir()
    e = msprobe.lake.open(str(empty), local=False)
    assert e.runs == [] and e.count_rows() == 0 and e.first_nan().empty
    assert msprobe.lake.read_catalog(str(tmp_path / "nowhere")) is None
    # index files that went away under an open lake: one typed line, whichever engine reads
    shutil.rmtree(os.path.join(root, "_lake", "index"))
    with pytest.raises(StorageError, match="cannot read the lake's index files"):
        msprobe.lake.open(root, local=False, refresh="none").sql("SELECT count(*) FROM lake")
    with pytest.raises(StorageError, match="SQL over .*No such file"):
        msprobe.lake.open(root, local=False, refresh="none").filter(run="run_a").sql("SELECT count(*) FROM lake")
    from msprobe.cli import main

    assert main(["lake", "sql", root, "SELECT count(*) FROM lake", "--refresh", "none", "--json"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("msprobe lake: error: "), err
    assert msprobe.lake.open(root, local=False).stats["indexed"] == STEPS * RANKS  # reopening rebuilds them


@pytest.mark.s3
def test_s3_sql_with_environment_only(tmp_path, s3_server, s3_bucket_url, monkeypatch, capsys):
    """`msprobe lake sql s3://...` with no --storage-options: the endpoint (AWS_ENDPOINT_URL) and
    the credentials come from the environment, for the listings (s3fs) and for DuckDB alike."""
    import s3fs

    from msprobe.backends._duckdb import httpfs_file as _httpfs_file
    from msprobe.backends._duckdb import s3_settings
    from msprobe.cli import main
    from tests.conftest_s3 import s3_storage_options

    src = S.make_lake(str(tmp_path / "src"), steps=1, ranks=2)
    fs = s3fs.S3FileSystem(**s3_storage_options(s3_server))
    bucket = s3_bucket_url[len("s3://"):]
    fs.put(src.rstrip("/") + "/", f"{bucket}/lake/", recursive=True)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "env-key-4711")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret-4711")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_SECURITY_TOKEN", raising=False)
    url = f"{s3_bucket_url}/lake"
    q = "SELECT run, count(DISTINCT rank) AS ranks, count(*) AS n FROM lake GROUP BY run ORDER BY run"
    assert main(["lake", "sql", url, q, "--json", "--no-cluster"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["run"], r["ranks"]) for r in rows] == [(run, 2) for run in S.RUNS]
    assert all(r["n"] == rows[0]["n"] > 0 for r in rows)

    lake = msprobe.lake.open(url, local=False)
    st = s3_settings(lake.store)
    assert (st["endpoint"], st["key"], st["secret"], st["token"]) == (s3_server, "env-key-4711", "env-secret-4711",
                                                                      None)
    con = lake.duckdb()
    if _httpfs_file(con) is not None:  # the pinned httpfs binary: DuckDB itself reads the bucket
        assert lake.sql_engine == "duckdb-httpfs"
        secret = con.sql("SELECT secret_string FROM duckdb_secrets() WHERE name = 'msprobe_lake_s3'").fetchone()[0]
        assert "env-key-4711" in secret and "127.0.0.1" in secret
    assert lake.sql("SELECT count(*) AS n FROM lake")["n"][0] == sum(r["n"] for r in rows)
    lake.close()

    # a re-dump of one rank into the same keys: its index is stale (another size and time), the
    # default refresh re-indexes it (one recursive listing per statistics step), `lake nan` finds it
    key = f"{bucket}/lake/run_a/step0/rank1/dump.json"
    doc = json.loads(fs.cat(key))
    name = next(n for n, r in doc["data"].items() if r.get("output"))
    doc["data"][name]["output"][0]["Max"] = float("nan")
    fs.pipe(key, json.dumps(doc).encode())
    with pytest.warns(StaleIndexWarning, match="1 rank dir"):
        assert main(["lake", "nan", url, "--json", "--no-cluster"]) == 0
    assert [(r["run"], r["rank"], r["record"]) for r in json.loads(capsys.readouterr().out)] == [("run_a", 1, name)]

    # what DuckDB cannot read is one typed line, no traceback
    bad = f"SELECT * FROM read_parquet('{s3_bucket_url}/nothing/here.parquet')"
    assert main(["lake", "sql", url, bad, "--no-cluster"]) == 1
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("lake: ")]
    assert len(err) == 1 and err[0].startswith("msprobe lake: error: SQL over ") and "404" in err[0], err


def test_redump_into_the_same_path(tmp_path, capsys):
    """A run re-dumped into the same path by our PrecisionDebugger: the lake's index of the
    first dump no longer covers the documents; the default refresh re-indexes them, so
    `lake nan` finds the NaN of the second dump. refresh='none' leaves the stale ranks out."""
    pytest.importorskip("torch")
    from readers_synth import debugger_dump

    from msprobe.cli import main

    root = tmp_path / "lake"
    debugger_dump(root / "run_x", layers=2)
    debugger_dump(root / "run_y", layers=2)
    assert main(["lake", "nan", str(root), "--json", "--no-cluster"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    before = msprobe.lake.open(str(root), local=False).catalog_rows[0]["records"]
    debugger_dump(root / "run_x", layers=5, nan=True)
    with pytest.warns(StaleIndexWarning, match="left out"):
        lake = msprobe.lake.open(str(root), local=False, refresh="none")
    assert lake.runs == ["run_x", "run_y"] and lake.stats["stale"] == 1
    assert set(lake.sql("SELECT DISTINCT run FROM lake")["run"]) == {"run_y"}  # nothing stale answers
    with pytest.warns(StaleIndexWarning, match="re-indexing"):
        assert main(["lake", "nan", str(root), "--json", "--no-cluster"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["run"], r["record"], bool(r["has_nan"])) for r in rows] == [
        ("run_x", "Functional.linear.4.forward", True)]
    lake = msprobe.lake.open(str(root), local=False)
    assert lake.stats["stale"] == 0 and lake.catalog_rows[0]["records"] > before
    doc = json.loads((root / "run_x" / "step0" / "rank" / "dump.json").read_text())
    assert lake.catalog_rows[0]["records"] == len(doc["data"])


import contextlib  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402


@contextlib.contextmanager
def _read_only(path: str):
    """``path`` made really read-only: its mode bits for a non-root user; as root (who ignores
    them) a read-only bind mount of the directory onto itself. Skipped only where neither can
    be done."""
    if os.geteuid() != 0:
        modes = {}
        for dirpath, dirs, files in os.walk(path):
            for n in [dirpath] + [os.path.join(dirpath, f) for f in files]:
                modes[n] = os.stat(n).st_mode
                os.chmod(n, modes[n] & ~0o222)
        try:
            yield
        finally:
            for n, m in modes.items():
                os.chmod(n, m)
        return
    r = subprocess.run(["mount", "--bind", path, path], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot bind-mount a read-only directory here: {r.stderr.strip()}")
    try:
        r = subprocess.run(["mount", "-o", "remount,bind,ro", path], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot remount read-only here: {r.stderr.strip()}")
        yield
    finally:
        subprocess.run(["umount", path], check=True)


def test_read_only_root(tmp_path, monkeypatch, capsys):
    """`msprobe lake ls DIR` on a read-only directory writes nothing there: the lake's files go
    to --lake-dir / lake_dir=, else to the cache directory (said on stderr); every question
    still answers."""
    from msprobe.cli import main

    root = S.make_lake(str(tmp_path / "share"), steps=2, ranks=4)
    cache = tmp_path / "cache"
    monkeypatch.setenv("MSPROBE_LAKE_CACHE", str(cache))
    before = sorted(os.listdir(root))
    with _read_only(root):
        with pytest.raises(OSError):
            open(os.path.join(root, "probe"), "w").close()
        assert main(["lake", "ls", root, "--no-cluster"]) == 0
        out, err = capsys.readouterr()
        assert "run_c" in out and "cannot be written" in err and str(cache) in err
        assert sorted(os.listdir(root)) == before  # no _lake/ in the share
        assert main(["lake", "nan", root, "--json", "--no-cluster"]) == 0
        out, err = capsys.readouterr()
        assert {(r["run"], r["rank"], r["record"]) for r in json.loads(out)} == {("run_c", S.NAN_RANK, S.NAN_RECORD)}
        assert str(cache) in err  # said with --json too (on stderr)
        lake = msprobe.lake.open(root, local=False)
        assert lake.stats["indexed"] == 0 and lake.lake_url.startswith("file://" + str(cache))
        assert lake.lake_note and lake.count_rows() > 0
        # where the user says
        mine = tmp_path / "mine"
        assert main(["lake", "sql", root, "SELECT count(DISTINCT rank) AS n FROM lake", "--lake-dir", str(mine),
                     "--json", "--no-cluster"]) == 0
        assert json.loads(capsys.readouterr().out) == [{"n": 4}]
        assert (mine / "manifest.parquet").exists() and (mine / "catalog.json").exists()
        api = msprobe.lake.open(root, local=False, lake_dir=str(tmp_path / "api"))
        assert api.lake_note is None and (tmp_path / "api" / "index").is_dir()
        assert sorted(api.runs) == list(S.RUNS)
        assert [r["run"] for r in msprobe.lake.read_catalog(root)] == list(S.RUNS)  # from the cache
        assert sorted(os.listdir(root)) == before
    # a writable root keeps its lake under ROOT/_lake, said nowhere
    shutil.rmtree(cache)
    lake = msprobe.lake.open(root, local=False)
    assert lake.lake_note is None and os.path.isfile(os.path.join(root, "_lake", "manifest.parquet"))
    assert not [n for n in os.listdir(os.path.join(root, "_lake")) if n.startswith(".msprobe-probe")]
    # that lake on a share made read-only afterwards: read as it is, nothing rebuilt, no cache
    with _read_only(root):
        lake = msprobe.lake.open(root, local=False)
        assert lake.stats["indexed"] == 0 and lake.lake_url == "file://" + os.path.join(root, "_lake")
        assert "reading its lake" in lake.lake_note and not cache.exists()
        assert {(r.run, r.rank) for r in lake.first_nan().itertuples()} == {("run_c", S.NAN_RANK)}
        # ... until something needs indexing: refresh="all" builds in the cache instead
        lake = msprobe.lake.open(root, local=False, refresh="all")
        assert lake.lake_url.startswith("file://" + str(cache)) and lake.stats["indexed"] == 2 * 4 * len(S.RUNS)


@pytest.mark.s3
def test_read_only_bucket(tmp_path, s3_server, s3_bucket_url, s3_fault_proxy, monkeypatch):
    """A bucket that refuses every PUT (403 AccessDenied from a proxy in front of the real
    server): the lake reads it and writes its own files elsewhere."""
    import s3fs

    from tests.conftest_s3 import s3_storage_options

    src = S.make_lake(str(tmp_path / "src"), steps=1, ranks=2)
    fs = s3fs.S3FileSystem(**s3_storage_options(s3_server))
    bucket = s3_bucket_url[len("s3://"):]
    fs.put(src.rstrip("/") + "/", f"{bucket}/lake/", recursive=True)
    s3_fault_proxy.deny = re.compile(".")  # every PUT/POST: 403 AccessDenied
    ro = s3_storage_options(s3_fault_proxy.endpoint, config_kwargs={"retries": {"max_attempts": 1}})
    monkeypatch.setenv("MSPROBE_LAKE_CACHE", str(tmp_path / "cache"))
    url = f"{s3_bucket_url}/lake"
    lake = msprobe.lake.open(url, ro, local=False)
    assert "cannot be written" in lake.lake_note and "denied" in lake.lake_note.lower(), lake.lake_note
    assert lake.lake_url.startswith("file://" + str(tmp_path / "cache"))
    assert lake.stats["indexed"] == 2 * len(S.RUNS) and s3_fault_proxy.counts["deny"] >= 1
    assert lake.sql("SELECT count(DISTINCT run) AS n FROM lake")["n"][0] == len(S.RUNS)
    fs.invalidate_cache()
    assert not fs.exists(f"{bucket}/lake/_lake")
    # --lake-dir in another, writable bucket (the real server, not the proxy)
    other = f"s3://{bucket}-lake"
    fs.mkdir(other[len("s3://"):])
    lake = msprobe.lake.open(url, ro, local=False, lake_dir=f"{other}/idx",
                             lake_storage_options=s3_storage_options(s3_server))
    assert lake.lake_note is None and lake.stats["indexed"] == 2 * len(S.RUNS)
    fs.invalidate_cache()
    assert fs.exists(f"{other[len('s3://'):]}/idx/manifest.parquet")
    assert lake.sql("SELECT count(*) AS n FROM lake")["n"][0] > 0


def test_disagree_on_a_healthy_ddp_run(tmp_path, capsys):
    """A real 4-process gloo DistributedDataParallel run dumped by our PrecisionDebugger: its
    parameters_grad records are each rank's local gradient (recorded before the all-reduce),
    so no two ranks agree and no rank is to blame; `lake disagree` says so and flags nothing.
    (A rank that differs from what the others agree on is still flagged: check_answers.)"""
    pytest.importorskip("torch")
    import socket

    from msprobe.cli import main

    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    root = tmp_path / "lake"
    child = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_ddp_child.py")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    procs = [subprocess.Popen([sys.executable, child, str(root / "ddp"), "2"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, RANK=str(r), WORLD_SIZE="4", MASTER_PORT=str(port),
                                       MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1", PYTHONPATH=repo))
             for r in range(4)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [e[-2000:] for _, e in outs]
    params = {o.split("PARAMS ", 1)[1].split()[0] for o, _ in outs}
    assert len(params) == 1  # DDP kept the parameters equal on every rank: a healthy run

    lake = msprobe.lake.open(str(root), local=False)
    assert (lake.catalog_rows[0]["steps"], lake.catalog_rows[0]["ranks"]) == (2, 4)
    grads = lake.sql("SELECT step, record, arg_path, count(DISTINCT rank) AS ranks, count(DISTINCT norm) AS values "
                     "FROM lake WHERE kind = 'parameters_grad' GROUP BY ALL")
    assert len(grads) == 2 * 4 and set(grads["ranks"]) == {4}  # 2 steps x (2 Linear x weight, bias)
    assert set(grads["values"]) == {4}  # the local gradients: every rank its own

    dis = lake.disagree()
    assert dis.empty  # it used to flag every one of the 32 gradient rows
    assert (dis.attrs["no_consensus_groups"], dis.attrs["no_consensus_rows"]) == (8, 32)
    assert "before the data-parallel all-reduce" in dis.attrs["note"]
    labelled = lake.disagree(no_consensus=True)
    assert len(labelled) == 32 and not labelled["consensus"].any()
    assert main(["lake", "disagree", str(root), "--no-cluster"]) == 0
    out = capsys.readouterr().out
    assert "no rank disagrees" in out and "before the data-parallel all-reduce" in out


def test_diverge_goes_on_past_a_step_whose_divergence_has_no_origin(tmp_path):
    """A step whose Result column flags a row that no origin explains (26.2.0's 10x rule: an output's
    Norm 5e-5 off over an input's 1e-7, above float32's round-off floor and below the origin's 1e-4)
    has no record where an error enters: the search for the origin goes on to the next step and
    finds the NaN written there (it stopped at step 0 with no origin before), while the first
    divergence stays the earliest step's. At round-off (the output 3e-6 off, the ratio of a
    context-parallel attention's recomputed gradient) the row keeps its warning but is no first
    divergence (it was before the round-off floor): there is none (the NaN is run_c's, the bench of
    ``diverge("run_a", "run_c")``, and 26.2.0's NaN rule flags a target's NaN only), and the origin
    is the NaN's all the same."""
    for output_off, first_step in ((5e-5, 0), (3e-6, None)):
        root = S.make_lake(str(tmp_path / f"lake{first_step}"), runs=("run_a", "run_c"), steps=2, ranks=4)
        path = tmp_path / f"lake{first_step}" / "run_c" / "step0" / "rank0" / "dump.json"
        doc = json.loads(path.read_text())
        record = doc["data"]["Functional.gelu.2.forward"]
        record["input_args"][0]["Norm"] *= 1 + 1e-7
        record["output"][0]["Norm"] *= 1 + output_off
        path.write_text(json.dumps(doc))
        answer = msprobe.lake.open(root).diverge("run_a", "run_c")
        first = answer["first_divergence"]
        if first_step == 0:
            assert (first["step"], first["record"], first["result"]) == (0, "Functional.gelu.2.forward", "warning")
        else:
            assert first is None and answer["ranks"] == [], first
        origin = answer["origin"]
        assert origin is not None, answer["steps_compared"]
        assert (origin["step"], origin["rank"], origin["record"]) == (S.NAN_STEP, S.NAN_RANK, S.NAN_RECORD)
        assert answer["steps_compared"] == [0, 1] and all(r["step"] == first_step for r in answer["ranks"])
