"""Generate the conformance vectors and golden dumps of spec/FORMAT.md (format 1.0).

    python spec/vectors/generate.py [--out SPEC_DIR]

Writes, under SPEC_DIR (default: the spec/ directory holding this script):

* ``vectors/valid/<doc>--<case>.json`` and ``vectors/invalid/<doc>--<case>.json``:
  documents made by mutating a minimal template, one change each (the approach of
  GeoParquet's ``test_json_schema.py``). ``<doc>`` is ``dump``, ``debug``, ``stack``,
  ``construct`` or ``msprobe_lake``. Every validator must accept the valid ones and
  reject the invalid ones.
* ``vectors/names.json``: record names and data names, valid (with their parsed fields)
  and invalid (with the reason).
* ``golden/<name>/``: tiny complete dumps, each with ``expected.json`` holding the
  tensors' values, statistics and CRC-32 in readable form.

Deterministic and self-contained: the standard library plus numpy (for the ``.npy``
tensor files), no msprobe import — the statistics here are computed independently of
``msprobe/format/stats.py`` so the tests cross-check the two. Tensor values come from
closed formulas, not from a random generator, so they are the same on every platform.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import shutil
import sys
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
FORMAT_VERSION = "1.0"
PRODUCER = "msprobe-lake spec/vectors/generate.py"


def dumps(obj) -> str:
    """The real tool's serialization: json.dump(obj, f, indent=1), no trailing newline."""
    return json.dumps(obj, indent=1)


def write_text(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="ascii", newline="\n") as f:
        f.write(text)


# --------------------------------------------------------------------------------------
# building blocks


def tensor(dtype="torch.float32", shape=(2, 3), stats=(1.5, -1.0, 0.25, 2.5), requires_grad=False, **extra):
    e = {"type": "torch.Tensor", "dtype": dtype, "shape": list(shape) if isinstance(shape, tuple) else shape}
    if stats is not None:
        e["Max"], e["Min"], e["Mean"], e["Norm"] = stats
    if requires_grad is not None:
        e["requires_grad"] = requires_grad
    e.update(extra)
    return e


def ms_tensor(dtype="Float32", shape=(2, 3), stats=(1.5, -1.0, 0.25, 2.5), **extra):
    e = {"type": "mindspore.Tensor", "dtype": dtype, "shape": list(shape)}
    e["Max"], e["Min"], e["Mean"], e["Norm"] = stats
    e.update(extra)
    return e


def typed(t, v, key="value"):
    return {"type": t, key: v}


API = "Functional.relu.0.forward"


def dump_template():
    return {
        "task": "statistics",
        "level": "L1",
        "framework": "pytorch",
        "dump_data_dir": None,
        "data": {
            API: {
                "input_args": [tensor(requires_grad=True)],
                "input_kwargs": {},
                "output": [tensor(stats=(1.5, 0.0, 0.5, 2.0), requires_grad=True)],
            }
        },
    }


def with_record(name, value, **top):
    d = dump_template()
    d["data"][name] = value
    d.update(top)
    return d


def with_arg(arg, section="input_args"):
    d = dump_template()
    rec = d["data"][API]
    if section == "input_kwargs":
        rec["input_kwargs"] = {"x": arg}
    else:
        rec[section].append(arg)
    return d


def with_tensor_change(**change):
    d = dump_template()
    t = d["data"][API]["input_args"][0]
    for k, v in change.items():
        if v is _DELETE:
            del t[k]
        else:
            t[k] = v
    return d


_DELETE = object()


def debug_template():
    return {
        "task": "statistics",
        "level": "debug",
        "framework": "pytorch",
        "dump_data_dir": None,
        "data": {"logits.0.debug": tensor(requires_grad=True)},
    }


def stack_template():
    return {
        "0": [
            [API, "Functional.relu.1.forward"],
            ["File /work/train.py, line 12, in forward, \n y = F.relu(x)",
             "File /work/train.py, line 30, in <module>, \n out = net(x)"],
        ]
    }


def construct_template():
    return {
        "Module.fc.Linear.forward.0": None,
        API: "Module.fc.Linear.forward.0",
    }


def marker_template():
    return {"format_version": FORMAT_VERSION, "dialect": "msprobe-lake", "producer": PRODUCER}


# --------------------------------------------------------------------------------------
# schema vectors: (doc, case) -> document


def valid_vectors():
    v = {}
    # dump.json
    v["dump", "minimal"] = dump_template()
    v["dump", "empty-data"] = {**dump_template(), "data": {}}
    v["dump", "only-data"] = {"data": dump_template()["data"]}
    d = dump_template()
    d.update(task=None, level=None, framework=None)
    v["dump", "null-header"] = d
    v["dump", "unknown-top-key"] = {**dump_template(), "x_future_key": {"anything": [1, 2]}}
    v["dump", "tensor-unknown-keys"] = with_tensor_change(is_nan=False, layout={"Device Matrix": [2, 1]})
    d = with_tensor_change(data_name=API + ".input.0.pt")
    d["task"], d["dump_data_dir"] = "tensor", "/dump/step0/rank/dump_tensor_data"
    v["dump", "tensor-data-name"] = d
    v["dump", "tensor-md5"] = with_tensor_change(md5="1a2b3c4d")
    v["dump", "tensor-md5-null"] = with_tensor_change(md5=None)
    v["dump", "xor-0d-value"] = with_arg({"type": "torch.Tensor", "dtype": "torch.float32", "shape": [],
                                          "md5": 1.723590612411499, "requires_grad": True})
    v["dump", "tensor-data-name-null"] = with_tensor_change(data_name=None)
    v["dump", "tensor-requires-grad-null"] = with_tensor_change(requires_grad=None)
    v["dump", "tensor-no-requires-grad"] = with_tensor_change(requires_grad=_DELETE)
    v["dump", "xor-no-stats"] = with_tensor_change(Max=_DELETE, Min=_DELETE, Mean=_DELETE, Norm=_DELETE,
                                                 md5="0x00000000deadbeef")
    v["dump", "tensor-empty"] = with_arg(tensor(shape=(0, 3), stats=(None, None, None, None)))
    v["dump", "tensor-0d"] = with_arg(tensor(shape=(), stats=(-2.0, -2.0, -2.0, -2.0)))
    v["dump", "tensor-bool"] = with_arg(tensor(dtype="torch.bool", stats=(True, False, None, None)))
    v["dump", "tensor-int"] = with_arg(tensor(dtype="torch.int64", stats=(7, -3, None, None)))
    v["dump", "tensor-nan-inf"] = with_arg(tensor(stats=(math.nan, -math.inf, math.nan, math.inf)))
    v["dump", "tensor-parameter-type"] = with_arg(tensor(dtype="torch.float32") | {
        "type": "torch.nn.parameter.Parameter"})
    v["dump", "numpy-ndarray"] = with_arg({"type": "numpy.ndarray", "dtype": "float32", "shape": [2],
                                           "Max": 1.0, "Min": 0.0, "Mean": 0.5, "Norm": 1.0})
    v["dump", "mindspore-tensor"] = {**dump_template(), "framework": "mindspore", "data": {
        "Mint.add.0.forward": {"input_args": [ms_tensor(), ms_tensor("Int32", (4,), (3.0, 0.0, 1.5, 3.7416574954986572))],
                               "input_kwargs": {}, "output": [ms_tensor()]}}}
    v["dump", "scalars"] = with_arg([typed("int", 3), typed("float", 0.5), typed("bool", True), typed("str", "mean"),
                                     typed("complex", [1.0, -2.0]), typed("float", math.inf)])
    v["dump", "none-arg"] = with_arg(None)
    v["dump", "slice"] = with_arg(typed("slice", [None, 2, None]))
    v["dump", "ellipsis"] = with_arg(typed("ellipsis", "..."))
    v["dump", "torch-dtype"] = with_arg(typed("torch.dtype", "torch.float16"), "input_kwargs")
    v["dump", "torch-device"] = with_arg(typed("torch.device", "cpu"), "input_kwargs")
    v["dump", "torch-size"] = with_arg(typed("torch.Size", [2, 3]))
    v["dump", "memory-format"] = with_arg(typed("torch.memory_format", "contiguous_format", key="format"),
                                          "input_kwargs")
    v["dump", "reduce-op"] = with_arg(typed("torch.distributed.ReduceOp", "RedOpType.SUM"))
    v["dump", "process-group"] = with_arg({"type": "torch.ProcessGroup", "group_ranks": [0, 1],
                                           "group_id": "8a1bc3f0"})
    v["dump", "numpy-scalar"] = with_arg(typed("float32", 0.25))
    v["dump", "mindspore-dtype"] = with_arg(typed("mindspore.dtype", "Float32"), "input_kwargs")
    v["dump", "p2pop"] = with_arg({"class_type": "torch.distributed.P2POp", "tensor": tensor(), "op": "isend",
                                   "peer": 1, "tag": 0})
    v["dump", "nested"] = with_arg([[tensor(), None, [typed("int", 1), {"k": tensor()}]], {"a": {"b": [tensor()]}}])
    v["dump", "empty-object-arg"] = with_arg({})
    v["dump", "unknown-typed-value"] = with_arg({"type": "some.Future", "payload": [1, 2, 3]})
    v["dump", "unknown-nonstring-type"] = with_arg({"type": 5, "value": 1})
    v["dump", "bare-number-arg"] = with_arg(42)
    v["dump", "output-single"] = with_record("Torch.sum.0.forward", {"input_args": [tensor()], "input_kwargs": {},
                                                                      "output": tensor(shape=())})
    v["dump", "backward-record"] = with_record("Functional.relu.0.backward", {"input": [tensor()],
                                                                               "output": [tensor()]})
    v["dump", "module-records"] = {**dump_template(), "level": "L0", "data": {
        "Module.fc.Linear.forward.0": {"input_args": [tensor()], "input_kwargs": {}, "output": [tensor()],
                                       "parameters": {"weight": tensor(), "bias": tensor(shape=(4,))}},
        "Module.fc.Linear.parameters_grad": {"weight": [tensor()], "bias": [tensor(shape=(4,))]},
        "Module.fc.Linear.backward.0": {"input": [tensor()], "output": [tensor()]},
    }}
    v["dump", "module-list-index"] = with_record("Module.0.layers.1.Linear.forward.2", {"input_args": []})
    v["dump", "parameters-grad-bare-tensor"] = with_record("Module.fc.Linear.parameters_grad",
                                                           {"weight": tensor(), "bias": tensor(shape=(4,))})
    v["dump", "parameters-grad-26x"] = with_record("Module.fc.Linear.parameters_grad.0", {"bias": [tensor()],
                                                                                        "weight": [tensor()]})
    v["dump", "parameters-grad-null"] = with_record("Cell.fc.Dense.parameters_grad", {"weight": None})
    v["dump", "primitive-api"] = with_record("Primitive.conv2d.Conv2D.0.forward", {"input_args": [ms_tensor()]})
    v["dump", "aten-overload"] = with_record("Aten.add.Tensor.0.forward", {"input_args": [tensor()]})
    v["dump", "unknown-prefix"] = with_record("Custom.fused_op.0.forward", {"input_args": []})
    v["dump", "is-recompute"] = with_record("Torch.matmul.0.forward", {"input_args": [], "input_kwargs": {},
                                                                        "output": [], "is_recompute": False})
    v["dump", "empty-record"] = with_record("Tensor.__add__.3.forward", {})
    v["dump", "debug-level"] = debug_template() | {"level": "debug"}
    # debug.json
    v["debug", "minimal"] = debug_template()
    d = debug_template()
    d["data"]["info.0.debug"] = {"n_tok": tensor(dtype="torch.int64", shape=(2,), stats=(5, 3, None, None)),
                                 "flag": tensor(dtype="torch.bool", shape=(), stats=(True, True, None, None)),
                                 "scale": typed("float", 0.5), "name": typed("str", "x")}
    d["data"]["items.0.debug"] = [tensor(), [tensor(dtype="torch.int64", stats=(1, 1, None, None)), None],
                                  typed("int", 3)]
    d["data"]["logits_grad.0.debug"] = tensor()
    v["debug", "nested-values"] = d
    v["debug", "empty-data"] = {**debug_template(), "data": {}}
    d = debug_template()
    d["task"], d["dump_data_dir"] = "tensor", "/dump/step0/rank/dump_tensor_data"
    d["data"]["logits.0.debug"]["data_name"] = "logits.0.debug.pt"
    v["debug", "tensor"] = d
    v["debug", "name-with-dots"] = {**debug_template(), "data": {"model.layer1.out.2.debug": tensor()}}
    # stack.json
    v["stack", "minimal"] = stack_template()
    v["stack", "empty"] = {}
    v["stack", "legacy-name-to-frames"] = {API: ["File /work/train.py, line 12, in forward, \n y = F.relu(x)"]}
    v["stack", "legacy-string-and-null"] = {API: "File /work/train.py, line 12", "Functional.relu.1.forward": None}
    v["stack", "empty-frames"] = {"0": [[API], []]}
    v["stack", "non-ascii-frame"] = {"0": [[API], ["File /work/\u8bad\u7ec3.py, line 1, in <module>, \n x = 1"]]}
    # construct.json
    v["construct", "minimal"] = construct_template()
    v["construct", "empty-l1"] = {}
    v["construct", "micro-step-list"] = {API: ["Module.fc.Linear.forward.0", 0]}
    # msprobe_lake.json
    v["msprobe_lake", "minimal"] = marker_template()
    v["msprobe_lake", "required-only"] = {"format_version": "1.0", "dialect": "msprobe-lake"}
    v["msprobe_lake", "full"] = marker_template() | {"framework": "pytorch", "task": "tensor", "level": "mix",
                                                     "summary_mode": "statistics", "tensor_format": "pt"}
    v["msprobe_lake", "future-minor"] = marker_template() | {"format_version": "1.7", "x_future": True}
    v["msprobe_lake", "other-dialect"] = marker_template() | {"dialect": "msprobe-26"}
    v["msprobe_lake", "typed"] = marker_template() | {"step": 3, "rank": None, "records": 12, "complete": True,
                                                      "final": True, "pid": 4242, "document_crc32": "0a1b2c3d",
                                                      "files": {"Functional.relu.0.forward.input.0.pt":
                                                                [1234, "89abcdef"]}}
    v["msprobe_lake", "files-entry-ignored"] = marker_template() | {"files": {"x.pt": "not a pair"}}
    return v


def invalid_vectors():
    v = {}
    # dump.json: document structure
    v["dump", "not-an-object"] = [dump_template()]
    v["dump", "missing-data"] = {k: val for k, val in dump_template().items() if k != "data"}
    v["dump", "data-not-object"] = {**dump_template(), "data": [dump_template()["data"]]}
    v["dump", "task-not-string"] = {**dump_template(), "task": 1}
    v["dump", "level-not-string"] = {**dump_template(), "level": ["L1"]}
    v["dump", "framework-not-string"] = {**dump_template(), "framework": True}
    v["dump", "dump-data-dir-not-string"] = {**dump_template(), "dump_data_dir": 0}
    # record names
    for case, name in [
        ("name-no-count", "Functional.relu.forward"),
        ("name-bad-direction", "Functional.relu.0.sideways"),
        ("name-module-without-path", "Module.Linear.forward.0"),
        ("name-module-api-order", "Module.fc.0.forward"),
        ("name-empty-segment", "Functional..relu.0.forward"),
        ("name-slash", "Functional/relu.0.forward"),
        ("name-backslash", "Functional.relu\\x.0.forward"),
        ("name-dotdot-traversal", "../../etc.0.debug"),
        ("name-whitespace", "Functional.re lu.0.forward"),
        ("name-leading-dot", ".Functional.relu.0.forward"),
        ("name-nul", "Functional.relu\u0000.0.forward"),
        ("name-newline", "x\n.0.debug"),
        ("name-empty", ""),
    ]:
        v["dump", case] = with_record(name, {"input_args": []})
    v["dump", "record-not-object"] = with_record("Torch.sum.0.forward", [tensor()])
    v["dump", "module-record-not-object"] = with_record("Module.fc.Linear.forward.0", "oops")
    # tensor entries
    v["dump", "tensor-missing-dtype"] = with_tensor_change(dtype=_DELETE)
    v["dump", "tensor-dtype-not-string"] = with_tensor_change(dtype=7)
    v["dump", "tensor-missing-shape"] = with_tensor_change(shape=_DELETE)
    v["dump", "tensor-shape-not-list"] = with_tensor_change(shape="2,3")
    v["dump", "tensor-shape-negative"] = with_tensor_change(shape=[2, -1])
    v["dump", "tensor-shape-bool"] = with_tensor_change(shape=[True])
    v["dump", "tensor-shape-fraction"] = with_tensor_change(shape=[2.5])
    v["dump", "tensor-shape-nested"] = with_tensor_change(shape=[[2]])
    v["dump", "tensor-stat-string"] = with_tensor_change(Max="1.5")
    v["dump", "tensor-stat-object"] = with_tensor_change(Norm={"value": 1})
    v["dump", "tensor-stat-list"] = with_tensor_change(Mean=[0.1])
    v["dump", "tensor-md5-bool"] = with_tensor_change(md5=True)
    v["dump", "tensor-md5-list"] = with_tensor_change(md5=["1a2b3c4d"])
    v["dump", "tensor-requires-grad-not-bool"] = with_tensor_change(requires_grad="yes")
    v["dump", "tensor-requires-grad-int"] = with_tensor_change(requires_grad=1)
    for case, dn in [
        ("data-name-parent-dir", "../" + API + ".input.0.pt"),
        ("data-name-dotdot", ".."),
        ("data-name-dotdot-prefix", "..hidden.pt"),
        ("data-name-absolute", "/etc/passwd"),
        ("data-name-subdir", "sub/" + API + ".input.0.pt"),
        ("data-name-backslash", "..\\..\\x.pt"),
        ("data-name-drive", "C:" + API + ".input.0.pt"),
        ("data-name-nul", API + ".input.0.pt\u0000.txt"),
        ("data-name-empty", ""),
        ("data-name-dot", "."),
        ("data-name-not-string", 5),
        ("data-name-list", [API + ".input.0.pt"]),
    ]:
        v["dump", case] = with_tensor_change(data_name=dn)
    d = with_arg({"cache": [None, {"k": tensor(shape=(2, "3"))}]}, "input_kwargs")
    v["dump", "nested-tensor-bad-shape"] = d
    v["dump", "output-single-bad-tensor"] = with_record("Torch.sum.0.forward", {"output": tensor(dtype=None)})
    v["dump", "parameters-grad-bad-tensor"] = with_record("Module.fc.Linear.parameters_grad",
                                                          {"weight": [tensor(shape=None)]})
    v["dump", "parameters-bad-data-name"] = with_record("Module.fc.Linear.forward.0", {
        "parameters": {"weight": tensor(data_name="../weight.pt")}})
    v["dump", "mindspore-tensor-no-shape"] = with_arg({"type": "mindspore.Tensor", "dtype": "Float32"})
    v["dump", "debug-level-api-name"] = {**debug_template(), "data": {"logits.0.debug": tensor(),
                                                                      API: {"input_args": []}}}
    # debug.json
    v["debug", "not-an-object"] = "debug"
    v["debug", "missing-level"] = {k: val for k, val in debug_template().items() if k != "level"}
    v["debug", "level-not-debug"] = {**debug_template(), "level": "L1"}
    v["debug", "api-record-name"] = {**debug_template(), "data": {API: {"input_args": []}}}
    v["debug", "module-record-name"] = {**debug_template(), "data": {"Module.fc.Linear.forward.0": {}}}
    v["debug", "name-traversal"] = {**debug_template(), "data": {"../x.0.debug": tensor()}}
    v["debug", "name-no-count"] = {**debug_template(), "data": {"logits.debug": tensor()}}
    v["debug", "bad-tensor"] = {**debug_template(), "data": {"logits.0.debug": tensor(shape=[-3])}}
    v["debug", "nested-bad-data-name"] = {**debug_template(), "data": {
        "info.0.debug": {"k": [tensor(data_name="/abs/info.0.debug.k.0.pt")]}}}
    v["debug", "missing-data"] = {"task": "statistics", "level": "debug"}
    # stack.json
    v["stack", "not-an-object"] = [stack_template()["0"]]
    v["stack", "names-not-strings"] = {"0": [[API, 3], ["File x, line 1"]]}
    v["stack", "frames-not-strings"] = {"0": [[API], ["File x, line 1", 2]]}
    v["stack", "frames-not-list"] = {"0": [[API], {"frame": "File x"}]}
    v["stack", "frames-string-in-pair"] = {"0": [[API], "File x, line 1"]}
    v["stack", "value-number"] = {"0": 17}
    v["stack", "value-object"] = {"0": {"names": [API]}}
    v["stack", "legacy-frames-not-strings"] = {API: ["File x, line 1", None]}
    # construct.json
    v["construct", "not-an-object"] = [construct_template()]
    v["construct", "parent-number"] = {API: 0}
    v["construct", "parent-bool"] = {API: False}
    v["construct", "parent-float"] = {API: 1.5}
    # msprobe_lake.json
    v["msprobe_lake", "not-an-object"] = ["1.0", "msprobe-lake"]
    v["msprobe_lake", "missing-format-version"] = {"dialect": "msprobe-lake"}
    v["msprobe_lake", "format-version-number"] = {"format_version": 1.0, "dialect": "msprobe-lake"}
    v["msprobe_lake", "format-version-no-minor"] = {"format_version": "1", "dialect": "msprobe-lake"}
    v["msprobe_lake", "format-version-patch"] = {"format_version": "1.0.0", "dialect": "msprobe-lake"}
    v["msprobe_lake", "format-version-prefix"] = {"format_version": "v1.0", "dialect": "msprobe-lake"}
    v["msprobe_lake", "missing-dialect"] = {"format_version": "1.0"}
    v["msprobe_lake", "dialect-empty"] = {"format_version": "1.0", "dialect": ""}
    v["msprobe_lake", "dialect-not-string"] = {"format_version": "1.0", "dialect": ["msprobe-lake"]}
    v["msprobe_lake", "producer-not-string"] = marker_template() | {"producer": {"name": "x"}}
    v["msprobe_lake", "tensor-format-not-string"] = marker_template() | {"tensor_format": 1}
    v["msprobe_lake", "step-not-integer"] = marker_template() | {"step": "3"}
    v["msprobe_lake", "rank-negative"] = marker_template() | {"rank": -1}
    v["msprobe_lake", "records-not-integer"] = marker_template() | {"records": 1.5}
    v["msprobe_lake", "complete-not-boolean"] = marker_template() | {"complete": "yes"}
    v["msprobe_lake", "document-crc32-not-hex"] = marker_template() | {"document_crc32": "CRC"}
    v["msprobe_lake", "files-not-object"] = marker_template() | {"files": [["x.pt", 1, "00000000"]]}
    return v


# --------------------------------------------------------------------------------------
# names.json


def names_document():
    valid_records = [
        ("Functional.linear.0.forward", "api", "Functional", "linear", None, 0, "forward"),
        ("Functional.linear.12.backward", "api", "Functional", "linear", None, 12, "backward"),
        ("Tensor.__add__.3.backward", "api", "Tensor", "__add__", None, 3, "backward"),
        ("Torch.matmul.0.forward", "api", "Torch", "matmul", None, 0, "forward"),
        ("NPU.npu_fusion_attention.0.forward", "api", "NPU", "npu_fusion_attention", None, 0, "forward"),
        ("VF.lstm.0.forward", "api", "VF", "lstm", None, 0, "forward"),
        ("Aten.add.Tensor.0.forward", "api", "Aten", "add.Tensor", None, 0, "forward"),
        ("Distributed.all_reduce.0.forward", "api", "Distributed", "all_reduce", None, 0, "forward"),
        ("MindSpeed.npu_rotary_position_embedding.1.forward", "api", "MindSpeed",
         "npu_rotary_position_embedding", None, 1, "forward"),
        ("Primitive.conv2d.Conv2D.0.forward", "api", "Primitive", "conv2d", "Conv2D", 0, "forward"),
        ("Mint.abs.0.forward", "api", "Mint", "abs", None, 0, "forward"),
        ("MintFunctional.relu.0.backward", "api", "MintFunctional", "relu", None, 0, "backward"),
        ("Jit.AlexNet.0.forward", "api", "Jit", "AlexNet", None, 0, "forward"),
        ("Module.conv2.Conv2d.forward.0", "module", "Module", "conv2", "Conv2d", 0, "forward"),
        ("Module.layers.0.attn.Linear.forward.1", "module", "Module", "layers.0.attn", "Linear", 1, "forward"),
        ("Module.0.conv1.Conv2d.backward.0", "module", "Module", "0.conv1", "Conv2d", 0, "backward"),
        ("Cell.relu.ReLU.forward.0", "module", "Cell", "relu", "ReLU", 0, "forward"),
        ("Module.conv2.Conv2d.parameters_grad", "parameters_grad", "Module", "conv2", "Conv2d", None, None),
        ("Module.fc.Linear.parameters_grad.0", "parameters_grad", "Module", "fc", "Linear", 0, None),
        ("Cell.conv2.Conv2d.parameters_grad", "parameters_grad", "Cell", "conv2", "Conv2d", None, None),
        ("logits.0.debug", "debug", "", "logits", None, 0, None),
        ("logits_grad.0.debug", "debug", "", "logits", None, 0, None),
        ("model.layer1.out.12.debug", "debug", "", "model.layer1.out", None, 12, None),
    ]
    invalid_records = [
        ("", "empty name"),
        ("Functional.linear.forward", "no call count"),
        ("Functional.linear.0", "no direction"),
        ("Functional.linear.0.sideways", "direction is neither forward nor backward"),
        ("Functional.linear.x.forward", "call count is not a number"),
        ("Module.Linear.forward.0", "module name without a module path"),
        ("Module.fc.0.forward", "module names put the direction before the count"),
        ("Module.fc.Linear.parameters_grad.x", "parameters_grad count is not a number"),
        ("Functional..linear.0.forward", "empty dotted segment"),
        (".Functional.linear.0.forward", "leading dot"),
        ("Functional.linear.0.forward.", "trailing dot"),
        ("Functional/linear.0.forward", "path separator"),
        ("Functional\\linear.0.forward", "backslash path separator"),
        ("../../etc/passwd.0.debug", "path traversal"),
        ("..\\x.0.debug", "path traversal"),
        ("x/y.0.debug", "path separator in a debug name"),
        ("Functional.lin ear.0.forward", "whitespace in a segment"),
        ("Functional.linear\t.0.forward", "control character"),
        ("x\n.0.debug", "control character"),
        ("Functional.linear\u0000.0.forward", "NUL"),
        ("x.debug", "debug name without a count"),
        ("Bogus.linear.0.forward", "unknown API prefix (strict parsing only)"),
        ("9Functional.linear.0.forward", "prefix is not an identifier"),
    ]
    valid_data = [
        ("Functional.linear.5.backward.output.0.pt", "Functional.linear.5.backward", "output", ["0"], "pt"),
        ("Functional.linear.0.forward.input.0.pt", "Functional.linear.0.forward", "input", ["0"], "pt"),
        ("Functional.linear.0.forward.input.1.0.pt", "Functional.linear.0.forward", "input", ["1", "0"], "pt"),
        ("Functional.linear.0.forward.kwargs.weight.pt", "Functional.linear.0.forward", "kwargs", ["weight"], "pt"),
        ("Tensor.permute.1.forward.pt", "Tensor.permute.1.forward", None, [], "pt"),
        ("Module.conv1.Conv2d.forward.0.input.0.pt", "Module.conv1.Conv2d.forward.0", "input", ["0"], "pt"),
        ("Module.conv1.Conv2d.forward.0.parameters.bias.pt", "Module.conv1.Conv2d.forward.0", "parameters",
         ["bias"], "pt"),
        ("Module.layers.0.attn.Linear.backward.1.output.0.pt", "Module.layers.0.attn.Linear.backward.1", "output",
         ["0"], "pt"),
        ("Module.conv1.Conv2d.parameters_grad.weight.pt", "Module.conv1.Conv2d.parameters_grad", None,
         ["weight"], "pt"),
        ("Module.fc.Linear.parameters_grad.0.weight.pt", "Module.fc.Linear.parameters_grad.0", None,
         ["weight"], "pt"),
        ("Cell.conv1.Conv2d.forward.0.parameters.weight.npy", "Cell.conv1.Conv2d.forward.0", "parameters",
         ["weight"], "npy"),
        ("Primitive.conv2d.Conv2D.0.forward.input.0.npy", "Primitive.conv2d.Conv2D.0.forward", "input", ["0"],
         "npy"),
        ("MintFunctional.relu.0.backward.input.0.npy", "MintFunctional.relu.0.backward", "input", ["0"], "npy"),
        ("logits.0.debug.pt", "logits.0.debug", None, [], "pt"),
        ("info.0.debug.n_tok.pt", "info.0.debug", None, ["n_tok"], "pt"),
        ("items_grad.0.debug.1.0.npy", "items_grad.0.debug", None, ["1", "0"], "npy"),
    ]
    invalid_data = [
        ("", "empty name"),
        ("../Functional.linear.0.forward.input.0.pt", "parent directory"),
        ("..", "parent directory"),
        (".", "current directory"),
        ("/etc/passwd", "absolute path"),
        ("dump_tensor_data/Functional.linear.0.forward.input.0.pt", "path separator"),
        ("..\\Functional.linear.0.forward.input.0.pt", "backslash path separator"),
        ("C:Functional.linear.0.forward.input.0.pt", "drive-qualified"),
        ("Functional.linear.0.forward.input.0.pt\u0000", "NUL"),
        ("Functional.linear.0.forward.input.0.txt", "extension is neither .pt nor .npy"),
        ("Functional.linear.0.forward.input.0", "no extension"),
        ("notarecord.pt", "no record name before the extension"),
    ]
    return {
        "description": "Record names and data names of spec/FORMAT.md section 7. Valid record names "
                       "parse (strictly) into the given fields and format back byte for byte; invalid "
                       "ones raise NameFormatError. Data names: the same with parse_data_name (record "
                       "unknown); invalid ones raise NameFormatError or UnsafePathError.",
        "format_version": FORMAT_VERSION,
        "record_names": {
            "valid": [{"name": n, "kind": k, "prefix": p, "api_name": a, "class_name": c, "call_index": i,
                       "direction": dr} for n, k, p, a, c, i, dr in valid_records],
            "invalid": [{"name": n, "reason": r} for n, r in invalid_records],
        },
        "data_names": {
            "valid": [{"name": n, "record": r, "io": io, "path": p, "ext": e} for n, r, io, p, e in valid_data],
            "invalid": [{"name": n, "reason": r} for n, r in invalid_data],
        },
    }


# --------------------------------------------------------------------------------------
# golden dumps (statistics computed here, independently of msprobe/format/stats.py)


def _f(x):
    """A numpy scalar as the JSON value a producer writes (Python float/int/bool)."""
    return x.item()


def stats_of(a: np.ndarray, framework: str = "pytorch"):
    """(Max, Min, Mean, Norm) by the msprobe-lake rules of spec/FORMAT.md 15.1."""
    if a.size == 0:
        return (None, None, None, None)
    if a.dtype == np.bool_:
        return (bool(np.any(a)), bool(np.all(a)), None, None)
    if a.ndim == 0:
        return (_f(a[()]),) * 4
    ms = framework == "mindspore"
    if a.dtype.kind in "iu" or a.dtype == np.float64:
        if not ms:
            if a.dtype.kind in "iu":
                return (int(a.max()), int(a.min()), None, None)
            return (float(a.max()), float(a.min()), None, None)
        a = a.astype(np.float32)
    t = a.dtype.type
    wide = a.astype(np.float64)
    mean = t(np.sum(wide) / a.size)
    norm = t(math.sqrt(float(np.sum(wide * wide))))
    return (_f(a.max()), _f(a.min()), _f(mean), _f(norm))


def crc32_of(a: np.ndarray) -> str:
    return "%08x" % (zlib.crc32(np.ascontiguousarray(a).tobytes()) & 0xFFFFFFFF)


def values_of(a: np.ndarray):
    return a.tolist()


def pattern(shape, dtype, scale=8.0, offset=0):
    """Deterministic values: ((i * 37 + offset) % 17 - 8) / scale, exact in every float dtype."""
    n = int(np.prod(shape)) if shape else 1
    i = np.arange(n, dtype=np.int64)
    v = ((i * 37 + offset) % 17 - 8).astype(np.float64) / scale
    return v.astype(dtype).reshape(shape)


class Golden:
    """Collects one rank directory: documents, tensor files, expected values."""

    def __init__(self, root: str, rank_rel: str, framework: str, dtype_names: dict):
        self.root = root
        self.rank_rel = rank_rel
        self.framework = framework
        self.dtype_names = dtype_names
        self.expected = []
        self.files = {}

    def entry(self, record, path, a, *, tensor_type, requires_grad=None, data_name=None, md5=False,
              np_save=False):
        st = stats_of(a, self.framework)
        e = {"type": tensor_type, "dtype": self.dtype_names[a.dtype.name], "shape": list(a.shape)}
        e["Max"], e["Min"], e["Mean"], e["Norm"] = st
        if requires_grad is not None:
            e["requires_grad"] = requires_grad
        crc = crc32_of(a)
        if md5:
            e["md5"] = crc
        if data_name:
            e["data_name"] = data_name
            if np_save:
                self.files[data_name] = a
        self.expected.append({
            "record": record, "path": path, "dtype": e["dtype"], "numpy_dtype": a.dtype.name,
            "shape": list(a.shape), "values": values_of(a),
            "Max": st[0], "Min": st[1], "Mean": st[2], "Norm": st[3], "crc32": crc,
            "data_name": data_name,
        })
        return e

    def write(self, documents: dict, description: str, marker: dict, mapping: dict = None):
        rank_dir = os.path.join(self.root, self.rank_rel)
        for name, doc in documents.items():
            write_text(os.path.join(rank_dir, name), dumps(doc))
        write_text(os.path.join(rank_dir, "msprobe_lake.json"), dumps(marker))
        mapping = mapping or {}
        for data_name, a in self.files.items():
            path = os.path.join(rank_dir, "dump_tensor_data", mapping.get(data_name, data_name))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                np.save(f, a, allow_pickle=False)
        if mapping:
            rows = "".join(f"{conv},{orig}\n" for orig, conv in mapping.items())
            write_text(os.path.join(rank_dir, "dump_tensor_data", "mapping.csv"), rows)
        doc_name = "debug.json" if "debug.json" in documents else "dump.json"
        n_records = len(documents[doc_name]["data"])
        expected = {
            "description": description,
            "format_version": FORMAT_VERSION,
            "dialect": marker["dialect"],
            "framework": self.framework,
            "rank_dirs": [self.rank_rel],
            "document": f"{self.rank_rel}/{doc_name}",
            "records": n_records,
            "record_names": list(documents[doc_name]["data"]),
            "tensor_files": sorted(mapping.get(k, k) for k in self.files),
            "mapping": mapping,
            "tensors": self.expected,
        }
        write_text(os.path.join(self.root, "expected.json"), dumps(expected))


TORCH_DTYPES = {"float32": "torch.float32", "float16": "torch.float16", "float64": "torch.float64",
                "int64": "torch.int64", "int32": "torch.int32", "bool": "torch.bool"}
MS_DTYPES = {"float32": "Float32", "float16": "Float16", "float64": "Float64", "int64": "Int64",
             "int32": "Int32", "bool": "Bool"}


def golden_statistics(root):
    """PyTorch, mix level, statistics: modules, APIs, every argument type, stack and construct."""
    g = Golden(root, "step0/rank", "pytorch", TORCH_DTYPES)
    T = "torch.Tensor"
    P = "torch.nn.parameter.Parameter"
    x = pattern((2, 3), np.float32)
    w = pattern((4, 3), np.float32, offset=5)
    b = pattern((4,), np.float32, scale=16.0, offset=2)
    y = (x @ w.T + b).astype(np.float32)
    r = np.maximum(y, np.float32(0))
    gy = pattern((2, 4), np.float32, scale=64.0, offset=1)
    gx = (gy @ w).astype(np.float32)
    gw = (gy.T @ x).astype(np.float32)
    gb = gy.sum(axis=0).astype(np.float32)
    idx = np.argmax(y, axis=1).astype(np.int64)
    gt = y > np.float32(0)
    s = np.float32(r.sum())
    e = np.zeros((0, 3), np.float32)
    h = x.astype(np.float16)
    d64 = x.astype(np.float64) * 3.0
    z = np.array([1.0, 0.0, -1.0], np.float32)
    # z / 0, with the canonical (positive, quiet) NaN: x86 makes 0/0 a negative NaN, whose bytes
    # (and CRC-32) a JSON NaN could not reproduce
    q = np.array([np.inf, np.nan, -np.inf], np.float32)

    M = "Module.fc.Linear.forward.0"
    L = "Functional.linear.0.forward"
    data = {}
    data[M] = {
        "input_args": [g.entry(M, "input_args.0", x, tensor_type=T, requires_grad=False)],
        "input_kwargs": {},
        "output": [g.entry(M, "output.0", y, tensor_type=T, requires_grad=True)],
        "parameters": {
            "weight": g.entry(M, "parameters.weight", w, tensor_type=P, requires_grad=True),
            "bias": g.entry(M, "parameters.bias", b, tensor_type=P, requires_grad=True),
        },
    }
    data[L] = {
        "input_args": [g.entry(L, "input_args.0", x, tensor_type=T, requires_grad=False),
                       g.entry(L, "input_args.1", w, tensor_type=P, requires_grad=True),
                       g.entry(L, "input_args.2", b, tensor_type=P, requires_grad=True)],
        "input_kwargs": {},
        "output": [g.entry(L, "output.0", y, tensor_type=T, requires_grad=True)],
    }
    R = "Functional.relu.0.forward"
    data[R] = {"input_args": [g.entry(R, "input_args.0", y, tensor_type=T, requires_grad=True)],
               "input_kwargs": {"inplace": typed("bool", False)},
               "output": [g.entry(R, "output.0", r, tensor_type=T, requires_grad=True)]}
    A = "Torch.argmax.0.forward"
    data[A] = {"input_args": [g.entry(A, "input_args.0", y, tensor_type=T, requires_grad=True)],
               "input_kwargs": {"dim": typed("int", 1), "keepdim": typed("bool", False)},
               "output": [g.entry(A, "output.0", idx, tensor_type=T, requires_grad=False)]}
    G = "Tensor.__gt__.0.forward"
    data[G] = {"input_args": [g.entry(G, "input_args.0", y, tensor_type=T, requires_grad=True),
                              typed("float", 0.0)],
               "input_kwargs": {},
               "output": [g.entry(G, "output.0", gt, tensor_type=T, requires_grad=False)]}
    S = "Torch.sum.0.forward"
    data[S] = {"input_args": [g.entry(S, "input_args.0", r, tensor_type=T, requires_grad=True)],
               "input_kwargs": {},
               "output": [g.entry(S, "output.0", np.array(s, np.float32), tensor_type=T, requires_grad=True)]}
    E = "Torch.empty.0.forward"
    data[E] = {"input_args": [typed("int", 0), typed("int", 3)],
               "input_kwargs": {"dtype": typed("torch.dtype", "torch.float32"),
                                "device": typed("torch.device", "cpu")},
               "output": [g.entry(E, "output.0", e, tensor_type=T, requires_grad=False)]}
    H = "Tensor.to.0.forward"
    data[H] = {"input_args": [g.entry(H, "input_args.0", x, tensor_type=T, requires_grad=False)],
               "input_kwargs": {"dtype": typed("torch.dtype", "torch.float16"),
                                "memory_format": typed("torch.memory_format", "contiguous_format", key="format")},
               "output": [g.entry(H, "output.0", h, tensor_type=T, requires_grad=False)]}
    D = "Tensor.double.0.forward"
    data[D] = {"input_args": [g.entry(D, "input_args.0", x, tensor_type=T, requires_grad=False)],
               "input_kwargs": {},
               "output": [g.entry(D, "output.0", d64, tensor_type=T, requires_grad=False)]}
    Q = "Torch.div.0.forward"
    data[Q] = {"input_args": [g.entry(Q, "input_args.0", z, tensor_type=T, requires_grad=False),
                              typed("float", 0.0)],
               "input_kwargs": {"rounding_mode": None},
               "output": [g.entry(Q, "output.0", q, tensor_type=T, requires_grad=False)]}
    I = "Tensor.__getitem__.0.forward"
    data[I] = {"input_args": [g.entry(I, "input_args.0", x, tensor_type=T, requires_grad=False),
                              [typed("ellipsis", "..."), typed("slice", [None, 2, None])]],
               "input_kwargs": {},
               "output": [g.entry(I, "output.0", x[..., :2].copy(), tensor_type=T, requires_grad=False)]}
    C = "Torch.cat.0.forward"
    data[C] = {"input_args": [[g.entry(C, "input_args.0.0", x, tensor_type=T, requires_grad=False),
                               g.entry(C, "input_args.0.1", x, tensor_type=T, requires_grad=False)]],
               "input_kwargs": {"dim": typed("int", 0)},
               "output": [g.entry(C, "output.0", np.concatenate([x, x]), tensor_type=T, requires_grad=False)]}
    RB = "Functional.relu.0.backward"
    gr = (gy * (y > 0)).astype(np.float32)
    data[RB] = {"input": [g.entry(RB, "input.0", gy, tensor_type=T, requires_grad=False)],
                "output": [g.entry(RB, "output.0", gr, tensor_type=T, requires_grad=False)]}
    LB = "Functional.linear.0.backward"
    data[LB] = {"input": [g.entry(LB, "input.0", gr, tensor_type=T, requires_grad=False)],
                "output": [g.entry(LB, "output.0", gx, tensor_type=T, requires_grad=False),
                           g.entry(LB, "output.1", gw, tensor_type=T, requires_grad=False),
                           g.entry(LB, "output.2", gb, tensor_type=T, requires_grad=False)]}
    MB = "Module.fc.Linear.backward.0"
    data[MB] = {"input": [g.entry(MB, "input.0", gr, tensor_type=T, requires_grad=False)],
                "output": [g.entry(MB, "output.0", gx, tensor_type=T, requires_grad=False)]}
    PG = "Module.fc.Linear.parameters_grad"
    data[PG] = {"weight": [g.entry(PG, "weight.0", gw, tensor_type=T, requires_grad=False)],
                "bias": [g.entry(PG, "bias.0", gb, tensor_type=T, requires_grad=False)]}
    dump = {"task": "statistics", "level": "mix", "framework": "pytorch", "dump_data_dir": None, "data": data}
    frame = "File /golden/train.py, line {}, in {}, \n {}"
    stack = {
        "0": [[M], [frame.format(40, "<module>", "y = net(x)")]],
        "1": [[L], [frame.format(12, "forward", "return F.linear(x, self.weight, self.bias)"),
                    frame.format(40, "<module>", "y = net(x)")]],
        "2": [[R, A, G, S, E, H, D, Q, I, C], [frame.format(41, "<module>", "loss = post(y)")]],
    }
    construct = {M: None, L: M, R: None, A: None, G: None, S: None, E: None, H: None, D: None, Q: None,
                 I: None, C: None, RB: None, LB: MB, MB: None}
    marker = {"format_version": FORMAT_VERSION, "dialect": "msprobe-lake", "producer": PRODUCER,
              "framework": "pytorch", "task": "statistics", "level": "mix", "summary_mode": "statistics"}
    g.write({"dump.json": dump, "stack.json": stack, "construct.json": construct},
            "PyTorch mix-level statistics dump: a Linear module and the APIs around it, with int, bool, "
            "0-d, empty, float16, float64 and NaN/Inf tensors, and every argument encoding.", marker)


def golden_tensor(root):
    """MindSpore L1 tensor dump with .npy files, including one long name resolved by mapping.csv."""
    g = Golden(root, "step0/rank0", "mindspore", MS_DTYPES)
    T = "mindspore.Tensor"
    x = pattern((2, 3), np.float32)
    r = np.maximum(x, np.float32(0))
    k = pattern((4,), np.int32, scale=1.0, offset=3).astype(np.int32)
    k2 = (k + k).astype(np.int32)
    m = x > np.float32(0.0)
    gy = pattern((2, 3), np.float32, scale=32.0, offset=4)
    gr = (gy * (x > 0)).astype(np.float32)
    data = {}

    def dn(rec, rest, ext="npy"):
        return f"{rec}.{rest}.{ext}"

    R = "Functional.relu.0.forward"
    data[R] = {"input_args": [g.entry(R, "input_args.0", x, tensor_type=T, data_name=dn(R, "input.0"), np_save=True)],
               "input_kwargs": {},
               "output": [g.entry(R, "output.0", r, tensor_type=T, data_name=dn(R, "output.0"), np_save=True)]}
    A = "Tensor.__add__.0.forward"
    data[A] = {"input_args": [g.entry(A, "input_args.0", k, tensor_type=T, data_name=dn(A, "input.0"), np_save=True),
                              g.entry(A, "input_args.1", k, tensor_type=T, data_name=dn(A, "input.1"), np_save=True)],
               "input_kwargs": {},
               "output": [g.entry(A, "output.0", k2, tensor_type=T, data_name=dn(A, "output.0"), np_save=True)]}
    G = "Mint.greater.0.forward"
    data[G] = {"input_args": [g.entry(G, "input_args.0", x, tensor_type=T, data_name=dn(G, "input.0"), np_save=True),
                              typed("float", 0.0)],
               "input_kwargs": {},
               "output": [g.entry(G, "output.0", m, tensor_type=T, data_name=dn(G, "output.0"), np_save=True)]}
    long_rec = "Functional." + "very_long_fused_custom_operator_name_" * 6 + "op.0.forward"
    long_dn = dn(long_rec, "input.0")
    data[long_rec] = {"input_args": [g.entry(long_rec, "input_args.0", x, tensor_type=T, data_name=long_dn,
                                             np_save=True)],
                      "input_kwargs": {}, "output": []}
    RB = "Functional.relu.0.backward"
    data[RB] = {"input": [g.entry(RB, "input.0", gy, tensor_type=T, data_name=dn(RB, "input.0"), np_save=True)],
                "output": [g.entry(RB, "output.0", gr, tensor_type=T, data_name=dn(RB, "output.0"), np_save=True)]}
    assert len(long_dn) > 255
    mapping = {long_dn: "%032d.npy" % 1}
    dump = {"task": "tensor", "level": "L1", "framework": "mindspore",
            "dump_data_dir": "/golden/tensor-mindspore/step0/rank0/dump_tensor_data", "data": data}
    frame = "File /golden/train_ms.py, line {}, in construct, \n {}"
    stack = {"0": [[R, A, G, long_rec], [frame.format(20, "out = self.body(x)")]]}
    marker = {"format_version": FORMAT_VERSION, "dialect": "msprobe-lake", "producer": PRODUCER,
              "framework": "mindspore", "task": "tensor", "level": "L1", "tensor_format": "npy"}
    g.write({"dump.json": dump, "stack.json": stack, "construct.json": {}},
            "MindSpore L1 tensor dump: .npy tensor files (float32, int32, bool), MindSpore statistics "
            "rules (integers via float32), and one data name over 255 characters stored under a "
            "converted name listed in mapping.csv.", marker, mapping)


def golden_debug(root):
    """PyTorch level-debug save() dump in md5 mode: debug.json with nested values."""
    g = Golden(root, "step0/rank", "pytorch", TORCH_DTYPES)
    T = "torch.Tensor"
    lg = pattern((2, 2), np.float32, scale=4.0, offset=7)
    n = np.array([5, 3], np.int64)
    flag = np.array(True)
    glg = pattern((2, 2), np.float32, scale=16.0, offset=9)
    loss = np.array(np.float32(0.75), np.float32)
    data = {}
    data["logits.0.debug"] = g.entry("logits.0.debug", "", lg, tensor_type=T, requires_grad=True, md5=True)
    data["info.0.debug"] = {
        "n_tok": g.entry("info.0.debug", "n_tok", n, tensor_type=T, requires_grad=False, md5=True),
        "flag": g.entry("info.0.debug", "flag", flag, tensor_type=T, requires_grad=False, md5=True),
        "scale": typed("float", 0.5),
        "name": typed("str", "x"),
    }
    data["items.0.debug"] = [g.entry("items.0.debug", "0", lg[0].copy(), tensor_type=T, requires_grad=True, md5=True),
                             [g.entry("items.0.debug", "1.0", n, tensor_type=T, requires_grad=False, md5=True), None],
                             typed("int", 3)]
    data["loss.0.debug"] = g.entry("loss.0.debug", "", loss, tensor_type=T, requires_grad=True, md5=True)
    data["loss_grad.0.debug"] = g.entry("loss_grad.0.debug", "", np.array(np.float32(1.0)), tensor_type=T,
                                        requires_grad=False, md5=True)
    data["logits_grad.0.debug"] = g.entry("logits_grad.0.debug", "", glg, tensor_type=T, requires_grad=False,
                                          md5=True)
    debug = {"task": "statistics", "level": "debug", "framework": "pytorch", "dump_data_dir": None, "data": data}
    marker = {"format_version": FORMAT_VERSION, "dialect": "msprobe-lake", "producer": PRODUCER,
              "framework": "pytorch", "task": "statistics", "level": "debug", "summary_mode": "md5"}
    g.write({"debug.json": debug}, "PyTorch level-debug dump of PrecisionDebugger.save() in md5 mode: "
            "debug.json with a tensor, a dict, a nested list, a 0-d loss and gradients; md5 is the "
            "CRC-32 of each tensor's bytes.", marker)


GOLDENS = {"statistics-pytorch": golden_statistics, "tensor-mindspore": golden_tensor,
           "debug-md5-pytorch": golden_debug}


# --------------------------------------------------------------------------------------


def generate(out: str) -> None:
    vec = os.path.join(out, "vectors")
    for sub in ("valid", "invalid"):
        shutil.rmtree(os.path.join(vec, sub), ignore_errors=True)
    for kind, cases in (("valid", valid_vectors()), ("invalid", invalid_vectors())):
        for (doc, case), obj in sorted(cases.items()):
            write_text(os.path.join(vec, kind, f"{doc}--{case}.json"), dumps(copy.deepcopy(obj)))
    write_text(os.path.join(vec, "names.json"), dumps(names_document()))
    gold = os.path.join(out, "golden")
    for name, fn in GOLDENS.items():
        shutil.rmtree(os.path.join(gold, name), ignore_errors=True)
        fn(os.path.join(gold, name))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.dirname(HERE), help="spec directory to write into (default: spec/)")
    args = ap.parse_args(argv)
    generate(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
