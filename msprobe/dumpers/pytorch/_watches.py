"""Module outputs that are one of the call's inputs, unchanged (``nn.Identity``, a dropout that drops
nothing): watched for their users to come (the nodes made after the call inside its parent), whose
gradients are what 26.2.0's identity node on the outputs gets (spec/PRODUCER.md §20 item 43)."""
from __future__ import annotations

from typing import Any, Optional

from msprobe.dumpers.pytorch._edges import InputEdges, edge, node_edge, node_seq, sequence_mark

__all__ = ["MODEL", "WATCHES", "Watch", "end_watches", "found_watched", "model_users", "watch_outputs"]

class Watch:
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

    def __init__(self, grads: Any, position: int, mark: int, keep: Any, parent: Any) -> None:
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


def found_watched(node: Any, seq: int) -> None:
    """``node`` (created by a module call's forward) sends gradients to watched tensors: hook it."""
    slots: dict = {}
    for slot, (nxt, nr) in enumerate(node.next_functions):
        if nxt is not None:
            for watch in WATCHES.get(node_edge(nxt, nr), ()):
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
        found_watched(node, seq)
        stack.extend(nxt for nxt, _ in node.next_functions if nxt is not None and id(nxt) not in seen)


def end_watches(parent: Any) -> None:
    """The watches whose parent call (its input edges, or :data:`MODEL`) has ended, dropped."""
    for key in list(WATCHES):
        left = [w for w in WATCHES[key] if w.parent is not parent]
        if left:
            WATCHES[key] = left
        else:
            del WATCHES[key]


def watch_outputs(grads: Any, outputs: list, edges: Optional[InputEdges], parent: Optional[InputEdges]) -> None:
    """Watch the outputs that are inputs unchanged for their users to come inside ``parent`` (None: the
    model's own forward); the watches whose parent this call is are over (its walk has run)."""
    if WATCHES and edges is not None:
        end_watches(edges)
    if edges is None:
        return
    if len(WATCHES) > 4096:
        WATCHES.clear()
    end = sequence_mark() or 0
    for position, out in enumerate(outputs):
        if edges.holds(out):
            grads.inputs_of[position] = edges.keys[edge(out)]
            WATCHES.setdefault(edge(out), []).append(
                Watch(grads, position, end, out.grad_fn or out, MODEL if parent is None else parent))
