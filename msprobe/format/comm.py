"""Communication between ranks, read from the dumps alone: what each communication API's
arguments are, which calls of a step match across ranks, and a happens-before order over every
record of the step on every rank (spec/FORMAT.md section 25).

A ``Distributed.*`` record (``MintDistributed.*`` and ``Communication.*`` in MindSpore) is one call of a
communication API. Its arguments play one of three parts (:data:`COMM_APIS`):

* **data**: what the call sends or contributes (``send``'s tensor, ``all_reduce``'s tensor before
  the call, ``all_gather``'s input, ``broadcast``'s tensor on its root);
* **buffer**: where the call writes what it receives (``recv``'s tensor, ``all_gather``'s output
  list, ``all_to_all_single``'s output, ``broadcast``'s tensor on the other ranks). Its content
  *before* the call is whatever the memory held (``torch.empty``): never data, never an origin,
  never a divergence;
* **result**: the arguments after the call (the record's ``output``, one entry per argument), the
  buffers' and in-place data's new content.

Calls are matched per step: a point-to-point send on rank ``a`` to ``b`` with the ``k``-th receive
on ``b`` from ``a`` (per channel, in order); a collective with the calls of the same API and
group on every member, the ``k``-th with the ``k``-th. Each communication record gets a
**level**: one more than the level of the rank's previous communication record and of every
call it receives from (a receive: its send; a collective: the previous communication of every
member, which all get the one level: they happen at once). A record's order key
``(level of the last communication record at or before it, rank, index)`` sorts the records of
a step in an order where everything that can have caused a record comes before it
(:class:`StepGraph`). Incomplete dumps (a peer rank missing, a call without its peer) still get
an order: an unmatched call waits for nothing.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Optional

__all__ = ["CommApi", "COMM_APIS", "COMM_PREFIXES", "PREFIX_APIS", "CommCall", "comm_api", "comm_call", "buffer_args", "null_args",
           "is_buffer_leaf",
           "calls_in", "call_rows", "calls_from_rows", "graph_from_calls", "propagation", "describe_path", "CALL_FIELDS",
           "StepGraph", "Edge", "build_step_graph"]


@dataclass(frozen=True)
class CommApi:
    """What the arguments of one communication API are (positions in the Python signature).

    ``kind``: ``"send"``, ``"recv"`` (point to point), ``"all"`` (every member's result depends
    on every member's data: all_reduce, all_gather, reduce_scatter, all_to_all), ``"from_root"``
    (broadcast, scatter: the root's data reaches every member), ``"to_root"`` (reduce, gather:
    every member's data reaches the root), ``"sync"`` (barrier: no data) or ``"batch"``
    (batch_isend_irecv: a list of point-to-point operations).
    ``data``/``buffers``: the argument names holding data / receive buffers; ``root_data`` and
    ``root_buffers`` hold them only on the root (``"from_root"`` / ``"to_root"``);
    ``peer``: the argument naming the peer or root (a global rank), ``group_peer`` the same as a
    rank of ``group``."""

    kind: str
    params: tuple
    data: tuple = ()
    buffers: tuple = ()
    root_data: tuple = ()
    root_buffers: tuple = ()
    peer: Optional[str] = None
    group_peer: Optional[str] = None
    asynchronous: bool = False
    #: buffers whose pre-call content the dump records all the same (26.2.0 writes broadcast's
    #: tensor on every rank); every other buffer is written ``null`` (spec/FORMAT.md 22.1)
    recorded_buffers: tuple = ()

    def position(self, param: str) -> int:
        return self.params.index(param)


_P2P = ("tensor", "{peer}", "group", "tag", "group_{peer}")


def _p2p(kind: str, peer: str, asynchronous: bool = False) -> CommApi:
    params = tuple(p.format(peer=peer) for p in _P2P)
    if kind == "send":
        return CommApi(kind, params, data=("tensor",), peer=peer, group_peer=f"group_{peer}", asynchronous=asynchronous)
    return CommApi(kind, params, buffers=("tensor",), peer=peer, group_peer=f"group_{peer}", asynchronous=asynchronous)


_ALL_IN_OUT = ("output", "input")

#: the communication APIs, by API name (torch.distributed's signatures; MindSpore's mint.distributed,
#: ops.communication and communication.comm_func use the same names and orders)
COMM_APIS: dict = {
    "send": _p2p("send", "dst"),
    "isend": _p2p("send", "dst", True),
    "recv": _p2p("recv", "src"),
    "irecv": _p2p("recv", "src", True),
    "broadcast": CommApi("from_root", ("tensor", "src", "group", "async_op", "group_src"),
                         root_data=("tensor",), buffers=("tensor",), peer="src", group_peer="group_src",
                         recorded_buffers=("tensor",)),
    "all_reduce": CommApi("all", ("tensor", "op", "group", "async_op"), data=("tensor",)),
    "reduce": CommApi("to_root", ("tensor", "dst", "op", "group", "async_op", "group_dst"),
                      data=("tensor",), peer="dst", group_peer="group_dst"),
    "all_gather": CommApi("all", ("tensor_list", "tensor", "group", "async_op"),
                          data=("tensor",), buffers=("tensor_list",)),
    "all_gather_into_tensor": CommApi("all", ("output_tensor", "input_tensor", "group", "async_op"),
                                      data=("input_tensor",), buffers=("output_tensor",)),
    "_all_gather_base": CommApi("all", ("output_tensor", "input_tensor", "group", "async_op"),
                                data=("input_tensor",), buffers=("output_tensor",)),
    # torch 2.13's names for the two above (its deprecation notices point to them): an extra of ours
    "all_gather_single": CommApi("all", ("output_tensor", "input_tensor", "group", "async_op"),
                                 data=("input_tensor",), buffers=("output_tensor",)),
    "gather": CommApi("to_root", ("tensor", "gather_list", "dst", "group", "async_op", "group_dst"),
                      data=("tensor",), root_buffers=("gather_list",), peer="dst", group_peer="group_dst"),
    "scatter": CommApi("from_root", ("tensor", "scatter_list", "src", "group", "async_op", "group_src"),
                       buffers=("tensor",), root_data=("scatter_list",), peer="src", group_peer="group_src"),
    "reduce_scatter": CommApi("all", ("output", "input_list", "op", "group", "async_op"),
                              data=("input_list",), buffers=("output",)),
    "reduce_scatter_tensor": CommApi("all", ("output", "input", "op", "group", "async_op"),
                                     data=("input",), buffers=("output",)),
    "_reduce_scatter_base": CommApi("all", ("output", "input", "op", "group", "async_op"),
                                    data=("input",), buffers=("output",)),
    "reduce_scatter_single": CommApi("all", ("output", "input", "op", "group", "async_op"),
                                     data=("input",), buffers=("output",)),
    "all_to_all": CommApi("all", ("output_tensor_list", "input_tensor_list", "group", "async_op"),
                          data=("input_tensor_list",), buffers=("output_tensor_list",)),
    "all_to_all_single": CommApi("all", ("output", "input", "output_split_sizes", "input_split_sizes", "group",
                                         "async_op"), data=("input",), buffers=("output",)),
    "barrier": CommApi("sync", ("group", "async_op", "device_ids")),
    "batch_isend_irecv": CommApi("batch", ("p2p_op_list",)),
}

#: record-name prefixes of communication APIs
COMM_PREFIXES = ("Distributed", "MintDistributed", "Communication")

#: APIs of one prefix only, by prefix: MindSpore's ``mindspore.ops.communication`` (``Communication``) also
#: has these, whose namesakes in ``communication.comm_func`` take other arguments
PREFIX_APIS: dict = {
    "Communication": {
        "gather_into_tensor": CommApi("to_root", ("output_tensor", "input_tensor", "dst", "group", "async_op"),
                                      data=("input_tensor",), root_buffers=("output_tensor",), peer="dst"),
        "scatter_tensor": CommApi("from_root", ("output_tensor", "input_tensor", "src", "group", "async_op"),
                                  buffers=("output_tensor",), root_data=("input_tensor",), peer="src"),
        "all_to_all_v_c": CommApi("all", ("output", "input", "send_count_matrix", "group", "async_op"),
                                  data=("input",), buffers=("output",)),
    },
}


def comm_api(record_name: str) -> Optional[tuple]:
    """``(api name, CommApi)`` of a communication record's name, else None."""
    parts = record_name.split(".")
    if len(parts) < 3 or parts[0] not in COMM_PREFIXES:
        return None
    spec = PREFIX_APIS.get(parts[0], {}).get(parts[1]) or COMM_APIS.get(parts[1])
    return (parts[1], spec) if spec is not None else None


def _plain(entry: Any) -> Any:
    """The Python value of a non-tensor JSON entry (``{"type": "int", "value": 1}`` -> 1)."""
    if isinstance(entry, dict):
        if "group_ranks" in entry:
            ranks = entry.get("group_ranks")
            return tuple(ranks) if isinstance(ranks, list) else None
        return entry.get("value")
    return entry


def _argument(record: dict, spec: CommApi, param: str) -> tuple:
    """(present, entry) of argument ``param`` in the record's inputs (positional or keyword)."""
    args = record.get("input_args")
    kwargs = record.get("input_kwargs")
    if isinstance(kwargs, dict) and param in kwargs:
        return True, kwargs[param]
    if param in spec.params and isinstance(args, list):
        i = spec.position(param)
        if i < len(args):
            return True, args[i]
    return False, None


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass
class CommCall:
    """One communication record of one rank (see :func:`comm_call`)."""

    rank: int
    index: int          # the record's position among the rank's records of the step
    name: str
    api: str
    kind: str
    group: Optional[tuple]  # the members' global ranks, None: the default (world) group
    peer: Optional[int] = None  # global rank of the peer (p2p) or root (rooted collectives)
    tag: int = 0
    is_root: bool = False
    level: int = 0
    key: tuple = field(default=())  # matching key (without the sequence number)
    seq: int = 0


def _group_rank(group: Optional[tuple], local: Optional[int]) -> Optional[int]:
    if local is None or group is None:
        return local
    return group[local] if 0 <= local < len(group) else None


def comm_call(name: str, record: Any, rank: int, index: int) -> Optional[CommCall]:
    """The :class:`CommCall` of record ``name`` of ``rank`` (None for other records)."""
    found = comm_api(name)
    if found is None or not isinstance(record, dict) or not name.endswith(".forward"):
        return None
    api, spec = found
    _, group_entry = _argument(record, spec, "group")
    group = _plain(group_entry)
    group = group if isinstance(group, tuple) else None
    call = CommCall(rank, index, name, api, spec.kind, group)
    if spec.peer is not None:
        _, peer = _argument(record, spec, spec.peer)
        call.peer = _int(_plain(peer))
        if call.peer is None and spec.group_peer is not None:
            _, local = _argument(record, spec, spec.group_peer)
            call.peer = _group_rank(group, _int(_plain(local)))
        call.is_root = call.peer == rank
    if "tag" in spec.params:
        _, tag = _argument(record, spec, "tag")
        call.tag = _int(_plain(tag)) or 0
    return call


def buffer_args(name: str, record: Any, rank: int) -> set:
    """The arguments of a communication record whose content before the call is no data: a set
    of positional indexes and keyword names (empty for other records). ``rank``: the record's rank
    (a broadcast's tensor is data on its root, a buffer elsewhere)."""
    found = comm_api(name)
    if found is None or not isinstance(record, dict):
        return set()
    _, spec = found
    params = set(spec.buffers)
    if spec.root_data or spec.root_buffers:
        call = comm_call(name, record, rank, 0)
        root = call is not None and call.is_root
        if root:
            params -= set(spec.root_data)
            params |= set(spec.root_buffers)
    out: set = set()
    kwargs = record.get("input_kwargs")
    for param in params:
        if isinstance(kwargs, dict) and param in kwargs:
            out.add(param)
        elif param in spec.params:
            out.add(spec.position(param))
    return out


def null_args(name: str, record: Any, rank: int) -> set:
    """The arguments a producer writes ``null`` in a communication record's inputs: its buffers
    (:func:`buffer_args`) but those 26.2.0 records all the same (``recorded_buffers``)."""
    found = comm_api(name)
    out = buffer_args(name, record, rank)
    if found is None or not out or not found[1].recorded_buffers:
        return out
    spec = found[1]
    keep = set(spec.recorded_buffers) | {spec.position(p) for p in spec.recorded_buffers}
    return out - keep


def is_buffer_leaf(suffix: str, buffers: "set | frozenset") -> bool:
    """Whether a leaf path (``input.0``, ``input.0.1``, ``input.tensor_list``, ``kwargs.tensor`` as
    compare and the index name them) lies in one of ``buffers`` (:func:`buffer_args`)."""
    if not buffers:
        return False
    parts = suffix.split(".")
    if len(parts) < 2 or parts[0] not in ("input", "kwargs"):
        return False
    head = parts[1]
    key: Any = int(head) if head.isdigit() else head
    return key in buffers


# -- the step's graph ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Edge:
    """One matched communication: data of ``src`` (rank, record index, record name) reaches ``dst``."""

    src_rank: int
    src_index: int
    src_record: str
    dst_rank: int
    dst_index: int
    dst_record: str
    kind: str  # "p2p" or the collective's API name


class StepGraph:
    """The matched communication of one step over its ranks and the order it implies.

    ``calls``: {rank: [CommCall] in record order}. After :func:`build_step_graph`, each call has
    its ``level``; :meth:`order_key` gives any record's key; :meth:`edges` the matched pairs."""

    def __init__(self, calls: dict, world: Optional[tuple] = None) -> None:
        self.calls = {rank: list(items) for rank, items in calls.items()}
        self.world = tuple(sorted(self.calls)) if world is None else tuple(world)
        self._indexes = {rank: [c.index for c in items] for rank, items in self.calls.items()}
        self.matches: dict = {}   # (rank, index) -> [(rank, index)] of the calls it is matched with
        self.unmatched: list = []  # calls whose peers are not in the dump

    def order_key(self, rank: int, index: Optional[int]) -> tuple:
        """(level, rank, index) of record ``index`` of ``rank``: the level of the last communication
        record at or before it (0 before any)."""
        if index is None:
            return (float("inf"), rank, 0)
        indexes = self._indexes.get(rank)
        level = 0
        if indexes:
            k = bisect.bisect_right(indexes, index) - 1
            if k >= 0:
                level = self.calls[rank][k].level
        return (level, rank, index)

    def call_at(self, rank: int, index: int) -> Optional[CommCall]:
        indexes = self._indexes.get(rank) or []
        k = bisect.bisect_left(indexes, index)
        return self.calls[rank][k] if k < len(indexes) and indexes[k] == index else None

    def sources(self, rank: int, index: int) -> list:
        """[CommCall] whose data reaches this call (a receive's send; a collective's members that
        contribute to this member's result)."""
        call = self.call_at(rank, index)
        if call is None:
            return []
        found = (self.call_at(r, i) for r, i in self.matches.get((rank, index), []))
        peers = [p for p in found if p is not None]
        if call.kind == "recv":
            return peers
        if call.kind == "all":
            return peers
        if call.kind == "from_root":
            return [p for p in peers if p.is_root] if not call.is_root else []
        if call.kind == "to_root":
            return peers if call.is_root else []
        return []

    def edges(self) -> Iterator[Edge]:
        """Every matched data flow: send -> recv, and each member -> each member it reaches."""
        for rank, items in self.calls.items():
            for call in items:
                for src in self.sources(rank, call.index):
                    kind = "p2p" if call.kind == "recv" else call.api
                    yield Edge(src.rank, src.index, src.name, rank, call.index, call.name, kind)


def _members(call: CommCall, world: tuple) -> tuple:
    return call.group if call.group is not None else world


def _match(graph: StepGraph) -> dict:
    """Match the calls; return {(rank, index): [members' (rank, index)]} for collectives (every
    member's call, itself excluded) and p2p pairs (each side the other)."""
    world = graph.world
    sends: dict = {}
    recvs: dict = {}
    colls: dict = {}
    for rank, items in graph.calls.items():
        counters: dict = {}
        for call in items:
            if call.kind in ("send", "recv"):
                if call.peer is None:
                    continue
                src, dst = (rank, call.peer) if call.kind == "send" else (call.peer, rank)
                call.key = ("p2p", src, dst, call.tag)
                table = sends if call.kind == "send" else recvs
                bucket = table.setdefault(call.key, [])
                call.seq = len(bucket)
                bucket.append(call)
            elif call.kind in ("all", "from_root", "to_root", "sync"):
                call.key = ("coll", call.api, _members(call, world))
                call.seq = counters.get(call.key, 0)
                counters[call.key] = call.seq + 1
                colls.setdefault((call.key, call.seq), []).append(call)
    matches: dict = {}
    for key, items in sends.items():
        for send, recv in zip(items, recvs.get(key, [])):
            matches.setdefault((send.rank, send.index), []).append((recv.rank, recv.index))
            matches.setdefault((recv.rank, recv.index), []).append((send.rank, send.index))
    for items in colls.values():
        spots = [(c.rank, c.index) for c in items]
        for c in items:
            matches[(c.rank, c.index)] = [s for s in spots if s != (c.rank, c.index)]
    graph.unmatched = [c for items in graph.calls.values() for c in items if _incomplete(c, matches, world)]
    return matches


def _incomplete(call: CommCall, matches: dict, world: tuple) -> bool:
    """Whether a call lacks a peer in the dump (a p2p call without its pair, a collective with fewer
    members than its group)."""
    got = matches.get((call.rank, call.index), [])
    if call.kind in ("send", "recv"):
        return not got
    if call.kind in ("all", "from_root", "to_root", "sync"):
        return len(got) + 1 < len(_members(call, world))
    return False


def _levels(graph: StepGraph) -> None:
    """Give every call its level by running the ranks forward: a receive waits for its send, a
    collective for all its members present in the dump; a stall (a peer that never comes) is
    broken by letting the earliest waiting call go without it."""
    pos = {rank: 0 for rank in graph.calls}
    last = {rank: 0 for rank in graph.calls}
    done: set = set()
    waiting = sum(len(items) for items in graph.calls.values())

    def ready(call: CommCall) -> Optional[list]:
        peers = graph.matches.get((call.rank, call.index), [])
        if call.kind == "recv":
            return [] if all(p in done for p in peers) else None
        if call.kind in ("all", "from_root", "to_root", "sync"):
            present = [p for p in peers if p[0] in pos]
            heads = all(graph.calls[r][pos[r]].index == i if pos[r] < len(graph.calls[r]) else False
                        for r, i in present)
            return present if heads else None
        return []

    while waiting:
        moved = False
        for rank in graph.calls:
            items = graph.calls[rank]
            while pos[rank] < len(items):
                call = items[pos[rank]]
                group = ready(call)
                if group is None:
                    break
                _advance(graph, call, group, pos, last, done)
                waiting -= 1 + len(group)
                moved = True
        if not moved and waiting:
            stalled = min((graph.calls[r][pos[r]] for r in graph.calls if pos[r] < len(graph.calls[r])),
                          key=lambda c: (last[c.rank], c.rank))
            _advance(graph, stalled, [], pos, last, done)
            waiting -= 1


def _advance(graph: StepGraph, call: CommCall, group: list, pos: dict, last: dict, done: set) -> None:
    members = [call] + [graph.calls[r][pos[r]] for r, _ in group]
    level = max(last[m.rank] for m in members) + 1
    if call.kind == "recv":
        for r, i in graph.matches.get((call.rank, call.index), []):
            src = graph.call_at(r, i)
            if src is not None:
                level = max(level, src.level + 1)
    for m in members:
        m.level = level
        last[m.rank] = level
        pos[m.rank] += 1
        done.add((m.rank, m.index))


def build_step_graph(ranks: Iterable[tuple], world: Optional[tuple] = None) -> StepGraph:
    """The :class:`StepGraph` of one step from ``(rank, [(record name, record)...])`` pairs, each
    rank's records in dump order (only the communication records are kept). ``world``: the
    ranks of the default group (default: the ranks given)."""
    calls: dict = {}
    for rank, records in ranks:
        items = []
        for index, (name, record) in enumerate(records):
            call = comm_call(name, record, rank, index)
            if call is not None:
                items.append(call)
        calls[rank] = items
    return graph_from_calls(calls, world)


def graph_from_calls(calls: dict, world: Optional[tuple] = None) -> StepGraph:
    """The :class:`StepGraph` of {rank: [CommCall in record order]}, matched and levelled."""
    graph = StepGraph(calls, world)
    graph.matches = _match(graph)
    _levels(graph)
    return graph


# -- rows: what a rank contributes to its step's graph --------------------------------------------

#: the fields of :func:`call_rows`' rows, in order
CALL_FIELDS = ("index", "name", "group", "peer", "tag", "is_root")


def calls_in(data: dict, rank: int) -> list:
    """[CommCall] of one rank's ``dump.json`` ``data`` (records in document order)."""
    out = []
    prefixes = tuple(prefix + "." for prefix in COMM_PREFIXES)
    for index, name in enumerate(data):
        if name.startswith(prefixes):
            call = comm_call(name, data[name], rank, index)
            if call is not None:
                out.append(call)
    return out


def call_rows(calls: Iterable[CommCall]) -> list:
    """JSON-ready rows (:data:`CALL_FIELDS`) of some calls; :func:`calls_from_rows` reads them back."""
    return [[c.index, c.name, list(c.group) if c.group is not None else None, c.peer, c.tag, c.is_root] for c in calls]


def calls_from_rows(rank: int, rows: Iterable[list]) -> list:
    out = []
    for index, name, group, peer, tag, is_root in rows:
        found = comm_api(name)
        if found is None:
            continue
        api, spec = found
        out.append(CommCall(rank, index, name, api, spec.kind, tuple(group) if group is not None else None,
                            peer, tag, bool(is_root)))
    return out


def propagation(graph: StepGraph, rank: int, index: int, carries: Any) -> list:
    """The communication hops an anomaly born at record ``index`` of ``rank`` travels, earliest
    first: [Edge] along the matched calls whose data carries it (``carries(rank, index)``: whether
    that communication record's data, or result for a receiving side, holds the anomaly)."""
    reached = {rank: index}
    hops: list = []
    seen: set = set()
    for edge in sorted(graph.edges(), key=lambda e: (graph.order_key(e.dst_rank, e.dst_index), e.src_rank)):
        start = reached.get(edge.src_rank)
        if start is None or edge.src_index < start or (edge.dst_rank, edge.dst_index) in seen:
            continue
        if edge.src_rank == edge.dst_rank or not carries(edge.src_rank, edge.src_index, "data"):
            continue
        if not carries(edge.dst_rank, edge.dst_index, "result"):
            continue
        seen.add((edge.dst_rank, edge.dst_index))
        hops.append(edge)
        if edge.dst_rank not in reached or reached[edge.dst_rank] > edge.dst_index:
            reached[edge.dst_rank] = edge.dst_index
    return hops


def describe_path(origin: tuple, hops: list) -> str:
    """``rank 0 Tensor.masked_fill.0.forward -> Distributed.send.0.forward -> rank 1
    Distributed.recv.0.forward``: the origin (rank, record name) and the hops."""
    rank, record = origin
    parts = [f"rank {rank} {record}"]
    last = (rank, record)
    for edge in hops:  # a hop that leaves from where the previous one arrived names that place once
        if (edge.src_rank, edge.src_record) != last:
            parts.append(f"rank {edge.src_rank} {edge.src_record}")
        parts.append(f"rank {edge.dst_rank} {edge.dst_record}")
        last = (edge.dst_rank, edge.dst_record)
    return " -> ".join(parts)
