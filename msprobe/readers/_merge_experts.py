"""Expert parallelism (``ep``, spec/FORMAT.md section 26.8): the ranks of an expert-parallel group
each hold their share of the batch for the dense part of the model (data-parallel replicas) and
their own experts (``local_experts.<i>``, global expert ``ep_rank * local + i``), the tokens sent to
the experts' ranks and back with ``all_to_all``. Their logical model is the one card holding every
expert on the whole batch:

* an **expert record** is a record after an ``all_to_all`` (the dispatch forward, the combine's
  reverse backward), before the experts' container's module record that ends their work, that
  belongs to one local expert: a module record naming ``local_experts.<i>``, an API record the
  expert whose record follows it there. It is that expert's whole record, on its
  rank alone: renamed to the global expert, kept as it is (a shard of the set of experts, neither
  a replica nor a piece of the batch), its backward statistics divided by the group's size (each
  rank's loss averages its own share of the batch, Megatron's convention);
* the records after the rank's last backward record that take an expert's parameters or
  gradients (its optimizer's unscale, clip and update), followed from the expert's
  ``parameters_grad`` through the records' outputs (not through a collective over several
  ranks: its result is the group's), are that expert's too (a value that goes into an all_reduce
  there is a partial sum of the group's expert norms: not compared);
* every other record (the router, the experts' container taking the tokens of all local experts,
  the dense layers) is the ranks' data-parallel replicas, joined (:func:`join_replicas`).

The logical order: the shared records in their order, each run of expert records that follows one
of them ordered by layer and global expert (descending in backward runs: autograd runs the experts
last created first), as one card holding all runs them; API call counts renumbered in that order.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Optional

from msprobe.errors import ConfigError
from msprobe.format.comm import comm_api, comm_call
from msprobe.format.parallel import merge_shard_stats
from msprobe.format.stats import STAT_KEYS
from msprobe.readers._merge_leaf import (
    _anomalous,
    _feeding_reduce,
    _is_backward,
    _last_backward,
    _leaves,
    _same,
    _signature,
)

__all__ = ["join_experts", "expert_groups", "expert_names", "mark_unordered_tokens"]

_EXPERT = re.compile(r"^(?P<layer>.*?)\.local_experts\.(?P<i>\d+)(?=\.)")
_API = re.compile(r"^(?P<head>[^.]+\.[^.]+(?:\.[^.]+)*?)\.(?P<n>\d+)\.(?P<dir>forward|backward)$")
_A2A = ("all_to_all", "all_to_all_single")


def expert_groups(data: dict) -> Optional[tuple]:
    """The group of a rank's first all_to_all call (its expert-parallel group), else None."""
    for index, (name, record) in enumerate(data.items()):
        found = comm_api(name)
        if found is not None and found[0] in _A2A:
            call = comm_call(name, record, -1, index)
            if call is not None and call.group:
                return tuple(call.group)
    return None


def _expert_of_name(name: str) -> Optional[tuple]:
    found = _EXPERT.match(name) if name.startswith("Module.") else None
    return (found.group("layer"), int(found.group("i"))) if found else None


def _segments(data: dict) -> tuple:
    """({record name: (layer, local expert) or None}, {the experts' containers' module records}) of
    the records after an all_to_all up to the next one or the first module record of no one expert
    after an expert's (the experts' container, which ends the experts' work; the first layer's
    dispatch has no backward all_to_all when its input needs no gradient, and there a module's
    backward record may come before its work): None for a record there of no one expert; a
    container is a module record there of the module holding ``local_experts``."""
    out: dict = {}
    run: list = []
    inside = seen = False
    for name in data:
        found = comm_api(name)
        if found is not None:
            if found[0] in _A2A:
                _attribute(run, out)
                run, inside, seen = [], True, False
            continue
        if not inside:
            continue
        run.append(name)
        own = _expert_of_name(name)
        seen = seen or own is not None
        if seen and own is None and name.startswith("Module."):
            _attribute(run, out)
            run, inside = [], False
    _attribute(run, out)
    for name in out:  # an API call's backward record is its forward call's expert's
        if name.endswith(".backward") and not name.startswith("Module."):
            forward = out.get(name[:-len("backward")] + "forward")
            if forward is not None:
                out[name] = forward
    layers = {found[0] for found in out.values() if found is not None}
    containers = {name for name, found in out.items() if found is None and name.startswith("Module.")
                  and any(name.startswith(layer + ".") for layer in layers)}
    return out, containers


def _attribute(run: list, out: dict) -> None:
    """Each record of a run its expert: its own name's, else the next one naming an expert."""
    following = None
    for name in reversed(run):
        own = _expert_of_name(name)
        if own is not None:
            following = own
            out[name] = own
        elif name.startswith("Module."):
            out[name] = None  # a module of no one expert: the container of the local experts
            following = None
        else:
            out[name] = following


def _tail(data: dict, seeds: dict, group: tuple = ()) -> dict:
    """{record name: (layer, local expert)} of the records after the last backward record that take
    what an expert's ``parameters_grad`` holds or what such records made (their outputs; not a
    collective over several ranks of the expert-parallel ``group``, or over the default group: its
    result is the group's, while one over the expert data-parallel ranks, holding the same expert,
    is still the expert's)."""
    names = list(data)
    last = _last_backward(names)
    known: dict = {}
    for name, expert in seeds.items():
        if name.endswith("parameters_grad"):
            for _, leaf in _leaves(data.get(name)):
                known[_signature(leaf)] = expert
    out: dict = {}
    for name in names[last + 1:] if last >= 0 else ():
        record = data[name]
        if not isinstance(record, dict):
            continue
        inputs = [leaf for key in ("input_args", "input_kwargs") for _, leaf in _leaves(record.get(key))]
        tags = [known[_signature(leaf)] for leaf in inputs if _signature(leaf) in known]
        if not tags:
            continue
        expert = tags[-1]
        if comm_api(name) is None:
            out[name] = expert
        else:
            call = comm_call(name, record, -1, 0)
            if call is not None and (call.group is None or len(set(call.group) & set(group)) > 1):
                continue  # a collective over the expert-parallel group: its result is the group's, not one expert's
        for _, leaf in _leaves(record.get("output")):
            known[_signature(leaf)] = expert
    return out


def _leafwise(node: Any, change: Callable) -> Any:
    """``node`` with ``change(leaf)`` for each tensor leaf (the md5 dropped: no longer its bytes')."""
    if isinstance(node, dict) and "dtype" in node and "shape" in node:
        out = change(node)
        if out is not node:
            out.pop("md5", None)
        return out
    if isinstance(node, dict):
        return {key: _leafwise(value, change) for key, value in node.items()}
    if isinstance(node, list):
        return [_leafwise(value, change) for value in node]
    return node


def _nulled(node: Any, partial: set) -> Any:
    """``node`` with the statistics (and the tensor) of each leaf in ``partial`` (signatures) left out."""
    def change(leaf: dict) -> dict:
        if _signature(leaf) not in partial:
            return leaf
        out = dict(leaf, **{stat: None for stat in STAT_KEYS})
        out.pop("data_name", None)
        return out
    return _leafwise(node, change)


def _divided(node: Any, by: float, tensors: Any = None) -> Any:
    """``node``'s statistics divided by ``by`` (its tensors too: ``tensors``' recipes, else none)."""
    def change(leaf: dict) -> dict:
        out = dict(leaf, **{stat: leaf[stat] / by for stat in STAT_KEYS if isinstance(leaf.get(stat), float)})
        made = tensors.scaled(leaf.get("data_name"), by) if tensors is not None else None
        if made is None:
            out.pop("data_name", None)
        else:
            out["data_name"] = made
        return out
    return _leafwise(node, change)


def _concat(nodes: list, divisor: float, tensors: Any = None) -> Any:
    """The members' tensors joined along their first dimension (each rank's tokens of its own
    experts: shards of the set, whatever their values), their statistics divided by ``divisor``."""
    first = nodes[0]
    if isinstance(first, dict) and "dtype" in first and "shape" in first:
        if not all(isinstance(node, dict) and "shape" in node for node in nodes):
            return first
        merged = merge_shard_stats(nodes, 0)
        if divisor != 1.0:
            merged.update({stat: merged[stat] / divisor for stat in STAT_KEYS if isinstance(merged.get(stat), float)})
        made = tensors.made("cat", [node.get("data_name") for node in nodes], 0, divisor) if tensors is not None else None
        if made is not None:
            merged["data_name"] = made
        return merged
    if isinstance(first, dict):
        return {key: _concat([node.get(key) if isinstance(node, dict) else None for node in nodes], divisor, tensors)
                for key in first}
    if isinstance(first, list):
        return [_concat([node[i] if isinstance(node, list) and i < len(node) else None for node in nodes], divisor,
                        tensors) for i in range(len(first))]
    return first


def _order(datas: list, experts: list) -> list:
    """[(replica or None, name)]: the shared records (replica 0's) in order, after each the runs of
    expert records of every replica that follow it, by layer and global expert."""
    layers: dict = {}
    for found in experts:
        for layer, _ in found.values():
            layers.setdefault(layer, len(layers))
    runs: dict = {}
    for replica, (data, found) in enumerate(zip(datas, experts)):
        anchor = None
        for name in data:
            if name in found:
                runs.setdefault(anchor, []).append((replica, name))
            else:
                anchor = name
    local = max((i for found in experts for _, i in found.values()), default=0) + 1

    def run_of(anchor: Optional[str]) -> list:
        items = runs.get(anchor, [])
        backward = all(_is_backward(name) for _, name in items)
        sign = -1 if backward else 1

        def key(item: tuple) -> tuple:
            layer, i = experts[item[0]][item[1]]
            return (sign * layers[layer], sign * (item[0] * local + i))
        return [(replica, name) for replica, name in sorted(items, key=key)]

    out = run_of(None)
    for name in datas[0]:
        if name in experts[0]:
            continue
        out.append((None, name))
        out.extend(run_of(name))
    return out


def _chained_tail(data: dict, experts: dict, report: dict) -> dict:
    """``data`` with its tail (the records after its last backward record) in the order of one card
    running Megatron's chained optimizer: each pipeline stage's tail alternates blocks of records of
    no expert (the dense parameters' pass: unscale, norms, clip, update) and blocks of expert records
    (the same pass over the experts); the card runs each block over every stage's parameters before
    the next, so block k of every stage, in stage order, comes before block k + 1 (as it was where the
    stages' tails do not alternate alike)."""
    names = list(data)
    last = _last_backward(names)
    per_stage: dict = {}
    seen: dict = {}  # API -> [the tensors of an earlier stage's tail record of it]
    for name in names[last + 1:]:
        stages = report["records"].get(name, {}).get("stages") or [0]
        api = _API.match(name)
        leaves = [leaf for _, leaf in _leaves(data[name])]
        known = bool(leaves) and all(leaf.get(stat) is not None for leaf in leaves for stat in STAT_KEYS)
        if api and name not in experts and known and any(
                len(other) == len(leaves) and all(_same(a, b) for a, b in zip(leaves, other))
                for stage, other in seen.get(api.group("head"), []) if stage < min(stages)):
            continue  # every stage computing the same value of the groups' sums (the chained clip's total norm)
        if api:
            seen.setdefault(api.group("head"), []).append((min(stages), leaves))
        blocks = per_stage.setdefault(min(stages), [])
        kind = name in experts
        if not blocks or blocks[-1][0] != kind:
            blocks.append((kind, []))
        blocks[-1][1].append(name)
    shapes = {tuple(kind for kind, _ in blocks) for blocks in per_stage.values()}
    if len(per_stage) < 2 or len(shapes) != 1:
        return {name: data[name] for name in names[:last + 1] + [n for blocks in per_stage.values()
                                                                   for _, block in blocks for n in block]} \
            if len(per_stage) < 2 else data
    tail = [name for k in range(len(shapes.pop())) for stage in sorted(per_stage) for name in per_stage[stage][k][1]]
    return {name: data[name] for name in names[:last + 1] + tail}


def _renames(order: list, experts: list, local: int) -> dict:
    """{(replica or None, name): logical name}: experts' modules under their global index, API call
    counts renumbered in ``order`` (a backward record takes its forward call's number)."""
    counts: dict = {}
    numbers: dict = {}
    out: dict = {}
    for replica, name in order:
        logical = name
        if replica is not None:
            layer, i = experts[replica][name]
            if name.startswith("Module."):
                logical = f"{layer}.local_experts.{replica * local + i}" + name[len(f"{layer}.local_experts.{i}"):]
        api = _API.match(name)
        if api and not name.startswith("Module."):
            key = (replica, api.group("head"), int(api.group("n")))
            if key not in numbers:
                numbers[key] = counts.get(api.group("head"), 0)
                counts[api.group("head")] = numbers[key] + 1
            logical = f"{api.group('head')}.{numbers[key]}.{api.group('dir')}"
        out[(replica, name)] = logical
    return out


def _merged_layers(inside: dict, merged: dict) -> dict:
    """{a stage's layer path: the merged model's} (a later pipeline stage's ``layers.0`` is the
    model's ``layers.2``), read from the experts' module records."""
    out: dict = {}
    for name in inside:
        own, logical = _expert_of_name(name), _expert_of_name(merged[name])
        if own is not None and logical is not None:
            out[own[0]] = logical[0]
    return out


def _expert_maps(models: list, raws: list, ranks: list) -> tuple:
    """(experts: per model {merged name: (segment, local expert)}, tails: per model {merged name:
    (stage, the stage's name)} of the records after the experts, containers: the experts'
    container records); ``raws``, ``ranks``: per model, per pipeline stage, its first rank's
    records and its ranks."""
    experts: list = []
    tails: list = []
    containers: set = set()
    for replica, ((_, _, _, report), stage_raws) in enumerate(zip(models, raws)):
        found_all: dict = {}
        tail: dict = {}
        for stage, raw in enumerate(stage_raws):
            # the stage's names -> its merged model's (the merge leaves out what the layout does, renumbering the rest)
            merged = {entry["names"][str(stage)]: name for name, entry in report["records"].items()
                      if str(stage) in entry.get("names", {})}
            segments, closers = _segments(raw)
            inside = {name: found for name, found in segments.items() if found is not None and name in merged}
            if replica == 0:
                containers |= {merged[name] for name in closers if name in merged}
            group = tuple(rank for other in ranks for rank in other[stage])  # the stage's expert-parallel ranks
            after = {name: found for name, found in _tail(raw, inside, group).items() if name in merged}
            layers = _merged_layers(inside, merged)
            found_all.update({merged[name]: (layers.get(found[0], found[0]), found[1])
                              for name, found in list(inside.items()) + list(after.items())})
            tail.update({merged[name]: (stage, name) for name in after})
        experts.append(found_all)
        tails.append(tail)
    return experts, tails, containers


def _stripped(models: list, datas: list, experts: list, shared: dict) -> list:
    """Each rank's merged model (its records ``datas``) without its experts' records, its shared
    records under their logical names."""
    out = []
    for replica, ((_, parents, frames, report), held) in enumerate(zip(models, datas)):
        kept = {shared.get(name, name): record for name, record in held.items() if name not in experts[replica]}
        records = {shared.get(name, name): entry for name, entry in report["records"].items()
                   if name not in experts[replica] and name in held}
        findings = [dict(f, record=shared.get(f["record"], f["record"])) for f in report["findings"]
                    if f["record"] not in experts[replica] and f["record"] in held]
        out.append((kept, {shared.get(k, k): shared.get(v, v) if v else v for k, v in parents.items()
                           if k not in experts[replica]},  # (an expert record's local name may be a shared one's)
                    {shared.get(k, k): v for k, v in frames.items()},
                    dict(report, records=records, findings=findings)))
    return out


def _join_containers(joined: dict, report: dict, models: list, containers: set, shared: dict, tensors: Any) -> None:
    """The experts' container records: each rank's tokens of its own experts, in expert order."""
    size = float(len(models))
    for name in containers:
        logical = shared.get(name, name)
        nodes = [model[0].get(name) for model in models]
        if logical not in joined or any(node is None for node in nodes):
            continue
        joined[logical] = _concat(nodes, size if _is_backward(name) else 1.0, tensors)
        held = sorted({rank for model in models for rank in model[3]["records"].get(name, {}).get("ranks", [])})
        entry = report["records"].setdefault(logical, {"stages": [0], "leaf_suspects": {}, "suspects": []})
        entry.update(ranks=held, leaves={path: "expert parallel: the ranks' tokens joined"
                                         for path, _ in _leaves(joined[logical])})
        report["findings"] = [f for f in report["findings"] if f["record"] != logical]


def _nulled_like(record: Any, raw: Any, partial: set) -> Any:
    """``record`` (a tensor-parallel merge of ``raw``) with the leaves that are partial values on the
    rank (``raw``'s leaves in ``partial``, at the same paths) left out."""
    paths = {path for path, leaf in _leaves(raw) if _signature(leaf) in partial}

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, dict) and "dtype" in node and "shape" in node:
            if path not in paths:
                return node
            out = dict(node, **{stat: None for stat in STAT_KEYS})
            out.pop("data_name", None)
            out.pop("md5", None)
            return out
        if isinstance(node, dict):
            return {key: walk(value, f"{path}.{key}".lstrip(".")) for key, value in node.items()}
        if isinstance(node, list):
            return [walk(value, f"{path}.{i}".lstrip(".")) for i, value in enumerate(node)]
        return node
    return walk(record, "")


def _expert_record(models: list, raws: list, tails: list, partials: list, replica: int, name: str,
                   tensors: Any, wide: bool = False) -> Any:
    """One expert's record as its rank holds it (a backward tensor divided by ep); ``wide``: its
    stage has several (tensor-parallel) ranks, whose merged record is taken."""
    record = models[replica][0][name]
    if name in tails[replica]:  # its rank's own values: a partial norm is no all_reduce's result here
        stage, own = tails[replica][name]
        if wide:
            record = _nulled_like(record, raws[replica][stage].get(own), partials[replica][stage])
        else:
            record = _nulled(raws[replica][stage].get(own, record), partials[replica][stage])
    # a backward tensor of the rank's loss over its share; a parameter's gradient is already its
    # averaged all_reduce's result (the merge of each rank's model takes it)
    if _is_backward(name) and not name.endswith("parameters_grad"):
        return _divided(record, float(len(models)), tensors)
    return record


def _plan(models: list, raws: list, ranks: list) -> tuple:
    """(experts, tails, containers, local experts a rank, each model's records in the card's tail
    order, the logical order, the logical names) of an expert-parallel group's models."""
    experts, tails, containers = _expert_maps(models, raws, ranks)
    counts = {len({i for _, i in found.values()}) for found in experts}
    if len(counts) != 1 or not experts[0]:
        raise ConfigError("expert parallel: the ranks of the expert-parallel group hold no local_experts records "
                          "between their all_to_all calls, or not as many each")
    local = counts.pop()
    datas = [_chained_tail(model[0], found, model[3]) for model, found in zip(models, experts)]
    order = _order(datas, experts)
    return experts, tails, containers, local, datas, order, _renames(order, experts, local)


def expert_names(models: list, raws: list, ranks: list) -> list:
    """Per model of an expert-parallel group (as :func:`join_experts` takes them) {its record's name:
    (the logical name, whether it is an expert's record)}: the card's names, whose shapes tell the
    ranks' tensor-parallel shards from replicas before they are merged."""
    experts, _, _, _, datas, _, renames = _plan(models, raws, ranks)
    return [{name: (renames.get((replica, name)), True) if name in experts[replica] else
             (renames.get((None, name), name), False) for name in data} for replica, data in enumerate(datas)]


def join_experts(models: list, raws: list, ranks: list, join: Callable, tensors: Any = None) -> tuple:
    """The logical model of an expert-parallel group: ``models`` [(data, parents, frames, report)]
    of each expert-parallel rank's merged model (its pipeline stages, in expert-parallel order),
    ``raws`` per model the records of each stage's rank (communication included), ``ranks`` per model
    each stage's ranks; ``join(models, rename)`` joins the
    shared records of the renamed models as data-parallel replicas (``rename(name)``: a shared
    record's logical name, for the other side's records); ``tensors``: the step's tensor recipes (a
    tensor dump: an expert's backward tensors divided as their statistics are), else None. Returns
    (data, parents, frames, report)."""
    experts, tails, containers, local, datas, order, renames = _plan(models, raws, ranks)
    partials = [[_feeding_reduce(raw) for raw in stage_raws] for stage_raws in raws]
    shared = {name: logical for (replica, name), logical in renames.items() if replica is None}
    joined, parents, frames, report = join(_stripped(models, datas, experts, shared))
    _join_containers(joined, report, models, containers, shared, tensors)
    data: dict = {}
    for replica, name in order:
        logical = renames[(replica, name)]
        if replica is None:
            if logical in joined:
                data[logical] = joined.pop(logical)
            continue
        entry = models[replica][3]["records"].get(name) or {}
        wide = len(ranks[replica][min(entry.get("stages") or [0])]) > 1
        record = data[logical] = _expert_record(models, raws, tails, partials, replica, name, tensors, wide)
        entry = models[replica][3]["records"].get(name) or {}
        held = entry.get("ranks") or ranks[replica][0]  # the ranks of its stage holding it
        inner = entry.get("leaf_suspects") or {}  # (the tensor-parallel shard that alone carries it)
        suspects = {path: list(inner.get(path) or held) for path, leaf in _leaves(record) if _anomalous(leaf)}
        report["records"][logical] = {"stages": entry.get("stages", [0]), "ranks": list(held), "leaves": {},
                                      "names": {"0": name}, "leaf_suspects": suspects,
                                      "suspects": sorted({rank for found in suspects.values() for rank in found})}
        parent = models[replica][1].get(name)
        if parent is not None or name in models[replica][1]:
            parents[logical] = renames.get((replica, parent), shared.get(parent, parent)) if parent else None
        found = models[replica][2].get(name)
        if found is not None:
            frames[logical] = found
    data.update(joined)  # shared records of some replicas alone: after the rest
    report["experts"] = {"local": local, "ranks": sorted(rank for model in ranks for stage in model for rank in stage)}
    return data, parents, frames, report




def _moe_paths(data: dict) -> set:
    """The module paths of the MoE layers: those holding the experts' container (``local_experts``'s parent)."""
    return {found.group("layer").rsplit(".", 1)[0] for found in map(_EXPERT.match, data) if found is not None}


def _layer_record(name: str, moe: set) -> bool:
    """Whether ``name`` is an MoE layer's own module record (forward or backward)."""
    return any(name.startswith(path + ".") and _LAYER_RECORD.match(name[len(path) + 1:]) for path in moe)


_LAYER_RECORD = re.compile(r"^[^.]+\.(forward|backward)\.\d+$")


def _in_moe(name: str, parents: dict, moe: set) -> bool:
    """Whether ``name`` runs inside an MoE layer (it or a module holding it under one's path; an API
    call's backward record where its forward call does), the layer's own record (its input and
    output: the tokens as the layer takes them) excepted."""
    if _layer_record(name, moe):
        return False
    names = [name] + ([name[:-len("backward")] + "forward"] if name.endswith(".backward") else [])
    for start in names:
        seen: set = set()
        current: Optional[str] = start
        while current is not None and current not in seen:
            seen.add(current)
            if any(current.startswith(path + ".") for path in moe):
                return True
            current = parents.get(current)
    return False


def _token_order(name: str, parents: dict, moe: set, containers: set, routes: Any) -> Optional[list]:
    """The card's order of the tokens of record ``name`` inside an MoE layer (:class:`TokenRoutes`:
    an expert's, the experts' container's, else the layer's dense tokens), None when not known."""
    if routes is None:
        return None
    module: Optional[str] = name
    if not name.startswith("Module."):
        forward = name[:-len("backward")] + "forward" if name.endswith(".backward") else name
        module = parents.get(forward) or parents.get(name)
    path = next((path for path in moe if module and module.startswith(path + ".")), None)
    call = module.rsplit(".", 1)[-1] if module else ""
    if module is None or path is None or not call.isdigit():
        return None
    own = _expert_of_name(module)
    if own is not None:
        return routes.expert(path, own[1], int(call))
    if any(module.startswith(container + ".") and _LAYER_RECORD.match(module[len(container) + 1:])
           for container in containers):
        return routes.container(path, int(call))
    return routes.dense(path, int(call))


def mark_unordered_tokens(data: dict, parents: dict, tensors: Any, routes: Any = None) -> tuple:
    """(``data`` with the tensors of the MoE layers' tokens put in the single card's order, how many
    leaves so put, how many left unordered). Under expert x tensor parallelism each tp rank holds its
    piece of the sequence flattened to tokens, and an expert's tokens come by source rank: where
    ``routes`` (:class:`~msprobe.readers._merge_routes.TokenRoutes`) gives the card's order of a
    tensor's tokens, its rows are taken in it (:meth:`TensorRecipes.reordered`); else the tensor is
    named :meth:`TensorRecipes.unordered` and not compared element by element (its statistics are).
    Left as they are: the parameters and their gradients, an argument other than the first (of
    a forward call; of a backward record, an output other than the first) shaped like a parameter
    of the layer (a weight, a bias, their gradients), a tensor shaped like the layer's own input
    or output (the tokens before they are flattened, whose pieces join in order), and an integer
    tensor of one dimension the number of experts (the tokens per expert)."""
    moe = _moe_paths(data)
    if not moe or tensors is None:
        return data, 0, 0
    containers = {found.group("layer") for found in map(_EXPERT.match, data) if found is not None}
    weights = {tuple(leaf.get("shape") or ()) for name, record in data.items() if _in_moe(name, parents, moe)
               for path, leaf in _leaves(record) if path.startswith("parameters") or name.endswith("parameters_grad")}
    layers = {tuple(leaf.get("shape") or ()) for name, record in data.items() if _layer_record(name, moe)
              for _, leaf in _leaves(record)}
    counts = [0, 0]
    experts = max((int(found.group("i")) for found in map(_EXPERT.match, data) if found is not None), default=-1) + 1

    def marker(order: Optional[list]) -> Callable:
        def mark(leaf: dict) -> dict:
            shape = tuple(leaf.get("shape") or ())
            if shape in layers or (len(shape) == 1 and shape[0] == experts and "int" in str(leaf.get("dtype"))):
                return leaf  # the layer's own tokens; the tokens per expert
            fits = order is not None and len(shape) > 0 and shape[0] == len(order)
            made = tensors.reordered(leaf.get("data_name"), order) if fits else tensors.unordered(leaf.get("data_name"))
            if made is None:
                return leaf
            counts[0 if fits else 1] += 1
            return dict(leaf, data_name=made)
        return mark

    def marked(name: str, record: Any) -> Any:
        if name.endswith("parameters_grad") or not isinstance(record, dict) or not _in_moe(name, parents, moe):
            return record
        mark = marker(_token_order(name, parents, moe, containers, routes))
        args = "output" if _is_backward(name) else "input_args"
        out = {}
        for key, node in record.items():
            if key == "parameters":
                out[key] = node
            elif key == args and isinstance(node, list):
                out[key] = [value if index > 0 and all(tuple(leaf.get("shape") or ()) in weights
                                                       for _, leaf in _leaves(value)) else _leafwise(value, mark)
                            for index, value in enumerate(node)]
            else:
                out[key] = _leafwise(node, mark)
        return out

    marked_data = {name: marked(name, record) for name, record in data.items()}
    return marked_data, counts[0], counts[1]
