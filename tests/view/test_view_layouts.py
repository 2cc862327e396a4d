"""``msprobe view --layout`` in a real headless Chromium (Debian's package, driven by Playwright): a
Megatron-style TP=2 x PP=2 run on 4 gloo ranks (tests/compare/_tp_pp_child.py, dumped by our
dumper, rank 3 scaling its shard of layers.2's first weight and shifting its replica of the head's
bias) against the same model on one card, and against a TP=4 run (``--bench-layout tp=4``).

The page shows the merged run as one logical model: one cell (``merged``), the list's rows and the
model tree's nodes in logical names (stage 1's ``layers.0`` is ``layers.2``), and each row and node
naming the ranks that hold it (stage 0's records on ranks 0,1, stage 1's on 2,3), the origin's
record with its suspect rank 3; with a merged bench, the bench's ranks too. Served by ``msprobe
view`` in its own process (the CLI's flags). These tests fail, never skip, when Chromium cannot be
installed or started (tests/view/conftest.py). MSPROBE_VIEW_SHOTS=1 writes docs/explorer/layout.png
(the rows, largest error first) and layout_tree.png."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.compare.test_compare_layouts import _run
from tests.view.conftest import WAIT_MS, shot
from tests.view.conftest import until as _until
from tests.view.test_view_links import _env, _serving, _stop

pytest.importorskip("torch")

ORIGIN = "Functional.linear.4.forward"  # layers.2's first linear: stage 1, ranks 2 and 3; rank 3's shard scaled


@pytest.fixture(scope="module")
def layout_runs(tmp_path_factory) -> Path:
    """single/ (one card), fault/ (TP=2 x PP=2, rank 3's faults) and tp4/ (TP=4), real gloo runs."""
    root = tmp_path_factory.mktemp("view_layouts")
    for name, args in (("single", (1, 1)), ("fault", (2, 2, 3)), ("tp4", (4, 1))):
        _run(root / name, *args)
    return root


def _rows_shown(page) -> dict:
    """{row name: the text of its ranks cell} of the list's rows on screen."""
    return page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('#rows .vrow')].map((r) =>
        [r.dataset.name, (r.querySelector('.vcell.ranks') || {}).textContent]))""")


def _node_ranks(page, box: str, name: str) -> str:
    line = page.locator(f"{box} .tnode[data-name='{name}'] > .tline")
    tag = line.locator(".tag-ranks")
    return tag.inner_text() if tag.count() else ""


def test_merged_tp_pp_run_names_the_ranks_of_each_row_and_node(page, layout_runs, tmp_path):
    env = _env(str(tmp_path / "registry"))
    proc, url = _serving([str(layout_runs / "fault"), str(layout_runs / "single"), "--layout", "tp=2,pp=2",
                          "--work-dir", str(tmp_path / "view")], env)
    try:
        page.goto(url)
        page.wait_for_selector("body[data-ready]", state="attached", timeout=120000)
        assert "target tp=2,pp=2" in page.locator("#layouts").inner_text()
        assert page.locator("#cell-badge").inner_text().endswith("merged")
        page.locator(".tab[data-view=list]").click()
        _until(page, lambda: page.locator("#rows .vrow").count() > 5)
        heads = page.locator("#view-list .vhead .vcell").all_inner_texts()
        assert "ranks" in heads and "bench ranks" not in heads, heads  # the bench is one card
        rows = _rows_shown(page)
        # stage 0's first records are held by ranks 0 and 1 (its tensor-parallel group)
        assert rows and all(text.startswith("0,1") for text in rows.values()), rows
        # the origin's row: stage 1's record, its ranks 2 and 3, rank 3 the suspect
        page.locator("input[data-filter=q]").fill(ORIGIN + ".input.1")
        _until(page, lambda: ORIGIN + ".input.1" in _rows_shown(page))
        assert _rows_shown(page)[ORIGIN + ".input.1"] == "2,3 · suspect 3"
        page.locator(f"#rows .vrow[data-name='{ORIGIN}.input.1']").click()
        _until(page, lambda: page.locator("#record-name").count() == 1 and page.locator("#record-name").inner_text() == ORIGIN)
        assert page.locator("#record-ranks").inner_text() == "held by ranks 2,3 · suspect 3"
        # the model tree: the stages under their logical names, each module naming its ranks
        page.locator(".tab[data-view=tree]").click()
        _until(page, lambda: page.locator("#tree .tnode").count() > 4)
        for layer, ranks in ((0, "0,1"), (1, "0,1"), (2, "2,3"), (3, "2,3")):
            assert _node_ranks(page, "#tree", f"Module.layers.{layer}.MLP.forward.0") == f"ranks {ranks}"
        assert _node_ranks(page, "#tree", "Module.head.Linear.forward.0") == "ranks 2,3 · suspect 3"
        # the bench (one card) holds no ranks
        _until(page, lambda: page.locator("#tree-bench .tnode").count() > 4)
        assert _node_ranks(page, "#tree-bench", "Module.layers.2.MLP.forward.0") == ""
        page.locator("#tree .tnode[data-name='Module.layers.2.MLP.forward.0'] > .tline .toggle").click()
        _until(page, lambda: _node_ranks(page, "#tree", "Module.layers.2.fc1.ColumnParallelLinear.forward.0") == "ranks 2,3 · suspect 3")
        shot(page, "layout_tree")
        page.locator(".tab[data-view=list]").click()
        page.locator("input[data-filter=q]").fill("")
        page.select_option("select[data-filter=sort]", "norm_rel")  # the largest errors first
        _until(page, lambda: page.locator("#rows .vrow").count() > 5)
        shot(page, "layout")
        assert not page.errors, page.errors
    finally:
        _stop(proc)


def test_merged_bench_layout_names_the_bench_ranks(page, layout_runs, tmp_path):
    env = _env(str(tmp_path / "registry"))
    proc, url = _serving([str(layout_runs / "fault"), str(layout_runs / "tp4"), "--layout", "tp=2,pp=2",
                          "--bench-layout", "tp=4", "--work-dir", str(tmp_path / "view")], env)
    try:
        page.goto(url + "#view=list&q=Module.layers.2.MLP.forward.0.input")
        page.wait_for_selector("body[data-ready]", state="attached", timeout=120000)
        assert "bench tp=4" in page.locator("#layouts").inner_text()
        _until(page, lambda: page.locator("#rows .vrow").count() > 0)
        heads = page.locator("#view-list .vhead .vcell").all_inner_texts()
        assert "ranks" in heads and "bench ranks" in heads, heads
        cells = page.evaluate("""() => [...document.querySelectorAll('#rows .vrow')].map((r) =>
            [...r.querySelectorAll('.vcell.ranks')].map((c) => c.textContent))""")
        assert cells and all(target.startswith("2,3") and bench == "0,1,2,3" for target, bench in cells), cells
        page.locator(".tab[data-view=tree]").click()
        _until(page, lambda: page.locator("#tree-bench .tnode").count() > 4)
        assert _node_ranks(page, "#tree-bench", "Module.layers.2.MLP.forward.0") == "ranks 0,1,2,3"
        assert _node_ranks(page, "#tree", "Module.layers.2.MLP.forward.0") == "ranks 2,3"
        assert not page.errors, page.errors
    finally:
        _stop(proc)


def test_the_report_names_the_ranks_too(page, layout_runs, tmp_path):
    from tests.view.test_view_links import _cli

    out = tmp_path / "report.html"
    _cli(["report", str(layout_runs / "fault"), str(layout_runs / "single"), "--layout", "tp=2,pp=2", "-o", str(out)],
         _env(str(tmp_path / "registry")))
    page.goto(out.as_uri() + f"#view=list&q={ORIGIN}.input.1")
    page.wait_for_selector("body[data-ready]", state="attached", timeout=WAIT_MS)
    _until(page, lambda: ORIGIN + ".input.1" in _rows_shown(page))
    assert _rows_shown(page)[ORIGIN + ".input.1"] == "2,3 · suspect 3"
    page.locator(".tab[data-view=tree]").click()
    _until(page, lambda: page.locator("#tree .tnode").count() > 4)
    assert _node_ranks(page, "#tree", "Module.layers.2.MLP.forward.0") == "ranks 2,3"
    assert not page.errors, page.errors
    assert os.path.getsize(out) > 0


def test_a_data_parallel_run_names_the_ranks_of_both_replicas(tmp_path_factory):
    """DP=2 x TP=2 x PP=2 (bench/megatron_layouts.py over real gloo, Megatron's rank order, a NaN
    injected by one rank at step 1) merged with ``--layout tp=2,pp=2,dp=2`` against one card: the
    replicas are joined into one logical model, and the injected record's rows name the ranks of
    both replicas' tensor-parallel groups of its stage, the injecting rank their suspect."""
    import sys

    from msprobe.view import open_view
    from tests.view.conftest import ROOT

    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import bench_layouts as B

    out = str(tmp_path_factory.mktemp("view_dp"))
    single = B.dump_run(out, "single", "healthy", None)
    target_run, bench_run, layout, _ = B.GROUPS["dp"]
    fault = dict(B.variants(target_run))["nan_s1"]
    sidecars = B.dump_run(out, target_run, "nan_s1", fault)
    want = B.truth(sidecars, single, B.run_dir(out, target_run, "nan_s1"))
    with open_view(B.run_dir(out, target_run, "nan_s1"), B.run_dir(out, bench_run, "healthy"), layout=layout,
                   work_dir=str(tmp_path_factory.mktemp("view_dp_w"))) as v:
        assert v.meta()["layouts"] == {"target": layout}
        assert {c["rank_dir"] for c in v.meta()["cells"]} == {"merged"}  # the replicas joined: one model a step
        origin = v.overview()["origin"]
        args = v.record(origin["cell"], origin["record"])["args"]
        for arg in args:
            ranks = {int(rank) for rank in arg["ranks"].split(",")}
            assert set(want["stage_ranks"]) < ranks and len(ranks) == 2 * len(want["stage_ranks"]), (arg, want)
        assert any(arg["suspects"] == str(want["rank"]) for arg in args), (args, want)
