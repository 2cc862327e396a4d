"""A module's output that is a tensor 26.2.0's identity nodes would have given a life of its own (an input
returned unchanged, an output used as it is by ``.to()`` or in place), on small plain-PyTorch models
(tests/fixtures/real/scripts/identity_zoo.py), dumped LIVE by the real msprobe 26.2.0 and by ours and
compared as the wild zoo compares (tests/dumpers/test_wild_zoo.py): the same records in the same order,
statistics within 1e-5. Ours adds no autograd node (spec/PRODUCER.md §20 item 43 (a), (c)), so these
records come from observation alone: the users of a returned input inside the calling module, the
queue of completed calls, the outputs' gradients handed to the APIs that use them unchanged."""
from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_wild_zoo as wild  # noqa: E402

SCRIPT = os.path.join(wild.REAL, "scripts", "identity_zoo.py")
MODELS = ["pooler", "embed", "shortcut", "shared", "router", "chain", "top", "shape"]


@pytest.mark.real_tool
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("cfg", ["mix", "L0", "md5"])
def test_identity_records_as_real_msprobe_26(tmp_path, real_tool, model, cfg):
    real_root = wild.run_tool(real_tool, str(tmp_path / "real"), model, cfg, ours=False, script=SCRIPT)
    ours_root = wild.run_tool(sys.executable, str(tmp_path / "ours"), model, cfg, ours=True, script=SCRIPT)
    fig = wild.compare_runs(real_root, ours_root, model)
    assert not fig["problems"], fig["problems"][:20]
    assert fig["records"] > 10 and fig["equal"] == fig["records"]
    # the module backward records 26.2.0 does not write are only those of item 10 (an output changed in
    # place: the shortcut model's Sequential and its last Linear), not a module whose input's gradient
    # never reaches it (the shape model's positions)
    assert fig["module_backward_kept"] == (4 if model == "shortcut" else 0), fig
