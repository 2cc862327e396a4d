"""The compare plot: what a person wants to see in one fixed-size PNG (1200 x 700 px).

* One rank pair: the relative Norm error of each CSV row (log axis; rows whose error is 0 are
  counted, not drawn), error and warning rows marked along the top, the first divergence and
  the worst rows numbered and listed beside the axes.
* Several rank pairs (a cluster): a step x rank heatmap of each pair's worst relative Norm
  error, pairs holding error rows outlined in red and those with warnings in orange, and the
  worst rows over all pairs numbered on their cells and listed beside the map.

:class:`PlotMarks` is what compare keeps per rank pair for it (beside the per-row series):
the error/warning rows and the ``TOP_N`` worst rows, bounded whatever the pair's size.
"""
from __future__ import annotations

import heapq
import math
import os
from typing import Any, Optional

__all__ = ["PlotMarks", "plot_compare", "cluster_grid", "TOP_N", "FIGSIZE", "DPI"]

TOP_N = 10
#: error/warning rows kept per rank pair for the single-pair plot (all are counted)
MAX_MARKS = 20000
FIGSIZE = (12, 7)
DPI = 100
_FLAGGED = ("error", "warning")


class PlotMarks:
    """Error/warning rows and the worst rows (by relative Norm error) of one rank pair."""

    __slots__ = ("marks", "counts", "_worst")

    def __init__(self) -> None:
        self.marks: list = []  # [row index, result]
        self.counts = {"error": 0, "warning": 0}
        self._worst: list = []  # min-heap of (value, -row index, row name, result)

    def see(self, idx: int, result: str, name: str, norm_rel: Optional[float]) -> None:
        if result in _FLAGGED:
            self.counts[result] += 1
            if len(self.marks) < MAX_MARKS:
                self.marks.append([idx, result])
        if norm_rel is not None and norm_rel.__class__ is float and 0 < norm_rel < math.inf:
            self._push((norm_rel, -idx, name, result))

    def _push(self, item: tuple) -> None:
        if len(self._worst) < TOP_N:
            heapq.heappush(self._worst, item)
        elif item > self._worst[0]:
            heapq.heapreplace(self._worst, item)

    def merge(self, other: Any, offset: int) -> None:
        """Add a chunk's marks (a PlotMarks or its :meth:`as_dict`), its row indices shifted by ``offset``."""
        d = other.as_dict() if isinstance(other, PlotMarks) else other
        for k in self.counts:
            self.counts[k] += d["counts"].get(k, 0)
        room = MAX_MARKS - len(self.marks)
        self.marks.extend([i + offset, res] for i, res in d["marks"][:max(room, 0)])
        for w in d["worst"]:
            self._push((w["norm_relative_err"], -(w["row_index"] + offset), w["row"], w["result"]))

    def worst_rows(self) -> list:
        """The worst rows, worst first: {row, row_index, norm_relative_err, result}."""
        return [{"row": name, "row_index": -neg, "norm_relative_err": v, "result": res}
                for v, neg, name, res in sorted(self._worst, reverse=True)]

    def as_dict(self) -> dict:
        return {"marks": self.marks, "counts": dict(self.counts), "worst": self.worst_rows()}

    def __reduce__(self):  # plain data across processes and Dask
        return (_from_dict, (self.as_dict(),))


def _from_dict(d: dict) -> PlotMarks:
    m = PlotMarks()
    m.merge(d, 0)
    return m


# -- drawing -------------------------------------------------------------------------------------

def plot_compare(results: list, out_dir: str, ts: str, mode: str, threshold: float) -> tuple:
    """(PNG path, None) or (None, why there is no plot)."""
    if mode == "md5":
        return None, "no plot in md5 mode (no statistics to compare)"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None, "matplotlib is not installed: no plot (pip install matplotlib, or the plot extra)"
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"compare_plot_{ts}.png")
    fig = plt.figure(figsize=FIGSIZE, dpi=DPI)
    try:
        if len(results) == 1:
            _pair_figure(fig, results[0], threshold)
        else:
            _cluster_figure(fig, results)
        fig.savefig(path, dpi=DPI)
    finally:
        plt.close(fig)
    return path, None


def _short(name: str, width: int = 58) -> str:
    return name if len(name) <= width else name[: width // 2 - 1] + "…" + name[-(width // 2 - 1):]


def _marks_of(result: dict) -> PlotMarks:
    marks = result.get("marks")
    return marks if isinstance(marks, PlotMarks) else _from_dict(marks or {"marks": [], "counts": {}, "worst": []})


def _side_list(fig: Any, title: str, lines: list, left: float = 0.70) -> None:
    axes = fig.add_axes((left, 0.10, 0.99 - left, 0.80))
    axes.axis("off")
    axes.text(0, 1, title, fontsize=10, weight="bold", va="top", transform=axes.transAxes)
    for line, (text, color) in enumerate(lines):
        axes.text(0, 0.95 - line * 0.045, text, fontsize=8, va="top", color=color, family="monospace",
                  transform=axes.transAxes)


_COLOR = {"error": "#c62828", "warning": "#ef8f00", "pass": "#1f4e79"}


def _pair_figure(fig: Any, result: dict, threshold: float) -> None:
    series = result["series"]
    marks = _marks_of(result)
    axes = fig.add_axes((0.07, 0.12, 0.57, 0.76))
    drawn = [row for row, value in enumerate(series) if value is not None and 0 < value < math.inf]
    zeros = sum(1 for value in series if value == 0)
    axes.plot(drawn, [series[row] for row in drawn], ".", ms=3, color=_COLOR["pass"],
              label=f"rows with an error > 0 ({len(drawn)})")
    axes.set_yscale("log")
    axes.axhline(threshold, color="#555555", lw=0.8, ls="--", label=f"{threshold:g}")
    transform = axes.get_xaxis_transform()
    for res, height in (("error", 1.036), ("warning", 1.014)):  # a rug above the axes, off the data
        rows = [row for row, row_result in marks.marks if row_result == res]
        if marks.counts[res]:
            axes.plot(rows, [height] * len(rows), "|", ms=8, mew=1.2, color=_COLOR[res], transform=transform,
                      clip_on=False, label=f"{res} rows ({marks.counts[res]}), marked above the axes")
    worst = marks.worst_rows()
    for (column, height), numbers in _label_groups(worst, max(len(series), 1)):
        axes.annotate(",".join(map(str, numbers)), (column, height), xytext=(3, 3), textcoords="offset points",
                      fontsize=8, color="black", weight="bold")
    first = result.get("first_divergence")
    if first is not None and first.get("row_index") is not None and first["row_index"] < len(series):
        value = series[first["row_index"]]
        height = value if value is not None and 0 < value < math.inf else threshold
        axes.plot([first["row_index"]], [height], "o", ms=11, mfc="none", mec=_COLOR["error"], mew=1.5,
                label="first divergence")
    axes.set_xlim(-0.5, max(len(series), 1) - 0.5)
    axes.set_xlabel("row of the compare CSV (execution order)")
    axes.set_ylabel("relative Norm error (log)")
    if zeros:
        axes.plot([], [], " ", label=f"rows with error 0 ({zeros}, not drawn on the log axis)")
    axes.legend(fontsize=8, loc="lower right", framealpha=0.9)
    res = ", ".join(f"{name} {count}" for name, count in sorted(result["results"].items()))
    axes.set_title(f"step {result['step']} {result['rank_dir']} vs {result['bench_rank_dir']}: "
                   f"{result['rows']} rows ({res})", fontsize=10, pad=26)
    lines = []
    for number, entry in enumerate(worst, 1):
        color = _COLOR.get(entry["result"], "black")
        lines += [(f"{number:>2}. {entry['norm_relative_err']:.3g} {entry['result']:<7} row {entry['row_index']}",
                   color),
                  (f"     {_short(entry['row'], 44)}", color)]
    if first is not None:
        lines += [("", "black"), ("first divergence:", _COLOR["error"]),
                  (f"  {_short(first['row'], 46)}", _COLOR["error"])]
    _side_list(fig, f"worst rows (of {result['rows']})", lines or [("no row with a relative Norm error > 0", "black")],
               left=0.665)


def _label_groups(worst: list, n_rows: int) -> list:
    """[((column, height), [numbers])]: the worst rows' numbers, those drawn close together joined ("3,4,5")."""
    groups: list = []
    for number, entry in enumerate(worst, 1):
        column, height = entry["row_index"], entry["norm_relative_err"]
        for group in groups:
            (group_column, group_height), numbers = group
            if (abs(group_column - column) <= 0.03 * n_rows
                    and abs(math.log10(group_height) - math.log10(height)) < 0.35):
                numbers.append(number)
                break
        else:
            groups.append(((column, height), [number]))
    return groups


def _rank_key(result: dict) -> tuple:
    rank = result.get("rank")
    return (rank is None, rank if isinstance(rank, int) else 0, str(result["rank_dir"]))


def _step_key(step: Any) -> tuple:
    return (step is None, step if isinstance(step, int) else 0, str(step))


def cluster_grid(results: list) -> dict:
    """What the cluster plot draws: ``steps``, ``ranks`` (rank dir names), ``worst``
    (steps x ranks: a pair's largest finite relative Norm error, 0.0 when all its errors are 0,
    None without a pair or a value), ``flags`` ({(row, column): 'error'/'warning'}) and ``top``
    (the worst rows over all pairs, worst first, each with its cell)."""
    steps = sorted({result["step"] for result in results}, key=_step_key)
    by_rank_dir = {result["rank_dir"]: result for result in results}
    ranks = [result["rank_dir"] for result in sorted(by_rank_dir.values(), key=_rank_key)]
    step_row = {step: row for row, step in enumerate(steps)}
    rank_column = {rank_dir: column for column, rank_dir in enumerate(ranks)}
    worst: list = [[None] * len(ranks) for _ in steps]  # step x rank: the worst value, None when none
    flags: dict = {}
    top: list = []
    for result in results:
        row, column = step_row[result["step"]], rank_column[result["rank_dir"]]
        finite = [value for value in result["series"]
                  if value is not None and value.__class__ is float and value < math.inf]
        worst[row][column] = max(finite) if finite else None
        marks = _marks_of(result)
        if marks.counts["error"]:
            flags[(row, column)] = "error"
        elif marks.counts["warning"]:
            flags[(row, column)] = "warning"
        top.extend(dict(entry, step=result["step"], rank_dir=result["rank_dir"], cell=(row, column))
                   for entry in marks.worst_rows())
    top.sort(key=lambda entry: -entry["norm_relative_err"])
    return {"steps": steps, "ranks": ranks, "worst": worst, "flags": flags, "top": top[:TOP_N]}


def _cluster_figure(fig: Any, results: list) -> None:
    import matplotlib
    import numpy as np
    from matplotlib import colors
    from matplotlib.patches import Patch, Polygon, Rectangle

    grid = cluster_grid(results)
    steps, ranks = grid["steps"], grid["ranks"]
    data = np.array([[np.nan if value is None else value for value in row] for row in grid["worst"]], dtype=float)
    positive = data[np.isfinite(data) & (data > 0)]
    axes = fig.add_axes((0.07, 0.12, 0.52, 0.76))
    bar_axes = fig.add_axes((0.605, 0.12, 0.012, 0.76))
    cmap = matplotlib.colormaps["viridis"].with_extremes(under="#f2f2f2", bad="#ffffff")
    low = float(positive.min()) if positive.size else 1e-8
    high = float(positive.max()) if positive.size else 1.0
    if high <= low:
        low, high = low / 10, high * 10
    shown = np.where(data == 0, low / 10, data)  # a pair whose errors are all 0: the 'under' colour
    image = axes.imshow(shown, aspect="auto", interpolation="nearest", cmap=cmap,
                        norm=colors.LogNorm(vmin=low, vmax=high), origin="upper")
    fig.colorbar(image, cax=bar_axes, extend="min").set_label("worst relative Norm error of the rank pair", fontsize=9)
    for (row, column), flag in grid["flags"].items():
        if flag == "error":  # outlined
            axes.add_patch(Rectangle((column - 0.46, row - 0.46), 0.92, 0.92, fill=False, ec=_COLOR["error"], lw=2.2))
        else:  # a corner: many pairs warn on float noise alone, the map stays readable
            axes.add_patch(Polygon([(column - 0.5, row - 0.5), (column - 0.2, row - 0.5), (column - 0.5, row - 0.3)],
                                   fc=_COLOR["warning"], ec="none"))
    labelled: set = set()
    for number, entry in enumerate(grid["top"], 1):
        if entry["cell"] not in labelled:
            labelled.add(entry["cell"])
            row, column = entry["cell"]
            axes.text(column, row, str(number), ha="center", va="center", fontsize=8, weight="bold", color="white",
                    bbox={"boxstyle": "circle,pad=0.15", "fc": "black", "ec": "none", "alpha": 0.6})
    every_r = max(1, math.ceil(len(ranks) / 40))
    every_s = max(1, math.ceil(len(steps) / 30))
    axes.set_xticks(range(0, len(ranks), every_r))
    axes.set_xticklabels([str(ranks[column]) for column in range(0, len(ranks), every_r)], rotation=90, fontsize=8)
    axes.set_yticks(range(0, len(steps), every_s))
    axes.set_yticklabels([str(steps[row]) for row in range(0, len(steps), every_s)], fontsize=8)
    axes.set_xlabel("rank directory")
    axes.set_ylabel("step")
    n_err = sum(1 for value in grid["flags"].values() if value == "error")
    n_warn = sum(1 for value in grid["flags"].values() if value == "warning")
    axes.set_title(f"{len(results)} rank pairs ({len(steps)} steps x {len(ranks)} ranks): {n_err} with error rows, "
                 f"{n_warn} more with warnings", fontsize=10)
    fig.legend(handles=[Patch(fill=False, ec=_COLOR["error"], lw=2.2, label="pair with error rows"),
                        Patch(fc=_COLOR["warning"], ec="none", label="warnings only (corner)"),
                        Patch(fc="#f2f2f2", ec="#999999", label="all errors 0"),
                        Patch(fc="#ffffff", ec="#999999", label="no value")],
               fontsize=8, loc="lower left", bbox_to_anchor=(0.66, 0.01), ncol=2, frameon=False)
    lines = []
    for number, entry in enumerate(grid["top"], 1):
        color = _COLOR.get(entry["result"], "black")
        lines += [(f"{number:>2}. {entry['norm_relative_err']:.3g} {entry['result']:<7} step {entry['step']} "
                   f"{entry['rank_dir']}", color),
                  (f"     {_short(entry['row'], 44)}", color)]
    _side_list(fig, f"worst rows over all {len(results)} pairs",
               lines or [("no row with a relative Norm error > 0", "black")], left=0.665)
