"""API coverage, MindSpore: the APIs our MindSpore dumper wraps are, namespace by namespace, those
the installed real mindstudio-probe 26.2.0 lists (its own ``support_wrap_ops.yaml``, a data file of
the package, read from its venv), less exactly the names spec/PRODUCER.md section 20 lists as absent
from MindSpore 2.10.0, plus exactly the extras listed there.

That the absent names are absent, and that every name we list is a callable attribute of
MindSpore 2.10.0, is checked inside the MindSpore venv (mindspore/ms_test_apilist.py)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import _realtool  # noqa: E402
from gen_ms_api_list import NAMESPACES, REAL_LIST, real_names, spec_names  # noqa: E402

from msprobe.dumpers.apilist import load_api_list as _load  # noqa: E402

_OURS = os.path.join(ROOT, "msprobe", "dumpers", "mindspore", "support_wrap_ops.yaml")


def load_api_list() -> dict:
    return _load(_OURS)  # the file msprobe.dumpers.mindspore reads (that package needs MindSpore)

_FIND = ("import importlib.util, os; s = importlib.util.find_spec('msprobe'); "
         f"print(os.path.join(s.submodule_search_locations[0], *{REAL_LIST!r}))")


@pytest.fixture(scope="module")
def real_lists(real_tool):
    out = subprocess.run([real_tool, "-c", _FIND], capture_output=True, text=True, env=_realtool._clean_env(),
                         cwd=os.path.dirname(real_tool), timeout=300)
    path = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    assert out.returncode == 0 and os.path.isfile(path), (out.stdout, out.stderr[-1000:])
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def test_our_namespaces_are_the_generators():
    assert list(load_api_list()) == list(NAMESPACES)


@pytest.mark.real_tool
def test_the_real_tool_has_every_namespace(real_lists):
    assert {real_key for real_key, _, _ in NAMESPACES.values() if real_key is not None} == set(real_lists), \
        sorted(real_lists)


def test_a_namespace_the_real_tool_lacks_is_all_extras():
    """ops.communication (26.2.0 does not wrap it): every name we wrap there is a documented extra."""
    lists = load_api_list()
    extras = spec_names("extras")
    for ns, (real_key, _, _) in NAMESPACES.items():
        if real_key is None:
            assert lists[ns] and set(lists[ns]) == extras.get(ns, set()), ns


@pytest.mark.real_tool
@pytest.mark.parametrize("ns", list(NAMESPACES))
def test_wrapped_apis_are_the_real_tools_plus_documented_extras(real_lists, ns):
    ours_listed = load_api_list()[ns]
    ours = set(ours_listed)
    assert len(ours) == len(ours_listed), f"{ns}: listed twice: {sorted(n for n in ours if ours_listed.count(n) > 1)}"
    real = set(real_names(real_lists, ns))
    absent = spec_names("absent").get(ns, set())
    extras = spec_names("extras").get(ns, set())
    assert real - ours == absent, (f"{ns}: 26.2.0 lists these, we do not, and PRODUCER.md section 20 does not list "
                                   f"them as absent from MindSpore 2.10.0: {sorted(real - ours - absent)}; "
                                   f"listed there as absent but wrapped or not in 26.2.0's list: "
                                   f"{sorted(absent - (real - ours))}")
    assert ours - real == extras, (f"{ns}: wrapped beyond 26.2.0 but not in PRODUCER.md section 20: "
                                   f"{sorted(ours - real - extras)}; listed there but not wrapped or wrapped "
                                   f"by 26.2.0 too: {sorted(extras - (ours - real))}")


@pytest.mark.real_tool
def test_our_order_is_the_real_tools(real_lists):
    """The generated file keeps 26.2.0's order (extras last), so a regeneration diff is readable."""
    lists = load_api_list()
    for ns in NAMESPACES:
        extras = spec_names("extras").get(ns, set())
        ours = [n for n in lists[ns] if n not in extras]
        assert ours == [n for n in real_names(real_lists, ns) if n in set(ours)], ns
