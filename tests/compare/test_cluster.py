"""Right answers across ranks (issue 38): real 2-rank gloo runs of bench/cluster_faults.py (a 2-stage
pipeline with blocking send/recv into ``torch.empty`` and with isend/irecv over 2 micro-batches,
tensor parallel with all_reduce/all_gather), a known fault at step 1, under our dumper. Compare's
first NaN / first divergence, ``lake nan`` / ``lake diverge`` and ``overflow_check`` name the
injected (step, rank, record) first, and nothing on a healthy step (the small version of
bench/bench_cluster.py)."""
from __future__ import annotations

import os
import shutil
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("duckdb")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench"))

import bench_cluster as B  # noqa: E402
import cluster_faults as cf  # noqa: E402

#: the faults dumped here, and the healthy pair of each layout
FAULTS = ("pp/nan_s1_fwd", "pp/nan_s0_fwd", "pp/scale_s0", "pp_async/nan_s1_fwd", "pp_async/nan_s0_bwd",
          "tp/nan_shard")
TOOLS = ["compare", "compare_origin", "lake", "overflow_check"]


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("cluster"))
    B.dump_all(root, list(FAULTS), ["ours"])
    return os.path.join(root, "ours")


def _answers(dumps: str, layout: str, run: str, place, tmp: str) -> dict:
    base = os.path.join(tmp, "lake")
    if not os.path.isdir(os.path.join(base, layout)):  # a lake of its own per test (its _lake folder)
        shutil.copytree(os.path.join(dumps, layout), os.path.join(base, layout))
    got = B.score_run(base, layout, run, place, TOOLS)
    return {tool: B._verdict(place, ans, os.path.join(base, layout, run)) for tool, ans in got.items()}


@pytest.mark.parametrize("fault", FAULTS)
def test_the_injected_place_is_named_first(dumps, fault, tmp_path):
    place = cf.place(fault)
    got = _answers(dumps, place["layout"], fault.split("/")[1], place, str(tmp_path))
    if place["kind"] == "scale":
        assert "overflow_check" not in got
    missed = {tool: v["named"] for tool, v in got.items() if not v["hit"]}
    assert not missed, f"{fault}: expected {place}, got {missed}"


@pytest.mark.parametrize("layout", sorted({cf.FAULTS[f][0] for f in FAULTS}))
def test_no_answer_on_a_healthy_pair(dumps, layout, tmp_path):
    """Two healthy runs (the receive buffers' leftover memory differs): no first NaN/Inf, no
    divergence, no lake answer, no anomaly in any step."""
    got = _answers(dumps, layout, "none2", None, str(tmp_path))
    assert set(got) == set(TOOLS)
    answered = {tool: v["named"] for tool, v in got.items() if v["healthy_step"]}
    assert not answered, f"{layout}: answers on healthy steps: {answered}"
