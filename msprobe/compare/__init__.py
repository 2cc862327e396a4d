"""``msprobe compare``: compare two dumps of any dialect (8.x, 26.x, ours), record by record.

>>> from msprobe.compare import compare
>>> s = compare("run_npu/step0", "run_gpu/step0", "out")      # doctest: +SKIP
>>> s["first_divergence"]                                     # doctest: +SKIP

Writes one ``compare_result_<rank dir>_<timestamp>.csv`` per rank (the real tool's
columns for statistics, md5 and tensor dumps), optionally ``.xlsx``, a
``summary.json`` and a plot of the relative Norm error along execution order.
"""
from __future__ import annotations

from msprobe.compare._core import NORM_REL_THRESHOLD, compare, compare_pair, detect_mode, pair_sources
from msprobe.compare._rows import COLUMNS, norm_record_name, record_leaves

__all__ = ["compare", "compare_pair", "detect_mode", "pair_sources", "COLUMNS", "norm_record_name",
           "record_leaves", "NORM_REL_THRESHOLD"]
