"""The order of a logical model's records (the step's happens-before order over its pipeline
stages) and the lining up of a tensor-parallel group's ranks (spec/FORMAT.md sections 26.3, 26.4)."""
from __future__ import annotations

from typing import Any, Optional

from msprobe.format.comm import comm_api, comm_call
from msprobe.readers._merge_leaf import _last_backward, _leaves, _shape, _signature


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

    ours, theirs = keys(base, base_data), keys(names, data)
    matcher = difflib.SequenceMatcher(None, ours, theirs, autojunk=False)
    mapping: dict = {}
    extras: list = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            mapping.update(zip(base[i1:i2], names[j1:j2]))
            continue
        free = list(range(i1, i2)) if tag == "replace" else []
        for j in range(j1, j2) if tag in ("insert", "replace") else ():
            # a record whose sources read differently (a sum whose other part is zero on one rank) is
            # still the same record when its own name and shapes are
            i = next((i for i in free if ours[i][0] == theirs[j][0]), None)
            if i is None:
                extras.append((base[i1 - 1] if i1 > 0 else None, names[j]))
            else:
                free = [k for k in free if k > i]
                mapping[base[i]] = names[j]
    return mapping, extras


_COLLECTIVE = ("all", "from_root", "to_root", "sync")


class _Steps:
    """The graph of :func:`model_order`: nodes (runs of records, communication calls), each stage's
    chain of them, the sends and receives between stages and the collectives spanning stages."""

    def __init__(self, stage_ranks: list) -> None:
        self.stage_of = {rank: stage for stage, ranks in enumerate(stage_ranks) for rank in ranks}
        self.names: list = []   # node -> [(stage, name)]
        self.tail: list = []    # node -> whether it runs after its stage's last backward record
        self.chains: list = []
        self.sends: dict = {}
        self.recvs: dict = {}
        self.shared: dict = {}

    def add(self, names: list, tail: bool) -> int:
        self.names.append(list(names))
        self.tail.append(tail)
        return len(self.names) - 1

    def stage(self, stage: int, rank: int, data: dict, hint: Optional[tuple] = None) -> None:
        """The chain of one stage's records (``data``: its first rank's). ``hint``: ({name of a
        point-to-point call: the stage of its peer, None: none of the model's}, {names of the tail})
        where the ranks do not say them (a virtual pipeline stage, :mod:`msprobe.readers._merge_chunks`)."""
        names = list(data)
        if hint is not None:
            tails = [name in hint[1] for name in names]
        else:
            last = _last_backward(names)
            tails = [0 <= last < index for index in range(len(names))]
        chain: list = []
        run: list = []
        calls: list = []  # adjacent communication calls: [(node, call, record)]
        counts: dict = {}
        for index, name in enumerate(names):
            if (run or calls) and tails[index] != tails[index - 1]:  # the tail is a node of its own
                self._flush(chain, run, calls, tails[index - 1])
                run, calls = [], []
            if comm_api(name) is None:
                if calls:
                    self._flush(chain, [], calls, tails[index - 1])
                    calls = []
                run.append((stage, name))
                continue
            call = comm_call(name, data[name], rank, index)
            node = None
            if call is not None:
                peer = hint[0].get(name, -1) if hint is not None else -1
                node = self._call(stage, call, tails[index], counts, peer)
            if node is not None:
                if run:
                    chain.append(self.add(run, tails[index - 1]))
                    run = []
                calls.append((node, call, data[name]))
        self._flush(chain, run, calls, tails[-1] if tails else False)
        self.chains.append(chain)

    def _flush(self, chain: list, run: list, calls: list, tail: bool) -> None:
        """Appends a run of records, then adjacent communication calls with their sends first: calls
        issued together (a batch of isend/irecv, Megatron's send_forward_recv_forward) do not wait
        for each other, so a send there waits for no receive (unless it sends what one received)."""
        if run:
            chain.append(self.add(run, tail))
        received: set = set()
        for _, call, record in calls:
            if call.kind == "recv":
                received.update(_signature(leaf) for _, leaf in _leaves(record.get("output")))
        relay = [call.kind == "send" and any(_signature(leaf) in received
                                             for _, leaf in _leaves(record.get("input_args")))
                 for _, call, record in calls]
        if any(relay):
            chain.extend(node for node, _, _ in calls)
            return
        chain.extend(node for node, call, _ in calls if call.kind == "send")
        chain.extend(node for node, call, _ in calls if call.kind != "send")

    def _call(self, stage: int, call: Any, tail: bool, counts: dict, peer: Optional[int] = -1) -> Optional[int]:
        """The node of a communication call between stages (None for one within the stage).
        ``peer``: the stage of a point-to-point call's peer when the hint says it (-1: its rank's)."""
        stage_of = self.stage_of
        if call.kind in ("send", "recv") and peer != -1:
            other = peer if peer is not None else stage
        else:
            other = stage_of.get(call.peer, stage)
        if call.kind in ("send", "recv") and other != stage:
            key = ((stage, other) if call.kind == "send" else (other, stage)) + (call.tag,)
            node = self.add([], tail)
            (self.sends if call.kind == "send" else self.recvs).setdefault(key, []).append(node)
            return node
        if call.kind in _COLLECTIVE and call.group and len({stage_of[r] for r in call.group if r in stage_of}) > 1:
            group = (call.api, tuple(sorted(call.group)))
            seq = counts.get(group, 0)
            counts[group] = seq + 1
            if (group, seq) not in self.shared:
                self.shared[(group, seq)] = self.add([], tail)
            return self.shared[(group, seq)]
        return None

    def edges(self) -> tuple:
        """({node: [following nodes]}, [how many nodes each waits for])."""
        edges: dict = {node: [] for node in range(len(self.names))}
        waits = [0] * len(self.names)
        for chain in self.chains:
            for a, b in zip(chain, chain[1:]):
                edges[a].append(b)
                waits[b] += 1
        for key, items in self.sends.items():
            for send, recv in zip(items, self.recvs.get(key, [])):
                edges[send].append(recv)
                waits[recv] += 1
        return edges, waits

    def walk(self) -> list:
        """The records in the order of :func:`model_order`."""
        edges, waits = self.edges()
        ready = [chain[0] for chain in reversed(self.chains) if chain and waits[chain[0]] == 0]
        later: list = []
        out: list = []
        done: set = set()
        while len(done) < len(self.names):
            if ready:
                node = ready.pop()
            elif later:
                later.sort(key=lambda n: self.names[n][0][0] if self.names[n] else -1)
                node = later.pop(0)
            else:  # a receive whose send is not in the dump: let the earliest waiting node go
                node = min((n for n in range(len(self.names)) if n not in done), key=lambda n: (waits[n], n))
            if node in done:
                continue
            done.add(node)
            out.extend(self.names[node])
            for following in edges[node]:  # the chain's next first, the receiver last: it is taken next
                waits[following] -= 1
                if waits[following] == 0:
                    (later if self.tail[following] else ready).append(following)
        return out


def model_order(stage_ranks: list, stage_data: list, hints: Optional[list] = None) -> list:
    """[(stage, record name)] of the non-communication records of each stage (``stage_data``: the
    records of the stage's first rank) in the step's happens-before order across the stages.

    Each stage's records are a chain; a send to another stage of the model happens before the
    matching receive (the k-th from stage a to stage b with the k-th receive of b from a), a
    collective over ranks of several stages (a clip's norm over the model-parallel group) is one
    moment for all of them. Among the orders these allow, the one a single card runs is taken:
    after a send, the receiver goes on (the data is followed), and the records after a stage's
    last backward record (the optimizer's updates, the clip, the loss scaler) wait until no stage
    has anything else to do, then run stage after stage. ``hints``: per stage, what
    :meth:`_Steps.stage` takes where the ranks do not say it (virtual pipeline stages)."""
    steps = _Steps(stage_ranks)
    for stage, data in enumerate(stage_data):
        steps.stage(stage, stage_ranks[stage][0], data, hints[stage] if hints else None)
    return steps.walk()
