"""An independent writer of the msprobe dump format 1.0, written from spec/FORMAT.md alone.

``write_dump`` turns a list of calls (numpy arrays for tensors, Python values for the rest)
into a dump of one dialect (section 4), task and summary mode: the layout of section 5, the
names of section 7, the documents of sections 8-13, the tensor files and mapping.csv of
section 14 (or, with ``zarr=True``, the Zarr tensor store of section 21, through the generic
``zarr`` library), the statistics and checksums of section 15, the marker of section 6 and,
optionally, only a crash journal (section 17). Imports nothing of msprobe-lake.
"""
from __future__ import annotations

import json
import os
from typing import Any, Optional

import numpy as np
from reader import MAX_FILE_NAME_LENGTH, crc32_hex, dumps_indent1, element_bytes, logical_dtype, stats, xor_md5

_MS_DTYPES = {"float32": "Float32", "float16": "Float16", "float64": "Float64", "bfloat16": "BFloat16",
              "int8": "Int8", "int16": "Int16", "int32": "Int32", "int64": "Int64", "uint8": "UInt8",
              "bool": "Bool", "complex64": "Complex64"}


class BF16:
    """A bfloat16 tensor given by its float32 values (each must be exact in bfloat16)."""

    def __init__(self, values: np.ndarray):
        self.values = np.asarray(values, dtype=np.float32)


class Param:
    """A module parameter (an nn.Parameter: type torch.nn.parameter.Parameter / mindspore.Parameter)."""

    def __init__(self, value: Any):
        self.value = value


class Call:
    """One record. ``kind``: api | module | parameters_grad | debug.

    api: ``Call("api", "Functional.linear", "forward", n, sections)``; module:
    ``Call("module", "Module.fc.Linear", "forward", n, sections)``; parameters_grad:
    ``Call("parameters_grad", "Module.fc.Linear", None, n, {name: grad})``; debug:
    ``Call("debug", "logits", None, n, value)``. ``sections``: {"input_args": [...],
    "input_kwargs": {...}, "output": [...], "parameters": {...}} (forward) or {"input": [...],
    "output": [...]} (backward)."""

    def __init__(self, kind: str, base: str, direction: Optional[str], n: int, body: Any,
                 parent: Optional[str] = None, stack: Optional[list] = None):
        self.kind, self.base, self.direction, self.n, self.body = kind, base, direction, n, body
        self.parent, self.stack = parent, stack


def record_name(c: Call, dialect: str) -> str:
    """7.1 (and 4.1: parameters_grad with a count in msprobe-26 only)."""
    if c.kind == "api":
        return f"{c.base}.{c.n}.{c.direction}"
    if c.kind == "module":
        return f"{c.base}.{c.direction}.{c.n}"
    if c.kind == "parameters_grad":
        return f"{c.base}.parameters_grad.{c.n}" if dialect == "msprobe-26" else f"{c.base}.parameters_grad"
    return f"{c.base}.{c.n}.debug"


class _Writer:
    def __init__(self, rank_path: str, dialect: str, framework: str, task: str, mode: str, zarr: bool = False):
        self.path, self.dialect, self.framework, self.task, self.mode = rank_path, dialect, framework, task, mode
        self.ext = "pt" if framework == "pytorch" else "npy"
        self.files: dict = {}  # stored name -> bytes
        self.mapping: list = []
        self.zarr = zarr
        self.payloads: list = []  # (data_name, logical dtype, shape, stored array): section 21

    # -- 10.2 tensor entries
    def tensor(self, value: Any, data_name: Optional[str], param: bool = False) -> dict:
        bf16 = isinstance(value, BF16)
        a = value.values if bf16 else np.asarray(value)
        np_dtype = "bfloat16" if bf16 else str(a.dtype)
        if self.framework == "pytorch":
            ttype = "torch.nn.parameter.Parameter" if param else "torch.Tensor"
            dtype = f"torch.{np_dtype}"
        else:
            ttype = "mindspore.Parameter" if param else "mindspore.Tensor"
            dtype = _MS_DTYPES[np_dtype]
        e: dict = {"type": ttype, "dtype": dtype, "shape": list(a.shape)}
        if self.mode != "xor":
            mx, mn, mean, norm = stats(a, dtype, self.dialect, self.framework)
            e.update({"Max": mx, "Min": mn, "Mean": mean, "Norm": norm})
        elif self.mode == "xor":
            e["md5"] = xor_md5(a, dtype)
        if self.framework == "pytorch":
            e["requires_grad"] = bool(param)
        if self.mode == "md5":
            cast = self.dialect == "msprobe-8" or (self.framework == "mindspore" and self.dialect != "msprobe-lake")
            src = a.astype(np.float32) if cast and bf16 else a  # 15.2
            e["md5"] = crc32_hex(element_bytes(src, "float32" if src is not a else dtype))
        if self.task == "tensor" and data_name is not None:
            name = f"{data_name}.{self.ext}"
            e["data_name"] = name
            self.save(name, a, bf16)
        return e

    def save(self, name: str, a: np.ndarray, bf16: bool) -> None:
        """14.1 (and 7.3 for names over 255 characters); 21 with a Zarr store."""
        if self.zarr:
            stored = np.frombuffer(element_bytes(a, "bfloat16" if bf16 else str(a.dtype)),
                                   dtype="<u2" if bf16 else a.dtype.newbyteorder("<"))
            self.payloads.append((name, "bfloat16" if bf16 else logical_dtype(str(a.dtype)), list(a.shape), stored))
            return
        if self.ext == "pt":
            import io

            import torch

            t = torch.from_numpy(np.array(a, order="C", copy=True).reshape(a.shape))
            if bf16:
                t = t.to(torch.bfloat16)
            buf = io.BytesIO()
            torch.save(t, buf)
            data = buf.getvalue()
        elif bf16:  # 14.1: raw little-endian bytes, no header
            data = element_bytes(a, "bfloat16")
        else:
            import io

            buf = io.BytesIO()
            np.save(buf, np.array(a, order="C").reshape(a.shape), allow_pickle=False)
            data = buf.getvalue()
        stored = name
        if len(name) > MAX_FILE_NAME_LENGTH:
            stored = f"{len(self.mapping) + 1:032d}.{self.ext}"
            self.mapping.append((stored, name))
        self.files[stored] = data

    # -- 10.3-10.8 other values
    def value(self, v: Any, data_name: Optional[str]) -> Any:
        if v is None:
            return None
        if isinstance(v, Param):
            return self.tensor(v.value, data_name, param=True)
        if isinstance(v, (np.ndarray, BF16)):
            return self.tensor(v, data_name)
        if isinstance(v, bool):
            return {"type": "bool", "value": v}
        if isinstance(v, int):
            return {"type": "int", "value": v}
        if isinstance(v, float):
            return {"type": "float", "value": v}
        if isinstance(v, str):
            return {"type": "str", "value": v}
        if isinstance(v, slice):
            return {"type": "slice", "value": [v.start, v.stop, v.step]}
        if v is Ellipsis:
            return {"type": "ellipsis", "value": "..."}
        if isinstance(v, (list, tuple)):
            return [self.value(x, f"{data_name}.{i}" if data_name else None) for i, x in enumerate(v)]
        if isinstance(v, dict):
            return {k: self.value(x, f"{data_name}.{k}" if data_name else None) for k, x in v.items()}
        raise TypeError(f"cannot write {type(v).__name__}")

    def record(self, c: Call, name: str) -> Any:
        """9.2: the record's value, keys in the spec's order; data names of 7.2."""
        if c.kind == "debug":
            return self.value(c.body, name)
        if c.kind == "parameters_grad":
            return {p: [self.value(g, f"{name}.{p}")] for p, g in c.body.items()}
        b = c.body
        out: dict = {}
        if c.direction == "forward":
            if "input_args" in b:
                out["input_args"] = [self.value(x, f"{name}.input.{i}") for i, x in enumerate(b["input_args"])]
            if "input_kwargs" in b:
                out["input_kwargs"] = {k: self.value(x, f"{name}.kwargs.{k}") for k, x in b["input_kwargs"].items()}
            recompute = self.dialect == "msprobe-8"
            if recompute and c.kind == "api":
                out["is_recompute"] = False  # 9.2: before output on API records
            if "output" in b:
                out["output"] = [self.value(x, f"{name}.output.{i}") for i, x in enumerate(b["output"])]
            if "parameters" in b:
                out["parameters"] = {k: self.value(Param(x), f"{name}.parameters.{k}")
                                     for k, x in b["parameters"].items()}
            if recompute and c.kind == "module":
                out["is_recompute"] = False  # 9.2: last on module records
        else:
            out["input"] = [self.value(x, f"{name}.input.{i}") for i, x in enumerate(b.get("input", []))]
            out["output"] = [self.value(x, f"{name}.output.{i}") for i, x in enumerate(b.get("output", []))]
        return out


def rank_dir_name(dialect: str, rank: Optional[int], pid: int) -> str:
    """5.2 / 4.1."""
    if rank is not None:
        return f"rank{rank}"
    return f"proc{pid}" if dialect == "msprobe-26" else "rank"


def write_dump(root: str, calls: list, *, dialect: str = "msprobe-lake", framework: str = "pytorch",
               task: str = "statistics", mode: str = "statistics", level: str = "L1", steps: tuple = (0,),
               ranks: tuple = (None,), pid: int = 4242, journal_only: bool = False, zarr: bool = False) -> list:
    """Write ``calls`` for every step and rank; return the rank directory paths."""
    out = []
    for step in steps:
        for rank in ranks:
            rdir = os.path.join(root, f"step{step}", rank_dir_name(dialect, rank, pid))
            os.makedirs(rdir, exist_ok=True)
            out.append(rdir)
            _write_rank(rdir, calls, dialect, framework, task, mode, level, step, rank, journal_only, zarr)
    return out


def _put(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


_CHUNK_BYTES = 16  # producer's choices (21.3): tiny, so that payloads span inner chunks and shards are padded
_SHARD_CHUNKS = 4


def write_zarr(rdir: str, payloads: list) -> None:
    """Section 21: one 1-D array per logical dtype, payloads concatenated (equal bytes stored once),
    a payload never straddling two shards (the writer pads to the next shard), the manifest in
    the group's attributes."""
    import hashlib

    import zarr
    from zarr.codecs import BloscCodec

    root = os.path.join(rdir, "tensors.zarr")
    by_dtype: dict = {}
    manifest: dict = {"layout_version": "1.0", "complete": True, "compression": "zstd", "arrays": {},
                      "payloads": [], "tensors": {}, "incomplete": []}
    seen: dict = {}
    for name, ld, shape, stored in payloads:
        raw = stored.tobytes()
        sha = hashlib.sha256(raw).hexdigest()[:32]
        key = (ld, len(raw), sha)
        if key not in seen:
            parts = by_dtype.setdefault(ld, {"parts": [], "length": 0, "dtype": stored.dtype})
            size = stored.dtype.itemsize
            chunk = max(1, _CHUNK_BYTES // size)
            shard = chunk * _SHARD_CHUNKS
            n = stored.size
            start = parts["length"]
            if n and n <= shard and start // shard != (start + n - 1) // shard:
                pad = shard - start % shard  # the next shard boundary
                parts["parts"].append(np.zeros(pad, dtype=stored.dtype))
                start += pad
            parts["parts"].append(stored)
            parts["length"] = start + n
            seen[key] = len(manifest["payloads"])
            manifest["payloads"].append([ld, start, n, sha])
        manifest["tensors"][name] = [seen[key], shape]
    group = zarr.open_group(root, mode="w", zarr_format=3)
    for ld, parts in by_dtype.items():
        dt = parts["dtype"]
        chunk = max(1, _CHUNK_BYTES // dt.itemsize)
        shard = chunk * _SHARD_CHUNKS
        data = np.concatenate(parts["parts"]) if parts["parts"] else np.zeros(0, dt)
        storage = str(np.dtype(dt).newbyteorder("="))
        arr = group.create_array(ld, shape=(len(data),), dtype=storage,
                                 chunks=(chunk,), shards=(shard,), fill_value=0,
                                 compressors=[BloscCodec(cname="zstd", clevel=1, shuffle="bitshuffle",
                                                         typesize=dt.itemsize)],
                                 attributes={"msprobe_lake": {"logical_dtype": ld, "storage_dtype": storage,
                                                              "layout_version": "1.0"}})
        if len(data):
            arr[:] = data
        cdir = os.path.join(root, ld, "c")
        shards = {n: os.path.getsize(os.path.join(cdir, n)) for n in sorted(os.listdir(cdir), key=int)} \
            if os.path.isdir(cdir) else {}
        manifest["arrays"][ld] = {"shards": shards, "shard_elements": shard, "chunk_elements": chunk,
                                  "storage_dtype": storage, "compressed": True}
    group.attrs["msprobe_lake"] = manifest


def _write_rank(rdir: str, calls: list, dialect: str, framework: str, task: str, mode: str, level: str,
                step: int, rank: Optional[int], journal_only: bool, zarr: bool = False) -> None:
    w = _Writer(rdir, dialect, framework, task, mode, zarr)
    data: dict = {}
    construct: dict = {}
    stacks: dict = {}
    for c in calls:
        name = record_name(c, dialect)
        data[name] = w.record(c, name)
        if level in ("L0", "mix") and c.kind in ("api", "module"):
            construct[name] = c.parent  # 12
        if c.stack and c.kind in ("api", "module") and c.direction == "forward":
            stacks.setdefault(tuple(c.stack), []).append(name)  # 11.1
    debug = level == "debug"
    doc = {"task": task, "level": level, "framework": framework,
           "dump_data_dir": os.path.join(rdir, "dump_tensor_data") if w.files else None, "data": data}
    if zarr:
        write_zarr(rdir, w.payloads)
        doc["dump_data_dir"] = os.path.join(rdir, "tensors.zarr")  # 21.1
    if w.files:
        os.makedirs(os.path.join(rdir, "dump_tensor_data"), exist_ok=True)
        for n, b in w.files.items():
            _put(os.path.join(rdir, "dump_tensor_data", n), b)
        if w.mapping:  # 14.3: converted name,original name
            _put(os.path.join(rdir, "dump_tensor_data", "mapping.csv"),
                 "".join(f"{a},{b}\n" for a, b in w.mapping).encode("ascii"))
    stack_doc = {str(i): [names, list(fr)] for i, (fr, names) in enumerate(stacks.items())}
    doc_bytes = dumps_indent1(doc).encode("ascii")
    if journal_only:  # 17: a step killed before its documents were published
        os.makedirs(os.path.join(rdir, ".journal"), exist_ok=True)
        lines = []
        sid_of = {}
        for i, (fr, names) in enumerate(stacks.items()):
            lines.append({"stack_id": str(i), "frames": list(fr)})
            for n in names:
                sid_of[n] = str(i)
        for n, v in data.items():
            line: dict = {"name": n, "record": v}
            if n in construct:
                line["parent"] = construct[n]
            if n in sid_of:
                line["stack_id"] = sid_of[n]
            lines.append(line)
        body = "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines)
        _put(os.path.join(rdir, ".journal", "000001.jsonl"), (body + '{"name": "torn').encode("utf-8"))
    else:
        _put(os.path.join(rdir, "debug.json" if debug else "dump.json"), doc_bytes)
        if not debug:
            _put(os.path.join(rdir, "stack.json"), dumps_indent1(stack_doc).encode("ascii"))
            _put(os.path.join(rdir, "construct.json"), dumps_indent1(construct).encode("ascii"))
    if dialect == "msprobe-lake":  # 6
        marker = {"format_version": "1.0", "dialect": "msprobe-lake", "producer": "spec-check 1.0",
                  "framework": framework, "task": task, "level": level, "summary_mode": mode,
                  "tensor_format": "zarr" if zarr else ("pt" if framework == "pytorch" else "npy"),
                  "step": step, "rank": rank,
                  "records": len(data)}
        if not journal_only:
            marker["document_crc32"] = crc32_hex(doc_bytes)
        marker["files"] = {n: [len(b), crc32_hex(b)] for n, b in w.files.items()}
        _put(os.path.join(rdir, "msprobe_lake.json"), dumps_indent1(marker).encode("ascii"))
