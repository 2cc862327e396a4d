"""``msprobe view`` / ``msprobe report``: a browser explorer of dumps, compare outputs and lakes.

>>> from msprobe.view import open_view, serve, write_report
>>> data = open_view("run_npu", "run_gpu")          # the pair, compared once   # doctest: +SKIP
>>> serve(data)                                      # http://127.0.0.1:PORT/?token=...  # doctest: +SKIP
>>> write_report(data, "report.html")                # one self-contained file  # doctest: +SKIP

Views: the overview (step x rank heatmap of the worst result), the cluster view (one step's ranks as
lanes in communication order, matched calls as edges, the first anomaly and its path), the divergence list (paged rows in
execution order, the first divergent one marked), the model tree (construct.json, each node coloured
by the worst result below it), trends (a row's statistic over steps per rank, target against bench),
the record detail (every argument side by side, md5, stack, tensor histogram) and export (PNG/SVG,
CSV). The page is built from ``frontend/`` into ``msprobe/view/static/`` and ships in the wheel.

Importing this package imports neither duckdb nor starlette.
"""
from __future__ import annotations

from typing import Any

__all__ = ["open_view", "serve", "make_app", "write_report", "MAX_ROWS_PER_CELL", "MAX_TREE_NODES"]

#: public names served from a heavier module on first use (``import msprobe.view`` stays light)
_LAZY = {"MAX_ROWS_PER_CELL": "_report", "MAX_TREE_NODES": "_report"}


def __getattr__(name: str) -> Any:
    if _LAZY.get(name) == "_report":
        from msprobe.view import _report

        return getattr(_report, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_view(*args: Any, **kwargs: Any) -> Any:
    from msprobe.view._data import open_view as _open

    return _open(*args, **kwargs)


def serve(*args: Any, **kwargs: Any) -> Any:
    from msprobe.view._server import serve as _serve

    return _serve(*args, **kwargs)


def make_app(*args: Any, **kwargs: Any) -> Any:
    from msprobe.view._server import make_app as _make

    return _make(*args, **kwargs)


def write_report(*args: Any, **kwargs: Any) -> Any:
    from msprobe.view._report import write_report as _write

    return _write(*args, **kwargs)
