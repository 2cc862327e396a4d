"""The merge of one tensor leaf across the members of a parallel layout (the tensor-parallel ranks
of a stage, or the data-parallel replicas of a logical model): shard, replica, partial sum or
partial value, decided by shapes (spec/FORMAT.md section 26.4); :mod:`msprobe.readers._merged`
builds the logical model with it."""
from __future__ import annotations

import math
import re
from typing import Any, Optional

from msprobe.format.comm import comm_api
from msprobe.format.nonfinite import stat_kinds
from msprobe.format.parallel import merge_shard_stats
from msprobe.format.stats import MAX, MEAN, MIN, NORM, STAT_KEYS, stats_equal

_STATS = STAT_KEYS
#: integer dtypes (counts), as the dumpers spell them
_COUNTS = re.compile(r"^(torch\.)?u?int(8|16|32|64)$|^U?Int(8|16|32|64)$")


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
    """A NaN or +/-Inf among a tensor leaf's statistics, as the format classifies them
    (:func:`msprobe.format.nonfinite.stat_kinds`, the rule of compare's first NaN/Inf)."""
    return _is_leaf(leaf) and bool(stat_kinds(leaf.get(stat) for stat in _STATS))


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


class _Merger:
    """Merges one record of a group of members (the tensor-parallel ranks of a stage, or the
    data-parallel replicas of a model): each member a list of ranks."""

    def __init__(self, members: list, reference: dict, other_shapes: Optional[dict],
                 findings: list, partials: Optional[list] = None, scale_backward: float = 1.0):
        self.members, self.reference, self.other_shapes = members, reference, other_shapes
        self.findings = findings
        self.partials = partials or [_Reduced({}) for _ in members]
        self.peers: list = []  # the same tensor on the other data-parallel replicas (:meth:`record`)
        self.scale_backward = scale_backward
        self.kinds: dict = {}
        self.suspects: dict = {}
        self.name = ""
        self.partial_values: list = [set() for _ in members]  # per member: signatures of partial values
        self.tensors: Any = None  # the merged step's TensorRecipes (a tensor dump), else None
        self.balanced = 0  # context-parallel members: the tokens of a sequence each holds (load-balanced chunks)
        self.summed_values: list = [set() for _ in members]  # per member: signatures of its partial sums (_summed)

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
        if isinstance(first, dict) and first.get("type") == "int":
            return self._size(nodes, ref, path)
        if isinstance(first, dict):
            return {key: self._node([n.get(key) if isinstance(n, dict) else None for n in nodes],
                                    ref.get(key) if isinstance(ref, dict) else None, f"{path}.{key}".lstrip("."))
                    for key, value in first.items()}
        if isinstance(first, list):
            return [self._node([n[i] if isinstance(n, list) and i < len(n) else None for n in nodes],
                               ref[i] if isinstance(ref, list) and i < len(ref) else None, f"{path}.{i}".lstrip("."))
                    for i in range(len(first))]
        return first

    def _size(self, nodes: list, ref: Any, path: str) -> Any:
        """An int the members hold (a shape's output, a reshape's size): where the other side's value
        is not theirs but their sum (each member's size of its piece: a data-parallel replica's batch,
        a shard's width), the whole's, the other side's; else the first member's."""
        values = [n.get("value") if isinstance(n, dict) else None for n in nodes]
        sizes = [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v > 0]
        whole = ref.get("value") if isinstance(ref, dict) and ref.get("type") == "int" else None
        if len(nodes) > 1 and len(sizes) == len(nodes) and isinstance(whole, int) and whole != sizes[0] and \
                sum(sizes) == whole:
            self.kinds[path] = "a piece's size"
            return dict(nodes[0], value=whole)
        return nodes[0]

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
            peers = [_at(peer, path) for peer in self.peers]  # (integers, counts, are no parameter)
            if peers and not _is_backward(self.name) and not _COUNTS.match(str(nodes[0].get("dtype"))) and \
                    all(_is_leaf(peer) and _same(peer, nodes[0]) for peer in peers):
                return dims[-1]
            return None
        return -2

    def _leaf(self, nodes: list, ref: Optional[dict], path: str) -> Any:
        partial = self._partial_leaf(nodes, path)
        if partial is not None:
            return partial
        first = nodes[0]
        if not all(_is_leaf(n) for n in nodes):
            self.kinds[path] = "missing on a rank"
            return first
        if any(shape != _shape(first) and len(shape) != len(_shape(first)) for shape in (_shape(n) for n in nodes)):
            self.kinds[path] = "shapes differ across the ranks"
            return first
        scattered = self._scattered(nodes, path)
        if scattered is not None:
            return scattered
        nodes, reduced = self._reduced(nodes)
        shapes = [_shape(n) for n in nodes]
        reading = self._reading(nodes, shapes, path)
        if reading == -2:  # shapes cannot decide: equal statistics are one tensor, others pieces of one
            same = all(_same(n, nodes[0]) for n in nodes[1:]) or (ref is not None and _shape(ref) == shapes[0])
            reading = None if same else self._dim(shapes, ref)
        self._anomalies(nodes, path)
        if reading is None:
            return self._replicas(nodes, ref, path, reduced)
        self.kinds[path] = "sharded"
        if self.scale_backward != 1.0 and _is_backward(self.name):  # a replica's gradient of its own loss
            nodes = [dict(n, **{stat: n[stat] / self.scale_backward for stat in _STATS
                                if isinstance(n.get(stat), float)}) for n in nodes]
        self._outside(nodes, ref, path)
        divisor = self.scale_backward if self.scale_backward != 1.0 and _is_backward(self.name) else 1.0
        return self._tensor(merge_shard_stats(nodes, reading), "cat", nodes, reading, divisor)

    def _tensor(self, merged: dict, how: str, nodes: list, dim: int = 0, divisor: float = 1.0) -> dict:
        """``merged`` naming the tensor made of the members' (:mod:`msprobe.readers._merge_tensors`),
        or none when they have none."""
        shape, groups = _shape(nodes[0]), 1
        size = shape[dim] if -len(shape) <= dim < len(shape) else 0
        if how == "cat" and self.balanced and len(nodes) > 1 and self.balanced % 2 == 0 and size and \
                size % self.balanced == 0:
            how, groups = "balanced", size // self.balanced  # the members' chunks put in sequence order
        made = self.tensors.made(how, [n.get("data_name") for n in nodes], dim, divisor, groups) \
            if self.tensors is not None else None
        if made is None:
            merged.pop("data_name", None)
        else:
            merged["data_name"] = made
        return merged

    def _partial_leaf(self, nodes: list, path: str) -> Optional[dict]:
        """The leaf as a partial value (:meth:`_partial_value`) when it is one: an input every member
        holds as a partial value, or a one-element output of a record with such an input."""
        present = [(i, n) for i, n in enumerate(nodes) if _is_leaf(n)]
        if not present:
            return None
        if path.startswith("input"):
            if all(_signature(n) in self.partial_values[i] for i, n in present):
                self.record_partial = True
                return self._partial_value(present, path)
        elif self.record_partial and math.prod(_shape(present[0][1])) == 1:
            return self._partial_value(present, path)
        return None

    def _scattered(self, nodes: list, path: str) -> Optional[dict]:
        """A partial sum every member reduce_scatters (a sequence-parallel row-parallel output, the
        gradient of a gathered sequence): the sum one card computes is the members' pieces joined
        along the dimension they split (sequence parallelism's reduce_scatter), else None."""
        pieces = [partial.scattered(n) for partial, n in zip(self.partials, nodes)]
        if len(nodes) < 2 or not all(piece is not None for piece in pieces):
            return None
        whole, shapes = _shape(nodes[0]), [_shape(piece) for piece in pieces]
        dims = [d for d in range(len(whole)) if all(len(shape) == len(whole) for shape in shapes) and
                sum(shape[d] for shape in shapes) == whole[d] and  # (uneven pieces: a list-form reduce_scatter)
                all(shape[o] == whole[o] for shape in shapes for o in range(len(whole)) if o != d)]
        if not dims:
            return None
        self.kinds[path] = "partial: its reduce_scatter's pieces"
        joined = merge_shard_stats(pieces, dims[0])
        merged = dict(nodes[0], **{stat: joined.get(stat) for stat in _STATS})  # the partial's dtype, flags
        merged.pop("md5", None)
        # the tensor: the members' partial sums added, in the record's own layout (the pieces are the
        # collective's, whose layout may differ: a batch-first activation transposed to Megatron's
        # sequence-first one before its reduce_scatter joins along the sequence, not the batch)
        return self._tensor(merged, "sum", nodes)

    def _reduced(self, nodes: list) -> tuple:
        """(nodes, reduced): each rank's partial sum replaced by its all_reduce's result (the sum one
        card computes) when every member's is one."""
        results = [partial.get(n) for partial, n in zip(self.partials, nodes)]
        if not all(r is not None for r in results):
            return nodes, False
        nodes = [dict(n, **{stat: r.get(stat) for stat in _STATS}) for n, r in zip(nodes, results)]
        for n, r in zip(nodes, results):
            n.pop("md5", None)
            n.pop("data_name", None)
            if self.tensors is not None and r.get("data_name") is not None:
                n["data_name"] = r["data_name"]  # the all_reduce's result: the sum one card computes
        return nodes, True

    def _replicas(self, nodes: list, ref: Optional[dict], path: str, reduced: bool) -> dict:
        """A tensor each member holds whole: kept once when they agree; else the replicas' losses'
        mean, a data-parallel partial gradient, a partial value of shards, or a finding."""
        first = nodes[0]
        if self.scale_backward != 1.0 and not _is_backward(self.name) and _COUNTS.match(str(first.get("dtype"))):
            return self._counted(nodes, path)
        if all(_same(n, first) for n in nodes[1:]):
            self.kinds[path] = "partial" if reduced else "replicated"
            return first
        if len(nodes) == len(self.summed_values) and all(_signature(n) in held for n, held in zip(nodes, self.summed_values)):
            return self._summed(nodes, path)  # a partial sum passed on (a module's output of its last linear's)
        if any(_anomalous(n) for n in nodes):
            return self._disagreeing(nodes, ref, path)
        one = math.prod(_shape(first)) == 1
        if self.scale_backward != 1.0:
            if _is_backward(self.name):
                return self._replica_mean(nodes, path)
            if one:
                return self._mean(nodes, path)
        on_shards = any(kind in ("sharded", "partial of shards") for key, kind in self.kinds.items()
                        if key.startswith("input"))
        if one and not path.startswith("input") and on_shards:
            return self._partial_value(list(enumerate(nodes)), path)
        if on_shards and path.startswith("output"):  # backward: a gradient of what a shard alone computed;
            return self._summed(nodes, path)  # forward: a row-parallel partial sum reduced later (an expert's fc2)
        return self._disagreeing(nodes, ref, path)

    def _summed(self, nodes: list, path: str) -> dict:
        """A gradient each member holds whole, of what it computed on its shard alone (a bias added to
        a piece of the sequence: its gradient sums that piece's positions): the whole's is the
        members' sum. Its Mean is the sum of theirs; Max, Min and Norm of a sum cannot be made of the
        parts' (left out: not compared)."""
        merged = dict(nodes[0], **{stat: None for stat in _STATS})
        merged.pop("md5", None)
        means = [n.get(MEAN.key) for n in nodes]
        if all(isinstance(v, (int, float)) for v in means):
            merged[MEAN.key] = sum(means)
        if len(nodes) == len(self.summed_values):
            for n, held in zip(nodes, self.summed_values):
                held.add(_signature(n))
        self.kinds[path] = "partial: the members' sum"
        merged.pop("data_name", None)
        return merged

    def _counted(self, nodes: list, path: str) -> dict:
        """Integers each data-parallel replica holds whole (counts over its share of the batch: the
        tokens routed to each expert; equal or not): the whole batch's are their sum, whose Max and
        Min cannot be made of the parts' (left out: not compared)."""
        merged = dict(nodes[0], **{stat: None for stat in _STATS})
        merged.pop("md5", None)
        merged.pop("data_name", None)
        self.kinds[path] = "data-parallel partial: the replicas' counts, summed"
        return merged

    def _partial_value(self, present: list, path: str) -> dict:
        """One value per rank computed from its shard alone (a gradient clip's norm of each shard, and
        what is made of it before the all_reduce that completes it; ``present``: [(member, leaf)]): no
        statistic of the whole can be made of them: not compared (the all_reduce's result is)."""
        for i, n in present:
            self.partial_values[i].add(_signature(n))
        merged = dict(present[0][1], **{stat: None for stat in _STATS})
        merged.pop("md5", None)
        merged.pop("data_name", None)  # no tensor of the whole either
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
        return self._tensor(merged, "average", nodes)

    def _mean(self, nodes: list, path: str) -> dict:
        """One value per replica (a loss averaged over each replica's share of the batch): their mean."""
        values = [n.get(MEAN.key) for n in nodes]
        merged = dict(nodes[0])
        merged.pop("md5", None)
        if all(isinstance(v, (int, float)) for v in values):
            mean = sum(values) / len(values)
            merged.update({MAX.key: mean, MIN.key: mean, MEAN.key: mean, NORM.key: abs(mean)})
        self.kinds[path] = "mean over the replicas"
        return self._tensor(merged, "average", nodes)

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
        varying = [dim for dim in range(len(shapes[0])) if len({s[dim] for s in shapes if len(s) == len(shapes[0])}) > 1]
        if len(varying) == 1 and all(len(s) == len(shapes[0]) for s in shapes):
            return varying[0]  # uneven pieces (tokens routed to experts) of a piece of the whole: the dimension they vary in
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


#: the reduce_scatter APIs whose input (the second argument) is one tensor: a partial sum on each rank
_SCATTERS = ("reduce_scatter_tensor", "_reduce_scatter_base", "reduce_scatter_single")


class _Reduced:
    """The all_reduce calls of one rank, by their input: ``get(leaf)`` is the result of the
    all_reduce whose input is ``leaf`` (its statistics equal), or ``leaf`` divided by one of
    ``factors`` (a data-parallel gradient divided by the number of replicas before it is summed,
    Megatron's averaging), else None."""

    def __init__(self, data: dict, factors: tuple = (1.0,)):
        self.factors = factors
        self.by_shape: dict = {}
        self.scatters: dict = {}  # signature of a reduce_scatter's input -> its output (this rank's piece)
        self.scatter_lists: list = []  # (statistics of a list-form reduce_scatter's pieces joined, its output)
        for name, record in data.items():
            api = comm_api(name)
            if api is None or not isinstance(record, dict):
                continue
            args, out = record.get("input_args") or [], record.get("output") or []
            if api[0] == "all_reduce" and args and out and _is_leaf(args[0]) and _is_leaf(out[0]):
                self.by_shape.setdefault(_shape(args[0]), []).append((args[0], out[0]))
            elif api[0] in _SCATTERS and len(args) > 1 and out and _is_leaf(args[1]) and _is_leaf(out[0]):
                self.scatters[_signature(args[1])] = out[0]
            elif api[0] == "reduce_scatter" and len(args) > 1 and isinstance(args[1], list) and args[1] and \
                    all(_is_leaf(piece) for piece in args[1]) and out and _is_leaf(out[0]):
                # the list form (Megatron's input_split_sizes): the pieces' concatenation is the partial sum
                self.scatter_lists.append((merge_shard_stats(args[1], 0), out[0]))

    def scattered(self, leaf: Any) -> Optional[dict]:
        """This rank's piece of the sum a reduce_scatter made of ``leaf`` (a partial sum), else None; a
        list-form reduce_scatter's pieces (in any order: a permutation of the tokens) whose joined
        statistics are ``leaf``'s (within the tolerance of section 15.1: joined in float64)."""
        if not _is_leaf(leaf):
            return None
        found = self.scatters.get(_signature(leaf))
        if found is None:
            found = next((piece for whole, piece in self.scatter_lists if _same(whole, leaf)), None)
        return found

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


def _at(node: Any, path: str) -> Any:
    for part in path.split(".") if path else ():
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _last_backward(names: list) -> int:
    return max((i for i, name in enumerate(names) if _is_backward(name) and comm_api(name) is None), default=-1)
