"""The explorer uses compare's mask rule (issue 41, item 6): a causal LM's intended ``-inf``
(``masked_fill(triu, -inf)`` fed to attention) is its own quiet category, never NaN/Inf, so the
cells of a real fault (one weight x1.02 from step 2) are the ones that stand out."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("duckdb")
pytest.importorskip("torch")

from msprobe.view import open_view
from tests.view.conftest import WAIT_MS

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@pytest.fixture(scope="module")
def causal_pair(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("causal")
    env = dict(os.environ, PYTHONPATH=str(ROOT), MSPROBE_LAKE_CACHE=str(out / "_cache"))
    subprocess.run([sys.executable, str(HERE / "_make_causal.py"), str(out)], check=True, env=env, timeout=600,
                   capture_output=True)
    return out


def _cells(data) -> list:
    return data.overview()["cells"]


def test_a_pair_with_an_attention_mask_is_not_nan_inf_and_the_fault_stands_out(causal_pair, tmp_path):
    data = open_view(str(causal_pair / "target"), str(causal_pair / "bench"), work_dir=str(tmp_path / "w"))
    try:
        cells = _cells(data)
        assert len(cells) == 3
        assert all(cell["nan_inf"] == 0 for cell in cells), cells
        assert all(cell["masked"] > 0 for cell in cells), cells
        worst = max(cells, key=lambda cell: cell["max_score"])  # what the heatmap and the worst list rank by
        assert worst["step"] == 2 and data.overview()["origin"]["cell"] == worst["cell"]
        first = worst["cell"]
        masked = data.rows(first, 0, 1000, {"result": "masked"})
        names = [row["name"] for row in masked["rows"]]
        assert any("masked_fill" in name for name in names) and all(not row["nan_inf"] for row in masked["rows"])
        assert data.rows(first, 0, 1000, {"result": "nan_inf"})["rows"] == []
    finally:
        data.close()


def test_one_dump_with_an_attention_mask_shows_masks_not_nan_inf(causal_pair, tmp_path):
    data = open_view(str(causal_pair / "bench"), work_dir=str(tmp_path / "w"))
    try:
        cells = _cells(data)
        assert cells and all(cell["nan_inf"] == 0 and cell["masked"] > 0 for cell in cells), cells
    finally:
        data.close()


def test_a_real_inf_is_still_nan_inf(tmp_path):
    """+inf, or -inf outside a mask (an overflowing matmul), keeps the NaN/Inf colour."""
    import json

    inf_entry = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": -1.0,
                 "Min": float("-inf"), "Mean": float("-inf"), "Norm": float("inf"), "requires_grad": False}
    rank = tmp_path / "d" / "step0" / "rank"
    rank.mkdir(parents=True)
    (rank / "dump.json").write_text(json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch",
                                                "data": {"Functional.matmul.0.forward": {"output": [inf_entry]}}}))
    data = open_view(str(tmp_path / "d"), work_dir=str(tmp_path / "w"))
    try:
        (cell,) = _cells(data)
        assert (cell["nan_inf"], cell["masked"]) == (1, 0)
    finally:
        data.close()


def test_the_page_lists_a_mask_quietly(page, causal_pair, tmp_path):
    """In a real browser, on the report of the pair: no row of the faulty cell wears the NaN colour; the
    'mask -inf' filter lists the mask's rows, labelled so."""
    import time

    from msprobe.view import write_report

    data = open_view(str(causal_pair / "target"), str(causal_pair / "bench"), work_dir=str(tmp_path / "w"))
    try:
        out = write_report(data, str(tmp_path / "report.html"))
    finally:
        data.close()
    page.goto(f"file://{out}")
    page.wait_for_selector("body[data-ready]", state="attached", timeout=WAIT_MS)
    worst = page.locator("#worst-cells tbody").inner_text()
    assert "NaN/Inf" not in worst and worst.startswith("step 2"), worst  # the real fault, not the masks
    page.locator(".tab[data-view=list]").click()
    page.wait_for_selector("#view-list:not([hidden]) #rows .vrow")
    assert page.locator("#rows .vrow.r-nan").count() == 0
    page.select_option("select[data-filter=result]", "masked")
    deadline = time.monotonic() + 20
    while not page.evaluate("() => [...document.querySelectorAll('#rows .vrow')].length > 0 && "
                            "[...document.querySelectorAll('#rows .vrow')].every(r => r.textContent.includes('mask -inf'))"):
        assert time.monotonic() < deadline, page.locator("#rows").inner_text()[:500]
        page.wait_for_timeout(50)
    assert page.errors == [], page.errors
