"""The communication graph of each step as two lake tables (spec/FORMAT.md section 22).

For each (run, split, step) whose ranks hold communication calls, one Dask task
(:func:`build_graph`, a :class:`GraphJob`) reads the step's ranks' dump.json one at a time,
keeps their communication calls (:func:`msprobe.format.comm.calls_in`: the API, group, peer,
receive buffers, and whether its data and its result hold a NaN/Inf by
:func:`msprobe.format.cluster.rank_anomalies`' rule), matches them across the ranks
(:func:`msprobe.format.comm.graph_from_calls`) and writes two Parquet files under the lake's
``comm/`` directory:

* ``calls.parquet``: one row per communication call (:data:`CALL_COLUMNS`), with its ``level``
  in the step's happens-before order;
* ``edges.parquet``: one row per matched data flow (:data:`EDGE_COLUMNS`): a send and its
  receive, each member of a collective to each member it reaches; written in row groups as the
  edges are produced, so a task holds one step's calls and one row group.

``comm/state.json`` records the rank directories (index key, document size and time) each
step's graph was built from; a refresh rebuilds the steps whose rank directories changed
(:func:`plan_graphs`). ``Lake.sql`` reads the tables as the views ``comm_calls`` and
``comm_edges``.
"""
from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from typing import Any, Optional

from msprobe.format.cluster import rank_anomalies
from msprobe.format.comm import buffer_args, calls_in, graph_from_calls
from msprobe.format.layout import RankLocation

__all__ = ["GRAPH_PREFIX", "STATE_KEY", "CALLS_FILE", "EDGES_FILE", "CALL_COLUMNS", "EDGE_COLUMNS", "GraphJob",
           "GraphPlan", "build_graph", "plan_graphs", "graph_dir_of", "read_state", "write_state", "calls_schema",
           "edges_schema", "buffer_paths", "is_buffer_row", "EDGE_BATCH", "PREFETCH_BATCH"]

GRAPH_PREFIX = "comm"
STATE_KEY = f"{GRAPH_PREFIX}/state.json"
CALLS_FILE = "calls.parquet"
EDGES_FILE = "edges.parquet"
#: edges written per Parquet row group; rank directories whose documents are fetched at once (object stores)
EDGE_BATCH = 1 << 16
PREFETCH_BATCH = 32

#: one row per communication call of a step
CALL_COLUMNS = ("run", "split", "step", "rank", "rank_dir", "index", "record", "api", "kind", "group", "peer", "tag",
                "is_root", "level", "buffers", "data_nonfinite", "result_nonfinite", "matched")
#: one row per matched data flow of a step (``kind``: "p2p" or the collective's API)
EDGE_COLUMNS = ("run", "split", "step", "src_rank", "src_index", "src_record", "dst_rank", "dst_index", "dst_record",
                "kind")


def calls_schema() -> Any:
    import pyarrow as pa

    types = {"step": pa.int64(), "rank": pa.int64(), "index": pa.int64(), "group": pa.list_(pa.int64()),
             "peer": pa.int64(), "tag": pa.int64(), "is_root": pa.bool_(), "level": pa.int64(),
             "buffers": pa.list_(pa.string()), "data_nonfinite": pa.bool_(), "result_nonfinite": pa.bool_(),
             "matched": pa.bool_()}
    return pa.schema([(name, types.get(name, pa.string())) for name in CALL_COLUMNS])


def edges_schema() -> Any:
    import pyarrow as pa

    ints = ("step", "src_rank", "src_index", "dst_rank", "dst_index")
    return pa.schema([(name, pa.int64() if name in ints else pa.string()) for name in EDGE_COLUMNS])


def graph_dir_of(compact_key: str) -> str:
    """``comm/run=R/[split=S/]step=N`` of a step's compacted index key (``index/.../_compact.parquet``)."""
    step_dir = compact_key.rsplit("/", 1)[0]
    return f"{GRAPH_PREFIX}/{step_dir.split('/', 1)[1]}"


def buffer_paths(name: str, record: Any, rank: int) -> list:
    """The index's argument paths (``input_args.0``, ``input_kwargs.tensor``) of a communication
    record's receive buffers (:func:`msprobe.format.comm.buffer_args`)."""
    out = []
    for arg in sorted(buffer_args(name, record, rank), key=str):
        out.append(f"input_args.{arg}" if isinstance(arg, int) else f"input_kwargs.{arg}")
    return out


def is_buffer_row(arg_path: Any, buffers: Any) -> bool:
    """Whether an index row's ``arg_path`` lies in one of ``buffers`` (:func:`buffer_paths`)."""
    if buffers is None or not isinstance(arg_path, str) or isinstance(buffers, (str, float)) \
            or not hasattr(buffers, "__iter__"):
        return False  # no call there (a null from the join)
    return any(arg_path == path or arg_path.startswith(path + ".") for path in buffers)


# -- planning -------------------------------------------------------------------------------------


def _fingerprint(rows: list) -> str:
    """What a step's graph was built from: its rank directories' index keys, document sizes and times."""
    items = sorted((row["index_key"], row.get("doc_size"), row.get("mtime")) for row in rows)
    return hashlib.sha256(json.dumps(items, default=str).encode("utf-8")).hexdigest()[:24]


@dataclass(frozen=True)
class GraphJob:
    """One step's graph (:func:`build_graph`): the rank directories ``locs`` ((prefix, rank_dir, rank)
    each, in rank order) of (run, split, step), written to ``dir`` of the lake directory."""

    root_url: str
    storage_options: Optional[dict]
    lake_url: str
    lake_options: Optional[dict]
    run: str
    split: Optional[str]
    step: Optional[int]
    locs: list
    dir: str
    fingerprint: str


@dataclass(frozen=True)
class GraphPlan:
    """The graph tasks of a refresh (:func:`plan_graphs`): ``build`` ([(dir, run, split, step, locs,
    fingerprint)]), ``keep`` ({dir: state entry} still current) and ``deletes`` (the files of steps
    that went away or are rebuilt)."""

    build: tuple
    keep: dict
    deletes: tuple


def plan_graphs(rows: dict, state: dict, refresh: str) -> GraphPlan:
    """Which steps' graphs to (re)build from the manifest rows after a refresh (``rows``: index key
    -> row) and ``state`` ({dir: {"fingerprint", ...}} of ``comm/state.json``). Reads no storage."""
    steps: dict = {}
    for row in rows.values():
        if row.get("rank") is None:
            continue  # a rank directory without a rank number: no place in a graph
        steps.setdefault(graph_dir_of(row.get("compact_key") or _compact_of(row["index_key"])), []).append(row)
    build, keep = [], {}
    for where, members in sorted(steps.items()):
        members.sort(key=lambda row: (row["rank"], row["rank_dir"]))
        fingerprint = _fingerprint(members)
        old = state.get(where)
        if refresh == "none" or (refresh != "all" and old and old.get("fingerprint") == fingerprint):
            if old:
                keep[where] = old
            continue
        if all(row.get("comm_calls") == 0 for row in members):  # known from the index build: no call
            keep[where] = {"fingerprint": fingerprint, "ranks": len(members), "calls": 0, "edges": 0}
            continue
        first = members[0]
        build.append((where, first["run"], first["split"], first["step"],
                      [(row["prefix"], row["rank_dir"], row["rank"]) for row in members], fingerprint))
    gone = [where for where in state if where not in steps] if refresh != "none" else []
    deletes = [f"{where}/{name}" for where in gone for name in (CALLS_FILE, EDGES_FILE)]
    return GraphPlan(tuple(build), keep, tuple(deletes))


def _compact_of(index_key: str) -> str:
    return f"{index_key.rsplit('/', 2)[0]}/_compact.parquet"


def read_state(store: Any) -> dict:
    """``comm/state.json`` ({dir: {fingerprint, calls, edges, ranks}}), {} when absent or unreadable."""
    from msprobe.errors import MsprobeError

    if store is None:
        return {}
    try:
        doc = json.loads(store.get(STATE_KEY))
    except (MsprobeError, ValueError):
        return {}
    steps = doc.get("steps") if isinstance(doc, dict) else None
    return {key: value for key, value in steps.items() if isinstance(value, dict)} if isinstance(steps, dict) else {}


def write_state(store: Any, state: dict) -> None:
    store.put(STATE_KEY, json.dumps({"steps": state}, indent=1, sort_keys=True).encode("utf-8"))


# -- the task ------------------------------------------------------------------------------------------


def _rank_calls(data: dict, rank: int) -> list:
    """[(CommCall, buffers, [NaN/Inf in data, in result])] of one rank's records."""
    calls = calls_in(data, rank)
    if not calls:
        return []
    _, flags = rank_anomalies(data.items(), rank)
    return [(call, buffer_paths(call.name, data[call.name], rank), flags.get(call.index, [False, False]))
            for call in calls]


def _read_calls(job: GraphJob) -> tuple:
    """({rank: [CommCall]}, {(rank, index): (buffers, flags)}, {rank: rank_dir}) of the job's ranks,
    one document in memory at a time."""
    from msprobe.errors import MsprobeError, StorageNotFoundError
    from msprobe.format.documents import DEBUG_JSON, DUMP_JSON
    from msprobe.lake._build import Prefetched
    from msprobe.lake._core import cached_store
    from msprobe.readers import RankSource

    base = cached_store(job.root_url, job.storage_options)
    calls: dict = {}
    extra: dict = {}
    rank_dirs: dict = {}
    for start in range(0, len(job.locs), PREFETCH_BATCH):
        chunk = job.locs[start:start + PREFETCH_BATCH]
        store = Prefetched(base)
        store.prefetch([prefix for prefix, _, _ in chunk], (DUMP_JSON, DEBUG_JSON))
        for prefix, rank_dir, rank in chunk:
            src = RankSource(store, RankLocation(prefix, job.step, rank_dir, rank, job.split), run=job.run)
            try:
                data = src.document().data
            except StorageNotFoundError:
                continue  # the rank directory went away
            except MsprobeError:
                data = {}
            items = _rank_calls(data, rank)
            calls[rank] = [call for call, _, _ in items]
            rank_dirs[rank] = rank_dir
            extra.update({(rank, call.index): (buffers, flags) for call, buffers, flags in items})
            src.release()
            del data
    return calls, extra, rank_dirs


def _calls_table(job: GraphJob, graph: Any, extra: dict, rank_dirs: dict) -> Any:
    import pyarrow as pa

    unmatched = {(call.rank, call.index) for call in graph.unmatched}
    cols: dict = {name: [] for name in CALL_COLUMNS}
    for rank in sorted(graph.calls):
        for call in graph.calls[rank]:
            buffers, flags = extra[(rank, call.index)]
            values = (job.run, job.split, job.step, rank, rank_dirs[rank], call.index, call.name, call.api, call.kind,
                      list(call.group) if call.group is not None else None, call.peer, call.tag, call.is_root,
                      call.level, buffers, bool(flags[0]), bool(flags[1]), (rank, call.index) not in unmatched)
            for name, value in zip(CALL_COLUMNS, values):
                cols[name].append(value)
    return pa.Table.from_pydict(cols, schema=calls_schema())


def _write_edges(store: Any, key: str, job: GraphJob, graph: Any) -> int:
    """Stream the graph's edges into ``key`` in row groups of :data:`EDGE_BATCH`; returns how many."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = edges_schema()
    buf = io.BytesIO()
    count = 0
    with pq.ParquetWriter(buf, schema, compression="zstd") as writer:
        cols: dict = {name: [] for name in EDGE_COLUMNS}
        for edge in graph.edges():
            values = (job.run, job.split, job.step, edge.src_rank, edge.src_index, edge.src_record, edge.dst_rank,
                      edge.dst_index, edge.dst_record, edge.kind)
            for name, value in zip(EDGE_COLUMNS, values):
                cols[name].append(value)
            count += 1
            if len(cols["kind"]) >= EDGE_BATCH:
                writer.write_table(pa.Table.from_pydict(cols, schema=schema))
                cols = {name: [] for name in EDGE_COLUMNS}
        if cols["kind"] or not count:
            writer.write_table(pa.Table.from_pydict(cols, schema=schema))
    store.put(key, buf.getvalue())
    return count


def build_graph(job: GraphJob) -> dict:
    """Task: the communication graph of one step (its ranks' dump.json, communication records
    only kept) into ``calls.parquet`` and ``edges.parquet`` of ``job.dir``; returns its state
    entry ``{dir, fingerprint, ranks, calls, edges}``."""
    import pyarrow.parquet as pq

    from msprobe.lake._core import cached_store

    calls, extra, rank_dirs = _read_calls(job)
    graph = graph_from_calls(calls, tuple(sorted(calls)))
    out_store = cached_store(job.lake_url, job.lake_options, write=True)
    table = _calls_table(job, graph, extra, rank_dirs)
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    out_store.put(f"{job.dir}/{CALLS_FILE}", buf.getvalue())
    n_calls = table.num_rows
    del table, buf
    n_edges = _write_edges(out_store, f"{job.dir}/{EDGES_FILE}", job, graph)
    return {"dir": job.dir, "fingerprint": job.fingerprint, "ranks": len(calls), "calls": n_calls, "edges": n_edges}


# -- the views ---------------------------------------------------------------------------------------

#: the DuckDB views over the tables, and their files
VIEWS = (("comm_calls", CALLS_FILE, calls_schema), ("comm_edges", EDGES_FILE, edges_schema))


def register_views(con: Any, graphs: dict, *, own: Any, remote_root: Optional[str], engine: str) -> None:
    """Create the views ``comm_calls`` and ``comm_edges`` in ``con`` over the graph files of
    ``graphs`` ({dir: state entry}; steps without calls have no files), read as the lake's
    ``engine`` reads its index (DuckDB's Parquet reader, its httpfs under ``remote_root``, the
    location the store's ``duckdb_setup`` gave, else pyarrow)."""
    import pyarrow as pa
    import pyarrow.dataset as pads

    from msprobe.readers import arrow_location

    dirs = sorted(where for where, entry in graphs.items() if entry.get("calls"))
    for view, name, schema in VIEWS:
        keys = [f"{where}/{name}" for where in dirs]
        source = None
        if keys and engine == "duckdb-parquet":
            source = "read_parquet([" + ", ".join(_quote(str(own().duckdb_path(key))) for key in keys) + "])"
        elif keys and engine == "duckdb-httpfs" and remote_root is not None:
            root = remote_root.rstrip("/")
            source = "read_parquet([" + ", ".join(_quote(f"{root}/{key}") for key in keys) + "])"
        if source is not None:
            con.execute(f"CREATE VIEW {view} AS SELECT * FROM {source}")
            continue
        located = [arrow_location(own(), key) for key in keys]
        locations = [loc for loc in located if loc is not None]
        data: Any
        if keys and len(locations) == len(keys):
            data = pads.FileSystemDataset.from_paths([loc[1] for loc in locations], schema=schema(),
                                                     format=pads.ParquetFileFormat(), filesystem=locations[0][0])
        else:
            data = pa.Table.from_pylist([], schema=schema())
        con.register(f"{view}_arrow", data)
        con.execute(f"CREATE VIEW {view} AS SELECT * FROM {view}_arrow")


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
