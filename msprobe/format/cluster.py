"""The first NaN/Inf of a step over all its ranks, in the order their communication implies.

:func:`first_anomaly` walks each rank's records in order (a mask's intended ``-inf`` is no
anomaly, :mod:`msprobe.format.nonfinite`; a communication call's receive buffers before the call
are no data, :mod:`msprobe.format.comm`), takes each rank's first record holding a NaN or an Inf,
and answers with the one that comes first in the step's happens-before order: a NaN born on one
pipeline stage and received by the next is named where it was born, not where it arrived. Its
``path`` lists the communication hops that carried it to the other ranks.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator, Optional

from msprobe.format.comm import (
    COMM_PREFIXES,
    buffer_args,
    calls_in,
    describe_path,
    graph_from_calls,
    is_buffer_leaf,
    propagation,
)
from msprobe.format.model import is_tensor_entry
from msprobe.format.nonfinite import NonFiniteTracker
from msprobe.format.settled import settled_positions

__all__ = ["record_tensor_leaves", "first_anomaly", "rank_anomalies"]

_COMM = tuple(prefix + "." for prefix in COMM_PREFIXES)
_IO_KEYS = (("input_args", "input"), ("input_kwargs", "input"), ("input", "input"), ("output", "output"),
            ("parameters", "parameters"))


def _walk(value: Any, path: str, io: str) -> Iterator[tuple]:
    if is_tensor_entry(value):
        yield io, path, value
    elif isinstance(value, dict) and "type" not in value:
        for key, item in value.items():
            yield from _walk(item, f"{path}.{key}", io)
    elif isinstance(value, list):
        for position, item in enumerate(value):
            yield from _walk(item, f"{path}.{position}", io)


def record_tensor_leaves(record: Any) -> Iterator[tuple]:
    """(io, path, tensor entry) of a record's tensors: ``input.0``, ``input.<kwarg>``,
    ``output.0``, ``parameters.<name>`` (compare's row suffixes); other records' leaves by key."""
    if not isinstance(record, dict):
        return
    for key, value in record.items():
        io, prefix = next(((io, io) for k, io in _IO_KEYS if k == key), (key, key))
        if key == "input_kwargs" and isinstance(value, dict):
            for kwarg, item in value.items():
                yield from _walk(item, f"input.{kwarg}", io)
        else:
            yield from _walk(value, prefix, io)


def _stats(entry: dict) -> tuple:
    return (entry.get("Max"), entry.get("Min"), entry.get("Mean"), entry.get("Norm"))


def rank_anomalies(records: Iterable[tuple], rank: int) -> tuple:
    """(first, flags) of one rank's ``(name, record)`` pairs in order: ``first`` =
    ``{record, record_index, kind, argument}`` of its first record holding a NaN or a (non-mask)
    Inf (records walked where their content was settled, :mod:`msprobe.format.settled`; such a
    record's entry has its ``settled_at`` position), or None; ``flags`` = {record index: [NaN/Inf in data, NaN/Inf in result]} of its
    communication calls."""
    tracker = NonFiniteTracker()
    first = None
    flags: dict = {}
    items = list(records)
    # a record whose content postdates its place is walked where it was settled (format.settled)
    moved = settled_positions(name for name, _ in items)
    for index in sorted(range(len(items)), key=lambda at: moved.get(at, at)) if moved else range(len(items)):
        name, record = items[index]
        comm = name.startswith(_COMM)
        if first is not None and not comm:
            continue
        tracker.record(name)
        buffers = buffer_args(name, record, rank) if comm else set()
        bad = [False, False]
        for io, path, entry in record_tensor_leaves(record):
            if buffers and is_buffer_leaf(path, buffers):
                continue
            kind = tracker.see(io, path, _stats(entry), entry.get("dtype"), entry.get("shape"))
            if kind in ("nan", "inf"):
                bad[1 if io == "output" else 0] = True
                if first is None:
                    first = {"record": name, "record_index": index, "kind": kind, "argument": path}
                    if index in moved:
                        first["settled_at"] = moved[index]
        if comm:
            flags[index] = bad
    return first, flags


def first_anomaly(ranks: Iterable[tuple], world: Optional[tuple] = None) -> Optional[dict]:
    """The first NaN/Inf of one step over its ranks: ``{rank, record, record_index, kind,
    argument, order, path, path_text, ranks}`` or None. ``ranks``: ``(rank, data)`` pairs, each
    ``data`` the rank's ``dump.json`` records in order; ``ranks`` in the answer: each rank's own
    first anomaly, in the step's order."""
    calls: dict = {}
    firsts: list = []
    flags: dict = {}
    for rank, data in ranks:
        calls[rank] = calls_in(data, rank)
        first, rank_flags = rank_anomalies(data.items(), rank)
        flags.update({(rank, index): flag for index, flag in rank_flags.items()})
        if first is not None:
            firsts.append(dict(first, rank=rank))
    if not firsts:
        return None
    graph = graph_from_calls(calls, world)
    for entry in firsts:  # the level of where its content was settled (format.settled), its own index
        level = graph.order_key(entry["rank"], entry.get("settled_at", entry["record_index"]))[0]
        entry["order"] = [level, entry["rank"], entry["record_index"]]
    firsts.sort(key=lambda entry: entry["order"])
    chosen = dict(firsts[0])

    def carries(rank: int, index: int, what: str) -> bool:
        flag = flags.get((rank, index))
        return bool(flag and flag[0 if what == "data" else 1])

    hops = propagation(graph, chosen["rank"], chosen["record_index"], carries)
    chosen["path"] = [{"from_rank": e.src_rank, "from_record": e.src_record, "to_rank": e.dst_rank,
                       "to_record": e.dst_record, "via": e.kind} for e in hops]
    chosen["path_text"] = describe_path((chosen["rank"], chosen["record"]), hops)
    chosen["ranks"] = firsts
    return chosen
