"""The MindSpore API list against the installed MindSpore 2.10.0 (runs in the MindSpore venv).

tests/dumpers/test_ms_api_coverage.py compares our lists with the real tool's, up to the names
spec/PRODUCER.md section 20 lists as absent from MindSpore 2.10.0; here every name we list must be a
callable attribute of MindSpore 2.10.0 and every name listed as absent must not be one."""
from __future__ import annotations

import os
import sys

import mindspore
import numpy as np
import pytest
from mindspore import Tensor, ops
from ms_common import ROOT, pynative, read_doc  # noqa: F401 - pynative: the fixture

sys.path.insert(0, os.path.join(ROOT, "scripts"))
from gen_ms_api_list import NAMESPACES, exists, spec_names, target

from msprobe.dumpers.mindspore._apis import load_api_list, namespaces
from msprobe.mindspore import PrecisionDebugger


def test_the_pinned_mindspore():
    assert mindspore.__version__ == "2.10.0"


@pytest.mark.parametrize("ns", list(NAMESPACES))
def test_every_listed_name_is_a_callable_attribute(ns):
    missing = [n for n in load_api_list()[ns] if not exists(target(ns), n)]
    assert not missing, f"{ns}: not callable attributes of mindspore {mindspore.__version__}: {missing}"


@pytest.mark.parametrize("ns", list(NAMESPACES))
def test_the_names_listed_as_absent_are_absent(ns):
    present = sorted(n for n in spec_names("absent").get(ns, ()) if exists(target(ns), n))
    assert not present, f"{ns}: PRODUCER.md section 20 lists these as absent, mindspore has them: {present}"


def test_the_dumper_wraps_the_generators_namespaces():
    ours = namespaces()
    assert list(ours) == list(NAMESPACES)
    for key, (_, prefix, _) in NAMESPACES.items():
        assert ours[key][0] == prefix and ours[key][1] == [target(key)], key


pytestmark = pytest.mark.usefixtures("pynative")


def test_records_are_the_real_lists(tmp_path):
    """Examples of the difference the list makes: 26.2.0 records ``Tensor.to`` (documented),
    ``Tensor.__bool__``, ``Functional.is_tensor`` and ``Functional.quant_matmul`` (its dotted
    ``auto_generate.quant_matmul``), not ``Tensor.astype`` (its list's entry ``bool astype``
    names neither), ``Tensor.expand_dims`` or ``Functional.floor_divide``."""
    root = str(tmp_path / "d")
    dbg = PrecisionDebugger(task="statistics", dump_path=root, level="L1")
    x = Tensor(np.array([[1.0, -2.0, 3.0], [0.5, 4.0, -1.0]], np.float32))
    dbg.start()
    y = x.to(mindspore.float16)
    z = x.astype(mindspore.float16)
    c = ops.floor_divide(x.expand_dims(0), 2.0)
    t = ops.is_tensor(x)
    b = bool(x[0, 0] > 0)
    dbg.stop()
    dbg.step()
    data = read_doc(root)["data"]
    assert y.dtype == z.dtype == mindspore.float16 and c.shape == (1, 2, 3) and t and b
    for name in ("Tensor.to.0.forward", "Functional.is_tensor.0.forward", "Tensor.__bool__.0.forward",
                 "Tensor.__gt__.0.forward"):
        assert name in data, (name, sorted(data))
    assert not [k for k in data if k.startswith(("Tensor.astype.", "Tensor.bool.", "Tensor.expand_dims.",
                                                    "Functional.floor_divide."))], sorted(data)
    assert data["Tensor.to.0.forward"]["output"][0]["dtype"] == "Float16"
