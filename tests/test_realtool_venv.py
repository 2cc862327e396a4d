"""The real-tool venv of tests/_realtool.py is usable from the repository root.

Run from the checkout (as CI runs pytest), ``python -c "import msprobe"`` imports OUR package (the
current directory comes first on ``sys.path``); the venv's import check must still find the real
one, else a fresh machine installs torch into the venv and then reports the tool unavailable.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _realtool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.real_tool
def test_check_finds_the_real_msprobe_from_the_checkout(real_tool, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("PYTHONPATH", ROOT)
    out = _realtool._check(_realtool.Path(real_tool))
    assert out.returncode == 0, out.stderr[-2000:]
    assert os.path.realpath(out.stdout.strip().splitlines()[-1].split()[0]).startswith(os.path.realpath(os.path.dirname(
        os.path.dirname(real_tool)))), out.stdout
    # and the real package answers like itself, not like ours
    ver = subprocess.run([real_tool, "-c", "import importlib.metadata as m; print(m.version('mindstudio-probe'))"],
                         capture_output=True, text=True, cwd=os.path.dirname(real_tool), env=_realtool._clean_env())
    assert ver.returncode == 0 and ver.stdout.strip() == "26.2.0", (ver.stdout, ver.stderr[-500:])
