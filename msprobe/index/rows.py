"""Flat rows: one per tensor-like argument of a rank's records (the table behind
``to_pandas()``, ``to_arrow()`` and the Parquet index).

Walks the raw JSON directly (no Arg objects) so that a 100,000-record document
flattens in about a second; paths follow :func:`msprobe.format.model.parse_arg`.
"""
from __future__ import annotations

import json
import math
from typing import Any, Iterable, Optional

from msprobe.format.layout import TENSOR_DIR
from msprobe.format.model import is_valid_shape, tensor_entries
from msprobe.format.naming import RecordName, read_record_name
from msprobe.format.stats import STAT_COLUMNS, STATISTICS

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
TENSOR_COLUMNS = ("io", "arg_path", "type", "dtype", "shape", "numel") + STAT_COLUMNS + (
    "md5", "has_nan", "has_inf", "requires_grad", "data_name", "location")
#: Every column, in order; ``stack_id`` and ``parent`` come from stack.json / construct.json.
COLUMNS = RECORD_COLUMNS + TENSOR_COLUMNS + ("stack_id", "parent")
#: What a record digest needs (read from the index without dump.json).
DIGEST_COLUMNS = ("seq", "record", "kind", "api_type", "api_name", "call_index", "direction", "stack_id", "parent")

_STAT_KEYS = tuple((s.column, s.key) for s in STATISTICS)


def empty_columns() -> dict:
    return {column: [] for column in COLUMNS}


def record_fields(name: str) -> tuple:
    """(kind, api_type, api_name, call_index, direction) of a record name; unknown names are tolerated."""
    parsed: RecordName = read_record_name(name)
    if parsed.kind == "unknown":
        return ("unknown", None, None, None, None)
    api_name = parsed.api_name
    if parsed.kind == "api" and parsed.class_name:
        api_name = f"{parsed.api_name}.{parsed.class_name}"
    elif parsed.kind in ("module", "parameters_grad") and parsed.class_name:
        api_name = f"{parsed.api_name}.{parsed.class_name}"
    elif parsed.kind == "debug" and parsed.is_grad:
        api_name = f"{parsed.api_name}_grad"
    return (parsed.kind, parsed.prefix or None, api_name, parsed.call_index, parsed.direction)


def record_tensors(kind: str, raw: Any) -> list:
    """[(io, arg_path, tensor entry)] of one record, in document order."""
    out: list = []
    if kind in ("parameters_grad", "debug") or not isinstance(raw, dict):
        found = tensor_entries(raw)
        side = kind if kind in ("parameters_grad", "debug") else None
        return [(side, path, tensor) for path, tensor in found]
    for key, value in raw.items():
        found = tensor_entries(value, key)
        out.extend((key, path, tensor) for path, tensor in found)
    return out


def _num(value: Any) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:
            return math.copysign(math.inf, value)
    if isinstance(value, str):
        try:
            return float(value)
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
    order = {name: seq for seq, name in enumerate(data)} if names is not None else None
    items = ((name, data[name]) for name in names) if names is not None else iter(data.items())
    for position, (name, raw) in enumerate(items):
        seq = order[name] if order is not None else position
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
                for column, value in zip(RECORD_COLUMNS, rec_vals):
                    cols[column].append(value)
                for column in TENSOR_COLUMNS:
                    cols[column].append(None)
                cols["stack_id"].append(sid)
                cols["parent"].append(par)
            continue
        for side, path, tensor in tensors:
            for column, value in zip(RECORD_COLUMNS, rec_vals):
                cols[column].append(value)
            _append_tensor(cols, side, path, tensor, mapping, locations)
            cols["stack_id"].append(sid)
            cols["parent"].append(par)
    return cols


def _append_tensor(cols: dict, side: str, path: str, tensor: dict, mapping: dict, locations: Optional[dict]) -> None:
    """The tensor columns of one row (``io`` through ``location``) of a record's tensor ``tensor``."""
    stats = [_num(tensor.get(key)) for _, key in _STAT_KEYS]
    shape: Any = tensor.get("shape")
    data_name = tensor.get("data_name")
    data_name = data_name if isinstance(data_name, str) else None
    requires_grad = tensor.get("requires_grad")
    md5 = tensor.get("md5")
    cols["io"].append(side)
    cols["arg_path"].append(path)
    cols["type"].append(tensor.get("type"))
    cols["dtype"].append(tensor.get("dtype") if isinstance(tensor.get("dtype"), str) else None)
    cols["shape"].append([int(size) for size in shape] if _numel(shape) is not None else None)
    cols["numel"].append(_numel(shape))
    for (column, _), value in zip(_STAT_KEYS, stats):
        cols[column].append(value)
    # 26.x xor mode writes a 0-d tensor's value instead of its checksum: keep it, as text
    cols["md5"].append(md5 if isinstance(md5, str) or md5 is None else json.dumps(md5))
    cols["has_nan"].append(any(value is not None and value != value for value in stats))
    cols["has_inf"].append(any(value is not None and value in (math.inf, -math.inf) for value in stats))
    cols["requires_grad"].append(requires_grad if isinstance(requires_grad, bool) else None)
    cols["data_name"].append(data_name)
    if data_name and locations is not None:
        cols["location"].append(locations.get(data_name))
    else:
        cols["location"].append(f"{TENSOR_DIR}/{mapping.get(data_name, data_name)}" if data_name else None)


def forward_twin(name: str, kind: str) -> str:
    if kind == "api" and name.endswith(".backward"):
        return name[: -len("backward")] + "forward"
    if kind == "module":
        head, _, index = name.rpartition(".")
        if head.endswith(".backward"):
            return head[: -len("backward")] + "forward." + index
    return name


def arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema([
        ("run", pa.string()), ("step", pa.int64()), ("rank", pa.int64()), ("rank_dir", pa.string()),
        ("split", pa.string()), ("seq", pa.int64()), ("record", pa.string()), ("kind", pa.string()),
        ("api_type", pa.string()), ("api_name", pa.string()), ("call_index", pa.int64()),
        ("direction", pa.string()), ("io", pa.string()), ("arg_path", pa.string()), ("type", pa.string()),
        ("dtype", pa.string()), ("shape", pa.list_(pa.int64())), ("numel", pa.int64()),
        *[(column, pa.float64()) for column in STAT_COLUMNS],
        ("md5", pa.string()), ("has_nan", pa.bool_()), ("has_inf", pa.bool_()), ("requires_grad", pa.bool_()),
        ("data_name", pa.string()), ("location", pa.string()), ("stack_id", pa.string()), ("parent", pa.string()),
    ])


def rows_to_arrow(cols: dict, metadata: Optional[dict] = None) -> Any:
    import pyarrow as pa

    schema = arrow_schema()
    if metadata:
        schema = schema.with_metadata({str(key): str(value) for key, value in metadata.items()})
    return pa.Table.from_pydict({column: cols[column] for column in COLUMNS}, schema=schema)
