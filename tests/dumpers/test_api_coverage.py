"""API coverage: the APIs our PyTorch dumper wraps are, namespace by namespace, those the installed
real mindstudio-probe 26.2.0 wraps (its own ``support_wrap_ops.yaml``, as far as the names exist in
this torch), plus exactly the extras spec/PRODUCER.md section 20 lists with their reasons."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
yaml = pytest.importorskip("yaml")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import _realtool  # noqa: E402
from gen_api_list import NAMESPACES, NOT_INSTALLED, exists, torch_npu_public  # noqa: E402

from msprobe.dumpers.pytorch._apis import load_api_list  # noqa: E402

_FIND = ("import importlib.util, os; s = importlib.util.find_spec('msprobe'); "
         "print(os.path.join(s.submodule_search_locations[0], 'pytorch', 'dump', 'api_dump', "
         "'support_wrap_ops.yaml'))")


def spec_extras(framework: str) -> dict:
    """namespace -> names, from the api-extras block of spec/PRODUCER.md section 20."""
    with open(os.path.join(ROOT, "spec", "PRODUCER.md"), encoding="utf-8") as f:
        text = f.read()
    block = re.search(rf"<!-- BEGIN api-extras {framework} -->(.*?)<!-- END api-extras -->", text, re.S)
    assert block, f"spec/PRODUCER.md section 20 has no api-extras block for {framework}"
    out: dict = {}
    for ns, name in re.findall(r"`(\w+)\.([\w.]+)`", block.group(1)):
        out.setdefault(ns, set()).add(name)
    return out


@pytest.fixture(scope="module")
def real_lists(real_tool):
    out = subprocess.run([real_tool, "-c", _FIND], capture_output=True, text=True, env=_realtool._clean_env(),
                         cwd=os.path.dirname(real_tool), timeout=300)
    path = out.stdout.strip().splitlines()[-1]
    assert out.returncode == 0 and os.path.isfile(path), (out.stdout, out.stderr[-1000:])
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


@pytest.mark.real_tool
@pytest.mark.parametrize("ns", [*NAMESPACES, "npu"])
def test_wrapped_apis_are_the_real_tools_plus_documented_extras(real_lists, ns):
    ours_listed = set(load_api_list()[ns])
    extras = spec_extras("pytorch").get(ns, set())
    if ns == "npu":  # torch_npu is not installed: its 2.13.0 exports (scripts/data/torch_npu_ops.txt)
        public = torch_npu_public()
        real = {n for n in real_lists["torch_npu"] if n in public}
        ours = ours_listed
    else:
        real_key, objs = NAMESPACES[ns]
        real = set() if ns in NOT_INSTALLED else {n for n in real_lists.get(real_key) or [] if exists(objs, n)}
        ours = {n for n in ours_listed if exists(objs, n)}
        assert ours == ours_listed, f"listed but absent from torch {torch.__version__}: {sorted(ours_listed - ours)}"
    assert not real - ours, f"{ns}: 26.2.0 wraps these, we do not: {sorted(real - ours)}"
    assert ours - real == extras, (f"{ns}: wrapped beyond 26.2.0 but not in PRODUCER.md section 20: "
                                   f"{sorted(ours - real - extras)}; listed there but not wrapped or wrapped "
                                   f"by 26.2.0 too: {sorted(extras - (ours - real))}")


def test_every_documented_extra_namespace_is_ours():
    assert set(spec_extras("pytorch")) <= set(load_api_list())
