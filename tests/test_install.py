"""Installed as a user installs it: the wheel built out of tree, into a fresh venv.

The venv first gets the base install (``msprobe demo`` then says, in one line, which extra it
needs), then the ``torch`` extra only (``msprobe demo`` runs from an empty folder, rc 0, and
says which extra adds the table read-back). Pins come from constraints/ci.txt, as CI's.
Also: the metadata (SPDX license, LICENSE file, one version, extras) and the warning when
mindstudio-probe shares the environment.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import msprobe

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "constraints" / "ci.txt"


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def _run(cmd: list, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=str(cwd), capture_output=True, text=True, timeout=timeout,
                          env=_env())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """``python -m build`` (sdist, then the wheel from the unpacked sdist) into a temp dir."""
    out = tmp_path_factory.mktemp("dist")
    had_build = (ROOT / "build").exists()
    r = _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", out, ROOT], ROOT, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert had_build or not (ROOT / "build").exists(), "the build left build/ in the source tree"
    wheels = list(out.glob("msprobe_lake-*.whl"))
    assert len(wheels) == 1, list(out.iterdir())
    return wheels[0]


def test_wheel_metadata(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        lic = next(n for n in names if n.endswith("licenses/LICENSE"))
        assert "Apache License" in z.read(lic).decode()
        assert "msprobe/dumpers/pytorch/support_wrap_ops.yaml" in names
        # msprobe view's page ships built, with the licences of what it bundles; its sources do not
        for asset in ("app.js", "app.css", "LICENSES.txt"):
            assert f"msprobe/view/static/{asset}" in names
        assert "ECharts" in z.read("msprobe/view/static/LICENSES.txt").decode()
        assert not any("frontend" in n or "node_modules" in n for n in names)
    head = dict(line.split(": ", 1) for line in meta.split("\n\n", 1)[0].splitlines() if ": " in line)
    assert head["License-Expression"] == "Apache-2.0"
    assert head["License-File"] == "LICENSE"
    assert head["Version"] == msprobe.__version__ == wheel.name.split("-")[1]
    assert "Classifier" in meta and "Project-URL" in meta
    requires = [line.split(": ", 1)[1] for line in meta.splitlines() if line.startswith("Requires-Dist: ")]
    assert "pyyaml>=6" in requires and any(r.startswith("tqdm") for r in requires)
    extras = {line.split(": ", 1)[1] for line in meta.splitlines() if line.startswith("Provides-Extra: ")}
    assert {"torch", "parquet", "duckdb", "plot", "xlsx", "lake", "view", "all"} <= extras and "yaml" not in extras
    assert any(r.startswith("starlette") and 'extra == "view"' in r for r in requires)
    assert any(r.startswith("openpyxl") and 'extra == "xlsx"' in r for r in requires)
    assert any(r.startswith("duckdb>=1.0.1") for r in requires)


def test_fresh_venv_base_then_torch_extra_runs_the_demo(wheel, tmp_path):
    venv = tmp_path / "venv"
    r = _run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path)
    assert r.returncode == 0, r.stderr
    py, msprobe_cmd = venv / "bin" / "python", venv / "bin" / "msprobe"
    # this interpreter's pip installs into the venv (no ensurepip); pip's cache is reused; no .pyc
    # compiled at install time (torch's thousands of modules)
    pip = [sys.executable, "-m", "pip", "--python", py, "install", "-q", "--disable-pip-version-check",
           "--no-compile", "-c", CONSTRAINTS]

    r = _run(pip + [wheel], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    empty = tmp_path / "empty"
    empty.mkdir()
    r = _run([msprobe_cmd, "demo"], empty)
    assert r.returncode == 1
    assert r.stderr.strip() == "msprobe demo: error: torch is required for this feature: pip install 'msprobe-lake[torch]'"
    assert "Traceback" not in r.stdout + r.stderr
    r = _run([py, "-W", "error", "-c", "import msprobe, msprobe.readers, msprobe.format; print(msprobe.__version__)"],
             empty)
    assert r.returncode == 0 and r.stdout.strip() == msprobe.__version__, r.stderr

    r = _run(pip + [f"{wheel}[torch]"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    r = _run([py, "-c", "import pyarrow"], empty)
    assert r.returncode != 0, "the torch extra alone should not bring pyarrow"
    r = _run([msprobe_cmd, "demo"], empty)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "valid: True" in r.stdout
    assert "table read-back (to_pandas, the Parquet index) skipped: pip install 'msprobe-lake[parquet]'" in r.stdout
    assert "non-finite values: no NaN, no +/-Inf (-inf only in masked_fill outputs" in r.stdout
    assert sorted(os.listdir(empty)) == ["demo_dump"]
    shutil.rmtree(venv)


# -- next to mindstudio-probe -------------------------------------------------------------------

_WARN = "msprobe-lake and mindstudio-probe are both installed in this environment"


def test_no_warning_without_mindstudio_probe():
    r = _run([sys.executable, "-W", "error", "-c", "import msprobe"], ROOT)
    assert r.returncode == 0, r.stderr


def test_warns_in_an_environment_that_has_mindstudio_probe():
    """The real mindstudio-probe venv (tests/_realtool.py) with our package first on the path."""
    import _realtool  # tests/ is on sys.path for the files in it

    try:
        py = _realtool.real_tool_python("26.2.0")
    except _realtool.RealToolUnavailable as exc:  # a failure, as for every real-tool test (tests/conftest.py)
        pytest.fail(str(exc), pytrace=False)
    env = dict(_env(), PYTHONPATH=str(ROOT))
    r = subprocess.run([py, "-c", "import msprobe, os; print(os.path.dirname(msprobe.__file__))"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(ROOT / "msprobe")
    assert _WARN in r.stderr and "DistributionConflictWarning" in r.stderr
    assert "mindstudio_probe-26.2.0.dist-info" in r.stderr
    assert "Keep each in its own virtual environment" in r.stderr


def test_warns_when_mindstudio_probe_files_are_mixed_into_the_package(tmp_path):
    """After installing one over the other, the package folder holds files of both."""
    pkg = tmp_path / "msprobe"
    shutil.copytree(ROOT / "msprobe", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "msprobe.py").write_text("def main():\n    pass\n")  # mindstudio-probe's entry module
    env = dict(_env(), PYTHONPATH=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "msprobe", "--version"], capture_output=True, text=True, env=env,
                       timeout=120, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert _WARN in r.stderr and f"its files msprobe.py in {pkg}" in r.stderr
