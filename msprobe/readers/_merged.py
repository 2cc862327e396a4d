"""The logical model of a parallel run: its ranks merged by a :class:`~msprobe.format.parallel.Layout`
(spec/FORMAT.md section 26).

Per data-parallel replica, each pipeline stage's tensor-parallel ranks are merged record by
record, then the stages are concatenated in model order under the logical names
(:func:`~msprobe.format.parallel.stage_renames`). Each tensor of a record is, across the ranks
of its tensor-parallel group:

* **replicated**: equal statistics on every rank (within the format's tolerance): kept once;
  replicas that differ where the reference (the other side of a compare) says the tensor is
  whole are a finding (``replicas disagree``), the ranks that differ from the reference named;
* **partial**: a rank's partial sum before an ``all_reduce`` (a row-parallel matmul's output:
  its statistics are the all_reduce's input on that rank): not a shard; it takes the statistics
  of the all_reduce's result (the sum the single-card model computes);
* **sharded**: otherwise; merged exactly (:func:`~msprobe.format.parallel.merge_shard_stats`)
  along the dimension where the reference's shape is the shards' sum (else the last).

Communication records (``Distributed.*``) are the layout's own work, not the model's: left out
and listed. A module that appears on several stages under one name spans them: its inputs are
the first stage's, its outputs the last's (backward: the other way round).
"""
from __future__ import annotations

from typing import Any, Optional

from msprobe.errors import ConfigError
from msprobe.format.comm import comm_api, comm_call
from msprobe.format.documents import DumpDocument
from msprobe.format.parallel import Layout, LayoutError, merge_shard_stats, stage_renames
from msprobe.format.stats import MAX, MIN, STAT_KEYS, stats_equal

__all__ = ["MergedSource", "merge_dump_step", "read_layout", "Layout"]

_STATS = STAT_KEYS


def _is_leaf(node: Any) -> bool:
    return isinstance(node, dict) and "dtype" in node and "shape" in node


def _signature(leaf: Any) -> Optional[tuple]:
    if not _is_leaf(leaf):
        return None
    return (tuple(leaf.get("shape") or ()),) + tuple(leaf.get(stat) for stat in _STATS)


def _same(a: dict, b: dict) -> bool:
    return list(a.get("shape") or []) == list(b.get("shape") or []) and \
        all(stats_equal(a.get(stat), b.get(stat)) for stat in _STATS)


class MergedSource:
    """A record source holding the merged records of one logical model (one step)."""

    def __init__(self, step: Any, rank: Optional[int], rank_dir: str, url: str, document: DumpDocument,
                 parents: dict, frames: dict, report: dict):
        self.step, self.rank, self.rank_dir, self.url = step, rank, rank_dir, url
        self._document, self._parents, self._frames = document, parents, frames
        self.report = report
        self.store = None

    @property
    def key(self) -> tuple:
        return ("merged", self.url, self.step, self.rank_dir)

    def document(self) -> DumpDocument:
        return self._document

    def raw_record(self, name: str) -> Any:
        return self._document.data.get(name)

    def tensor_key(self, data_name: str) -> str:
        raise ConfigError("a merged parallel layout holds statistics only: its tensors are not files "
                          "(compare it in statistics mode)")

    def stack_ids(self) -> dict:
        return {}

    def frames_of(self, name: str) -> Optional[list]:
        found = self._frames.get(name)
        if found is None:
            return None
        source, original = found
        try:
            return source.frames_of(original)
        except Exception:  # noqa: BLE001 - no stack.json: no frames
            return None

    def parents(self) -> dict:
        return self._parents

    def construct(self) -> None:
        return None

    def release(self) -> None:
        return None


class _Merger:
    """Merges the records of one tensor-parallel group (one pipeline stage)."""

    def __init__(self, ranks: list, datas: list, reference: dict, findings: list):
        self.ranks, self.datas, self.reference, self.findings = ranks, datas, reference, findings
        self.partials = [self._partials(data) for data in datas]
        self.kinds: dict = {}

    @staticmethod
    def _partials(data: dict) -> dict:
        """{signature of an all_reduce's input: its result} of one rank."""
        found = {}
        for name, record in data.items():
            api = comm_api(name)
            if api is None or api[0] != "all_reduce" or not isinstance(record, dict):
                continue
            args, out = record.get("input_args") or [], record.get("output") or []
            if args and out and _is_leaf(args[0]) and _is_leaf(out[0]):
                found[_signature(args[0])] = out[0]
        return found

    def record(self, logical: str, name: str) -> tuple:
        """(merged record, {leaf path: kind}) of record ``name`` of every rank."""
        nodes = [data.get(name) for data in self.datas]
        self.kinds = {}
        self.name = logical
        return self._node(nodes, self.reference.get(logical), ""), self.kinds

    def _node(self, nodes: list, ref: Any, path: str) -> Any:
        first = nodes[0]
        if _is_leaf(first):
            return self._leaf(nodes, ref if _is_leaf(ref) else None, path)
        if isinstance(first, dict):
            return {key: self._node([n.get(key) if isinstance(n, dict) else None for n in nodes],
                                    ref.get(key) if isinstance(ref, dict) else None, f"{path}.{key}".lstrip("."))
                    for key, value in first.items()}
        if isinstance(first, list):
            return [self._node([n[i] if isinstance(n, list) and i < len(n) else None for n in nodes],
                               ref[i] if isinstance(ref, list) and i < len(ref) else None, f"{path}.{i}".lstrip("."))
                    for i in range(len(first))]
        return first

    def _leaf(self, nodes: list, ref: Optional[dict], path: str) -> Any:
        first = nodes[0]
        if not all(_is_leaf(n) for n in nodes):
            self.kinds[path] = "missing on a rank"
            return first
        results = [partial.get(_signature(n)) for partial, n in zip(self.partials, nodes)]
        if all(r is not None for r in results):
            self.kinds[path] = "partial"
            merged = dict(first)
            merged.update({stat: (results[0] or {}).get(stat) for stat in _STATS})
            merged.pop("md5", None)
            return merged
        if all(_same(n, first) for n in nodes[1:]):
            self.kinds[path] = "replicated"
            return first
        shapes = [list(n.get("shape") or []) for n in nodes]
        if ref is not None and list(ref.get("shape") or []) == shapes[0]:
            return self._disagreeing(nodes, ref, path)
        self.kinds[path] = "sharded"
        return merge_shard_stats(nodes, self._dim(shapes, ref))

    def _disagreeing(self, nodes: list, ref: dict, path: str) -> dict:
        """Replicas that differ although the reference holds the tensor whole: a finding."""
        wrong = [rank for rank, n in zip(self.ranks, nodes) if not _same(n, ref)]
        self.kinds[path] = "replicas disagree"
        self.findings.append({"record": self.name, "leaf": path, "finding": "replicas disagree",
                              "ranks": list(self.ranks), "differ_from_bench": wrong,
                              "values": {str(rank): {stat: n.get(stat) for stat in _STATS}
                                         for rank, n in zip(self.ranks, nodes)}})
        index = self.ranks.index(wrong[0]) if wrong else 0
        return nodes[index]

    @staticmethod
    def _dim(shapes: list, ref: Optional[dict]) -> int:
        if ref is not None:
            whole = list(ref.get("shape") or [])
            if len(whole) == len(shapes[0]):
                for dim in range(len(whole)):
                    if whole[dim] == sum(s[dim] for s in shapes) and all(
                            whole[d] == shapes[0][d] for d in range(len(whole)) if d != dim):
                        return dim
        return -1


def _suspects(kinds: dict, nodes_by_rank: dict, ref: Any) -> list:
    """Ranks whose shard cannot be a piece of the reference's tensor (its Max above the whole's
    Max, or its Min below the whole's Min)."""
    out: set = set()
    if not isinstance(ref, dict):
        return []
    for path, kind in kinds.items():
        if kind != "sharded":
            continue
        whole = _at(ref, path)
        if not _is_leaf(whole):
            continue
        for rank, record in nodes_by_rank.items():
            leaf = _at(record, path)
            if not _is_leaf(leaf):
                continue
            high, low = leaf.get(MAX.key), leaf.get(MIN.key)
            top, bottom = whole.get(MAX.key), whole.get(MIN.key)
            if isinstance(high, (int, float)) and isinstance(top, (int, float)) and high > top + 1e-8 + 1e-5 * abs(top):
                out.add(rank)
            if isinstance(low, (int, float)) and isinstance(bottom, (int, float)) and \
                    low < bottom - 1e-8 - 1e-5 * abs(bottom):
                out.add(rank)
    return sorted(out)


def _at(node: Any, path: str) -> Any:
    for part in path.split(".") if path else ():
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _span(previous: dict, later: dict, name: str) -> dict:
    """A module record on several stages: inputs of the first stage, outputs of the last
    (backward: inputs, the gradients of its outputs, of the last stage, outputs of the first)."""
    merged = dict(previous)
    if name.endswith(".forward") or ".forward." in name:
        if "output" in later:
            merged["output"] = later["output"]
    else:
        for key in ("input_args", "input_kwargs"):
            if key in later:
                merged[key] = later[key]
    return merged


def _records_of(source: Any) -> dict:
    try:
        return source.document().data
    except Exception:  # noqa: BLE001 - a rank without a document holds no records
        return {}


def merge_model(stages: list, reference: Optional[dict] = None) -> tuple:
    """``stages``: [[source of each tp rank] per pipeline stage]; returns (data, parents, frames,
    report) of the logical model."""
    reference = reference or {}
    findings: list = []
    left_out: list = []
    datas = [[_records_of(source) for source in stage] for stage in stages]
    names = [[name for name in stage_data[0] if comm_api(name) is None] for stage_data in datas]
    renames = stage_renames(names)
    forward: dict = {}
    backward: list = []
    parents: dict = {}
    frames: dict = {}
    provenance: dict = {}
    for stage, (sources, stage_data, rename) in enumerate(zip(stages, datas, renames)):
        ranks = [source.rank for source in sources]
        left_out.extend({"rank": source.rank, "record": name} for source, data in zip(sources, stage_data)
                        for name in data if comm_api(name) is not None)
        known = set(stage_data[0])
        findings.extend({"record": name, "leaf": "", "finding": "record not on the stage's first rank: not merged",
                         "ranks": [source.rank], "differ_from_bench": [], "values": {}}
                        for source, data in zip(sources[1:], stage_data[1:]) for name in data
                        if name not in known and comm_api(name) is None)
        merger = _Merger(ranks, stage_data, reference, findings)
        local_parents = _parents(sources[0])
        stage_backward: dict = {}
        for name in names[stage]:
            logical = rename[name]
            record, kinds = merger.record(logical, name)
            missing = [rank for rank, data in zip(ranks, stage_data) if name not in data]
            target = stage_backward if ".backward" in name or "parameters_grad" in name else forward
            if logical in target and isinstance(target[logical], dict) and isinstance(record, dict):
                record = _span(target[logical], record, logical)
                target.pop(logical)
            target[logical] = record
            if name in local_parents:  # records outside the construct tree (parameters_grad) stay outside
                parent = local_parents[name]
                parents[logical] = rename.get(parent, parent) if parent is not None else None
            frames[logical] = (sources[0], name)
            entry = provenance.setdefault(logical, {"stages": [], "ranks": [], "leaves": {}, "suspects": []})
            entry["stages"].append(stage)
            entry["ranks"].extend(ranks)
            entry["leaves"].update(kinds)
            entry["suspects"] = sorted(set(entry["suspects"]) | set(
                _suspects(kinds, {rank: data.get(name) for rank, data in zip(ranks, stage_data)},
                          reference.get(logical))))
            if missing:
                entry["missing_on"] = missing
        backward.append(stage_backward)
    data = dict(forward)
    for stage_backward in reversed(backward):
        data.update(stage_backward)
    order = {name: index for index, name in enumerate(data)}
    findings.sort(key=lambda finding: order.get(finding["record"], len(order)))  # in the logical model's order
    report = {"findings": findings, "communication_left_out": len(left_out), "records": provenance}
    return data, parents, frames, report


def _parents(source: Any) -> dict:
    try:
        return source.parents() or {}
    except Exception:  # noqa: BLE001 - no construct.json: no tree
        return {}


def _groups_of(sources: list) -> tuple:
    """({rank: its tensor-parallel group}, {rank: previous pipeline stage's rank}) as the dump says
    them: the group of a rank's first all_reduce; the peer of its first receive when that comes
    before its first send (the first stage sends first; later stages receive their input first)."""
    tp_of: dict = {}
    prev: dict = {}
    for source in sources:
        first_send, first_recv = None, None
        for index, (name, record) in enumerate(_records_of(source).items()):
            call = comm_call(name, record, source.rank, index)
            if call is None:
                continue
            if call.api == "all_reduce" and source.rank not in tp_of and call.group:
                tp_of[source.rank] = tuple(call.group)
            if call.kind == "send" and first_send is None:
                first_send = index
            if call.kind == "recv" and first_recv is None:
                first_recv = (index, call.peer)
        if first_recv is not None and first_recv[1] is not None and (first_send is None or first_recv[0] < first_send):
            prev[source.rank] = first_recv[1]
    return tp_of, prev


def read_layout(sources: list) -> tuple:
    """(text, [(key, stages)]) of the logical models the dump's communication records describe
    (``--layout auto``): tensor-parallel groups from the all_reduce calls' groups, the pipeline
    stages in model order from the point-to-point calls. ConfigError when they do not cover
    every rank once."""
    tp_of, prev = _groups_of(sources)
    following = {before: rank for rank, before in prev.items()}
    ranks = sorted(source.rank for source in sources)
    models: dict = {}
    for head in (rank for rank in ranks if rank not in prev):
        chain, seen = [head], {head}
        while following.get(chain[-1]) is not None and following[chain[-1]] not in seen:
            chain.append(following[chain[-1]])
            seen.add(chain[-1])
        stages = tuple(tp_of.get(rank, (rank,)) for rank in chain)
        models.setdefault(min(stages[0]), stages)
    covered = sorted(rank for stages in models.values() for stage in stages for rank in stage)
    if covered != ranks:
        raise ConfigError(f"--layout auto: the dump's all_reduce groups and send/recv peers do not describe "
                          f"one layout of ranks {ranks} (they cover {covered}); give --layout tp=T,pp=P")
    ordered = [stages for _, stages in sorted(models.items())]
    text = f"tp={len(ordered[0][0])},pp={len(ordered[0])} (read from the dump)"
    return text, [((index, 0, 0), [list(stage) for stage in stages]) for index, stages in enumerate(ordered)]


def _checked(models: list, sources: list) -> list:
    """Warnings where a layout's tensor-parallel groups are not the dump's all_reduce groups."""
    tp_of, _ = _groups_of(sources)
    out = []
    for _, stages in models:
        for stage in stages:
            for rank in stage:
                said = tp_of.get(rank)
                if said is not None and sorted(said) != sorted(stage):
                    out.append(f"rank {rank}: the layout's tensor-parallel group is {stage}, its first all_reduce's "
                               f"group is {list(said)}")
    return out


def merge_dump_step(sources: list, layout: Optional[Layout], reference: Optional[dict] = None) -> list:
    """The :class:`MergedSource` of each logical model (data-parallel replica) of one step's rank
    sources under ``layout`` (None: read from the dump, :func:`read_layout`). ConfigError when the
    ranks do not fit the layout."""
    if layout is not None and layout.vpp != 1:
        raise ConfigError(f"layout {layout.text()}: virtual pipeline stages (vpp) are not merged yet")
    by_rank = {source.rank: source for source in sources}
    if None in by_rank or len(by_rank) != len(sources):
        raise ConfigError("a parallel layout needs rank directories (rank0, rank1, ...), one per rank")
    if sorted(by_rank) != list(range(len(by_rank))):
        raise ConfigError(f"a parallel layout needs ranks 0..{len(by_rank) - 1}, the dump has {sorted(by_rank)}")
    if layout is None:
        text, models = read_layout(sources)
        warnings = []
    else:
        try:
            text, models = layout.text(), layout.models(sorted(by_rank))
        except LayoutError as exc:
            raise ConfigError(str(exc)) from exc
        warnings = _checked(models, sources)
    out = []
    for index, (key, stages) in enumerate(models):
        stage_sources = [[by_rank[rank] for rank in stage] for stage in stages]
        data, parents, frames, report = merge_model(stage_sources, reference)
        first = stage_sources[0][0]
        raw = dict(first.document().raw)
        raw["data"] = data
        report.update({"layout": text, "model": index, "dp_cp_ep": list(key), "warnings": warnings,
                       "stages": [[source.rank for source in stage] for stage in stage_sources]})
        out.append(MergedSource(first.step, index, f"merged{index}" if len(models) > 1 else "merged",
                                first.url, DumpDocument(raw), parents, frames, report))
    return out
