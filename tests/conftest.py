import os

import pytest

pytest_plugins = ["tests.conftest_s3"]

_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@pytest.fixture(autouse=True)
def _restore_thread_env():
    """Dask's nanny sets OMP_NUM_THREADS & co. in the parent's os.environ; keep that from leaking
    into the subprocesses of later tests in the same worker (it changes CPU reduction results)."""
    saved = {k: os.environ.get(k) for k in _THREAD_VARS}
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture()
def fresh_debugger():
    """A PrecisionDebugger singleton reset before and after the test (modules opt in with
    ``pytestmark = pytest.mark.usefixtures("fresh_debugger")``; torch is imported only then)."""
    from msprobe.pytorch import PrecisionDebugger

    PrecisionDebugger._reset()
    yield PrecisionDebugger
    PrecisionDebugger._reset()
