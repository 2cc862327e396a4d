"""The lake across ranks that communicate: the communication graph tables (``comm_calls``,
``comm_edges``), ``lake nan`` and ``lake diverge`` in the step's happens-before order, on a
2-stage pipeline over 2 ranks (pipeline_synth: a NaN or a x3 born on rank 1 that reaches
rank 0 with the gradient), and on a real 2-rank gloo pipeline under our dumper."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pipeline_synth as P

import msprobe.lake
from msprobe.lake._graph import STATE_KEY
from msprobe.readers.index import StaleIndexWarning

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def pipeline_src(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("pipeline"))
    P.make_run(root, "healthy", None, seed=1)
    P.make_run(root, "nan", "nan", seed=2)
    P.make_run(root, "scaled", "scale", seed=3)
    return root


def _open(root: str, **options):
    return msprobe.lake.open(root, local=False, **options)


def test_first_nan_is_where_it_was_born(pipeline_src, tmp_path):
    root = shutil.copytree(pipeline_src, str(tmp_path / "lake"))
    with _open(root) as lake:
        fn = lake.first_nan()
    rows = fn.to_dict("records")
    # rank 1 holds a NaN in its receive buffer at healthy step 0 (leftover memory): no answer there
    assert [(r["run"], r["step"], r["rank"], r["record"], r["arg_path"]) for r in rows] == [
        ("nan", P.FAULT_STEP, 1, P.FAULT_RECORD, "output.0"),     # born on rank 1 ...
        ("nan", P.FAULT_STEP, 0, P.RECV_RECORD, "output.0"),      # ... reaches rank 0 with the gradient
    ]
    assert [r["origin"] for r in rows] == [True, False]
    assert rows[0]["order"] == [2, 1, P.FAULT_INDEX] and rows[1]["order"] == [4, 0, 2]
    assert rows[0]["path"] == (f"rank 1 {P.FAULT_RECORD} -> rank 1 {P.SEND_RECORD} -> rank 0 {P.RECV_RECORD}")
    assert fn.attrs["paths"]["nan"] == [{"from_rank": 1, "from_record": P.SEND_RECORD, "to_rank": 0,
                                         "to_record": P.RECV_RECORD, "via": "p2p"}]


def test_graph_tables(pipeline_src, tmp_path):
    root = shutil.copytree(pipeline_src, str(tmp_path / "lake"))
    with _open(root) as lake:
        calls = lake.sql("SELECT step, rank, \"index\", record, api, kind, peer, level, buffers, data_nonfinite, "
                         "result_nonfinite, matched FROM comm_calls WHERE run = 'nan' ORDER BY step, level")
        edges = lake.sql("SELECT step, src_rank, src_index, src_record, dst_rank, dst_index, dst_record, kind "
                         "FROM comm_edges WHERE run = 'nan' ORDER BY step, dst_rank")
        assert lake.stats["graphs"] == 9
    step1 = calls[calls["step"] == P.FAULT_STEP].to_dict("records")
    assert [(c["rank"], c["index"], c["api"], c["peer"], c["level"], list(c["buffers"])) for c in step1] == [
        (0, 1, "send", 1, 1, []), (1, 0, "recv", 0, 2, ["input_args.0"]), (1, 6, "send", 0, 3, []),
        (0, 2, "recv", 1, 4, ["input_args.0"])]
    assert [(c["data_nonfinite"], c["result_nonfinite"]) for c in step1] == [
        (False, False), (False, False), (True, False), (False, True)]
    assert all(calls["matched"])
    # the buffer's NaN at step 0 is no data, and no result either
    assert not calls[calls["step"] == 0][["data_nonfinite", "result_nonfinite"]].any().any()
    # one edge per matched send/recv, matching the calls
    for step in range(3):
        got = {tuple(e.values())[1:] for e in edges[edges["step"] == step].to_dict("records")}
        assert got == {(0, 1, P.SEND_RECORD, 1, 0, P.RECV_RECORD, "p2p"), (1, 6, P.SEND_RECORD, 0, 2, P.RECV_RECORD, "p2p")}


def test_graph_follows_the_refresh(pipeline_src, tmp_path):
    root = shutil.copytree(pipeline_src, str(tmp_path / "lake"))
    state_file = os.path.join(root, "_lake", STATE_KEY)
    with _open(root) as lake:
        assert lake.timings["graph_s"] >= 0
    first = json.load(open(state_file))["steps"]
    with _open(root) as lake:  # nothing changed: nothing rebuilt
        assert lake.graphs == first
    shutil.rmtree(os.path.join(root, "nan", "step2"))
    # rank 0 of step 1 re-dumped without its receive: the step's graph is rebuilt (the send from rank 1 unmatched)
    path = os.path.join(root, "nan", "step1", "rank0", "dump.json")
    doc = json.load(open(path))
    del doc["data"][P.RECV_RECORD]
    json.dump(doc, open(path, "w"), indent=1)
    os.utime(path, (1, 1))
    with pytest.warns(StaleIndexWarning), _open(root) as lake:
        assert "comm/run=nan/step=2" not in lake.graphs
        gone = os.path.join(root, "_lake", "comm", "run=nan", "step=2")
        assert not os.path.exists(os.path.join(gone, "calls.parquet")) and not os.path.exists(os.path.join(gone, "edges.parquet"))
        assert lake.graphs["comm/run=nan/step=1"] != first["comm/run=nan/step=1"]
        steps = lake.sql("SELECT DISTINCT step FROM comm_calls WHERE run = 'nan' ORDER BY step")["step"].tolist()
        assert steps == [0, 1]
        n = lake.sql("SELECT count(*) AS n FROM comm_edges WHERE run = 'nan' AND step = 1")["n"][0]
        assert n == 1
        unmatched = lake.sql("SELECT rank, record FROM comm_calls WHERE run = 'nan' AND step = 1 AND NOT matched")
        assert unmatched.to_dict("records") == [{"rank": 1, "record": P.SEND_RECORD}]


def test_diverge_follows_the_pipeline(pipeline_src, tmp_path):
    root = shutil.copytree(pipeline_src, str(tmp_path / "lake"))
    with _open(root) as lake:
        d = lake.diverge("healthy", "scaled")
    first, origin = d["first_divergence"], d["origin"]
    # rank 0's receive (record #2) departs from the bench too (an origin of its rank pair: its data,
    # the buffer before the call, is no data), but after rank 1's record #3 in the step's order
    assert (origin["step"], origin["rank"], origin["record"]) == (P.FAULT_STEP, P.FAULT_RANK, P.FAULT_RECORD)
    assert origin["order"] == [2, 1, P.FAULT_INDEX]
    assert origin["path_text"] == f"rank 1 {P.FAULT_RECORD} -> rank 1 {P.SEND_RECORD} -> rank 0 {P.RECV_RECORD}"
    assert (first["step"], first["rank"], first["record"]) == (P.FAULT_STEP, P.FAULT_RANK, P.FAULT_RECORD)
    assert first["order"] == [2, 1, P.FAULT_INDEX] and first["path"] == origin["path"]
    assert d["steps_compared"] == [0, 1]  # healthy step 0 (its receive buffers differ): no answer


def test_cli_nan(pipeline_src, tmp_path, capsys):
    from msprobe.cli import main

    root = shutil.copytree(pipeline_src, str(tmp_path / "lake"))
    assert main(["lake", "nan", root, "--no-cluster"]) == 0
    out = capsys.readouterr().out
    assert f"origin (nan): step {P.FAULT_STEP} rank1 {P.FAULT_RECORD} output.0 (nan" in out
    assert f"path: rank 1 {P.FAULT_RECORD} -> rank 1 {P.SEND_RECORD} -> rank 0 {P.RECV_RECORD}" in out
    assert main(["lake", "nan", root, "--json", "--no-cluster"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["rank"], r["origin"]) for r in rows] == [(1, True), (0, False)]
    assert main(["lake", "sql", root, "SELECT count(*) AS n FROM comm_edges", "--json", "--no-cluster"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 18}]


def test_gloo_pipeline_nan_born_on_rank1(tmp_path):
    """A real 2-rank gloo pipeline under our dumper: a NaN born in rank 1's stage at step 1 reaches
    rank 0 through the gradient sent back; lake nan names rank 1's birth first."""
    pytest.importorskip("torch")
    root = tmp_path / "lake"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(HERE))]
                                                       + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    proc = subprocess.run([sys.executable, os.path.join(HERE, "_pp_child.py"), str(root / "pp")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with _open(str(root)) as lake:
        rows = lake.first_nan().to_dict("records")
        edges = lake.sql("SELECT count(*) AS n FROM comm_edges WHERE step = 1")["n"][0]
    assert edges == 2
    assert rows[0]["origin"] and (rows[0]["step"], rows[0]["rank"]) == (1, 1)
    assert rows[0]["record"].startswith("Tensor.masked_fill.") and rows[0]["io"] == "output"
    assert [(r["rank"], r["step"]) for r in rows[1:]] == [(0, 1)]
    assert rows[1]["record"].startswith("Distributed.recv.")
    assert "-> rank 0 Distributed.recv." in rows[0]["path"]
