"""``msprobe compare``: compare two dumps of any dialect (8.x, 26.x, ours), record by record.

>>> from msprobe.compare import compare
>>> s = compare("run_npu/step0", "run_gpu/step0", "out")      # doctest: +SKIP
>>> s["first_divergence"]                                     # doctest: +SKIP

Writes one ``compare_result_<rank dir>_<timestamp>.csv`` per rank (the real tool's
columns for statistics, md5 and tensor dumps), optionally ``.xlsx``, a
``summary.json`` and a plot of the relative Norm error along execution order.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

#: each public name's module: imported on first use, so that ``msprobe index`` (the leaf table)
#: or the lake (the origin's order) loads only the part of compare it takes
_WHERE = {
    "add_paths": "_cluster", "order_results": "_cluster",
    "NORM_REL_THRESHOLD": "_core", "compare": "_core", "compare_pair": "_core", "detect_mode": "_core",
    "pair_sources": "_core",
    "COMPARE_LEAVES": "_indexed",
    "layout_mode": "_layouts", "layout_pairs": "_layouts", "layout_summary": "_layouts", "merged_dump": "_layouts",
    "write_compare_leaves": "_leaftable",
    "describe": "_origin", "earliest": "_origin", "order_key": "_origin",
    "COLUMNS": "_rows", "norm_record_name": "_rows", "record_leaves": "_rows",
    "ONLY_10X": "_verdict", "ROUNDOFF_FLOOR": "_verdict", "roundoff_floor_sql": "_verdict",
    "mindspore_against_pytorch": "_xframe", "read_api_mapping": "_xframe", "read_cell_mapping": "_xframe",
    "read_layer_mapping": "_xframe",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(_WHERE))


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
