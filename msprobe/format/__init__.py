"""The msprobe dump format: naming grammar, record model, documents, layout, statistics.

Pure Python plus numpy: importing it never imports torch, mindspore, pyarrow,
zarr, s3fs or dask.
"""
from __future__ import annotations

from msprobe.format._digests import CRC_BUDGET, check_digests
from msprobe.format.dialects import DIALECTS, Dialect, detect_dialect, get_dialect
from msprobe.format.documents import (
    CONSTRUCT_JSON,
    DEBUG_JSON,
    DUMP_JSON,
    STACK_JSON,
    ConstructDocument,
    DebugDocument,
    DumpDocument,
    StackDocument,
    dumps_json,
    loads_json,
)
from msprobe.format.fastjson import loads_json_bytes
from msprobe.format.layout import (
    FORMAT_VERSION,
    TENSOR_DIR,
    RankDir,
    check_format_version,
    parse_rank_dir,
    parse_step_dir,
    rank_dir_name,
    validate_marker,
)
from msprobe.format.model import (
    Arg,
    Record,
    TensorArg,
    iter_tensors,
    parse_arg,
    tensor_entry,
    typed_value,
)
from msprobe.format.naming import (
    DataName,
    RecordName,
    check_file_name,
    is_record_name,
    parse_data_name,
    parse_record_name,
)
from msprobe.format.stats import crc32_hex, reference_stats, xor64_hex

__all__ = [
    "FORMAT_VERSION",
    "DUMP_JSON", "DEBUG_JSON", "STACK_JSON", "CONSTRUCT_JSON", "TENSOR_DIR",
    "DumpDocument", "DebugDocument", "StackDocument", "ConstructDocument", "loads_json", "dumps_json",
    "Dialect", "DIALECTS", "RankDir", "detect_dialect", "get_dialect", "parse_rank_dir", "parse_step_dir",
    "rank_dir_name", "validate_marker", "check_format_version",
    "Arg", "Record", "TensorArg", "iter_tensors", "parse_arg", "tensor_entry", "typed_value",
    "DataName", "RecordName", "check_file_name", "is_record_name", "parse_data_name", "parse_record_name",
    "crc32_hex", "reference_stats", "xor64_hex", "loads_json_bytes",
    "check_digests", "CRC_BUDGET",
]
