"""Cell dumps inside compiled graphs (GRAPH_MODE L0, and the Cells of ``mindspore.jit`` Cells).

No hook runs inside a compiled graph, so each dumped Cell's ``construct`` is replaced, before
compilation, by a wrapper that routes its tensor inputs, its parameters and its tensor outputs
through identity "dump point" ops. A dump point is a ``ops.Custom(func_type="pyfunc")`` whose
Python function receives the value (as numpy) while the graph runs, plus a small constant
``meta`` tensor ``[index, count]``; its ``bprop`` passes the incoming gradient through a second
dump point, so the backward pass reports the gradients of the Cell's outputs (backward
``input``) and of its inputs (backward ``output``). Points are chained with ``ops.depend`` so
that they fire in a fixed order, and the gradient points wait for their forward value.

The Python side assigns the call counts at run time (per step, as the PyNative hooks do) and
writes the records through the same session/encoder, with the names of PyNative L0
(``Cell.<path>.<Class>.forward.<n>`` / ``.backward.<n>``, ``parameters``). ``parameters_grad``
comes from Parameter hooks (they run in graphs too), registered when the Cell is wrapped.
What the graph cannot give: call stacks (the points fire from the executor), non-tensor
arguments (constants folded into the graph: ``input_args`` lists the tensor arguments only)
and keyword arguments (passed on undumped: a point's callback gets numbers, not names);
the gradient of an input nothing needs is pruned from the graph (``null``, as PyNative writes).

``mindspore.ops.TensorDump`` (what msprobe uses on Ascend) has no CPU kernel in MindSpore 2.10;
pyfunc ops run on CPU, so the dumper uses these points with device_target CPU only.
"""
from __future__ import annotations

import weakref
from typing import Any, Optional

import mindspore
import numpy as np
from mindspore import Tensor, ops

from msprobe.dumpers.control import backward_parent
from msprobe.dumpers.mindspore._apis import GUARD, PIJIT_CONTEXT, import_first
from msprobe.dumpers.mindspore._encode import Encoder

__all__ = ["GraphCellDump", "is_jit_cell"]


def is_jit_cell(cell: Any) -> bool:
    """True when the Cell's ``construct`` is decorated with ``mindspore.jit`` (ast capture, a graph);
    ``capture_mode="bytecode"`` is not one: it runs op by op at L1/mix and its Cell is hooked as
    any other (as 26.2.0, whose jit-Cell test looks for a JitConfig in the wrapper's closure)."""
    construct = getattr(type(cell), "construct", None)
    return bool(getattr(construct, "__wrapped_by_jit__", False)) and not _bytecode_captured(construct)


def _bytecode_captured(construct: Any) -> bool:
    ctx = import_first(*PIJIT_CONTEXT)
    return ctx is not None and any(isinstance(getattr(cell_var, "cell_contents", None), ctx)
                                   for cell_var in getattr(construct, "__closure__", None) or ())


def _same(*shapes):
    return shapes[0]


def _point(callback, grad_point=None):
    """An identity op calling ``callback(array, index, count)``; its gradient passes through
    ``grad_point`` (after the forward value exists), or unchanged."""

    def dump_point(x, meta):
        callback(x, int(meta[0]), int(meta[1]))
        return x

    if grad_point is None:
        def bprop(x, meta, out, dout):
            return dout, ops.zeros_like(meta)
    else:
        def bprop(x, meta, out, dout):
            return grad_point(ops.depend(dout, out), meta), ops.zeros_like(meta)

    op = ops.Custom(dump_point, out_shape=_same, out_dtype=_same, func_type="pyfunc", bprop=bprop)
    op.add_prim_attr("side_effect_io", True)  # never merged with another point nor dropped
    return op


def _meta(i, n):
    return Tensor(np.array([i, n], np.int32))


def _through(values: tuple, point, last):
    """(``values`` with each tensor passed through ``point``, meta ``[index, count]``, each point
    after the previous one; the last point's output or ``last``). Compiled into the graph."""
    n = 0
    for v in values:
        if ops.is_tensor(v):
            n = n + 1
    res: tuple = ()
    i = 0
    for v in values:
        if ops.is_tensor(v):
            if last is not None:
                v = ops.depend(v, last)
            v = point(v, _meta(i, n))
            last = v
            i = i + 1
        res = res + (v,)
    return res, last


def _grad_hook(point):
    def hook(grad):
        return point(grad, _meta(0, 1))

    return hook


class _Call:
    __slots__ = ("name", "rec", "parent", "n_in", "n_out", "n_par", "pending", "exp_in")

    def __init__(self, name: str, rec: Optional[dict], parent: Optional[str]):
        self.name, self.rec, self.parent = name, rec, parent
        self.n_in = self.n_out = self.n_par = 0
        self.exp_in: Optional[int] = None
        self.pending: dict = {}


class _SplitRecords:
    """Where the records of the jit Cells go with the split (spec/PRODUCER.md §23.3): the ``graph/``
    session of their own, asked as the core is asked (``next_module_index``, ``structure``,
    ``record``, ``journal_held``), with its own encoder and the core's filter."""

    def __init__(self, session: Any, encoder: Any, core: Any) -> None:
        self.session, self.encoder, self.core = session, encoder, core

    def next_module_index(self, key: str) -> int:
        return self.session.next_module_index(key)

    def structure(self, name: str, parent: Optional[str]) -> None:
        self.session.add_structure(name, parent)

    def record(self, name: str, rec: Any, *, parent: Optional[str] = None, construct: bool = True,
               filtered: bool = True) -> bool:
        if filtered and not self.core.keep(rec, name, self.encoder):
            return False
        self.session.add_record(name, rec, parent=parent, construct=construct, stats=self.encoder.take_stats())
        return True

    def journal_held(self) -> Any:
        return self.session.journal_held()


class GraphCellDump:
    """The dump points of one dumper and their run-time bookkeeping. The records go through the
    dumper's core, or, given ``own_session`` (the ``graph/`` session of the jit-Cell split), to that
    session with an encoder of its own."""

    def __init__(self, dumper, own_session=None):
        self._dumper = weakref.ref(dumper)
        core = dumper.core
        self.own_session = own_session
        if own_session is None:
            self.encoder = core.encoder()
            self.records: Any = core
        else:
            config = dumper.config
            self.encoder = Encoder(own_session, save_tensors=config.task == "tensor",
                                   summary_mode=config.summary_mode, tensor_list=config.tensor_list)
            self.encoder.check_overflow = core.encoder().check_overflow
            self.records = _SplitRecords(own_session, self.encoder, core)
        self.stack: list = []  # forward calls open, innermost last
        self.open: dict = {}  # key -> forward calls collecting values
        self.done: dict = {}  # key -> finished forward call indexes (LIFO for the backward pass)
        self.bw_open: dict = {}  # key -> backward calls collecting gradients
        self.parent_of: dict = {}
        self.n_inputs: dict = {}  # forward call -> its number of tensor inputs
        self.pgrad_names: set = set()  # parameters_grad records of the wrapped Cells
        self.param_names: dict = {}  # key -> the Cell's parameter names, in point order
        self._wrapped: list = []  # (cell, had its own construct attribute, the attribute)
        self.fired = 0  # points run while the dumper was on, since the last reset()

    # ------------------------------------------------------------- wrapping
    def wrap(self, cell, key: str) -> None:
        if getattr(cell, "_msprobe_graph_key", None) is not None:
            return
        object.__setattr__(cell, "_msprobe_graph_key", key)
        owner = weakref.ref(self)
        self._hook_param_grads(cell, key)

        def point_callback(kind):
            def callback(arr, index, total):
                graph_dump = owner()
                if graph_dump is not None:
                    graph_dump.on_point(key, kind, arr, index, total)
            return callback

        fin = _point(point_callback("in"), _point(point_callback("grad_in")))
        fout = _point(point_callback("out"), _point(point_callback("grad_out")))
        fpar = _point(point_callback("param"))
        names = tuple(name for name in cell._params)
        self.param_names[key] = names
        n_par = len(names)
        func = cell.construct
        is_tensor = ops.is_tensor
        depend = ops.depend

        def construct(self, *args, **kwargs):
            new, last = _through(args, fin, None)
            for j, name in enumerate(names):
                p = getattr(self, name)
                if last is not None:
                    p = depend(p, last)
                last = fpar(p, _meta(j, n_par))
            if last is not None and new:  # the parameters are read before the call runs
                new = tuple(depend(a, last) if is_tensor(a) else a for a in new)
            out = func(*new, **kwargs)  # keyword arguments pass undumped
            if isinstance(out, tuple):
                res, _ = _through(out, fout, None)
                return res
            if is_tensor(out):
                return fout(out, _meta(0, 1))
            return out

        if is_jit_cell(cell):  # PyNative: the wrapper is compiled with the Cell (points inside the graph only)
            construct = mindspore.jit(construct)
        had = "construct" in cell.__dict__
        self._wrapped.append((cell, had, cell.__dict__.get("construct")))
        object.__setattr__(cell, "construct", construct.__get__(cell, type(cell)))

    def keys(self) -> list:
        return [getattr(cell, "_msprobe_graph_key", None) for cell, _, _ in self._wrapped]

    def _hook_param_grads(self, cell, key: str) -> None:
        """parameters_grad: a Parameter hook (compiled into the graph with it, so registered before
        compilation) passing the gradient through a point."""
        dumper = self._dumper()
        if dumper is None or not dumper.config.backward_enabled:
            return
        name = f"{key}.parameters_grad"
        self.pgrad_names.add(name)
        owner = weakref.ref(self)
        for pname, param in cell._params.items():
            if not getattr(param, "requires_grad", False):
                continue

            def callback(arr, index, total, pname=pname):
                graph_dump = owner()
                if graph_dump is not None:
                    graph_dump.on_param_grad(name, pname, arr)

            dumper.param_handles.append(param.register_hook(_grad_hook(_point(callback))))

    def on_param_grad(self, name: str, pname: str, arr: np.ndarray) -> None:
        dumper = self._dumper()
        if dumper is None or not dumper.core.is_on():
            return
        self.fired += 1
        if not dumper.core.wanted(name, True):
            return
        GUARD.inside = True
        try:
            save = self.encoder.wants_tensors(name)
            value = Tensor(np.array(arr, copy=True))
            # kept until the Cell's backward record, written just before it (as in PyNative)
            dumper.pending_param_grads.setdefault(name, {})[pname] = [self.encoder.encode(value, f"{name}.{pname}", save)]
        finally:
            GUARD.inside = False

    def unwrap(self) -> None:
        for cell, had, attr in self._wrapped:
            if had:
                object.__setattr__(cell, "construct", attr)
            else:
                try:
                    object.__delattr__(cell, "construct")
                except AttributeError:
                    pass
            try:
                object.__delattr__(cell, "_msprobe_graph_key")
            except AttributeError:
                pass
        self._wrapped = []

    # ------------------------------------------------------------ run time
    def reset(self) -> None:
        self.fired = 0
        self.stack.clear()
        self.open.clear()
        self.done.clear()
        self.bw_open.clear()
        self.parent_of.clear()
        self.n_inputs.clear()

    def on_point(self, key: str, kind: str, arr: np.ndarray, index: int, total: int) -> None:
        dumper = self._dumper()
        if dumper is None or not dumper.core.is_on():
            return
        self.fired += 1
        GUARD.inside = True
        try:
            value = Tensor(np.array(arr, copy=True))
            with self.records.journal_held():  # in the graph's run: no tensor read until it ends
                if kind in ("in", "param", "out"):
                    self._forward(dumper, key, kind, value, index, total)
                else:
                    self._backward(dumper, key, kind, value, index, total)
        finally:
            GUARD.inside = False

    def _open_forward(self, dumper, key: str) -> _Call:
        idx = self.records.next_module_index(key)
        fwd = f"{key}.forward.{idx}"
        parent = self.stack[-1].name if self.stack else None
        call = _Call(fwd, {} if dumper.core.wanted(fwd) else None, parent)
        if call.rec is not None and dumper.config.task != "structure":
            want_in, _ = dumper.core.io("forward")
            if want_in:
                call.rec["input_args"] = []
                call.rec["input_kwargs"] = {}
        self.stack.append(call)
        self.open.setdefault(key, []).append(call)
        return call

    def _forward(self, dumper, key: str, kind: str, value: Tensor, index: int, total: int) -> None:
        calls = self.open.get(key) or []
        call = calls[-1] if calls else None
        if call is None or (kind == "in" and index == 0):
            call = self._open_forward(dumper, key)
        enc, rec, fwd = self.encoder, call.rec, call.name
        save = rec is not None and enc.wants_tensors(fwd)
        want_in, want_out = dumper.core.io("forward")
        structure = dumper.config.task == "structure"
        if kind == "in":
            call.n_in += 1
            if rec is not None and want_in and not structure:
                rec["input_args"].append(enc.encode(value, f"{fwd}.input.{index}", save))
            return
        if kind == "param":
            call.n_par += 1
            if rec is not None and want_out and not structure:
                name = self.param_names[key][index]
                rec.setdefault("parameters", {})[name] = enc.encode(value, f"{fwd}.parameters.{name}", save)
            return
        call.n_out += 1
        if rec is not None and want_out and not structure:
            call.pending[index] = enc.encode(value, f"{fwd}.output.{index}", save)
        if call.n_out < total:
            return
        calls.pop()
        if self.stack and self.stack[-1] is call:
            self.stack.pop()
        elif call in self.stack:
            self.stack.remove(call)
        self.parent_of[fwd] = call.parent
        self.n_inputs[fwd] = call.n_in
        self.done.setdefault(key, []).append(int(fwd.rsplit(".", 1)[1]))
        if rec is None:
            self.records.structure(fwd, call.parent)
            return
        if want_out and not structure:
            params = rec.pop("parameters", {})
            rec["output"] = [call.pending[slot] for slot in sorted(call.pending)]
            rec["parameters"] = params
        self.records.record(fwd, rec, parent=call.parent)

    def _backward(self, dumper, key: str, kind: str, value: Tensor, index: int, total: int) -> None:
        """``grad_out``: a gradient of the Cell's outputs (they come first; the backward record's
        ``input``); ``grad_in``: of its inputs (``output``; the call is complete with the last)."""
        call = self.bw_open.get(key)
        if kind == "grad_out":
            new = call is None or call.n_out > 0 or (call.exp_in is not None and call.n_in >= call.exp_in)
        else:
            new = call is None
        if new or call is None:  # (call is None only where new is True)
            done = self.done.get(key)
            idx = done.pop() if done else 0
            bwd = f"{key}.backward.{idx}"
            parent = backward_parent(self.parent_of.get(f"{key}.forward.{idx}"))
            call = _Call(bwd, {} if dumper.core.wanted(bwd) else None, parent)
            self.bw_open[key] = call
        want_in, want_out = dumper.core.io("backward")
        if kind == "grad_out":
            side, wanted = "input", want_in
            call.exp_in = total
            call.n_in += 1
            count = call.n_in
        else:
            side, wanted = "output", want_out
            call.n_out += 1
            count = call.n_out
        if call.rec is not None and wanted:
            save = self.encoder.wants_tensors(call.name)
            call.rec.setdefault(side, {})[index] = self.encoder.encode(value, f"{call.name}.{side}.{index}", save)
        if kind == "grad_out" and count < total:
            return
        if kind == "grad_in" and count >= total:
            self.bw_open.pop(key, None)
        # written once the output gradients are in, and again with each input gradient (some
        # never come: the graph prunes the gradient of an input nothing needs)
        self._emit_backward(dumper, call)

    def flush_param_grads(self, key: Optional[str] = None) -> None:
        """Write the wrapped Cells' parameters_grad records (those of ``key`` only) to this session."""
        dumper = self._dumper()
        if dumper is None:
            return
        for name in ([f"{key}.parameters_grad"] if key is not None else sorted(self.pgrad_names)):
            rec = dumper.pending_param_grads.pop(name, None)
            if rec:
                self.records.record(name, rec, parent=None, construct=False, filtered=False)

    def _emit_backward(self, dumper, call: _Call) -> None:
        self.flush_param_grads(call.name.rsplit(".backward.", 1)[0])  # before the backward record, as in PyNative
        if call.rec is None:
            self.records.structure(call.name, call.parent)
            return
        want_in, want_out = dumper.core.io("backward")
        rec: dict = {}
        if want_in:
            rec["input"] = [entry for _, entry in sorted(call.rec.get("input", {}).items())]
        if want_out:  # None for an input whose gradient the graph never computed, as in PyNative
            got = call.rec.get("output", {})
            total = max(self.n_inputs.get(call.name.replace(".backward.", ".forward."), 0), len(got))
            rec["output"] = [got.get(slot) for slot in range(total)]
        self.records.record(call.name, rec, parent=call.parent)
