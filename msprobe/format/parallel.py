"""Parallel layouts: which rank holds which part of one logical model (spec/FORMAT.md section 26).

A layout ``tp=2,pp=2[,dp=..][,vpp=..][,order=tp-cp-ep-dp-pp]`` numbers the ranks as Megatron does:
the first dimension of ``order`` varies fastest (``tp-cp-ep-dp-pp``: rank = ((pp * DP + dp) * EP
+ ep) * CP * TP + cp * TP + tp). The ranks of one data-parallel replica form one logical model:
its pipeline stages in model order, each stage's tensor-parallel ranks holding the shards of its
column/row-parallel layers.

This module is the pure part: parsing, the rank -> coordinates map, the exact merge of the
statistics of tensor-parallel shards, and the renaming of a pipeline stage's records into the
logical model's names. :mod:`msprobe.readers._merged` builds the merged model of a dump.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from msprobe.format.stats import STAT_KEYS, STATISTICS

__all__ = ["Layout", "LayoutError", "parse_layout", "merge_shard_stats", "stage_renames", "DIMENSIONS"]

#: the parallel dimensions, in Megatron's default order (fastest first)
DIMENSIONS = ("tp", "cp", "ep", "dp", "pp")


class LayoutError(ValueError):
    """A layout text that cannot be read, or that does not fit the dump's ranks."""


@dataclass(frozen=True)
class Layout:
    """Sizes of the parallel dimensions and their order (the first varies fastest)."""

    tp: int = 1
    pp: int = 1
    dp: Optional[int] = None  # None: the ranks left over (world // (tp * cp * ep * pp))
    cp: int = 1
    ep: int = 1
    vpp: int = 1
    order: tuple = DIMENSIONS

    def sizes(self, world: int) -> dict:
        """Every dimension's size for ``world`` ranks (dp completed); LayoutError when they do not fit."""
        fixed = self.tp * self.cp * self.ep * self.pp
        dp = self.dp if self.dp is not None else max(world // fixed, 1)
        if fixed * dp != world:
            raise LayoutError(f"layout {self.text()} needs {fixed * dp} ranks, the dump has {world}")
        return {"tp": self.tp, "cp": self.cp, "ep": self.ep, "dp": dp, "pp": self.pp}

    def coordinates(self, rank: int, world: int) -> dict:
        """{dimension: index} of global ``rank``."""
        sizes, out, rest = self.sizes(world), {}, rank
        for dim in self.order:
            out[dim] = rest % sizes[dim]
            rest //= sizes[dim]
        return out

    def models(self, ranks: list) -> list:
        """The logical models of the ranks: one per (dp, cp, ep) index, each a list of pipeline
        stages in model order, each stage the ranks of its tensor-parallel group in tp order."""
        world = len(ranks)
        models: dict = {}
        for rank in sorted(ranks):
            c = self.coordinates(rank, world)
            stages = models.setdefault((c["dp"], c["cp"], c["ep"]), [[] for _ in range(self.pp)])
            stages[c["pp"]].append((c["tp"], rank))
        return [(key, [[rank for _, rank in sorted(stage)] for stage in stages]) for key, stages in sorted(models.items())]

    def text(self) -> str:
        parts = [f"tp={self.tp}", f"pp={self.pp}"]
        parts += [f"{dim}={getattr(self, dim)}" for dim in ("dp", "cp", "ep", "vpp")
                  if getattr(self, dim) not in (None, 1)]
        if self.order != DIMENSIONS:
            parts.append("order=" + "-".join(self.order))
        return ",".join(parts)


def parse_layout(text: str) -> Layout:
    """``tp=2,pp=2[,dp=N][,cp=N][,ep=N][,vpp=N][,order=tp-cp-ep-dp-pp]`` -> :class:`Layout`."""
    values: dict = {}
    for part in (p.strip() for p in str(text).split(",") if p.strip()):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep:
            raise LayoutError(f"layout {text!r}: {part!r} is not key=value")
        if key == "order":
            order = tuple(value.strip().lower().split("-"))
            if sorted(order) != sorted(DIMENSIONS):
                raise LayoutError(f"layout {text!r}: order must name each of {'-'.join(DIMENSIONS)} once")
            values["order"] = order
        elif key in ("tp", "pp", "dp", "cp", "ep", "vpp"):
            if not value.strip().isdigit() or int(value) < 1:
                raise LayoutError(f"layout {text!r}: {key} must be a positive integer")
            values[key] = int(value)
        else:
            raise LayoutError(f"layout {text!r}: unknown key {key!r} (tp, pp, dp, cp, ep, vpp, order)")
    return Layout(**values)


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


#: the dtypes whose statistics are rounded back to them after the merge (the merge sums in float64;
#: the dumper writes a float32 tensor's statistics as float32 values)
_ROUND = {"torch.float32": np.float32, "Float32": np.float32, "float32": np.float32,
          "torch.float16": np.float16, "Float16": np.float16, "float16": np.float16}


def merge_shard_stats(leaves: list, dim: int) -> dict:
    """The statistics of the concatenation of tensor shards along ``dim`` (exact): Max the shards'
    max, Min their min, Mean the numel-weighted mean, Norm the root of the sum of squared norms
    (rounded to the tensors' float dtype, as the dumper writes them); shape the shards' with
    ``dim`` summed; a NaN statistic in any shard makes every merged statistic NaN, a +/-Inf Max or
    Min is the merged one. md5 (a CRC of each shard's bytes) cannot be merged: left out."""
    first = leaves[0]
    merged = {key: value for key, value in first.items() if key not in STAT_KEYS and key != "md5"}
    shapes = [list(leaf.get("shape") or []) for leaf in leaves]
    shape = list(shapes[0])
    if shape and -len(shape) <= dim < len(shape):
        shape[dim] = sum(s[dim] if len(s) == len(shape) else 0 for s in shapes)
    merged["shape"] = shape
    numels = [math.prod(s) for s in shapes]
    cast = _ROUND.get(str(first.get("dtype")))
    # a NaN anywhere in a shard is a NaN in the whole tensor: every statistic of the whole is NaN
    poisoned = any(isinstance(v, float) and math.isnan(v) for leaf in leaves for v in (leaf.get(k) for k in STAT_KEYS))
    for statistic in STATISTICS:  # each by its own rule (format.stats)
        stat = statistic.key
        found = [_number(leaf.get(stat)) for leaf in leaves]
        if any(v is None for v in found) or stat not in first:
            merged[stat] = first.get(stat) if len(leaves) == 1 else None
            continue
        value = math.nan if poisoned else statistic.merge(found, numels)
        merged[stat] = float(cast(value)) if cast is not None and math.isfinite(value) else value
    return merged


_API = re.compile(r"^(?P<head>[^.]+\.[^.]+(?:\.[^.]+)*?)\.(?P<n>\d+)\.(?P<dir>forward|backward)$")
_MODULE = re.compile(r"^Module\.(?P<path>.+)\.(?P<cls>[^.]+)\.(?P<dir>forward|backward)\.(?P<n>\d+)$")


_ENDS = ("forward", "backward", "parameters_grad")
#: the prefixes of module records: PyTorch's modules, MindSpore's Cells
_MODULES = ("Module.", "Cell.")


def _list_index(name: str) -> Optional[tuple]:
    """(prefix path, index, position) of the first integer segment (the outermost ModuleList index)
    of a module record's path, e.g. ``("layers", 0, 1)`` for ``Module.layers.0.fc1.Linear.forward.0``
    and ``Module.layers.0.fc1.Linear.parameters_grad`` (a MindSpore Cell's, ``Cell.layers.0...``, alike);
    the call count after the direction is none."""
    if not name.startswith(_MODULES):
        return None
    segments = name.split(".")[1:]
    for i, seg in enumerate(segments):
        if seg in _ENDS:
            return None
        if seg.isdigit() and i > 0:
            return ".".join(segments[:i]), int(seg), i
    return None


def stage_renames(stages: list, order: Optional[list] = None) -> list:
    """For the record names of each pipeline stage (in model order), {stage name: logical name}.

    A module's list index (``layers.0`` of stage 1) is offset by the indices of the same list on
    the earlier stages. An API record's call count is renumbered in ``order`` ([(stage, name)]: the
    step's happens-before order over the stages, see :mod:`msprobe.readers._merged`; default:
    stage after stage): the logical ``Functional.linear.N`` is the N-th call of that API in that
    order, as one card running the same step numbers it; a backward record takes its forward
    call's number. A name that none of this changes stays as it is (a module present on several
    stages spans them). An ``order`` item ``(stage, name, rank)`` is a record that only ``rank``
    of the stage holds (not in ``stages``): it is numbered in its place and renamed under the key
    ``(rank, name)``."""
    if order is None:
        order = [(stage, name) for stage, names in enumerate(stages) for name in names]
    offsets: list = []
    offset: dict = {}
    for names in stages:
        offsets.append(dict(offset))
        seen: dict = {}
        for name in names:
            found = _list_index(name)
            if found:
                seen.setdefault(found[0], set()).add(found[1])
        for prefix, indexes in seen.items():
            offset[prefix] = offset.get(prefix, 0) + len(indexes)
    renames: list = [{name: _module_renamed(name, offsets[stage]) for name in names}
                     for stage, names in enumerate(stages)]
    counts: dict = {}
    numbers: dict = {}  # (stage, API head, stage-local count, rank of a lone record) -> logical count
    for stage, name, *alone in order:
        holder = alone[0] if alone else None
        key_of = name if holder is None else (holder, name)
        if holder is not None:
            renames[stage][key_of] = _module_renamed(name, offsets[stage])
        api = _API.match(name)
        if not api or name.startswith(_MODULES) or key_of not in renames[stage]:
            continue
        head = api.group("head")
        key = (stage, head, int(api.group("n")), holder)
        if key not in numbers:
            numbers[key] = counts.get(head, 0)
            counts[head] = numbers[key] + 1
        renames[stage][key_of] = f"{head}.{numbers[key]}.{api.group('dir')}"
    return renames


def _module_renamed(name: str, offset: dict) -> str:
    """A module record's name with its outermost list index offset by the earlier stages'."""
    found = _list_index(name)
    if not found:
        return name
    prefix, index, position = found
    parts = name.split(".")
    parts[1 + position] = str(index + offset.get(prefix, 0))
    return ".".join(parts)
