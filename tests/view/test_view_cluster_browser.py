"""The cluster view as a person uses it, in a real headless Chromium (Debian's package, driven by
Playwright), live and in the report opened from ``file://``, on the 2-rank pipeline of
tests/view/_make_cluster.py: two lanes, the matched send/recv as arrows and the all_reduce as a bar,
rank 0's masked_fill ringed as the first NaN with its path to rank 1, and a click opening a record.

These tests fail, never skip, when Chromium cannot be installed or started (tests/view/conftest.py).
With MSPROBE_VIEW_SHOTS=1 the live walk writes docs/explorer/cluster.png."""
from __future__ import annotations

from tests.view.conftest import WAIT_MS, LiveServer, shot
from tests.view.conftest import until as _until
from tests.view.test_view_cluster import ORIGIN, cluster_view, pipeline  # noqa: F401 - the fixtures

READY = "body[data-ready]"


def _walk(page, url: str, shots: bool) -> None:
    page.goto(url)
    page.wait_for_selector(READY, state="attached", timeout=WAIT_MS)
    page.locator(".tab[data-view=cluster]").click()
    page.wait_for_selector("#view-cluster:not([hidden]) #cluster-svg")
    # step 0 (its rank 1 receive buffer held a NaN before the receive: that is no anomaly): both
    # ranks as lanes, nothing ringed
    page.select_option("#cluster-step", index=0)
    _until(page, lambda: page.locator("#cluster-step option:checked").inner_text().endswith("step 0")
           and "No anomaly" in page.locator("#cluster-anomaly").inner_text())
    assert page.locator("#cluster-svg .cl-lane").count() == 2
    assert page.locator("#cluster-svg .cl-node.origin").count() == 0
    assert page.locator("#cluster-svg .cl-path").count() == 0
    assert "No anomaly" in page.locator("#cluster-anomaly").inner_text()
    # step 1: both ranks as lanes
    page.select_option("#cluster-step", index=1)
    page.wait_for_selector("#cluster-svg .cl-node.origin")
    lanes = page.locator("#cluster-svg .cl-lane")
    assert lanes.count() == 2
    assert [lanes.nth(k).get_attribute("data-rank-dir") for k in range(2)] == ["rank0", "rank1"]
    # the matched calls: two send -> recv arrows and one all_reduce bar between the lanes
    edges = page.locator("#cluster-svg .cl-edge")
    assert sorted((edges.nth(k).get_attribute("data-from"), edges.nth(k).get_attribute("data-to"))
                  for k in range(edges.count())) == [("0:2", "1:0"), ("1:4", "0:3")]
    assert page.locator("#cluster-svg .cl-coll[data-api=all_reduce]").count() == 1
    # the first NaN is ringed where it is born, its path drawn from rank 0's send to rank 1's recv
    origin = page.locator("#cluster-svg .cl-node.origin")
    assert origin.count() == 1 and origin.get_attribute("data-record") == ORIGIN
    assert origin.get_attribute("data-rank") == "0"
    assert page.locator("#cluster-svg .cl-path[data-from='0:2'][data-to='1:0']").count() == 1
    assert "first NaN" in page.locator("#cluster-anomaly").inner_text()
    assert page.locator("#cluster-path").inner_text().startswith(f"rank 0 {ORIGIN} -> rank 0 Distributed.send")
    if shots:
        shot(page, "cluster")
    # a real click on rank 1's receive opens its record, in its cell
    box = page.locator("#cluster-svg .cl-node[data-rank='1'][data-record='Distributed.recv.0.forward'] .shape")
    xy = box.bounding_box()
    page.mouse.click(xy["x"] + xy["width"] / 2, xy["y"] + xy["height"] / 2)
    page.wait_for_selector("#view-record:not([hidden]) #record-name")
    _until(page, lambda: page.locator("#record-name").inner_text() == "Distributed.recv.0.forward")
    assert page.locator("#cell-badge").inner_text().endswith("step 1 · rank1")
    # back to the cluster: the step of the record's cell, its ringed origin opened by a click
    page.locator(".tab[data-view=cluster]").click()
    assert page.locator("#cluster-step option:checked").inner_text().endswith("step 1")
    page.wait_for_selector("#cluster-svg .cl-node.origin")
    page.locator("#cluster-svg .cl-node.origin .shape").click()
    page.wait_for_selector("#view-record:not([hidden]) #record-name")
    _until(page, lambda: page.locator("#record-name").inner_text() == ORIGIN)
    assert page.locator("#cell-badge").inner_text().endswith("step 1 · rank0")
    assert page.errors == [], page.errors


def test_cluster_view_live(page, cluster_view):  # noqa: F811 - the fixture
    s = LiveServer(cluster_view)
    try:
        _walk(page, s.url, True)
    finally:
        s.close()


def test_cluster_view_in_the_report(page, cluster_view, tmp_path):  # noqa: F811 - the fixture
    from msprobe.view import write_report

    out = write_report(cluster_view, str(tmp_path / "report.html"))
    requests: list = []
    page.on("request", lambda r: requests.append(r.url))
    _walk(page, f"file://{out}", False)
    assert all(u.startswith(("file://", "data:", "blob:")) for u in requests), requests

