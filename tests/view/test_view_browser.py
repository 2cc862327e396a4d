"""The explorer as a person uses it: a real headless Chromium (Debian's package, driven by Playwright)
on the live server and on the self-contained report, on the dump pair with a NaN in fc2's weight on
rank 1 at step 1 (and the same pair with HTML in its names and stacks).

These tests fail, never skip, when Chromium cannot be installed or started (tests/view/conftest.py).
With MSPROBE_VIEW_SHOTS=1 they write the screenshots of docs/explorer.md into docs/explorer/."""
from __future__ import annotations

import pytest

from tests.view.conftest import WAIT_MS, LiveServer, shot

FAULT_ROW = "Functional.linear.1.forward.input.1"
FAULT_RECORD = "Functional.linear.1.forward"
FAULT_MODULE = "Module.fc2.Linear.forward.0"
READY = "body[data-ready]"


def _ready(page, url: str) -> None:
    page.goto(url)
    page.wait_for_selector(READY, state="attached", timeout=WAIT_MS)
    assert page.errors == [], page.errors


def _wait(page, js: str, timeout: float = 20.0) -> None:
    """Poll ``js`` (a function expression) until it is truthy: Playwright's wait_for_function
    evaluates its predicate with eval, which the page's policy forbids (as it should)."""
    import time

    deadline = time.monotonic() + timeout
    while not page.evaluate(js):
        assert time.monotonic() < deadline, f"timed out waiting for {js}"
        page.wait_for_timeout(50)


def _click_heatmap_cell(page, step: int, rank_dir: str) -> None:
    """A real mouse click on the heatmap's canvas, at the pixel ECharts drew the cell at."""
    xy = page.evaluate("""([step, rank]) => {
        const ix = window.__msprobe.overviewIndex;
        const cell = window.__msprobe.state.meta.cells.find((c) => c.step === step && c.rank_dir === rank);
        const [x, y] = ix.rowKey(cell.cell);
        const px = window.__msprobe.charts.overview.convertToPixel({seriesIndex: 0}, [x, y]);
        const box = document.getElementById('overview-chart').getBoundingClientRect();
        return [box.left + px[0], box.top + px[1]];
    }""", [step, rank_dir])
    page.mouse.click(xy[0], xy[1])


def _walk_the_views(page, url: str, shots: bool) -> None:
    _ready(page, url)
    # overview: the first divergence names the faulty step and rank; the worst cell is that one
    first = page.locator("#first-divergence")
    assert "step 1 · rank1" in first.inner_text() and FAULT_ROW in first.inner_text()
    worst = page.locator("#worst-cells tbody tr")
    assert FAULT_ROW in page.locator("#origin").inner_text()
    assert worst.count() == 1 and worst.first.get_attribute("data-step") == "1"
    assert worst.first.get_attribute("data-rank") == "rank1"
    if shots:
        shot(page, "overview")
    # click a healthy cell on the canvas: its list has no first divergence
    _click_heatmap_cell(page, 0, "rank0")
    page.wait_for_selector("#view-list:not([hidden]) #rows .vrow")
    assert page.locator("#cell-badge").inner_text() == "step 0 · rank0"
    assert page.locator("#rows .vrow.first-div").count() == 0
    # and the faulty one: the first divergent row is marked, and is the faulty API's first row
    page.locator(".tab[data-view=overview]").click()
    _click_heatmap_cell(page, 1, "rank1")
    _wait(page, "() => document.getElementById('cell-badge').textContent === 'step 1 · rank1'")
    page.wait_for_selector("#rows .vrow.first-div")
    marked = page.locator("#rows .vrow.first-div")
    assert marked.get_attribute("data-name") == FAULT_ROW
    page.select_option("select[data-filter=result]", "divergent")
    _wait(page, f"() => document.querySelector('#rows .vrow') && "
                f"document.querySelector('#rows .vrow').dataset.name === '{FAULT_ROW}'")
    assert "first" in page.locator("#rows .vrow").first.inner_text()
    if shots:
        shot(page, "divergences")
    # record detail: every argument, target and bench side by side, and the stack
    page.locator("#rows .vrow").first.click()
    page.wait_for_selector("#view-record:not([hidden]) #record-name")
    assert page.locator("#record-name").inner_text() == FAULT_RECORD
    args = page.locator("#record-args tbody tr")
    assert args.count() == 4 and "NaN" in args.nth(1).inner_text()
    assert "linear.py" in page.locator("#record-stack").inner_text()
    if shots:
        shot(page, "record")
    # the model tree: the module path is opened and the record highlighted, coloured as an error
    page.locator("#show-in-tree").click()
    page.wait_for_selector("#view-tree:not([hidden]) #tree .tline.hl")
    assert page.locator("#tree .tline.hl .tcol-name").inner_text() == FAULT_RECORD
    on_path = page.locator("#tree .tline.on-path .tcol-name").all_inner_texts()
    assert on_path == [FAULT_MODULE]
    assert "r-nan" in page.locator("#tree .tline.on-path").get_attribute("class")
    healthy = page.locator("#tree .tnode[data-name='Module.fc1.Linear.forward.0'] > .tline")
    assert "r-pass" in healthy.get_attribute("class")
    # the bench tree beside it: the same record's counterpart marked, on the same module path
    page.wait_for_selector("#tree-bench .tline.hl")
    assert page.locator("#tree-bench .tline.hl .tcol-name").inner_text() == FAULT_RECORD
    assert page.locator("#tree-bench .tline.on-path .tcol-name").all_inner_texts() == [FAULT_MODULE]
    # search, then open the hit
    page.fill("#tree-search", "fc1.Linear.forward")
    page.wait_for_selector("#tree-hits li")
    assert page.locator("#tree-hits li").first.inner_text() == "Module.fc1.Linear.forward.0"
    # export: the CSV of the current filter downloads
    page.locator(".tab[data-view=list]").click()
    with page.expect_download() as dl:
        page.locator("#export-csv").click()
    text = open(dl.value.path(), encoding="utf-8").read()
    lines = text.strip().splitlines()
    assert lines[0].startswith("i,name,") and lines[1].split(",")[1] == FAULT_ROW
    assert page.errors == [], page.errors


def test_live_server_views(page, live):
    _walk_the_views(page, live.url, True)


def test_report_views_from_the_file_alone(page, nan_view, tmp_path):
    from msprobe.view import write_report

    out = write_report(nan_view, str(tmp_path / "report.html"))
    requests: list = []
    page.on("request", lambda r: requests.append(r.url))
    _walk_the_views(page, f"file://{out}", False)
    assert all(u.startswith(("file://", "data:", "blob:")) for u in requests), requests


def test_trend_shows_the_jump(page, scale_view):
    s = LiveServer(scale_view)
    try:
        _ready(page, s.url)
        _click_heatmap_cell(page, 1, "rank1")
        page.wait_for_selector("#rows .vrow")
        page.locator(f"#rows .vrow[data-name='{FAULT_RECORD}.output.0']").click()
        page.wait_for_selector("#record-args")
        # the page's statistics are the server's (format.stats.STATISTICS through /api/meta), none of its own
        from msprobe.format.stats import STAT_COLUMNS

        heads = page.evaluate("[...document.querySelectorAll('#record-args th')].map(th => th.textContent)")
        assert [h for h in heads if h.startswith("target ")] == [f"target {c}" for c in STAT_COLUMNS], heads
        options = page.evaluate("[...document.querySelectorAll('#trend-stat option')].map(o => o.value)")
        assert sorted(options) == sorted(STAT_COLUMNS) and options[0] == "norm", options
        page.locator(f"#record-args tr[data-name='{FAULT_RECORD}.output.0'] button", has_text="trend").click()
        page.wait_for_selector("#view-trends:not([hidden])")
        _wait(page, "() => window.__msprobe.charts.trend && window.__msprobe.charts.trend.getOption().series.length === 4")
        series = page.evaluate("window.__msprobe.charts.trend.getOption().series.map(s => [s.name, s.data])")
        by = {name: dict((int(x), y) for x, y in data) for name, data in series}
        assert by["rank1 target"][1] > 20 * by["rank1 bench"][1]
        assert by["rank1 target"][0] == by["rank1 bench"][0] and by["rank0 target"] == by["rank0 bench"]
        shot(page, "trends")
        with page.expect_download() as dl:
            page.locator("#view-trends button", has_text="SVG").first.click()
        assert open(dl.value.path(), encoding="utf-8").read().lstrip().startswith("<svg")
        with page.expect_download() as dl:
            page.locator("#view-trends button", has_text="PNG").first.click()
        assert open(dl.value.path(), "rb").read(8) == b"\x89PNG\r\n\x1a\n"
        assert page.errors == [], page.errors
    finally:
        s.close()


@pytest.mark.parametrize("where", ["server", "report"])
def test_hostile_names_and_stacks_render_as_text(page, hostile_view, tmp_path, where):
    from msprobe.view import write_report

    if where == "server":
        s = LiveServer(hostile_view)
        url = s.url
    else:
        s = None
        url = f"file://{write_report(hostile_view, str(tmp_path / 'h.html'))}"
    try:
        _ready(page, url)
        page.locator(".tab[data-view=list]").click()
        page.fill("input[data-filter=q]", "relu<script")
        _wait(page, "() => { const r = document.querySelectorAll('#rows .vrow'); "
                    "return r.length > 0 && [...r].every((x) => x.dataset.name.includes('<script>')); }")
        row = page.locator("#rows .vrow").first
        assert "<script>window.__pwned=1</script>" in row.inner_text()
        row.click()
        page.wait_for_selector("#record-stack")
        assert '<img src=x onerror="window.__pwned=2">' in page.locator("#record-stack").inner_text()
        assert "<script>" in page.locator("#record-args").inner_text()  # the dtype, as text
        page.locator("#show-in-tree").click()
        page.wait_for_selector("#tree .tline.hl")
        assert "<script>" in page.locator("#tree .tline.hl .tcol-name").inner_text()
        # nothing ran, and the page holds no element the names would have made
        assert page.evaluate("window.__pwned") is None
        assert page.locator("#app img").count() == 0 and page.locator("#app script").count() == 0
        # the policy itself: an inline script added now does not run
        page.evaluate("""() => { const s = document.createElement('script'); s.textContent = 'window.__pwned = 3';
                                 document.body.append(s); }""")
        page.wait_for_timeout(100)
        assert page.evaluate("window.__pwned") is None
    finally:
        if s is not None:
            s.close()


@pytest.mark.parametrize("where", ["server", "report"])
def test_trees_side_by_side_expand_together_and_mark_the_unmatched(page, skew_view, tmp_path, where):
    """The bench calls the target's relu record gelu: expanding the ReLU module on one side expands
    it on the other, each side's odd record is marked as having no counterpart, collapsing follows."""
    from msprobe.view import write_report

    relu = "Module.act.ReLU.forward.0"
    s = LiveServer(skew_view) if where == "server" else None
    url = s.url if s else f"file://{write_report(skew_view, str(tmp_path / 'skew.html'))}"
    try:
        _ready(page, url)
        page.locator(".tab[data-view=tree]").click()
        page.wait_for_selector(f"#tree .tnode[data-name='{relu}']")
        page.wait_for_selector(f"#tree-bench .tnode[data-name='{relu}']")
        target_kids = page.locator(f"#tree .tnode[data-name='{relu}'] > .tkids")
        bench_kids = page.locator(f"#tree-bench .tnode[data-name='{relu}'] > .tkids")
        assert target_kids.is_hidden() and bench_kids.is_hidden()
        # expand on the target side (a real click on its toggle): both sides open
        page.locator(f"#tree .tnode[data-name='{relu}'] > .tline .toggle").click()
        page.wait_for_selector(f"#tree-bench .tnode[data-name='{relu}'] > .tkids .tnode")
        assert target_kids.is_visible() and bench_kids.is_visible()
        odd_target = page.locator(f"#tree .tnode[data-name='{relu}'] > .tkids > .tnode > .tline")
        odd_bench = page.locator(f"#tree-bench .tnode[data-name='{relu}'] > .tkids > .tnode > .tline")
        assert odd_target.locator(".tcol-name").all_inner_texts() == ["Functional.relu.0.forward"]
        assert odd_bench.locator(".tcol-name").all_inner_texts() == ["Functional.gelu.0.forward"]
        for line in (odd_target, odd_bench):
            assert "unmatched" in line.get_attribute("class")
            assert "counterpart" in line.locator(".tag-unmatched").inner_text()
        # a matched module is not marked, on either side
        fc1 = "#tree{} .tnode[data-name='Module.fc1.Linear.forward.0'] > .tline"
        for side in ("", "-bench"):
            assert "unmatched" not in page.locator(fc1.format(side)).get_attribute("class")
            assert page.locator(fc1.format(side) + " .tag-unmatched").count() == 0
        if where == "server":  # the screenshot: the faulty record found by search, on both sides
            page.fill("#tree-search", "linear.1.forward")
            page.locator("#tree-hits li", has_text=FAULT_RECORD).click()
            page.wait_for_selector("#tree-bench .tline.hl")
            page.fill("#tree-search", "")
            _wait(page, "() => document.querySelectorAll('#tree-hits li').length === 0")
            page.evaluate("() => window.scrollTo(0, 0)")
            shot(page, "tree")
        # collapse on the bench side: the target follows
        page.locator(f"#tree-bench .tnode[data-name='{relu}'] > .tline .toggle").click()
        _wait(page, f"() => document.querySelector(\"#tree .tnode[data-name='{relu}'] > .tkids\").hidden")
        assert bench_kids.is_hidden() and target_kids.is_hidden()
        # and expanding from the bench side opens the target's
        page.locator(f"#tree-bench .tnode[data-name='{relu}'] > .tline .toggle").click()
        _wait(page, f"() => !document.querySelector(\"#tree .tnode[data-name='{relu}'] > .tkids\").hidden")
        assert target_kids.is_visible()
        assert page.errors == [], page.errors
    finally:
        if s is not None:
            s.close()
