"""Links to a view (issue 49 item 2), in a real headless Chromium, live and in the report opened from
``file://``, on the 2-rank pipeline of tests/view/_make_cluster.py: the URL's fragment names the tab,
the cell (run, step, rank), the record, the cluster's page of lanes and the list's filters; opening
a URL gives the same view; back and forward walk the views a person opened; the access token is out
of the URL once the page has it.

These tests fail, never skip, when Chromium cannot be installed or started (tests/view/conftest.py)."""
from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

from tests.view.conftest import LiveServer
from tests.view.test_view_cluster import cluster_view, pipeline  # noqa: F401 - the fixtures

READY = "body[data-ready]"
RECV = "Distributed.recv.0.forward"


def _until(page, check, timeout_ms: int = 20000) -> None:
    for _ in range(timeout_ms // 50):
        if check():
            return
        page.wait_for_timeout(50)
    assert check()


def _link(page) -> dict:
    return {k: v[0] for k, v in parse_qs(urlsplit(page.url).fragment).items()}


def _active(page) -> str:
    return page.locator(".tab.active").get_attribute("data-view")


def _open(page, url: str) -> None:
    """A fresh load of ``url`` (never a same-page move to its fragment)."""
    page.goto("about:blank")
    page.goto(url)
    page.wait_for_selector(READY, state="attached", timeout=30000)


def _walk(page, base: str) -> None:
    # a link to step 1's cluster view, rank 1's cell: that view, that cell
    _open(page, base + "#view=cluster&step=1&rank=rank1")
    page.wait_for_selector("#view-cluster:not([hidden]) #cluster-svg .cl-node.origin")
    assert _active(page) == "cluster"
    assert page.locator("#cluster-step option:checked").inner_text().endswith("step 1")
    assert page.locator("#cell-badge").inner_text().endswith("step 1 · rank1")
    assert "token" not in page.url
    # a click on rank 1's receive: the record view, its link in the URL
    page.locator(f"#cluster-svg .cl-node[data-rank='1'][data-record='{RECV}'] .shape").click()
    _until(page, lambda: _active(page) == "record" and page.locator("#record-name").inner_text() == RECV)
    assert {k: _link(page).get(k) for k in ("view", "step", "rank", "record")} == \
        {"view": "record", "step": "1", "rank": "rank1", "record": RECV}
    record_url = page.url
    # back: the cluster view again; forward: the record again
    page.go_back()
    _until(page, lambda: _active(page) == "cluster" and _link(page).get("view") == "cluster")
    assert page.locator("#cluster-step option:checked").inner_text().endswith("step 1")
    page.go_forward()
    _until(page, lambda: _active(page) == "record" and page.locator("#record-name").inner_text() == RECV)
    # the list of rank 0's step-1 cell, its NaN/Inf rows only, by a link; a filter changed is a
    # new entry, back restores the previous filter
    _open(page, base + "#view=list&step=1&rank=rank0&result=nan_inf")
    _until(page, lambda: _active(page) == "list" and page.locator("#rows .vrow").count() > 0)
    assert page.locator("select[data-filter=result]").input_value() == "nan_inf"
    assert page.locator("#cell-badge").inner_text().endswith("step 1 · rank0")
    nan_rows = page.locator("#row-count").inner_text()
    page.select_option("select[data-filter=dir]", "backward")
    _until(page, lambda: _link(page).get("dir") == "backward")
    assert _link(page).get("result") == "nan_inf"
    page.go_back()
    _until(page, lambda: "dir" not in _link(page) and page.locator("select[data-filter=dir]").input_value() == "all")
    _until(page, lambda: page.locator("#row-count").inner_text() == nan_rows)
    # the record's URL opened afresh: the same record of the same cell
    _open(page, record_url)
    _until(page, lambda: _active(page) == "record" and page.locator("#record-name").inner_text() == RECV)
    assert page.locator("#cell-badge").inner_text().endswith("step 1 · rank1")
    # a tab chosen by hand is in the URL; a link naming no cell of this view says so
    page.locator(".tab[data-view=overview]").click()
    _until(page, lambda: _link(page).get("view") == "overview")
    _open(page, base + "#view=list&step=7&rank=rank9")
    _until(page, lambda: "not in this view" in page.locator("#status").inner_text())
    assert page.errors == [], page.errors


def test_links_live(page, cluster_view):  # noqa: F811 - the fixture
    s = LiveServer(cluster_view)
    try:
        _walk(page, s.url)
    finally:
        s.close()


def test_links_in_the_report(page, cluster_view, tmp_path):  # noqa: F811 - the fixture
    from msprobe.view import write_report

    out = write_report(cluster_view, str(tmp_path / "report.html"))
    _walk(page, f"file://{out}")


@pytest.mark.parametrize("hash_", ["", "#view=cluster&step=1&rank=rank0"])
def test_the_token_leaves_the_url(page, cluster_view, hash_):  # noqa: F811 - the fixture
    s = LiveServer(cluster_view)
    try:
        _open(page, s.url + hash_)
        assert "token" not in page.url and page.url.startswith(f"http://127.0.0.1:{s.port}/#view=")
        assert _active(page) == _link(page)["view"] == ("cluster" if hash_ else "overview")
        # the page goes on asking the server (the token kept in the page, the cookie set)
        page.locator(".tab[data-view=list]").click()
        _until(page, lambda: page.locator("#rows .vrow").count() > 0)
        assert _link(page)["view"] == "list" and "token" not in page.url
    finally:
        s.close()
