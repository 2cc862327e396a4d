"""The logical model of a parallel run: its ranks merged by a :class:`~msprobe.format.parallel.Layout`
(spec/FORMAT.md section 26).

Per data-parallel replica, each pipeline stage's tensor-parallel ranks are merged record by
record, in the step's happens-before order over the stages (:func:`model_order`), under the
logical names (:func:`~msprobe.format.parallel.stage_renames`). Each tensor of a record is,
across the ranks of its tensor-parallel group:

* **partial**: a rank's partial sum before an ``all_reduce`` (a row-parallel matmul's output:
  its statistics are the all_reduce's input on that rank): not a shard; it takes the statistics
  of the all_reduce's result (the sum the single-card model computes);
* **sharded** or **replicated**, decided by shapes alone, never by values: what each rank holds
  against the other side's shape of the same tensor (the whole tensor of a single card, or what
  another layout's shards can make): a ``[16]`` leaf on 2 ranks against a ``[32]`` bench is a
  shard along dimension 0 whatever its values (zero-initialised biases, all-NaN gradients). A
  shard is merged exactly (:func:`~msprobe.format.parallel.merge_shard_stats`, NaN and Inf
  carried); replicas that differ are a finding (``replicas disagree``), the ranks that differ
  from the reference named. Where shapes cannot decide (no such tensor on the other side, or
  both readings fit), equal statistics are kept once and others joined along the last dimension.

Data-parallel replicas are joined into one logical model when the other side holds the whole
batch (:func:`join_replicas`): activations along the dimension the shapes name, parameters as
replicas; each replica's backward tensors are its own loss's (averaged over its share of the
batch, Megatron's convention), dp times the whole batch's: their statistics are divided by dp.
Context-parallel ranks (pieces of the sequence) are joined the same way; with dp and cp both > 1,
each replica's cp ranks first, then the replicas (two joins, backward divided by cp then by dp).

Communication records (``Distributed.*``) are the layout's own work, not the model's: left out
and listed. A module that appears on several stages under one name spans them: its inputs are
the first stage's, its outputs the last's (backward: the other way round).
"""
from __future__ import annotations

from typing import Any, Optional

from msprobe.errors import ConfigError
from msprobe.format.comm import comm_api
from msprobe.format.documents import DumpDocument
from msprobe.format.parallel import Layout, stage_renames
from msprobe.readers._merge_chunks import virtual_stages
from msprobe.readers._merge_experts import expert_groups, expert_names, join_experts, mark_unordered_tokens
from msprobe.readers._merge_layout import _cp_tokens, _ep_size, _records_of, layout_models, read_layout
from msprobe.readers._merge_leaf import (
    _anomalous,
    _averaging,
    _feeding_reduce,
    _grown,
    _is_backward,
    _leaves,
    _Merger,
    _partials,
    _shape,
)
from msprobe.readers._merge_order import _align, model_order
from msprobe.readers._merge_routes import TokenRoutes
from msprobe.readers._merge_tensors import PREFIX, TensorRecipes, tensor_views

__all__ = ["MergedSource", "merge_dump_step", "read_layout", "Layout", "model_order", "shapes_of", "other_shapes_of"]


def shapes_of(data: dict) -> dict:
    """{record: {leaf path: {shape}}} of one side's records taken as they are (a single card)."""
    return {name: {path: {_shape(leaf)} for path, leaf in _leaves(record)} for name, record in data.items()}


class MergedSource:
    """A record source holding the merged records of one logical model (one step)."""

    def __init__(self, step: Any, rank: Optional[int], rank_dir: str, url: str, document: DumpDocument,
                 parents: dict, frames: dict, report: dict, tensors: Optional[TensorRecipes] = None):
        self.step, self.rank, self.rank_dir, self.url = step, rank, rank_dir, url
        self._document, self._parents, self._frames = document, parents, frames
        self.report = report
        self.store = tensors  # reads the merged tensors (spec/FORMAT.md 26.6) as a store reads files

    @property
    def key(self) -> tuple:
        return ("merged", self.url, self.step, self.rank_dir)

    def document(self) -> DumpDocument:
        return self._document

    def raw_record(self, name: str) -> Any:
        return self._document.data.get(name)

    def tensor_key(self, data_name: str) -> str:
        if self.store is None or not str(data_name).startswith(PREFIX):
            raise ConfigError("this merged parallel layout holds statistics only (its ranks dumped no tensors): "
                              "compare it in statistics mode")
        return data_name + ".npy"  # what the recipe's store reads back (its name may end like a rank's file)

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


def _span(previous: dict, later: dict, name: str) -> dict:
    """A module record on several stages: inputs of the first stage, outputs of the last
    (backward: inputs, the gradients of its outputs, of the last stage, outputs of the first)."""
    merged = dict(previous)
    if name.endswith(".forward") or ".forward." in name:
        if "output" in later:
            merged["output"] = later["output"]
    else:  # a backward record's inputs are under "input" (the gradients of the module's outputs)
        for key in ("input", "input_args", "input_kwargs"):
            if key in later:
                merged[key] = later[key]
    return merged


def _rank_records(source: Any) -> dict:
    """All the records of a source's rank (a model chunk's view holds some: the partial sums of the
    rank's all_reduce calls are read from all of them)."""
    full = getattr(source, "full", None)
    return full if isinstance(full, dict) else _records_of(source)


def _hints(stages: list) -> Optional[list]:
    """The order hints of virtual pipeline stages (None for plain stages)."""
    hints = [getattr(stage[0], "order_hints", None) if stage else None for stage in stages]
    return hints if any(hint is not None for hint in hints) else None


def merge_model(stages: list, reference: Optional[dict] = None, other_shapes: Optional[dict] = None,
                peers: Optional[list] = None, factors: tuple = (1.0,), tensors: Optional[TensorRecipes] = None) -> tuple:
    """``stages``: [[source of each tp rank] per pipeline stage]; returns (data, parents, frames,
    report) of the logical model. ``reference``: the other side's records (statistics) under the
    logical names; ``other_shapes``: the other side's shapes (:func:`shapes_of`, or what its
    layout can make of its shards), which tell a shard from a replica; ``peers``: the stages of the
    other data-parallel replicas (the same tensor there tells a parameter from a piece of the batch);
    ``factors``: what a gradient may be divided by before its all_reduce (1, and dp); ``tensors``: the
    recipes of the merged tensors (a tensor dump)."""
    merge = _ModelMerge(stages, reference or {}, other_shapes, peers or [], factors)
    for merger in merge.mergers:
        merger.tensors = tensors
    return merge.run()


class _ModelMerge:
    """The state of one :func:`merge_model`: the stages' records, their order, names and mergers."""

    def __init__(self, stages: list, reference: dict, other_shapes: Optional[dict], peers: list,
                 factors: tuple) -> None:
        self.stages, self.reference = stages, reference
        self.peer_data = [[_records_of(stage[0]) for stage in replica] for replica in peers]
        self.findings: list = []
        self.left_out: list = []
        self.datas = [[_records_of(source) for source in stage] for stage in stages]
        self.ranks_of = [[source.rank for source in stage] for stage in stages]
        self.names = [[name for name in stage_data[0] if comm_api(name) is None] for stage_data in self.datas]
        self.averaging: list = [set() for _ in stages]
        if len(factors) > 1:  # the replicas' gradient averaging before their all_reduce: the layout's own work
            for stage, stage_data in enumerate(self.datas):
                full = _rank_records(stages[stage][0])
                self.averaging[stage] = _averaging(full, _partials(full)) & set(stage_data[0])
                self.names[stage] = [name for name in self.names[stage] if name not in self.averaging[stage]]
                self.left_out.extend({"rank": self.ranks_of[stage][0], "record": name}
                                     for name in sorted(self.averaging[stage]))
        self.maps, lone = self._aligned()
        self.order = self._order(lone)
        self.renames = stage_renames(self.names, self.order)
        self.mergers = [self._merger(stage, other_shapes, factors) for stage in range(len(stages))]
        self.data: dict = {}
        self.stage_held: dict = {}
        self.parents: dict = {}
        self.frames: dict = {}
        self.provenance: dict = {}
        self.local_parents = [_parents(stage[0]) for stage in stages]

    def _aligned(self) -> tuple:
        """([[{base name: the rank's name}] per member] per stage, {(stage, base name before it or None):
        [(member, name)] of the records one rank alone holds})."""
        maps: list = []
        lone: dict = {}
        for stage, stage_data in enumerate(self.datas):
            stage_maps = []
            for member, held in enumerate(stage_data):
                mapping, extras = _align(self.names[stage], [name for name in held if comm_api(name) is None
                                                             and name not in self.averaging[stage]],
                                         stage_data[0], held)
                stage_maps.append(mapping)
                for anchor, name in extras:
                    lone.setdefault((stage, anchor), []).append((member, name))
            maps.append(stage_maps)
        return maps, lone

    def _order(self, lone: dict) -> list:
        """[(stage, name) or (stage, name, rank of a lone record)] in the step's order."""
        order: list = []
        for stage in range(len(self.stages)):
            order.extend((stage, name, self.ranks_of[stage][member]) for member, name in lone.get((stage, None), []))
        kept = [{name: record for name, record in stage_data[0].items() if name not in self.averaging[index]}
                for index, stage_data in enumerate(self.datas)]
        for stage, name in model_order(self.ranks_of, kept, _hints(self.stages)):
            order.append((stage, name))
            order.extend((stage, extra, self.ranks_of[stage][member]) for member, extra in lone.get((stage, name), []))
        return order

    def _merger(self, stage: int, other_shapes: Optional[dict], factors: tuple) -> "_Merger":
        sources, stage_data, ranks = self.stages[stage], self.datas[stage], self.ranks_of[stage]
        self.left_out.extend({"rank": source.rank, "record": name} for source, held in zip(sources, stage_data)
                             for name in held if comm_api(name) is not None
                             and {"rank": source.rank, "record": name} not in self.left_out)
        fulls = [_rank_records(source) for source in sources]
        merger = _Merger([[rank] for rank in ranks], self.reference, other_shapes, self.findings,
                         [_partials(full, factors) for full in fulls])
        if len(self.stages) > 1 or len(ranks) > 1:
            merger.partial_values = [_feeding_reduce(full) for full in fulls]
        return merger

    def run(self) -> tuple:
        for stage, name, *alone in self.order:
            if alone:
                self._lone(stage, name, alone[0])
            else:
                self._merged(stage, name)
        position = {name: index for index, name in enumerate(self.data)}
        self.findings.sort(key=lambda finding: position.get(finding["record"], len(position)))  # the model's order
        report = {"findings": self.findings, "communication_left_out": len(self.left_out), "records": self.provenance}
        return self.data, self.parents, self.frames, report

    def _lone(self, stage: int, name: str, rank: int) -> None:
        """A record of one rank alone: kept as it is, a finding."""
        member = self.ranks_of[stage].index(rank)
        logical = self.renames[stage][(rank, name)]
        record = self.datas[stage][member][name]
        self.findings.append({"record": logical, "leaf": "", "finding": f"record on rank {rank} alone of its "
                              f"tensor-parallel group {self.ranks_of[stage]}", "ranks": [rank],
                              "differ_from_bench": [], "values": {}})
        kinds = {path: "on one rank only" for path, _ in _leaves(record)}
        suspects = {path: [rank] for path, leaf in _leaves(record) if _anomalous(leaf)}
        source = self.stages[stage][member]
        self._place(stage, name, logical, record, _parents(source).get(name), source)
        self._note(stage, name, logical, [rank], kinds, suspects, [])

    def _merged(self, stage: int, name: str) -> None:
        logical = self.renames[stage][name]
        nodes = [d.get(m[name]) if name in m else None for d, m in zip(self.datas[stage], self.maps[stage])]
        record, kinds, suspects = self.mergers[stage].record(logical, nodes,
                                                             [replica[stage].get(name) for replica in self.peer_data])
        self._place(stage, name, logical, record, self.local_parents[stage].get(name), self.stages[stage][0])
        ranks = [rank for rank, node in zip(self.ranks_of[stage], nodes) if node is not None]
        self._note(stage, name, logical, ranks, kinds, suspects,
                   [rank for rank, node in zip(self.ranks_of[stage], nodes) if node is None])

    def _place(self, stage: int, name: str, logical: str, record: Any, parent: Optional[str], source: Any) -> None:
        """The record in the logical model (a module on several stages spanning them), its parent, frames."""
        data = self.data
        if logical in data and isinstance(data[logical], dict) and isinstance(record, dict):
            earlier = self.stage_held[logical]
            record = _span(data[logical], record, logical) if earlier <= stage else _span(record, data[logical],
                                                                                           logical)
            data.pop(logical)  # a module spanning stages is written when it ends: on the last of them
        data[logical] = record
        self.stage_held[logical] = min(stage, self.stage_held.get(logical, stage))
        if parent is not None or name in self.local_parents[stage]:  # parameters_grad stays outside the tree
            self.parents[logical] = self.renames[stage].get(parent, parent) if parent is not None else None
        self.frames.setdefault(logical, (source, name))

    def _note(self, stage: int, name: str, logical: str, ranks: list, kinds: dict, suspects: dict,
              missing: list) -> None:
        """The record's provenance: its stages, ranks, leaves' kinds and suspects."""
        entry = self.provenance.setdefault(logical, {"stages": [], "ranks": [], "leaves": {}, "suspects": [],
                                                     "leaf_suspects": {}, "names": {}})
        if stage not in entry["stages"]:
            entry["stages"].append(stage)
        entry["ranks"] = sorted(set(entry["ranks"]) | set(ranks))
        entry["names"][str(stage)] = name
        entry["leaves"].update(kinds)
        for path, found in suspects.items():
            entry["leaf_suspects"][path] = sorted(set(entry["leaf_suspects"].get(path, [])) | set(found))
        entry["suspects"] = sorted({rank for found in entry["leaf_suspects"].values() for rank in found})
        if missing:
            entry["missing_on"] = missing


def model_shapes(stages: list) -> dict:
    """{logical record: {leaf path: shapes}} the ranks of one logical model can make of each
    tensor (its own shape on one rank, or its tensor-parallel ranks' pieces joined along any
    dimension): the other side's hint when both sides are merged (layout against layout)."""
    datas = [[_records_of(source) for source in stage] for stage in stages]
    ranks_of = [[source.rank for source in stage] for stage in stages]
    names = [[name for name in stage_data[0] if comm_api(name) is None] for stage_data in datas]
    renames = stage_renames(names, model_order(ranks_of, [stage_data[0] for stage_data in datas], _hints(stages)))
    out: dict = {}
    for stage, stage_data in enumerate(datas):
        for name in names[stage]:
            entry = out.setdefault(renames[stage][name], {})
            for path, leaf in _leaves(stage_data[0][name]):
                entry.setdefault(path, set()).update(_grown({_shape(leaf)}, len(stage_data)))
    return out


def _parents(source: Any) -> dict:
    try:
        return source.parents() or {}
    except Exception:  # noqa: BLE001 - no construct.json: no tree
        return {}


def _stage_sources(by_rank: dict, stages: list, vpp: int) -> list:
    """[[source of each tp rank] per stage] of a logical model (per virtual stage when vpp > 1)."""
    physical = [[by_rank[rank] for rank in stage] for stage in stages]
    return virtual_stages(physical, vpp) if vpp > 1 else physical


def other_shapes_of(sources: list, layout: Optional[Layout]) -> dict:
    """What one side can make of each tensor under its layout (:func:`model_shapes` of its first
    logical model)."""
    by_rank = {source.rank: source for source in sources}
    _, models, _, vpp = layout_models(sources, layout)
    return model_shapes(_stage_sources(by_rank, models[0][1], vpp))


def join_replicas(models: list, reference: dict, other_shapes: dict, tensors: Optional[TensorRecipes] = None,
                  balanced: int = 0) -> tuple:
    """One logical model of the data-parallel replicas' merged models ``[(data, parents, frames,
    report)]``: each tensor joined along the batch (the dimension the other side's shape names) or
    kept once (parameters, reduced gradients) by :class:`_Merger`; backward statistics of joined
    tensors divided by the number of replicas (each replica's loss averages its own share); a
    scalar that differs across the replicas (each one's loss, a mean over its share) is their mean.
    A record that only some replicas hold (a fault's ``masked_fill``) is kept as it is, in its place.
    ``balanced``: the replicas are context-parallel ranks, each holding this many tokens of a sequence
    (Megatron's load-balanced chunks: their tensors are put in sequence order), else 0."""
    reports = [model[3] for model in models]
    members = [sorted({rank for entry in report["records"].values() for rank in entry["ranks"]}) for report in reports]
    findings: list = []
    merger = _Merger(members, reference, other_shapes, findings, scale_backward=float(len(models)))
    merger.tensors, merger.balanced = tensors, balanced
    first_data, parents, frames, _ = models[0]
    base = list(first_data)
    maps: list = []
    lone: dict = {}
    for index, model in enumerate(models):
        mapping, extras = _align(base, list(model[0]))
        maps.append(mapping)
        for anchor, name in extras:
            lone.setdefault(anchor, []).append((index, name))
    order = [(None, index, name) for index, name in lone.get(None, [])]
    for name in base:
        order.append((name, None, None))
        order.extend((None, index, extra) for index, extra in lone.get(name, []))
    data: dict = {}
    provenance: dict = {}
    for name, alone, extra in order:
        if name is None:  # a record of some replicas alone
            logical = extra if extra not in data else f"{extra}@replica{alone}"
            data[logical] = models[alone][0][extra]
            entry = dict(reports[alone]["records"].get(extra) or {"ranks": members[alone], "leaf_suspects": {}})
            findings.append({"record": logical, "leaf": "", "finding": f"record on data-parallel replica {alone} "
                             f"alone", "ranks": entry["ranks"], "differ_from_bench": [], "values": {}})
            if extra in models[alone][1]:
                parents.setdefault(logical, models[alone][1][extra])
            frames.setdefault(logical, models[alone][2].get(extra))
            provenance[logical] = entry
            continue
        data[name], provenance[name] = _joined(name, models, reports, maps, members, merger, findings)
    findings = [f for report in reports for f in report["findings"]] + findings
    position = {name: index for index, name in enumerate(data)}
    findings.sort(key=lambda finding: position.get(finding["record"], len(position)))
    report = {"findings": findings, "records": provenance,
              "communication_left_out": sum(r["communication_left_out"] for r in reports)}
    return data, parents, frames, report


def _joined(name: str, models: list, reports: list, maps: list, members: list, merger: "_Merger",
            findings: list) -> tuple:
    """(record, provenance entry) of one record every (or some) data-parallel replica holds."""
    nodes = [model[0].get(mapping[name]) if name in mapping else None for model, mapping in zip(models, maps)]
    entries = [report["records"].get(mapping[name]) if name in mapping else None
               for report, mapping in zip(reports, maps)]
    kinds: dict = {}
    suspects: dict = {}
    if any(node is None for node in nodes):
        record = models[0][0][name]
        findings.append({"record": name, "leaf": "", "finding": "record not on every data-parallel replica",
                         "ranks": [rank for member, node in zip(members, nodes) if node is not None
                                   for rank in member], "differ_from_bench": [], "values": {}})
    else:  # each replica named by the ranks holding this record
        merger.members = [e["ranks"] if e else member for e, member in zip(entries, members)]
        record, kinds, suspects = merger.record(name, nodes)
    entry = dict(entries[0] or {})
    entry["ranks"] = sorted(rank for e in entries if e for rank in e["ranks"])
    entry["stages"] = sorted({stage for e in entries if e for stage in e.get("stages", [])})
    leaf_suspects: dict = {}
    for e in entries:
        for path, found in (e or {}).get("leaf_suspects", {}).items():
            leaf_suspects[path] = sorted(set(leaf_suspects.get(path, [])) | set(found))
    entry["leaves"] = dict(entry.get("leaves", {}), **{p: f"data parallel: {k}" for p, k in kinds.items()})
    for path, found in suspects.items():
        inner = [rank for rank in leaf_suspects.get(path, []) if rank in found]
        leaf_suspects[path] = inner or found
    entry["leaf_suspects"] = leaf_suspects
    entry["suspects"] = sorted({rank for found in leaf_suspects.values() for rank in found})
    return record, entry


def _shrunk(shapes: set, degree: int) -> set:
    """``shapes`` and each of them with one dimension divided by ``degree`` (what one of ``degree``
    data-parallel replicas may hold of a tensor of the whole batch)."""
    out = set(shapes)
    for shape in shapes:
        for dim in range(len(shape)):
            if shape[dim] % degree == 0:
                out.add(shape[:dim] + (shape[dim] // degree,) + shape[dim + 1:])
    return out


def _shrunk_shapes(other_shapes: Optional[dict], degrees: tuple) -> dict:
    """``other_shapes`` with each shape :func:`_shrunk` by each of ``degrees`` in turn (what one
    member of the data-parallel (and context-parallel) joins may hold)."""
    out: dict = {}
    for name, paths in (other_shapes or {}).items():
        out[name] = {}
        for path, shapes in paths.items():
            for degree in degrees:
                shapes = _shrunk(shapes, degree)
            out[name][path] = shapes
    return out


def _holds_a_piece(sources: list, other_shapes: Optional[dict], degrees: tuple) -> bool:
    """Whether data-parallel (or context-parallel) replicas hold pieces of the other side's batch:
    the first tensor input of the first stage's first rank is, joined ``degrees[0]`` times along a
    dimension (then ``degrees[1]`` times along another: dp x cp), the other side's, and not the
    other side's as it is."""
    if not other_shapes or all(degree < 2 for degree in degrees):
        return False
    for name, record in _records_of(sources[0]).items():
        if _is_backward(name) or comm_api(name) is not None:
            continue
        for path, leaf in _leaves(record):
            wanted = other_shapes.get(name, {}).get(path)
            if not wanted or not path.startswith("input"):
                continue
            shape = _shape(leaf)
            grown = {shape}
            for degree in degrees:
                grown = _grown(grown, degree)
            return shape not in wanted and bool(grown & wanted)
    return False


def _expert_blocks(replicas: list, heads: list, ep: int, text: str) -> list:
    """[[index of each model of an expert-parallel group, in rank order]] in rank order: the models
    whose first rank calls its first all_to_all over the same ranks (else of one (dp, cp) index)."""
    if len(replicas) % ep:
        raise ConfigError(f"layout {text}: expert parallel needs dp a multiple of ep; this layout has "
                          f"{len(replicas)} models")
    groups: dict = {}
    for index, ((key, _), head) in enumerate(zip(replicas, heads)):
        groups.setdefault(expert_groups(_records_of(head)) or tuple(key[:2]), []).append(index)
    if any(len(members) != ep for members in groups.values()):
        raise ConfigError(f"layout {text}: the ranks' all_to_all groups {sorted(groups)} are not groups of ep={ep} ranks")
    return [sorted(members, key=lambda i: heads[i].rank) for _, members in
            sorted(groups.items(), key=lambda item: min(heads[i].rank for i in item[1]))]


def _by_expert(replicas: list, block: list, count: int, raws: list, ranks: list, wanted: tuple,
               reference: dict) -> tuple:
    """([shapes], [reference]) per model of an expert-parallel group whose stages have several ranks:
    the other side's shapes and statistics of the same expert under each rank's own names (read from
    a first merge, which leaves out what the layout does as the merge proper does); ``wanted``: the
    shapes of what one rank holds and of what one group holds."""
    each = [merge_model(replicas[i][1], None, wanted[0], [replicas[j][1] for j in block if j != i],
                        (1.0, float(count))) for i in block]
    names = expert_names(each, raws, ranks)
    shapes = [{name: wanted[1 if expert else 0].get(logical, {}) for name, (logical, expert) in found.items()}
              for found in names]
    references = [{name: reference[logical] for name, (logical, _) in found.items() if logical in reference}
                  for found in names]
    return shapes, references


def _experts_count(data: dict) -> int:
    """The number of experts of a merged model's MoE layers (its global expert indices)."""
    found = [int(name.split(".local_experts.", 1)[1].split(".", 1)[0]) for name in data
             if name.startswith("Module.") and ".local_experts." in name]
    return max(found) + 1 if found else 0


def _experts_merged(replicas: list, ep: int, text: str, warnings: list, reference: Optional[dict],
                    other_shapes: Optional[dict], tensors: Optional[TensorRecipes]) -> "MergedSource":
    """The logical model of expert-parallel groups (spec/FORMAT.md 26.8): each expert-parallel rank's
    model (its pipeline stages merged by :func:`merge_model`) joined with the others of its group by
    :func:`~msprobe.readers._merge_experts.join_experts` (its shared records as data-parallel
    replicas), then the groups joined as data-parallel replicas (the expert data-parallel ranks: the
    same experts on other shares of the batch). With tensor parallel inside an expert-parallel group
    (expert tensor parallel) in tensor mode, the MoE layers' tokens are not put in the card's order:
    their tensors are named unordered (:func:`mark_unordered_tokens`; ``unordered_tensors`` in the
    report: how many leaves). A group is the models whose first rank calls its first all_to_all
    over the same ranks, in rank order (the layout's (dp, cp) index where the ranks call none)."""
    heads = [stages[0][0] for _, stages in replicas]
    blocks = _expert_blocks(replicas, heads, ep, text)
    per_rank, per_block = _shrunk_shapes(other_shapes, (len(heads),)), _shrunk_shapes(other_shapes, (len(blocks),))
    merged = []
    expert_tp = any(len(stage) > 1 for _, stages in replicas for stage in stages)
    for block in blocks:
        raws = [[_rank_records(stage[0]) for stage in replicas[i][1]] for i in block]
        ranks = [[[source.rank for source in stage] for stage in replicas[i][1]] for i in block]
        shapes, references = [per_rank] * len(block), [reference] * len(block)
        if expert_tp:  # expert tensor parallel
            shapes, references = _by_expert(replicas, block, len(heads), raws, ranks, (per_rank, per_block),
                                            reference or {})
        each = [merge_model(replicas[i][1], known, wanted, [replicas[j][1] for j in block if j != i],
                            (1.0, float(len(heads))), tensors) for i, wanted, known in zip(block, shapes, references)]

        def join(models: list) -> tuple:
            return join_replicas(models, reference or {}, per_block, tensors)

        merged.append(join_experts(each, raws, ranks, join, tensors))
    if len(merged) == 1:
        data, parents, frames, report = merged[0]
    else:  # the expert data-parallel replicas: the groups on their shares of the batch
        data, parents, frames, report = join_replicas(merged, reference or {}, other_shapes or {}, tensors)
        report["experts"] = merged[0][3]["experts"]
    unordered = reordered = 0
    if expert_tp and tensors is not None:  # the MoE layers' tokens in the card's order (spec/FORMAT.md 26.8)
        routes = None
        if len(blocks) == 1 and all(len(replicas[i][1]) == 1 for i in blocks[0]):  # one group, no pipeline
            routes = TokenRoutes([replicas[i][1][0] for i in blocks[0]], tensors, _experts_count(data))
        data, reordered, unordered = mark_unordered_tokens(data, parents, tensors, routes)
    first = heads[0]
    raw = dict(first.document().raw)
    raw["data"] = data
    report.update({"layout": text, "model": 0, "dp_cp_ep": [list(key) for key, _ in replicas], "warnings": warnings,
                   "unordered_tensors": unordered, "reordered_tensors": reordered,
                   "stages": [[source.rank for i in block for source in replicas[i][1][stage]]
                              for block in blocks for stage in range(len(replicas[block[0]][1]))],
                   "replicas": [[[source.rank for source in stage] for stage in stages] for _, stages in replicas]})
    return MergedSource(first.step, None, "merged", first.url, DumpDocument(raw), parents, frames, report, tensors)


def merge_dump_step(sources: list, layout: Optional[Layout], reference: Optional[dict] = None,
                    other_shapes: Optional[dict] = None) -> list:
    """The :class:`MergedSource` of each logical model of one step's rank sources under ``layout``
    (None: read from the dump, :func:`read_layout`); the data-parallel replicas (and context-parallel
    ranks) joined into one when they hold pieces of the other side's batch (and sequence). ``reference``: the other side's records;
    ``other_shapes``: its shapes (default: those of ``reference``). ConfigError when the ranks do
    not fit the layout."""
    recipes = TensorRecipes()
    viewed = tensor_views(sources, recipes)
    tensors = recipes if any(view is not source for view, source in zip(viewed, sources)) else None
    sources = viewed
    text, models, warnings, vpp = layout_models(sources, layout)
    by_rank = {source.rank: source for source in sources}
    if other_shapes is None and reference:
        other_shapes = shapes_of(reference)
    replicas = [(key, _stage_sources(by_rank, stages, vpp)) for key, stages in models]
    ep = _ep_size(sources, layout)
    dps, cps = sorted({key[0] for key, _ in models}), sorted({key[1] for key, _ in models})
    if ep > 1 and len(cps) > 1:  # each context-parallel rank's experts get tokens of its sequence chunks
        raise ConfigError(f"layout {text}: expert parallelism with context parallelism is not merged (the "
                          "experts' tokens of each sequence chunk cannot be put back in one card's order); "
                          "compare the ranks without --layout, or a run without context parallelism")
    if ep > 1:
        return [_experts_merged(replicas, ep, text, warnings, reference, other_shapes, tensors)]
    degrees = (len(dps), len(cps)) if len(dps) > 1 and len(cps) > 1 else (len(replicas),)
    if _holds_a_piece([stage[0] for stage in replicas[0][1]], other_shapes, degrees):
        tokens = _cp_tokens(replicas[0][1][0][0], len(cps)) if len(cps) > 1 and tensors is not None else 0
        return [_pieces_joined(replicas, degrees, dps, reference, other_shapes, tensors, text, warnings, tokens)]
    return _models_apart(replicas, reference, other_shapes, tensors, text, warnings)


def _pieces_joined(replicas: list, degrees: tuple, dps: list, reference: Optional[dict], other_shapes: Optional[dict],
                   tensors: Optional[TensorRecipes], text: str, warnings: list, tokens: int = 0) -> "MergedSource":
    """The one logical model of replicas holding pieces of the other side's batch (and sequence);
    ``tokens``: a context-parallel rank's tokens of a sequence (its tensors' chunks put in sequence
    order), 0 without context parallelism or tensors."""
    first = replicas[0][1][0][0]
    wanted = _shrunk_shapes(other_shapes, degrees)
    each = [merge_model(stages, reference, wanted, [other for j, (_, other) in enumerate(replicas) if j != i],
                        (1.0, float(len(replicas))), tensors) for i, (_, stages) in enumerate(replicas)]
    if len(degrees) == 2:  # dp x cp: each replica's cp ranks along the sequence, then the replicas
        by_dp = [[model for (key, _), model in zip(replicas, each) if key[0] == d] for d in dps]
        per_dp = _shrunk_shapes(other_shapes, degrees[:1])
        each = [join_replicas(group, reference or {}, per_dp, tensors, tokens) for group in by_dp]
        tokens = 0  # then the data-parallel replicas, along the batch
    data, parents, frames, report = join_replicas(each, reference or {}, other_shapes or {}, tensors,
                                                  tokens if len(dps) == 1 else 0)
    raw = dict(first.document().raw)
    raw["data"] = data
    report.update({"layout": text, "model": 0, "dp_cp_ep": [list(key) for key, _ in replicas],
                   "warnings": warnings, "stages": [[s.rank for s in stage] for _, stages in replicas
                                                    for stage in stages],
                   "replicas": [[[s.rank for s in stage] for stage in stages] for _, stages in replicas]})
    return MergedSource(first.step, None, "merged", first.url, DumpDocument(raw), parents, frames, report, tensors)


def _models_apart(replicas: list, reference: Optional[dict], other_shapes: Optional[dict],
                  tensors: Optional[TensorRecipes], text: str, warnings: list) -> list:
    """One merged model per (dp, cp, ep) index (the other side holds one replica's batch)."""
    out = []
    for index, (key, stage_sources) in enumerate(replicas):
        data, parents, frames, report = merge_model(stage_sources, reference, other_shapes, tensors=tensors)
        head = stage_sources[0][0]
        raw = dict(head.document().raw)
        raw["data"] = data
        report.update({"layout": text, "model": index, "dp_cp_ep": list(key), "warnings": warnings,
                       "stages": [[source.rank for source in stage] for stage in stage_sources]})
        out.append(MergedSource(head.step, None, f"merged{index}" if len(replicas) > 1 else "merged",
                                head.url, DumpDocument(raw), parents, frames, report, tensors))
    return out
