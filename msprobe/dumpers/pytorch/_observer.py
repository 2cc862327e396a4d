"""A module call's backward, observed without changing the autograd graph (spec/PRODUCER.md §20 item 43).

No node is added to the graph and no tensor is replaced: the gradients of a module's outputs come from
tensor hooks on them, the gradient of each of its inputs is the sum of what the module's own nodes (those
created during its forward, found from its outputs by the nodes' sequence numbers) send to that input,
taken from post hooks on those nodes and summed apart, in the order the engine runs them, in the
gradient's dtype (the real tool's identity node sums the same terms in the same order). Every hook
returns None, so the engine adds the same numbers in the same order as without the dumper.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from msprobe.dumpers.pytorch._apis import GUARD
from msprobe.dumpers.pytorch._edges import STARTS, InputEdges, edge, node_edge, node_seq, sequence_mark
from msprobe.dumpers.pytorch._order import COMPLETED, before_event, end_of_backward
from msprobe.dumpers.pytorch._watches import WATCHES, found_watched, watch_outputs

__all__ = ["CallGrads", "OutputApi", "changed_output", "observe", "observed_output", "on_grad", "output_call"]

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
            found_watched(node, seq)
        for slot, (nxt, nr) in enumerate(node.next_functions):
            if nxt is None:
                continue
            index = edges.index_of(nxt, nr)
            if index is not None:
                found.setdefault(id(node), (node, []))[1].append((slot, index))
            for position in out_keys.get(node_edge(nxt, nr), ()) if own else ():
                inner.setdefault(id(node), (node, []))[1].append((slot, position))
            if index is None and not hasattr(nxt, "variable") and id(nxt) not in seen \
                    and (node_seq(nxt) or 0) >= edges.mark:
                stack.append(nxt)
    return found, inner


class CallGrads:
    """The gradients of one module call, gathered as the engine produces them. ``begin()`` runs at the
    first gradient of an output, ``done(grad_output, grad_input)`` once every gradient the module's own
    nodes send to its inputs has arrived (or, when a node of the module is never reached, when the input's
    node runs, or at the end of the backward pass)."""

    def __init__(self, n_out: int, n_in: int, mark: int, begin: Callable[[], None],
                 done: Callable[[tuple, tuple], None], hold: Optional[Callable[[], None]] = None,
                 order: Optional[int] = None) -> None:
        self.mark = mark
        self.order = next(STARTS) if order is None else order
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
            torch.autograd.Variable._execution_engine.queue_callback(end_of_backward)  # noqa: SLF001
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
            # against the module calls completed by then: in the queue (:class:`Completed`)
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
        """All gradients are in: written at the next older event (:class:`Completed`)."""
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
    whose forward encloses this one, ``parent`` (its input edges; None: none), ends (:class:`Watch`)."""
    grads = CallGrads(len(outputs), n_in, edges.mark if edges is not None else (sequence_mark() or 0), begin, done,
                      hold, edges.order if edges is not None else None)
    out_keys: dict = {}
    for position, out in enumerate(outputs):
        out_keys.setdefault(edge(out), []).append(position)
    consumers, inner = _consumers(outputs, edges, out_keys) if edges is not None else ({}, {})
    grads.end = next(STARTS)
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
        index = edges.keys.get(edge(out)) if edges is not None else None
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
        watch_outputs(grads, outputs, edges, parent)
    return grads
