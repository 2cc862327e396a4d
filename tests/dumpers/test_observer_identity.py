"""A module's output that is a tensor 26.2.0's identity nodes would have given a life of its own (an input
returned unchanged, an output used as it is by ``.to()`` or in place), on small plain-PyTorch models
(tests/fixtures/real/scripts/identity_zoo.py), dumped LIVE by the real msprobe 26.2.0 and by ours and
compared as the wild zoo compares (tests/dumpers/test_wild_zoo.py): the same records in the same order,
statistics within 1e-5. Ours adds no autograd node (spec/PRODUCER.md §20 item 43 (a), (c)), so these
records come from observation alone: the users of a returned input inside the calling module, the
queue of completed calls, the outputs' gradients handed to the APIs that use them unchanged."""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import sys

import pytest

pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_wild_zoo as wild  # noqa: E402
import zoo_compare as zoo  # noqa: E402

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


# --- where 26.2.0's identity nodes change which code runs (spec/PRODUCER.md §20 item 47) ---
#: model -> the argument places of its nn.MultiheadAttention calls that hold one tensor: self-attention (h, h, h),
#: a pooling head (probe, h, h). 26.2.0's identity node on the module's inputs hands each place a tensor of its own
BRANCH_MODELS = {"encoder": (0, 1, 2), "mha": (0, 1, 2), "pool": (1, 2)}
#: the nn.MultiheadAttention calls per step
MHA_CALLS = {"encoder": 2, "mha": 1, "pool": 1}
_TRANSPOSE = re.compile(r"^Tensor\.transpose\.(\d+)\.(forward|backward)$")
_MHA_API = re.compile(r"^Functional\.multi_head_attention_forward\.\d+\.forward$")
_MHA_MODULE = re.compile(r"^Module\..*\.MultiheadAttention\.(forward|backward)\.\d+$")


def unpacked_path(ours_root: str, out_root: str, shared: tuple) -> dict:
    """Our dump (``ours_root``) rewritten as the run that takes nn.MultiheadAttention's unpacked path writes it,
    into ``out_root``: 26.2.0's. With one tensor at the ``shared`` places, MultiheadAttention.forward
    (batch_first) transposes it once (``query is key is value``: ``query = key = value = query.transpose(1, 0)``;
    ``key is value``: the key once, the value is the key); given distinct tensors it transposes each, so the last
    input transpose before each ``multi_head_attention_forward`` call is there once per shared place (the same
    tensor: the same forward record, and a backward record each, in the reverse order); the transposes are
    numbered again. The module's backward record has our whole gradient at the first shared place and null at
    the others (checked here); 26.2.0 has each place's part there: the entry of the first place is copied (its
    values are past the perturbation, not compared). Returns the counts of records added and entries filled."""
    shutil.copytree(ours_root, out_root)
    added = filled = 0
    for path in sorted(glob.glob(os.path.join(out_root, "step*", "*", "dump.json"))):
        with open(path) as f:
            doc = json.load(f)
        construct_path = os.path.join(os.path.dirname(path), "construct.json")
        with open(construct_path) as f:
            construct = json.load(f)
        names = list(doc["data"])
        copies: dict = {}  # our transpose counter -> how many records 26.2.0 has of it
        for i, name in enumerate(names):
            if _MHA_API.match(name):
                last = _TRANSPOSE.match(names[i - 1])
                assert last and last.group(2) == "forward", names[i - 3:i + 1]
                copies[int(last.group(1))] = len(shared)
        data: dict = {}
        parents: dict = {}
        number: dict = {}  # (our counter, copy) -> 26.2.0's counter, in forward order
        for name in names:
            match = _TRANSPOSE.match(name)
            if not match:
                data[name] = doc["data"][name]
                if name in construct:
                    parents[name] = construct[name]
                continue
            ours, direction = int(match.group(1)), match.group(2)
            n = copies.get(ours, 1)
            order = range(n) if direction == "forward" else reversed(range(n))
            for copy in order:
                if direction == "forward":
                    number[ours, copy] = len(number)
                new = f"Tensor.transpose.{number[ours, copy]}.{direction}"
                data[new] = doc["data"][name]
                if name in construct:
                    parents[new] = construct[name]
            added += n - 1
        for name, rec in data.items():
            if _MHA_MODULE.match(name) and ".backward." in name:
                grads = rec["output"]
                assert all(grads[place] is None for place in shared[1:]), (name, grads)  # ours: the whole at the first
                assert grads[shared[0]] is not None, (name, grads)
                for place in shared[1:]:
                    grads[place] = grads[shared[0]]
                    filled += 1
        doc["data"] = data
        with open(path, "w") as f:
            json.dump(doc, f)
        with open(construct_path, "w") as f:
            json.dump(parents, f)
    return {"added": added, "filled": filled}


def _branch_starts(name: str) -> bool:
    """The first record of the code the unpacked path runs otherwise (its projections: the attention call's
    output, the module's forward record at L0), or a backward record: 26.2.0's perturbation reaches it."""
    return zoo.is_backward(name) or bool(_MHA_API.match(name) or _MHA_MODULE.match(name))


@pytest.mark.real_tool
@pytest.mark.parametrize("model", sorted(BRANCH_MODELS))
@pytest.mark.parametrize("cfg", ["mix", "L0"])
def test_attention_path_as_real_msprobe_26(tmp_path, real_tool, model, cfg):
    """nn.MultiheadAttention given one tensor at several places (self-attention, so every
    nn.TransformerEncoderLayer; a pooling head's key and value): ours records the packed path the training
    runs, 26.2.0 the unpacked one its identity nodes send it down (spec/PRODUCER.md §20 item 47). 26.2.0's
    records are ours rewritten as that path writes them (unpacked_path), and nothing else: the same records,
    encodings, construct parents, and values up to the first record of the other path."""
    real_root = wild.run_tool(real_tool, str(tmp_path / "real"), model, cfg, ours=False, script=SCRIPT)
    ours_root = wild.run_tool(sys.executable, str(tmp_path / "ours"), model, cfg, ours=True, script=SCRIPT)
    shared = BRANCH_MODELS[model]
    counts = unpacked_path(ours_root, str(tmp_path / "expected"), shared)
    steps, extra = 2, len(shared) - 1  # per call: that many more transposes forward and as many backward
    assert counts == {"added": steps * MHA_CALLS[model] * 2 * extra if cfg == "mix" else 0,
                      "filled": steps * MHA_CALLS[model] * extra}, counts
    fig = wild.compare_runs(real_root, str(tmp_path / "expected"), model, starts=_branch_starts)
    assert not fig["problems"], fig["problems"][:20]
    assert fig["records"] > 30 and fig["equal"] == fig["records"], fig
    assert fig["values"] > 20, fig  # (the records before the attention: the embedding block's, compared exactly)
    # the difference is that path and no other: ours as it is differs from 26.2.0's
    assert wild.compare_runs(real_root, ours_root, model, starts=_branch_starts)["problems"]
