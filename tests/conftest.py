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


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Keep ``--dist loadgroup``'s groups (scripts/test.sh): pytest-xdist (3.8) marks a test's
    ``xdist_group`` by appending ``@group`` to the item's ``_nodeid``, which pytest 9 no longer
    reads (a node's id lives in ``_id``); without this every group is spread over the workers, and
    a module's fixture of 38 gloo runs (test_layouts_megatron.py) was dumped once per worker. Runs
    after xdist's hook (trylast); nothing to do where xdist's suffix is already the id."""
    if not getattr(config.option, "loadgroup", False):  # set on an xdist worker under --dist loadgroup
        return
    for item in items:
        written = item.__dict__.get("_nodeid")
        if written and written != item.nodeid:  # pytest 9 (before it, xdist's ``_nodeid`` is the id)
            from _pytest.nodeid import NodeId  # pytest 9's id type: the one way to set the id

            item._id = NodeId.parse(written)


# --- the real tool (mindstudio-probe) in its cached venv: built by the test run, never skipped ---

_SUMMARY: dict = {}  # outcome counts of the real_tool / real_fixture tests (controller side under xdist)


def pytest_configure(config):
    config.addinivalue_line("markers", "real_tool: runs the real msprobe (mindstudio-probe) in its venv")
    config.addinivalue_line("markers", "real_fixture: compares our dump with a committed real-tool dump")


def _real_venv(version: str) -> str:
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _realtool

    try:
        return _realtool.real_tool_python(version)
    except _realtool.RealToolUnavailable as exc:  # a failure, not a skip: conformance must be checked
        pytest.fail(f"the real mindstudio-probe {version} venv cannot be built: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def real_tool():
    """The python of the real mindstudio-probe 26.2.0 venv (built on first use; failure fails the test)."""
    return _real_venv("26.2.0")


@pytest.fixture(scope="session")
def real_tool_8():
    """The python of the real mindstudio-probe 8.1.1 venv (built on first use; failure fails the test)."""
    return _real_venv("8.1.1")


@pytest.fixture(scope="session")
def real_tool_1():
    """The python of the real mindstudio-probe 1.1.1 venv (2024; built on first use; failure fails the test)."""
    return _real_venv("1.1.1")


def pytest_runtest_logreport(report):
    """Count the tests marked real_tool / real_fixture by outcome (reports come back from xdist workers)."""
    kinds = [k for k in ("real_tool", "real_fixture") if k in report.keywords]
    if not kinds or (report.when != "call" and not (report.when == "setup" and report.outcome != "passed")):
        return
    counts = _SUMMARY.setdefault("counts", {})
    xfail = report.outcome == "skipped" and hasattr(report, "wasxfail")  # pytest reports an xfail as skipped
    outcome = "xfailed" if xfail else report.outcome
    for kind in kinds:
        c = counts.setdefault(kind, {"passed": 0, "failed": 0, "skipped": 0, "xfailed": 0})
        c[outcome] = c.get(outcome, 0) + 1


def pytest_terminal_summary(terminalreporter):
    counts = _SUMMARY.get("counts", {})
    if not counts:
        return
    labels = {"real_tool": "comparisons run live against the real msprobe",
              "real_fixture": "comparisons against committed real-msprobe dumps"}
    terminalreporter.section("real-tool conformance")
    for kind in ("real_tool", "real_fixture"):
        c = counts.get(kind)
        if c:
            ran = c["passed"] + c["failed"]
            terminalreporter.write_line(f"{labels[kind]}: {ran} ran ({c['passed']} passed, {c['failed']} failed), "
                                        f"{c['skipped']} skipped, {c['xfailed']} expected to fail (xfail)")
