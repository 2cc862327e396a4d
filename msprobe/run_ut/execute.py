"""Replay one API on the device side and on the CPU benchmark, forward and backward, and judge it.

The unit of work is an :class:`ApiPacket` (an API full name, its inputs, and
optionally the gradient flowing into its output plus what the dump recorded);
:func:`packet_from_record` builds one from a reader record, and
:func:`check_packet` turns it into an :class:`ApiResult` (one result-CSV row
and its details-CSV rows). Online checking can build packets directly.
"""
from __future__ import annotations

import dataclasses
import importlib
import time
from typing import Any, Callable, Optional, Union

from msprobe.errors import MsprobeError
from msprobe.format.model import SequenceArg, TensorArg
from msprobe.run_ut import standards
from msprobe.run_ut.metrics import ERROR, PASS, SKIP, WARNING, compare_values, skip_row, worst

__all__ = ["ApiPacket", "ApiResult", "CheckOptions", "check_packet", "packet_from_record", "split_api_name",
           "resolve_api", "skip_result", "filter_reason", "AUTO_CEILING"]


#: ``CheckOptions.max_input_bytes`` default: derived from the memory available when the check starts
#: (:func:`msprobe.run_ut.memory.default_input_ceiling`; run_ut shares it among its workers)
AUTO_CEILING = "auto"


@dataclasses.dataclass
class CheckOptions:
    """How to run the two sides."""

    device: str = "cpu"                 #: device side: "cpu", "cuda:0", "npu:0"
    upcast: bool = True                 #: benchmark in float64 (except conv)
    white_list: tuple = ()              #: API names (without type/index) to check; empty = all
    black_list: tuple = ()              #: API names never checked
    check_recorded: bool = True         #: judge dumped outputs/gradients against the benchmark too
    replay_mode: str = "auto"           #: readers' replay mode: auto | real | random
    seed: Optional[int] = 1234          #: seed of generated inputs and of each side's run
    keep_tensors: bool = False          #: keep inputs/outputs on the result (for -save_error_data)
    #: the most bytes the generated (not dumped) inputs of one API may take, from their declared shapes;
    #: above it the API gets a SKIP row (config ``max_input_mb``, CLI ``--max-input-mb``); None: no ceiling;
    #: ``"auto"``: from the memory available (:func:`msprobe.run_ut.memory.default_input_ceiling`)
    max_input_bytes: Union[int, str, None] = AUTO_CEILING

    def input_ceiling(self) -> Optional[int]:
        """``max_input_bytes`` as bytes (``"auto"`` resolved for one process)."""
        if self.max_input_bytes == AUTO_CEILING:
            from msprobe.run_ut.memory import default_input_ceiling

            return int(default_input_ceiling(1)[0])
        return self.max_input_bytes  # type: ignore[return-value]


@dataclasses.dataclass
class ApiPacket:
    """One API call to check: ``name`` is its full name without direction (``Functional.linear.0``)."""

    name: str
    args: list
    kwargs: dict
    has_backward: bool = False
    grad: Any = None                    #: gradient(s) of the output: a tensor or a list of tensors
    recorded_output: Optional[list] = None  #: flattened dumped outputs (None where not dumped)
    recorded_grads: Optional[list] = None   #: flattened dumped input gradients (backward record's output)


@dataclasses.dataclass
class ApiResult:
    name: str
    forward: str
    backward: str                        #: "" when the dump has no backward for the API
    message: str = ""
    rows: list = dataclasses.field(default_factory=list)   #: details rows (dicts, see metrics.DETAIL_FIELDS)
    seconds: float = 0.0
    tensors: Optional[dict] = None       #: inputs/outputs kept for -save_error_data
    skip_cause: str = ""                 #: "input_ceiling": skipped for the generated inputs' ceiling

    @property
    def failed(self) -> bool:
        return self.forward in (ERROR, WARNING) or self.backward in (ERROR, WARNING)


def split_api_name(full: str) -> tuple:
    """``Functional.linear.0`` (or ``...0.forward``) -> (``Functional``, ``linear``, ``0``)."""
    parts = full.split(".")
    if parts and parts[-1] in ("forward", "backward"):
        parts = parts[:-1]
    if len(parts) < 3:
        return (parts[0] if parts else "", ".".join(parts[1:]), "")
    return parts[0], ".".join(parts[1:-1]), parts[-1]


def filter_reason(api_type: str, api_name: str, options: CheckOptions) -> Optional[str]:
    """Why an API is not replayed at all (None: it is)."""
    if api_type in standards.NOT_REPLAYED_TYPES:
        return standards.NOT_REPLAYED_TYPES[api_type] + "."
    if api_type not in standards.REPLAYABLE_TYPES:
        return f"API type {api_type!r} is not replayed by run_ut (only {', '.join(standards.REPLAYABLE_TYPES)})."
    base = standards.base_api_name(api_name)
    if base in standards.UNSUPPORTED_APIS:
        return f"API {api_name} is not replayable (run_ut does not check it: no deterministic result to compare)."
    if options.black_list and (api_name in options.black_list or base in options.black_list):
        return f"API {api_name} is filtered out by the black list."
    if options.white_list and api_name not in options.white_list and base not in options.white_list:
        return f"API {api_name} is filtered out: it is not in the white list."
    if api_type == "NPU" and not _has_torch_npu():
        return f"NPU API {api_name} needs torch_npu, which is not importable here."
    return None


_NPU: Optional[bool] = None


def _has_torch_npu() -> bool:
    global _NPU
    if _NPU is None:
        try:
            import torch_npu  # noqa: F401

            _NPU = True
        except Exception:  # noqa: BLE001 - any failure means no NPU side
            _NPU = False
    return _NPU


def _variable_functions() -> Any:
    """torch's module of the C functions its Python API wraps, those not exported at the top
    included (``torch._VF``: attribute by attribute, ``torch._C._VariableFunctions``)."""
    return importlib.import_module("torch._VF")


def resolve_api(api_type: str, api_name: str) -> Callable:
    """The callable a record's API name stands for (``Tensor`` methods take self first)."""
    import torch

    api = None
    if api_type == "Tensor":
        api = getattr(torch.Tensor, api_name, None)
    elif api_type == "Torch":
        api = getattr(torch, api_name, None) or getattr(_variable_functions(), api_name, None)
    elif api_type == "Functional":
        api = getattr(torch.nn.functional, api_name, None)
    elif api_type == "VF":
        api = getattr(_variable_functions(), api_name, None)
    elif api_type == "Aten":
        op_name, _, overload = api_name.partition(".")
        packet = getattr(torch.ops.aten, op_name, None)
        if packet is not None:
            api = getattr(packet, overload or "default", None) or packet
    elif api_type == "NPU":
        import torch_npu

        api = getattr(torch_npu, api_name, None) or getattr(getattr(torch.ops, "npu", None), api_name, None)
    if api is None:
        raise MsprobeError(f"{api_type}.{api_name}: torch {torch.__version__} has no such API")
    return api


def _is_inplace(api_name: str) -> bool:
    if api_name.startswith("__"):
        return api_name.startswith("__i") or api_name == "__setitem__"
    return api_name.endswith("_")


def skip_result(name: str, message: str, has_backward: bool) -> ApiResult:
    rows = [skip_row(f"{name}.forward.output.0", message)]  # one details row for a skipped API
    return ApiResult(name, SKIP, SKIP if has_backward else "", message, rows)


# -- the two sides -------------------------------------------------------------------------------------


class _Side:
    """Inputs placed for one side, with the positional tensor leaves tracked for gradients."""

    def __init__(self, args: list, kwargs: dict, *, device: str, upcast: bool, need_grad: bool, inplace: bool,
                 copy: bool = True):
        self.device = device
        self.upcast = upcast
        self.need_grad = need_grad
        self.inplace = inplace
        self.copy = copy  #: False: a tensor already on the device in its dtype is used as it is (no copy)
        self.leaves: list = []
        self.args = [self._conv(arg, track=True) for arg in args]
        self.kwargs = {key: self._conv(value, track=False) for key, value in kwargs.items()}

    def release(self) -> None:
        """Drop the inputs (once the call has run and no backward needs them)."""
        self.args, self.kwargs, self.leaves = [], {}, []

    def _conv(self, item: Any, *, track: bool) -> Any:
        import torch

        if isinstance(item, torch.Tensor):
            dtype = item.dtype
            if self.upcast and item.is_floating_point() and dtype in (torch.float16, torch.bfloat16, torch.float32):
                dtype = torch.float64
            tensor = item.detach().to(device=self.device, dtype=dtype, copy=self.copy)
            grad = self.need_grad and item.requires_grad and tensor.is_floating_point()
            if grad:
                tensor.requires_grad_(True)
            if track:
                self.leaves.append(tensor if grad else None)
            if grad and self.inplace:  # a leaf may not be modified in place (in-place APIs, inplace=True kwargs)
                return tensor.clone()
            return tensor
        if isinstance(item, (list, tuple)):
            out = [self._conv(value, track=track) for value in item]
            return type(item)(out) if isinstance(item, tuple) else out
        if isinstance(item, dict):
            return {key: self._conv(value, track=track) for key, value in item.items()}
        return item


def _flatten(value: Any, out: list) -> list:
    import torch

    if isinstance(value, torch.Tensor) or value is None or isinstance(value, (bool, int, float, str, complex)):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _flatten(item, out)
    elif isinstance(value, dict):
        for item in value.values():
            _flatten(item, out)
    else:
        out.append(value)
    return out


def _seed(seed: Optional[int], device: str) -> None:
    """Seed the generators a side uses (torch.manual_seed would also queue lazy CUDA/XPU/MTIA seeding,
    formatting a stack trace each time: slow)."""
    import torch

    if seed is None:
        return
    torch.default_generator.manual_seed(seed)
    if device.startswith("cuda"):
        torch.cuda.manual_seed(seed)
    elif device.startswith("npu"):
        torch.npu.manual_seed(seed)  # type: ignore[attr-defined]


def _run(api: Callable, side: _Side, seed: Optional[int]) -> Any:
    import torch

    _seed(seed, side.device)
    if side.need_grad:
        return api(*side.args, **side.kwargs)
    with torch.no_grad():
        return api(*side.args, **side.kwargs)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:500]


def _mutates(api_name: str, kwargs: dict) -> bool:
    """Whether the call may write into its arguments (in-place API, ``inplace=True``, ``out=``)."""
    return _is_inplace(api_name) or kwargs.get("inplace") is True or kwargs.get("out") is not None


def check_packet(packet: ApiPacket, options: Optional[CheckOptions] = None, *, consume: bool = False) -> ApiResult:
    """Replay ``packet`` on both sides and judge every output (and input gradient).

    The CPU benchmark runs first, on its own (float64) copies; the device side then uses the
    packet's tensors as they are where they are already on the device in their dtype and the call
    does not write into its arguments. ``consume=True``: the caller no longer needs the packet's
    inputs, which are dropped once both sides have run (a forward-only check then holds at most
    the two outputs and one float64 array of their size while it judges them).
    """
    options = options or CheckOptions()
    started = time.perf_counter()
    name = packet.name
    api_type, api_name, _ = split_api_name(name)
    reason = filter_reason(api_type, api_name, options)
    if reason:
        return skip_result(name, reason, packet.has_backward)
    api = resolve_api(api_type, api_name)
    base = standards.base_api_name(api_name)
    want_bwd = packet.has_backward and base not in standards.NO_BACKWARD_APIS
    upcast = options.upcast and base not in standards.KEEP_DTYPE_APIS
    if api_name in ("__setitem__", "__getitem__") and len(packet.args) > 1 and isinstance(packet.args[1], list):
        packet.args[1] = tuple(packet.args[1])  # a multi-dimensional index is a tuple (dump.json has a list)
    mutates = _mutates(api_name, packet.kwargs)
    bench: Optional[_Side] = _Side(packet.args, packet.kwargs, device="cpu", upcast=upcast, need_grad=want_bwd,
                                   inplace=mutates)
    bench_exc: Optional[Exception] = None
    bench_out: Any = None
    try:
        bench_out = _run(api, bench, options.seed)  # type: ignore[arg-type]
    except Exception as exc:  # noqa: BLE001 - reported after the device side (its failure is reported first)
        bench_exc, bench = exc, None
        if upcast:  # built now, from the inputs before the device side may write into them
            bench = _Side(packet.args, packet.kwargs, device="cpu", upcast=False, need_grad=want_bwd, inplace=mutates)
    if bench is not None and bench_exc is None and not want_bwd:
        bench.release()
    target = _Side(packet.args, packet.kwargs, device=options.device, upcast=False, need_grad=want_bwd, inplace=mutates,
                copy=mutates or options.keep_tensors)
    try:
        target_out = _run(api, target, options.seed)
    except Exception as exc:  # noqa: BLE001 - reported, never fatal
        msg = f"The API raised on the device side ({options.device}): {_first_line(exc)}"
        return skip_result(name, msg, packet.has_backward)
    if not want_bwd:
        target.release()
    note = ""
    if bench_exc is not None:
        if bench is None:
            return skip_result(name, f"The API raised on the CPU benchmark: {_first_line(bench_exc)}",
                               packet.has_backward)
        try:
            bench_out = _run(api, bench, options.seed)
        except Exception as bench_exc2:  # noqa: BLE001
            return skip_result(name, f"The API raised on the CPU benchmark: {_first_line(bench_exc2)}",
                               packet.has_backward)
        if not want_bwd:
            bench.release()
        note = f"Benchmark ran in the recorded dtype (float64 failed: {_first_line(bench_exc)})."
    assert bench is not None
    tensors = None
    if options.keep_tensors:
        tensors = {"forward.input": packet.args, "forward.input_kwargs": packet.kwargs,
                   "forward.output.device": target_out, "forward.output.bench": bench_out}
    elif consume and not want_bwd:
        packet.args, packet.kwargs = [], {}
    recorded = packet.recorded_output if options.check_recorded else None
    rows = _forward_rows(name, api_name, target_out, bench_out, recorded, base in standards.RANDOM_APIS, note)
    fwd = _aggregate(rows)
    bwd = ""
    message = ""
    if packet.has_backward:
        outs = [target_out, bench_out]
        drop = tensors is None  # nothing else keeps the outputs: _backward lets each go once it is done
        if drop:
            target_out = bench_out = recorded = None
        brows, bwd, message = _backward(packet, options, name, api_name, base, outs, target, bench,
                                        consume=consume and drop)
        rows.extend(brows)
    return ApiResult(name, fwd, bwd, message, rows, time.perf_counter() - started, tensors)


def _forward_rows(name: str, api_name: str, target_out: Any, bench_out: Any, recorded: Optional[list],
                  random_api: bool, note: str) -> list:
    """The forward rows: each output of the device side (the target) judged against the benchmark's."""
    target_flat = _flatten(target_out, [])
    bench_flat = _flatten(bench_out, [])
    rows = []
    for i in range(max(len(bench_flat), len(target_flat))):
        row_name = f"{name}.forward.output.{i}"
        bench_value = bench_flat[i] if i < len(bench_flat) else None
        target_value = target_flat[i] if i < len(target_flat) else None
        if random_api:
            rows.append(skip_row(row_name, f"{api_name} draws random numbers: the two sides cannot be compared "
                                           "element by element."))
            continue
        recorded_value = recorded[i] if recorded and i < len(recorded) else None
        row = compare_values(row_name, api_name, bench_value, target_value, recorded=recorded_value)
        if note:
            row["message"] = (note + "\n" + row.get("message", "")).strip()
        rows.append(row)
    return rows


def _aggregate(rows: list) -> str:
    """error > warning > pass; rows skipped for want of a value do not count."""
    return worst(row.get("status") for row in rows)


def _backward(packet: ApiPacket, options: CheckOptions, name: str, api_name: str, base: str, outs: list,
              target: _Side, bench: _Side, *, consume: bool = False) -> tuple:
    """The backward rows. ``outs``: [device output, benchmark output], emptied here (with the two
    sides' inputs) once the backward ran, so that only the input gradients are alive while they are
    judged; ``consume``: the packet's inputs and gradient go too."""
    import torch

    row_name = f"{name}.backward.output.0"
    if base in standards.NO_BACKWARD_APIS:
        msg = f"The backward of {api_name} is not checked by run_ut."
        return [skip_row(row_name, msg)], SKIP, msg
    target_tensors = [tensor for tensor in _flatten(outs[0], []) if isinstance(tensor, torch.Tensor)]
    bench_tensors = [tensor for tensor in _flatten(outs[1], []) if isinstance(tensor, torch.Tensor)]
    if len(target_tensors) != 1 or len(bench_tensors) != 1:
        msg = "The API has several outputs: its backward is not checked."
        return [skip_row(row_name, msg)], SKIP, msg
    grad = packet.grad
    if isinstance(grad, (list, tuple)):
        grads = [one_grad for one_grad in grad if isinstance(one_grad, torch.Tensor)]
        grad = grads[0] if len(grads) == 1 else None
    if not isinstance(grad, torch.Tensor):
        msg = "The dump holds no gradient for the output: the backward is not checked."
        return [skip_row(row_name, msg)], SKIP, msg
    target_out, bench_out = target_tensors[0], bench_tensors[0]
    target_tensors = bench_tensors = []
    outs.clear()
    if not target_out.requires_grad or not bench_out.requires_grad:
        rows = [skip_row(f"{name}.backward.output.{i}", "No gradient flows to this argument: nothing to compare.")
                for i in range(max(1, len(target.leaves)))]
        return rows, PASS, ""
    try:
        if tuple(grad.shape) != tuple(target_out.shape):
            raise ValueError(f"gradient shape {tuple(grad.shape)} differs from the output shape "
                             f"{tuple(target_out.shape)}")
        _seed(options.seed, target.device)
        target_out.backward(grad.detach().to(device=target_out.device, dtype=target_out.dtype))
        del target_out  # the device side's graph is gone: its output too
        bench_grad_out = grad.detach().to(device="cpu", dtype=bench_out.dtype)
        del grad
        if consume:
            packet.grad = None
        _seed(options.seed, "cpu")
        bench_out.backward(bench_grad_out)
        del bench_out, bench_grad_out
    except Exception as exc:  # noqa: BLE001
        msg = f"The backward raised: {_first_line(exc)}"
        return [skip_row(row_name, msg)], SKIP, msg
    target_grads = [leaf.grad if leaf is not None else None for leaf in target.leaves]
    bench_grads = [leaf.grad if leaf is not None else None for leaf in bench.leaves]
    target.release()
    bench.release()
    if consume:
        packet.args, packet.kwargs = [], {}
    rows = []
    rec = packet.recorded_grads if options.check_recorded else None
    for i, (target_grad, bench_grad) in enumerate(zip(target_grads, bench_grads)):
        target_grads[i] = bench_grads[i] = None  # each pair goes once judged
        recorded_grad = rec[i] if rec and i < len(rec) else None
        # gradients are judged by the benchmark rule: an API's forward algorithm (single rounding, exact,
        # ULP) says nothing of its backward (reductions over broadcast dims, masks, transposed matmuls)
        rows.append(compare_values(f"{name}.backward.output.{i}", "", bench_grad, target_grad, recorded=recorded_grad))
    if not rows:
        rows = [skip_row(row_name, "The API has no tensor argument to differentiate.")]
    return rows, _aggregate(rows), ""


# -- from a reader record --------------------------------------------------------------------------------


def _flatten_args(args: list, out: list) -> list:
    for arg in args:
        if isinstance(arg, SequenceArg):
            _flatten_args(list(arg.items), out)
        else:
            out.append(arg)
    return out


def _load_recorded(args: list) -> Optional[list]:
    flat = _flatten_args(args, [])
    out: list = []
    any_file = False
    for arg in flat:
        if isinstance(arg, TensorArg) and isinstance(arg.data_name, str) and hasattr(arg, "load"):
            try:
                out.append(arg.load(framework="torch"))
                any_file = True
                continue
            except Exception:  # noqa: BLE001 - an unreadable dumped tensor only loses this extra check
                pass
        out.append(None)
    return out if any_file else None


def packet_from_record(record: Any, backward_record: Any = None, options: Optional[CheckOptions] = None) -> ApiPacket:
    """An :class:`ApiPacket` from a forward record of ``msprobe.readers`` (and its backward twin)."""
    options = options or CheckOptions()
    name = record.name
    if name.endswith(".forward"):
        name = name[: -len(".forward")]
    ceiling = options.input_ceiling()
    args, kwargs = record.replay_inputs(options.replay_mode, seed=options.seed, need_grad=True,
                                        max_generated_bytes=ceiling)
    pkt = ApiPacket(name, list(args), dict(kwargs), has_backward=backward_record is not None)
    if options.check_recorded:
        pkt.recorded_output = _load_recorded(record.output)
    if backward_record is not None:
        try:
            gargs, _ = backward_record.replay_inputs(options.replay_mode, seed=options.seed,
                                                     max_generated_bytes=ceiling)
        except Exception:  # noqa: BLE001 - the backward is then reported as not checkable
            gargs = []
        grad_tensor = _flatten(gargs, [])
        pkt.grad = grad_tensor[0] if len(grad_tensor) == 1 else grad_tensor
        # the dumped input gradients are not judged: the real tool's backward records do not map their
        # outputs to the forward arguments one to one (a relu(inplace) grad is recorded with another shape)
    return pkt
