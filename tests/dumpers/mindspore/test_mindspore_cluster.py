"""MindSpore's communication namespace ``mindspore.ops.communication`` (issue 46 item 4; spec/PRODUCER.md
section 20 item 25, FORMAT.md section 25): a 2-worker MindSpore CPU cluster (the mccl backend, a scheduler
and 2 workers on 127.0.0.1, MindSpore in its own venv, ms_venv.py) runs ms_comm_cluster.py under our
dumper with the new namespace and with ``mint.distributed``; a NaN born on rank 1 at step 1 reaches rank 0
through a broadcast. The run written the new way gets its communication records (``Communication.*``,
matched across the ranks as ``MintDistributed.*`` are), and the cluster answers of ours (compare's first
NaN and its origin, ``lake nan``, ``overflow_check``; bench/bench_cluster.py's scoring) name the injected
record, as they do for ``mint.distributed``. Without the communication records rank 0's NaN would come
first. One cluster launch (about 30 s to 90 s on the 2-core machine, most of it MindSpore's start)."""
from __future__ import annotations

import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "bench"))
from ms_common import run_cluster  # noqa: E402
from ms_venv import require_venv  # noqa: E402

pytest.importorskip("duckdb")
pytest.importorskip("pyarrow")

import bench_cluster as B  # noqa: E402

from msprobe.format.comm import calls_in, graph_from_calls  # noqa: E402

PLACE = {"step": 1, "rank": 1, "record": "Mint.mul.0.forward", "kind": "nan"}
TOOLS = ["compare", "compare_origin", "lake", "overflow_check"]
PREFIX = {"ops": "Communication", "mint": "MintDistributed"}


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    py = require_venv()
    out = tmp_path_factory.mktemp("ms_cluster")
    run_cluster(py, os.path.join(HERE, "ms_comm_cluster.py"), [str(out / "dumps")], str(out), timeout=400)
    return str(out / "dumps")


def _data(root: str, step: int, rank: int) -> dict:
    with open(os.path.join(root, f"step{step}", f"rank{rank}", "dump.json"), encoding="utf-8") as f:
        return json.load(f)["data"]


def _edges(root: str, step: int) -> list:
    graph = graph_from_calls({rank: calls_in(_data(root, step, rank), rank) for rank in (0, 1)})
    return sorted((e.src_rank, e.src_index, e.dst_rank, e.dst_index, e.kind) for e in graph.edges())


@pytest.mark.parametrize("namespace", ["ops", "mint"])
def test_the_communication_calls_are_records_of_the_graph(dumps, namespace):
    prefix = PREFIX[namespace]
    for rank in (0, 1):
        data = _data(os.path.join(dumps, namespace, "nan"), 1, rank)
        names = [n for n in data if not n.startswith("Mint.")]
        assert names == [f"{prefix}.broadcast.0.forward", f"{prefix}.all_reduce.0.forward"], names
        bc = data[f"{prefix}.broadcast.0.forward"]  # written in place: the output is the argument after the call
        assert bc["input_args"][1] == {"type": "int", "value": 1}
        assert (bc["output"][0]["Max"] != bc["output"][0]["Max"]) and (
            (bc["input_args"][0]["Max"] != bc["input_args"][0]["Max"]) == (rank == 1))  # NaN from rank 1
    edges = _edges(os.path.join(dumps, namespace, "nan"), 1)
    assert (1, 2, 0, 2, "broadcast") in edges, edges  # rank 1's activations reach rank 0
    assert {(a, b) for a, _, b, _, kind in edges if kind == "all_reduce"} >= {(0, 1), (1, 0)}, edges


def test_both_namespaces_make_the_same_graph(dumps):
    for step in range(3):
        assert _edges(os.path.join(dumps, "ops", "nan"), step) == _edges(os.path.join(dumps, "mint", "nan"), step)


def _answers(dumps: str, namespace: str) -> dict:
    got = B.score_run(dumps, namespace, "nan", PLACE, TOOLS)
    return {tool: B._verdict(PLACE, ans, os.path.join(dumps, namespace, "nan")) for tool, ans in got.items()}


def test_the_cluster_answers_name_the_injected_record(dumps):
    answers = {ns: _answers(dumps, ns) for ns in ("ops", "mint")}
    for ns, got in answers.items():
        assert set(got) == set(TOOLS), got
        missed = {tool: v["named"] for tool, v in got.items() if not v["hit"]}
        assert not missed, f"{ns}: expected {PLACE}, got {missed}"
    assert {t: v["named"] for t, v in answers["ops"].items()} == {t: v["named"] for t, v in answers["mint"].items()}
