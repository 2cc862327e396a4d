"""Small dumps in the real tool's layouts, written with plain json + torch.save / numpy.save.

Statistics are computed from the tensors actually saved, the way the dialect does
(26.x: integer Max/Min as ints and Mean/Norm null; 8.x: floats), so tests can
compare JSON, tables and loaded tensors against each other.
"""
from __future__ import annotations

import json
import os
from typing import Optional

import numpy as np

FRAMES = ["File train.py, line 10, in forward, \n return F.linear(x, w, b)",
          "File train.py, line 30, in <module>, \n y = model(x)"]


def _stats(a: np.ndarray, dialect: str) -> dict:
    if a.size == 0:
        return {"Max": None, "Min": None, "Mean": None, "Norm": None}
    if a.dtype == np.bool_:
        return {"Max": bool(a.any()), "Min": bool(a.all()), "Mean": None, "Norm": None}
    if np.issubdtype(a.dtype, np.integer):
        if dialect == "msprobe-8":
            f = a.astype(np.float32)
            return {"Max": float(f.max()), "Min": float(f.min()), "Mean": float(f.mean()),
                    "Norm": float(np.linalg.norm(f.reshape(-1)))}
        return {"Max": int(a.max()), "Min": int(a.min()), "Mean": None, "Norm": None}
    f = a.astype(np.float64)
    return {"Max": float(f.max()), "Min": float(f.min()), "Mean": float(f.mean()),
            "Norm": float(np.sqrt((f * f).sum()))}


class DumpWriter:
    """Writes one rank directory."""

    def __init__(self, rank_dir: str, *, dialect: str = "msprobe-26", framework: str = "pytorch",
                 task: str = "tensor", level: str = "mix", ext: Optional[str] = None):
        self.dir = rank_dir
        self.dialect = dialect
        self.framework = framework
        self.task = task
        self.level = level
        self.ext = ext or ("npy" if framework == "mindspore" else "pt")
        self.data: dict = {}
        self.stack: dict = {}
        self.construct: dict = {}
        self.tensors: dict = {}  # data_name -> the array saved
        self.mapping: dict = {}
        os.makedirs(os.path.join(rank_dir, "dump_tensor_data"), exist_ok=True)

    def tensor(self, a: np.ndarray, data_name: Optional[str], requires_grad: bool = False,
               raw_dtype: Optional[str] = None) -> dict:
        ms = self.framework == "mindspore"
        dtype = raw_dtype or str(a.dtype)
        if ms:
            spelled = {"float32": "Float32", "float16": "Float16", "int64": "Int64", "int32": "Int32",
                       "bool": "Bool", "bfloat16": "BFloat16", "float64": "Float64"}[dtype]
            entry = {"type": "mindspore.Tensor", "dtype": spelled, "shape": list(a.shape)}
        else:
            entry = {"type": "torch.Tensor", "dtype": f"torch.{dtype}", "shape": list(a.shape)}
        entry.update(_stats(a, self.dialect))
        entry["requires_grad"] = requires_grad
        if self.task == "tensor" and data_name:
            fname = f"{data_name}.{self.ext}"
            entry["data_name"] = fname
            self._save(fname, a, raw_dtype)
        elif self.task == "md5":
            import zlib

            entry["md5"] = f"{zlib.crc32(np.ascontiguousarray(a).tobytes()) & 0xFFFFFFFF:08x}"
        return entry

    def _save(self, fname: str, a: np.ndarray, raw_dtype: Optional[str]) -> None:
        stored = fname
        if len(fname) > 255:  # the real tool renames and records the rename in mapping.csv
            stored = f"{abs(hash(fname)) % 10**32:032d}.{self.ext}"
            self.mapping[fname] = stored
        path = os.path.join(self.dir, "dump_tensor_data", stored)
        self.tensors[fname] = a
        if raw_dtype == "bfloat16":  # raw stream: the upper halves of float32 words
            bits = (a.astype(np.float32).view(np.uint32) >> 16).astype("<u2")
            with open(path, "wb") as f:
                f.write(bits.tobytes())
        elif self.ext == "pt":
            import torch

            torch.save(torch.from_numpy(np.array(a, order="C", copy=True)), path)
        else:
            np.save(path, a)

    def add(self, name: str, raw, parent: Optional[str] = "__none__", stack: bool = False) -> None:
        if self.dialect == "msprobe-8" and name.endswith(".forward") and isinstance(raw, dict):
            raw = {**raw, "is_recompute": False}
        self.data[name] = raw
        if parent != "__none__" and self.level in ("mix", "L0"):
            self.construct[name] = parent
        if stack:
            self.stack.setdefault("0", [[], FRAMES])[0].append(name)

    def write(self) -> None:
        doc = {"task": self.task, "level": self.level, "framework": self.framework,
               "dump_data_dir": os.path.join(self.dir, "dump_tensor_data") if self.task == "tensor" else None,
               "data": self.data}
        name = "debug.json" if self.level == "debug" else "dump.json"
        with open(os.path.join(self.dir, name), "w") as f:
            json.dump(doc, f, indent=1)
        if self.level != "debug":
            with open(os.path.join(self.dir, "stack.json"), "w") as f:
                json.dump(self.stack, f, indent=1)
            with open(os.path.join(self.dir, "construct.json"), "w") as f:
                json.dump(self.construct, f, indent=1)
        if self.mapping:
            with open(os.path.join(self.dir, "dump_tensor_data", "mapping.csv"), "w") as f:
                for k, v in self.mapping.items():  # the real tool's order: converted,original
                    f.write(f"{v},{k}\n")
        if self.task != "tensor" and not os.listdir(os.path.join(self.dir, "dump_tensor_data")):
            os.rmdir(os.path.join(self.dir, "dump_tensor_data"))


def torch_rank(rank_dir: str, *, dialect: str = "msprobe-26", task: str = "tensor", level: str = "mix",
               seed: int = 0, n_extra: int = 0) -> DumpWriter:
    """A Linear layer forward + backward, an int sum, a bool test, a cat of a list, and n_extra adds."""
    rng = np.random.default_rng(seed)
    w = DumpWriter(rank_dir, dialect=dialect, task=task, level=level)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    wt = rng.standard_normal((2, 4)).astype(np.float32)
    b = rng.standard_normal((2,)).astype(np.float32)
    y = x @ wt.T + b
    mod = "Module.fc.Linear.forward.0"
    lin = "Functional.linear.0.forward"
    w.add(lin, {"input_args": [w.tensor(x, f"{lin}.input.0"), w.tensor(wt, f"{lin}.input.1", True),
                               w.tensor(b, f"{lin}.input.2", True)],
                "input_kwargs": {}, "output": [w.tensor(y, f"{lin}.output.0", True)]}, parent=mod, stack=True)
    w.add(mod, {"input_args": [w.tensor(x, f"{mod}.input.0")], "input_kwargs": {},
                "output": [w.tensor(y, f"{mod}.output.0", True)],
                "parameters": {"weight": w.tensor(wt, f"{mod}.parameters.weight", True),
                               "bias": w.tensor(b, f"{mod}.parameters.bias", True)}}, parent=None, stack=True)
    ids = rng.integers(0, 10, size=(5,)).astype(np.int64)
    s = np.array(ids.sum(), dtype=np.int64)
    name = "Torch.sum.0.forward"
    w.add(name, {"input_args": [w.tensor(ids, f"{name}.input.0")],
                 "input_kwargs": {"dim": {"type": "int", "value": 0},
                                  "dtype": {"type": "torch.dtype", "value": "torch.int64"}},
                 "output": [w.tensor(s, f"{name}.output.0")]}, parent=None, stack=True)
    mask = y > 0
    name = "Torch.isfinite.0.forward"
    w.add(name, {"input_args": [w.tensor(y, f"{name}.input.0", True)], "input_kwargs": {},
                 "output": [w.tensor(mask, f"{name}.output.0")]}, parent=None, stack=True)
    cat = np.concatenate([x, x], axis=0)
    name = "Torch.cat.0.forward"
    w.add(name, {"input_args": [[w.tensor(x, f"{name}.input.0.0"), w.tensor(x, f"{name}.input.0.1")],
                                {"type": "int", "value": 0}],
                 "input_kwargs": {}, "output": [w.tensor(cat, f"{name}.output.0")]}, parent=None, stack=True)
    name = "Tensor.__getitem__.0.forward"
    w.add(name, {"input_args": [w.tensor(cat, f"{name}.input.0"),
                                [{"type": "slice", "value": [0, 2, None]}, {"type": "ellipsis", "value": "..."},
                                 None]],
                 "input_kwargs": {}, "output": [w.tensor(cat[0:2, ..., None], f"{name}.output.0")]},
          parent=None, stack=True)
    for i in range(n_extra):
        name = f"Tensor.__add__.{i}.forward"
        z = x + i
        w.add(name, {"input_args": [w.tensor(x, f"{name}.input.0"), {"type": "int", "value": i}],
                     "input_kwargs": {}, "output": [w.tensor(z, f"{name}.output.0")]}, parent=None, stack=True)
    gy = np.ones_like(y)
    name = "Functional.linear.0.backward"
    bmod = "Module.fc.Linear.backward.0"
    w.add(name, {"input": [w.tensor(gy, f"{name}.input.0")],
                 "output": [w.tensor(gy @ wt, f"{name}.output.0"), w.tensor(gy.T @ x, f"{name}.output.1"),
                            w.tensor(gy.sum(0), f"{name}.output.2")]}, parent=bmod)
    w.add(bmod, {"input": [w.tensor(gy, f"{bmod}.input.0")], "output": [w.tensor(gy @ wt, f"{bmod}.output.0")]},
          parent=None)
    pg = "Module.fc.Linear.parameters_grad" + (".0" if dialect != "msprobe-8" else "")
    w.add(pg, {"weight": [w.tensor(gy.T @ x, f"{pg}.weight")], "bias": [w.tensor(gy.sum(0), f"{pg}.bias")]})
    w.add("Tensor.add_.0.forward", {"input_args": [w.tensor(wt, "Tensor.add_.0.forward.input.0", True),
                                                   {"type": "float", "value": -0.1}],
                                    "input_kwargs": {"alpha": None}, "output": []})
    w.write()
    return w


def torch_dump(root: str, *, dialect: str = "msprobe-26", steps=(0,), ranks=(None,), task: str = "tensor",
               level: str = "mix", n_extra: int = 0) -> dict:
    """A dump root; returns {(step, rank_dir): DumpWriter}."""
    out = {}
    for step in steps:
        for rank in ranks:
            if rank is None:
                rd = "proc4242" if dialect == "msprobe-26" else "rank"
            else:
                rd = f"rank{rank}"
            out[(step, rd)] = torch_rank(os.path.join(root, f"step{step}", rd), dialect=dialect, task=task,
                                         level=level, seed=step * 10 + (rank or 0), n_extra=n_extra)
    return out


def mindspore_dump(root: str) -> dict:
    """A MindSpore jit dump: graph/ and pynative/ splits, .npy files, a raw bfloat16 file, mapping.csv."""
    out = {}
    rng = np.random.default_rng(7)
    for split in ("graph", "pynative"):
        rd = os.path.join(root, split, "step0", "rank0")
        w = DumpWriter(rd, dialect="msprobe-8", framework="mindspore", level="mix")
        x = rng.standard_normal((2, 3)).astype(np.float32)
        cell = "Cell.dense.Dense.forward.0"
        name = "Primitive.matmul.MatMul.0.forward"
        w.add(name, {"input_args": [w.tensor(x, f"{name}.input.0"), w.tensor(x.T, f"{name}.input.1")],
                     "input_kwargs": {}, "output": [w.tensor(x @ x.T, f"{name}.output.0")]}, parent=cell, stack=True)
        w.add(cell, {"input_args": [w.tensor(x, f"{cell}.input.0")], "input_kwargs": {},
                     "output": [w.tensor(x @ x.T, f"{cell}.output.0")]}, parent=None, stack=True)
        bf = np.array([[1.5, -2.0], [0.25, 3.0]], dtype=np.float32)  # exact in bfloat16
        name = "Mint.add.0.forward"
        w.add(name, {"input_args": [w.tensor(bf, f"{name}.input.0", raw_dtype="bfloat16")], "input_kwargs": {},
                     "output": [w.tensor(bf * 2, f"{name}.output.0", raw_dtype="bfloat16")]}, parent=None)
        long_name = "Jit." + "very_long_function_name_" * 12 + ".0.forward"
        w.add(long_name, {"input_args": [w.tensor(x, f"{long_name}.input.0")], "input_kwargs": {},
                          "output": []}, parent=None)
        w.write()
        out[(split, 0, "rank0")] = w
    return out


def debug_dump(root: str) -> DumpWriter:
    rng = np.random.default_rng(3)
    w = DumpWriter(os.path.join(root, "step0", "proc77"), task="statistics", level="debug")
    y = rng.standard_normal((3, 4)).astype(np.float32)
    w.add("y.0.debug", w.tensor(y, None, True))
    w.add("y_grad.0.debug", w.tensor(np.ones_like(y), None))
    w.add("info.0.debug", {"n": w.tensor(np.array([1, 2], dtype=np.int64), None), "scale": {"type": "float",
                                                                                         "value": 0.5}})
    w.write()
    return w


def debugger_dump(path, layers: int, nan: bool = False, index: bool = False) -> None:
    """A real (not synthetic) dump by our PrecisionDebugger into ``path``: one step of
    ``layers`` Linear layers at L1 (``nan``: a NaN in the last one's input); ``index``: the
    dumper writes the Parquet index at publish."""
    import torch

    from msprobe.pytorch import PrecisionDebugger

    PrecisionDebugger._reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(layers)])
    dbg = PrecisionDebugger(dump_path=str(path), level="L1", index=index)
    dbg.start(model)
    x = torch.ones(2, 4)
    for i, layer in enumerate(model):
        if nan and i == layers - 1:
            x = x.clone()
            x[0, 0] = float("nan")
        x = layer(x)
    dbg.stop()
    dbg.step()
    PrecisionDebugger._reset()
