"""Flat rows: one per tensor-like argument of a rank's records (the table behind
``to_pandas()``, ``to_arrow()`` and the Parquet index).

Walks the raw JSON directly (no Arg objects) so that a 100,000-record document
flattens in about a second; paths follow :func:`msprobe.format.model.parse_arg`.
"""
from __future__ import annotations

import json
import math
from typing import Any, Iterable, Optional

from msprobe.errors import NameFormatError
from msprobe.format.layout import TENSOR_DIR
from msprobe.format.model import is_valid_shape, tensor_entries
from msprobe.format.naming import RecordName, parse_record_name

__all__ = [
    "COLUMNS",
    "RECORD_COLUMNS",
    "TENSOR_COLUMNS",
    "DIGEST_COLUMNS",
    "rank_rows",
    "record_fields",
    "arrow_schema",
    "rows_to_arrow",
    "empty_columns",
    "forward_twin",
]

#: Columns of a row that describe the record (repeated on each of its tensors).
RECORD_COLUMNS = ("run", "step", "rank", "rank_dir", "split", "seq", "record", "kind", "api_type", "api_name",
                  "call_index", "direction")
#: Columns that describe one tensor-like argument.
TENSOR_COLUMNS = ("io", "arg_path", "type", "dtype", "shape", "numel", "max", "min", "mean", "norm", "md5",
                  "has_nan", "has_inf", "requires_grad", "data_name", "location")
#: Every column, in order; ``stack_id`` and ``parent`` come from stack.json / construct.json.
COLUMNS = RECORD_COLUMNS + TENSOR_COLUMNS + ("stack_id", "parent")
#: What a record digest needs (read from the index without dump.json).
DIGEST_COLUMNS = ("seq", "record", "kind", "api_type", "api_name", "call_index", "direction", "stack_id", "parent")

_STAT_KEYS = (("max", "Max"), ("min", "Min"), ("mean", "Mean"), ("norm", "Norm"))


def empty_columns() -> dict:
    return {c: [] for c in COLUMNS}


def record_fields(name: str) -> tuple:
    """(kind, api_type, api_name, call_index, direction) of a record name; unknown names are tolerated."""
    try:
        rn: RecordName = parse_record_name(name, strict=False)
    except NameFormatError:
        return ("unknown", None, None, None, None)
    api_name = rn.api_name
    if rn.kind == "api" and rn.class_name:
        api_name = f"{rn.api_name}.{rn.class_name}"
    elif rn.kind in ("module", "parameters_grad") and rn.class_name:
        api_name = f"{rn.api_name}.{rn.class_name}"
    elif rn.kind == "debug" and rn.is_grad:
        api_name = f"{rn.api_name}_grad"
    return (rn.kind, rn.prefix or None, api_name, rn.call_index, rn.direction)


def record_tensors(kind: str, raw: Any) -> list:
    """[(io, arg_path, tensor entry)] of one record, in document order."""
    out: list = []
    if kind in ("parameters_grad", "debug") or not isinstance(raw, dict):
        found = tensor_entries(raw)
        io = kind if kind in ("parameters_grad", "debug") else None
        return [(io, p, t) for p, t in found]
    for key, value in raw.items():
        found = tensor_entries(value, key)
        out.extend((key, p, t) for p, t in found)
    return out


def _num(v: Any) -> Optional[float]:
    if v is None:
        return None
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if isinstance(v, (int, float)):
        try:
            return float(v)
        except OverflowError:
            return math.copysign(math.inf, v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def _numel(shape: Any) -> Optional[int]:
    """The element count of a valid shape (see :func:`msprobe.format.model.is_valid_shape`), else None:
    a NaN, infinite or beyond-int64 shape is indexed as null, never an OverflowError."""
    if not isinstance(shape, list) or not is_valid_shape(shape):
        return None
    return math.prod(shape)


def rank_rows(data: dict, *, run: Optional[str], step: Optional[int], rank: Optional[int], rank_dir: str,
              split: Optional[str] = None, stack_ids: Optional[dict] = None, parents: Optional[dict] = None,
              mapping: Optional[dict] = None, placeholders: bool = False,
              names: Optional[Iterable[str]] = None, locations: Optional[dict] = None) -> dict:
    """Column lists for the records of one rank (``data`` is dump.json's ``data``).

    ``placeholders=True`` adds one row with ``io`` null for each record without a
    tensor (the index keeps every record that way). ``names`` limits the records.
    """
    cols = empty_columns()
    stack_ids = stack_ids or {}
    parents = parents or {}
    mapping = mapping or {}
    order = {n: i for i, n in enumerate(data)} if names is not None else None
    items = ((n, data[n]) for n in names) if names is not None else iter(data.items())
    for i, (name, raw) in enumerate(items):
        seq = order[name] if order is not None else i
        kind, api_type, api_name, call_index, direction = record_fields(name)
        tensors = record_tensors(kind, raw)
        sid = stack_ids.get(name)
        if sid is None and direction == "backward":
            sid = stack_ids.get(forward_twin(name, kind))
        par = parents.get(name)
        par = par if isinstance(par, str) else None
        rec_vals = (run, step, rank, rank_dir, split, seq, name, kind, api_type, api_name, call_index, direction)
        if not tensors:
            if placeholders:
                for c, v in zip(RECORD_COLUMNS, rec_vals):
                    cols[c].append(v)
                for c in TENSOR_COLUMNS:
                    cols[c].append(None)
                cols["stack_id"].append(sid)
                cols["parent"].append(par)
            continue
        for io, path, t in tensors:
            for c, v in zip(RECORD_COLUMNS, rec_vals):
                cols[c].append(v)
            stats = [_num(t.get(k)) for _, k in _STAT_KEYS]
            shape = t.get("shape")
            dn = t.get("data_name")
            dn = dn if isinstance(dn, str) else None
            rg = t.get("requires_grad")
            md5 = t.get("md5")
            cols["io"].append(io)
            cols["arg_path"].append(path)
            cols["type"].append(t.get("type"))
            cols["dtype"].append(t.get("dtype") if isinstance(t.get("dtype"), str) else None)
            cols["shape"].append([int(d) for d in shape] if _numel(shape) is not None else None)
            cols["numel"].append(_numel(shape))
            for (c, _), v in zip(_STAT_KEYS, stats):
                cols[c].append(v)
            # 26.x xor mode writes a 0-d tensor's value instead of its checksum: keep it, as text
            cols["md5"].append(md5 if isinstance(md5, str) or md5 is None else json.dumps(md5))
            cols["has_nan"].append(any(v is not None and v != v for v in stats))
            cols["has_inf"].append(any(v is not None and v in (math.inf, -math.inf) for v in stats))
            cols["requires_grad"].append(rg if isinstance(rg, bool) else None)
            cols["data_name"].append(dn)
            if dn and locations is not None:
                cols["location"].append(locations.get(dn))
            else:
                cols["location"].append(f"{TENSOR_DIR}/{mapping.get(dn, dn)}" if dn else None)
            cols["stack_id"].append(sid)
            cols["parent"].append(par)
    return cols


def forward_twin(name: str, kind: str) -> str:
    if kind == "api" and name.endswith(".backward"):
        return name[: -len("backward")] + "forward"
    if kind == "module":
        head, _, n = name.rpartition(".")
        if head.endswith(".backward"):
            return head[: -len("backward")] + "forward." + n
    return name


def arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema([
        ("run", pa.string()), ("step", pa.int64()), ("rank", pa.int64()), ("rank_dir", pa.string()),
        ("split", pa.string()), ("seq", pa.int64()), ("record", pa.string()), ("kind", pa.string()),
        ("api_type", pa.string()), ("api_name", pa.string()), ("call_index", pa.int64()),
        ("direction", pa.string()), ("io", pa.string()), ("arg_path", pa.string()), ("type", pa.string()),
        ("dtype", pa.string()), ("shape", pa.list_(pa.int64())), ("numel", pa.int64()),
        ("max", pa.float64()), ("min", pa.float64()), ("mean", pa.float64()), ("norm", pa.float64()),
        ("md5", pa.string()), ("has_nan", pa.bool_()), ("has_inf", pa.bool_()), ("requires_grad", pa.bool_()),
        ("data_name", pa.string()), ("location", pa.string()), ("stack_id", pa.string()), ("parent", pa.string()),
    ])


def rows_to_arrow(cols: dict, metadata: Optional[dict] = None) -> Any:
    import pyarrow as pa

    schema = arrow_schema()
    if metadata:
        schema = schema.with_metadata({str(k): str(v) for k, v in metadata.items()})
    return pa.Table.from_pydict({c: cols[c] for c in COLUMNS}, schema=schema)
