"""A Cell call's backward, observed without changing the autograd graph (spec/PRODUCER.md §20 item 43).

MindSpore's own Cell backward hooks (``Cell.register_backward_hook``) route the Cell's positional tensor
inputs and its outputs through a ``CellBackwardHook`` primitive, an identity node of its own: a tensor
used both inside and outside the Cell then gets its gradient summed in another order. PyNative MindSpore
(2.10) also shows its autograd graph to Python, as torch does: ``Tensor._grad_node`` (a ``BackwardNode``
with ``next_functions``, ``_sequence_nr()``, ``_unique_id()``, post hooks ``register_hook`` and pre hooks
``register_prehook``) and ``Tensor._output_index``. This module observes a Cell call through them; no node
is added and no tensor replaced:

* the gradient of each output (the record's ``input``) comes from a pre hook on its node (its gradient
  for that output: not a tensor hook, which a ``mindspore.jit`` graph the tensor goes into would have to
  compile);
* the gradient of each positional tensor input (the record's ``output``) is the sum of what the Cell's
  own nodes (created during its forward: sequence numbers from the call's mark on, found from the
  outputs' nodes) send to that input, taken from post hooks on those nodes and summed apart in the
  order the engine runs them (the terms and order of the ``CellBackwardHook`` node's sum);
* the record is written where that identity node would have run: once every such node has sent its
  gradient (or the input's node runs), before the next observed event of an older node or of an API
  call begun earlier (so after the gradients of the Cell's parameters are accumulated), or at the end of
  the backward pass; calls completed together are written newest first.

Every hook returns None: the engine adds the same numbers in the same order as without the dumper.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable, Optional

from mindspore import Tensor

from msprobe.dumpers.mindspore._apis import GUARD

#: whether this MindSpore shows its autograd graph to Python (tests force False to check the fallback)
SUPPORTED = hasattr(Tensor, "_grad_node") and hasattr(Tensor, "_output_index")
_LEAF = 1 << 63  # a leaf's node (a parameter, an input that requires grad) has sequence number 2**64 - 1
#: Cell and API calls begun, counted: an API's backward event writes first the calls begun after it
ORDER = itertools.count()


def node_seq(node: Any) -> Optional[int]:
    """A node's sequence number (None for a leaf's node, or what is not a node)."""
    try:
        seq = node._sequence_nr()  # noqa: SLF001 - MindSpore's BackwardNode API
    except Exception:  # noqa: BLE001 - never break training for the dump
        return None
    return None if seq >= _LEAF else seq


def _node(t: Any) -> Any:
    try:
        return t._grad_node  # noqa: SLF001
    except Exception:  # noqa: BLE001
        return None


def _output_index(t: Tensor) -> int:
    return int(getattr(t, "_output_index", 0) or 0)


def _edge(t: Tensor) -> Optional[tuple]:
    """The graph edge the gradient of ``t`` goes to: (its node's id, output number); None: no gradient."""
    node = _node(t)
    if node is None:
        return None
    return node._unique_id(), _output_index(t)  # noqa: SLF001


def top_tensors(values: Any) -> list:
    """The tensors MindSpore's Cell backward hook takes from a Cell's arguments or output: the output
    itself, or the items of a tuple that are tensors (not those nested deeper)."""
    if isinstance(values, Tensor):
        return [values]
    if isinstance(values, tuple):
        return [v for v in values if isinstance(v, Tensor)]
    return []


class CellObserver:
    """One dumper's observed Cell calls: the newest node seen (the next call's mark), the calls whose
    gradients are in and whose records wait for their place, the end-of-backward callback."""

    def __init__(self, executor: Any) -> None:
        self.executor = executor
        self.seen = -1  # the newest sequence number seen (a lower bound of the next node's)
        self.completed: list = []
        self.open: list = []  # begun, not all gradients in
        self.grad_fns: dict = {}  # node id -> (node, [(output index, callback)]) of the outputs' pre hooks
        self.final_queued = False

    # ---------------------------------------------------------------- forward
    def saw(self, tensors: list) -> None:
        for t in tensors:
            seq = node_seq(_node(t))
            if seq is not None and seq > self.seen:
                self.seen = seq

    def inputs(self, args: tuple, kwargs: dict) -> "Inputs":
        """A Cell call begins with ``args`` and ``kwargs``: its positional tensors' edges and its mark
        (above every node seen so far, its keyword tensors' too)."""
        tensors = top_tensors(args)
        self.saw(tensors)
        self.saw(top_tensors(tuple(kwargs.values())))
        return Inputs(tensors, self.seen + 1)

    def observe(self, inputs: "Inputs", output: Any, begin: Callable[[], None],
                leave: Callable[[], None], done: Callable[[tuple, tuple], None]) -> Optional["CellCall"]:
        """The Cell call's forward ended with ``output``: hook its backward (None: nothing to observe:
        no positional tensor input, as MindSpore's hook, or no output needing a gradient)."""
        outputs = top_tensors(output)
        if not inputs.count or not any(_node(o) is not None for o in outputs):
            return None
        call = CellCall(self, inputs, len(outputs), begin, leave, done)
        consumers, frontier = _walk(outputs, inputs)
        nodes = consumers or frontier
        call.pending = len(nodes)
        for node, slots in nodes.values():
            seq = node_seq(node)
            node.register_hook(lambda grad_inputs, grad_outputs, slots=slots, seq=seq:
                               call.node_grads(slots, grad_inputs, seq))
        for node in inputs.nodes:
            seq = node_seq(node)
            if seq is not None:  # (a leaf's node: the consumers or the end of the backward complete it)
                node.register_prehook(lambda grad_outputs, seq=seq: call.input_node_runs(seq))
        for position, out in enumerate(outputs):
            node = _node(out)
            if node is None:
                call.outputs_left -= 1
                continue
            index = inputs.keys.get(_edge(out))
            if index is not None:  # an input returned unchanged: its gradient goes through
                call.through[position] = index
            self.on_grad(node, _output_index(out), _output_callback(call, position, node_seq(node)))
        self.saw(outputs)
        inputs.nodes = []  # (the walk is done: a hook on an input's node must not keep the nodes alive)
        return call

    def on_grad(self, node: Any, index: int, fn: Callable[[Any], None]) -> None:
        """Call ``fn(grad)`` with the gradient of output ``index`` of ``node`` (a pre hook on the node, not a
        tensor hook: a tensor with a Python hook cannot go into a ``mindspore.jit`` graph). One hook per
        node, whose callbacks run last-added first (an outer Cell, whose forward ends after its inner
        Cell's, sees their common output's gradient first, the order of MindSpore's nested identity nodes)."""
        uid = node._unique_id()  # noqa: SLF001
        have = self.grad_fns.get(uid)
        if have is None:
            fns: list = []

            def hook(grad_outputs, fns=fns):
                for at, each in list(fns):
                    try:
                        each(grad_outputs[at] if at < len(grad_outputs) else None)
                    except Exception:  # noqa: BLE001 - never break training for the dump
                        pass

            node.register_prehook(hook)
            have = self.grad_fns[uid] = (node, fns)  # (the node kept: its id stays its own)
        have[1].insert(0, (index, fn))

    # --------------------------------------------------------------- backward
    def started(self) -> None:
        """A call's backward began: the end of this backward pass writes what is still waiting."""
        if self.final_queued or self.executor is None:
            return
        try:
            self.executor.queue_backward_final_callback(self.end_of_backward)
            self.final_queued = True
        except Exception:  # noqa: BLE001 - not inside a backward pass: stop() and step() write them
            pass

    def end_of_backward(self) -> None:
        self.final_queued = False
        self.flush_all()

    def node_event(self, seq: Optional[int]) -> None:
        """A hook is about to record something for the node ``seq``: the completed calls newer than it
        are written first (their identity node would have run before it)."""
        if self.completed and seq is not None:
            self._flush(lambda c: c.inputs.mark > seq)

    def api_event(self, order: int) -> None:
        """An API call's backward (begun at ``order``) is about to be recorded: the completed calls begun
        after it are written first."""
        if self.completed:
            self._flush(lambda c: c.inputs.order > order)

    def flush_all(self) -> None:
        """The end of the backward pass (or of the step): every begun call is over, and written."""
        for call in list(self.open):
            call.finish()
        self._flush(lambda c: True)
        self.grad_fns.clear()

    def _flush(self, due: Callable[["CellCall"], bool]) -> None:
        calls = [c for c in self.completed if due(c)]
        if not calls:
            return
        self.completed = [c for c in self.completed if not due(c)]
        for call in sorted(calls, key=lambda c: (-c.inputs.mark, -c.inputs.order)):
            call.emit()


class Inputs:
    """A Cell call's positional tensor inputs as graph edges, taken before its forward."""

    __slots__ = ("mark", "order", "keys", "nodes", "count")

    def __init__(self, tensors: list, mark: int) -> None:
        self.mark = mark
        self.order = next(ORDER)
        self.count = len(tensors)
        self.keys: dict = {}
        self.nodes: list = []
        seen: set = set()
        for index, t in enumerate(tensors):
            key = _edge(t)
            if key is None:
                continue
            self.keys.setdefault(key, index)
            if key[0] not in seen:
                seen.add(key[0])
                self.nodes.append(_node(t))


def _output_callback(call: "CellCall", position: int, seq: Optional[int]) -> Callable[[Any], None]:
    return lambda grad: call.output_grad(position, grad, seq)


def _walk(outputs: list, inputs: Inputs) -> tuple:
    """The Cell's own nodes (sequence number from the mark on, reached from the outputs' nodes) that send a
    gradient to one of its inputs, and those that send one out of the Cell elsewhere (to a parameter, to an
    older node): two dicts {node id: (node, [(slot, input index)])} (the second with no slots)."""
    consumers: dict = {}
    frontier: dict = {}
    seen: set = set()
    stack = [n for n in map(_node, outputs) if n is not None]
    while stack:
        node = stack.pop()
        uid = node._unique_id()  # noqa: SLF001
        if uid in seen:
            continue
        seen.add(uid)
        seq = node_seq(node)
        if seq is None or seq < inputs.mark:
            continue  # a leaf, or a node made before the call (an input returned unchanged)
        for slot, (nxt, nr) in enumerate(node.next_functions):
            if nxt is None:
                continue
            index = inputs.keys.get((nxt._unique_id(), nr))  # noqa: SLF001
            if index is not None:
                consumers.setdefault(uid, (node, []))[1].append((slot, index))
                continue
            nseq = node_seq(nxt)
            if nseq is not None and nseq >= inputs.mark:
                stack.append(nxt)
            else:
                frontier.setdefault(uid, (node, []))
    return consumers, frontier


class CellCall:
    """The gradients of one Cell call, gathered as the engine produces them."""

    def __init__(self, observer: CellObserver, inputs: Inputs, n_out: int, begin: Callable[[], None],
                 leave: Callable[[], None], done: Callable[[tuple, tuple], None]) -> None:
        self.observer = observer
        self.inputs = inputs
        self.grad_output: list = [None] * n_out
        self.grad_input: list = [None] * inputs.count
        self.outputs_left = n_out
        self.pending = 0
        self.through: dict = {}  # position of an output that is an input unchanged -> the input's index
        self.started = False
        self.finished = False
        self._begin, self._leave, self._done = begin, leave, done

    def _start(self) -> None:
        if not self.started:
            self.started = True
            self.observer.open.append(self)
            self.observer.started()
            self._begin()

    def output_grad(self, position: int, grad: Any, seq: Optional[int]) -> None:
        if self.finished:
            return
        self.observer.node_event(seq)
        self._start()
        self.grad_output[position] = grad
        self.outputs_left -= 1
        if position in self.through:
            self._add(self.through[position], grad)
        if self.pending <= 0 and self.outputs_left <= 0:
            self.finish()  # no node of its own: done once its outputs' gradients are in

    def node_grads(self, slots: list, grad_inputs: tuple, seq: Optional[int]) -> None:
        if self.finished:
            return
        self.observer.node_event(seq)
        self._start()
        for slot, index in slots:
            self._add(index, grad_inputs[slot] if slot < len(grad_inputs) else None)
        self.pending -= 1
        if self.pending <= 0:
            self.finish()

    def input_node_runs(self, seq: Optional[int]) -> None:
        """An input's node runs: every gradient sent to that input is in."""
        self.finish()
        self.observer.node_event(seq)

    def _add(self, index: int, grad: Any) -> None:
        """``grad_input[index] += grad``, apart from the graph."""
        if grad is None:
            return
        have = self.grad_input[index]
        if have is None:
            self.grad_input[index] = grad
            return
        inside = getattr(GUARD, "inside", False)
        GUARD.inside = True
        try:
            self.grad_input[index] = have + grad
        finally:
            GUARD.inside = inside

    def finish(self) -> None:
        if self.finished or not self.started:
            return
        self.finished = True
        if self in self.observer.open:
            self.observer.open.remove(self)
        self._leave()
        self.observer.completed.append(self)

    def emit(self) -> None:
        try:
            self._done(tuple(self.grad_output), tuple(self.grad_input))
        except Exception:  # noqa: BLE001 - never break training for the dump
            pass


