"""Runs the MindSpore tests (ms_test_*.py next to this file) inside their own venv.

MindSpore 2.10.0 needs numpy<2, so its tests cannot run in the main environment: this test
creates (once) and reuses the cached venv of ms_venv.py, then runs pytest there with our
sources on PYTHONPATH and reports the result. For ms_test_conformance.py it also builds the venv
of the real mindstudio-probe 26.2.0 with MindSpore (``ms_venv.ensure_real_venv``) and names its
python in ``MSPROBE_TEST_MS_REAL_PYTHON``. A venv that cannot be created (no network to fetch the
MindSpore wheel) FAILS the test, with the reason: it never skips.
"""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Optional

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ROOT = os.path.dirname(ROOT)
sys.path.insert(0, HERE)
from ms_venv import ensure_real_venv, require_venv  # noqa: E402


@pytest.fixture(scope="module")
def ms_python():
    return require_venv()


@pytest.fixture(scope="module")
def ms_real_python(ms_python):
    py, why = ensure_real_venv()
    if py is None:
        pytest.fail(why, pytrace=False)
    return py


def _run_inner(py: str, *modules: str, env: Optional[dict] = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT, GLOG_v="3", PYTHONDONTWRITEBYTECODE="1", **(env or {}))
    cmd = [py, "-m", "pytest", "--noconftest", "-p", "no:cacheprovider", "-o", "python_files=ms_test_*.py",
           "-q", "-rfE", *[os.path.join(HERE, m) for m in modules]]
    return subprocess.run(cmd, cwd=HERE, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=1200)


@pytest.mark.parametrize("module", [pytest.param("ms_test_conformance.py", marks=pytest.mark.real_tool),
                                    "ms_test_features.py", "ms_test_graph.py",
                                    "ms_test_more.py", "ms_test_docs.py", "ms_test_apilist.py",
                                    "ms_test_adapter.py", "ms_test_observer.py"])
def test_mindspore_suite(ms_python, module, request):
    env = {}
    if module == "ms_test_conformance.py":  # its md5 test runs the real tool live
        env = {"MSPROBE_TEST_MS_REAL_PYTHON": request.getfixturevalue("ms_real_python")}
    if module == "ms_test_more.py":  # its s3 test dumps to this process's moto S3 server
        env = {"MSPROBE_TEST_S3_ENDPOINT": request.getfixturevalue("s3_server"),
               "MSPROBE_TEST_S3_URL": request.getfixturevalue("s3_bucket_url")}
    proc = _run_inner(ms_python, module, env=env)
    tail = proc.stdout[-6000:]
    print(tail)
    assert proc.returncode == 0, tail
    assert " passed" in tail and " failed" not in tail
    assert " skipped" not in tail.strip().splitlines()[-1], tail  # the s3 test ran against the server given to it
