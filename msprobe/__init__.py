"""msprobe-lake: the msprobe precision-debugging dump format, as a data lake.

``import msprobe`` is light: torch, mindspore, pyarrow, zarr, s3fs and dask are
only imported by the submodules that need them, when they are used.
"""
from __future__ import annotations

from msprobe.errors import MsprobeError

__version__ = "0.1.0"
FORMAT_VERSION = "1.0"

__all__ = ["MsprobeError", "__version__", "FORMAT_VERSION"]
