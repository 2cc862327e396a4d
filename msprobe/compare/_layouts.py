"""Compare under parallel layouts (``--layout``, ``--bench-layout``): each side's ranks merged into
its logical models (:mod:`msprobe.readers._merged`, spec/FORMAT.md section 26), then paired.

A side without a layout is taken as it is (a single-card run: its one rank directory). The target
is merged with the bench as its reference (the bench's shapes tell a shard from a replica, its
statistics which replica or shard departs). Merged sides are compared in statistics mode: md5
values of shards cannot be merged, and tensors are not concatenated here."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Optional

from msprobe.errors import ConfigError
from msprobe.format.parallel import LayoutError, parse_layout
from msprobe.readers import merge_dump_step, records_of

__all__ = ["layout_pairs", "layout_mode", "layout_summary", "merged_dump"]


def _parse(text: Optional[str], flag: str) -> Any:
    if not text or text == "auto":
        return text or None
    try:
        return parse_layout(text)
    except LayoutError as exc:
        raise ConfigError(f"{flag}: {exc}") from exc


def _side(dump: Any, step: Any, layout: Any, reference: Optional[dict]) -> list:
    sources = [source for source in dump.sources if source.step == step]
    if layout is None:
        return sources
    return merge_dump_step(sources, None if layout == "auto" else layout, reference)


def layout_pairs(target_dump: Any, bench_dump: Any, steps: list, layout: Optional[str],
                 bench_layout: Optional[str]) -> list:
    """[(target source, bench source)] of the merged logical models, step by step: a lone bench
    model pairs with every target model, else model i with model i."""
    target_layout, bench_parsed = _parse(layout, "--layout"), _parse(bench_layout, "--bench-layout")
    pairs: list = []
    for target_step, bench_step in steps:
        benches = _side(bench_dump, bench_step, bench_parsed, None)
        if not benches:
            continue
        reference = records_of(benches[0])
        targets = _side(target_dump, target_step, target_layout, reference)
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
        sources.extend(_side(dump, step, parsed, records_of(found[0]) if found else None))
    return SimpleNamespace(sources=sources, dialect=getattr(dump, "dialect", None), url=getattr(dump, "url", None))


def layout_mode(mode: str) -> str:
    """The compare mode of merged sides: statistics (md5 and tensor refused with the reason)."""
    if mode == "md5":
        raise ConfigError("--layout: md5 values are CRCs of each shard's bytes and cannot be merged into the "
                          "whole tensor's; compare merged layouts in statistics mode")
    if mode == "tensor":
        raise ConfigError("--layout: tensor mode is not merged yet (the shards' tensors are not concatenated); "
                          "compare merged layouts in statistics mode")
    return "statistics"


def layout_summary(pairs: list, summary: dict) -> dict:
    """The layout section of summary.json: per merged model its stages, findings, communication
    records left out and, for the origin and first divergence, the ranks that hold the record and
    those whose shard cannot be a piece of the bench's tensor."""
    models = []
    for target, bench in pairs:
        for side, source in (("target", target), ("bench", bench)):
            report = getattr(source, "report", None)
            if report is None:
                continue
            models.append({"side": side, "rank_dir": source.rank_dir, "layout": report["layout"],
                           "stages": report["stages"], "findings": report["findings"],
                           "communication_left_out": report["communication_left_out"],
                           "warnings": report["warnings"],
                           "records": len(report["records"])})
    out: dict = {"models": models}
    for key in ("origin", "first_divergence"):
        found = summary.get(key)
        if not found:
            continue
        for target, _ in pairs:
            if found.get("rank_dir") not in (None, target.rank_dir):
                continue  # another logical model's (data-parallel replica's) record
            report = getattr(target, "report", None)
            entry = report["records"].get(found.get("record") or found.get("row", "").split(".input")[0]
                                          .split(".output")[0]) if report else None
            if entry:
                out[key] = {"record": found.get("record"), "ranks": entry["ranks"], "stages": entry["stages"],
                            "suspect_ranks": entry["suspects"], "leaves": entry["leaves"]}
                break
    return out
