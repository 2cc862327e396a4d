"""The compare plot is drawn by a helper interpreter (matplotlib imported while compare runs),
with the same PNG as in-process, and in-process whenever the helper fails."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

import msprobe.compare._plotproc as plotproc
from msprobe.compare import compare

HERE = os.path.dirname(os.path.abspath(__file__))
MS26 = os.path.join(os.path.dirname(HERE), "fixtures", "real", "ms26")
T = os.path.join(MS26, "L1_statistics", "step0")
B = os.path.join(MS26, "L1_statistics_perturbed", "step0")
ROOT = os.path.dirname(os.path.dirname(HERE))

pytest.importorskip("matplotlib")


def _png(out: str) -> bytes:
    (p,) = glob.glob(os.path.join(out, "compare_plot_*.png"))
    with open(p, "rb") as f:
        return f.read()


def test_helper_draws_the_plot_and_the_parent_never_imports_matplotlib(tmp_path):
    code = ("import sys, json; from msprobe.compare import compare; "
            f"s = compare({T!r}, {B!r}, {str(tmp_path / 'o')!r}, timestamp='1', progress=False); "
            "print(json.dumps([s['plot'], s['plot_note'], 'matplotlib' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=ROOT), timeout=600)
    plot, note, imported = json.loads(out.stdout.strip().splitlines()[-1])
    assert plot and os.path.exists(plot) and note is None
    assert imported is False  # the helper drew it


@pytest.mark.parametrize("broken", ["no interpreter", "crash", "bad answer"])
def test_helper_failure_falls_back_to_the_same_png(tmp_path, monkeypatch, broken):
    compare(T, B, str(tmp_path / "helper"), timestamp="1", progress=False)
    if broken == "no interpreter":
        monkeypatch.setattr(plotproc.sys, "executable", str(tmp_path / "no-such-python"))
    elif broken == "crash":
        monkeypatch.setattr(plotproc, "_SERVE", "import os; os._exit(3)")
    else:
        monkeypatch.setattr(plotproc, "_SERVE", "import sys; sys.stdin.read(); print('[\"/nonexistent.png\", null]')")
    s = compare(T, B, str(tmp_path / "inproc"), timestamp="1", progress=False)
    assert s["plot"] == str(tmp_path / "inproc" / "compare_plot_1.png")
    assert _png(str(tmp_path / "helper")) == _png(str(tmp_path / "inproc"))


def test_helper_is_ended_when_compare_fails(tmp_path, monkeypatch):
    started = []
    real = plotproc.PlotProcess.__init__

    def spy(self):
        real(self)
        started.append(self.proc)

    monkeypatch.setattr(plotproc.PlotProcess, "__init__", spy)
    with pytest.raises(Exception):
        compare(str(tmp_path / "missing"), B, str(tmp_path / "o"), progress=False)
    (proc,) = started
    assert proc.poll() is not None  # killed and reaped, not left behind
