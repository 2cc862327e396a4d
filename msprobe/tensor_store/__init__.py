"""The optional Zarr v3 tensor store (``tensor_store: "zarr"``; spec/FORMAT.md section 21).

Tensor payloads of one step and rank go into ``<rank dir>/tensors.zarr``: one 1-D array
per logical dtype, a few large shards per array, deduplicated and blosc-compressed;
the manifest (group attributes) maps every ``data_name`` to its payload. numcodecs and
google-crc32c (the ``zarr`` extra) are imported only when a store is written or read.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from msprobe._lazy import lazy_names

if TYPE_CHECKING:
    from msprobe.tensor_store._layout import STORE_DIR, aligned_buffer, location, parse_location, storage_dtype
    from msprobe.tensor_store._reader import IncompleteTensorError, ZarrTensorReader, has_tensor_store
    from msprobe.tensor_store._writer import WriterSummary, ZarrTensorWriter

#: each public name's submodule, imported on first use (msprobe._lazy)
__getattr__, __dir__ = lazy_names(__name__, {
    "_layout": ("STORE_DIR", "aligned_buffer", "location", "parse_location", "storage_dtype"),
    "_reader": ("IncompleteTensorError", "ZarrTensorReader", "has_tensor_store"),
    "_writer": ("WriterSummary", "ZarrTensorWriter"),
})

__all__ = ["STORE_DIR", "ZarrTensorWriter", "ZarrTensorReader", "IncompleteTensorError", "WriterSummary",
           "has_tensor_store", "location", "parse_location", "storage_dtype", "aligned_buffer"]
