"""A dump's rows as tables: the Arrow table of the selected rank directories, each read from its
Parquet index (one scan, filter pushed down, compacted files replacing those they cover) or from
its dump.json, and the pandas frame of such a table. :class:`msprobe.readers.Dump` asks it for
``to_arrow``/``to_pandas``."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Optional

from msprobe.errors import ConfigError, MsprobeError, StorageNotFoundError, require
from msprobe.index.files import (
    STRING_COLUMNS,
    check_decoded_strings,
    check_index_footer,
    concat_tables,
    decode_limit,
    read_index_table,
)
from msprobe.index.rows import COLUMNS, arrow_schema, rank_rows, rows_to_arrow
from msprobe.readers._store import arrow_location

if TYPE_CHECKING:
    from msprobe.readers.protocols import DumpSource

__all__ = ["json_table", "sources_table", "table_to_pandas", "tensor_locations"]


def sources_table(sources: Iterable, columns: Optional[Iterable[str]], filter: Any,  # noqa: A002 - the public keyword's name
                  compacts: dict) -> Any:
    """One row per tensor-like argument of ``sources`` (rank directories, in order): each run of
    indexed ones in one scan, the others from dump.json (``filter``, ``columns``: as
    :meth:`msprobe.readers.Dump.to_arrow`; ``compacts``: the compacted index files)."""
    require("pyarrow", "parquet")
    import pyarrow.compute as pc
    import pyarrow.dataset as pads

    cols = list(columns) if columns is not None else list(COLUMNS)
    unknown = [c for c in cols if c not in COLUMNS]
    if unknown:
        raise ConfigError(f"unknown columns {unknown}; valid: {', '.join(COLUMNS)}")
    expr = pc.field("has_nan").is_valid()  # drops the index's record-only rows (cheaper than io)
    if filter is not None:
        expr = expr & filter
    parts = []
    batch: list = []

    def flush() -> None:
        if batch:
            parts.append(_scan_indexes(batch, cols, expr, compacts))
            batch.clear()

    for src in sources:
        if src.use_index:
            batch.append(src)
            continue
        flush()
        t = json_table(src)
        parts.append(pads.dataset(t).to_table(columns=cols, filter=expr))
    flush()
    if not parts:
        return arrow_schema().empty_table().select(cols)
    return concat_tables(parts) if len(parts) > 1 else parts[0]


def json_table(src: DumpSource) -> Any:
    """A rank's rows read from its dump.json (no index)."""
    try:
        data = src.document().data
    except StorageNotFoundError:
        data = {}
    has_map = src.has_mapping() if hasattr(src, "has_mapping") else False
    cols = rank_rows(data, run=src.run, step=src.step, rank=src.rank, rank_dir=src.rank_dir, split=src.split,
                     stack_ids=src.stack_ids(), parents=src.parents(),
                     mapping=src.mapping() if has_map else None,
                     locations=tensor_locations(src))
    return rows_to_arrow(cols)


def _with_compactions(sources: list, compacts: dict) -> list:
    """[(source or None, store, key)]: a compacted file replaces the files it covers when
    every one of them is selected (its rows are in the same order)."""
    if not compacts:
        return [(src, src.index_store, k) for src in sources for k in src.index_keys()]
    selected = {src.index_key for src in sources if getattr(src, "index_only", False)}
    cover_of = {}
    for ckey, covered in compacts.items():
        if all(c in selected for c in covered):
            for c in covered:
                cover_of[c] = ckey
    out: list = []
    done: set = set()
    for src in sources:
        ckey = cover_of.get(getattr(src, "index_key", None)) if getattr(src, "index_only", False) else None
        if ckey is None:
            out.extend((src, src.index_store, k) for k in src.index_keys())
        elif ckey not in done:
            done.add(ckey)
            out.append((None, src.index_store, ckey))
    return out


def _scan_indexes(sources: list, columns: list, expr: Any, compacts: Optional[dict] = None) -> Any:
    """One pyarrow dataset scan over the index files of ``sources`` (filter pushed down).

    Indexes inside a dump take the dump's run name (the dump may have been renamed or
    indexed by its producer without one); files of an index-only lake keep theirs."""
    import pyarrow as pa
    import pyarrow.dataset as pads

    groups: list = []  # (file system or None, paths or (store, key) pairs, run override)
    for src, store, key in _with_compactions(sources, compacts or {}):
        run = None if src is None or getattr(src, "index_only", False) else (src.run,)
        loc = arrow_location(store, key)
        fs = loc[0] if loc else None
        item = loc[1] if loc else (store, key)
        if groups and fs is not None and groups[-1][0] is fs and groups[-1][2] == run:
            groups[-1][1].append(item)
        else:
            groups.append((fs, [item], run))
    tables = []
    for fs, items, run in groups:
        if fs is None:
            t = concat_tables([read_index_table(store, key) for store, key in items])
            if run is not None:
                t = _set_run(t, run[0])
            t = pads.dataset(t).to_table(columns=columns, filter=expr)
        else:
            # strings are read dictionary-encoded (as stored) and decoded after the filter
            fmt = pads.ParquetFileFormat(read_options=pads.ParquetReadOptions(dictionary_columns=_STRINGS))
            ds = pads.dataset(items, format=fmt, filesystem=fs, schema=_dict_schema())
            size = 0
            for frag in ds.get_fragments():  # each footer before any page is inflated
                n = fs.get_file_info(frag.path).size or 0
                check_index_footer(frag.metadata, n, frag.path)
                size += n
            t = ds.to_table(columns=columns, filter=expr)
            check_decoded_strings(t, decode_limit(size), "index files")  # before the strings are decoded
            full = arrow_schema()
            t = t.cast(pa.schema([full.field(c) for c in t.column_names]))
            if run is not None and "run" in columns:
                t = _set_run(t, run[0])
        tables.append(t)
    return concat_tables(tables) if len(tables) > 1 else tables[0]


_STRINGS = list(STRING_COLUMNS)  # read dictionary-encoded (as stored), decoded after the filter


def _dict_schema() -> Any:
    import pyarrow as pa

    s = arrow_schema()
    return pa.schema([pa.field(f.name, pa.dictionary(pa.int32(), pa.string())) if f.name in _STRINGS else f
                      for f in s])


def _set_run(t: Any, run: Optional[str]) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    i = t.schema.get_field_index("run")
    if i < 0 or t.num_rows == 0:
        return t
    if run is not None and pc.all(pc.equal(t.column(i), run)).as_py():
        return t
    return t.set_column(i, t.schema.field(i), pa.array([run] * t.num_rows, type=pa.string()))


def table_to_pandas(table: Any) -> Any:
    import pandas as pd
    import pyarrow as pa

    mapping = {pa.int64(): pd.Int64Dtype(), pa.bool_(): pd.BooleanDtype()}
    df = table.to_pandas(types_mapper=mapping.get)
    if "shape" in df.columns:
        df["shape"] = [tuple(int(x) for x in s) if s is not None else None for s in df["shape"]]
    return df


def tensor_locations(src: DumpSource) -> Optional[dict]:
    """data name -> location for a rank with a Zarr tensor store (spec section 21), else None."""
    fn = getattr(src, "tensor_locations", None)
    if fn is None:
        return None
    try:
        return fn()
    except MsprobeError:
        return None
