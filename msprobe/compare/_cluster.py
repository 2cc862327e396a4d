"""Answers across the ranks of a step that follow their communication (spec/FORMAT.md section 25).

Each rank pair's report carries its target's communication calls (:func:`comm_report`: the
calls with their peers and groups, and whether each call's data and result hold a NaN/Inf or
depart from the bench); :func:`order_results` builds each step's graph from the reports
(:mod:`msprobe.format.comm`) and gives every first divergence, origin and first NaN/Inf its
place in the step's happens-before order (``order``), which :func:`msprobe.compare._origin.earliest`
sorts by; :func:`add_paths` writes the chosen answer's propagation path over the ranks.
"""
from __future__ import annotations

from typing import Any, Optional

from msprobe.compare._origin import ORIGIN_THRESHOLD, departure
from msprobe.compare._rows import leaf_side, record_leaves
from msprobe.format.comm import (
    buffer_args,
    call_rows,
    calls_from_rows,
    calls_in,
    describe_path,
    graph_from_calls,
    is_buffer_leaf,
    propagation,
)
from msprobe.format.nonfinite import stat_kinds

__all__ = ["comm_report", "order_results", "add_paths", "ORDERED_KEYS"]

#: the entries of a rank pair's report placed in the step's order
ORDERED_KEYS = ("first_divergence", "origin", "first_nan_inf_target", "first_nan_target", "first_inf_target",
                "first_nan_inf_bench", "first_nan_bench", "first_inf_bench")
_RESULT_IO = ("output",)


def _flags(name: str, raw: Any, bench_raw: Any, rank: int, md5: bool, threshold: float) -> list:
    """[NaN/Inf in its data, NaN/Inf in its result, data departs, result departs] of one call."""
    buffers = buffer_args(name, raw, rank)
    bench = {suffix: leaf for suffix, leaf, _ in record_leaves(name, bench_raw)} if isinstance(bench_raw, dict) else {}
    out = [False, False, False, False]
    for suffix, leaf, io in record_leaves(name, raw):
        if leaf is None or is_buffer_leaf(suffix, buffers):
            continue
        side = leaf_side(leaf)
        if not side.tensor:
            continue
        result = io in _RESULT_IO
        if stat_kinds(side.stats):
            out[1 if result else 0] = True
        other = bench.get(suffix)
        if other is not None:
            size, note = departure(side, leaf_side(other), md5)
            if size > threshold or note:
                out[3 if result else 2] = True
    return out


def comm_report(target_data: dict, bench_data: dict, pairs: list, rank: Optional[int], mode: str,
                threshold: Optional[float] = None) -> Optional[dict]:
    """The target's communication calls of one rank pair: ``{"calls": rows, "flags": [[NaN/Inf in
    data, in result, data departs, result departs] per call]}``, or None when it has none."""
    if rank is None:
        return None
    calls = calls_in(target_data, rank)
    if not calls:
        return None
    limit = ORIGIN_THRESHOLD if threshold is None else threshold
    md5 = mode == "md5"
    flags = []
    for call in calls:
        bench = pairs[call.index][1] if call.index < len(pairs) else None
        flags.append(_flags(call.name, target_data[call.name], bench_data.get(bench) if bench else None, rank, md5,
                            limit))
    return {"calls": call_rows(calls), "flags": flags}


def _step_of(result: dict) -> tuple:
    return (result.get("step"), str(result.get("split") or ""))


def _graphs(results: list) -> dict:
    """{(step, split): (StepGraph, {(rank, index): flags})} of the results holding a comm report."""
    by_step: dict = {}
    for result in results:
        report = result.get("comm")
        if report and result.get("rank") is not None:
            by_step.setdefault(_step_of(result), []).append((result["rank"], report))
    out = {}
    for key, reports in by_step.items():
        calls = {rank: calls_from_rows(rank, report["calls"]) for rank, report in reports}
        flags = {(rank, row[0]): flag for rank, report in reports for row, flag in zip(report["calls"], report["flags"])}
        world = tuple(sorted({result["rank"] for result in results
                              if _step_of(result) == key and result.get("rank") is not None}))
        out[key] = (graph_from_calls(calls, world), flags)
    return out


def order_results(results: list) -> dict:
    """Give every entry of :data:`ORDERED_KEYS` of the rank pairs' reports its ``order`` in its
    step's happens-before order (level, rank, record index); returns the graphs by (step, split)."""
    graphs = _graphs(results)
    for result in results:
        got = graphs.get(_step_of(result))
        rank = result.get("rank")
        if got is None or rank is None:
            continue
        graph = got[0]
        for key in ORDERED_KEYS:
            entry = result.get(key)
            if isinstance(entry, dict):
                entry["order"] = list(graph.order_key(rank, entry.get("record_index")))
                if entry.get("settled_at") is not None:  # its content's place (format.settled): its level
                    entry["order"][0] = graph.order_key(rank, entry["settled_at"])[0]
    return graphs


_CARRIES = {"divergence": (2, 3), "nonfinite": (0, 1)}


def add_paths(chosen: dict, graphs: dict) -> None:
    """Add ``path`` (the hops, earliest first) and ``path_text`` to the chosen answers of a
    summary (``chosen``: {summary key: located entry with step, rank, record_index, record})."""
    for key, entry in chosen.items():
        if not entry or entry.get("record_index") is None or entry.get("rank") is None:
            continue
        got = graphs.get((entry.get("step"), str(entry.get("split") or "")))
        if got is None:
            continue
        graph, flags = got
        data_at, result_at = _CARRIES["divergence" if key in ("origin", "first_divergence") else "nonfinite"]

        def carries(rank: int, index: int, what: str, flags: dict = flags, data_at: int = data_at,
                    result_at: int = result_at) -> bool:
            flag = flags.get((rank, index))
            return bool(flag and flag[data_at if what == "data" else result_at])

        hops = propagation(graph, entry["rank"], entry["record_index"], carries)
        entry["path"] = [{"from_rank": e.src_rank, "from_record": e.src_record, "to_rank": e.dst_rank,
                          "to_record": e.dst_record, "via": e.kind} for e in hops]
        entry["path_text"] = describe_path((entry["rank"], entry["record"]), hops)
