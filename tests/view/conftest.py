"""Fixtures of the explorer's tests: the dump pairs (made by our PyTorch dumper in a subprocess),
their views, a live server in a thread, and one headless Chromium for the session.

Chromium is Debian's ``chromium`` package, installed here with apt-get when it is missing (as
scripts/bootstrap.sh does); Playwright drives it through ``executable_path``. When it cannot be
installed or started the tests FAIL: they never skip."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
TOKEN = "test-token-0123456789"
#: where the browser tests put their screenshots: docs/explorer/ when MSPROBE_VIEW_SHOTS=1
SHOTS = os.path.join(ROOT, "docs", "explorer") if os.environ.get("MSPROBE_VIEW_SHOTS") else None


def _make(root: str, fault: str, hostile: bool = False) -> str:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, os.path.join(HERE, "_make_pair.py"), root, fault] + (["hostile"] if hostile else [])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return root


@pytest.fixture(scope="session")
def nan_pair(tmp_path_factory) -> str:
    """target/ and bench/: a NaN in fc2's weight on rank 1 at step 1 of the target."""
    return _make(str(tmp_path_factory.mktemp("nan_pair")), "nan")


@pytest.fixture(scope="session")
def scale_pair(tmp_path_factory) -> str:
    """target/ and bench/: fc2's weight scaled x100 on rank 1 at step 1 of the target."""
    return _make(str(tmp_path_factory.mktemp("scale_pair")), "scale")


def _derived(root: str, pair: str, how: str) -> str:
    """A copy of ``pair`` under ``root`` changed by ``_make_pair.py HOW ROOT`` (poison, rename)."""
    for side in ("target", "bench"):
        shutil.copytree(os.path.join(pair, side), os.path.join(root, side))
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, os.path.join(HERE, "_make_pair.py"), how, root], capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return root


@pytest.fixture(scope="session")
def hostile_pair(tmp_path_factory, nan_pair) -> str:
    """The NaN pair with HTML and script tags in a record name, a dtype and a stack frame."""
    return _derived(str(tmp_path_factory.mktemp("hostile_pair")), nan_pair, "poison")


@pytest.fixture(scope="session")
def skew_pair(tmp_path_factory, nan_pair) -> str:
    """The NaN pair whose bench calls its relu record gelu: one target record and one bench record
    have no counterpart (each tree has an unmatched node under Module.act.ReLU.forward.0)."""
    return _derived(str(tmp_path_factory.mktemp("skew_pair")), nan_pair, "rename")


def _open(pair: str):
    from msprobe.view import open_view

    return open_view(os.path.join(pair, "target"), os.path.join(pair, "bench"))


@pytest.fixture(scope="session")
def nan_view(nan_pair):
    v = _open(nan_pair)
    yield v
    v.close()


@pytest.fixture(scope="session")
def scale_view(scale_pair):
    v = _open(scale_pair)
    yield v
    v.close()


@pytest.fixture(scope="session")
def skew_view(skew_pair):
    v = _open(skew_pair)
    yield v
    v.close()


@pytest.fixture(scope="session")
def hostile_view(hostile_pair):
    v = _open(hostile_pair)
    yield v
    v.close()


class LiveServer:
    """uvicorn serving one view in a thread, on a free port of 127.0.0.1."""

    def __init__(self, data) -> None:
        import uvicorn

        from msprobe.view import make_app

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(make_app(data, TOKEN), host="127.0.0.1", port=self.port,
                                                    log_level="warning", access_log=False))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the view server did not start"
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}/?token={TOKEN}"

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="session")
def live(nan_view):
    s = LiveServer(nan_view)
    yield s
    s.close()


def _ensure_chromium() -> str:
    if not os.path.exists(CHROMIUM):
        if os.geteuid() != 0 or not shutil.which("apt-get"):
            pytest.fail(f"{CHROMIUM} is missing and cannot be installed here (apt-get install chromium as root)")
        cmd = ["apt-get", "install", "-y", "-q", "chromium"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, timeout=900)
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        assert out.returncode == 0 and os.path.exists(CHROMIUM), f"apt-get install chromium failed: {out.stderr[-2000:]}"
    return CHROMIUM


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium for the session (Debian's package, driven by Playwright)."""
    path = _ensure_chromium()
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    try:
        b = pw.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
    except Exception as exc:  # noqa: BLE001 - any failure to start is the test's failure
        pw.stop()
        pytest.fail(f"Chromium ({path}) did not start: {exc}")
    yield b
    b.close()
    pw.stop()


@pytest.fixture()
def page(browser):
    """A fresh page (1400 x 900) that records console errors, page errors and CSP violations."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 900}, accept_downloads=True)
    p = ctx.new_page()
    p.set_default_timeout(WAIT_MS)
    p.errors = []
    p.on("pageerror", lambda e: p.errors.append(f"pageerror: {e}"))
    p.on("console", lambda m: p.errors.append(f"console: {m.text}") if m.type == "error" else None)
    yield p
    ctx.close()


#: the longest the browser tests wait for a page state (a selector, a poll, Playwright's own waits):
#: a bound, not a figure; a wait returns as soon as its state holds. 30 s was too short on the
#: 2-core machine at load 9 (a record view's first paint during the whole suite's run).
WAIT_MS = 180_000


def until(page, check, timeout_ms: int = WAIT_MS) -> None:
    """Poll ``check`` every 50 ms until it holds or ``timeout_ms`` of wall time have passed
    (Playwright's wait_for_function evals, which the page's policy forbids); assert it at the end."""
    deadline = time.monotonic() + timeout_ms / 1000
    while time.monotonic() < deadline:
        if check():
            return
        page.wait_for_timeout(50)
    assert check()


def shot(page, name: str) -> None:
    """A screenshot of the page for docs/explorer.md (only when MSPROBE_VIEW_SHOTS=1)."""
    if SHOTS:
        os.makedirs(SHOTS, exist_ok=True)
        page.screenshot(path=os.path.join(SHOTS, f"{name}.png"))
