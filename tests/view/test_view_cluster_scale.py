"""The cluster view at the size of a real run, in a real headless Chromium (Debian's package, driven
by Playwright):

* the 2-rank pipeline of the cluster-fault benchmark (bench/cluster_faults.py ``pp_async``: isend/irecv
  over 2 micro-batches, a NaN injected on rank 1 at step 1, dumped by our dumper over real gloo),
  ``msprobe view FAULT HEALTHY``'s Cluster tab at 1400 x 900: the first screen shows both lane labels,
  the ringed origin and every hop of its path; a run of downstream NaN records is one mark that
  expands into its records;
* a step of 64 ranks x 20,000 records (tests/view/_make_big_cluster.py: most records NaN after a NaN
  that reaches every rank): the page's DOM stays under 20,000 elements at first paint, scrolled to
  the step's end and zoomed out to the whole step (a DOM count, the same on every machine; the
  timings are bench/bench_view.py's).

These tests fail, never skip, when Chromium cannot be installed or started (tests/view/conftest.py).
With MSPROBE_VIEW_SHOTS=1 they write docs/explorer/cluster_pipeline.png and cluster_scale.png."""
from __future__ import annotations

import os
import sys

import pytest

from tests.view.conftest import ROOT, WAIT_MS, LiveServer, shot
from tests.view.conftest import until as _until

pytest.importorskip("torch")
sys.path.insert(0, os.path.join(ROOT, "bench"))

READY = "body[data-ready]"
DOM_LIMIT = 20000


@pytest.fixture(scope="module")
def pp_async(tmp_path_factory) -> tuple:
    """(FAULT, HEALTHY): bench/cluster_faults.py's pp_async/nan_s1_fwd and a healthy run, by our dumper."""
    import cluster_faults as cf

    root = str(tmp_path_factory.mktemp("pp_async"))
    for run in ("nan_s1_fwd", "none"):
        cf.run("pp_async", run, os.path.join(root, run))
    return os.path.join(root, "nan_s1_fwd"), os.path.join(root, "none")


def _inside(inner: dict, outer: dict, slack: float = 1.0) -> bool:
    return (inner["x"] >= outer["x"] - slack and inner["y"] >= outer["y"] - slack
            and inner["x"] + inner["width"] <= outer["x"] + outer["width"] + slack
            and inner["y"] + inner["height"] <= outer["y"] + outer["height"] + slack)


def _window(page) -> dict:
    """The part of the cluster box the lanes show (right of the sticky labels), on the screen."""
    box = page.locator("#cluster-box").bounding_box()
    labels = page.locator("#cluster-labels").bounding_box()
    right = labels["x"] + labels["width"]
    return {"x": right, "y": box["y"], "width": box["x"] + box["width"] - right, "height": min(box["height"], 900 - box["y"])}


def test_pipeline_opens_on_the_labels_the_origin_and_its_whole_path(page, pp_async, tmp_path):
    from msprobe.view import open_view

    fault, healthy = pp_async
    with open_view(fault, healthy, work_dir=str(tmp_path / "w")) as v:
        s = LiveServer(v)
        try:
            page.goto(s.url)
            page.wait_for_selector(READY, state="attached", timeout=WAIT_MS)
            page.locator(".tab[data-view=cluster]").click()
            page.wait_for_selector("#cluster-svg .cl-node.origin")
            page.wait_for_timeout(200)
            box = page.locator("#cluster-box").bounding_box()
            # both lane labels, whole, on the screen and in the box
            for rank_dir in ("rank0", "rank1"):
                label = page.locator(f"#cluster-labels .lane-label[data-rank-dir={rank_dir}]")
                assert label.count() == 1 and label.is_visible()
                assert _inside(label.bounding_box(), box), (rank_dir, label.bounding_box(), box)
                assert rank_dir in label.inner_text()
            # compare's origin (rank 1's injected record) ringed, and every hop of its path drawn,
            # whole, in the window on the lanes
            win = _window(page)
            anomaly = page.locator("#cluster-anomaly").inner_text()
            assert "rank1" in anomaly
            ring = page.locator("#cluster-svg .cl-node.origin .origin-ring")
            assert ring.count() == 1 and _inside(ring.bounding_box(), win), (ring.bounding_box(), win)
            label = page.locator("#cluster-svg .origin-label")
            assert _inside(label.bounding_box(), win), (label.bounding_box(), win)
            hops = page.locator("#cluster-svg .cl-path")
            assert hops.count() >= 1
            for k in range(hops.count()):
                assert _inside(hops.nth(k).bounding_box(), win), (k, hops.nth(k).bounding_box(), win)
            ends = page.locator("#cluster-svg .cl-node.on-path .shape")
            assert ends.count() >= 2
            for k in range(ends.count()):
                assert _inside(ends.nth(k).bounding_box(), win)
            shot(page, "cluster_pipeline")
            # the downstream NaN records: runs, one mark each with its count; a click expands one
            runs = page.locator("#cluster-svg .cl-node.k-run")
            assert runs.count() >= 1
            counts = [int(runs.nth(k).get_attribute("data-count")) for k in range(runs.count())]
            assert all(c >= 2 for c in counts)
            assert page.locator("#cluster-svg .cl-node.k-anomaly.r-nan").count() + sum(counts) > runs.count()
            first = runs.first
            n, i, rank = int(first.get_attribute("data-count")), first.get_attribute("data-i"), first.get_attribute("data-rank")
            first.locator(".shape").click()
            members = page.locator(f"#cluster-svg .cl-node.member[data-rank='{rank}']")
            _until(page, lambda: members.count() == n)
            assert members.first.get_attribute("data-i") == i
            page.locator(f"#cluster-svg .cl-node.k-run[data-rank='{rank}'][data-i='{i}'] .shape").click()
            _until(page, lambda: members.count() == 0)
            assert page.errors == [], page.errors
        finally:
            s.close()


def _scale_report(tmp_path) -> str:
    """A report whose cluster view is the 64 x 20,000 step (the view's real cluster model and page)."""
    from msprobe.view._cluster import MAX_LANES, assemble
    from msprobe.view._data import ROW_FIELDS, json_safe
    from msprobe.view._report import render_report
    from tests.view import _make_big_cluster as big

    cells, rows, read, summary = big.step_model(64, 20000)
    model = assemble(None, 0, cells, rows, read, summary)
    lanes = model.page(0, MAX_LANES)
    assert [lane["records"] for lane in lanes["lanes"]] == [20000] * 64
    assert min(lane["anomalous"] for lane in lanes["lanes"]) > 14000
    entries = [dict(c, rows=0, errors=0, warnings=0, nan_inf=1, masked=0, max_score=0.0, worst_norm_rel=None,
                    first_div_name=None) for c in cells]
    bundle = {"meta": {"title": "64 x 20,000", "target": "big", "bench": None, "has_bench": False, "rows": 0, "mode": None,
                       "cells": [dict(c) for c in cells], "truncated_rows": 0},
              "overview": {"cells": entries, "first_cell": big.BAD_RANK, "origin": None},
              "columns": list(ROW_FIELDS), "rows": {}, "stacks": {}, "stack_texts": [], "trees": {}, "bench_trees": {},
              "threshold": None, "csv_fields": list(ROW_FIELDS), "clusters": {"0": json_safe(lanes)},
              "cluster_of": {str(c["cell"]): "0" for c in cells}}
    out = tmp_path / "scale.html"
    out.write_text(render_report(bundle), encoding="utf-8")
    return str(out)


def _dom(page) -> int:
    return page.evaluate("() => document.getElementsByTagName('*').length")


def test_cluster_dom_at_64_ranks_of_20000_records(page, tmp_path):
    url = f"file://{_scale_report(tmp_path)}#view=cluster&step=0&rank=rank5"
    page.goto(url)
    page.wait_for_selector(READY, state="attached", timeout=WAIT_MS)
    page.wait_for_selector("#cluster-svg .cl-node.origin")
    assert page.locator("#cluster-labels .lane-label").count() == 16
    assert page.locator("#cluster-range").inner_text() == "ranks 0–15 of 64"
    first = _dom(page)
    assert first < DOM_LIMIT, first
    win = _window(page)
    assert _inside(page.locator("#cluster-svg .cl-node.origin .origin-ring").bounding_box(), win)
    shot(page, "cluster_scale")
    # a run of 99 NaN records on rank 0 expands into the 50 it names and a '+49' that opens the
    # rank's NaN/Inf rows in the list
    run = page.locator("#cluster-svg .cl-node.k-run[data-rank='0'][data-count='99']").first
    i = run.get_attribute("data-i")
    run.locator(".shape").click()
    members = page.locator("#cluster-svg .cl-node.member[data-rank='0']")
    _until(page, lambda: members.count() == 50)
    assert members.first.get_attribute("data-i") == i
    more = page.locator("#cluster-svg .run-more[data-rank='0']")
    assert more.count() == 1 and more.text_content().startswith("+49") and more.get_attribute("data-count") == "49"
    assert _dom(page) < DOM_LIMIT
    more.click()
    _until(page, lambda: page.locator(".tab.active").get_attribute("data-view") == "list")
    assert page.locator("select[data-filter=result]").input_value() == "nan_inf"
    assert page.locator("#cell-badge").inner_text().endswith("step 0 · rank0")
    # back: the cluster view (scrolled where the click left it); 'Anomaly & path' brings the origin back
    page.go_back()
    page.wait_for_selector("#view-cluster:not([hidden]) #cluster-svg .cl-node")
    page.locator("#cluster-zoom-path").click()
    page.wait_for_selector("#cluster-svg .cl-node.origin")
    assert _inside(page.locator("#cluster-svg .cl-node.origin .origin-ring").bounding_box(), _window(page))
    # the step's end: painted there (its last all_reduce), the DOM as small
    page.evaluate("() => { const b = document.getElementById('cluster-box'); b.scrollLeft = b.scrollWidth; }")
    last = "Distributed.all_reduce.199.forward"
    page.wait_for_selector(f"#cluster-svg .cl-node[data-record='{last}']")
    assert _dom(page) < DOM_LIMIT
    # the whole step at once, then the next page of lanes
    page.locator("#cluster-zoom-fit").click()
    _until(page, lambda: page.locator("#cluster-svg .cl-node[data-record='Distributed.all_reduce.0.forward']").count() > 0)
    assert _dom(page) < DOM_LIMIT
    page.locator("#cluster-next").click()
    _until(page, lambda: page.locator("#cluster-range").inner_text() == "ranks 16–31 of 64")
    assert _dom(page) < DOM_LIMIT
    assert page.errors == [], page.errors
