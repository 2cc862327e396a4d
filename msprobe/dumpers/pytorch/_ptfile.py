"""A ``.pt`` tensor file (torch.save's zip format) written around the tensor's bytes, copied once.

``torch.save`` of a tensor pickles it, copies its storage into a zip stream with a CRC-32 per record,
and the stream is copied again to come out as bytes. Here the caller's one copy off the model's
tensor (which has to be made before the hook returns: the model may overwrite it) lands directly at
its final place in the file's buffer, 64-byte aligned after the record's local header, as torch.save
aligns it (``torch.load(mmap=True)`` relies on that). The background writer then adds the CRC-32 (the
carry-less-multiply kernel), the pickle and the small records torch writes, and the zip directory,
and hands the buffer to the store as it is.

The file holds the records of torch 2.x's format (``data.pkl``, ``.format_version``,
``.storage_alignment``, ``byteorder``, ``data/0``, ``version``, ``.data/serialization_id``); it loads
with ``torch.load(weights_only=True)`` to the same tensor (tests/dumpers/test_fastpath.py). Anything
this does not cover (sparse, quantized, a dtype without a storage class, 2 GiB and more: the zip
would need zip64) takes ``torch.save``.
"""
from __future__ import annotations

import collections
import io
import os
import pickle
import struct
import threading
import zlib
from typing import Optional

import torch

from msprobe.dumpers.fastpath import native
from msprobe.tensor_store import aligned_buffer

__all__ = ["PtFile", "POOL", "supported"]

_ALIGN = 64
_PREFIX = "archive/"
_DATA = (_PREFIX + "data/0").encode()
_HEAD = 30 + len(_DATA)
_PAD = (-(_HEAD + 4)) % _ALIGN  # the local header of data/0, an "FB" extra field of _PAD bytes, then the data
_DATA_OFF = _HEAD + 4 + _PAD
_MAX_BYTES = (1 << 31) - (1 << 20)
#: a buffer of at least PAGE_MIN bytes starts on a 4096-byte boundary (LocalStore(direct=True) writes it
#: with O_DIRECT: straight to the disk, no copy into the page cache)
PAGE_MIN = 1 << 20
_STORAGE: dict = {}
#: (dtype, shape) -> data.pkl's (name, crc, bytes)
_PKL: dict = {}
#: the records every file has, as torch 2.x writes them: (name, crc, bytes)
_FIXED = [((_PREFIX + n).encode(), zlib.crc32(b), b) for n, b in
          ((".format_version", b"1"), (".storage_alignment", b"64"), ("byteorder", b"little"), ("version", b"3\n"))]
_FB = b"FB" + struct.pack("<H", _PAD) + b"Z" * _PAD  # torch.save's padding extra field
_SID = (_PREFIX + ".data/serialization_id").encode()
#: the serialization ids of this process: a random 128-bit start, counted up (torch: unique per save)
_ID = [0, int.from_bytes(os.urandom(16), "little")]


class _Pool:
    """The buffers of large files already written, kept for the next files of about their size.

    A fresh buffer's pages are faulted in (and zeroed by the kernel) by the tensor copy, which took
    ~4x the copy's own time here (a 48 MB copy: 28 ms into a fresh buffer, 6 ms into one used
    before). A buffer comes back through :meth:`give` once its file is written or has failed for
    good (the writer's ``on_done``: nothing reads it after that), and is kept while the idle bytes
    stay within ``cap``. Sizes go by class (rounded up to 1/16 of their power of two), so tensors
    of one shape share buffers; a file is the first ``size`` bytes of its buffer, all written anew
    (the header, the tensor's copy, the tail: ``finish`` returns exactly those), so nothing of an
    earlier file is in it."""

    def __init__(self, cap: int = 256 << 20) -> None:
        self.cap = cap
        self.idle = 0
        self.free: dict = {}  # class size -> [page-aligned uint8 tensors of that size]
        self.lock = threading.Lock()

    @staticmethod
    def size_class(size: int) -> int:
        grain = 1 << max(12, size.bit_length() - 4)
        return -(-size // grain) * grain

    def take(self, size: int) -> torch.Tensor:
        """A page-aligned uint8 buffer of at least ``size`` bytes (a used one when there is one)."""
        cls = self.size_class(size)
        with self.lock:
            bufs = self.free.get(cls)
            if bufs:
                self.idle -= cls
                return bufs.pop()
        return torch.from_numpy(aligned_buffer(cls))

    def give(self, buf: torch.Tensor) -> None:
        cls = buf.numel()
        with self.lock:
            if self.idle + cls <= self.cap:
                self.free.setdefault(cls, []).append(buf)
                self.idle += cls

    def clear(self) -> None:
        with self.lock:
            self.free.clear()
            self.idle = 0


#: the buffers of this process's large files (cleared when a dump session closes)
POOL = _Pool()


def _storage_class(dtype: torch.dtype) -> Optional[type]:
    if not _STORAGE:
        for dt, name in torch.storage._dtype_to_storage_type_map().items():
            cls = getattr(torch, name, None)
            if cls is not None:
                _STORAGE[dt] = cls
    return _STORAGE.get(dtype)


def supported(t: torch.Tensor) -> bool:
    return (t.layout == torch.strided and not t.is_quantized and not t.is_meta and _storage_class(t.dtype) is not None
            and t.numel() * t.element_size() <= _MAX_BYTES and type(t) in (torch.Tensor, torch.nn.Parameter))


class _Storage:
    """Stands for the storage in the pickle (a persistent id, as torch.save writes it)."""


class _Rebuild:
    __slots__ = ("args",)

    def __init__(self, args: tuple):
        self.args = args

    def __reduce__(self):
        return (torch._utils._rebuild_tensor_v2, self.args)


def _pickle(dtype: torch.dtype, shape: tuple, numel: int) -> bytes:
    stride, acc = [], 1
    for d in reversed(shape):
        stride.append(acc)
        acc *= max(int(d), 1)
    sentinel = _Storage()
    buf = io.BytesIO()
    p = pickle.Pickler(buf, protocol=2)
    key = ("storage", _storage_class(dtype), "0", "cpu", numel)
    p.persistent_id = lambda obj: key if obj is sentinel else None  # type: ignore[method-assign]
    p.dump(_Rebuild((sentinel, 0, tuple(int(d) for d in shape), tuple(reversed(stride)), False,
                     collections.OrderedDict())))
    return buf.getvalue()


def _local(name: bytes, crc: int, size: int, extra: bytes = b"") -> bytes:
    return struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 0, 0, 0, crc, size, size, len(name), len(extra)) + name + extra


def _central(name: bytes, crc: int, size: int, offset: int) -> bytes:
    return struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 0, 0, 0, crc, size, size, len(name), 0, 0, 0, 0,
                       0, offset) + name


class PtFile:
    """The file's buffer with the tensor copied in (the constructor, in the hook); ``finish()`` (in the
    writer thread) completes it and returns its bytes as a memoryview."""

    __slots__ = ("buf", "nbytes", "dtype", "shape", "numel", "file_crc", "_pooled")

    def __init__(self, t: torch.Tensor):
        self.dtype, self.shape, self.numel = t.dtype, tuple(t.shape), t.numel()
        self.nbytes = self.numel * t.element_size()
        self.file_crc: Optional[int] = None  # the whole file's CRC-32, once finish() made it
        tail = 2048 + 48 * t.dim()  # pickle, the small records and the zip directory fit in it
        size = _DATA_OFF + self.nbytes + tail
        if size >= PAGE_MIN:  # from the pool, starting on a 4096-byte boundary (the store writes it O_DIRECT)
            self._pooled: Optional[torch.Tensor] = POOL.take(size)
            self.buf = self._pooled[:size]
        else:
            self._pooled = None
            self.buf = torch.empty(size, dtype=torch.uint8)
        if self.nbytes:
            dst = self.buf[_DATA_OFF:_DATA_OFF + self.nbytes].view(self.dtype).view(self.shape)
            dst.copy_(t.detach().resolve_conj().resolve_neg())

    def release(self) -> None:
        """The file is written (or failed for good): its buffer goes back to the pool. Nothing may
        read this object's bytes after this."""
        pooled, self._pooled = self._pooled, None
        if pooled is not None:
            POOL.give(pooled)

    def finish(self) -> memoryview:
        mv = memoryview(self.buf.numpy().data)  # .data: see _encode.tensor_bytes
        data = mv[_DATA_OFF:_DATA_OFF + self.nbytes]
        fast = native()  # the compiled kernels, loaded once per process (msprobe/dumpers/fastpath.py)
        if fast is not None and fast.HAVE_CLMUL and self.nbytes:
            crc = fast.crc32(self.buf.data_ptr() + _DATA_OFF, self.nbytes)
        else:
            crc = zlib.crc32(data)
        mv[:_DATA_OFF] = _local(_DATA, crc, self.nbytes, _FB)
        key = (self.dtype, self.shape)
        pkl = _PKL.get(key)
        if pkl is None:
            if len(_PKL) > 4096:
                _PKL.clear()
            body = _pickle(self.dtype, self.shape, self.numel)
            pkl = _PKL[key] = (_PREFIX.encode() + b"data.pkl", zlib.crc32(body), body)
        _ID[0] += 1
        sid = f"{_ID[1] + _ID[0]:040d}".encode()[-40:]
        records = [pkl, *_FIXED, (_SID, zlib.crc32(sid), sid)]
        pos = _DATA_OFF + self.nbytes
        central = [_central(_DATA, crc, self.nbytes, 0)]
        tail = []
        for n, c, body in records:
            central.append(_central(n, c, len(body), pos))
            rec = _local(n, c, len(body)) + body
            tail.append(rec)
            pos += len(rec)
        cd = b"".join(central)
        tail.append(cd)
        tail.append(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(central), len(central), len(cd), pos, 0))
        end = b"".join(tail)
        start = _DATA_OFF + self.nbytes
        if start + len(end) > len(mv):  # cannot happen with the tail reserved above; keep it correct anyway
            out = bytes(mv[:start]) + end
            self.file_crc = zlib.crc32(out)
            return memoryview(out)
        # the whole file's CRC-32 (the writer's digest) from the data's, without reading the data again
        head_crc = zlib.crc32(mv[:_DATA_OFF])
        combine = getattr(fast, "crc32_combine", None) if fast is not None else None
        whole = combine(head_crc, crc, self.nbytes) if combine is not None else zlib.crc32(data, head_crc)
        self.file_crc = zlib.crc32(end, whole)
        mv[start:start + len(end)] = end
        return mv[:start + len(end)]
