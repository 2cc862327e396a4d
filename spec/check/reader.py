"""An independent reader of the msprobe dump format 1.0, written from spec/FORMAT.md alone.

It imports nothing of msprobe-lake: the standard library and numpy (torch only to load
``.pt`` files, zarr only to read a ``tensors.zarr`` store). Section numbers below are
those of spec/FORMAT.md. Used by tests/format/test_spec_check.py to check that the spec
is enough to read (and, with writer.py, to write) every dump the package reads.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import zlib
from typing import Any, Optional

import numpy as np

# ---------------------------------------------------------------- section 8: JSON documents

MAX_DEPTH = 64


class FormatError(ValueError):
    """A document or name that breaks a MUST of the spec."""


def _no_dups(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise FormatError(f"duplicate key {k!r}")  # 8.2
        out[k] = v
    return out


def _depth(v: Any, d: int = 0) -> int:
    if d > MAX_DEPTH:
        raise FormatError("nested deeper than 64 levels")  # 8.3
    if isinstance(v, dict):
        return max([_depth(x, d + 1) for x in v.values()] or [d])
    if isinstance(v, list):
        return max([_depth(x, d + 1) for x in v] or [d])
    return d


def load_json(data: bytes) -> Any:
    if data.startswith(b"\xef\xbb\xbf"):  # 8.5: a BOM MAY be skipped
        data = data[3:]
    try:
        text = data.decode("utf-8")  # 8.5: not UTF-8 -> rejected
    except UnicodeDecodeError as exc:
        raise FormatError(f"not UTF-8: {exc}") from None
    try:
        obj = json.loads(text, object_pairs_hook=_no_dups)  # 8.1: NaN/Infinity accepted by json
    except RecursionError:
        raise FormatError("nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise FormatError(f"not JSON: {exc}") from None
    _depth(obj)
    return obj


def dumps_indent1(obj: Any) -> str:
    """8.4: json.dump(obj, indent=1): ASCII only, repr floats, no trailing newline."""
    return json.dumps(obj, indent=1, ensure_ascii=True)


# ---------------------------------------------------------------- section 7: naming grammar

SEG = r"[^./\\\s]+"
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
DEBUG_NAME_RE = re.compile(r"^(?P<name>[^/\\\x00]+?)\.(?P<n>\d+)\.debug$")
PARAMS_GRAD_NAME_RE = re.compile(rf"^(?P<prefix>Module|Cell)\.(?P<path>{SEG}(?:\.{SEG})*?)\.(?P<cls>{IDENT})"
                                 rf"\.parameters_grad(?:\.(?P<n>\d+))?$")
MODULE_NAME_RE = re.compile(rf"^(?P<prefix>Module|Cell)\.(?P<path>{SEG}(?:\.{SEG})*?)\.(?P<cls>{IDENT})"
                            rf"\.(?P<direction>forward|backward)\.(?P<n>\d+)$")
API_NAME_RE = re.compile(rf"^(?P<prefix>{IDENT})\.(?P<api>{SEG}(?:\.{SEG})*?)\.(?P<n>\d+)"
                         rf"\.(?P<direction>forward|backward)$")
DATA_NAME_RE = re.compile(r"^(?P<record>.+?\.(?:\d+\.(?:forward|backward)|(?:forward|backward)\.\d+|"
                          r"parameters_grad(?:\.\d+)?|\d+\.debug))(?:\.(?P<rest>.+?))?\.(?P<ext>pt|npy)$")
API_PREFIXES = {"Tensor", "Torch", "Functional", "NPU", "VF", "Aten", "Distributed", "MindSpeed",
                "Primitive", "Mint", "MintFunctional", "MintDistributed", "Jit", "Communication"}
IO_WORDS = ("input", "output", "kwargs", "parameters")
STEP_DIR_RE = re.compile(r"^step(?P<step>\d+)$")
RANK_DIR_RE = re.compile(r"^(?:rank(?P<rank>\d+)?|proc(?P<pid>\d+))$")
MAX_FILE_NAME_LENGTH = 255
CONVERTED_RE = re.compile(r"^\d{32}(\.[A-Za-z0-9]+)?$")


def _safe_name(name: str) -> None:
    """7.1: the checks every record name passes first."""
    if not isinstance(name, str) or not name:
        raise FormatError("empty name")
    for bad in ("/", "\\", "\x00", "\r", "\n", "\t"):
        if bad in name:
            raise FormatError(f"{bad!r} in name")
    if name.startswith(".") or name.endswith(".") or ".." in name:
        raise FormatError("leading, trailing or empty dotted segment")


def parse_record_name(name: str, strict: bool = False) -> dict:
    """7.1: kind and parsed fields."""
    _safe_name(name)
    m = DEBUG_NAME_RE.match(name)
    if m:
        base = m.group("name")
        grad = base.endswith("_grad")
        return {"kind": "debug", "prefix": "", "api_name": base[:-5] if grad else base, "class_name": None,
                "call_index": int(m.group("n")), "direction": None, "is_grad": grad}
    m = PARAMS_GRAD_NAME_RE.match(name)
    if m:
        return {"kind": "parameters_grad", "prefix": m.group("prefix"), "api_name": m.group("path"),
                "class_name": m.group("cls"), "call_index": int(m.group("n")) if m.group("n") else None,
                "direction": None}
    m = MODULE_NAME_RE.match(name)
    if m:
        return {"kind": "module", "prefix": m.group("prefix"), "api_name": m.group("path"),
                "class_name": m.group("cls"), "call_index": int(m.group("n")), "direction": m.group("direction")}
    m = API_NAME_RE.match(name)
    if m and m.group("prefix") not in ("Module", "Cell"):
        prefix, api = m.group("prefix"), m.group("api")
        if strict and prefix not in API_PREFIXES:
            raise FormatError(f"unknown API prefix {prefix!r}")
        segs = api.split(".")
        if prefix == "Primitive" and len(segs) >= 2:
            api_name, cls = segs[0], ".".join(segs[1:])
        else:
            api_name, cls = api, None
        return {"kind": "api", "prefix": prefix, "api_name": api_name, "class_name": cls,
                "call_index": int(m.group("n")), "direction": m.group("direction")}
    raise FormatError(f"{name!r} follows no rule of the naming grammar")


def check_file_name(name: Any) -> None:
    """7.2: a data name is a plain file name."""
    if not isinstance(name, str) or not name or name in (".", "..") or name.startswith(".."):
        raise FormatError(f"unsafe data name {name!r}")
    if any(c in name for c in ("/", "\\", "\x00")) or re.match(r"^[A-Za-z]:", name):
        raise FormatError(f"unsafe data name {name!r}")


def parse_data_name(name: str, record: Optional[str] = None) -> dict:
    """7.2: record, io, path, ext."""
    check_file_name(name)
    if record is not None:
        ext = name.rsplit(".", 1)[-1] if "." in name else ""
        if ext not in ("pt", "npy") or not name.startswith(record + "."):
            raise FormatError(f"{name!r} is not a data name of {record!r}")
        middle = name[len(record) + 1:-(len(ext) + 1)] if len(name) > len(record) + len(ext) + 1 else ""
        rest = middle or None
    else:
        m = DATA_NAME_RE.match(name)
        if not m:
            raise FormatError(f"{name!r} is not a data name")
        record, rest, ext = m.group("record"), m.group("rest"), m.group("ext")
    segs = rest.split(".") if rest else []
    io_ = segs[0] if segs and segs[0] in IO_WORDS else None
    return {"record": record, "io": io_, "path": segs[1:] if io_ else segs, "ext": ext}


# ---------------------------------------------------------------- section 10: argument values

TENSOR_TYPES = {"torch.Tensor", "torch.nn.parameter.Parameter", "mindspore.Tensor", "mindspore.Parameter",
                "mindspore.common.parameter.Parameter", "numpy.ndarray", "mindtorch.Tensor"}
STAT_KEYS = ("Max", "Min", "Mean", "Norm")


def is_tensor_entry(v: Any) -> bool:
    """10.2: a known tensor type, or any object with a string type and both dtype and shape."""
    if not isinstance(v, dict) or not isinstance(v.get("type"), str):
        return False
    return v["type"] in TENSOR_TYPES or ("dtype" in v and "shape" in v)


def check_tensor_entry(t: dict) -> None:
    if not isinstance(t.get("dtype"), str):
        raise FormatError("dtype must be a string")
    sh = t.get("shape")
    if not isinstance(sh, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in sh):
        raise FormatError("shape must be an array of non-negative integers")
    for k in STAT_KEYS:
        if k in t and t[k] is not None and not isinstance(t[k], (int, float, bool)):
            raise FormatError(f"{k} must be a number, boolean or null")
    if "data_name" in t and t["data_name"] is not None:
        if not isinstance(t["data_name"], str):
            raise FormatError("data_name must be a string")
        check_file_name(t["data_name"])
    if "md5" in t and t["md5"] is not None and (isinstance(t["md5"], bool) or
                                                not isinstance(t["md5"], (str, int, float))):
        raise FormatError("md5 must be a string, a number or null")
    if "requires_grad" in t and t["requires_grad"] is not None and not isinstance(t["requires_grad"], bool):
        raise FormatError("requires_grad must be a boolean")


def tensor_leaves(value: Any, path: tuple = ()):
    """(path, entry) of every tensor entry, depth first in document order (section 18's rows)."""
    if is_tensor_entry(value):
        yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from tensor_leaves(v, path + (str(k),))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from tensor_leaves(v, path + (str(i),))


# ---------------------------------------------------------------- section 15: statistics, md5, xor

_TORCH_NP = {"float32": "float32", "float16": "float16", "float64": "float64", "bfloat16": "bfloat16",
             "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64", "uint8": "uint8",
             "uint16": "uint16", "uint32": "uint32", "uint64": "uint64", "bool": "bool",
             "complex64": "complex64", "complex128": "complex128", "long": "int64", "int": "int32",
             "short": "int16", "float": "float32", "double": "float64", "half": "float16"}


def logical_dtype(dtype: str) -> str:
    """torch.float32 / Float32 / float32 -> float32 (section 21's array names)."""
    d = dtype[len("torch."):] if dtype.startswith("torch.") else dtype
    d = d.lower()
    return _TORCH_NP.get(d, d)


def bf16_round(x: float) -> float:
    """15.1 rule 8: float32 -> bfloat16, round to nearest even on the upper 16 bits."""
    bits = int(np.array([x], dtype=np.float32).view(np.uint32)[0])
    if math.isnan(x):
        return x
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return float(np.array([bits & 0xFFFFFFFF], dtype=np.uint32).view(np.float32)[0])


def _py(x: Any) -> Any:
    return x.item() if hasattr(x, "item") else x


def stats(a: np.ndarray, dtype: str, dialect: str = "msprobe-26", framework: str = "pytorch") -> tuple:
    """15.1: (Max, Min, Mean, Norm). ``a`` holds the values (bfloat16/float8 widened to float32)."""
    ld = logical_dtype(dtype)
    if a.size == 0:
        return (None, None, None, None)
    if ld == "bool":
        return (bool(a.any()), bool(a.all()), None, None)
    if a.ndim == 0:
        v = _py(a)
        return (v, v, v, v)
    ms = framework == "mindspore"
    if np.iscomplexobj(a):
        m = np.abs(a)
        return (_py(m.max()), _py(m.min()), _py(m.mean()), _py(np.linalg.norm(m)) if ms else None)
    legacy = ms or dialect == "msprobe-8"
    if a.dtype.kind in "iu" or ld == "float64":
        if legacy:
            return _rule7(a.astype(np.float32), np.float32)
        if a.dtype.kind in "iu":
            return (int(a.max()), int(a.min()), None, None)
        return (float(a.max()), float(a.min()), None, None)
    if ld == "bfloat16":
        mx, mn, mean, norm = _rule7(a.astype(np.float32), np.float32)
        return (mx, mn, bf16_round(mean), bf16_round(norm))
    if ld in ("float32", "float16"):
        return _rule7(a, np.float32 if ld == "float32" else np.float16)
    return _rule7(a.astype(np.float32), np.float32)  # rule 9


def _rule7(a: np.ndarray, out) -> tuple:
    wide = a.astype(np.float64)
    with np.errstate(all="ignore"):
        mean = float(out(np.sum(wide) / wide.size))
        norm = float(out(np.sqrt(np.sum(wide * wide))))
    return (float(a.max()), float(a.min()), mean, norm)


def stats_equal(a: Any, b: Any) -> bool:
    """15.1's tolerance."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    fa, fb = float(a), float(b)
    if math.isnan(fa) or math.isnan(fb):
        return math.isnan(fa) and math.isnan(fb)
    if math.isinf(fa) or math.isinf(fb):
        return fa == fb
    return abs(fa - fb) <= 1e-8 + 1e-5 * abs(fb)


def element_bytes(a: np.ndarray, dtype: str) -> bytes:
    """15.2: the elements as little-endian bytes in C order, in the tensor's own dtype."""
    ld = logical_dtype(dtype)
    if ld == "bfloat16":  # a holds the float32 widening: the upper 16 bits are the bfloat16
        return (np.ascontiguousarray(a, dtype="<f4").view("<u4") >> 16).astype("<u2").tobytes()
    arr = np.ascontiguousarray(a)
    return arr.astype(arr.dtype.newbyteorder("<")).tobytes()


def crc32_hex(data: bytes) -> str:
    return f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"


def xor_md5(a: np.ndarray, dtype: str) -> Any:
    """15.3: xor mode's md5 value (null when empty, the value when 0-d)."""
    if a.size == 0:
        return None
    if a.ndim == 0:
        v = _py(a)
        if isinstance(v, (bool, int)):
            return f"0x{int(v) & ((1 << 64) - 1):016x}"
        return float(v)
    b = element_bytes(a, dtype)
    b += b"\x00" * (-len(b) % 8)
    x = np.bitwise_xor.reduce(np.frombuffer(b, dtype="<u8")) if b else 0
    return f"0x{int(x):016x}"


def summary_mode_of(entry: dict) -> str:
    """Section 24."""
    if "md5" not in entry:
        return "statistics"
    return "md5" if any(k in entry for k in STAT_KEYS) else "xor"


# ---------------------------------------------------------------- section 4.3: dialect detection

_INT_PREFIXES = ("torch.int", "torch.uint", "torch.long", "torch.short")
_PG_COUNT = re.compile(r"\.parameters_grad\.\d+$")
_FWD = re.compile(r"\.(?:\d+\.forward|forward\.\d+)$")
DIALECTS = ("msprobe-1", "msprobe-8", "msprobe-26", "msprobe-lake")


def _int_votes(v: Any, level: int) -> tuple:
    if level > 6:
        return 0, 0
    if isinstance(v, dict):
        if v.get("type") == "torch.Tensor" and str(v.get("dtype", "")).startswith(_INT_PREFIXES):
            sh, mx = v.get("shape"), v.get("Max")
            if isinstance(sh, list) and sh:
                if isinstance(mx, float):
                    return 1, 0
                if isinstance(mx, int) and not isinstance(mx, bool):
                    return 0, 1
            return 0, 0
        items = list(v.values())
    elif isinstance(v, list):
        items = v
    else:
        return 0, 0
    a = b = 0
    for x in items:
        p, q = _int_votes(x, level + 1)
        a, b = a + p, b + q
    return a, b


def vote(data: dict) -> tuple:
    v8 = v26 = 0
    for i, (name, rec) in enumerate(data.items()):
        if i >= 64 or abs(v8 - v26) > 8:
            break
        if name.endswith(".parameters_grad"):
            v8 += 2
        elif _PG_COUNT.search(name):
            v26 += 2
        elif _FWD.search(name) and isinstance(rec, dict):
            if "is_recompute" in rec:
                v8 += 1
            else:
                v26 += 1
        p, q = _int_votes(rec, 0)
        v8, v26 = v8 + p, v26 + q
    return v8, v26


def is_1x(header: Any, data: dict) -> bool:
    """4.3 step 4: no framework key (nor a fragment), no counted parameters_grad and no
    is_recompute in the first 64 records."""
    if not isinstance(header, dict) or "framework" in header or header.get("fragment"):
        return False
    for i, (name, rec) in enumerate(data.items()):
        if i >= 64:
            break
        if _PG_COUNT.search(name) or (isinstance(rec, dict) and "is_recompute" in rec):
            return False
    return True


def detect_dialect(rank_dir_names: list, data: Optional[dict], marker: Optional[dict],
                   header: Any = None) -> Optional[str]:
    if marker and marker.get("dialect") in DIALECTS:
        return marker["dialect"]
    if any(n.startswith("proc") for n in rank_dir_names):
        return "msprobe-26"
    if data is None:
        return "msprobe-8" if rank_dir_names else None
    if is_1x(header, data):
        return "msprobe-1"
    v8, v26 = vote(data)
    return "msprobe-26" if v26 > v8 else "msprobe-8"


# ---------------------------------------------------------------- section 5: layout

def _holds_documents(path: str) -> bool:
    """5.8 rule 1."""
    names = set(os.listdir(path))
    return bool(names & {"dump.json", "debug.json"}) or os.path.isdir(os.path.join(path, "dump_tensor_data"))


def _rank_of(name: str) -> Optional[int]:
    m = RANK_DIR_RE.match(name)
    return int(m.group("rank")) if m and m.group("rank") is not None else None


def _step_of(name: str) -> Optional[int]:
    m = STEP_DIR_RE.match(name)
    return int(m.group("step")) if m else None


def _found(path: str, step: Optional[int], split: Optional[str]) -> dict:
    name = os.path.basename(path)
    return {"split": split, "step": step, "rank": _rank_of(name), "rank_dir": name, "path": path}


def _rank_dirs_of(path: str, step: Optional[int], split: Optional[str]) -> list:
    return [_found(os.path.join(path, n), step, split) for n in os.listdir(path)
            if RANK_DIR_RE.match(n) and os.path.isdir(os.path.join(path, n))]


def _discover(path: str, split: Optional[str]) -> list:
    if _holds_documents(path):  # rule 1
        return [_found(path, _step_of(os.path.basename(os.path.dirname(path))), split)]
    names = [n for n in os.listdir(path) if os.path.isdir(os.path.join(path, n))]
    steps = [n for n in names if STEP_DIR_RE.match(n)]
    if steps:  # rule 2
        return [r for n in steps for r in _rank_dirs_of(os.path.join(path, n), _step_of(n), split)]
    if any(RANK_DIR_RE.match(n) for n in names):  # rule 3
        return _rank_dirs_of(path, _step_of(os.path.basename(path)), split)
    out = []
    if split is None:  # rule 4
        for sp in ("graph", "pynative"):
            if sp in names:
                out += _discover(os.path.join(path, sp), sp)
    return out


def discover(path: str) -> list:
    """5.8: [{split, step, rank, rank_dir, path}] in the spec's order."""
    path = os.path.abspath(path)
    if os.path.isfile(path) and os.path.basename(path) in ("dump.json", "debug.json"):
        path = os.path.dirname(path)  # 5.4
    out = _discover(path, None)
    order = {None: 0, "graph": 1, "pynative": 2}
    out.sort(key=lambda r: (order[r["split"]], (r["step"] is not None, r["step"] or 0),
                            (r["rank"] is not None, r["rank"] or 0), r["rank_dir"]))
    return out


KERNEL_RE = re.compile(r"^\d{14}$")


def kernel_dumps(path: str) -> list:
    """5.7: step<N>/<YYYYmmddHHMMSS>/<device>/.../<file>: their paths relative to the dump root."""
    out = []
    for n in sorted(os.listdir(path)):
        m = STEP_DIR_RE.match(n)
        if not m:
            continue
        for ts in sorted(os.listdir(os.path.join(path, n))):
            tsdir = os.path.join(path, n, ts)
            if KERNEL_RE.match(ts) and os.path.isdir(tsdir):
                for dp, _, fs in os.walk(tsdir):
                    for f in sorted(fs):
                        out.append(os.path.relpath(os.path.join(dp, f), path).replace(os.sep, "/"))
    return sorted(out)


# ---------------------------------------------------------------- sections 11, 12, 14.3, 17

def stack_ids(stack: Any) -> dict:
    """11: record name -> stack id (both forms)."""
    out: dict = {}
    if not isinstance(stack, dict):
        return out
    for sid, v in stack.items():
        if isinstance(v, list) and len(v) == 2 and isinstance(v[0], list):
            for name in v[0]:
                out.setdefault(name, sid)
        else:  # legacy: record name -> frames
            out.setdefault(sid, sid)
    return out


def read_mapping(data: bytes) -> dict:
    """14.3: original name -> stored (converted) name."""
    out = {}
    for row in csv.reader(io.StringIO(data.decode("utf-8", errors="replace"))):
        if len(row) < 2:
            continue
        a, b = row[0].strip(), row[1].strip()
        if not a or not b:
            continue
        ca, cb = bool(CONVERTED_RE.match(a)), bool(CONVERTED_RE.match(b))
        if ca and not cb:
            out[b] = a
        elif cb and not ca:
            out[a] = b
        elif not a.lower().startswith(("original", "converted", "hash")):
            out[b] = a
    return out


def read_journal_lines(jdir: str) -> list:
    """17: the complete lines of the segments, in numeric order (torn last lines ignored)."""
    if not os.path.isdir(jdir):
        return []
    segs = sorted((n for n in os.listdir(jdir) if re.match(r"^\d{6,}\.jsonl$", n)), key=lambda n: int(n[:-6]))
    lines = []
    for n in segs:
        with open(os.path.join(jdir, n), "rb") as f:
            data = f.read()
        parts = data.split(b"\n")
        lines.extend(parts[:-1])  # the last part is b"" or a torn line
    return lines


def replay_journal(jdir: str) -> dict:
    """17: {records: {name: value} (order of first line), parents: {name: parent}, stacks: {name: frames}}."""
    recs: dict = {}
    parents: dict = {}
    stacks: dict = {}
    frames_of: dict = {}
    sid_of: dict = {}
    for line in read_journal_lines(jdir):
        try:
            obj = json.loads(line.decode("utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError):
            continue
        if not isinstance(obj, dict):
            continue
        if "frames" in obj and "name" not in obj:
            if isinstance(obj["frames"], list):
                frames_of[str(obj.get("stack_id"))] = obj["frames"]
            continue
        if not isinstance(obj.get("name"), str) or "record" not in obj:
            continue
        name = obj["name"]
        recs[name] = obj["record"]  # a later line replaces the value, keeps the first position
        if "parent" in obj:
            parents[name] = obj["parent"]
        if isinstance(obj.get("stack"), list):
            stacks[name] = obj["stack"]
            sid_of[name] = f"journal:{name}"  # 18: the id of an inline stack
        elif obj.get("stack_id") is not None:
            sid_of[name] = str(obj["stack_id"])
    for name, sid in sid_of.items():
        if name not in stacks and sid in frames_of:
            stacks[name] = frames_of[sid]
    return {"records": recs, "parents": parents, "stacks": stacks, "stack_ids": sid_of}


def replay_documents(jdir: str, marker: Optional[dict] = None) -> dict:
    """17: the documents a replay publishes: {"dump.json"|"debug.json": ..., "stack.json", "construct.json"}."""
    j = replay_journal(jdir)
    marker = marker or {}
    data = j["records"]
    debug = bool(data) and all(DEBUG_NAME_RE.match(n) for n in data)
    doc = {"task": marker.get("task"), "level": marker.get("level"), "framework": marker.get("framework"),
           "dump_data_dir": None, "data": data}
    groups: dict = {}
    for name in data:  # numbered in order of first use (11.1)
        if name in j["stacks"]:
            groups.setdefault(tuple(j["stacks"][name]), []).append(name)
    stack = {str(i): [names, list(fr)] for i, (fr, names) in enumerate(groups.items())}
    out = {"debug.json" if debug else "dump.json": doc}
    if not debug:
        out["stack.json"] = stack
        out["construct.json"] = dict(j["parents"])
    return out


# ---------------------------------------------------------------- a rank directory

class RankDir:
    def __init__(self, info: dict):
        self.__dict__.update(info)
        p = self.path
        self.marker = self._json("msprobe_lake.json")
        if self.marker is not None and not isinstance(self.marker, dict):
            self.marker = None
        self.doc_name = "dump.json" if os.path.exists(os.path.join(p, "dump.json")) else (
            "debug.json" if os.path.exists(os.path.join(p, "debug.json")) else None)
        self.doc = self._json(self.doc_name) if self.doc_name else None
        data = dict(self.doc["data"]) if isinstance(self.doc, dict) and isinstance(self.doc.get("data"), dict) \
            else None
        self.journal = replay_journal(os.path.join(p, ".journal"))
        self.journal_only = set()
        if data is None and self.journal["records"]:
            data = {}
        if data is not None:
            for n, v in self.journal["records"].items():  # 17: the document wins; journal-only appended
                if n not in data:
                    data[n] = v
                    self.journal_only.add(n)
        self.data = data
        self.stack = self._json("stack.json")
        self.construct = self._json("construct.json")
        mp = os.path.join(p, "dump_tensor_data", "mapping.csv")
        self.mapping = read_mapping(open(mp, "rb").read()) if os.path.exists(mp) else {}
        self.zarr = os.path.isdir(os.path.join(p, "tensors.zarr"))
        self._manifest: Optional[dict] = None

    def _json(self, name: str) -> Any:
        fp = os.path.join(self.path, name)
        if not os.path.exists(fp):
            return None
        with open(fp, "rb") as f:
            return load_json(f.read())

    # -- derived
    def meta(self, key: str) -> Any:
        if isinstance(self.doc, dict) and self.doc.get(key) is not None:
            return self.doc.get(key)
        return (self.marker or {}).get(key)

    def parent_of(self, name: str) -> Any:
        c = self.construct if isinstance(self.construct, dict) else {}
        v = c.get(name, self.journal["parents"].get(name))
        if isinstance(v, list):
            v = v[0] if v else None
        return v if isinstance(v, str) else None

    def summary_mode(self) -> Optional[str]:
        if self.marker and self.marker.get("summary_mode"):
            return self.marker["summary_mode"]
        for _, value in (self.data or {}).items():
            for _, t in tensor_leaves(value):
                return summary_mode_of(t)
        return None

    # -- section 18's rows
    def rows(self) -> list:
        out = []
        sids = stack_ids(self.stack)
        for n in self.journal_only:  # 18: a journaled record's stack_id is its journal line's
            if n in self.journal["stack_ids"]:
                sids[n] = self.journal["stack_ids"][n]
        for seq, (name, value) in enumerate((self.data or {}).items()):
            try:
                f = parse_record_name(name)
            except FormatError:
                f = {"kind": None, "prefix": None, "api_name": None, "call_index": None, "direction": None}
            base = {"step": self.step, "rank": self.rank, "rank_dir": self.rank_dir, "split": self.split,
                    "seq": seq, "record": name, "kind": f["kind"],
                    "api_type": f["prefix"] if f["kind"] != "debug" else None, "api_name": index_api_name(name, f),
                    "call_index": f["call_index"], "direction": f["direction"],
                    "stack_id": sids.get(forward_name(name, f)), "parent": self.parent_of(name)}
            leaves = list(tensor_leaves(value))
            if not leaves:
                out.append({**base, "io": None, "arg_path": None, "dtype": None})
            for path, t in leaves:
                io_ = {"parameters_grad": "parameters_grad", "debug": "debug"}.get(f["kind"] or "",
                                                                                   path[0] if path else None)
                st = [t.get(k) for k in STAT_KEYS]
                md5 = t.get("md5")
                dn = t.get("data_name")
                out.append({**base, "io": io_, "arg_path": ".".join(path), "type": t.get("type"),
                            "dtype": t.get("dtype"), "shape": tuple(t.get("shape") or ()),
                            "max": _num(st[0]), "min": _num(st[1]), "mean": _num(st[2]), "norm": _num(st[3]),
                            "md5": md5 if isinstance(md5, str) or md5 is None else json.dumps(md5),
                            "requires_grad": t.get("requires_grad"), "data_name": dn,
                            "location": self.location(dn) if isinstance(dn, str) else None})
        return out

    def location(self, data_name: str) -> Optional[str]:
        if self.zarr:
            man = self.manifest()
            got = man["tensors"].get(data_name)
            if got is None:
                return None
            p = man["payloads"][got[0]]
            return None if p is None else f"tensors.zarr/{p[0]}#{p[1]}:{p[1] + p[2]}"
        return f"dump_tensor_data/{self.mapping.get(data_name, data_name)}"

    # -- section 21
    def manifest(self) -> dict:
        if self._manifest is None:
            root = os.path.join(self.path, "tensors.zarr")
            with open(os.path.join(root, "zarr.json"), "rb") as f:
                m = dict(load_json(f.read())["attributes"]["msprobe_lake"])
            m["payloads"] = list(m.get("payloads") or [])
            m["tensors"] = dict(m.get("tensors") or {})
            pending = set(m.get("incomplete") or [])
            if not m.get("complete"):  # 21.5: merge the manifest journal
                for line in read_journal_lines(os.path.join(root, ".manifest")):
                    try:
                        o = json.loads(line)
                    except ValueError:
                        continue
                    if "payload" in o and "array" in o:
                        i = o["payload"]
                        while len(m["payloads"]) <= i:
                            m["payloads"].append(None)
                        m["payloads"][i] = [o["array"], o["start"], o["count"], o["sha256"]]
                    elif "name" in o and "payload" in o:
                        m["tensors"][o["name"]] = [o["payload"], o["shape"]]
                        pending.discard(o["name"])
                    elif "pending" in o:
                        pending.add(o["pending"])
            m["pending"] = pending
            self._manifest = m
        return self._manifest

    # -- section 14 / 21: tensor values (bfloat16 and float8 widened to float32)
    def load(self, entry: dict) -> np.ndarray:
        dn, dtype, shape = entry["data_name"], entry["dtype"], tuple(entry["shape"])
        check_file_name(dn)
        if self.zarr:
            return self._load_zarr(dn, dtype, shape)
        stored = dn if os.path.exists(os.path.join(self.path, "dump_tensor_data", dn)) else self.mapping.get(dn, dn)
        check_file_name(stored)
        with open(os.path.join(self.path, "dump_tensor_data", stored), "rb") as f:
            data = f.read()
        if dn.endswith(".pt"):
            import torch

            t = torch.load(io.BytesIO(data), weights_only=True)
            if t.dtype == torch.bfloat16:
                return t.float().numpy()
            return t.numpy()
        if data[:6] == b"\x93NUMPY":
            a = np.load(io.BytesIO(data), allow_pickle=False)
        else:  # 14.1: raw little-endian bytes of a dtype numpy lacks
            ld = logical_dtype(dtype)
            size = {"bfloat16": 2}.get(ld, 1)
            n = int(np.prod(shape, dtype=np.int64))
            if len(data) != n * size:
                raise FormatError(f"{dn}: {len(data)} raw bytes for {n} elements of {dtype}")
            if ld == "bfloat16":
                a = (np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
            else:
                raise FormatError(f"{dn}: raw {dtype} not decoded by this checker")
        if tuple(a.shape) != shape:
            raise FormatError(f"{dn}: shape {a.shape} != {shape}")
        return a

    def _load_zarr(self, dn: str, dtype: str, shape: tuple) -> np.ndarray:
        import zarr

        m = self.manifest()
        if dn in m["pending"] or dn not in m["tensors"]:
            raise FormatError(f"{dn}: incomplete (21.5)")
        pi, shp = m["tensors"][dn]
        p = m["payloads"][pi]
        if p is None:
            raise FormatError(f"{dn}: payload not stored")
        arr_name, start, count, _sha = p
        ld = logical_dtype(dtype)
        if count == 0:
            return np.zeros(tuple(shp), dtype=np.float32 if ld == "bfloat16" else ld)
        g = zarr.open_group(os.path.join(self.path, "tensors.zarr"), mode="r")
        raw = np.asarray(g[arr_name][start:start + count])
        if ld == "bfloat16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        return raw.reshape(tuple(shp))


def index_api_name(name: str, f: dict) -> Optional[str]:
    """18: the name without prefix, count, direction and suffix (api group; path.cls; debug name)."""
    k = f.get("kind")
    if k == "api":
        return API_NAME_RE.match(name).group("api")
    if k == "module":
        m = MODULE_NAME_RE.match(name)
        return f"{m.group('path')}.{m.group('cls')}"
    if k == "parameters_grad":
        m = PARAMS_GRAD_NAME_RE.match(name)
        return f"{m.group('path')}.{m.group('cls')}"
    if k == "debug":
        return DEBUG_NAME_RE.match(name).group("name")
    return None


def forward_name(name: str, f: dict) -> str:
    """18: a backward record's stack is that of its forward record (the same call)."""
    if f.get("direction") == "backward":
        if f["kind"] == "module":
            return name[: -len(f".backward.{f['call_index']}")] + f".forward.{f['call_index']}"
        return name[: -len(".backward")] + ".forward"
    return name


def _num(v: Any) -> Optional[float]:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    return None


class Dump:
    """A dump root (or split root, step or rank directory)."""

    def __init__(self, path: str):
        self.path = path
        self.rank_dirs = [RankDir(i) for i in discover(path)]
        self.kernel = kernel_dumps(path) if os.path.isdir(path) else []
        if not self.rank_dirs and not self.kernel:
            raise FormatError(f"{path}: not an msprobe dump (4.3)")

    @property
    def dialect(self) -> Optional[str]:
        if not self.rank_dirs:
            return None
        first = self.rank_dirs[0]
        return detect_dialect([r.rank_dir for r in self.rank_dirs], first.data, first.marker, first.doc)

    def rows(self) -> list:
        return [row for r in self.rank_dirs for row in r.rows()]


def validate(path: str) -> list:
    """The checks of the text a validator makes; returns the problems (empty: valid)."""
    problems = []
    try:
        d = Dump(path)
    except (FormatError, OSError) as exc:
        return [str(exc)]
    for r in d.rank_dirs:
        if r.doc is None and not r.journal["records"]:
            continue
        if r.doc is not None:
            problems += [f"{r.path}: {p}" for p in validate_document(r.doc, debug=r.doc_name == "debug.json")]
        names = set()
        for value in (r.data or {}).values():
            for _, t in tensor_leaves(value):
                dn = t.get("data_name")
                if isinstance(dn, str):
                    if dn in names:
                        problems.append(f"{r.path}: data_name {dn} named twice")
                    names.add(dn)
                    try:
                        r.load(t)
                    except (FormatError, OSError, KeyError) as exc:
                        problems.append(f"{r.path}: {dn}: {exc}")
        if r.marker and isinstance(r.marker.get("document_crc32"), str) and r.doc_name:
            with open(os.path.join(r.path, r.doc_name), "rb") as f:
                if crc32_hex(f.read()) != r.marker["document_crc32"]:
                    problems.append(f"{r.path}: document_crc32 differs")
        for fname, ent in ((r.marker or {}).get("files") or {}).items():
            fp = os.path.join(r.path, "dump_tensor_data", fname)
            if isinstance(ent, list) and len(ent) == 2 and os.path.exists(fp):
                with open(fp, "rb") as f:
                    b = f.read()
                if len(b) != ent[0] or crc32_hex(b) != ent[1]:
                    problems.append(f"{r.path}: {fname} differs from the marker's files")
    return problems


def validate_document(doc: Any, debug: bool = False) -> list:
    """Sections 9, 10, 13: what a validator rejects in dump.json / debug.json."""
    if not isinstance(doc, dict):
        return ["the document is not an object"]
    out = []
    if not isinstance(doc.get("data"), dict):
        return ["data is missing or not an object"]
    for k in ("task", "level", "framework", "dump_data_dir"):
        if k in doc and doc[k] is not None and not isinstance(doc[k], str):
            out.append(f"{k} must be a string or null")
    if debug and doc.get("level") != "debug":
        out.append("debug.json's level must be 'debug'")
    for name, value in doc["data"].items():
        try:
            f = parse_record_name(name)
        except FormatError as exc:
            out.append(str(exc))
            continue
        if f["kind"] in ("api", "module") and not isinstance(value, dict):
            out.append(f"{name}: an api or module record must be an object")
        if (debug or doc.get("level") == "debug") and f["kind"] != "debug":
            out.append(f"{name}: not a debug name in a debug document")
        for _, t in tensor_leaves(value):
            try:
                check_tensor_entry(t)
            except FormatError as exc:
                out.append(f"{name}: {exc}")
    return out


def validate_stack(doc: Any) -> list:
    """11.3."""
    if not isinstance(doc, dict):
        return ["stack.json is not an object"]
    out = []
    for k, v in doc.items():
        if isinstance(v, list) and len(v) == 2 and isinstance(v[0], list):
            if not all(isinstance(x, str) for x in v[0]) or not isinstance(v[1], list) or \
                    not all(isinstance(x, str) for x in v[1]):
                out.append(f"{k}: names and frames must be arrays of strings")
        elif isinstance(v, list):
            if not all(isinstance(x, str) for x in v):
                out.append(f"{k}: legacy frames must be strings")
        elif v is not None and not isinstance(v, str):
            out.append(f"{k}: not a stack entry")
    return out


def validate_construct(doc: Any) -> list:
    """12."""
    if not isinstance(doc, dict):
        return ["construct.json is not an object"]
    return [f"{k}: parent must be a string, null, an array or an object" for k, v in doc.items()
            if not (v is None or isinstance(v, (str, list, dict)))]


def validate_marker(doc: Any) -> list:
    """6."""
    if not isinstance(doc, dict):
        return ["the marker is not an object"]
    out = []
    v = doc.get("format_version")
    if not isinstance(v, str) or not re.match(r"^[0-9]+\.[0-9]+$", v):
        out.append("format_version must be 'MAJOR.MINOR'")
    if not isinstance(doc.get("dialect"), str) or not doc.get("dialect"):
        out.append("dialect must be a non-empty string")
    for k in ("producer", "framework", "task", "level", "summary_mode", "tensor_format"):
        if k in doc and not isinstance(doc[k], str):
            out.append(f"{k} must be a string")

    def count(v):
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    typed = {"step": lambda v: v is None or count(v), "rank": lambda v: v is None or count(v), "records": count,
             "complete": lambda v: isinstance(v, bool), "final": lambda v: isinstance(v, bool),
             "pid": lambda v: isinstance(v, int) and not isinstance(v, bool),
             "document_crc32": lambda v: isinstance(v, str) and re.fullmatch(r"[0-9a-f]{8}", v) is not None,
             "files": lambda v: isinstance(v, dict)}
    out += [f"{k} has the wrong type" for k, ok in typed.items() if k in doc and not ok(doc[k])]
    return out


VALIDATORS = {"dump": lambda d: validate_document(d), "debug": lambda d: validate_document(d, debug=True),
              "stack": validate_stack, "construct": validate_construct, "msprobe_lake": validate_marker}
