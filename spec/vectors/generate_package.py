"""Generate the vectors of spec/FORMAT.md that are made with msprobe-lake itself.

    python spec/vectors/generate_package.py [--out SPEC_DIR]

Unlike generate.py (standard library and numpy only), this script runs the package: the
expected values below are what msprobe-lake's readers and reference functions give, so the
independent checker of spec/check/ (written from the text alone) is compared with them.

* ``vectors/statistics.json`` (section 15): small tensors of every dtype class, float16 and
  bfloat16 cases whose rounding matters included, with Max/Min/Mean/Norm per dialect and
  framework, the CRC-32 and the XOR of their bytes;
* ``vectors/dialects.json`` (section 4.3): rank directory names, markers and documents with
  the dialect detected;
* ``vectors/layouts/`` (section 5): one small tree per layout, ``layouts.json`` listing the
  rank directories (split, step, rank, name), the dialect and the kernel dump files found;
* ``vectors/journal/`` (section 17): rank directories holding a crash journal (and one a
  document too), ``expected.json`` the records a reader finds and the documents a replay
  publishes;
* ``golden/zarr-pytorch/`` (section 21): a PyTorch tensor dump in a Zarr store (float32,
  bfloat16, int64, bool, 0-d, empty, deduplicated payloads), with ``expected.json``.

Deterministic: re-running it reproduces the committed files byte for byte.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))


def dumps(obj) -> str:
    return json.dumps(obj, indent=1, ensure_ascii=True)


def put(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


def _clean(v):
    return v  # NaN and Infinity are written as the tokens of spec section 8.1


# ------------------------------------------------------------------ statistics.json

def _bf16_values(vals):
    """float32 values exact in bfloat16 (their low 16 bits are zero)."""
    a = np.array(vals, dtype=np.float32).view(np.uint32) & np.uint32(0xFFFF0000)
    return a.view(np.float32)


def statistics_vectors() -> dict:
    from msprobe.format.stats import crc32_hex, reference_stats, xor64_hex

    cases = [
        ("float32 small", "float32", [[0.1, 0.2, 0.3], [-1.5, 2.25, 1e-7]]),
        ("float32 NaN", "float32", [1.0, float("nan"), -2.0]),
        ("float32 Inf", "float32", [1.0, float("inf"), -2.0]),
        ("float16 mean rounds", "float16", [0.1, 0.2, 0.3, 0.7001]),
        ("float16 norm rounds", "float16", [1.0, 1.0, 1.0, 0.0009765625]),
        ("float16 many", "float16", [((i * 37) % 101) / 64.0 - 0.75 for i in range(257)]),
        ("bfloat16 mean rounds", "bfloat16", [0.1, 0.2, 0.3, 0.7]),
        ("bfloat16 ties to even", "bfloat16", [1.0, 1.0078125, 1.0, 1.0078125, 1.0, 1.0]),
        ("bfloat16 many", "bfloat16", [((i * 53) % 97) / 16.0 - 3.0 for i in range(300)]),
        ("float64", "float64", [0.1, -0.2, 1e300]),
        ("int64", "int64", [[3, -4], [7, 0]]),
        ("int32", "int32", [1, 2, 3, -4]),
        ("uint8", "uint8", [0, 255, 7]),
        ("bool", "bool", [True, False, True]),
        ("bool all", "bool", [True, True]),
        ("0-d float32", "float32", 1.7235906),
        ("0-d int64", "int64", -3),
        ("0-d bool", "bool", True),
        ("empty", "float32", np.zeros((0, 4)).tolist()),
        ("complex64", "complex64", [1 + 2j, -3 + 0.5j]),
    ]
    out = []
    for label, dtype, values in cases:
        if dtype == "bfloat16":
            a = _bf16_values(values)
            raw = (a.view(np.uint32) >> 16).astype("<u2")
        else:
            a = np.array(values, dtype=dtype)
            raw = a
        if dtype == "float32" and np.asarray(values).shape == (0, 4):
            a = np.zeros((0, 4), dtype=np.float32)
            raw = a
        entry = {"label": label, "dtype": dtype, "shape": list(a.shape),
                 "values": [_clean(x) for x in np.asarray(a).reshape(-1).tolist()] if not np.iscomplexobj(a)
                 else [[float(x.real), float(x.imag)] for x in a.reshape(-1)],
                 "bytes_crc32": crc32_hex(np.ascontiguousarray(raw).reshape(-1)),
                 "bytes_xor": xor64_hex(np.ascontiguousarray(raw).reshape(-1)), "stats": {}}
        for framework in ("pytorch", "mindspore"):
            for dialect in ("msprobe-8", "msprobe-26", "msprobe-lake"):  # msprobe-1: the msprobe-8 rules
                got = reference_stats(a, dialect=dialect, framework=framework,
                                      logical_dtype="bfloat16" if dtype == "bfloat16" else None)
                entry["stats"][f"{framework}/{dialect}"] = [_clean(x) for x in got]
        out.append(entry)
    return {"description": "Statistics (spec/FORMAT.md 15.1) of small tensors, per framework/dialect, with the "
                           "CRC-32 (15.2) and XOR (15.3) of their little-endian bytes (bfloat16: the 16-bit "
                           "words). Values are listed flat in C order; bfloat16 values are exact float32 "
                           "widenings. Expected values computed by msprobe-lake.",
            "format_version": "1.0", "cases": out}


# ------------------------------------------------------------------ dialects.json

def _t(dtype="torch.float32", shape=(2,), mx=1.0, ttype="torch.Tensor"):
    return {"type": ttype, "dtype": dtype, "shape": list(shape), "Max": mx, "Min": mx, "Mean": None, "Norm": None}


def dialect_vectors() -> dict:
    from msprobe.format.dialects import detect_dialect

    fwd8 = {"input_args": [_t()], "input_kwargs": {}, "is_recompute": False, "output": [_t()]}
    fwd26 = {"input_args": [_t()], "input_kwargs": {}, "output": [_t()]}
    cases = [
        ("marker wins", ["rank"], {"dialect": "msprobe-lake", "format_version": "1.0"},
         {"Functional.relu.0.forward": fwd8}),
        ("unknown marker dialect is ignored", ["rank"], {"dialect": "other", "format_version": "1.0"},
         {"Functional.relu.0.forward": fwd26}),
        ("proc directory", ["proc123"], None, {"Functional.relu.0.forward": fwd8}),
        ("no document", ["rank0", "rank1"], None, None),
        ("is_recompute votes 8", ["rank"], None, {"Functional.relu.0.forward": fwd8}),
        ("no is_recompute votes 26", ["rank"], None, {"Functional.relu.0.forward": fwd26}),
        ("backward records do not vote", ["rank"], None,
         {"Functional.relu.0.backward": {"input": [_t()], "output": [_t()]}}),
        ("tie goes to 8", ["rank"], None,
         {"Functional.relu.0.forward": fwd8, "Functional.relu.1.forward": fwd26}),
        ("parameters_grad without count: 2 votes", ["rank"], None,
         {"Functional.relu.0.forward": fwd26, "Module.fc.Linear.parameters_grad": {"weight": [_t()]}}),
        ("parameters_grad with count: 2 votes", ["rank"], None,
         {"Functional.relu.0.forward": fwd8, "Module.fc.Linear.parameters_grad.0": {"weight": [_t()]}}),
        ("integer Max integer votes 26", ["rank"], None,
         {"Functional.relu.0.forward": {**fwd8, "input_args": [_t("torch.int64", (3,), 4), _t("torch.int64", (3,), 5)]}}),
        ("integer Max float votes 8", ["rank"], None,
         {"Functional.relu.0.forward": {**fwd26, "input_args": [_t("torch.int64", (3,), 4.0),
                                                                _t("torch.int32", (3,), 5.0)]}}),
        ("0-d integers do not vote", ["rank"], None,
         {"Functional.relu.0.forward": {**fwd26, "input_args": [_t("torch.int64", (), 4.0), _t("torch.int64", (), 5.0)]}}),
        ("Parameter type does not vote", ["rank"], None,
         {"Functional.relu.0.forward": {**fwd26, "input_args": [_t("torch.int64", (3,), 4.0, "torch.nn.parameter.Parameter"),
                                                                _t("torch.int64", (3,), 5.0, "torch.nn.parameter.Parameter")]}}),
        ("MindSpore integers do not vote", ["rank"], None,
         {"Functional.relu.0.forward": {**fwd26, "input_args": [_t("Int64", (3,), 4.0, "mindspore.Tensor"),
                                                                _t("Int64", (3,), 5.0, "mindspore.Tensor")]}}),
        ("votes stop when 8 apart", ["rank"], None,
         {**{f"Functional.relu.{i}.forward": fwd26 for i in range(9)},
          **{f"Functional.gelu.{i}.forward": fwd8 for i in range(20)}}),
        ("only the first 64 records vote", ["rank"], None,
         {**{f"Functional.relu.{i}.forward": (fwd26 if i % 2 else fwd8) for i in range(64)},
          **{f"Functional.gelu.{i}.forward": fwd26 for i in range(20)}}),
        ("nested deeper than 6 does not vote", ["rank"], None,
         {"Functional.relu.0.forward": {**fwd8, "input_args": [[[[[[_t("torch.int64", (3,), 4)] * 3]]]]]}}),
    ]
    out = []
    for label, names, marker, data in cases:
        out.append({"label": label, "rank_dirs": names, "marker": marker, "data": data,
                    "dialect": detect_dialect(names, data, marker)})
    data1 = {"Functional.linear.0.forward": fwd26, "Module.fc.Linear.forward.0": fwd26,
             "Module.fc.Linear.parameters_grad": {"weight": [_t()]}}
    head = {"task": "statistics", "level": "mix", "dump_data_dir": None}
    with_header = [  # step 4: 1.x, known from the document's header (no 'framework')
        ("1.x: no framework key, no is_recompute", ["rank"], data1, head),
        ("a framework key is not 1.x", ["rank"], data1, {**head, "framework": "pytorch"}),
        ("is_recompute is not 1.x", ["rank0"], {"Functional.relu.0.forward": fwd8}, head),
        ("a counted parameters_grad is not 1.x", ["rank"],
         {"Functional.relu.0.forward": fwd26, "Module.fc.Linear.parameters_grad.0": {"weight": [_t()]}}, head),
        ("a proc directory comes before 1.x", ["proc12"], data1, head),
    ]
    for label, names, data, header in with_header:
        out.append({"label": label, "rank_dirs": names, "marker": None, "data": data, "header": header,
                    "dialect": detect_dialect(names, data, None, {**header, "data": data})})
    return {"description": "Dialect detection (spec/FORMAT.md 4.3): the rank directory names of a dump, the "
                           "marker and the document data of its first rank directory (null: none), and the "
                           "dialect msprobe-lake detects; 'header' (when given): the document's other top-level "
                           "members (step 4, msprobe-1: no 'framework').", "format_version": "1.0", "cases": out}


# ------------------------------------------------------------------ layouts/

def _doc(framework="pytorch", level="L1", data=None) -> str:
    return dumps({"task": "statistics", "level": level, "framework": framework, "dump_data_dir": None,
                  "data": data if data is not None else {"Functional.relu.0.forward": {
                      "input_args": [_t()], "input_kwargs": {}, "output": [_t()]}}})


def layouts(root: str) -> None:
    trees = {
        "single-rank": ["step0/rank"],
        "proc": ["step0/proc4242", "step1/proc4242"],
        "distributed": ["step0/rank0", "step0/rank1", "step0/rank10", "step0/rank2"],
        "steps": ["step10/rank", "step2/rank", "step0/rank"],
        "split": ["graph/step0/rank0", "pynative/step0/rank0", "graph/step1/rank0", "pynative/step1/rank0"],
        "no-steps": ["rank1", "rank0"],
    }
    for name, dirs in trees.items():
        for d in dirs:
            put(os.path.join(root, name, d, "dump.json"), _doc("mindspore" if name == "split" else "pytorch",
                                                               "L0" if name == "split" else "L1"))
        put(os.path.join(root, name, "step0", "notes.txt") if name not in ("split", "no-steps") else
            os.path.join(root, name, "README.txt"), "not part of the dump\n")
    # a rank directory holding no document is still one (5.8 rule 2): step1's holds an unknown file only
    put(os.path.join(root, "single-rank", "step1", "rank", "notes.txt"), "not part of the dump\n")
    # kernel dumps only (5.7)
    k = os.path.join(root, "kernel-only")
    put(os.path.join(k, "step0", "kernel_config_0.json"),
        dumps({"dump": {"dump_list": [], "dump_path": "/abs/step0", "dump_mode": "all", "dump_op_switch": "on"}}))
    put(os.path.join(k, "step0", "20260101120000", "0", "0", "Add.Add_1.12.3.1767268800000000"), "kernel bytes\n")
    put(os.path.join(k, "step0", "20260101120000", "0", "0", "MatMul.MatMul_2.13.3.1767268800000001"), "kernel\n")
    import msprobe.readers as mr

    paths = ["single-rank", "proc", "distributed", "steps", "split", "no-steps", "kernel-only", "distributed/step0",
             "distributed/step0/rank1", "split/graph"]
    out = []
    for p in paths:
        d = mr.open(os.path.join(root, p))
        out.append({"path": p, "dialect": d.dialect,
                    "rank_dirs": [{"split": s.split, "step": s.step, "rank": s.rank, "rank_dir": s.rank_dir}
                                  for s in d.sources],
                    "kernel_dumps": sorted(k.key for k in d.kernel_dumps())})
    put(os.path.join(root, "layouts.json"), dumps({
        "description": "Directory layouts (spec/FORMAT.md 5): for each path under this directory, the rank "
                       "directories msprobe-lake finds (in its order), the dialect and the kernel dump files.",
        "format_version": "1.0", "layouts": out}))


# ------------------------------------------------------------------ journal/

def journals(root: str) -> None:
    import msprobe.readers as mr
    from msprobe.backends import open_store
    from msprobe.dumpers.recover import recover_store

    st = ["File /t/train.py, line 3, in forward, \n y = F.relu(x)", "File /t/train.py, line 9, in <module>, \n main()"]
    half = {"input_args": [_t()], "input_kwargs": {}}
    full = {"input_args": [_t()], "input_kwargs": {}, "output": [_t()]}
    lines_a = [
        {"stack_id": "0", "frames": st},
        {"name": "Module.fc.Linear.forward.0", "record": half, "parent": None, "stack_id": "0"},
        {"name": "Functional.relu.0.forward", "record": full, "parent": "Module.fc.Linear.forward.0",
         "stack_id": "0"},
        {"name": "Module.fc.Linear.forward.0", "record": {**full, "parameters": {"weight": _t()}}, "parent": None,
         "stack_id": "0"},
        {"unknown": "ignored"},
        {"name": "Functional.gelu.0.forward", "record": full, "parent": None, "stack": st[1:], "extra": 1},
    ]
    lines_b = [{"name": "Functional.relu.1.forward", "record": full, "parent": None, "stack_id": "0"}]
    marker = {"format_version": "1.0", "dialect": "msprobe-lake", "framework": "pytorch", "task": "statistics",
              "level": "mix"}
    seg = lambda lines: "".join(json.dumps(x) + "\n" for x in lines)  # noqa: E731
    crashed = os.path.join(root, "crashed", "step0", "rank")
    put(os.path.join(crashed, ".journal", "000001.jsonl"), seg(lines_a[:3]))
    put(os.path.join(crashed, ".journal", "000002.jsonl"), seg(lines_a[3:]) + seg(lines_b) + '{"name": "Functional.to')
    put(os.path.join(crashed, "msprobe_lake.json"), dumps(marker))
    live = os.path.join(root, "live", "step0", "rank")
    put(os.path.join(live, "dump.json"), _doc(level="mix", data={"Functional.relu.1.forward": {
        "input_args": [_t("torch.float32", (3,))], "input_kwargs": {}, "output": [_t()]}}))
    put(os.path.join(live, ".journal", "000001.jsonl"), seg(lines_a) + seg(lines_b))
    expected = {}
    for name in ("crashed", "live"):
        d = mr.open(os.path.join(root, name))
        recs = d.records()
        expected[name] = {"records": [r.name for r in recs],
                          "data": {r.name: r.raw for r in recs}}
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(os.path.join(root, "crashed"), os.path.join(tmp, "crashed"))
        recover_store(open_store(os.path.join(tmp, "crashed"), read_only=False, create=False))
        rd = os.path.join(tmp, "crashed", "step0", "rank")
        expected["crashed"]["replay"] = {n: json.load(open(os.path.join(rd, n)))
                                         for n in ("dump.json", "stack.json", "construct.json")}
        for doc in expected["crashed"]["replay"].values():
            doc.pop("dump_data_dir", None)
    put(os.path.join(root, "expected.json"), dumps({
        "description": "Crash journals (spec/FORMAT.md 17): 'crashed' holds a journal only (two segments, a torn "
                       "last line, a record in two halves, an unknown line, an inline stack); 'live' a document "
                       "and a journal (the document wins, journal-only records are appended). For each, the "
                       "records msprobe-lake reads; for 'crashed', the documents its replay publishes "
                       "(dump_data_dir left out).", "format_version": "1.0", **expected}))


# ------------------------------------------------------------------ golden/zarr-pytorch

def golden_zarr(root: str) -> None:
    import torch

    from msprobe.format.stats import reference_stats

    x = (np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5) / 4
    bf = _bf16_values(np.linspace(-2, 2, 6).astype(np.float32)).reshape(2, 3)
    ids = np.array([[1, 7, 3], [0, 2, 9]], dtype=np.int64)
    tensors = {
        "Functional.relu.0.forward.input.0.pt": x, "Functional.relu.0.forward.output.0.pt": np.maximum(x, 0),
        "Tensor.bfloat16.0.forward.input.0.pt": x,  # the same bytes: stored once
        "Tensor.bfloat16.0.forward.output.0.pt": ("bfloat16", bf),
        "Functional.embedding.0.forward.input.0.pt": ids,
        "Tensor.eq.0.forward.output.0.pt": ids > 2,
        "Tensor.sum.0.forward.output.0.pt": np.array(ids.sum()),
        "Torch.cat.0.forward.input.0.0.pt": np.zeros((0, 3), dtype=np.float32),
    }

    def entry(name):
        v = tensors[name]
        logical, a = v if isinstance(v, tuple) else (str(v.dtype), v)
        st = reference_stats(a, dialect="msprobe-lake", logical_dtype=logical if logical == "bfloat16" else None)
        return {"type": "torch.Tensor", "dtype": f"torch.{logical}", "shape": list(a.shape), "Max": st[0],
                "Min": st[1], "Mean": st[2], "Norm": st[3], "requires_grad": False, "data_name": name}

    data = {
        "Functional.relu.0.forward": {"input_args": [entry("Functional.relu.0.forward.input.0.pt")],
                                      "input_kwargs": {}, "output": [entry("Functional.relu.0.forward.output.0.pt")]},
        "Tensor.bfloat16.0.forward": {"input_args": [entry("Tensor.bfloat16.0.forward.input.0.pt")],
                                      "input_kwargs": {}, "output": [entry("Tensor.bfloat16.0.forward.output.0.pt")]},
        "Functional.embedding.0.forward": {"input_args": [entry("Functional.embedding.0.forward.input.0.pt")],
                                           "input_kwargs": {}, "output": [None]},
        "Tensor.eq.0.forward": {"input_args": [], "input_kwargs": {}, "output": [entry("Tensor.eq.0.forward.output.0.pt")]},
        "Tensor.sum.0.forward": {"input_args": [], "input_kwargs": {}, "output": [entry("Tensor.sum.0.forward.output.0.pt")]},
        "Torch.cat.0.forward": {"input_args": [[entry("Torch.cat.0.forward.input.0.0.pt")]], "input_kwargs": {},
                                "output": [None]},
    }
    rank = os.path.join(root, "step0", "rank")
    os.makedirs(os.path.join(rank, "dump_tensor_data"))
    for name, v in tensors.items():
        logical, a = v if isinstance(v, tuple) else (None, v)
        t = torch.from_numpy(np.array(a, order="C").reshape(a.shape))
        if logical == "bfloat16":
            t = t.to(torch.bfloat16)
        torch.save(t, os.path.join(rank, "dump_tensor_data", name))
    doc = {"task": "tensor", "level": "L1", "framework": "pytorch", "dump_data_dir": "tensors.zarr", "data": data}
    put(os.path.join(rank, "dump.json"), dumps(doc))
    put(os.path.join(rank, "msprobe_lake.json"), dumps({
        "format_version": "1.0", "dialect": "msprobe-lake", "producer": "msprobe-lake spec/vectors/generate_package.py",
        "framework": "pytorch", "task": "tensor", "level": "L1", "summary_mode": "statistics",
        "tensor_format": "pt"}))
    from msprobe.cli import main as cli_main

    rc = cli_main(["convert", root, "--to", "zarr"])
    assert rc == 0, rc
    with open(os.path.join(rank, "dump.json"), "rb") as f:
        doc = json.loads(f.read())
    doc["dump_data_dir"] = "tensors.zarr"  # not the temporary path it was converted at
    put(os.path.join(rank, "dump.json"), dumps(doc))
    with open(os.path.join(rank, "tensors.zarr", "zarr.json"), "rb") as f:
        manifest = json.loads(f.read())["attributes"]["msprobe_lake"]
    exp = []
    for name, v in tensors.items():
        logical, a = v if isinstance(v, tuple) else (str(v.dtype), v)
        exp.append({"data_name": name, "dtype": logical, "shape": list(a.shape),
                    "values": np.asarray(a).reshape(-1).tolist(), "payload": manifest["tensors"][name][0]})
    put(os.path.join(root, "expected.json"), dumps({
        "description": "A PyTorch L1 tensor dump whose tensors are in a Zarr v3 store (spec/FORMAT.md 21): float32, "
                       "bfloat16 (stored as uint16 bits), int64, bool, a 0-d and an empty tensor; the input of "
                       "Tensor.bfloat16 has the same bytes as relu's input and shares its payload. Made by "
                       "'msprobe convert --to zarr' from .pt files.", "format_version": "1.0",
        "rank_dirs": ["step0/rank"], "tensors": exp}))


def generate(out: str) -> None:
    vec = os.path.join(out, "vectors")
    put(os.path.join(vec, "statistics.json"), dumps(statistics_vectors()))
    put(os.path.join(vec, "dialects.json"), dumps(dialect_vectors()))
    for name, fn in (("layouts", layouts), ("journal", journals)):
        shutil.rmtree(os.path.join(vec, name), ignore_errors=True)
        fn(os.path.join(vec, name))
    gold = os.path.join(out, "golden", "zarr-pytorch")
    shutil.rmtree(gold, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:  # converted at a temporary path, then moved in
        golden_zarr(os.path.join(tmp, "zarr-pytorch"))
        shutil.copytree(os.path.join(tmp, "zarr-pytorch"), gold)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.dirname(HERE), help="spec directory to write into (default: spec/)")
    generate(ap.parse_args(argv).out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
