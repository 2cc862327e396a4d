"""Compare under parallel layouts (``--layout``, ``--bench-layout``): each side's ranks merged into
its logical models (:mod:`msprobe.readers._merged`, spec/FORMAT.md section 26), then paired.

A side without a layout is taken as it is (a single-card run: its one rank directory). The target
is merged with the bench as its reference (the bench's shapes tell a shard from a replica, its
statistics which replica or shard departs). Merged sides are compared in statistics mode: md5
values of shards cannot be merged, and tensors are not concatenated here."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Optional

import msprobe.readers as readers  # the layout merger's modules: only under --layout
from msprobe.errors import ConfigError
from msprobe.format.parallel import LayoutError, parse_layout

__all__ = ["layout_pairs", "layout_mode", "layout_summary", "merged_dump"]


def _parse(text: Optional[str], flag: str) -> Any:
    if not text or text == "auto":
        return text or None
    try:
        return parse_layout(text)
    except LayoutError as exc:
        raise ConfigError(f"{flag}: {exc}") from exc


def _step_sources(dump: Any, step: Any) -> list:
    return [source for source in dump.sources if source.step == step]


def _side(dump: Any, step: Any, layout: Any, reference: Optional[dict], other_shapes: Optional[dict] = None) -> list:
    sources = _step_sources(dump, step)
    if layout is None:
        return sources
    return readers.merge_dump_step(sources, None if layout == "auto" else layout, reference, other_shapes)


def _shapes(dump: Any, step: Any, layout: Any) -> Optional[dict]:
    """What one side holds of each tensor: a single card's shapes, or what its layout's shards can
    make (the other side's hint for telling shards from replicas)."""
    sources = _step_sources(dump, step)
    if not sources:
        return None
    if layout is None:
        return readers.shapes_of(readers.records_of(sources[0]))
    return readers.other_shapes_of(sources, None if layout == "auto" else layout)


def _in_target_names(dump: Any, step: Any, layout: Any, reference: dict, xframe: Optional[dict]) -> dict:
    """The bench's records under the target's logical names where a MindSpore target meets a PyTorch
    single card (its shapes tell the target's shards from replicas): the target merged once without
    them, its records paired with the bench's by the cross-framework mapping (``xframe``: -am/-cm
    files, default the built-in tables); else the bench's records as they are."""
    from msprobe.compare._xframe import XFrame, match_xframe, mindspore_against_pytorch

    sources = _step_sources(dump, step)
    if not sources or not reference or not mindspore_against_pytorch(readers.records_of(sources[0]), reference):
        return reference
    renamed: dict = {}
    for model in readers.merge_dump_step(sources, None if layout == "auto" else layout):
        for target, bench in match_xframe(readers.records_of(model), reference, XFrame(xframe or {"api": {}, "cell": {}}))[0]:
            if bench is not None and target not in renamed:
                renamed[target] = reference[bench]
    return renamed


def layout_pairs(target_dump: Any, bench_dump: Any, steps: list, layout: Optional[str],
                 bench_layout: Optional[str], xframe: Optional[dict] = None) -> list:
    """[(target source, bench source)] of the merged logical models, step by step: a lone bench
    model pairs with every target model, else model i with model i. A MindSpore target against a
    PyTorch single card is merged with the bench's records under its own names
    (:func:`_in_target_names`; ``xframe``: the -am/-cm mappings)."""
    target_layout, bench_parsed = _parse(layout, "--layout"), _parse(bench_layout, "--bench-layout")
    pairs: list = []
    for target_step, bench_step in steps:
        target_shapes = _shapes(target_dump, target_step, target_layout) if bench_parsed is not None else None
        benches = _side(bench_dump, bench_step, bench_parsed, None, target_shapes)
        if not benches:
            continue
        reference = readers.records_of(benches[0])
        bench_shapes = _shapes(bench_dump, bench_step, bench_parsed) if bench_parsed is not None else None
        if bench_parsed is None and target_layout is not None:
            reference = _in_target_names(target_dump, target_step, target_layout, reference, xframe)
        targets = _side(target_dump, target_step, target_layout, reference, bench_shapes)
        if len(benches) == 1:
            pairs.extend((target, benches[0]) for target in targets)
        else:
            pairs.extend(zip(targets, benches))
    if not pairs:
        raise ConfigError("no logical models pair up between the two dumps")
    return pairs


def merged_dump(dump: Any, layout: str, reference: Any = None) -> Any:
    """``dump`` with its sources replaced by its merged logical models, step by step (the explorer's
    model tree of a parallel run); ``reference``: the other side's dump (its first source of the
    same step tells shards from replicas)."""
    parsed = _parse(layout, "--layout")
    sources = []
    for step in sorted({source.step for source in dump.sources}, key=lambda found: (found is None, found or 0)):
        found = [source for source in reference.sources if source.step == step] if reference is not None else []
        sources.extend(_side(dump, step, parsed, readers.records_of(found[0]) if found else None))
    return SimpleNamespace(sources=sources, dialect=getattr(dump, "dialect", None), url=getattr(dump, "url", None))


def layout_mode(mode: str, tasks: Optional[list] = None) -> str:
    """The compare mode of merged sides: statistics or tensor (the shards' tensors concatenated,
    spec/FORMAT.md 26.6); md5 refused with the reason. ``auto``: tensor when every side's dump
    (``tasks``: the tasks of each pair's documents) holds tensors, else statistics."""
    if mode == "md5":
        raise ConfigError("--layout: md5 values are CRCs of each shard's bytes and cannot be merged into the "
                          "whole tensor's; compare merged layouts in statistics or tensor mode")
    if mode == "auto":
        return "tensor" if tasks and all(task == "tensor" for pair in tasks for task in pair) else "statistics"
    return mode


#: the answers of a compare, and the side each one is of
ANSWERS = (("origin", "target"), ("first_divergence", "target"), ("first_nan_inf_target", "target"),
           ("first_nan_target", "target"), ("first_inf_target", "target"), ("first_nan_inf_bench", "bench"),
           ("first_nan_bench", "bench"), ("first_inf_bench", "bench"))


def _row_path(path: str) -> str:
    """A merged leaf path (``input_args.1``) as compare's row names spell it (``input.1``)."""
    for key in ("input_args", "input_kwargs"):
        if path == key or path.startswith(key + "."):
            return "input" + path[len(key):]
    return path


def answer_ranks(report: Optional[dict], answer: dict) -> Optional[dict]:
    """The ranks behind one answer on a merged model: those holding its record, its stages, and the
    suspects: the ranks whose shard or replica alone carries the anomaly at the answer's leaf (a
    NaN's shard, a shard that cannot be a piece of the bench's tensor, the replica that departs),
    else at any leaf of the record."""
    if not report:
        return None
    record = answer.get("record") or str(answer.get("row", "")).split(".input")[0].split(".output")[0]
    entry = report["records"].get(record)
    if not entry:
        return None
    row = answer.get("row") or ""
    suffix = row[len(record) + 1:] if row.startswith(record + ".") else (answer.get("argument") or "")
    leaf = [ranks for path, ranks in entry.get("leaf_suspects", {}).items()
            if suffix and (_row_path(path) == suffix or path == suffix)]
    return {"record": record, "ranks": entry["ranks"], "stages": entry["stages"],
            "suspect_ranks": leaf[0] if leaf else entry["suspects"], "leaves": entry["leaves"]}


def _unordered_note(report: dict, mode: Any) -> list:
    """The warning of a merged model whose tensors of some leaves are not in the other side's order
    (tensor mode under expert x tensor parallelism, spec/FORMAT.md 26.8)."""
    count = report.get("unordered_tensors", 0)
    if mode != "tensor" or not count:
        return []
    return [f"tensor mode: the tokens of the MoE layers are not in the single card's order under expert x tensor "
            f"parallelism where the routing does not order them: {count} tensors' "
            "Cosine, EucDist, MaxAbsErr, MaxRelativeErr and error ratios are N/A (unordered(...) in Data_name), "
            "their statistics compared"]


def layout_summary(pairs: list, summary: dict) -> dict:
    """The layout section of summary.json: per merged model its stages, findings, communication
    records left out and, for each answer (origin, first divergence, first NaN/Inf), the ranks that
    hold the record and the suspects (:func:`answer_ranks`). Each merged answer of ``summary``
    gets its ``ranks`` and ``suspect_ranks`` (its ``rank`` is None: no one rank holds a merged record)."""
    models = []
    for target, bench in pairs:
        for side, source in (("target", target), ("bench", bench)):
            report = getattr(source, "report", None)
            if report is None:
                continue
            models.append({"side": side, "rank_dir": source.rank_dir, "step": source.step, "layout": report["layout"],
                           "stages": report["stages"], "findings": report["findings"],
                           "communication_left_out": report["communication_left_out"],
                           "warnings": report["warnings"] + _unordered_note(report, summary.get("mode")),
                           "unordered_tensors": report.get("unordered_tensors", 0) if summary.get("mode") == "tensor" else 0,
                           "records": len(report["records"])})
    out: dict = {"models": models}
    for key, side in ANSWERS:
        found = summary.get(key)
        if not found:
            continue
        for target, bench in pairs:
            source = target if side == "target" else bench
            if found.get("rank_dir", source.rank_dir) != source.rank_dir or \
                    found.get("step", source.step) != source.step:
                continue  # another step's, or another logical model's (data-parallel replica's) record
            ranks = answer_ranks(getattr(source, "report", None), found)
            if ranks:
                found.update(rank=None, ranks=ranks["ranks"], suspect_ranks=ranks["suspect_ranks"])
                if key in ("origin", "first_divergence"):
                    out[key] = ranks
            break
    return out
