"""PyTorch values -> record entries; statistics on the tensor's own device, fetched in batches."""
from __future__ import annotations

import io
import math
import weakref
import zlib
from typing import Any, Callable, NamedTuple, Optional, Union

import torch

from msprobe.dumpers import fastpath
from msprobe.dumpers.encode import ValueEncoder
from msprobe.dumpers.fastpath import DTYPE_CODES, native
from msprobe.dumpers.ndarray import is_ndarray, ndarray_entry
from msprobe.dumpers.pytorch import _cuda_stats, _ptfile
from msprobe.dumpers.pytorch._statcache import StatCache, dense_value
from msprobe.errors import MsprobeError
from msprobe.format.stats import STAT_KEYS, null_stats, stats_dict, xor64
from msprobe.tensor_store import storage_dtype

__all__ = ["Encoder", "StatHandle", "fetch_stats", "tensor_bytes"]

_FLOAT_LOW = (torch.float16, torch.bfloat16)
_F32_MAX = float(torch.finfo(torch.float32).max)
_K_FLOAT, _K_INT, _K_BOOL, _K_SCALAR, _K_DONE, _K_FUSED = 0, 1, 2, 3, 4, 5
_FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: the compiled one-pass kernels (msprobe/dumpers/fastpath.py), loaded at the first tensor: False until then
_FAST: Any = False
#: torch dtype -> the kernels' dtype code (constants: known before the kernels load)
_FAST_CODES: dict = {getattr(torch, name): code for name, code in DTYPE_CODES.items()}
#: largest element count given to the C kernels when they have no SIMD code for this CPU (torch's own
#: vectorised passes win above it)
_FAST_SCALAR_MAX = 1 << 14
#: classic .pt files written by _ptfile (torch.save's format around one copy); MSPROBE_LAKE_NATIVE=0: torch.save
_PT_FAST = not fastpath.disabled()


def _fast() -> Any:
    global _FAST
    if _FAST is False:
        _FAST = native()
    return _FAST


def _runs(tensor: torch.Tensor) -> Optional[tuple]:
    """A strided tensor's memory as contiguous runs: (run length, outer sizes, outer strides) with the
    dimensions that continue the run merged into it (no outer dimension left: one block), or None when
    its smallest stride is not 1 or the runs would be shorter than 8 elements (torch's reductions then).
    The statistics do not depend on the order the elements are read in."""
    dims = sorted(((stride, size) for size, stride in zip(tensor.shape, tensor.stride()) if size != 1), reverse=True)
    if not dims or dims[-1][0] != 1:
        return None
    run = dims[-1][1]
    index = len(dims) - 2
    while index >= 0 and dims[index][0] == run:
        run *= dims[index][1]
        index -= 1
    if run < 8 or index >= 16:
        return None
    return (run, tuple(size for _, size in dims[:index + 1]), tuple(stride for stride, _ in dims[:index + 1]))


def _no_storage(tensor: torch.Tensor) -> bool:
    """A CPU tensor with elements but no memory to read them from: a storage freed by ``resize_(0)``
    (FSDP's resharded parameters) or a wrapper subclass without data; its statistics are null, never read.
    (Other devices take torch's reductions, which refuse such a tensor with a RuntimeError.)"""
    try:
        return tensor.untyped_storage().nbytes() < (tensor.storage_offset() + 1) * tensor.element_size()
    except (RuntimeError, NotImplementedError, TypeError):
        return True


def _cpu_kernel_stats(tensor: torch.Tensor, count: int) -> Optional[dict]:
    """The statistics of a CPU tensor read once by the C kernels, or None where they do not apply (no
    kernels, a dtype they do not know, a negated view, a layout without unit-stride runs)."""
    fast = _FAST if _FAST is not False else _fast()
    code = _FAST_CODES.get(tensor.dtype)
    if fast is None or code is None or tensor.is_neg() or not (fast.SIMD or count <= _FAST_SCALAR_MAX):
        return None
    if tensor.is_contiguous():
        stats = fast.stats(tensor.data_ptr(), count, code)
    else:
        runs = _runs(tensor)
        if runs is None:
            return None
        if not runs[1]:  # a permutation of a contiguous block (a transpose): the block, in memory order
            stats = fast.stats(tensor.data_ptr(), count, code)
        else:
            stats = fast.stats_runs(tensor.data_ptr(), code, *runs)
    mean = stats[2]
    if tensor.dtype == torch.float32 and mean is not None and abs(mean) * count > _F32_MAX:
        mean = math.copysign(math.inf, mean)  # torch's float32 sum overflows there (26.2.0: -inf)
    return stats_dict((stats[0], stats[1], mean, stats[3]))


class StatHandle(NamedTuple):
    """The statistics of one tensor on their way to the host (``fetch_stats`` resolves a batch of them).

    ``kind``: how they are computed (``_K_*``); ``value``: the statistics already known (``_K_DONE``:
    a dict) or the device tensor holding them; ``width``: how many of Max, Min, Mean, Norm that
    tensor holds (``_K_FLOAT``, ``_K_FUSED``); ``dtype``: the dtype Mean and Norm round to
    (``_K_FUSED``); ``extra``: entries added to the statistics (md5 mode: ``{"md5": ...}``, maybe
    deferred to the fetch as :class:`_DeviceBytes`)."""

    kind: int
    value: Any
    width: int = 0
    dtype: Any = None
    extra: Optional[dict] = None

    def deferred_md5(self) -> bool:
        """Whether its ``md5`` is a device copy read at the fetch."""
        return self.extra is not None and isinstance(self.extra.get("md5"), _DeviceBytes)


def _stat_handle(tensor: torch.Tensor) -> StatHandle:
    """Start computing the statistics of ``tensor`` (no host sync); returns a handle for fetch_stats.

    A CPU tensor of a dtype the C kernels know, contiguous or made of unit-stride runs (``_runs``), is
    read once, now (Max, Min, Sum and sum of squares in one pass); a contiguous float CUDA tensor gets
    one fused Triton reduction when Triton is there; anything else takes the torch reductions below
    (the reference path, also taken with ``MSPROBE_LAKE_NATIVE=0``)."""
    count = tensor.numel()
    cpu = tensor.is_cpu
    if count == 0 or (cpu and _no_storage(tensor)):  # (the memory the C kernels below would read)
        return StatHandle(_K_DONE, null_stats())
    if cpu and tensor.dim():
        done = _cpu_kernel_stats(tensor, count)
        if done is not None:
            return StatHandle(_K_DONE, done)
    if (tensor.is_cuda and tensor.dtype in _FUSED_DTYPES and tensor.dim() and tensor.is_contiguous()
            and not tensor.is_neg()):
        if _cuda_stats.available():  # one fused pass on the device (Triton), rounded and fetched in batches
            return StatHandle(_K_FUSED, _cuda_stats.raw(tensor.detach()), 4, tensor.dtype)
    if tensor.dtype == torch.bool:
        return StatHandle(_K_BOOL, torch.stack([tensor.any(), tensor.all()]))
    if tensor.dim() == 0:
        return StatHandle(_K_SCALAR, tensor.detach().clone())
    if tensor.requires_grad:  # (the encoder passes a plain tensor as it is: the reductions build no graph)
        tensor = tensor.detach()
    if tensor.is_complex():
        magnitude = tensor.detach().abs()
        return StatHandle(_K_FLOAT, torch.stack([magnitude.max(), magnitude.min(), magnitude.mean()]).to(torch.float64),
                          3)
    if tensor.is_floating_point():
        low, high = torch.aminmax(tensor)
        if tensor.dtype == torch.float64:
            return StatHandle(_K_FLOAT, torch.stack([high, low]), 2)
        stats = torch.stack([high, low, tensor.mean(), torch.linalg.vector_norm(tensor)])
        return StatHandle(_K_FLOAT, stats.to(torch.float64) if tensor.dtype in _FLOAT_LOW else stats, 4)
    low, high = torch.aminmax(tensor)
    return StatHandle(_K_INT, torch.stack([high, low]).to(torch.int64))


def fetch_stats(handles: list[StatHandle]) -> list[dict]:
    """Resolve handles in as few device->host transfers as possible (one per dtype/device group);
    a handle shared by several entries (StatCache) is fetched once."""
    uniq: dict = {}
    for h in handles:
        uniq.setdefault(id(h), h)
    resolved: dict = {}
    groups: dict = {}
    for hid, h in uniq.items():
        kind = h.kind
        if kind == _K_DONE:
            resolved[hid] = h.value
        else:
            width = h.width if kind in (_K_FLOAT, _K_FUSED) else (2 if kind != _K_SCALAR else 1)
            dtype = h.dtype if kind == _K_FUSED else h.value.dtype  # fused: the dtype Mean/Norm round to
            groups.setdefault((kind, width, dtype, h.value.device), []).append(hid)
    for (kind, width, dtype, _), ids in groups.items():
        stacked = torch.stack([uniq[i].value for i in ids]) if kind != _K_SCALAR else \
            torch.stack([uniq[i].value.reshape(()) for i in ids])
        if kind == _K_FUSED:  # Mean, Norm: float64 -> the dtype (bfloat16 through float32, as the format)
            mid = stacked[:, 2:]
            mid = (mid.to(torch.float32) if dtype == torch.bfloat16 else mid).to(dtype)
            stacked = torch.cat([stacked[:, :2], mid.to(torch.float64)], dim=1)
        rows = stacked.tolist()
        for i, r in zip(ids, rows):
            if kind == _K_SCALAR:
                resolved[i] = stats_dict((r, r, r, r))
            elif kind == _K_BOOL:
                resolved[i] = stats_dict((bool(r[0]), bool(r[1]), None, None))
            elif kind == _K_INT:
                resolved[i] = stats_dict((int(r[0]), int(r[1]), None, None))
            else:  # _K_FLOAT, _K_FUSED: the first `width` statistics, the rest null
                resolved[i] = stats_dict(r[:width] + [None] * (len(STAT_KEYS) - width))
    deferred = [h.extra for h in uniq.values() if h.deferred_md5()]
    if deferred:
        _resolve_device_md5(deferred)
    for hid, h in uniq.items():
        if h.extra:
            resolved[hid] = dict(resolved[hid], **h.extra)
    return [resolved[id(h)] for h in handles]


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The contiguous CPU bytes of ``t`` in its own dtype."""
    c = t.detach()
    if c.device.type != "cpu":
        c = c.cpu()
    c = c.contiguous()
    if c.numel() == 0:
        return memoryview(b"")
    # ``.data``: the array's buffer (numpy's stubs type ndarray as a buffer only for Python >= 3.12)
    return memoryview(c.view(torch.uint8).numpy().data).cast("B") if c.dim() else memoryview(
        c.reshape(1).view(torch.uint8).numpy().data).cast("B")


class _DeviceBytes:
    """The bytes of a device tensor whose ``md5`` (CRC-32) is computed when its handle is fetched: a copy
    on its own device (the tensor may be written in place later), brought to the host with the other
    deferred ones of the same fetch in one transfer (no host synchronisation per tensor)."""

    __slots__ = ("flat",)

    def __init__(self, t: torch.Tensor):
        c = t.detach().clone(memory_format=torch.contiguous_format)
        self.flat = c.reshape(-1).view(torch.uint8)


def _md5_of(t: torch.Tensor) -> Union[str, _DeviceBytes]:
    """``md5`` of ``t`` now (a CPU tensor) or deferred to the fetch (another device's tensor)."""
    if t.is_cpu or t.is_neg() or t.is_conj() or t.numel() == 0:
        return _crc32_hex(t)
    try:
        return _DeviceBytes(t)
    except RuntimeError:  # a layout that cannot be viewed as bytes on the device: as before, through the host
        return _crc32_hex(t)


def _crc32_bytes(buf: Any) -> int:
    fast = _FAST if _FAST is not False else _fast()
    if fast is not None and fast.HAVE_CLMUL and isinstance(buf, torch.Tensor):
        n = buf.numel()
        return fast.crc32(buf.data_ptr(), n) if n else 0
    return zlib.crc32(memoryview(buf.numpy().data).cast("B") if isinstance(buf, torch.Tensor) else buf) & 0xFFFFFFFF


def _resolve_device_md5(extras: list) -> None:
    """Replace each deferred ``md5`` in ``extras`` (dicts) by its CRC-32: one device->host transfer per device."""
    by_dev: dict = {}
    for e in extras:
        by_dev.setdefault(e["md5"].flat.device, []).append(e)
    for items in by_dev.values():
        flats = [e["md5"].flat for e in items]
        try:
            host = (torch.cat(flats) if len(flats) > 1 else flats[0]).cpu()
        except RuntimeError:
            host = None
        off = 0
        for e, f in zip(items, flats):
            n = f.numel()
            try:
                part = host[off:off + n] if host is not None else f.cpu()
                e["md5"] = f"{_crc32_bytes(part):08x}"
            except RuntimeError:
                e["md5"] = None
            off += n


def _crc32_hex(t: torch.Tensor) -> str:
    """``md5`` (CRC-32 of the contiguous bytes): read in place for a contiguous CPU tensor (the
    carry-less-multiply kernel when the CPU has one), else over a contiguous CPU copy."""
    fast = _FAST if _FAST is not False else _fast()
    if fast is not None and fast.HAVE_CLMUL and t.is_cpu and t.is_contiguous() and not t.is_neg() \
            and not t.is_conj():
        n = t.numel() * t.element_size()
        return f"{fast.crc32(t.data_ptr(), n) if n else 0:08x}"
    return f"{zlib.crc32(tensor_bytes(t)) & 0xFFFFFFFF:08x}"


def _serialize(t: torch.Tensor) -> bytes:
    from msprobe.dumpers.pytorch._apis import GUARD

    GUARD.inside = True  # a writer thread: torch.save's own tensor calls are not the model's
    buf = io.BytesIO()
    torch.save(t, buf)
    return buf.getvalue()


def _finish_pt(f: Any) -> Any:
    from msprobe.backends import Digested
    from msprobe.dumpers.pytorch._apis import GUARD

    GUARD.inside = True  # a writer thread: these tensor calls are not the model's
    body = f.finish()
    return Digested(body, f.file_crc) if f.file_crc is not None else body  # (the writer's digest, made on the way)


def _raw_bytes(t: torch.Tensor) -> memoryview:
    from msprobe.dumpers.pytorch._apis import GUARD

    GUARD.inside = True  # the packer thread: these tensor calls are not the model's
    return tensor_bytes(t)


def _pooled_copy(t: torch.Tensor, nbytes: int) -> Callable[[], memoryview]:
    """A copy of ``t``'s bytes, taken now, in a buffer of the pool; the producer returns a view of it.

    The buffer goes back to the pool when the numpy array over it is freed: every view of the bytes
    (the producer's memoryview, the shard's pieces, numpy's arrays over them) refers to that array,
    so no buffer is reused while anything can still read it."""
    buf = _ptfile.POOL.take(nbytes)
    buf[:nbytes].view(t.dtype).view(t.shape).copy_(t.detach().resolve_conj().resolve_neg())
    arr = buf.numpy()
    weakref.finalize(arr, _ptfile.POOL.give, buf).atexit = False
    del buf
    return lambda: memoryview(arr[:nbytes].data).cast("B")


def _no_bytes() -> bytes:
    return b""


_SPECIAL_TYPES: dict = {}
#: the tensor classes whose statistics are read from the tensor itself, not from a detached copy
_PLAIN = (torch.Tensor, torch.nn.Parameter)
#: torch dtype -> its name in a record (``str(dtype)``)
_N_STATS = len(STAT_KEYS)
_DTYPE_NAMES: dict = {d: str(d) for d in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
                                          torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool,
                                          torch.complex64, torch.complex128)}
#: a plain CPU tensor's entry made by one C call (the C fast path's ``tensor_entry``: its attribute reads,
#: the statistics cache, the kernels, the entry); bench/run_step_bench.py's floor turns it off
NATIVE_ENTRY = True


def _entry_context(cache: StatCache, md5: bool) -> Any:
    """``tensor_entry``'s context for an encoder with ``cache`` (the fields of _fastpath.c's ``TC_*``,
    in their order), or False where the C path is not there."""
    fast = _FAST if _FAST is not False else _fast()
    if fast is None or not NATIVE_ENTRY or not hasattr(fast, "tensor_entry"):
        return False
    return (cache.entries, cache.limit, _DTYPE_NAMES, _FAST_CODES, StatHandle, _K_DONE, STAT_KEYS, md5,
            torch.device("cpu"), torch.Tensor, torch.nn.Parameter, bool(fast.SIMD), _FAST_SCALAR_MAX, torch.float32,
            torch._C.TensorBase.stride)


class Encoder(ValueEncoder):
    """Turns call arguments into JSON-ready entries; owns the per-call tensor decisions."""

    tensor_types = (torch.Tensor,)

    def __init__(self, session, *, save_tensors: bool, summary_mode: str, tensor_list: list):
        super().__init__(session, save_tensors=save_tensors, summary_mode=summary_mode, tensor_list=tensor_list)
        self.has_overflow = False
        self.cache = StatCache(ordered=summary_mode == "md5")
        #: tensor_entry's context (None: not made yet; False: the Python path only, as in xor mode)
        self._entry_ctx: Any = None if summary_mode != "xor" else False
        self.zarr = getattr(getattr(session, "config", None), "tensor_store", "files") == "zarr"

    def _save_payload(self, t: torch.Tensor, name: str) -> bool:
        """Tensor store: the same memory at the same version as a tensor saved earlier in this step
        is passed as an alias (no copy, no bytes); anything else is copied to the CPU now and its
        bytes are hashed and deduplicated by content in the store's packer thread."""
        session = self.session
        logical = str(t.dtype).replace("torch.", "", 1)

        try:
            if t.layout != torch.strided:
                raise MsprobeError(f"layout {t.layout} is not supported by the tensor store")
            storage_dtype(logical)
        except MsprobeError as exc:
            session.note_error("tensor_store", MsprobeError(f"{name}: {exc}"))
            return False
        key = owner = None
        try:
            owner = t._base if t._base is not None else t
            layout = (t.numel(),) if t.is_contiguous() else (tuple(t.shape), tuple(t.stride()))
            key = (id(owner), t.storage_offset(), layout, t.dtype, t.device, t.is_conj(), t.is_neg())
            same_as = session.zarr_sink.same_memory(key, owner, t._version)
            if same_as is not None:
                session.save_payload(name, logical, tuple(t.shape), _no_bytes, 0, same_as=same_as)
                return True
        except (RuntimeError, TypeError):  # sparse, meta, ...: no memory identity
            key = None
        nbytes = t.numel() * t.element_size()
        if nbytes >= _ptfile.PAGE_MIN and _ptfile.supported(t):
            # into a buffer of the pool (no page faults of a fresh one); it goes back once nothing
            # refers to its bytes any more (the payload deduplicated, or its shard written)
            session.save_payload(name, logical, tuple(t.shape), _pooled_copy(t, nbytes), nbytes)
        else:
            c = t.detach()
            c = c.to("cpu", copy=True) if c.device.type != "cpu" else c.clone()
            c = c.resolve_conj().resolve_neg().contiguous()
            session.save_payload(name, logical, tuple(c.shape), lambda c=c: _raw_bytes(c), nbytes)
        if key is not None:
            session.zarr_sink.remember_memory(key, owner, t._version, name)
        return True

    def framework_value(self, value: Any) -> Any:
        if isinstance(value, torch.Size):
            return {"type": "torch.Size", "value": list(value)}
        if isinstance(value, torch.dtype):
            return {"type": "torch.dtype", "value": str(value)}
        if isinstance(value, torch.device):  # type, colon, index, as 26.2.0 writes it ("cpu:None", "cuda:0")
            return {"type": "torch.device", "value": f"{value.type}:{value.index}"}
        if isinstance(value, torch.memory_format):
            return {"type": "torch.memory_format", "format": str(value).replace("torch.", "", 1)}
        return NotImplemented

    def _plain(self, v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return v.item() if v.numel() == 1 else None
        return super()._plain(v)

    def _special(self, value: Any, data_prefix: str, save: bool) -> Any:
        if is_ndarray(value):  # Tensor.numpy()'s output
            return ndarray_entry(value)
        tname = type(value).__name__
        if tname == "P2POp":
            return self._p2p_op(value, data_prefix, save)
        if tname == "ReduceOp" or tname == "RedOpType":
            return {"type": "torch.distributed.ReduceOp", "value": str(value)}
        if tname in ("ProcessGroup", "ProcessGroupGloo", "ProcessGroupNCCL"):
            try:
                import torch.distributed as dist

                ranks = dist.get_process_group_ranks(value)
                return {"type": "torch.ProcessGroup", "group_ranks": ranks,
                        "group_id": f"{zlib.crc32(str(ranks).encode()):08x}"}
            except Exception:  # noqa: BLE001 - a process group that cannot be described: no group_id
                return {"type": "torch.ProcessGroup", "value": None}
        return None

    def _p2p_op(self, op: Any, data_prefix: str, save: bool) -> dict:
        """A ``P2POp`` of ``batch_isend_irecv`` (26.2.0's fields); an ``irecv`` op's tensor in the
        call's inputs is its receive buffer before the receive: null (PRODUCER.md item 46)."""
        kind = getattr(getattr(op, "op", None), "__name__", None)
        group = self._special(getattr(op, "group", None), data_prefix, save) if getattr(op, "group", None) else None
        if group is None:
            try:
                import torch.distributed as dist

                group = self._special(dist.group.WORLD, data_prefix, save)
            except Exception:  # noqa: BLE001 - no default group: no group_id
                group = None
        buffer = kind == "irecv" and ".input." in data_prefix
        tensor = getattr(op, "tensor", None)
        return {"class_type": "torch.distributed.P2POp",
                "tensor": None if buffer or tensor is None else self.tensor(tensor, f"{data_prefix}.tensor", save),
                "op": kind, "peer": getattr(op, "peer", None), "tag": getattr(op, "tag", 0),
                "group_id": (group or {}).get("group_id")}

    def _native_ctx(self, save: bool) -> Any:
        """tensor_entry's context where the C path may take this call's values (statistics or md5 mode,
        nothing saved, no overflow check), else False."""
        ctx = self._entry_ctx
        if ctx is None:
            ctx = self._entry_ctx = _entry_context(self.cache, self.summary_mode == "md5")
        return ctx if ctx and _FAST and not save and not self.check_overflow else False

    def _encode_at(self, value: Any, prefix: str, key: Any) -> Any:
        """encode_values' fallback: ``value`` at ``<prefix>.<key>`` through the Python path (nothing saved)."""
        return self.encode(value, f"{prefix}.{key}", False)

    def encode_list(self, values: Any, prefix: str, save: bool) -> list:
        """The entries of a call's positional arguments: one C call (``encode_values``: the tensors it makes,
        None, bool, int, float, str, lists and tuples of them; each other argument through :meth:`encode`),
        the same entries as the Python path's."""
        ctx = self._native_ctx(save)
        if ctx:
            return _FAST.encode_values(values, ctx, self._encode_at, prefix)
        return super().encode_list(values, prefix, save)

    def encode_map(self, values: dict, prefix: str, save: bool) -> dict:
        if not values:  # (no keyword arguments: most calls)
            return {}
        ctx = self._native_ctx(save)
        if ctx:
            return _FAST.encode_values(values, ctx, self._encode_at, prefix)
        return super().encode_map(values, prefix, save)

    def encode_output(self, out: Any, prefix: str, save: bool, *, is_sequence: Any = None) -> Any:
        """:meth:`ValueEncoder.encode_output`; a plain tensor, or a tuple output (``is_sequence``), in one C call."""
        ctx = self._native_ctx(save)
        if ctx:
            if type(out) in _PLAIN:
                return _FAST.encode_values((out,), ctx, self._encode_output_at, prefix)
            if is_sequence is not None and is_sequence(out):
                return _FAST.encode_values(out, ctx, self._encode_output_at, prefix)
        return super().encode_output(out, prefix, save, is_sequence=is_sequence)

    def _encode_output_at(self, value: Any, prefix: str, key: Any) -> Any:
        """encode_values' fallback for an output's value (the output flag on, as encode_output sets it)."""
        self._tls.in_output = True
        try:
            return self.encode(value, f"{prefix}.{key}", False)
        finally:
            self._tls.in_output = False

    def tensor(self, t: torch.Tensor, data_name_prefix: str, save: bool) -> dict:
        ctx = self._entry_ctx
        if ctx is None:
            ctx = self._entry_ctx = _entry_context(self.cache, self.summary_mode == "md5")
        if ctx and _FAST and not save and not self.check_overflow:
            made = _FAST.tensor_entry(t, ctx)  # None: not a tensor it makes (below, the same entry)
            if made is not None:
                return made
        return self._tensor(t, data_name_prefix, save)

    def _tensor(self, t: torch.Tensor, data_name_prefix: str, save: bool) -> dict:
        """The entry of any tensor (the C path's, for the tensors that path takes)."""
        dtype = t.dtype
        entry: dict = {"type": "torch.Tensor", "dtype": _DTYPE_NAMES.get(dtype) or str(dtype), "shape": list(t.shape)}
        requires_grad = bool(t.requires_grad)
        mode = self.summary_mode
        md5: Optional[tuple] = None
        try:
            if mode == "xor":
                entry["md5"] = self._xor(dense_value(t.detach()))
            else:
                cache = self.cache
                key, base = cache.memory_key(t)
                handle = cache.lookup(t, key, base)
                data = None
                if handle is None:
                    # a plain tensor or parameter as it is (no detached copy of it: the C kernels read its
                    # memory, _stat_handle detaches it for torch's reductions, md5 reads bytes); else detached
                    data = t if type(t) in _PLAIN and not self.check_overflow else cache.dense(t.detach())
                    try:
                        handle = _stat_handle(data)
                        if mode == "md5":
                            handle = handle._replace(extra={"md5": _md5_of(data)})
                        cache.store(t, key, base, handle)
                    except RuntimeError:  # the entry without stats has each key, null (its keys' place as below)
                        entry.update(null_stats())
                        raise
                if handle.kind == _K_DONE and not self.check_overflow and not handle.deferred_md5():
                    # computed already (the CPU kernels): filled now, as the pending batch would; a done
                    # handle's value is null_stats() or stats_dict(): the keys of STAT_KEYS, in its order
                    v = handle.value
                    entry.update(v if len(v) == _N_STATS else {stat: v.get(stat) for stat in STAT_KEYS})
                    extra = handle.extra if handle.extra is not None else v
                    if "md5" in extra or "md5" in v:
                        md5 = (extra if "md5" in extra else v)["md5"],
                else:
                    entry.update(null_stats())
                    self._stats.append((entry, handle))
                if self.check_overflow:
                    if data is None:
                        data = cache.dense(t.detach())
                    if data.is_floating_point() and data.numel():
                        self._watch(data_name_prefix, data)
        except RuntimeError:  # meta/fake tensors, unsupported dtypes: keep the entry without stats
            pass
        entry["requires_grad"] = requires_grad
        # an empty *output* has no file (as the real tool does)
        if (save or self.check_overflow) and (t.numel() or not getattr(self._tls, "in_output", False)):
            name = f"{data_name_prefix}.pt"
            if save:
                entry["data_name"] = name
                self._write_tensor(entry, t, name)
            elif self.check_overflow:  # written when the record overflows (_keep)
                self._defer(data_name_prefix, entry, t.detach(), name)
        if md5 is not None:  # (the pending batch adds it last, after the entry is complete)
            entry["md5"] = md5[0]
        return entry

    def _write_tensor(self, entry: dict, t: torch.Tensor, name: str) -> None:
        if self.zarr:
            if not self._save_payload(t, name):
                del entry["data_name"]  # not storable there (a sparse or quantized tensor): noted in the error log
            return
        if _PT_FAST and _ptfile.supported(t):  # copied once, into the file's buffer (see _ptfile)
            f = _ptfile.PtFile(t)
            self.session.save_tensor(name, lambda f=f: _finish_pt(f), f.buf.numel(), release=f.release)
            return
        cpu = t.detach().to("cpu", copy=True).contiguous() if t.device.type != "cpu" else t.detach().clone()
        self.session.save_tensor(name, lambda c=cpu: _serialize(c), cpu.numel() * cpu.element_size())

    @staticmethod
    def _xor(data: torch.Tensor) -> Union[float, str, None]:  # a 0-d float tensor: its value
        if data.numel() == 0:
            return None
        if data.dim() == 0:
            v = data.item()
            return v if not isinstance(v, int) else f"0x{v & ((1 << 64) - 1):016x}"
        return f"0x{xor64(tensor_bytes(data)) & ((1 << 64) - 1):016x}"

    @staticmethod
    def _any_inf_nan(handles: list) -> bool:
        flags = torch.stack([(~torch.isfinite(h)).any() for h in handles])
        return bool(flags.any().item())
