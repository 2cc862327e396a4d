"""Safe loading of dumped tensor files: ``.pt`` (torch, ``weights_only``), ``.npy``
(``allow_pickle=False``) and raw bytes (MindSpore types numpy lacks, e.g. bfloat16).

Nothing here ever unpickles arbitrary objects: ``torch.load`` runs with
``weights_only=True`` (its restricted unpickler refuses every global that is not a
tensor rebuild function) and ``numpy.load`` with ``allow_pickle=False``. Files are
size-checked against the record before they are read, and the loaded array is
checked against the record's dtype and shape.
"""
from __future__ import annotations

import io
from typing import Any, Optional

import numpy as np

from msprobe.errors import (
    ConfigError,
    MissingDependencyError,
    StorageError,
    StorageNotFoundError,
    StorageTransientError,
    TensorLoadError,
)
from msprobe.format.dtypes import canonical_dtype, itemsize, numpy_dtype
from msprobe.format.protocols import ReadableStore

__all__ = ["load_tensor_file", "byte_limit", "DEFAULT_SLACK_FACTOR", "DEFAULT_SLACK_BYTES", "UNKNOWN_SIZE_LIMIT"]

#: A file may exceed ``numel * itemsize`` by this factor plus :data:`DEFAULT_SLACK_BYTES`
#: (container overhead, or a view saved with its whole storage by older dumpers).
DEFAULT_SLACK_FACTOR = 8
DEFAULT_SLACK_BYTES = 1 << 20
#: Limit when the record's dtype has no known item size.
UNKNOWN_SIZE_LIMIT = 1 << 31
_NPY_MAGIC = b"\x93NUMPY"
_FRAMEWORKS = ("numpy", "torch")


def byte_limit(shape: tuple, dtype: Any, max_bytes: Optional[int] = None) -> tuple[Optional[int], int]:
    """(expected payload bytes or None, the largest file size accepted)."""
    size = itemsize(dtype)
    count = 1
    for dim in shape:
        count *= int(dim)
    expected = None if size is None else count * size
    if max_bytes is not None:
        return expected, int(max_bytes)
    if expected is None:
        return None, UNKNOWN_SIZE_LIMIT
    return expected, expected * DEFAULT_SLACK_FACTOR + DEFAULT_SLACK_BYTES


def _fail(record: str, key: str, why: str) -> TensorLoadError:
    return TensorLoadError(f"record {record!r}: tensor file {key}: {why}")


def load_tensor_file(store: ReadableStore, key: str, *, record: str, dtype: Any, shape: tuple,
                     framework: str = "numpy", max_bytes: Optional[int] = None, check: bool = True) -> Any:
    """Read ``key`` from ``store`` and return a numpy array (or a torch tensor).

    Raises :class:`TensorLoadError` naming the record and the file when the file is
    missing, too large for its record, truncated, unsafe (a pickle payload, an object
    array) or disagrees with the record's dtype or shape (``check=True``).
    """
    if framework not in _FRAMEWORKS:
        raise ConfigError(f"framework={framework!r}: valid values are {', '.join(_FRAMEWORKS)}")
    expected, limit = byte_limit(shape, dtype, max_bytes)
    data = _read_bounded(store, key, record, limit, expected, dtype, shape)
    ext = key.rsplit(".", 1)[-1].lower() if "." in key.rsplit("/", 1)[-1] else ""
    if ext == "pt":
        _check_zip_sizes(data, record, key, limit, expected, dtype, shape)
        value = _load_pt(data, record, key)
    elif data[:6] == _NPY_MAGIC:
        value = _load_npy(data, record, key)
    else:
        value = _load_raw(data, record, key, dtype, shape, expected)
    if check:
        _check(value, record, key, dtype, shape, ext)
    return _convert(value, framework)


def _read_bounded(store: ReadableStore, key: str, record: str, limit: int, expected: Optional[int], dtype: Any,
                  shape: tuple) -> bytes:
    """The file's bytes, refusing it before reading when it is larger than ``limit``
    (one open: a HEAD and a GET on object stores)."""
    try:
        f = store.open_read(key)
    except StorageNotFoundError:
        raise _fail(record, key, "missing") from None
    except StorageTransientError:
        raise
    except StorageError as exc:
        raise _fail(record, key, f"unreadable ({exc})") from None
    try:
        with f:
            size = f.seek(0, io.SEEK_END)
            if size > limit:
                raise _fail(record, key, f"{size} bytes is far more than the record's {dtype} {list(shape)} "
                                         f"({expected} bytes); refused (limit {limit}, pass max_bytes= to override)")
            f.seek(0)
            data = f.read(min(limit, size) + 1)  # never ask for more than is there (a huge declared shape)
    except TensorLoadError:
        raise
    except StorageTransientError:
        raise
    except (OSError, StorageError, ValueError) as exc:
        raise _fail(record, key, f"unreadable ({type(exc).__name__}: {exc})") from None
    if len(data) > limit:
        raise _fail(record, key, f"grew past the limit of {limit} bytes while being read; refused")
    return bytes(data)


_ZIP_MAGIC = b"PK\x03\x04"


def _check_zip_sizes(data: bytes, record: str, key: str, limit: int, expected: Optional[int], dtype: Any,
                     shape: tuple) -> None:
    """A torch zip file's entries may be deflated (torch.save never compresses, but torch.load
    inflates them): refuse it before ``torch.load`` when the sizes its central directory declares
    (what torch allocates) add up to more than the record allows. Only the directory is parsed."""
    if data[:4] != _ZIP_MAGIC:
        return  # the legacy (pre-1.6) format: every storage is read from the file itself
    import zipfile

    try:
        infos = zipfile.ZipFile(io.BytesIO(data)).infolist()
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise _fail(record, key, f"unreadable or truncated (a bad zip archive: {exc})") from None
    total = 0
    for info in infos:
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise _fail(record, key, f"refused: zip entry {info.filename!r} uses compression method "
                                     f"{info.compress_type}, which torch files never use")
        total += info.file_size
    if total > limit:
        raise _fail(record, key, f"refused: its zip entries inflate to {total} bytes, far more than the record's "
                                 f"{dtype} {list(shape)} ({expected} bytes; limit {limit}, a compressed "
                                 "storage: a decompression bomb?)")


def _load_pt(data: bytes, record: str, key: str) -> Any:
    try:
        import torch
    except ImportError:
        raise MissingDependencyError(
            f"record {record!r}: loading the .pt file {key} needs torch: pip install 'msprobe-lake[torch]'"
        ) from None
    try:
        value = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - UnpicklingError, RuntimeError (bad zip), EOFError, ...
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "weights_only" in str(exc) or "Unsupported global" in str(exc) or isinstance(exc, _pickle_errors()):
            raise _fail(record, key, f"refused: not a plain tensor file ({type(exc).__name__}: {why[:300]})") from None
        raise _fail(record, key, f"unreadable or truncated ({type(exc).__name__}: {why[:300]})") from None
    if not isinstance(value, torch.Tensor):
        raise _fail(record, key, f"holds a {type(value).__name__}, not a tensor")
    return value


def _pickle_errors() -> tuple:
    import pickle

    return (pickle.UnpicklingError,)


def _load_npy(data: bytes, record: str, key: str) -> np.ndarray:
    buf = io.BytesIO(data)
    try:
        shape, array_dtype = _npy_header(buf)
    except Exception as exc:  # noqa: BLE001 - any decoder failure is one TensorLoadError naming the record
        raise _fail(record, key, f"bad .npy header ({exc})") from None
    if array_dtype.hasobject:
        raise _fail(record, key, "refused: .npy holds Python objects (would need pickle)")
    count = 1
    for dim in shape:
        count *= int(dim)
    if len(data) - buf.tell() < count * array_dtype.itemsize:
        raise _fail(record, key, f"truncated: {len(data) - buf.tell()} payload bytes for {count} x {array_dtype}")
    buf.seek(0)
    try:
        return np.load(buf, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - any decoder failure is one TensorLoadError naming the record
        raise _fail(record, key, f"unreadable .npy ({type(exc).__name__}: {exc})") from None


def _npy_header(buf: io.BytesIO) -> tuple:
    fmt = np.lib.format
    version = fmt.read_magic(buf)
    if version == (1, 0):
        shape, _, array_dtype = fmt.read_array_header_1_0(buf)
    else:
        shape, _, array_dtype = fmt.read_array_header_2_0(buf)
    return shape, array_dtype


def _load_raw(data: bytes, record: str, key: str, dtype: Any, shape: tuple, expected: Optional[int]) -> Any:
    """Raw bytes of a dtype numpy lacks (the docs: such tensors are dumped as the raw stream)."""
    if expected is None:
        raise _fail(record, key, f"not a .npy file, and the record's dtype {dtype!r} is unknown")
    if len(data) != expected:
        raise _fail(record, key, f"not a .npy file, and its {len(data)} bytes are not the raw "
                                 f"{expected} bytes of a {dtype} {list(shape)} tensor (truncated?)")
    c = canonical_dtype(dtype)
    nd = numpy_dtype(c)
    if nd is not None:
        return np.frombuffer(data, dtype=nd.newbyteorder("<")).reshape(shape).copy()
    if c == "bfloat16":
        return _RawBF16(np.frombuffer(data, dtype="<u2").reshape(shape).copy())
    raise _fail(record, key, f"raw bytes of dtype {dtype!r} cannot be decoded")


class _RawBF16:
    """bfloat16 bits (uint16) read from a raw file, until converted."""

    def __init__(self, bits: np.ndarray):
        self.bits = bits
        self.shape = bits.shape

    def to_numpy(self) -> np.ndarray:
        return (self.bits.astype(np.uint32) << 16).view(np.float32)

    def to_torch(self) -> Any:
        import torch

        return torch.from_numpy(self.bits.view(np.int16).copy()).view(torch.bfloat16)


def _value_dtype(value: Any) -> Optional[str]:
    if isinstance(value, _RawBF16):
        return "bfloat16"
    return canonical_dtype(str(value.dtype))


def _check(value: Any, record: str, key: str, dtype: Any, shape: tuple, ext: str) -> None:
    got_shape = tuple(int(dim) for dim in value.shape)
    if tuple(int(dim) for dim in shape) != got_shape:
        raise _fail(record, key, f"shape {list(got_shape)} differs from the record's {list(shape)}")
    want, got = canonical_dtype(dtype), _value_dtype(value)
    if want is None or want == got:
        return
    if ext == "npy" and want == "bfloat16" and got == "float32":
        return  # MindSpore may write bfloat16 as float32 .npy
    raise _fail(record, key, f"dtype {got} differs from the record's {dtype}")


def _convert(value: Any, framework: str) -> Any:
    if isinstance(value, _RawBF16):
        return value.to_torch() if framework == "torch" else value.to_numpy()
    if framework == "numpy":
        if isinstance(value, np.ndarray):
            return value
        tensor = value.detach()
        if tensor.is_conj():
            tensor = tensor.resolve_conj()
        if str(tensor.dtype) in ("torch.bfloat16",) or "float8" in str(tensor.dtype):
            tensor = tensor.float()
        elif str(tensor.dtype) == "torch.complex32":
            tensor = tensor.to(__import__("torch").complex64)
        return tensor.numpy()
    if isinstance(value, np.ndarray):
        import torch

        return torch.from_numpy(np.array(value, copy=True, order="C"))  # keeps 0-d arrays 0-d
    return value
