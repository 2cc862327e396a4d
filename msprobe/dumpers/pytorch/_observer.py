"""A module call's backward, observed without changing the autograd graph (spec/PRODUCER.md §20 item 43).

No node is added to the graph and no tensor is replaced: the gradients of a module's outputs come from
tensor hooks on them, the gradient of each of its inputs is the sum of what the module's own nodes (those
created during its forward, found from its outputs by the nodes' sequence numbers) send to that input,
taken from post hooks on those nodes and summed apart, in the order the engine runs them, in the
gradient's dtype (the real tool's identity node sums the same terms in the same order). Every hook
returns None, so the engine adds the same numbers in the same order as without the dumper.
"""
from __future__ import annotations

import itertools
import weakref
from typing import Any, Callable, Optional

import torch

from msprobe.dumpers.pytorch._apis import GUARD

_seq_nr = getattr(torch._C._autograd, "_get_sequence_nr", None)


def sequence_mark() -> Optional[int]:
    """The autograd sequence number the next node created in this thread gets (None: not known)."""
    return _seq_nr() if _seq_nr is not None else None


def _edge(t: torch.Tensor) -> tuple:
    """What the graph's edges into ``t`` look like: its node and output number, or the leaf itself."""
    return ("leaf", id(t)) if t.grad_fn is None else (id(t.grad_fn), t.output_nr)


def _node_edge(node: Any, nr: int) -> tuple:
    """The key of :func:`_edge` for the graph edge (node, output number)."""
    variable = getattr(node, "variable", None)
    return ("leaf", id(variable)) if variable is not None else (id(node), nr)


#: module forwards begun, counted: a later one is newer when two calls have the same mark
_STARTS = itertools.count()


class InputEdges:
    """A module call's input tensors that need a gradient, as graph edges, taken before its forward
    (an in-place op inside the module changes the tensor's node, not the edge its gradient reaches)."""

    __slots__ = ("mark", "order", "keys", "nodes", "apis")

    def __init__(self, tensors: list, mark: int) -> None:
        self.mark = mark
        self.order = next(_STARTS)  # (calls that created no node between them share a mark)
        self.apis: list = []  # API calls inside the forward that returned one of these inputs unchanged
        self.keys: dict = {}
        self.nodes: list = []  # kept until the forward ends, so that the ids stay theirs
        for index, t in enumerate(tensors):
            self.keys.setdefault(_edge(t), index)
            self.nodes.append(t if t.grad_fn is None else t.grad_fn)

    def holds(self, t: torch.Tensor) -> bool:
        return _edge(t) in self.keys

    def index_of(self, node: Any, nr: int) -> Optional[int]:
        return self.keys.get(_node_edge(node, nr))


class _Watch:
    """An output of a module call that is one of its inputs, unchanged (``nn.Identity``, a dropout that
    drops nothing): its gradient as 26.2.0's identity node on the outputs has it is what the nodes created
    after the call's forward, inside the module call that made it (its parent), send to that tensor (the
    users of the returned value there, not the uses before the call). Those nodes do not exist yet when
    the call ends: the walks of the module calls that end later (a sibling's, the parent's) find them
    and hook them (:func:`_consumers`). Uses after the parent's end are not looked for: the same tensor
    goes on as the parent's input to other calls (peft's q, k and v projections each pass the layer's
    input through their own ``lora_dropout``), and autograd cannot tell which of them got the value
    returned; without a user found, the output's gradient is the tensor's whole gradient."""

    __slots__ = ("grads", "position", "mark", "nodes", "keep", "parent")

    def __init__(self, grads: "CallGrads", position: int, mark: int, keep: Any, parent: Any) -> None:
        # ``mark``: the sequence number at the call's end (its users' nodes are from it on); not the start
        # count that :attr:`CallGrads.end` holds
        self.grads, self.position, self.mark, self.parent = grads, position, mark, parent
        self.nodes: set = set()
        self.keep = keep  # the tensor's node (or the leaf): its id, in the key, stays its own

    def found(self, node: Any, slots: list, seq: int) -> None:
        if id(node) in self.nodes:
            return
        self.nodes.add(id(node))
        grads, position = self.grads, self.position
        grads.watch_more(position)
        node.register_hook(lambda grad_inputs, grad_outputs: grads.watched_grad(position, slots, grad_inputs, seq))


#: edge key -> the watches of outputs that are inputs unchanged, kept until their parent call ends
WATCHES: dict = {}
#: the parent of a top-level module call: the model's own forward (not recorded, see :func:`model_users`)
MODEL = object()


def _found_watched(node: Any, seq: int) -> None:
    """``node`` (created by a module call's forward) sends gradients to watched tensors: hook it."""
    slots: dict = {}
    for slot, (nxt, nr) in enumerate(node.next_functions):
        if nxt is not None:
            for watch in WATCHES.get(_node_edge(nxt, nr), ()):
                if seq >= watch.mark:
                    slots.setdefault(id(watch), (watch, []))[1].append(slot)
    for watch, found in slots.values():
        watch.found(node, found, seq)


def model_users(tensors: list) -> None:
    """A module call begins with ``tensors`` as its inputs: the nodes the model's own forward made for
    them outside every module call (newer than a watch of a top-level call, reachable from them) may
    use a watched tensor, and are hooked. (The model's own forward is not hooked: 26.2.0 hooks no root,
    and a hook there would change the call stacks written for the records.)"""
    ends = [w.mark for each in WATCHES.values() for w in each if w.parent is MODEL]
    if not ends:
        return
    oldest = min(ends)
    seen: set = set()
    stack = [t.grad_fn for t in tensors if t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        seq = node_seq(node)
        if seq is None or seq < oldest:
            continue
        _found_watched(node, seq)
        stack.extend(nxt for nxt, _ in node.next_functions if nxt is not None and id(nxt) not in seen)


def _end_watches(parent: Any) -> None:
    """The watches whose parent call (its input edges, or :data:`MODEL`) has ended, dropped."""
    for key in list(WATCHES):
        left = [w for w in WATCHES[key] if w.parent is not parent]
        if left:
            WATCHES[key] = left
        else:
            del WATCHES[key]


def _consumers(outputs: list, edges: InputEdges, out_keys: dict) -> tuple:
    """The module's own nodes that send a gradient to one of its inputs, and those that send one to one of
    its outputs (an output used inside the module too): ({id: (node, [(slot, input index)])}, the same with
    output positions). A node is the module's when it was created during its forward (its sequence number
    from the mark on); the walk goes from the outputs' nodes and stops at older nodes and at leaves."""
    found: dict = {}
    inner: dict = {}
    seen: set = set()
    stack = [o.grad_fn for o in outputs if o.grad_fn is not None]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        seq = node_seq(node) or 0
        own = seq >= edges.mark  # (an output that is an input has an older node)
        if WATCHES and own:
            _found_watched(node, seq)
        for slot, (nxt, nr) in enumerate(node.next_functions):
            if nxt is None:
                continue
            index = edges.index_of(nxt, nr)
            if index is not None:
                found.setdefault(id(node), (node, []))[1].append((slot, index))
            for position in out_keys.get(_node_edge(nxt, nr), ()) if own else ():
                inner.setdefault(id(node), (node, []))[1].append((slot, position))
            if index is None and not hasattr(nxt, "variable") and id(nxt) not in seen \
                    and (node_seq(nxt) or 0) >= edges.mark:
                stack.append(nxt)
    return found, inner


class _Completed:
    """Module calls whose gradients are all in, not yet written: each is written where 26.2.0's identity
    node on its inputs would have run, i.e. before the first observed event of a node older than the call
    (its sequence number below the call's mark; the engine runs the newer ready node first), or at the end
    of the backward pass, newest first. Gradient accumulation (sequence number max) comes before."""

    def __init__(self) -> None:
        self.calls: list = []
        self.open: list = []  # begun, not all gradients in
        self.held: list = []  # written with their place held, an output's gradient still to come

    def add(self, call: "CallGrads") -> None:
        self.calls.append(call)

    def flush_before(self, seq: Optional[int], begun_after: Optional[int] = None) -> None:
        """Write the completed calls newer than the node ``seq`` (all: None), or those begun after the
        start count ``begun_after``."""
        if not self.calls:
            return

        def due(c: CallGrads) -> bool:
            return c.order > begun_after if begun_after is not None else seq is None or c.mark > seq

        self._flush(due)

    def flush_from(self, call: "CallGrads") -> None:
        """Write ``call`` and the completed calls newer than it (begun later with the same mark)."""
        self._flush(lambda c: (c.mark, c.order) >= (call.mark, call.order))

    def _flush(self, due: Callable[["CallGrads"], bool]) -> None:
        calls = [c for c in self.calls if due(c)]
        if not calls:
            return
        self.calls = [c for c in self.calls if not due(c)]
        for call in sorted(calls, key=lambda c: (-c.mark, -c.order)):
            call.emit()

    def flush_all(self) -> None:
        for call in self.open:
            call.finish()
        self.open = []
        self.flush_before(None)
        held, self.held = self.held, []
        for call in held:
            call.release()

    def older_event(self, seq: int, begun_after: Optional[int] = None) -> None:
        """A node older than a begun call runs: a call that waits on no node of its own is over.
        ``begun_after``: the event is the identity node 26.2.0 makes at the end of a forward, whose
        start count this is: only the calls begun after it are written first (not those inside it)."""
        if self.open:
            for call in [c for c in self.open if c.finish_on_older and c.mark > seq]:
                call.finish()
        if self.calls:
            self.flush_before(seq, begun_after)


COMPLETED = _Completed()


def node_seq(node: Any) -> Optional[int]:
    """A node's sequence number (None for a leaf's, whose gradient accumulation runs first)."""
    if node is None or hasattr(node, "variable"):
        return None
    try:
        return node._sequence_nr()  # noqa: SLF001 - torch's Node API
    except Exception:  # noqa: BLE001
        return None


#: module -> the start count at the end of its last forward (weakly: a module may go)
ENDS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def before_accumulation(module: Any) -> None:
    """A parameter of ``module`` gets its gradient: the node that sent it is the module's, older than
    the calls begun after the module's forward ended, whose completed records come first."""
    end = ENDS.get(module) if COMPLETED.calls else None
    if end is not None:
        COMPLETED.flush_before(None, end)


def before_event(seq: Optional[int]) -> None:
    """A hook of the dumper is about to record something for the node ``seq``: write first the module
    calls completed before it in the engine's order."""
    if seq is not None:
        COMPLETED.older_event(seq)


class CallGrads:
    """The gradients of one module call, gathered as the engine produces them. ``begin()`` runs at the
    first gradient of an output, ``done(grad_output, grad_input)`` once every gradient the module's own
    nodes send to its inputs has arrived (or, when a node of the module is never reached, when the input's
    node runs, or at the end of the backward pass)."""

    def __init__(self, n_out: int, n_in: int, mark: int, begin: Callable[[], None],
                 done: Callable[[tuple, tuple], None], hold: Optional[Callable[[], None]] = None,
                 order: Optional[int] = None) -> None:
        self.mark = mark
        self.order = next(_STARTS) if order is None else order
        self.grad_output: list = [None] * n_out
        self.inner: list = [None] * n_out  # what the module's own nodes send to each output
        self.hold = hold  # the record is due with an output's gradient to come: hold its place
        self.held = False
        self.grad_input: list = [None] * n_in
        self.pending = 0  # hooks of the module's nodes (and outputs that are inputs) still to fire
        self.outputs_left = n_out
        self.started = False
        self.finished = False
        self.finish_on_older = False  # no node of its own sends a gradient to an input
        self._begin, self._done = begin, done
        self.dispatchers: list = []
        self.apis: list = []
        self.out_apis: list = []  # API calls after the forward that returned one of its outputs unchanged
        self.out_seqs: Optional[list] = None  # each output's node
        self.fired: set = set()
        self.watched: dict = {}  # position of an output that is an input -> [users hooked to come, their sum]
        self.inputs_of: dict = {}  # position of an output that is an input -> the input's index
        self.end: Optional[int] = None  # the start count at the forward's end
        self.queued = False  # written in the engine's order of the completed calls even with no node of its own
        self.leaves: dict = {}  # id of an input that is a leaf (a parameter) -> its input index
        self.inside: set = set()  # positions of the outputs the module's own nodes use too
        self.arrived: set = set()
        self.apis_held = False
        # inputs that need a gradient, none of which the module's nodes (or an output that is one of them)
        # send one to: 26.2.0's identity node on the inputs, which writes the record, never runs (BART's
        # positional embedding called on a slice of the embeddings for its shape): no record
        self.silent = False

    def start(self) -> None:
        if self.started:
            return
        self.started = True
        COMPLETED.open.append(self)
        try:
            torch.autograd.Variable._execution_engine.queue_callback(_end_of_backward)  # noqa: SLF001
        except Exception:  # noqa: BLE001 - not inside a backward pass: the other completions remain
            pass
        if not self.silent:
            self._begin()

    def add_input(self, index: int, grad: Any) -> None:
        _accumulate(self.grad_input, index, grad)

    def inner_grads(self, slots: list, grad_inputs: tuple) -> None:
        """A node of the module's own sent gradients to outputs (an output used inside the module too)."""
        if not self.finished or self.held:
            for slot, position in slots:
                _accumulate(self.inner, position, grad_inputs[slot] if slot < len(grad_inputs) else None)

    def external(self, position: int, grad: Any) -> Any:
        """An output's gradient as 26.2.0's identity node on the outputs has it: what the users outside
        the module sent, i.e. the output's whole gradient less what the module's own nodes sent (None
        when nothing is left: no user outside the module, as 26.2.0 writes it)."""
        inner = self.inner[position]
        if inner is None or grad is None:
            return grad
        inside = GUARD.inside
        GUARD.inside = True
        try:
            with torch.no_grad():
                rest = torch.sub(grad, inner)
                return rest if bool(torch.any(rest)) else None
        except Exception:  # noqa: BLE001 - never break training for the dump
            return grad
        finally:
            GUARD.inside = inside

    def watch_more(self, position: int) -> None:
        """One more user (created after the forward) of the output at ``position``, an input unchanged."""
        self.watched.setdefault(position, [0, None])[0] += 1

    def watched_grad(self, position: int, slots: list, grad_inputs: tuple, seq: int) -> None:
        """A user of the output at ``position`` (an input unchanged) sent its gradient: once all have, the
        output's gradient is their sum, as 26.2.0's identity node on the outputs sums them."""
        watch = self.watched.get(position)
        if watch is None or watch[0] <= 0:
            return
        total = [watch[1]]
        for slot in slots:
            _accumulate(total, 0, grad_inputs[slot] if slot < len(grad_inputs) else None)
        watch[1] = total[0]
        watch[0] -= 1
        if watch[0] == 0:
            # 26.2.0's identity node on the outputs runs after these users, as the engine orders it
            # against the module calls completed by then: in the queue (:class:`_Completed`)
            self.queued = True
            self.output_grad(position, watch[1], self.inputs_of[position], seq)

    def whole_grad(self, position: int, grad: Any, input_index: Optional[int], seq: Optional[int]) -> None:
        """The whole gradient of the output at ``position`` (its tensor hook)."""
        watch = self.watched.get(position)
        if watch is None:
            self.output_grad(position, grad, input_index, seq)
        elif watch[0] > 0:  # a hooked user did not run: the output's gradient is what the others sent
            watch[0] = 0
            self.output_grad(position, watch[1], input_index, seq)

    def output_grad(self, position: int, grad: Any, input_index: Optional[int], seq: Optional[int]) -> None:
        if self.held:
            self.grad_output[position] = self.external(position, grad)
            self.outputs_left -= 1
            if self.outputs_left <= 0:
                COMPLETED.held.remove(self)
                self.release()
            return
        if self.finished:
            return
        grad = self.external(position, grad)
        if self.finish_on_older and seq is not None and self.end is not None:
            # (with no node of its own, the record is written by 26.2.0's identity node on the outputs,
            # made at the forward's end: the calls begun inside, an identity module's queued, come after)
            COMPLETED.older_event(seq, self.end)
        else:
            before_event(seq)
        self.start()
        self.grad_output[position] = grad
        self.outputs_left -= 1
        if self.out_apis and not self.finish_on_older:
            self._outputs_node(position)
        if input_index is not None:  # an output that is an input, unchanged: its gradient goes through
            self.add_input(input_index, grad)
            self.pending -= 1
        if self.finish_on_older and self.out_seqs is not None:
            # 26.2.0's identity node on the outputs runs once the outputs' users are done: when the first
            # output's node runs (with the outputs of that same node), not when an output used inside
            # another one (a ModelOutput's last_hidden_state under its pooler_output) gets its gradient
            self.fired.add(position)
            if all(i in self.fired for i, each in enumerate(self.out_seqs) if each == seq):
                self.finish()
                return
        self._maybe_finish()

    def node_grads(self, slots: list, grad_inputs: tuple, seq: Optional[int]) -> None:
        if self.finished:
            return
        before_event(seq)
        self.start()
        for slot, index in slots:
            self.add_input(index, grad_inputs[slot] if slot < len(grad_inputs) else None)
        self.pending -= 1
        self._maybe_finish()

    def _maybe_finish(self) -> None:
        if self.pending <= 0 and (self.outputs_left <= 0 or any(g is not None for g in self.grad_input)):
            self.finish()

    def input_node_runs(self, seq: Optional[int]) -> None:
        if self.started:
            self.finish()
        before_event(seq)

    def finish(self) -> None:
        """All gradients are in: written at the next older event (:class:`_Completed`)."""
        if self.finished or not self.started:
            return
        self.finished = True
        if self in COMPLETED.open:
            COMPLETED.open.remove(self)
        if self.finish_on_older and self.outputs_left > 0 and self.hold is not None:
            # 26.2.0's identity node on the outputs runs now, with what the users outside the module
            # sent to each output; an output used inside the module too gets its whole gradient later
            # (its node runs after the module's nodes): the record's place is held until then
            self.held = True
            COMPLETED.held.append(self)
            self.hold()
            for api in self.out_apis:  # (their places come after the module's)
                api.hold()
            return
        self._unhook()
        if self.finish_on_older and not self.queued:
            self.emit()  # 26.2.0's identity node on the outputs alone: it runs before the module's nodes
        else:
            COMPLETED.add(self)

    def _unhook(self) -> None:
        for fns, fn in self.dispatchers:
            if fn in fns:
                fns.remove(fn)
        self.dispatchers = []

    def _outputs_node(self, position: int) -> None:
        """26.2.0's identity node on the outputs runs once the users outside the module are done: when
        the gradients of the outputs not used inside are in (the APIs' places are held there if an output
        used inside, whose whole gradient comes after the module's own nodes, is still to come)."""
        self.arrived.add(position)
        if self.outputs_left <= 0:
            self.fire_out_apis()
        elif not self.apis_held and all(p in self.arrived for p in range(len(self.grad_output))
                                        if p not in self.inside):
            self.apis_held = True
            for api in self.out_apis:
                api.hold()

    def fire_out_apis(self) -> None:
        """The API calls that returned one of the outputs unchanged (``.to()`` of an output on its device):
        26.2.0 records them from its identity node on the outputs, with all the outputs' gradients."""
        apis, self.out_apis = self.out_apis, []
        for api in apis:
            api.fire(tuple(self.grad_output))

    def release(self) -> None:
        """A held record's gradients are in (or the backward pass is over): written at its place."""
        self.held = False
        self._unhook()
        self.emit()

    def emit(self) -> None:
        try:
            if not self.silent:
                self._done(tuple(self.grad_output), tuple(self.grad_input))
            # then the API calls that returned an input unchanged: 26.2.0 records them from its identity
            # node on the module's inputs, whose gradients are the module's input gradients
            for api in self.apis:
                api(tuple(self.grad_input))
            self.fire_out_apis()
        except Exception:  # noqa: BLE001 - never break training for the dump
            pass


class OutputApi:
    """An API call after a module call's forward that returned one of its outputs unchanged, recorded by
    ``record(grads, grads)`` with the module's output gradients; ``reserve()`` holds its place in the
    documents (returning what drops the place when nothing fills it)."""

    __slots__ = ("record", "reserve", "drop")

    def __init__(self, record: Callable[[tuple, tuple], Any], reserve: Callable[[], Callable[[], None]]) -> None:
        self.record, self.reserve = record, reserve
        self.drop: Optional[Callable[[], None]] = None

    def hold(self) -> None:
        self.drop = self.reserve()

    def fire(self, grads: tuple) -> None:
        try:
            self.record(grads, grads)
        finally:
            if self.drop is not None:
                self.drop()


def _accumulate(sums: list, index: int, grad: Any) -> None:
    """``sums[index] += grad`` apart from the graph (None: nothing yet)."""
    if grad is None:
        return
    have = sums[index]
    if have is None:
        sums[index] = grad
        return
    inside = GUARD.inside
    GUARD.inside = True
    try:
        with torch.no_grad():
            sums[index] = torch.add(have, grad)
    finally:
        GUARD.inside = inside


#: id of a leaf -> (the call whose identity node in 26.2.0 hands it its gradient, its input index there)
RELEASED: dict = {}


def leaf_accumulates(leaf: torch.Tensor) -> None:
    """The gradient of ``leaf`` (a parameter) is accumulated now. When it is an input of a completed module
    call (``_WeightNorm`` gets a parametrization's ``original0`` and ``original1``), 26.2.0's identity node
    on that call's inputs sits between the call's nodes and the leaf's accumulation, and ran before it:
    the call's record (and those of the newer completed calls, which the engine runs first) is written
    now, and the leaves it hands gradients to are accumulated in its input order (:func:`release_order`)."""
    calls = [c for c in COMPLETED.calls if id(leaf) in c.leaves]
    if not calls:
        return
    COMPLETED.flush_from(min(calls, key=lambda c: (c.mark, c.order)))
    for call in calls:
        for key, index in call.leaves.items():
            RELEASED.setdefault(key, (call, index))


def release_order(names: list, leaf_ids: dict) -> list:
    """``names`` (parameter names, in the order their gradients were accumulated here) in the order 26.2.0
    accumulates them: the leaves one identity node hands gradients to come together, where the first of
    them came, in that node's input order (``leaf_ids``: name -> id of the parameter)."""
    first: dict = {}
    keys = []
    for position, name in enumerate(names):
        group = RELEASED.get(leaf_ids.get(name))
        if group is None:
            keys.append((position, 0))
        else:
            keys.append((first.setdefault(id(group[0]), position), group[1]))
    return [name for _, name in sorted(zip(keys, names))]


def _end_of_backward() -> None:
    COMPLETED.flush_all()
    WATCHES.clear()
    RELEASED.clear()


def observed_output(t: Any) -> bool:
    """Whether ``t``, as it is now, is a module output whose gradient a module call observes."""
    reg = getattr(t, "_msprobe_grad_hooks", None)
    return reg is not None and reg[0] is t.grad_fn


def changed_output(t: Any) -> bool:
    """Whether ``t`` was a module output whose gradient a module call observes, changed in place since."""
    reg = getattr(t, "_msprobe_grad_hooks", None)
    return reg is not None and reg[0] is not t.grad_fn


def output_call(t: Any) -> Optional["CallGrads"]:
    """The outermost module call whose output ``t`` is, as it is now (None: none observes it)."""
    return getattr(t, "_msprobe_out_call", None) if observed_output(t) else None


def on_grad(t: torch.Tensor, fn: Callable[[Any], None], last: bool = False) -> Optional[list]:
    """Call ``fn(grad)`` with the gradient of ``t`` (as it is now: a later in-place op does not move it).
    One hook per tensor node, whose callbacks run last-added first: an outer module, whose forward ends
    after its inner module's, sees the gradient of their common output first (the order of 26.2.0's
    nested identity nodes)."""
    node = t.grad_fn
    reg = getattr(t, "_msprobe_grad_hooks", None)
    if reg is None or reg[0] is not node:
        fns: list = []

        def hook(grad, fns=fns):
            for each in list(fns):
                try:
                    each(grad)
                except Exception:  # noqa: BLE001 - never break training for the dump
                    pass

        t.register_hook(hook)
        reg = (node, fns)
        try:
            t._msprobe_grad_hooks = reg  # type: ignore[attr-defined]  # noqa: SLF001
        except Exception:  # noqa: BLE001 - a tensor subclass without attributes: one hook per module
            pass
    reg[1].insert(len(reg[1]) if last else 0, fn)
    return reg[1]


def observe(outputs: list, edges: Optional[InputEdges], n_in: int, begin: Callable[[], None],
            done: Callable[[tuple, tuple], None], hold: Optional[Callable[[], None]] = None,
            watch: bool = False, parent: Optional[InputEdges] = None) -> CallGrads:
    """Hook one module call's backward: ``outputs`` are its output tensors that need a gradient (depth
    first), ``edges`` its inputs' (None: no input needs a gradient); ``hold()`` holds the record's place
    when it is due before all the outputs' gradients are in (without: those are written None). ``watch``
    (module calls): an output that is an input unchanged is watched for its users until the module call
    whose forward encloses this one, ``parent`` (its input edges; None: none), ends (:class:`_Watch`)."""
    grads = CallGrads(len(outputs), n_in, edges.mark if edges is not None else (sequence_mark() or 0), begin, done,
                      hold, edges.order if edges is not None else None)
    out_keys: dict = {}
    for position, out in enumerate(outputs):
        out_keys.setdefault(_edge(out), []).append(position)
    consumers, inner = _consumers(outputs, edges, out_keys) if edges is not None else ({}, {})
    grads.end = next(_STARTS)
    grads.pending = len(consumers)
    grads.finish_on_older = not consumers
    grads.silent = not consumers and edges is not None and bool(edges.keys) and not any(map(edges.holds, outputs))
    if grads.silent:
        grads.hold = None
    grads.out_seqs = [node_seq(o.grad_fn) for o in outputs]
    grads.inside = {position for _, slots in inner.values() for _, position in slots}
    for node, slots in consumers.values():
        seq = node_seq(node)
        node.register_hook(lambda grad_inputs, grad_outputs, slots=slots, seq=seq:
                           grads.node_grads(slots, grad_inputs, seq))
    for node, slots in inner.values():
        node.register_hook(lambda grad_inputs, grad_outputs, slots=slots: grads.inner_grads(slots, grad_inputs))
    if edges is not None:
        for node in {id(n): n for n in edges.nodes}.values():
            if isinstance(node, torch.Tensor):
                continue  # a leaf: the end of the backward pass completes the record
            seq = node_seq(node)
            node.register_prehook(lambda grad_outputs, seq=seq: grads.input_node_runs(seq))
    for position, out in enumerate(outputs):
        index = edges.keys.get(_edge(out)) if edges is not None else None
        grads.pending += index is not None

        seq = node_seq(out.grad_fn)

        def got(grad, position=position, index=index, seq=seq):
            grads.whole_grad(position, grad, index, seq)

        fns = on_grad(out, got)
        if fns is not None:
            grads.dispatchers.append((fns, got))
        if watch:
            try:
                out._msprobe_out_call = grads  # noqa: SLF001 - the outermost wins
            except Exception:  # noqa: BLE001 - a tensor subclass without attributes
                pass
    if edges is not None:
        grads.apis = edges.apis
        grads.leaves = {key[1]: index for key, index in edges.keys.items() if key[0] == "leaf"}
        edges.nodes = []  # (the ids served the walk; a hook on an input's node must not keep it alive)
    if watch:
        _watch(grads, outputs, edges, parent)
    return grads


def _watch(grads: CallGrads, outputs: list, edges: Optional[InputEdges], parent: Optional[InputEdges]) -> None:
    """Watch the outputs that are inputs unchanged for their users to come inside ``parent`` (None: the
    model's own forward); the watches whose parent this call is are over (its walk has run)."""
    if WATCHES and edges is not None:
        _end_watches(edges)
    if edges is None:
        return
    if len(WATCHES) > 4096:
        WATCHES.clear()
    end = sequence_mark() or 0
    for position, out in enumerate(outputs):
        if edges.holds(out):
            grads.inputs_of[position] = edges.keys[_edge(out)]
            WATCHES.setdefault(_edge(out), []).append(
                _Watch(grads, position, end, out.grad_fn or out, MODEL if parent is None else parent))
