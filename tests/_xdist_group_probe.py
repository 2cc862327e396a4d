"""Run by tests/test_suite_groups.py under ``-n 2 --dist loadgroup`` (not collected by the suite: no
``test_`` prefix): twelve tests of one ``xdist_group`` sharing a module fixture, which writes the
worker that built it into the file named by MSPROBE_GROUP_PROBE."""
import os

import pytest

pytestmark = pytest.mark.xdist_group("probe")


@pytest.fixture(scope="module")
def built():
    with open(os.environ["MSPROBE_GROUP_PROBE"], "a") as f:
        f.write(os.environ.get("PYTEST_XDIST_WORKER", "none") + "\n")


@pytest.mark.parametrize("i", range(12))
def test_in_the_group(built, i):
    pass
