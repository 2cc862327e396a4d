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

Communication records (``Distributed.*``) are the layout's own work, not the model's: left out
and listed. A module that appears on several stages under one name spans them: its inputs are
the first stage's, its outputs the last's (backward: the other way round).
"""
from __future__ import annotations

import math
from typing import Any, Optional

from msprobe.errors import ConfigError
from msprobe.format.comm import comm_api, comm_call
from msprobe.format.documents import DumpDocument
from msprobe.format.parallel import Layout, LayoutError, merge_shard_stats, stage_renames
from msprobe.format.stats import MAX, MEAN, MIN, NORM, STAT_KEYS, stats_equal

__all__ = ["MergedSource", "merge_dump_step", "read_layout", "Layout", "model_order", "shapes_of", "other_shapes_of"]

_STATS = STAT_KEYS


def _is_leaf(node: Any) -> bool:
    return isinstance(node, dict) and "dtype" in node and "shape" in node


def _shape(leaf: Any) -> tuple:
    return tuple(leaf.get("shape") or ())


def _signature(leaf: Any) -> Optional[tuple]:
    if not _is_leaf(leaf):
        return None
    return (_shape(leaf),) + tuple(leaf.get(stat) for stat in _STATS)


def _same(a: dict, b: dict) -> bool:
    return _shape(a) == _shape(b) and all(stats_equal(a.get(stat), b.get(stat)) for stat in _STATS)


def _anomalous(leaf: Any) -> bool:
    """A NaN or +/-Inf among a tensor leaf's statistics."""
    return _is_leaf(leaf) and any(isinstance(leaf.get(stat), float) and not math.isfinite(leaf[stat])
                                  for stat in _STATS)


def _is_backward(name: str) -> bool:
    return ".backward" in name or name.endswith("parameters_grad")


def _leaves(node: Any, path: str = "") -> list:
    """[(path, leaf)] of every tensor leaf under ``node``."""
    if _is_leaf(node):
        return [(path, node)]
    if isinstance(node, dict):
        return [found for key, value in node.items() for found in _leaves(value, f"{path}.{key}".lstrip("."))]
    if isinstance(node, list):
        return [found for i, value in enumerate(node) for found in _leaves(value, f"{path}.{i}".lstrip("."))]
    return []


def _grown(shapes: set, degree: int) -> set:
    """The whole shapes ``degree`` ranks holding a tensor of each of ``shapes`` can make: the
    tensor itself (replicas) or ``degree`` pieces joined along one dimension (shards)."""
    if degree <= 1:
        return set(shapes)
    out = set(shapes)
    for shape in shapes:
        for dim in range(len(shape)):
            out.add(shape[:dim] + (shape[dim] * degree,) + shape[dim + 1:])
    return out


def shapes_of(data: dict) -> dict:
    """{record: {leaf path: {shape}}} of one side's records taken as they are (a single card)."""
    return {name: {path: {_shape(leaf)} for path, leaf in _leaves(record)} for name, record in data.items()}


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
    """Merges one record of a group of members (the tensor-parallel ranks of a stage, or the
    data-parallel replicas of a model): each member a list of ranks."""

    def __init__(self, members: list, reference: dict, other_shapes: Optional[dict], degree: int,
                 findings: list, partials: Optional[list] = None, scale_backward: float = 1.0):
        self.members, self.reference, self.other_shapes = members, reference, other_shapes
        self.degree, self.findings = degree, findings
        self.partials = partials or [_Reduced({}) for _ in members]
        self.peers: list = []  # the same tensor on the other data-parallel replicas (:meth:`record`)
        self.scale_backward = scale_backward
        self.kinds: dict = {}
        self.suspects: dict = {}
        self.name = ""
        self.partial_values: list = [set() for _ in members]  # per member: signatures of partial values

    @property
    def ranks(self) -> list:
        return [rank for member in self.members for rank in member]

    def record(self, logical: str, nodes: list, peers: Optional[list] = None) -> tuple:
        """(merged record, {leaf path: kind}, {leaf path: [suspect ranks]}) of one record of every
        member; ``peers``: the record on the other data-parallel replicas (their first member's)."""
        self.kinds, self.suspects, self.name, self.peers = {}, {}, logical, [p for p in peers or [] if p is not None]
        self.record_partial = False  # an input of this record is a partial value
        merged = self._node(nodes, self.reference.get(logical), "")
        return merged, self.kinds, self.suspects

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

    def _reading(self, nodes: list, shapes: list, path: str) -> Optional[int]:
        """How the other side's shape reads the members' tensors: None (replicas), a dimension
        (shards along it), or -2 when shapes cannot decide. Where both readings fit (the data-parallel
        replicas may hold pieces of the batch too), tensors that differ across the members are
        shards, and equal ones replicas unless they are equal on every data-parallel replica too
        (a zero-initialised bias: a parameter, which data parallelism never splits)."""
        if any(shape != shapes[0] for shape in shapes[1:]):
            return -2
        wanted = (self.other_shapes or {}).get(self.name, {}).get(path) if self.other_shapes is not None else None
        if not wanted:
            return -2
        shape = shapes[0]
        fits: list = [None] if shape in wanted else []
        fits += [dim for dim in range(len(shape))
                 if shape[:dim] + (shape[dim] * len(shapes),) + shape[dim + 1:] in wanted]
        if len(fits) == 1:
            return fits[0]
        if len(fits) > 1 and None not in fits:
            return fits[-1]  # pieces along one of several dimensions: the last (hidden) one
        if len(fits) > 1 and None in fits:
            dims = [dim for dim in fits if dim is not None]
            if any(_anomalous(n) for n in nodes):
                return None  # a NaN/Inf on some members: replicas, the one carrying it departs
            if not all(_same(n, nodes[0]) for n in nodes[1:]):
                return dims[-1]
            peers = [_at(peer, path) for peer in self.peers]
            if peers and not _is_backward(self.name) and all(_is_leaf(peer) and _same(peer, nodes[0]) for peer in peers):
                return dims[-1]
            return None
        return -2

    def _leaf(self, nodes: list, ref: Optional[dict], path: str) -> Any:
        present = [(i, n) for i, n in enumerate(nodes) if _is_leaf(n)]
        if present and path.startswith("input") and all(_signature(n) in self.partial_values[i] for i, n in present):
            self.record_partial = True
            return self._partial_value(present, path)
        if present and not path.startswith("input") and self.record_partial and \
                math.prod(_shape(present[0][1])) == 1:
            return self._partial_value(present, path)
        first = nodes[0]
        if not all(_is_leaf(n) for n in nodes):
            self.kinds[path] = "missing on a rank"
            return first
        if any(shape != _shape(first) and len(shape) != len(_shape(first)) for shape in (_shape(n) for n in nodes)):
            self.kinds[path] = "shapes differ across the ranks"
            return first
        results = [partial.get(n) for partial, n in zip(self.partials, nodes)]
        reduced = all(r is not None for r in results)
        if reduced:  # each rank's partial sum: its all_reduce's result (the sum one card computes)
            nodes = [dict(n, **{stat: r.get(stat) for stat in _STATS}) for n, r in zip(nodes, results)]
            for n in nodes:
                n.pop("md5", None)
            first = nodes[0]
        shapes = [_shape(n) for n in nodes]
        reading = self._reading(nodes, shapes, path)
        if reading == -2:  # shapes cannot decide: equal statistics are one tensor, others pieces of one
            if all(_same(n, first) for n in nodes[1:]):
                reading = None
            elif ref is not None and _shape(ref) == shapes[0]:
                reading = None
            else:
                reading = self._dim(shapes, ref)
        self._anomalies(nodes, path)
        if reading is None:
            if all(_same(n, first) for n in nodes[1:]):
                self.kinds[path] = "partial" if reduced else "replicated"
                return first
            if self.scale_backward != 1.0 and math.prod(shapes[0]) == 1 and not _is_backward(self.name) and \
                    not any(_anomalous(n) for n in nodes):
                return self._mean(nodes, path)
            if self.scale_backward != 1.0 and _is_backward(self.name) and not any(_anomalous(n) for n in nodes):
                return self._replica_mean(nodes, path)
            if math.prod(shapes[0]) == 1 and not path.startswith("input") and not any(_anomalous(n) for n in nodes) \
                    and any(kind in ("sharded", "partial of shards") for key, kind in self.kinds.items()
                            if key.startswith("input")):
                return self._partial_value(list(enumerate(nodes)), path)
            return self._disagreeing(nodes, ref, path)
        self.kinds[path] = "sharded"
        if self.scale_backward != 1.0 and _is_backward(self.name):  # a replica's gradient of its own loss
            nodes = [dict(n, **{stat: n[stat] / self.scale_backward for stat in _STATS
                                if isinstance(n.get(stat), float)}) for n in nodes]
        self._outside(nodes, ref, path)
        return merge_shard_stats(nodes, reading)

    def _partial_value(self, present: list, path: str) -> dict:
        """One value per rank computed from its shard alone (a gradient clip's norm of each shard, and
        what is made of it before the all_reduce that completes it; ``present``: [(member, leaf)]): no
        statistic of the whole can be made of them: not compared (the all_reduce's result is)."""
        for i, n in present:
            self.partial_values[i].add(_signature(n))
        merged = dict(present[0][1], **{stat: None for stat in _STATS})
        merged.pop("md5", None)
        self.kinds[path] = "partial of shards"
        return merged

    def _replica_mean(self, nodes: list, path: str) -> dict:
        """A gradient each data-parallel replica holds whole, of its own share of the batch (a bias's,
        summed over the batch): the whole batch's is the replicas' mean. Its Mean is theirs; Max,
        Min and Norm of a mean cannot be made of the parts' (left out: not compared)."""
        merged = dict(nodes[0], **{stat: None for stat in _STATS})
        merged.pop("md5", None)
        means = [n.get(MEAN.key) for n in nodes]
        if all(isinstance(v, (int, float)) for v in means):
            merged[MEAN.key] = sum(means) / len(means)
        self.kinds[path] = "data-parallel partial: the replicas' mean"
        return merged

    def _mean(self, nodes: list, path: str) -> dict:
        """One value per replica (a loss averaged over each replica's share of the batch): their mean."""
        values = [n.get(MEAN.key) for n in nodes]
        merged = dict(nodes[0])
        merged.pop("md5", None)
        if all(isinstance(v, (int, float)) for v in values):
            mean = sum(values) / len(values)
            merged.update({MAX.key: mean, MIN.key: mean, MEAN.key: mean, NORM.key: abs(mean)})
        self.kinds[path] = "mean over the replicas"
        return merged

    def _anomalies(self, nodes: list, path: str) -> None:
        """The members alone holding a NaN/Inf: suspects of this leaf."""
        bad = [i for i, n in enumerate(nodes) if _anomalous(n)]
        if bad and len(bad) < len(nodes):
            self._suspect(path, bad)

    def _outside(self, nodes: list, ref: Optional[dict], path: str) -> None:
        """Shards that cannot be a piece of the reference's whole tensor (a Max above its Max, a Min
        below its Min)."""
        if ref is None:
            return
        top, bottom = ref.get(MAX.key), ref.get(MIN.key)
        bad = []
        for i, leaf in enumerate(nodes):
            high, low = leaf.get(MAX.key), leaf.get(MIN.key)
            if isinstance(high, (int, float)) and isinstance(top, (int, float)) and \
                    high > top + 1e-8 + 1e-5 * abs(top):
                bad.append(i)
            elif isinstance(low, (int, float)) and isinstance(bottom, (int, float)) and \
                    low < bottom - 1e-8 - 1e-5 * abs(bottom):
                bad.append(i)
        if bad:
            self._suspect(path, bad)

    def _suspect(self, path: str, members: list) -> None:
        found = self.suspects.setdefault(path, [])
        for i in members:
            found.extend(rank for rank in self.members[i] if rank not in found)
        found.sort()

    def _disagreeing(self, nodes: list, ref: Optional[dict], path: str) -> dict:
        """Replicas that differ: a finding; the replica that differs from the reference is kept
        (the first, without one)."""
        if ref is not None:
            wrong = [i for i, n in enumerate(nodes) if not _same(n, ref)]
        else:
            wrong = [i for i, n in enumerate(nodes) if not _same(n, nodes[0])]
        ranks = [rank for i in wrong for rank in self.members[i]]
        self.kinds[path] = "replicas disagree"
        self.findings.append({"record": self.name, "leaf": path, "finding": "replicas disagree",
                              "ranks": self.ranks, "differ_from_bench": ranks if ref is not None else [],
                              "values": {"/".join(map(str, member)): {stat: n.get(stat) for stat in _STATS}
                                         for member, n in zip(self.members, nodes)}})
        if wrong and len(wrong) < len(nodes):
            self._suspect(path, wrong)
        return nodes[wrong[0]] if wrong else nodes[0]

    @staticmethod
    def _dim(shapes: list, ref: Optional[dict]) -> int:
        if ref is not None:
            whole = list(ref.get("shape") or [])
            if len(whole) == len(shapes[0]) and all(len(s) == len(whole) for s in shapes):
                for dim in range(len(whole)):
                    if whole[dim] == sum(s[dim] for s in shapes) and all(
                            whole[d] == shapes[0][d] for d in range(len(whole)) if d != dim):
                        return dim
        return -1


def _feeding_reduce(data: dict) -> set:
    """Signatures of the one-element values of a rank's tail (the records after its last backward
    record) that flow into an all_reduce there: a gradient clip's norm of each local gradient, their
    squares and running sum before the all_reduce that completes them over the ranks. Each rank holds
    its own part of the sum: no statistic of the whole can be made of them (spec/FORMAT.md 26.4)."""
    names = list(data)
    last = _last_backward(names)
    if last < 0:
        return set()
    reaching: set = set()
    for name in reversed(names[last + 1:]):
        record = data[name]
        api = comm_api(name)
        if api is not None:
            if api[0] == "all_reduce" and isinstance(record, dict):
                reaching.update(_signature(leaf) for _, leaf in _leaves(record.get("input_args")))
            continue
        if not isinstance(record, dict):
            continue
        if any(_signature(leaf) in reaching for _, leaf in _leaves(record.get("output"))):
            for key in ("input_args", "input_kwargs"):
                reaching.update(_signature(leaf) for _, leaf in _leaves(record.get(key)))
    return {signature for signature in reaching if signature is not None and math.prod(signature[0]) <= 1}


def _averaging(data: dict, reduced: "_Reduced") -> set:
    """The records of a rank's tail whose outputs, gradients (more than one element), all go into
    all_reduce calls: a gradient divided by the number of data-parallel replicas before they are
    summed, the layout's own work as the all_reduce is (a single card has no such record)."""
    names = list(data)
    last = _last_backward(names)
    out = set()
    for name in names[last + 1:] if last >= 0 else ():
        record = data[name]
        if comm_api(name) is not None or not isinstance(record, dict):
            continue
        outputs = [leaf for _, leaf in _leaves(record.get("output"))]
        if outputs and all(math.prod(_shape(leaf)) > 1 and reduced.feeds(leaf) for leaf in outputs):
            out.add(name)
    return out


class _Reduced:
    """The all_reduce calls of one rank, by their input: ``get(leaf)`` is the result of the
    all_reduce whose input is ``leaf`` (its statistics equal), or ``leaf`` divided by one of
    ``factors`` (a data-parallel gradient divided by the number of replicas before it is summed,
    Megatron's averaging), else None."""

    def __init__(self, data: dict, factors: tuple = (1.0,)):
        self.factors = factors
        self.by_shape: dict = {}
        for name, record in data.items():
            api = comm_api(name)
            if api is None or api[0] != "all_reduce" or not isinstance(record, dict):
                continue
            args, out = record.get("input_args") or [], record.get("output") or []
            if args and out and _is_leaf(args[0]) and _is_leaf(out[0]):
                self.by_shape.setdefault(_shape(args[0]), []).append((args[0], out[0]))

    def feeds(self, leaf: Any) -> bool:
        """Whether ``leaf`` is (the statistics of) an all_reduce's input."""
        signature = _signature(leaf)  # exactly: the same tensor (a tolerance would take tiny gradients for it)
        return _is_leaf(leaf) and any(_signature(given) == signature for given, _ in self.by_shape.get(_shape(leaf), ()))

    def get(self, leaf: Any) -> Optional[dict]:
        if not _is_leaf(leaf):
            return None
        for given, result in self.by_shape.get(_shape(leaf), ()):
            for factor in self.factors:
                if all(_scaled_equal(leaf.get(stat), given.get(stat), factor) for stat in _STATS):
                    return result
        return None


def _scaled_equal(value: Any, divided: Any, factor: float) -> bool:
    if not isinstance(value, (int, float)) or not isinstance(divided, (int, float)):
        return value == divided
    return stats_equal(value / factor, divided, atol=0.0)  # relative only: tiny gradients are not all alike


def _partials(data: dict, factors: tuple = (1.0,)) -> _Reduced:
    """The :class:`_Reduced` of one rank's all_reduce calls."""
    return _Reduced(data, factors)


def _shape_of_name(name: str) -> str:
    """A record name without its call counts (what lines up the records of two ranks of a stage)."""
    return ".".join(part for part in name.split(".") if not part.isdigit())


def _align(base: list, names: list, base_data: Optional[dict] = None, data: Optional[dict] = None) -> tuple:
    """({base name: this rank's name}, [(base name before it or None, name)] of the records only
    this rank holds): another tensor-parallel rank's records lined up with the stage's first
    rank's (they run the same code; a record of one rank alone, a fault's ``masked_fill``, shifts
    nothing)."""
    if names == base:
        return {name: name for name in base}, []
    import difflib

    def keys(found: list, records: Optional[dict]) -> list:
        """Per record: its name without counts, its tensors' shapes, and the same of the records whose
        outputs its tensor inputs are (norms of different parameters: their squares differ so)."""
        made: dict = {}  # signature of an output -> the record that made it: its own key and its sources'
        out = []
        for n in found:
            record = (records or {}).get(n)
            leaves = _leaves(record)
            own = (_shape_of_name(n), tuple(_shape(leaf) for _, leaf in leaves))
            sources = tuple(made.get(_signature(leaf), (None, ())) for path, leaf in leaves if path.startswith("input"))
            out.append((own, sources))
            for path, leaf in leaves:
                if path.startswith("output"):  # two generations: a chain of sums stays short
                    made[_signature(leaf)] = (own, tuple(source[0] for source in sources))
        return out

    matcher = difflib.SequenceMatcher(None, keys(base, base_data), keys(names, data), autojunk=False)
    mapping: dict = {}
    extras: list = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            mapping.update(zip(base[i1:i2], names[j1:j2]))
        elif tag in ("insert", "replace"):
            extras.extend((base[i1 - 1] if i1 > 0 else None, name) for name in names[j1:j2])
    return mapping, extras


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


_COLLECTIVE = ("all", "from_root", "to_root", "sync")


class _Steps:
    """The nodes of :func:`model_order`'s graph: runs of records and communication calls."""

    def __init__(self) -> None:
        self.names: list = []   # node -> [(stage, name)]
        self.tail: list = []    # node -> whether it runs after its stage's last backward record

    def add(self, names: list, tail: bool) -> int:
        self.names.append(list(names))
        self.tail.append(tail)
        return len(self.names) - 1


def _last_backward(names: list) -> int:
    return max((i for i, name in enumerate(names) if _is_backward(name) and comm_api(name) is None), default=-1)


def model_order(stage_ranks: list, stage_data: list) -> list:
    """[(stage, record name)] of the non-communication records of each stage (``stage_data``: the
    records of the stage's first rank) in the step's happens-before order across the stages.

    Each stage's records are a chain; a send to another stage of the model happens before the
    matching receive (the k-th from stage a to stage b with the k-th receive of b from a), a
    collective over ranks of several stages (a clip's norm over the model-parallel group) is one
    moment for all of them. Among the orders these allow, the one a single card runs is taken:
    after a send, the receiver goes on (the data is followed), and the records after a stage's
    last backward record (the optimizer's updates, the clip, the loss scaler) wait until no stage
    has anything else to do, then run stage after stage."""
    stage_of = {rank: stage for stage, ranks in enumerate(stage_ranks) for rank in ranks}
    steps = _Steps()
    chains: list = []
    sends: dict = {}
    recvs: dict = {}
    shared: dict = {}
    for stage, data in enumerate(stage_data):
        rank = stage_ranks[stage][0]
        names = list(data)
        position = {name: index for index, name in enumerate(names)}
        last = _last_backward(names)
        chain: list = []
        run: list = []
        counts: dict = {}
        for index, name in enumerate(names):
            if index == last + 1 and run:  # the tail (after the last backward record) is a node of its own
                chain.append(steps.add(run, False))
                run = []
            if comm_api(name) is None:
                run.append((stage, name))
                continue
            call = comm_call(name, data[name], rank, index)
            if call is None:
                continue
            tail = last >= 0 and index > last
            if call.kind in ("send", "recv") and stage_of.get(call.peer, stage) != stage:
                if run:
                    chain.append(steps.add(run, tail))
                    run = []
                other = stage_of[call.peer]
                key = ((stage, other) if call.kind == "send" else (other, stage)) + (call.tag,)
                chain.append(steps.add([], tail))
                (sends if call.kind == "send" else recvs).setdefault(key, []).append(chain[-1])
            elif call.kind in _COLLECTIVE and call.group and \
                    len({stage_of[r] for r in call.group if r in stage_of}) > 1:
                if run:
                    chain.append(steps.add(run, tail))
                    run = []
                group = (call.api, tuple(sorted(call.group)))
                seq = counts.get(group, 0)
                counts[group] = seq + 1
                if (group, seq) not in shared:
                    shared[(group, seq)] = steps.add([], tail)
                chain.append(shared[(group, seq)])
        if run:  # after the forced cut above, a last run is all before or all after the last backward record
            chain.append(steps.add(run, 0 <= last < position[run[0][1]]))
        chains.append(chain)
    edges: dict = {node: [] for node in range(len(steps.names))}
    waits = [0] * len(steps.names)
    for chain in chains:
        for a, b in zip(chain, chain[1:]):
            edges[a].append(b)
            waits[b] += 1
    for key, items in sends.items():
        for send, recv in zip(items, recvs.get(key, [])):
            edges[send].append(recv)
            waits[recv] += 1
    ready = [chain[0] for chain in reversed(chains) if chain and waits[chain[0]] == 0]
    later: list = []
    out: list = []
    done: set = set()
    while len(done) < len(steps.names):
        if ready:
            node = ready.pop()
        elif later:
            later.sort(key=lambda n: steps.names[n][0][0] if steps.names[n] else -1)
            node = later.pop(0)
        else:  # a receive whose send is not in the dump: let the earliest waiting node go
            node = min((n for n in range(len(steps.names)) if n not in done), key=lambda n: (waits[n], n))
        if node in done:
            continue
        done.add(node)
        out.extend(steps.names[node])
        for following in edges[node]:  # the chain's next first, the receiver last: it is taken next
            waits[following] -= 1
            if waits[following] == 0:
                (later if steps.tail[following] else ready).append(following)
    return out


def merge_model(stages: list, reference: Optional[dict] = None, other_shapes: Optional[dict] = None,
                peers: Optional[list] = None, factors: tuple = (1.0,)) -> tuple:
    """``stages``: [[source of each tp rank] per pipeline stage]; returns (data, parents, frames,
    report) of the logical model. ``reference``: the other side's records (statistics) under the
    logical names; ``other_shapes``: the other side's shapes (:func:`shapes_of`, or what its
    layout can make of its shards), which tell a shard from a replica; ``peers``: the stages of the
    other data-parallel replicas (the same tensor there tells a parameter from a piece of the batch);
    ``factors``: what a gradient may be divided by before its all_reduce (1, and dp)."""
    reference = reference or {}
    peer_data = [[_records_of(stage[0]) for stage in replica] for replica in peers or []]
    findings: list = []
    left_out: list = []
    datas = [[_records_of(source) for source in stage] for stage in stages]
    ranks_of = [[source.rank for source in stage] for stage in stages]
    names = [[name for name in stage_data[0] if comm_api(name) is None] for stage_data in datas]
    averaging: list = [set() for _ in stages]
    if len(factors) > 1:  # the replicas' gradient averaging before their all_reduce: the layout's own work
        for stage, stage_data in enumerate(datas):
            averaging[stage] = _averaging(stage_data[0], _partials(stage_data[0]))
            names[stage] = [name for name in names[stage] if name not in averaging[stage]]
            left_out.extend({"rank": ranks_of[stage][0], "record": name} for name in sorted(averaging[stage]))
    maps: list = []
    lone: dict = {}  # (stage, base name before it or None) -> [(member, name)] of records one rank alone holds
    for stage, stage_data in enumerate(datas):
        stage_maps = []
        for member, held in enumerate(stage_data):
            mapping, extras = _align(names[stage], [name for name in held if comm_api(name) is None
                                                    and name not in averaging[stage]], stage_data[0], held)
            stage_maps.append(mapping)
            for anchor, name in extras:
                lone.setdefault((stage, anchor), []).append((member, name))
        maps.append(stage_maps)
    order: list = []
    for stage in range(len(stages)):
        order.extend((stage, name, ranks_of[stage][member]) for member, name in lone.get((stage, None), []))
    kept = [{name: record for name, record in stage_data[0].items() if name not in averaging[index]}
            for index, stage_data in enumerate(datas)]
    for stage, name in model_order(ranks_of, kept):
        order.append((stage, name))
        order.extend((stage, extra, ranks_of[stage][member]) for member, extra in lone.get((stage, name), []))
    renames = stage_renames(names, order)
    mergers = []
    for stage, (sources, stage_data) in enumerate(zip(stages, datas)):
        ranks = ranks_of[stage]
        left_out.extend({"rank": source.rank, "record": name} for source, held in zip(sources, stage_data)
                        for name in held if comm_api(name) is not None)
        merger = _Merger([[rank] for rank in ranks], reference, other_shapes, len(ranks), findings,
                         [_partials(held, factors) for held in stage_data])
        if len(stages) > 1 or len(ranks) > 1:
            merger.partial_values = [_feeding_reduce(held) for held in stage_data]
        mergers.append(merger)
    data: dict = {}
    stage_held: dict = {}
    parents: dict = {}
    frames: dict = {}
    provenance: dict = {}
    local_parents = [_parents(stage[0]) for stage in stages]
    for stage, name, *alone in order:
        stage_data = datas[stage]
        if alone:  # a record of one rank alone: kept as it is, a finding
            rank = alone[0]
            member = ranks_of[stage].index(rank)
            logical = renames[stage][(rank, name)]
            record = stage_data[member][name]
            ranks = [rank]
            kinds = {path: "on one rank only" for path, _ in _leaves(record)}
            suspects = {path: [rank] for path, leaf in _leaves(record) if _anomalous(leaf)}
            findings.append({"record": logical, "leaf": "", "finding": f"record on rank {rank} alone of its "
                             f"tensor-parallel group {ranks_of[stage]}", "ranks": [rank], "differ_from_bench": [],
                             "values": {}})
            parent = _parents(stages[stage][member]).get(name)
            source = stages[stage][member]
        else:
            logical = renames[stage][name]
            nodes = [d.get(m[name]) if name in m else None for d, m in zip(stage_data, maps[stage])]
            record, kinds, suspects = mergers[stage].record(logical, nodes,
                                                            [replica[stage].get(name) for replica in peer_data])
            ranks = [rank for rank, node in zip(ranks_of[stage], nodes) if node is not None]
            parent = local_parents[stage].get(name)
            source = stages[stage][0]
            missing = [rank for rank, node in zip(ranks_of[stage], nodes) if node is None]
        if logical in data and isinstance(data[logical], dict) and isinstance(record, dict):
            earlier = stage_held[logical]
            record = _span(data[logical], record, logical) if earlier <= stage else _span(record, data[logical],
                                                                                           logical)
            data.pop(logical)  # a module spanning stages is written when it ends: on the last of them
        data[logical] = record
        stage_held[logical] = min(stage, stage_held.get(logical, stage))
        if parent is not None or name in local_parents[stage]:  # parameters_grad stays outside the tree
            renamed = renames[stage].get(parent, parent) if parent is not None else None
            parents[logical] = renamed
        frames.setdefault(logical, (source, name))
        entry = provenance.setdefault(logical, {"stages": [], "ranks": [], "leaves": {}, "suspects": [],
                                                "leaf_suspects": {}, "names": {}})
        if stage not in entry["stages"]:
            entry["stages"].append(stage)
        entry["ranks"] = sorted(set(entry["ranks"]) | set(ranks))
        entry["names"][str(stage)] = name
        entry["leaves"].update(kinds)
        for path, found in suspects.items():
            entry["leaf_suspects"][path] = sorted(set(entry["leaf_suspects"].get(path, [])) | set(found))
        entry["suspects"] = sorted({rank for found in entry["leaf_suspects"].values() for rank in found})
        if not alone and missing:
            entry["missing_on"] = missing
    position = {name: index for index, name in enumerate(data)}
    findings.sort(key=lambda finding: position.get(finding["record"], len(position)))  # in the logical model's order
    report = {"findings": findings, "communication_left_out": len(left_out), "records": provenance}
    return data, parents, frames, report


def model_shapes(stages: list) -> dict:
    """{logical record: {leaf path: shapes}} the ranks of one logical model can make of each
    tensor (its own shape on one rank, or its tensor-parallel ranks' pieces joined along any
    dimension): the other side's hint when both sides are merged (layout against layout)."""
    datas = [[_records_of(source) for source in stage] for stage in stages]
    ranks_of = [[source.rank for source in stage] for stage in stages]
    names = [[name for name in stage_data[0] if comm_api(name) is None] for stage_data in datas]
    renames = stage_renames(names, model_order(ranks_of, [stage_data[0] for stage_data in datas]))
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
    text = f"tp={len(ordered[0][0])},pp={len(ordered[0])}"
    if len(ordered) > 1:
        text += f",dp={len(ordered)}"
    text += " (read from the dump)"
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


def _model_chunks(sources: list) -> Optional[tuple]:
    """(rank, [chunk prefixes]) of the first rank whose module records carry more than one model
    chunk index (``Module.0.``, ``Module.1.``: Megatron's virtual pipeline), else None."""
    for source in sources:
        chunks = sorted({name.split(".")[1] for name in _records_of(source)
                         if name.startswith("Module.") and name.split(".")[1].isdigit()})
        if len(chunks) > 1:
            return source.rank, [f"Module.{chunk}." for chunk in chunks]
    return None


def layout_models(sources: list, layout: Optional[Layout]) -> tuple:
    """(layout text, [(key, [[rank of each tp rank] per stage])], warnings) of one step's rank
    sources under ``layout`` (None: read from the dump). ConfigError when they do not fit."""
    if layout is not None and layout.vpp != 1:
        raise ConfigError(f"layout {layout.text()}: virtual pipeline stages (vpp) are not merged yet")
    by_rank = {source.rank: source for source in sources}
    if None in by_rank or len(by_rank) != len(sources):
        raise ConfigError("a parallel layout needs rank directories (rank0, rank1, ...), one per rank")
    if sorted(by_rank) != list(range(len(by_rank))):
        raise ConfigError(f"a parallel layout needs ranks 0..{len(by_rank) - 1}, the dump has {sorted(by_rank)}")
    if layout is None:
        text, models = read_layout(sources)
        warnings: list = []
    else:
        try:
            text, models = layout.text(), layout.models(sorted(by_rank))
        except LayoutError as exc:
            raise ConfigError(str(exc)) from exc
        warnings = _checked(models, sources)
    chunked = _model_chunks(sources) if any(len(stages) > 1 for _, stages in models) else None
    if chunked:  # a pipeline whose ranks hold several chunks: merged as plain stages, it would be wrong
        raise ConfigError(f"rank {chunked[0]} holds model chunks ({', '.join(chunked[1])}) of a pipeline: "
                          f"virtual pipeline stages (vpp > 1) are not merged yet")
    return text, models, warnings


def other_shapes_of(sources: list, layout: Optional[Layout]) -> dict:
    """What one side can make of each tensor under its layout (:func:`model_shapes` of its first
    logical model)."""
    by_rank = {source.rank: source for source in sources}
    _, models, _ = layout_models(sources, layout)
    return model_shapes([[by_rank[rank] for rank in stage] for stage in models[0][1]])


def join_replicas(models: list, reference: dict, other_shapes: dict) -> tuple:
    """One logical model of the data-parallel replicas' merged models ``[(data, parents, frames,
    report)]``: each tensor joined along the batch (the dimension the other side's shape names) or
    kept once (parameters, reduced gradients) by :class:`_Merger`; backward statistics of joined
    tensors divided by the number of replicas (each replica's loss averages its own share); a
    scalar that differs across the replicas (each one's loss, a mean over its share) is their mean.
    A record that only some replicas hold (a fault's ``masked_fill``) is kept as it is, in its place."""
    findings: list = []
    reports = [model[3] for model in models]
    members = [sorted({rank for entry in report["records"].values() for rank in entry["ranks"]}) for report in reports]
    merger = _Merger(members, reference, other_shapes, len(models), findings, scale_backward=float(len(models)))
    first_data, parents, frames, first_report = models[0]
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
        nodes = [model[0].get(mapping[name]) if name in mapping else None for model, mapping in zip(models, maps)]
        entries = [report["records"].get(mapping[name]) if name in mapping else None for report, mapping in zip(reports, maps)]
        kinds: dict = {}
        suspects: dict = {}
        if any(node is None for node in nodes):
            data[name] = first_data[name]
            findings.append({"record": name, "leaf": "", "finding": "record not on every data-parallel replica",
                             "ranks": [rank for member, node in zip(members, nodes) if node is not None
                                       for rank in member], "differ_from_bench": [], "values": {}})
        else:  # each replica named by the ranks holding this record
            merger.members = [e["ranks"] if e else member for e, member in zip(entries, members)]
            data[name], kinds, suspects = merger.record(name, nodes)
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
        provenance[name] = entry
    findings = [f for report in reports for f in report["findings"]] + findings
    position = {name: index for index, name in enumerate(data)}
    findings.sort(key=lambda finding: position.get(finding["record"], len(position)))
    report = {"findings": findings, "records": provenance,
              "communication_left_out": sum(r["communication_left_out"] for r in reports)}
    return data, parents, frames, report


def _shrunk(shapes: set, degree: int) -> set:
    """``shapes`` and each of them with one dimension divided by ``degree`` (what one of ``degree``
    data-parallel replicas may hold of a tensor of the whole batch)."""
    out = set(shapes)
    for shape in shapes:
        for dim in range(len(shape)):
            if shape[dim] % degree == 0:
                out.add(shape[:dim] + (shape[dim] // degree,) + shape[dim + 1:])
    return out


def _holds_a_piece(sources: list, other_shapes: Optional[dict], replicas: int) -> bool:
    """Whether data-parallel replicas hold pieces of the other side's batch: the first tensor input
    of the first stage's first rank is, joined ``replicas`` times along a dimension, the other
    side's, and not the other side's as it is."""
    if not other_shapes or replicas < 2:
        return False
    for name, record in _records_of(sources[0]).items():
        if _is_backward(name) or comm_api(name) is not None:
            continue
        for path, leaf in _leaves(record):
            wanted = other_shapes.get(name, {}).get(path)
            if not wanted or not path.startswith("input"):
                continue
            shape = _shape(leaf)
            return shape not in wanted and bool(_grown({shape}, replicas) & wanted)
    return False


def merge_dump_step(sources: list, layout: Optional[Layout], reference: Optional[dict] = None,
                    other_shapes: Optional[dict] = None) -> list:
    """The :class:`MergedSource` of each logical model of one step's rank sources under ``layout``
    (None: read from the dump, :func:`read_layout`); the data-parallel replicas joined into one when
    they hold pieces of the other side's batch. ``reference``: the other side's records;
    ``other_shapes``: its shapes (default: those of ``reference``). ConfigError when the ranks do
    not fit the layout."""
    text, models, warnings = layout_models(sources, layout)
    by_rank = {source.rank: source for source in sources}
    if other_shapes is None and reference:
        other_shapes = shapes_of(reference)
    replicas = [(key, [[by_rank[rank] for rank in stage] for stage in stages]) for key, stages in models]
    first = replicas[0][1][0][0]
    if _holds_a_piece([stage[0] for stage in replicas[0][1]], other_shapes, len(replicas)):
        dp = len(replicas)
        wanted = {name: {path: _shrunk(shapes, dp) for path, shapes in paths.items()}
                  for name, paths in (other_shapes or {}).items()}
        each = [merge_model(stages, reference, wanted, [other for j, (_, other) in enumerate(replicas) if j != i],
                            (1.0, float(dp))) for i, (_, stages) in enumerate(replicas)]
        data, parents, frames, report = join_replicas(each, reference or {}, other_shapes or {})
        raw = dict(first.document().raw)
        raw["data"] = data
        report.update({"layout": text, "model": 0, "dp_cp_ep": [list(key) for key, _ in replicas],
                       "warnings": warnings, "stages": [[s.rank for s in stage] for _, stages in replicas
                                                        for stage in stages],
                       "replicas": [[[s.rank for s in stage] for stage in stages] for _, stages in replicas]})
        return [MergedSource(first.step, None, "merged", first.url, DumpDocument(raw), parents, frames, report)]
    out = []
    for index, (key, stage_sources) in enumerate(replicas):
        data, parents, frames, report = merge_model(stage_sources, reference, other_shapes)
        head = stage_sources[0][0]
        raw = dict(head.document().raw)
        raw["data"] = data
        report.update({"layout": text, "model": index, "dp_cp_ep": list(key), "warnings": warnings,
                       "stages": [[source.rank for source in stage] for stage in stage_sources]})
        out.append(MergedSource(head.step, None, f"merged{index}" if len(replicas) > 1 else "merged",
                                head.url, DumpDocument(raw), parents, frames, report))
    return out
