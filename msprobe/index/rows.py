"""Flat rows: one per tensor-like argument of a rank's records (the table behind
``to_pandas()``, ``to_arrow()`` and the Parquet index).

Walks the raw JSON directly (no Arg objects) so that a 100,000-record document
flattens in about a second; paths follow :func:`msprobe.format.model.parse_arg`.
"""
from __future__ import annotations

import functools
import json
import math
from typing import Any, Iterable, Optional

from msprobe.format.layout import TENSOR_DIR
from msprobe.format.model import MAX_ARG_DEPTH, TENSOR_TYPES, is_valid_shape, tensor_entries
from msprobe.format.naming import RecordName, read_record_name
from msprobe.format.native import leafwalk
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


@functools.lru_cache(maxsize=1 << 16)
def record_fields(name: str) -> tuple:
    """(kind, api_type, api_name, call_index, direction) of a record name; unknown names are tolerated.
    Cached: the ranks of a step (indexed one after the other by a lake task) share their names."""
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
            return math.inf if value > 0 else -math.inf  # copysign would convert the int to a float
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

    One pass over the records gathers each row's record and tensor entry; the columns are then
    built a column at a time (each a comprehension over the rows), not a row at a time.
    """
    native = _native_rows(data, names, placeholders)
    if native is not None:
        cols = _columns_of(native, data, names is not None, (run, step, rank, rank_dir, split), stack_ids or {},
                           parents or {}, mapping or {}, locations)
        return {column: _listed(cols[column]) for column in COLUMNS}
    return _python_rows(data, (run, step, rank, rank_dir, split), stack_ids or {}, parents or {}, mapping or {},
                        placeholders, names, locations)


def rank_table(data: dict, where: tuple, *, stack_ids: Optional[dict] = None, parents: Optional[dict] = None,
               mapping: Optional[dict] = None, locations: Optional[dict] = None, metadata: Optional[dict] = None) -> Any:
    """The index table (pyarrow) of every record of ``data``, a placeholder row for each record
    without a tensor (:func:`rank_rows` with ``placeholders=True`` through :func:`rows_to_arrow`):
    from the C walk, each column laid out in C, where it is there. ``where``: (run, step, rank,
    rank_dir, split)."""
    native = _native_rows(data, None, True)
    if native is None:
        return rows_to_arrow(_python_rows(data, where, stack_ids or {}, parents or {}, mapping or {}, True, None,
                                          locations), metadata)
    return rows_to_arrow(_columns_of(native, data, False, where, stack_ids or {}, parents or {}, mapping or {},
                                     locations), metadata)


def _listed(cell: Any) -> list:
    """A column of :func:`_columns_of` as a list of its rows."""
    if isinstance(cell, list):
        return cell
    from msprobe.index.columns import gathered

    return gathered(*cell)


def _python_rows(data: dict, where: tuple, stack_ids: dict, parents: dict, mapping: dict, placeholders: bool,
                 names: Optional[Iterable[str]], locations: Optional[dict]) -> dict:
    """:func:`rank_rows` without the C walk."""
    run, step, rank, rank_dir, split = where
    order = {name: seq for seq, name in enumerate(data)} if names is not None else None
    items = ((name, data[name]) for name in names) if names is not None else iter(data.items())
    records: list = []  # (seq, name, kind, api_type, api_name, call_index, direction, stack_id, parent)
    row_record: list = []  # each row's position in ``records``
    sides: list = []
    paths: list = []
    tensors: list = []  # each row's tensor entry; _NO_TENSOR for a record's placeholder row
    for position, (name, raw) in enumerate(items):
        kind, api_type, api_name, call_index, direction = record_fields(name)
        found = record_tensors(kind, raw)
        if not found and not placeholders:
            continue
        sid = stack_ids.get(name)
        if sid is None and direction == "backward":
            sid = stack_ids.get(forward_twin(name, kind))
        par = parents.get(name)
        at = len(records)
        records.append((order[name] if order is not None else position, name, kind, api_type, api_name, call_index,
                        direction, sid, par if isinstance(par, str) else None))
        if not found:
            row_record.append(at)
            sides.append(None)
            paths.append(None)
            tensors.append(_NO_TENSOR)
            continue
        for side, path, tensor in found:
            row_record.append(at)
            sides.append(side)
            paths.append(path)
            tensors.append(tensor)
    cols = {"run": [run] * len(row_record), "step": [step] * len(row_record), "rank": [rank] * len(row_record),
            "rank_dir": [rank_dir] * len(row_record), "split": [split] * len(row_record)}
    for at, column in enumerate(("seq", "record", "kind", "api_type", "api_name", "call_index", "direction")):
        values = [record[at] for record in records]
        cols[column] = [values[i] for i in row_record]
    cols.update(_tensor_columns(sides, paths, tensors, mapping or {}, locations))
    for at, column in ((7, "stack_id"), (8, "parent")):
        values = [record[at] for record in records]
        cols[column] = [values[i] for i in row_record]
    return {column: cols[column] for column in COLUMNS}


#: the tensor entry of a record's placeholder row (a record without a tensor): every cell null
_NO_TENSOR: dict = {}
#: the tensor columns index_rows gives, in its order (after row_record, io and arg_path)
_NATIVE_COLUMNS = ("type", "dtype", "shape", "numel") + STAT_COLUMNS + ("md5", "has_nan", "has_inf", "requires_grad",
                                                                       "data_name")


def _native_rows(data: Any, names: Optional[Iterable[str]], placeholders: bool) -> Optional[tuple]:
    """(the records walked, index_rows' columns) from the C walk (``msprobe.format._leafwalk``), or
    None where it is not there or declines (then the Python code below decides, errors included)."""
    walker = leafwalk()
    if walker is None or not isinstance(data, dict):
        return None
    walked = list(names) if names is not None else list(data)
    kinds = [record_fields(name)[0] if isinstance(name, str) else None for name in walked]
    got = walker.index_rows(data, walked, kinds, TENSOR_TYPES, MAX_ARG_DEPTH, tuple(key for _, key in _STAT_KEYS),
                            placeholders, json.dumps)
    return None if got is None else (walked, got)


def _columns_of(native: tuple, data: dict, named: bool, where: tuple, stack_ids: dict, parents: dict, mapping: dict,
                locations: Optional[dict]) -> dict:
    """:func:`rank_rows`' columns from the C walk's rows (:func:`_native_rows`): each a list of the
    rows, or (values, index): the rows' values picked by the int64 bytes ``index`` (the columns
    of a record, one value per record; the columns of the rank, one value)."""
    import numpy as np

    walked, got = native
    row_record = got[0]
    rows = np.frombuffer(row_record, dtype=np.int64)
    count = len(rows)
    same = np.zeros(count, dtype=np.int64).tobytes()
    cols: dict = {column: ([value], same) for column, value in zip(("run", "step", "rank", "rank_dir", "split"), where)}
    order = {name: seq for seq, name in enumerate(data)} if named else None
    per_record: list = [(None,) * 9] * len(walked)
    # each record with rows, once, in order (np.unique would import numpy.ma: ~11 ms a process)
    for position in np.flatnonzero(np.bincount(rows, minlength=len(walked))).tolist():
        name = walked[position]
        kind, api_type, api_name, call_index, direction = record_fields(name)
        sid = stack_ids.get(name)
        if sid is None and direction == "backward":
            sid = stack_ids.get(forward_twin(name, kind))
        par = parents.get(name)
        per_record[position] = (order[name] if order is not None else position, name, kind, api_type, api_name,
                                call_index, direction, sid, par if isinstance(par, str) else None)
    by_column = zip(*per_record) if walked else [()] * 9  # the records' values, transposed
    cols.update((column, (list(values), row_record)) for column, values in
                zip(("seq", "record", "kind", "api_type", "api_name", "call_index", "direction", "stack_id", "parent"),
                    by_column))
    cols["io"], cols["arg_path"] = got[1], got[2]
    cols.update(zip(_NATIVE_COLUMNS, got[3:]))
    if not any(cols["data_name"]):
        cols["location"] = ([None], same)
    else:
        _file_columns(cols, None, mapping, locations)
    return cols


def _tensor_columns(sides: list, paths: list, tensors: list, mapping: dict, locations: Optional[dict]) -> dict:
    """The tensor columns (``io`` through ``location``) of the rows, a column at a time."""
    cols: dict = {"io": sides, "arg_path": paths, "type": [tensor.get("type") for tensor in tensors]}
    dtypes = [tensor.get("dtype") for tensor in tensors]
    cols["dtype"] = [dtype if isinstance(dtype, str) else None for dtype in dtypes]
    numels = [_numel(tensor.get("shape")) for tensor in tensors]
    cols["shape"] = [None if numel is None else [int(size) for size in tensor["shape"]]
                     for numel, tensor in zip(numels, tensors)]
    cols["numel"] = numels
    _stat_columns(cols, tensors)
    _file_columns(cols, tensors, mapping, locations)
    return cols


def _stat_columns(cols: dict, tensors: list) -> None:
    """The statistics, md5, NaN/Inf flags and requires_grad columns of the rows (into ``cols``)."""
    has_nan = has_inf = [False] * len(tensors)
    for column, key in _STAT_KEYS:
        values = [tensor.get(key) for tensor in tensors]
        values = [value if type(value) is float else _num(value) for value in values]  # exactly float: as it is
        cols[column] = values
        # None != None is False, NaN != NaN is True; None equals no infinity
        has_nan = [seen or value != value for seen, value in zip(has_nan, values)]
        has_inf = [seen or value == math.inf or value == -math.inf for seen, value in zip(has_inf, values)]
    # 26.x xor mode writes a 0-d tensor's value instead of its checksum: keep it, as text
    cols["md5"] = [md5 if isinstance(md5, str) or md5 is None else json.dumps(md5)
                   for md5 in (tensor.get("md5") for tensor in tensors)]
    cols["has_nan"] = has_nan
    cols["has_inf"] = has_inf
    cols["requires_grad"] = [grad if isinstance(grad, bool) else None
                             for grad in (tensor.get("requires_grad") for tensor in tensors)]
    if any(tensor is _NO_TENSOR for tensor in tensors):  # placeholder rows: no statistics, so no flags
        for column in ("has_nan", "has_inf"):
            cols[column] = [None if tensor is _NO_TENSOR else flag for flag, tensor in zip(cols[column], tensors)]


def _file_columns(cols: dict, tensors: Optional[list], mapping: dict, locations: Optional[dict]) -> None:
    """The data_name (from ``tensors``, unless None: then it is in ``cols``) and location columns
    of the rows (into ``cols``)."""
    if tensors is not None:
        cols["data_name"] = [name if isinstance(name, str) else None
                             for name in (tensor.get("data_name") for tensor in tensors)]
    data_names = cols["data_name"]
    if not any(data_names):
        cols["location"] = [None] * len(data_names)
        return
    if locations is not None:
        cols["location"] = [locations.get(name) if name else None for name in data_names]
    else:
        cols["location"] = [f"{TENSOR_DIR}/{mapping.get(name, name)}" if name else None for name in data_names]


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
    """The index table of :func:`rank_rows`' columns (each a list of the rows, or (values,
    index) as :func:`_columns_of` gives them), each column laid out by
    :func:`msprobe.index.columns.column`."""
    import pyarrow as pa

    from msprobe.index.columns import column

    schema = arrow_schema()
    if metadata:
        schema = schema.with_metadata({str(key): str(value) for key, value in metadata.items()})
    arrays = [column(cell, field.type) if isinstance(cell, list) else column(cell[0], field.type, cell[1])
              for field, cell in ((field, cols[field.name]) for field in schema)]
    return pa.Table.from_arrays(arrays, schema=schema)
