"""A first look while the view is built (issue 49 item 3): ``msprobe view`` serves, within seconds, a
pair's cells and its first cell's first records compared (read from the head of each dump.json, the
rest unread) or, for a lake with an index, its overview counted over the index files with one cell's
rows (the lake not opened), then replaces it by the whole view in place.

* ``head_records`` against ``json.load`` on a document cut into tiny chunks (a record, a number, a
  non-ASCII name and the NaN/Infinity tokens split across chunk ends), with a wanted name further on;
  documents that are not dump documents give None;
* in a real headless Chromium, the first look of the 2-rank NaN pair and of a lake of two runs, the
  whole set-up held by an event after the first look is published (the verdict does not depend on
  the machine's speed): the banner, the overview of every cell, the first cell's rows (only the
  first records of a pair, equal to the whole view's rows of the same names), then the whole view
  once the event is set. Each failed on the code before (no first look: the page waited for the
  whole set-up).

These tests fail, never skip, when Chromium cannot be installed or started (tests/view/conftest.py).
MSPROBE_VIEW_SHOTS=1 writes docs/explorer/first_look.png (the pair's first look, its list)."""
from __future__ import annotations

import json
import math
import os
import shutil
import threading

import pytest

from tests.view.conftest import shot
from tests.view.conftest import until as _until
from tests.view.test_view_endpoints import FAULT_ROW
from tests.view.test_view_progress import _Serving


def _doc() -> dict:
    data = {}
    for k in range(40):
        data[f"Functional.linear.{k}.forward" if k != 7 else "Functional.relu_é中.0.forward"] = {
            "input_args": [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, k + 1],
                            "Max": float("nan") if k == 3 else 1.5 * k, "Min": float("-inf") if k == 5 else -k,
                            "Mean": 0.123456789 * k, "Norm": float("inf") if k == 9 else 12345.678 + k}],
            "output": [{"type": "int", "value": 10 ** 12 + k}]}
    return {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "data": data}


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


@pytest.mark.parametrize("chunk", [5, 7, 64, 1 << 20])
def test_head_records_reads_the_first_records_as_json_does(tmp_path, monkeypatch, chunk):
    from msprobe.view import _first

    monkeypatch.setattr(_first, "_CHUNK", chunk)
    path = tmp_path / "dump.json"
    doc = _doc()
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False), encoding="utf-8")
    names = list(doc["data"])
    head = _first.head_records(str(path), 10)
    assert head is not None and list(head["data"]) == names[:10]
    assert {k: head[k] for k in ("task", "level", "framework", "dump_data_dir")} == \
        {k: doc[k] for k in ("task", "level", "framework", "dump_data_dir")}
    assert all(_same(doc["data"][name], head["data"][name]) for name in names[:10])
    # a wanted name further on: read on to it (at most twice the limit)
    more = _first.head_records(str(path), 10, {names[14]})
    assert list(more["data"]) == names[:15]
    capped = _first.head_records(str(path), 10, {"Functional.missing.0.forward"})
    assert list(capped["data"]) == names[:20]
    whole = _first.head_records(str(path), 1000)
    assert list(whole["data"]) == names


@pytest.mark.parametrize("text", ['[1, 2]', '{"task": "x"}', '{"data": []}', '{"data": {}}', 'not json', ''])
def test_head_records_of_what_is_no_dump_document_is_none(tmp_path, text):
    from msprobe.view import _first

    path = tmp_path / "dump.json"
    path.write_text(text, encoding="utf-8")
    assert _first.head_records(str(path), 10) is None
    assert _first.head_records(str(tmp_path / "absent.json"), 10) is None


def _held_loader(go: threading.Event, **kwargs):
    """A ``msprobe view`` loader (open_view with a first look) whose whole view waits for ``go`` once
    the first look is published."""
    from msprobe.view import open_view

    def loader(stage, look):
        def first_look(view):
            look(view)
            stage("held by the test")
            assert go.wait(180)
        return open_view(stage=stage, first_look=first_look, **kwargs)

    loader.first_look = True  # type: ignore[attr-defined]
    return loader


def _shown_rows(page) -> dict:
    return page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('#rows .vrow')].map((r) =>
        [r.dataset.name, r.querySelectorAll('.vcell')[2].textContent + '|' + r.querySelectorAll('.vcell')[3].textContent]))""")


def test_a_pair_first_look_then_the_whole_view(page, nan_pair, tmp_path, monkeypatch):
    from msprobe.view import _first

    monkeypatch.setattr(_first, "FIRST_RECORDS", 3)
    target, bench = os.path.join(nan_pair, "target"), os.path.join(nan_pair, "bench")
    with open(os.path.join(target, "step0", "rank0", "dump.json"), encoding="utf-8") as handle:
        first_records = list(json.load(handle)["data"])[:3]
    go = threading.Event()
    s = _Serving(_held_loader(go, path=target, bench=bench, work_dir=str(tmp_path / "w")))
    try:
        page.goto(s.url)
        page.wait_for_selector("body[data-ready]", state="attached", timeout=120000)
        banner = page.locator("#first-look")
        _until(page, lambda: "held by the test" in banner.inner_text())
        assert "the first 3 records of the first cell compared" in banner.inner_text()
        assert any("first look ready in" in line for line in s.progress), s.progress
        meta = page.evaluate("() => window.__msprobe.state.meta")
        cells = page.evaluate("() => window.__msprobe.state.overview.cells")
        # every cell of the pair, at once: the first with rows, the others still being compared
        assert [(c["step"], c["rank_dir"]) for c in meta["cells"]] == \
            [(step, f"rank{rank}") for step in range(3) for rank in range(2)]
        assert cells[0]["rows"] > 0 and all(c["rows"] == 0 for c in cells[1:])
        _until(page, lambda: len(_shown_rows(page)) > 0)
        first = _shown_rows(page)
        assert all(any(name.startswith(record + ".") for record in first_records) for name in first), first
        assert page.locator("#row-count").inner_text().startswith(f"{len(first)} rows")
        page.locator(".tab[data-view=list]").click()
        shot(page, "first_look")
        # the views over every cell wait for the whole view: they say so instead of a partial answer
        page.locator(".tab[data-view=cluster]").click()
        _until(page, lambda: "once the whole view is built" in page.locator("#status").inner_text())
        assert page.locator("#cluster-labels .lane-label").count() == 0
        go.set()
        page.wait_for_selector("body[data-whole]", state="attached", timeout=180000)
        assert page.locator("#first-look").count() == 0
        _until(page, lambda: page.locator("#cluster-labels .lane-label").count() == 2)  # the cluster, now whole
        page.locator(".tab[data-view=list]").click()
        cells = page.evaluate("() => window.__msprobe.state.overview.cells")
        assert all(c["rows"] > 0 for c in cells)
        bad = [(c["step"], c["rank_dir"]) for c in cells if c["nan_inf"]]
        assert bad == [(1, "rank1")]
        # the first cell's list holds every row now; those of the first look unchanged
        _until(page, lambda: len(_shown_rows(page)) > len(first))
        whole = _shown_rows(page)
        assert all(whole[name] == shown for name, shown in first.items()), (first, whole)
        assert not page.errors, page.errors
    finally:
        go.set()
        s.close()
    assert not s.error, s.error


def test_a_lake_first_look_counts_every_cell_and_opens_the_nan_cell(page, nan_pair, tmp_path):
    import msprobe.lake

    root = tmp_path / "lake"
    shutil.copytree(os.path.join(nan_pair, "target"), root / "run_npu")
    shutil.copytree(os.path.join(nan_pair, "bench"), root / "run_gpu")
    msprobe.lake.open(str(root), progress=False).close()  # an existing index (msprobe lake index)
    go = threading.Event()
    s = _Serving(_held_loader(go, path=str(root), work_dir=str(tmp_path / "w")))
    try:
        page.goto(s.url)
        page.wait_for_selector("body[data-ready]", state="attached", timeout=120000)
        _until(page, lambda: "held by the test" in page.locator("#first-look").inner_text())
        assert "counted from the lake's index" in page.locator("#first-look").inner_text()
        cells = page.evaluate("() => window.__msprobe.state.overview.cells")
        assert len(cells) == 12 and all(c["rows"] > 0 for c in cells)
        assert [(c["run"], c["step"], c["rank_dir"]) for c in cells if c["nan_inf"]] == [("run_npu", 1, "rank1")]
        assert page.locator("#cell-badge").inner_text() == "run_npu / step 1 · rank1"
        assert FAULT_ROW in page.locator("#first-divergence").inner_text()
        _until(page, lambda: FAULT_ROW in _shown_rows(page))
        go.set()
        page.wait_for_selector("body[data-whole]", state="attached", timeout=180000)
        assert page.locator("#first-look").count() == 0
        assert page.locator("#cell-badge").inner_text() == "run_npu / step 1 · rank1"
        _until(page, lambda: FAULT_ROW in _shown_rows(page))
        assert not page.errors, page.errors
    finally:
        go.set()
        s.close()
    assert not s.error, s.error


def test_one_dump_first_look_then_the_whole_view(page, nan_pair, tmp_path, monkeypatch):
    from msprobe.view import _first

    monkeypatch.setattr(_first, "FIRST_RECORDS", 3)
    target = os.path.join(nan_pair, "target")
    with open(os.path.join(target, "step0", "rank0", "dump.json"), encoding="utf-8") as handle:
        first_records = list(json.load(handle)["data"])[:3]
    go = threading.Event()
    s = _Serving(_held_loader(go, path=target, work_dir=str(tmp_path / "w")))
    try:
        page.goto(s.url + "#view=list")
        page.wait_for_selector("body[data-ready]", state="attached", timeout=120000)
        _until(page, lambda: "held by the test" in page.locator("#first-look").inner_text())
        assert "the first 3 records of the first cell read" in page.locator("#first-look").inner_text()
        cells = page.evaluate("() => window.__msprobe.state.overview.cells")
        assert [(c["step"], c["rank_dir"]) for c in cells] == [(step, f"rank{rank}") for step in range(3) for rank in range(2)]
        assert cells[0]["rows"] > 0 and all(c["rows"] == 0 for c in cells[1:])
        _until(page, lambda: len(_shown_rows(page)) > 0)
        first = _shown_rows(page)
        assert all(any(name.startswith(record + ".") for record in first_records) for name in first), first
        go.set()
        page.wait_for_selector("body[data-whole]", state="attached", timeout=180000)
        cells = page.evaluate("() => window.__msprobe.state.overview.cells")
        assert [(c["step"], c["rank_dir"]) for c in cells if c["nan_inf"]] == [(1, "rank1")]
        _until(page, lambda: len(_shown_rows(page)) > len(first))
        assert not page.errors, page.errors
    finally:
        go.set()
        s.close()
    assert not s.error, s.error


def test_a_first_look_that_breaks_leaves_the_whole_view(nan_pair, tmp_path, monkeypatch):
    """Whatever breaks a first look (here a failure planted in the pair's: any exception, DuckDB's
    included), the set-up says so and the whole view follows, unharmed."""
    from msprobe.view import _data, open_view

    def broken(*args, **kwargs):
        raise RuntimeError("planted")

    monkeypatch.setattr(_data, "pair_first_look", broken)
    said: list = []
    published: list = []
    with open_view(os.path.join(nan_pair, "target"), os.path.join(nan_pair, "bench"), work_dir=str(tmp_path / "w"),
                   stage=said.append, first_look=published.append) as v:
        assert not published and "no first look (RuntimeError: planted); the whole view follows" in said
        assert v.first_look is None and len(v.overview()["cells"]) == 6
        assert [(c["step"], c["rank_dir"]) for c in v.overview()["cells"] if c["nan_inf"]] == [(1, "rank1")]
