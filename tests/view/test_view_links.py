"""Links to a view (issue 49 item 2), in a real headless Chromium, live and in the report opened from
``file://``, on the 2-rank pipeline of tests/view/_make_cluster.py: the URL's fragment names the tab,
the cell (run, step, rank), the record, the cluster's page of lanes and the list's filters; opening
a URL gives the same view; back and forward walk the views a person opened; the access token is out
of the URL once the page has it.

``msprobe compare`` and ``msprobe lake nan`` print the link of the record they name while an ``msprobe
view`` of their input runs (its registry: msprobe.view.links), and the link opens that record.

These tests fail, never skip, when Chromium cannot be installed or started (tests/view/conftest.py)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.view.conftest import WAIT_MS, LiveServer
from tests.view.conftest import until as _until
from tests.view.test_view_cluster import ORIGIN, cluster_view, pipeline  # noqa: F401 - the fixtures

READY = "body[data-ready]"
RECV = "Distributed.recv.0.forward"


def _link(page) -> dict:
    return {k: v[0] for k, v in parse_qs(urlsplit(page.url).fragment).items()}


def _active(page) -> str:
    return page.locator(".tab.active").get_attribute("data-view")


def _open(page, url: str) -> None:
    """A fresh load of ``url`` (never a same-page move to its fragment)."""
    page.goto("about:blank")
    page.goto(url)
    page.wait_for_selector(READY, state="attached", timeout=WAIT_MS)


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


def _env(registry: str) -> dict:
    from tests.view.conftest import ROOT

    return dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                MSPROBE_VIEW_REGISTRY=registry)


def _cli(args: list, env: dict) -> str:
    out = subprocess.run([sys.executable, "-m", "msprobe", *args], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def _serving(args: list, env: dict):
    """``msprobe view ARGS`` in its own process: (process, the URL it printed)."""
    proc = subprocess.Popen([sys.executable, "-m", "msprobe", "view", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    m = re.match(r"msprobe view: (\S+)", line.strip())
    if not m:
        proc.kill()
        raise AssertionError(f"msprobe view did not start: {line!r} {proc.stderr.read()[-3000:]}")
    return proc, m.group(1)


def _stop(proc) -> None:
    proc.send_signal(signal.SIGINT)  # as a person stops it: the server's registration goes
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)


def test_compare_prints_the_link_of_a_running_view(page, pipeline, tmp_path):  # noqa: F811 - the fixture
    """compare's answers name the record's view on a running ``msprobe view`` of the same dump, and the
    link opens that record; with no server running compare prints no link."""
    target, bench = os.path.join(pipeline, "target"), os.path.join(pipeline, "bench")
    env = _env(str(tmp_path / "registry"))
    proc, url = _serving([target, bench, "--work-dir", str(tmp_path / "view")], env)
    try:
        said = _cli(["compare", target, bench, "--out", str(tmp_path / "cmp")], env)
        links = [line.split("view: ", 1)[1] for line in said.splitlines() if line.strip().startswith("view: ")]
        assert links and all(link.startswith(url + "#view=record") for link in links), said
        origin = links[0]
        frag = {k: v[0] for k, v in parse_qs(urlsplit(origin).fragment).items()}
        assert (frag["step"], frag["rank"], frag["record"]) == ("1", "rank0", ORIGIN), said
        _open(page, origin)
        _until(page, lambda: _active(page) == "record" and page.locator("#record-name").inner_text() == ORIGIN)
        assert page.locator("#cell-badge").inner_text().endswith("step 1 · rank0")
        assert "token" not in page.url
    finally:
        _stop(proc)
    assert os.listdir(tmp_path / "registry") == []
    said = _cli(["compare", target, bench, "--out", str(tmp_path / "cmp2")], env)
    assert "error enters at" in said and "view: " not in said


def test_lake_nan_prints_the_link_of_a_running_view(page, tmp_path):
    from tests.view._make_cluster import write_pipeline

    lake = str(tmp_path / "lake")
    write_pipeline(os.path.join(lake, "run_a"))
    write_pipeline(os.path.join(lake, "run_b"), bench=True)
    env = _env(str(tmp_path / "registry"))
    proc, url = _serving([lake, "--work-dir", str(tmp_path / "view")], env)
    try:
        said = _cli(["lake", "nan", lake], env)
        links = [line.split("view: ", 1)[1] for line in said.splitlines() if line.strip().startswith("view: ")]
        assert len(links) == 1 and links[0].startswith(url + "#view=record"), said
        frag = {k: v[0] for k, v in parse_qs(urlsplit(links[0]).fragment).items()}
        assert (frag["run"], frag["step"], frag["rank"], frag["record"]) == ("run_a", "1", "rank0", ORIGIN), said
        _open(page, links[0])
        _until(page, lambda: _active(page) == "record" and page.locator("#record-name").inner_text() == ORIGIN)
        assert page.locator("#cell-badge").inner_text() == "run_a / step 1 · rank0"
    finally:
        _stop(proc)
