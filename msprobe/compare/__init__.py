"""``msprobe compare``: compare two dumps of any dialect (8.x, 26.x, ours), record by record.

>>> from msprobe.compare import compare
>>> s = compare("run_npu/step0", "run_gpu/step0", "out")      # doctest: +SKIP
>>> s["first_divergence"]                                     # doctest: +SKIP

Writes one ``compare_result_<rank dir>_<timestamp>.csv`` per rank (the real tool's
columns for statistics, md5 and tensor dumps), optionally ``.xlsx``, a
``summary.json`` and a plot of the relative Norm error along execution order.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from msprobe._lazy import lazy_names

if TYPE_CHECKING:
    from msprobe.compare._cluster import add_paths, order_results
    from msprobe.compare._core import NORM_REL_THRESHOLD, compare, compare_pair, detect_mode, pair_sources
    from msprobe.compare._indexed import COMPARE_LEAVES
    from msprobe.compare._layouts import layout_mode, layout_pairs, layout_summary, merged_dump
    from msprobe.compare._leaftable import write_compare_leaves
    from msprobe.compare._origin import describe, earliest, order_key
    from msprobe.compare._rows import COLUMNS, norm_record_name, record_leaves
    from msprobe.compare._verdict import ONLY_10X, ROUNDOFF_FLOOR, roundoff_floor_sql
    from msprobe.compare._xframe import (
        mindspore_against_pytorch,
        read_api_mapping,
        read_cell_mapping,
        read_layer_mapping,
    )

#: each public name's module: imported on first use (msprobe._lazy), so that ``msprobe index`` (the
#: leaf table) or the lake (the origin's order) loads only the part of compare it takes
__getattr__, __dir__ = lazy_names(__name__, {
    "_cluster": ("add_paths", "order_results"),
    "_core": ("NORM_REL_THRESHOLD", "compare", "compare_pair", "detect_mode", "pair_sources"),
    "_indexed": ("COMPARE_LEAVES",),
    "_layouts": ("layout_mode", "layout_pairs", "layout_summary", "merged_dump"),
    "_leaftable": ("write_compare_leaves",),
    "_origin": ("describe", "earliest", "order_key"),
    "_rows": ("COLUMNS", "norm_record_name", "record_leaves"),
    "_verdict": ("ONLY_10X", "ROUNDOFF_FLOOR", "roundoff_floor_sql"),
    "_xframe": ("mindspore_against_pytorch", "read_api_mapping", "read_cell_mapping", "read_layer_mapping"),
})


__all__ = ["compare", "compare_pair", "detect_mode", "pair_sources", "COLUMNS", "norm_record_name",
           "record_leaves", "NORM_REL_THRESHOLD",
           # the rank pairs' order and the first of them (what the lake's questions and the CLI print)
           "order_results", "add_paths", "order_key", "earliest", "describe",
           # a MindSpore run against a PyTorch one (the lake pairs them as compare does)
           "mindspore_against_pytorch",
           # merged parallel layouts (--layout)
           "layout_mode", "layout_pairs", "layout_summary", "merged_dump",
           # cross-framework mapping files (-api_mapping, -cell_mapping, -layer_mapping)
           "read_api_mapping", "read_cell_mapping", "read_layer_mapping",
           # compare's leaf table in the index (msprobe index writes it; compare reads it when up to date)
           "COMPARE_LEAVES", "write_compare_leaves",
           # the first divergence's round-off floor (the explorer's first divergence follows it)
           "ONLY_10X", "ROUNDOFF_FLOOR", "roundoff_floor_sql"]
