"""The Parquet index of a dump: rows, schema, writing and compaction (spec section 18).

One row per tensor-like argument of each record (:mod:`msprobe.index.rows`), one file per
(step, rank) with the metadata a reader needs without dump.json (:mod:`msprobe.index.files`),
and one streaming compactor that merges many such files into one (:mod:`msprobe.index.compact`).
It stands below the readers in the layer order (errors, format, backends, tensor_store, index,
readers, ...): it works on stores and documents, never on a :class:`~msprobe.readers.Dump`;
:func:`msprobe.readers.index.build_index` indexes a whole dump with it, the dumpers write
each rank's file at publish time, and :mod:`msprobe.lake` builds and compacts its own.
pyarrow is imported when a table is made or read, not by importing this package.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from msprobe._lazy import lazy_names

if TYPE_CHECKING:
    from msprobe.index.compact import CompactWriter, compact_files, compact_index, run_compact_key
    from msprobe.index.files import (
        COMPACT_FILE,
        INDEX_FILE,
        INDEX_VERSION,
        META_PREFIX,
        StaleIndexWarning,
        concat_tables,
        doc_stat,
        mtime_of,
        parse_partition_path,
        partition_key,
        partition_order,
        rank_index_table,
        read_compactions,
        read_index_metadata,
        read_index_table,
        stale_reason,
        table_bytes,
        warn_stale,
        write_rank_index,
    )
    from msprobe.index.rows import COLUMNS, arrow_schema, rank_rows, rows_to_arrow

#: each public name's submodule, imported on first use (msprobe._lazy)
__getattr__, __dir__ = lazy_names(__name__, {
    "compact": ("CompactWriter", "compact_files", "compact_index", "run_compact_key"),
    "files": ("COMPACT_FILE", "INDEX_FILE", "INDEX_VERSION", "META_PREFIX", "StaleIndexWarning", "concat_tables", "doc_stat", "mtime_of", "parse_partition_path", "partition_key", "partition_order", "rank_index_table", "read_compactions", "read_index_metadata", "read_index_table", "stale_reason", "table_bytes", "warn_stale", "write_rank_index"),
    "rows": ("COLUMNS", "arrow_schema", "rank_rows", "rows_to_arrow"),
})

__all__ = [
    "COLUMNS", "COMPACT_FILE", "INDEX_FILE", "INDEX_VERSION", "META_PREFIX", "CompactWriter", "StaleIndexWarning",
    "arrow_schema", "compact_files", "compact_index", "concat_tables", "doc_stat", "mtime_of",
    "parse_partition_path", "partition_key", "partition_order", "rank_index_table", "rank_rows",
    "read_compactions", "read_index_metadata", "read_index_table", "rows_to_arrow", "run_compact_key",
    "stale_reason", "table_bytes", "warn_stale", "write_rank_index",
]
