"""The lake's compare-backed question, :func:`diverge`: the first record where two runs diverge,
over all their ranks (:func:`msprobe.compare.compare_pair` on each (step, rank) pair, or each
step's merged layouts, as tasks of the lake's Executor, step by step). The SQL questions are in
:mod:`msprobe.lake._questions`."""
from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from types import SimpleNamespace
from typing import Any, Optional, Union

from msprobe.compare import (
    add_paths,
    compare_pair,
    detect_mode,
    earliest,
    layout_mode,
    layout_pairs,
    layout_summary,
    mindspore_against_pytorch,
    order_key,
    order_results,
    pair_sources,
)
from msprobe.errors import ConfigError
from msprobe.execution import Outbox, Shipment, ship, star
from msprobe.format.documents import CONSTRUCT_JSON, DEBUG_JSON, DUMP_JSON, STACK_JSON
from msprobe.format.layout import RankLocation
from msprobe.lake._build import Prefetched
from msprobe.lake._core import cached_store
from msprobe.readers import RankSource, records_of, task_of

__all__ = ["diverge"]


def _sources(lake: Any, run: str) -> list:
    rows = [row for row in lake.manifest_rows if row["run"] == run]
    if not rows:
        raise ConfigError(f"no run {run!r} in {lake.url}; runs: {', '.join(lake.runs) or 'none'}")
    return [RankSource(lake.store, RankLocation(row["prefix"], row["step"], row["rank_dir"], row["rank"], row["split"]),
                       run=run) for row in rows]


def _loc(src: Any) -> tuple:
    return (src.prefix, src.step, src.rank_dir, src.rank, src.split)


def _files_of(summaries: list) -> list:
    return [path for summary in summaries for path in summary["files"]]


def _received(outbox: Optional[Outbox], got: Any) -> list:
    """A task's summaries, the files it shipped written into the caller's folder and named as
    they lie there."""
    if outbox is None:
        return got
    summaries = outbox.receive(got)
    for summary in summaries:
        summary["files"] = [outbox.name(path) for path in summary["files"]]
    return summaries


def _compare_batch(root_url: str, storage_options: Optional[dict], pairs: list, mode: str,
                   out_dir: Union[None, str, Outbox], timestamp: str) -> Union[list, Shipment]:
    """Task: :func:`msprobe.compare.compare_pair` on each (target loc, bench loc); the CSVs go
    to ``out_dir`` (a temporary directory, removed, when None; an :class:`Outbox`: the caller's
    folder, the summaries then in a :class:`Shipment`). Returns the summaries without their
    per-summary series."""
    if isinstance(out_dir, Outbox):
        return ship(out_dir, lambda folder: _compare_batch(root_url, storage_options, pairs, mode, folder, timestamp),
                    _files_of)
    store = Prefetched(cached_store(root_url, storage_options))
    store.prefetch([loc[0] for pair in pairs for loc in pair], (DUMP_JSON, DEBUG_JSON, STACK_JSON, CONSTRUCT_JSON))
    tmp = None
    if out_dir is None:
        tmp = out_dir = tempfile.mkdtemp(prefix="msprobe-lake-compare-")
    out = []
    try:
        for (target_loc, bench_loc) in pairs:
            target = RankSource(store, RankLocation(*target_loc))
            bench = RankSource(store, RankLocation(*bench_loc))
            chosen_mode = mode
            if chosen_mode == "auto":
                chosen_mode = detect_mode(records_of(target), records_of(bench), task_of(target), task_of(bench))
            summary = compare_pair(target, bench, mode=chosen_mode, out_dir=out_dir, ts=timestamp, multi_step=True)
            summary.pop("series", None)
            summary["mode"] = chosen_mode
            summary["split"] = target_loc[4]
            if tmp is not None:
                summary["files"] = []
            out.append(summary)
            target.release()
            bench.release()
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _layout_batch(root_url: str, storage_options: Optional[dict], target_locs: list, bench_locs: list, mode: str,
                  out_dir: Union[None, str, Outbox], timestamp: str, layouts: tuple) -> Union[list, Shipment]:
    """Task: one step of two runs under parallel layouts (``layouts``: target's, bench's): each side's
    ranks merged into its logical models (:mod:`msprobe.compare._layouts`), then compared; the
    summaries carry ``layout`` (suspect ranks of the origin and first divergence). ``out_dir``:
    as :func:`_compare_batch`'s."""
    if isinstance(out_dir, Outbox):
        return ship(out_dir, lambda folder: _layout_batch(root_url, storage_options, target_locs, bench_locs, mode,
                                                          folder, timestamp, layouts), _files_of)
    store = Prefetched(cached_store(root_url, storage_options))
    store.prefetch([loc[0] for loc in target_locs + bench_locs], (DUMP_JSON, STACK_JSON, CONSTRUCT_JSON))
    sides = [SimpleNamespace(sources=[RankSource(store, RankLocation(*loc)) for loc in locs])
             for locs in (target_locs, bench_locs)]
    step = (target_locs[0][1], bench_locs[0][1])
    tmp = None
    if out_dir is None:
        tmp = out_dir = tempfile.mkdtemp(prefix="msprobe-lake-compare-")
    out = []
    try:
        for target, bench in layout_pairs(sides[0], sides[1], [step], *layouts):
            # merged names are the logical model's, one card's: by name; a MindSpore model against a PyTorch
            # card through the frameworks' mappings, as compare pairs them
            across: Optional[dict] = {"api": {}, "cell": {}} if mindspore_against_pytorch(records_of(target), records_of(bench)) \
                else None
            summary = compare_pair(target, bench, mode=layout_mode(mode if mode != "auto" else "statistics"),
                                   out_dir=out_dir, ts=timestamp, multi_step=True, structural=False, xframe=across)
            summary.pop("series", None)
            summary.update(mode="statistics", split=target_locs[0][4],
                           layout=layout_summary([(target, bench)], summary))
            if tmp is not None:
                summary["files"] = []
            out.append(summary)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _layout_jobs(lake: Any, run_a: str, run_b: str, step: Optional[int], mode: str, out: Optional[Outbox],
                 timestamp: str, layouts: tuple) -> dict:
    """{(step, split): [one job of :func:`_layout_batch`]} for the steps both runs hold."""
    sides = []
    for run in (run_a, run_b):
        by_step: dict = {}
        for source in _sources(lake, run):
            if step is None or source.step == step:
                by_step.setdefault((-1 if source.step is None else source.step, source.split or ""), []).append(
                    _loc(source))
        sides.append(by_step)
    common = sorted(set(sides[0]) & set(sides[1]))
    if not common:
        raise ConfigError(f"diverge: runs {run_a!r} and {run_b!r} share no step")
    return {key: [(lake.url, lake.storage_options, sides[0][key], sides[1][key], mode, out, timestamp, layouts)]
            for key in common}


def diverge(lake: Any, run_a: str, run_b: str, *, step: Optional[int] = None, rank: Optional[int] = None,
            mode: str = "auto", out: Optional[str] = None, all_steps: bool = False, batch: int = 4,
            layout: Optional[str] = None, bench_layout: Optional[str] = None) -> dict:
    """The first record where ``run_b`` diverges from ``run_a``, over all ranks.

    Steps are paired as :func:`msprobe.compare.pair_sources` pairs them; the steps are
    compared in order, each step's rank pairs as Dask tasks (``batch`` pairs a task), and
    the search stops after the first step with an origin (``all_steps=True`` compares
    every step). A rank pair diverges where compare flags a summary (its result is not
    ``pass``, or its relative Norm error exceeds the threshold). ``out``: a local
    directory that keeps compare's CSVs (one per rank pair).

    Returns ``{"first_divergence": {run_a, run_b, step, rank, rank_dir, record, summary, record_index,
    result, metrics} or None, "origin": {run_a, run_b, step, rank, rank_dir, record, summary,
    argument, role, size, note, record_index} or None, "ranks": [the first divergence of each
    diverging rank of that step, in order], "steps_compared": [...], "pairs_compared": n,
    "mode": ...}``; ``first_divergence`` is the key of compare's summary.json too (``"first"``,
    the same object, is kept for older scripts). ``first_divergence`` follows the Result
    column (26.2.0's rules); ``origin`` is where the error is introduced (:mod:`msprobe.compare._origin`); both are the earliest step's,
    then the first in that step's happens-before order over its ranks (the communication graph of
    :mod:`msprobe.format.comm`, built from the rank pairs' ``comm`` reports by
    :func:`msprobe.compare._cluster.order_results`; ``order``: (level, rank, record index)), as compare
    chooses them (:func:`msprobe.compare._origin.earliest`), each with its propagation path over the ranks
    (``path``, ``path_text``: :func:`msprobe.compare._cluster.add_paths`).

    ``layout`` / ``bench_layout`` (``"tp=2,pp=2"`` or ``"auto"``): that run's ranks are merged into its
    logical model per step before comparing (:mod:`msprobe.compare._layouts`; one task a step);
    each rank entry and the origin then carry ``layout`` (the ranks holding the record, the
    suspect ranks).

    Example: ``lake.diverge("run_npu", "run_gpu")["first_divergence"]["record"]``.
    """
    if run_a == run_b:
        raise ConfigError("diverge: give two different runs")
    timestamp = time.strftime("%Y%m%d%H%M%S")
    # a Dask worker may not share this machine's disk: the CSVs then come back with the results
    with Outbox.opened(out) if out is not None else contextlib.nullcontext() as outbox:
        if layout or bench_layout:
            layout_mode(mode)
            return _diverge_steps(lake, run_a, run_b, _layout_jobs(lake, run_a, run_b, step, mode, outbox, timestamp,
                                                                   (layout, bench_layout)), _layout_batch, mode,
                                  all_steps, outbox)
        return _diverge_pairs(lake, run_a, run_b, step, rank, mode, outbox, all_steps, batch, timestamp)


def _diverge_pairs(lake: Any, run_a: str, run_b: str, step: Optional[int], rank: Optional[int], mode: str,
                   outbox: Optional[Outbox], all_steps: bool, batch: int, timestamp: str) -> dict:
    """:func:`diverge` of two runs without layouts: the rank pairs of each step in tasks of ``batch``."""
    target_sources, bench_sources = _sources(lake, run_a), _sources(lake, run_b)
    pairs = pair_sources(SimpleNamespace(sources=target_sources), SimpleNamespace(sources=bench_sources),
                         step=step, rank=rank)
    by_step: dict = {}
    for target, bench_source in pairs:
        step_key = (-1 if target.step is None else target.step, target.split or "")
        by_step.setdefault(step_key, []).append((_loc(target), _loc(bench_source)))
    jobs = {key: [(lake.url, lake.storage_options, items[start:start + batch], mode, outbox, timestamp)
                  for start in range(0, len(items), batch)] for key, items in by_step.items()}
    return _diverge_steps(lake, run_a, run_b, jobs, _compare_batch, mode, all_steps, outbox)


def _diverge_steps(lake: Any, run_a: str, run_b: str, jobs_by_step: dict, task: Any, mode: str,
                   all_steps: bool, outbox: Optional[Outbox]) -> dict:
    """Run each step's jobs (``task``) in step order until a step diverges (every step with
    ``all_steps``); the answer of :func:`diverge`. ``outbox``: the folder the tasks' CSVs go to."""
    first = origin = None
    ranks: list = []
    steps_done: list = []
    n_pairs = 0
    used_mode = mode
    for key in sorted(jobs_by_step):
        results = [summary for part in lake.runner.map(star(task), jobs_by_step[key],
                                                       sink=lambda got: _received(outbox, got))
                   for summary in part]
        n_pairs += len(results)
        steps_done.append(key[0] if key[0] >= 0 else None)
        if results:
            used_mode = results[0]["mode"]
        graphs = order_results(results)  # each answer's place in its step's happens-before order
        if origin is None:
            got = earliest(results, "origin")
            if got is not None:
                origin = dict(got["origin"], step=got["step"], rank=got["rank"], rank_dir=got["rank_dir"],
                              split=got["split"], run_a=run_a, run_b=run_b)
                if "layout" in got:
                    origin["layout"] = got["layout"].get("origin")
        divs = [summary for summary in results if summary["first_divergence"]] if first is None else []
        if divs:
            divs.sort(key=lambda summary: order_key(summary, "first_divergence"))
            for summary in divs:
                divergence = summary["first_divergence"]
                ranks.append({"step": summary["step"], "rank": summary["rank"], "rank_dir": summary["rank_dir"],
                              "split": summary["split"], "record": divergence["record"], "row": divergence["row"],
                              "record_index": divergence["record_index"], "result": divergence["result"],
                              "metrics": divergence["metrics"], "files": summary["files"],
                              "order": divergence.get("order"),
                              **({"layout": summary["layout"].get("first_divergence")} if "layout" in summary else {})})
            if first is None:
                first = dict(ranks[0], run_a=run_a, run_b=run_b)
        add_paths({"origin": origin, "first_divergence": first}, graphs)
        if origin is not None and not all_steps:  # a step whose rows depart with no record where an error
            break  # enters (26.2.0's ratio rules on round-off) does not end the search for the origin
    return {"run_a": run_a, "run_b": run_b, "mode": used_mode, "first_divergence": first, "first": first,
            "origin": origin, "ranks": ranks,
            "steps_compared": steps_done, "pairs_compared": n_pairs, "executor": lake.runner.last}


# -- rank disagreement -------------------------------------------------------------------------------
