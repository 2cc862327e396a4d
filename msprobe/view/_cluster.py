"""The cluster view of one step: its ranks as lanes, in the order their communication implies.

:func:`build_cluster` reads each rank of a (run, step) once (its ``dump.json``, then released), and
keeps per rank only what the view draws: the communication calls (:mod:`msprobe.format.comm`: the
step's graph, its levels and matched calls) and the anomalous records (NaN/Inf rows, divergent rows of
a compare; a communication call's receive buffers before the call left out), so a lane holds the
records that explain the step's communication and anomalies, never all of its records. The first
anomaly is :func:`msprobe.format.cluster.first_anomaly` of the dump (one dump, a lake) or compare's
``origin`` / first NaN/Inf / first divergence of summary.json (a compare), with its propagation path.

:meth:`StepCluster.page` answers a page of lanes (``lane_begin``..``lane_end``, at most
:data:`MAX_LANES`), the matched point-to-point calls and collectives among them, the anomaly with
its path, and every lane's counts (so 1,024 ranks are one small table and a few pages of lanes).

A lane does not draw every anomalous record: after a NaN most records of a real rank are NaN (tens of
thousands). Each run of anomalous records between two drawn records (a communication call, the
anomaly, a hop of its path) is one node of kind ``run`` with its count, first and last record and
its first :data:`RUN_MEMBERS` members (the lane's first :data:`HELD_MEMBERS` anomalous records are
held by name), so a lane's nodes are bounded by its communication calls, never by its anomalies.
"""
from __future__ import annotations

from array import array
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

from msprobe.errors import MsprobeError
from msprobe.format.cluster import first_anomaly
from msprobe.format.comm import (
    COMM_PREFIXES,
    StepGraph,
    buffer_args,
    calls_in,
    graph_from_calls,
    is_buffer_leaf,
)
from msprobe.readers import records_of

__all__ = ["StepCluster", "build_cluster", "assemble", "MAX_LANES", "MAX_NODES", "LANES_PAGE"]

#: lanes answered at most at once, and by default
MAX_LANES = 64
LANES_PAGE = 16
#: records kept per lane (communication calls and anomalous records, the earliest first; the
#: anomaly and its path always)
MAX_NODES = 400
#: communication rows read per cell (the receive-buffer check)
_MAX_ROWS = 5000
#: a run's members answered with it (an expanded run shows these), and the anomalous records of a
#: lane held by name (the earliest; a run's members past them are counted, not named)
RUN_MEMBERS = 50
HELD_MEMBERS = 200
_SEVERITY = {"warning": 1, "error": 2}
_RESULT = {0: "", 1: "warning", 2: "error"}
_COMM = tuple(prefix + "." for prefix in COMM_PREFIXES)
#: the summary entries of a compare shown on the view, the first present on the step being the anomaly
_COMPARE_MARKS = (("origin", "error enters"), ("first_nan_inf_target", "first NaN/Inf"),
                  ("first_nan_target", "first NaN"), ("first_inf_target", "first Inf"),
                  ("first_divergence", "first divergence"))


@dataclass
class Lane:
    """One rank of the step: its cell, counts and the records the view draws (``nodes``)."""

    rank: int
    rank_dir: str
    cell: int
    records: int = 0
    comm: int = 0
    anomalous: int = 0
    nodes: dict = field(default_factory=dict)  # record index -> node
    readable: bool = True
    dropped: int = 0  # records of the view's kinds past MAX_NODES, not drawn
    # the anomalous records that are no communication call: their indexes (ascending), flags
    # (severity << 1 | NaN/Inf) and the names of the first HELD_MEMBERS and of each run's ends
    bad: Any = field(default_factory=lambda: array("i"))
    flags: bytearray = field(default_factory=bytearray)
    names: dict = field(default_factory=dict)  # index -> (record, row)
    drawn: list = field(default_factory=list)  # the nodes a page draws (runs collapsed), made once
    kept: set = field(default_factory=set)  # indexes drawn whatever the bound (the anomaly, its path)

    def summary(self) -> dict:
        return {"rank": self.rank, "rank_dir": self.rank_dir, "cell": self.cell, "records": self.records,
                "comm": self.comm, "anomalous": self.anomalous, "readable": self.readable, "dropped": self.dropped}


def _worse(old: str, new: str) -> str:
    order = {"error": 3, "nan_inf": 3, "warning": 2, "pass": 1}
    return new if order.get(new, 0) > order.get(old, 0) else old


class StepCluster:
    """The cluster view's model of one (run, step): lanes, the graph and the anomaly."""

    def __init__(self, run: Optional[str], step: Optional[int], lanes: list, graph: StepGraph,
                 anomaly: Optional[dict], marks: list, note: Optional[str]) -> None:
        self.run = run
        self.step = step
        self.lanes = lanes
        self.graph = graph
        self.anomaly = anomaly
        self.marks = marks
        self.note = note
        self._by_rank = {lane.rank: lane for lane in lanes}
        for lane in lanes:
            _draw_lane(lane)

    def _node(self, rank: int, drawn: dict) -> dict:
        node = dict(drawn)
        index = node["i"]
        node["level"] = self.graph.order_key(rank, index)[0]
        call = self.graph.call_at(rank, index)
        if call is not None:
            node.update(comm=call.api, peer=call.peer, is_root=call.is_root)
        return node

    def _links(self, shown: set) -> tuple:
        """(point-to-point edges, collectives) among the records ``shown`` ({(rank, index)})."""
        p2p: list = []
        colls: list = []
        seen: set = set()
        for rank, items in self.graph.calls.items():
            for call in items:
                spot = (rank, call.index)
                if spot in seen:
                    continue
                peers = self.graph.matches.get(spot, [])
                if call.kind == "send":
                    p2p.extend({"from": [rank, call.index], "to": list(peer), "via": "p2p"} for peer in peers
                               if spot in shown and tuple(peer) in shown)
                elif call.kind in ("all", "from_root", "to_root", "sync"):
                    members = sorted([spot] + [tuple(peer) for peer in peers])
                    seen.update(members)
                    visible = [member for member in members if member in shown]
                    if len(visible) > 1:
                        roots = [list(m) for m in visible if (c := self.graph.call_at(*m)) is not None and c.is_root]
                        colls.append({"api": call.api, "kind": call.kind, "level": call.level,
                                      "members": [list(m) for m in visible], "roots": roots,
                                      "group_size": len(members)})
        return p2p, colls

    def page(self, lane_begin: int = 0, lane_end: int = LANES_PAGE) -> dict:
        """Lanes ``lane_begin``..``lane_end`` (at most :data:`MAX_LANES`) with their links and the anomaly."""
        lane_begin = max(int(lane_begin), 0)
        lane_end = min(max(int(lane_end), lane_begin), lane_begin + MAX_LANES)
        picked = self.lanes[lane_begin:lane_end]
        lanes = []
        shown: set = set()
        for lane in picked:
            nodes = [self._node(lane.rank, node) for node in lane.drawn]
            shown.update((lane.rank, node["i"]) for node in nodes if node["kind"] != "run")
            lanes.append(dict(lane.summary(), nodes=nodes, shown=len(nodes)))
        p2p, colls = self._links(shown)
        anomaly_lane = None
        if self.anomaly is not None:
            anomaly_lane = next((k for k, lane in enumerate(self.lanes) if lane.rank == self.anomaly["rank"]), None)
        return {"run": self.run, "step": self.step, "ranks_total": len(self.lanes), "lane_begin": lane_begin,
                "lane_end": lane_begin + len(picked), "lanes": lanes, "summary": [lane.summary() for lane in self.lanes],
                "p2p": p2p, "collectives": colls, "anomaly": self.anomaly, "anomaly_lane": anomaly_lane,
                "marks": self.marks, "levels": max((c.level for items in self.graph.calls.values() for c in items),
                                                   default=0),
                "note": self.note}


class _AnomalousRows:
    """The anomalous rows of a step's cells, read one cell at a time as its rank is read (``get``, as
    a dict's): every communication record's rows (the first :data:`_MAX_ROWS` of a cell: a receive
    buffer's rows are no anomaly) and every other record with a divergent or NaN/Inf row, one tuple
    ``(record, first such row, NaN/Inf, severity)`` a record (a rank of 20,000 records, most NaN after
    a NaN, is one grouped query; 64 such ranks are never held at once)."""

    def __init__(self, data: Any) -> None:
        self.data = data

    def get(self, cell: Any, default: Any = None) -> tuple:
        data = self.data
        comm = " OR ".join(f"starts_with(record, '{prefix}')" for prefix in _COMM)
        comm_rows = data.query(f"""SELECT record, name, result, nan_inf, {data.divergent_sql} AS bad FROM rows
            WHERE cell = ? AND ({comm}) ORDER BY i LIMIT {_MAX_ROWS}""", [cell])
        cur = data.cursor()
        try:
            found = cur.execute(f"""SELECT record, arg_min(name, i), bool_or(nan_inf),
                max(CASE result WHEN 'error' THEN 2 WHEN 'warning' THEN 1 ELSE 0 END) FROM rows
                WHERE cell = ? AND {data.divergent_sql} AND NOT ({comm}) GROUP BY record""", [cell]).fetchall()
        finally:
            cur.close()
        return comm_rows, [(record, name, bool(nan_inf), int(severity or 0)) for record, name, nan_inf, severity in found]


def _mark_comm_rows(lane: Lane, records: dict, rows: list, positions: dict) -> None:
    """Mark the communication calls of ``lane`` that have an anomalous row (a receive buffer's rows
    before the call are no anomaly)."""
    buffers: dict = {}
    for row in rows:
        record = row["record"]
        index = positions.get(record)
        node = lane.nodes.get(index) if index is not None else None
        if node is None:
            continue
        if record not in buffers:
            buffers[record] = buffer_args(record, records.get(record), lane.rank)
        if not row["bad"] or is_buffer_leaf(row["name"][len(record) + 1:], buffers[record]):
            continue
        node["nan_inf"] = node["nan_inf"] or bool(row["nan_inf"])
        node["result"] = _worse(node["result"], "nan_inf" if row["nan_inf"] else str(row["result"] or ""))
        node.setdefault("row", row["name"])


def _fill_lane(lane: Lane, records: dict, calls: list, rows: tuple) -> None:
    """The lane's communication calls (nodes) and its other anomalous records (``bad``, ``flags``)."""
    lane.records = len(records)
    lane.comm = len(calls)
    for call in calls:
        lane.nodes[call.index] = {"i": call.index, "record": call.name, "kind": "comm", "result": "", "nan_inf": False}
    comm_rows, bad = rows
    positions = {name: k for k, name in enumerate(records)} if comm_rows or bad else {}
    _mark_comm_rows(lane, records, comm_rows, positions)
    found = sorted((positions[record], record, name, nan_inf, severity) for record, name, nan_inf, severity in bad
                   if record in positions and positions[record] not in lane.nodes)
    lane.bad = array("i", (entry[0] for entry in found))
    lane.flags = bytearray(entry[4] << 1 | entry[3] for entry in found)
    lane.names = {entry[0]: (entry[1], entry[2]) for entry in found[:HELD_MEMBERS]}
    lane.anomalous = sum(1 for node in lane.nodes.values() if node["nan_inf"] or node["result"] in ("error", "warning")) \
        + sum(1 for flag in lane.flags if flag)
    # the ends of each stretch between two communication calls are named (a run's first and last record)
    stops = sorted(lane.nodes)
    for k, (index, record, name, _nan, _sev) in enumerate(found):
        if k == 0 or k == len(found) - 1 or bisect_left(stops, index) != bisect_left(stops, found[k - 1][0]) \
                or bisect_left(stops, index) != bisect_left(stops, found[k + 1][0]):
            lane.names[index] = (record, name)


def _member(lane: Lane, k: int) -> dict:
    """The ``k``-th anomalous record of ``lane`` as a node (named when held)."""
    index, flag = lane.bad[k], lane.flags[k]
    record, row = lane.names.get(index, (None, None))
    return {"i": index, "record": record, "row": row, "kind": "anomaly", "nan_inf": bool(flag & 1),
            "result": "nan_inf" if flag & 1 else _RESULT[flag >> 1]}


def _draw_lane(lane: Lane) -> None:
    """``lane.drawn``: its nodes (communication calls, the anomaly and its path) and between two of
    them each run of anomalous records as one node (a run of one: the record itself), ascending; the
    earliest :data:`MAX_NODES` of them drawn (kept nodes always)."""
    stops = sorted(lane.nodes)
    drawn = []
    k = 0
    total = len(lane.bad)
    while k < total:
        index = lane.bad[k]
        if index in lane.nodes:  # the anomaly itself: its flags go to its node
            node = lane.nodes[index]
            member = _member(lane, k)
            node["nan_inf"] = node["nan_inf"] or member["nan_inf"]
            node["result"] = _worse(node["result"], member["result"])
            node.setdefault("row", member["row"])
            k += 1
            continue
        stop = bisect_left(stops, index)
        end = k
        while end + 1 < total and lane.bad[end + 1] not in lane.nodes and bisect_left(stops, lane.bad[end + 1]) == stop:
            end += 1
        first = _member(lane, k)
        if end == k:
            drawn.append(first)
        else:
            last = _member(lane, end)
            flags = lane.flags[k:end + 1]
            worst = max(flag >> 1 for flag in flags)
            nan = any(flag & 1 for flag in flags)
            members = [_member(lane, j) for j in range(k, min(end + 1, k + RUN_MEMBERS))]
            drawn.append({"i": first["i"], "last": last["i"], "count": end - k + 1, "kind": "run",
                          "record": first["record"], "last_record": last["record"], "row": first["row"],
                          "nan_inf": nan, "result": "nan_inf" if nan else _RESULT[worst],
                          "members": [m for m in members if m["record"] is not None]})
        k = end + 1
    drawn.extend(lane.nodes.values())
    drawn.sort(key=lambda node: node["i"])
    if len(drawn) > MAX_NODES:
        keep = {id(node) for node in drawn[:MAX_NODES]} | {id(lane.nodes[index]) for index in lane.kept}
        lane.dropped = sum(node.get("count", 1) for node in drawn if id(node) not in keep)
        drawn = [node for node in drawn if id(node) in keep]
    lane.drawn = drawn


def _keep(lanes: dict, rank: Any, index: Any, record: str, kind: str) -> None:
    """Make sure the record (rank, index) is a node of its lane (the anomaly, a hop of its path)."""
    lane = lanes.get(rank)
    if lane is None or not isinstance(index, int):
        return
    lane.nodes.setdefault(index, {"i": index, "record": record, "kind": kind, "result": "", "nan_inf": False})
    lane.kept.add(index)


class _Reader:
    """Reads each lane's records once, for the graph, the lane and (a dump) the first anomaly."""

    def __init__(self, read: Any, cells: list, rows: Any) -> None:
        self.read = read  # a row of cells -> (its source or None, its records)
        self.cells = cells
        self.rows = rows
        self.lanes: dict = {}
        self.calls: dict = {}
        self.names: dict = {}  # rank -> {record name: index} of the records the path may name
        self.unreadable = 0

    def ranks(self) -> Iterator[tuple]:
        for pos, cell_row in enumerate(self.cells):
            rank = cell_row["rank"] if cell_row["rank"] is not None else pos
            lane = Lane(rank, str(cell_row["rank_dir"]), int(cell_row["cell"]))
            self.lanes[rank] = lane
            source, records = self.read(cell_row)
            if not records:  # no source, or none of its records could be read
                lane.readable = False
                self.unreadable += 1
            calls = calls_in(records, rank)
            self.calls[rank] = calls
            _fill_lane(lane, records, calls, self.rows.get(lane.cell, ([], [])))
            self.names[rank] = {name: k for k, name in enumerate(records)
                                if name.startswith(_COMM) or k in lane.nodes or k in lane.names}
            yield rank, records
            if source is not None and hasattr(source, "release"):
                source.release()


def _read_target(data: Any) -> Any:
    """The reader of a view's target ranks: a row of cells -> (its source or None, its records)."""
    def read(cell_row: dict) -> tuple:
        source = None
        try:
            source = data.located_row("target", cell_row)[1]
            return source, (records_of(source) if source is not None else {})
        except (MsprobeError, OSError, ValueError):
            return source, {}
    return read


def _hops(path: Any, names: dict) -> list:
    """A summary entry's path with each hop's record indexes (``from_i``, ``to_i``)."""
    out = []
    for hop in path or []:
        if not isinstance(hop, dict):
            continue
        out.append(dict(hop, from_i=names.get(hop.get("from_rank"), {}).get(hop.get("from_record")),
                        to_i=names.get(hop.get("to_rank"), {}).get(hop.get("to_record"))))
    return out


def _compare_marks(summary: dict, step: Any, run: Any, reader: _Reader) -> list:
    """compare's answers located on this step (summary.json's origin, first NaN/Inf, first divergence)."""
    marks: list = []
    for key, label in _COMPARE_MARKS:
        entry = summary.get(key)
        if not isinstance(entry, dict) or entry.get("step") != step or (run and entry.get("run") not in (None, run)):
            continue
        lane = next((lane for lane in reader.lanes.values() if lane.rank_dir == entry.get("rank_dir")), None)
        if lane is None or any(mark["rank"] == lane.rank and mark["record"] == entry.get("record") for mark in marks):
            continue  # the same record answers two questions (first NaN/Inf and first NaN): shown once
        index = entry.get("record_index")
        marks.append({"key": key, "label": label, "rank": lane.rank, "rank_dir": lane.rank_dir, "record": entry.get("record"),
                      "i": index if isinstance(index, int) else reader.names.get(lane.rank, {}).get(entry.get("record")),
                      "row": entry.get("row"), "argument": entry.get("argument"), "kind": entry.get("kind"),
                      "order": entry.get("order"), "path": _hops(entry.get("path"), reader.names),
                      "path_text": entry.get("path_text")})
    return marks


def build_cluster(data: Any, cell_row: dict) -> StepCluster:
    """The :class:`StepCluster` of the (run, step) of ``cell_row`` (a row of ``cells``) in the view ``data``."""
    run, step = cell_row["run"], cell_row["step"]
    cells = data.query("""SELECT * FROM cells WHERE run IS NOT DISTINCT FROM ?
        AND step IS NOT DISTINCT FROM ? ORDER BY rank NULLS LAST, rank_dir""", [run, step])
    return assemble(run, step, cells, _AnomalousRows(data), _read_target(data), data.summary)


def assemble(run: Any, step: Any, cells: list, rows: Any, read: Any, summary: dict) -> StepCluster:
    """The :class:`StepCluster` of a step from its ``cells`` (rows of ``cells``: cell, rank, rank_dir),
    their anomalous ``rows`` (``rows.get(cell, default)``: :class:`_AnomalousRows`, or a dict of them), ``read`` (a row of cells -> (its source or
    None, its records), each rank read once) and compare's ``summary`` (``{}``: the first NaN/Inf of
    the dumps themselves)."""
    reader = _Reader(read, cells, rows)
    use_summary = any(isinstance(summary.get(key), dict) for key, _ in _COMPARE_MARKS)
    found = None
    if use_summary:
        for _ in reader.ranks():
            pass
    else:
        found = first_anomaly(reader.ranks())
    graph = graph_from_calls(reader.calls)
    if use_summary:
        marks = _compare_marks(summary, step, run, reader)
    elif found is not None:
        marks = [{"key": "first_nan_inf", "label": "first " + ("NaN" if found["kind"] == "nan" else "Inf"),
                  "rank": found["rank"], "rank_dir": reader.lanes[found["rank"]].rank_dir, "record": found["record"],
                  "i": found["record_index"], "row": None, "argument": found.get("argument"), "kind": found["kind"],
                  "order": found.get("order"), "path": _hops(found.get("path"), reader.names),
                  "path_text": found.get("path_text")}]
    else:
        marks = []
    for mark in marks:
        _keep(reader.lanes, mark["rank"], mark["i"], mark["record"] or "", "anomaly")
        for hop in mark["path"]:
            _keep(reader.lanes, hop.get("from_rank"), hop.get("from_i"), hop.get("from_record") or "", "comm")
            _keep(reader.lanes, hop.get("to_rank"), hop.get("to_i"), hop.get("to_record") or "", "comm")
    anomaly = marks[0] if marks else None
    note = (f"{reader.unreadable} of {len(cells)} ranks' dump.json could not be read: their lanes show no records"
            if reader.unreadable else None)
    ordered = [reader.lanes[rank] for rank in sorted(reader.lanes)]
    return StepCluster(run, step, ordered, graph, anomaly, marks, note)
