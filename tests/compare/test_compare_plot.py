"""The compare plot: a step x rank heatmap for many rank pairs (worst relative Norm error, pairs
with error rows flagged, the worst rows numbered), a row plot for one pair (error rows marked);
fixed-size PNGs (the committed examples: docs/compare_plot_cluster.png, docs/compare_plot_pair.png,
made by scripts/plot_examples.py)."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from msprobe.compare import compare
from msprobe.compare._plot import DPI, FIGSIZE, cluster_grid

HERE = os.path.dirname(os.path.abspath(__file__))
MS26 = os.path.join(os.path.dirname(HERE), "fixtures", "real", "ms26")
STATS = os.path.join(MS26, "L1_statistics", "step0", "proc11134")
PERT = os.path.join(MS26, "L1_statistics_perturbed", "step0", "proc22962")
PLANTED = ("Torch.matmul.0.forward", "output")


def _png_size(path: str) -> tuple:
    from PIL import Image

    with Image.open(path) as im:
        return im.size


def _cluster(tmp_path, steps=(0, 1), ranks=(0, 1, 2, 10), planted=(1, 2)) -> tuple:
    target, bench = tmp_path / "npu", tmp_path / "gpu"
    for s in steps:
        for r in ranks:
            shutil.copytree(STATS, target / f"step{s}" / f"rank{r}")
            shutil.copytree(PERT, bench / f"step{s}" / f"rank{r}")
    doc_path = bench / f"step{planted[0]}" / f"rank{planted[1]}" / "dump.json"
    doc = json.loads(doc_path.read_text())
    doc["data"][PLANTED[0]][PLANTED[1]][0]["Norm"] *= 50.0
    doc_path.write_text(json.dumps(doc))
    return str(target), str(bench)


def test_cluster_plot_is_a_step_by_rank_heatmap(tmp_path):
    pytest.importorskip("matplotlib")
    target, bench = _cluster(tmp_path)
    s = compare(target, bench, str(tmp_path / "out"), timestamp="t", progress=False)
    assert len(s["pairs"]) == 8 and s["plot"] and os.path.exists(s["plot"])
    assert _png_size(s["plot"]) == (FIGSIZE[0] * DPI, FIGSIZE[1] * DPI)

    res = s["pairs"]
    assert all("worst_rows" in p and "series" not in p for p in res)
    assert s["pairs"][0]["worst_rows"][0]["norm_relative_err"] > 0


def test_cluster_grid(tmp_path):
    import msprobe.readers
    from msprobe.compare._core import compare_pair, pair_sources

    target, bench = _cluster(tmp_path)
    dn, db = msprobe.readers.open(target), msprobe.readers.open(bench)
    results = [compare_pair(a, b, mode="statistics", out_dir=str(tmp_path / "o"), ts="t", multi_step=True)
               for a, b in pair_sources(dn, db)]
    g = cluster_grid(results)
    assert g["steps"] == [0, 1]
    assert g["ranks"] == ["rank0", "rank1", "rank2", "rank10"]  # numeric order, not text order
    assert g["flags"].get((1, 2)) == "error"
    assert all(v != "error" for cell, v in g["flags"].items() if cell != (1, 2))
    best = g["top"][0]
    assert best["cell"] == (1, 2) and best["row"] == f"{PLANTED[0]}.{PLANTED[1]}.0" and best["result"] == "error"
    assert best["norm_relative_err"] == pytest.approx(49 / 50, rel=0.01)  # |n - 50 n| / (50 n)
    worst = g["worst"]
    assert worst[1][2] == max(v for row in worst for v in row if v is not None)
    assert len(g["top"]) <= 10 and [w["norm_relative_err"] for w in g["top"]] == \
        sorted((w["norm_relative_err"] for w in g["top"]), reverse=True)


def test_single_pair_plot_marks_error_rows(tmp_path):
    pytest.importorskip("matplotlib")
    target, bench = _cluster(tmp_path, steps=(0,), ranks=(0,), planted=(0, 0))
    s = compare(target, bench, str(tmp_path / "out"), timestamp="t", progress=False)
    (p,) = s["pairs"]
    assert p["results"].get("error", 0) >= 1
    assert p["worst_rows"][0]["row"] == f"{PLANTED[0]}.{PLANTED[1]}.0"
    assert p["worst_rows"][0]["result"] == "error"
    assert _png_size(s["plot"]) == (FIGSIZE[0] * DPI, FIGSIZE[1] * DPI)


def test_marks_survive_chunks_and_processes(tmp_path, monkeypatch):
    """The forked chunks of one pair give the same worst rows as the serial run."""
    import msprobe.compare._core as core

    monkeypatch.setattr(core, "CHUNK_MIN_RECORDS", 0)
    target, bench = _cluster(tmp_path, steps=(0,), ranks=(0,), planted=(0, 0))
    a = compare(target, bench, str(tmp_path / "a"), plot=False, timestamp="1", progress=False)
    b = compare(target, bench, str(tmp_path / "b"), plot=False, timestamp="1", workers=3, progress=False)
    assert a["pairs"][0]["worst_rows"] == b["pairs"][0]["worst_rows"]


def test_committed_examples_exist():
    docs = os.path.join(os.path.dirname(os.path.dirname(HERE)), "docs")
    for name in ("compare_plot_cluster.png", "compare_plot_pair.png"):
        path = os.path.join(docs, name)
        assert os.path.exists(path), path
        pytest.importorskip("PIL")
        assert _png_size(path) == (FIGSIZE[0] * DPI, FIGSIZE[1] * DPI)
