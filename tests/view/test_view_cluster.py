"""The cluster view's endpoint (``api/cluster``) and its report data, on a 2-rank pipeline step
(tests/view/_make_cluster.py: rank 0's masked_fill writes a NaN at step 1 that reaches rank 1 through a
send and comes back with the gradient; rank 1's receive buffer holds leftover NaN memory before the
receive at every step)."""
from __future__ import annotations

import os

import pytest

from tests.view._make_cluster import write_pipeline
from tests.view.conftest import TOKEN

ORIGIN = "Tensor.masked_fill.0.forward"


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("cluster_pipeline"))
    write_pipeline(os.path.join(root, "target"))
    write_pipeline(os.path.join(root, "bench"), bench=True)
    return root


@pytest.fixture(scope="session")
def cluster_view(pipeline):
    from msprobe.view import open_view

    v = open_view(os.path.join(pipeline, "target"))
    yield v
    v.close()


@pytest.fixture(scope="module")
def client(cluster_view):
    from starlette.testclient import TestClient

    from msprobe.view import make_app

    with TestClient(make_app(cluster_view, TOKEN), base_url="http://127.0.0.1") as c:
        c.headers["X-Msprobe-Token"] = TOKEN
        yield c


def _cell(view, step: int, rank_dir: str) -> int:
    return next(c["cell"] for c in view.meta()["cells"] if c["step"] == step and c["rank_dir"] == rank_dir)


def _nodes(lane: dict) -> dict:
    return {node["record"]: node for node in lane["nodes"]}


def test_cluster_lanes_edges_and_the_first_nan(client, cluster_view):
    # any cell of the step answers for the whole step
    r = client.get("/api/cluster", params={"cell": _cell(cluster_view, 1, "rank1")})
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["step"] == 1 and got["ranks_total"] == 2
    assert [lane["rank_dir"] for lane in got["lanes"]] == ["rank0", "rank1"]
    rank0, rank1 = (_nodes(lane) for lane in got["lanes"])
    # the matched point-to-point calls: rank 0's send (record 2) -> rank 1's recv (record 0), and back
    assert sorted((tuple(e["from"]), tuple(e["to"])) for e in got["p2p"]) == [((0, 2), (1, 0)), ((1, 4), (0, 3))]
    assert [(c["api"], sorted(map(tuple, c["members"]))) for c in got["collectives"]] == \
        [("all_reduce", [(0, 5), (1, 5)])]
    # communication order: a send comes before its receive, the collective at one level on both ranks
    assert rank0["Distributed.send.0.forward"]["level"] < rank1["Distributed.recv.0.forward"]["level"]
    assert rank1["Distributed.send.0.forward"]["level"] < rank0["Distributed.recv.0.forward"]["level"]
    assert rank0["Distributed.all_reduce.0.forward"]["level"] == rank1["Distributed.all_reduce.0.forward"]["level"]
    # the first NaN is where it is born (rank 0), not where it arrives (rank 1's first record)
    anomaly = got["anomaly"]
    assert (anomaly["rank"], anomaly["record"], anomaly["i"]) == (0, ORIGIN, 1)
    assert anomaly["path"][0]["from_record"] == "Distributed.send.0.forward"
    assert (anomaly["path"][0]["from_i"], anomaly["path"][0]["to_rank"], anomaly["path"][0]["to_i"]) == (2, 1, 0)
    assert anomaly["path_text"].startswith(f"rank 0 {ORIGIN} -> rank 0 Distributed.send.0.forward -> rank 1")
    # a lane holds the communication calls and the anomalous records, with the lane's counts
    assert rank0[ORIGIN]["nan_inf"] and rank0[ORIGIN]["kind"] == "anomaly"
    assert "Functional.linear.0.forward" not in rank0  # healthy, no communication: not drawn
    assert got["lanes"][0]["records"] == 7 and got["lanes"][0]["comm"] == 3
    assert got["summary"][1]["cell"] == _cell(cluster_view, 1, "rank1")


def test_a_receive_buffer_before_the_call_is_no_anomaly(client, cluster_view):
    # step 0 is healthy; rank 1's receive buffer held a NaN before the receive (its rows say so)
    rows = client.get("/api/rows", params={"cell": _cell(cluster_view, 0, "rank1"), "result": "nan_inf"}).json()
    assert [row["name"] for row in rows["rows"]] == ["Distributed.recv.0.forward.input.0"]
    got = client.get("/api/cluster", params={"cell": _cell(cluster_view, 0, "rank0")}).json()
    assert got["anomaly"] is None and got["marks"] == []
    recv = _nodes(got["lanes"][1])["Distributed.recv.0.forward"]
    assert not recv["nan_inf"] and recv["result"] == ""
    assert got["lanes"][1]["anomalous"] == 0


def test_cluster_lanes_are_paged(client, cluster_view):
    cell = _cell(cluster_view, 1, "rank0")
    got = client.get("/api/cluster", params={"cell": cell, "lane_begin": 1, "lane_end": 2}).json()
    assert [lane["rank"] for lane in got["lanes"]] == [1] and (got["lane_begin"], got["lane_end"]) == (1, 2)
    assert len(got["summary"]) == 2 and got["anomaly_lane"] == 0
    assert got["p2p"] == [] and got["collectives"] == []  # their other end is on another page
    assert client.get("/api/cluster", params={"cell": cell, "lane_begin": "x"}).status_code == 400
    assert client.get("/api/cluster", params={"cell": 99}).status_code == 400
    assert client.get("/api/cluster").status_code == 400


def test_a_lane_is_bounded(pipeline, monkeypatch, tmp_path):
    from msprobe.view import _cluster, open_view

    monkeypatch.setattr(_cluster, "MAX_NODES", 2)
    with open_view(os.path.join(pipeline, "target"), work_dir=str(tmp_path / "w")) as v:
        got = v.cluster(_cell(v, 1, "rank1"))
    lane = got["lanes"][1]
    # rank 1's NaN records between its receive and its send are one run (3 records): the first 2
    # nodes and the hops of the anomaly's path stay drawn on a bounded lane, the last add_ is dropped
    assert lane["dropped"] == 1 and lane["anomalous"] == 7
    assert [(node["record"], node.get("count")) for node in lane["nodes"]] == [
        ("Distributed.recv.0.forward", None), ("Functional.linear.0.forward", 3), ("Distributed.send.0.forward", None),
        ("Distributed.all_reduce.0.forward", None)]
    run = lane["nodes"][1]
    assert (run["kind"], run["i"], run["last"], run["last_record"]) == ("run", 1, 3, "Tensor.mean.0.forward")
    assert [m["record"] for m in run["members"]] == ["Functional.linear.0.forward", "Functional.relu.0.forward",
                                                    "Tensor.mean.0.forward"]
    assert {node["record"] for node in got["lanes"][0]["nodes"]} >= {ORIGIN, "Distributed.send.0.forward"}


def test_cluster_of_a_compare_names_its_origin(pipeline, tmp_path):
    from msprobe.view import open_view, write_report
    from msprobe.view._report import report_bundle

    with open_view(os.path.join(pipeline, "target"), os.path.join(pipeline, "bench"),
                   work_dir=str(tmp_path / "w")) as v:
        got = v.cluster(_cell(v, 1, "rank1"))
        assert got["anomaly"]["key"] == "origin" and got["anomaly"]["label"] == "error enters"
        assert (got["anomaly"]["rank"], got["anomaly"]["record"]) == (0, ORIGIN)
        assert got["anomaly"]["path"][0]["to_record"] == "Distributed.recv.0.forward"
        assert v.cluster(_cell(v, 0, "rank0"))["anomaly"] is None
        # the report holds every step's cluster, each cell pointing at its step's
        bundle = report_bundle(v)
        cells = {str(c["cell"]): c for c in v.meta()["cells"]}
        assert set(bundle["cluster_of"]) == set(cells)
        step1 = bundle["clusters"][bundle["cluster_of"][str(_cell(v, 1, "rank0"))]]
        assert len(step1["lanes"]) == 2 and step1["anomaly"]["record"] == ORIGIN
        html = open(write_report(v, str(tmp_path / "r.html")), encoding="utf-8").read()
        assert '"clusters"' in html


def test_cluster_of_a_lake_run(tmp_path):
    from msprobe.view import open_view

    write_pipeline(str(tmp_path / "lake" / "run_a"))
    write_pipeline(str(tmp_path / "lake" / "run_b"), bench=True)
    with open_view(str(tmp_path / "lake"), work_dir=str(tmp_path / "w")) as v:
        cells = {(c["run"], c["step"], c["rank_dir"]): c["cell"] for c in v.meta()["cells"]}
        got = v.cluster(cells[("run_a", 1, "rank1")])
        assert (got["run"], got["step"]) == ("run_a", 1) and [lane["rank"] for lane in got["lanes"]] == [0, 1]
        assert (got["anomaly"]["rank"], got["anomaly"]["record"]) == (0, ORIGIN) and len(got["p2p"]) == 2
        healthy = v.cluster(cells[("run_b", 1, "rank0")])
        assert healthy["run"] == "run_b" and healthy["anomaly"] is None and len(healthy["p2p"]) == 2
