"""msprobe-lake: the msprobe precision-debugging dump format, as a data lake.

``import msprobe`` is light: torch, mindspore, pyarrow, zarr, s3fs and dask are
only imported by the submodules that need them, when they are used. Importing it
next to Huawei's ``mindstudio-probe`` (the same ``msprobe`` package) warns
(:mod:`msprobe._coexist`).
"""
from __future__ import annotations

from msprobe._coexist import DistributionConflictWarning, warn_if_mixed
from msprobe.errors import MsprobeError

__version__ = "0.1.0"  # the one version source (pyproject.toml reads it)
#: The version of spec/FORMAT.md this code implements; readers accept any 1.x. Its one
#: definition (``msprobe.format.layout`` re-exports it), here at the bottom of the layers.
FORMAT_VERSION = "1.0"

__all__ = ["MsprobeError", "DistributionConflictWarning", "__version__", "FORMAT_VERSION"]

warn_if_mixed(stacklevel=2)
