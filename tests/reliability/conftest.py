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
