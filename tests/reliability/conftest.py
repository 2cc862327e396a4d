"""Shared helpers of the reliability tests: figures collected by the tests are printed at the
end of the session and, when MSPROBE_RELIABILITY_REPORT names a file, written there as JSON."""
from __future__ import annotations

import json
import os

import pytest

FIGURES: dict = {}


@pytest.fixture(scope="session")
def figures():
    return FIGURES


def pytest_sessionfinish(session):
    """pytest-xdist worker: hand the figures to the controller (merged in pytest_testnodedown)."""
    out = getattr(session.config, "workeroutput", None)
    if out is not None and FIGURES:
        out["reliability_figures"] = json.dumps(FIGURES)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    raw = getattr(node, "workeroutput", {}).get("reliability_figures")
    if raw:
        FIGURES.update(json.loads(raw))


def pytest_terminal_summary(terminalreporter):
    if not FIGURES:
        return
    terminalreporter.write_sep("-", "reliability figures")
    for key, value in FIGURES.items():
        terminalreporter.write_line(f"{key}: {json.dumps(value, sort_keys=True)}")
    path = os.environ.get("MSPROBE_RELIABILITY_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(FIGURES, f, indent=1, sort_keys=True)
