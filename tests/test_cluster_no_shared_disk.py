"""compare and the lake over a real Dask cluster that shares no disk with its client.

``dask scheduler`` and two ``dask worker`` processes are started as separate commands; each
worker runs in its own mount namespace (``unshare -m``) with a private tmpfs mounted over the
client's folder, so whatever a worker writes there is lost to the client, as on another machine.
The dumps lie on the tests' S3 server (moto), read by the workers directly. Every file a command
names must exist where it says, with the bytes of a run without the cluster; a local folder the
workers cannot fill is refused, never left empty behind a success.
"""
from __future__ import annotations

import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "lake"))
sys.path.insert(0, os.path.join(HERE, "compare"))
import lake_synth as S  # noqa: E402
from test_compare_dask import DIVERGE, RANKS, _four_ranks  # noqa: E402

from msprobe.cli import main  # noqa: E402
from tests._dask_processes import NoPrivateMount, isolated_cluster, private_mount_prefix  # noqa: E402

pytestmark = pytest.mark.s3

LAKE_STEPS, LAKE_RANKS = S.DIV_STEP + 1, S.DIV_RANK + 1


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(scheduler address, the client's folder the workers cannot see)."""
    client_dir = str(tmp_path_factory.mktemp("client"))
    aside = str(tmp_path_factory.mktemp("cluster"))  # the scheduler file, the workers' own space
    try:
        prefix = private_mount_prefix(client_dir)
    except NoPrivateMount as exc:  # a machine that cannot isolate the workers fails the test, never skips it
        refused = f"{exc}: without it the workers would see the client's folders"
    else:
        refused = ""
    if refused:
        pytest.fail(refused, pytrace=False)
    with isolated_cluster(client_dir, aside, prefix) as address:
        yield address, client_dir


def _upload(store, root: str, prefix: str) -> None:
    """Every file below the folder ``root`` into ``store`` under ``prefix``."""
    for dirpath, _, names in os.walk(root):
        for path in (os.path.join(dirpath, name) for name in names):
            with open(path, "rb") as handle:
                store.put(f"{prefix}/{os.path.relpath(path, root).replace(os.sep, '/')}", handle.read())


def _without_files(answer: dict) -> dict:
    """A diverge answer without the paths of its files (another folder, another timestamp)."""
    answer = json.loads(json.dumps(answer))
    for entry in [answer["first_divergence"], answer["first"], *answer["ranks"]]:
        if entry:
            entry.pop("files", None)
    answer.pop("executor")
    return answer


def _run_json(argv: list, capsys) -> dict:
    capsys.readouterr()
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _named_csvs(paths: list, strip_timestamp: bool = False) -> dict:
    """{file name (without its timestamp): bytes} of the files ``paths``, each checked present."""
    out = {}
    for path in paths:
        assert os.path.isfile(path), f"{path} is named but missing"
        name = os.path.basename(path)
        if strip_timestamp:
            name = name.rsplit("_", 1)[0]
        with open(path, "rb") as handle:
            out[name] = handle.read()
    return out


def test_compare_writes_every_csv_on_the_client(cluster, tmp_path, s3_server, s3_bucket_url, capsys, monkeypatch):
    from msprobe.backends import open_store
    from msprobe.compare import compare
    from tests.conftest_s3 import s3_storage_options

    address, client_dir = cluster
    work = os.path.join(client_dir, "compare")
    os.makedirs(work)
    target, bench = _four_ranks(os.path.join(work, "dumps"))
    opts = s3_storage_options(s3_server, picklable=True)
    store = open_store(s3_bucket_url, opts)
    _upload(store, target, "a/step0")
    _upload(store, bench, "b/step0")
    ref = compare(target, bench, os.path.join(work, "ref"), plot=False, timestamp="T", progress=False)
    monkeypatch.chdir(work)
    got = _run_json(["compare", "-tp", f"{s3_bucket_url}/a/step0", "-gp", f"{s3_bucket_url}/b/step0", "-o", "out",
                     "--scheduler", address, "--storage-options", json.dumps(opts), "--no-plot", "--json"], capsys)
    assert got["backend"] == "dask"
    named = [path for pair in got["pairs"] for path in pair["files"]]
    assert len(named) == RANKS and all(os.path.dirname(path) == "out" for path in named)
    assert os.path.isfile(got["summary_file"])
    # the bytes of an in-process compare of the same dumps (the names differ by their timestamp)
    assert _named_csvs(named, True) == _named_csvs([p["files"][0] for p in ref["pairs"]], True)
    assert sorted(os.listdir("out")) == sorted([os.path.basename(path) for path in named] + ["summary.json"])
    assert (got["first_divergence"]["rank"], got["first_divergence"]["record"]) == DIVERGE
    for key in ("first_divergence", "origin", "first_nan_inf_target"):
        assert got[key] == ref[key]

    # -o on the store: the workers upload their CSVs there
    to_store = _run_json(["compare", "-tp", f"{s3_bucket_url}/a/step0", "-gp", f"{s3_bucket_url}/b/step0", "-o",
                          f"{s3_bucket_url}/out", "--scheduler", address, "--storage-options", json.dumps(opts),
                          "--no-plot", "--json"], capsys)
    stored = {os.path.basename(path).rsplit("_", 1)[0]: store.get(path[len(s3_bucket_url) + 1:])
              for pair in to_store["pairs"] for path in pair["files"]}
    assert stored == _named_csvs(named, True)

    # dumps on this machine's disk, which the workers cannot read: refused, in one line
    capsys.readouterr()
    assert main(["compare", "-tp", target, "-gp", bench, "-o", "out2", "--scheduler", address, "--no-plot"]) == 1
    assert "cannot see it" in capsys.readouterr().err and not os.path.exists("out2")


def test_lake_diverge_and_nan(cluster, tmp_path, s3_server, s3_bucket_url, capsys, monkeypatch):
    from msprobe.backends import open_store
    from tests.conftest_s3 import s3_storage_options

    address, client_dir = cluster
    work = os.path.join(client_dir, "lake")
    local = S.make_lake(os.path.join(work, "dumps"), steps=LAKE_STEPS, ranks=LAKE_RANKS)
    opts = s3_storage_options(s3_server, picklable=True)
    _upload(open_store(s3_bucket_url, opts), local, "lake")
    url = f"{s3_bucket_url}/lake"
    monkeypatch.chdir(work)
    here = ["--no-cluster", "--json"]
    remote = ["--scheduler", address, "--storage-options", json.dumps(opts), "--json"]

    ref = _run_json(["lake", "diverge", local, "run_a", "run_b", "-o", "ref", *here], capsys)
    got = _run_json(["lake", "diverge", url, "run_a", "run_b", "-o", "out", *remote], capsys)
    assert got["executor"] == "client"
    assert (got["first"]["step"], got["first"]["rank"], got["first"]["record"]) == (S.DIV_STEP, S.DIV_RANK,
                                                                                   S.DIV_RECORD)
    named = [path for rank in got["ranks"] for path in rank["files"]]
    assert named and all(os.path.dirname(path) == "out" for path in named)
    # every rank pair's CSV is on the client, with the bytes of the run without the cluster
    listed = sorted(os.path.join("out", name) for name in os.listdir("out"))
    assert set(named) <= set(listed)
    assert _named_csvs(listed, True) == _named_csvs(sorted(os.path.join("ref", n) for n in os.listdir("ref")), True)
    assert len(listed) == LAKE_RANKS * LAKE_STEPS
    assert _without_files(got) == _without_files(ref)

    ref_nan = _run_json(["lake", "nan", local, *here], capsys)
    got_nan = _run_json(["lake", "nan", url, *remote], capsys)
    assert got_nan == ref_nan and got_nan

    # the lake's own files on the client's disk: the workers cannot write them there; refused
    capsys.readouterr()
    assert main(["lake", "nan", url, "--lake-dir", os.path.join(work, "own"), *remote]) == 1
    assert "the lake's folder" in capsys.readouterr().err
    # and so is a root on this machine's disk: the workers would read an empty folder
    assert main(["lake", "nan", local, "--scheduler", address]) == 1
    assert "the lake root" in capsys.readouterr().err
