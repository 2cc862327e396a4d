"""A dumped tensor's histogram and first values, for the record detail (tensor dumps only)."""
from __future__ import annotations

from typing import Any

from msprobe.errors import ConfigError, MsprobeError
from msprobe.readers import ANY

__all__ = ["tensor_view", "MAX_TENSOR_BYTES", "PREVIEW", "BINS"]

#: larger tensor files are not read for a preview
MAX_TENSOR_BYTES = 64 << 20
PREVIEW = 64
BINS = 32


def tensor_view(data: Any, cell: int, name: str, side: str) -> dict:
    """{histogram, preview, shape, dtype} of the tensor behind row ``name`` of ``cell`` on ``side``;
    {"available": False, "why": ...} when the dump holds no tensor file for it."""
    import numpy as np

    if side not in ("target", "bench"):
        raise ConfigError(f"side must be target or bench, not {side!r}")
    row = data.query("SELECT record, name, bench_name, data_name FROM rows WHERE cell = ? AND name = ?", [cell, name])
    if not row:
        raise ConfigError(f"no row {name!r} in this cell")
    r = row[0]
    d, src = data.located(side, cell)
    if src is None or d is None:
        return {"available": False, "why": f"the {side} dump cannot be opened from here"}
    files = _data_names(r["data_name"])
    file = files[0 if side == "target" else 1] if len(files) == 2 else (files[0] if files and side == "target" else None)
    if not file:
        return {"available": False, "why": "no tensor file for this argument (a statistics dump)"}
    row_name = r["name"] if side == "target" else (r["bench_name"] or "")
    record = r["record"] if side == "target" else row_name[: len(row_name) - (len(r["name"]) - len(r["record"]))]
    try:
        rec = d.record(record, step=src.step, rank=src.rank, run=src.run if src.run else ANY)
        ref = next((t for _, t in rec.tensors() if t.data_name == file), None)
        if ref is None:
            return {"available": False, "why": f"{record} holds no tensor file {file}"}
        arr = np.asarray(ref.load("numpy", max_bytes=MAX_TENSOR_BYTES))
    except (MsprobeError, OSError, ValueError) as exc:
        return {"available": False, "why": str(exc)}
    flat = arr.astype(np.float64, copy=False).ravel()
    finite = flat[np.isfinite(flat)]
    hist: dict = {"counts": [], "edges": []}
    if finite.size:
        counts, edges = np.histogram(finite, bins=BINS)
        hist = {"counts": counts.tolist(), "edges": edges.tolist()}
    return {"available": True, "dtype": str(ref.dtype), "shape": list(ref.shape), "histogram": hist,
            "nan": int(np.isnan(flat).sum()), "inf": int(np.isinf(flat).sum()),
            "preview": [_f(x) for x in flat[:PREVIEW].tolist()]}


def _data_names(v: Any) -> list:
    """The tensor file names of a compare row's Data_name cell (``['a.pt', 'b.pt']``, one name, or N/A)."""
    import ast

    if not isinstance(v, str) or v in ("", "N/A", "-1"):
        return []
    if v.startswith("["):
        try:
            got = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            return []
        return [x if isinstance(x, str) and x not in ("N/A", "-1") else None for x in got] \
            if isinstance(got, list) else []
    return [v]


def _f(x: float) -> Any:
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "Inf" if x > 0 else "-Inf"
    return x

