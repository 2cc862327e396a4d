"""The page served while the view is built (issue 49 item 3): ``msprobe view``'s server prints its URL
after a second of set-up and serves the page at once, which shows the set-up's stages until the view
is ready and then the overview; a set-up that fails at once raises before any URL, one that fails
later shows its error and stops the server. Driven in a real headless Chromium, the set-up held by an
event so the verdict does not depend on the machine's speed (the set-up itself is the real
``open_view`` of the 2-rank pipeline pair).

These tests fail, never skip, when Chromium cannot be installed or started (tests/view/conftest.py)."""
from __future__ import annotations

import json
import os
import threading
import urllib.request

from tests.view.conftest import WAIT_MS
from tests.view.conftest import until as _until
from tests.view.test_view_cluster import pipeline  # noqa: F401 - the fixture


class _Serving:
    """msprobe.view.serve in a thread with a loader held by ``go``; its printed lines, its error."""

    def __init__(self, loader) -> None:
        from msprobe.view._server import serve

        self.lines: list = []
        self.progress: list = []
        self.error: list = []
        self.stop = threading.Event()
        self.printed = threading.Event()

        def announce(line: str) -> None:
            self.lines.append(line)
            self.printed.set()

        def run() -> None:
            try:
                serve(loader=loader, announce=announce, progress=self.progress.append, until=self.stop)
            except Exception as exc:  # noqa: BLE001 - kept for the test to check
                self.error.append(exc)
            self.printed.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert self.printed.wait(120)

    @property
    def url(self) -> str:
        return self.lines[0].split("msprobe view: ", 1)[1]

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)


def test_the_page_shows_the_set_up_until_the_view_is_ready(page, pipeline, tmp_path):  # noqa: F811
    from msprobe.view import open_view

    go = threading.Event()

    def loader(stage):
        data = open_view(os.path.join(pipeline, "target"), os.path.join(pipeline, "bench"),
                         work_dir=str(tmp_path / "w"), stage=stage)
        stage("held by the test")
        assert go.wait(120)
        return data

    s = _Serving(loader)
    try:
        assert not s.error and s.url.startswith("http://127.0.0.1:")
        # the API answers 202 (accepted, not done) with the progress while the view is built
        with urllib.request.urlopen(s.url.replace("/?token=", "/api/meta?token="), timeout=30) as resp:
            assert resp.status == 202 and json.loads(resp.read())["loading"] is True
        page.goto(s.url)
        page.wait_for_selector("#loading")
        _until(page, lambda: "held by the test" in page.locator("#loading").inner_text())
        text = page.locator("#loading").inner_text()
        assert "Building the view" in text and "comparing the pair" in text and "loading the compare output" in text
        assert page.locator("body[data-ready]").count() == 0
        go.set()
        page.wait_for_selector("body[data-ready]", state="attached", timeout=WAIT_MS)
        assert page.locator("#loading").count() == 0
        assert page.locator("#first-divergence").inner_text().startswith("First divergence")
        assert any("ready in" in line for line in s.progress) and any("comparing the pair" in line for line in s.progress)
        assert page.errors == [], page.errors
    finally:
        go.set()
        s.close()
    assert not s.error


def test_a_set_up_that_fails_at_once_prints_no_url(tmp_path):
    def loader(stage):
        raise ValueError("no such dump")

    s = _Serving(loader)
    s.thread.join(30)
    assert s.lines == [] and [str(e) for e in s.error] == ["no such dump"]


def test_a_set_up_that_fails_later_shows_its_error_and_stops(page, tmp_path):
    go = threading.Event()

    def loader(stage):
        stage("reading")
        assert go.wait(120)
        raise ValueError("the dump went away")

    s = _Serving(loader)
    try:
        page.goto(s.url)
        page.wait_for_selector("#loading")
        go.set()
        _until(page, lambda: "could not be built" in page.locator("#loading").inner_text())
        assert "the dump went away" in page.locator("#loading").inner_text()
        s.thread.join(30)
        assert not s.thread.is_alive() and [str(e) for e in s.error] == ["the dump went away"]
    finally:
        go.set()
        s.close()
