"""A dumped tensor's histogram and first values, for the record detail (tensor dumps only).

The preview never reads the whole file: only the container's header and the first payload bytes,
by range requests through the dump's store (a local file or any fsspec store, ``s3://`` included):

- ``.pt`` (torch's zip): the end of central directory, the central directory, the pickle
  (``data.pkl``, parsed with :mod:`pickletools` without running it: the storage, its offset, the
  shape and strides), then the stored (uncompressed) member's first bytes at its offset;
- ``.npy``: the header, then the first bytes after it;
- a raw file (dtypes numpy lacks): the first bytes, decoded with the record's dtype;
- a Zarr tensor store: its reader fetches only the chunks of the payload (never the shard).

Every size is bounded before anything is allocated: the bytes read are at most :data:`PREVIEW_BYTES`
and at most what the record declares (its dtype and shape); a header or directory larger than
:data:`HEADER_BYTES` is refused. The histogram covers the elements read (``elements_read`` of
``elements``).
"""
from __future__ import annotations

import io
import math
import struct
from typing import Any

from msprobe.errors import ConfigError, MsprobeError, TensorLoadError
from msprobe.readers import ANY

__all__ = ["tensor_view", "read_preview", "PREVIEW_BYTES", "HEADER_BYTES", "MAX_ZARR_BYTES", "PREVIEW", "BINS"]

#: the most payload bytes a preview reads (the histogram's elements)
PREVIEW_BYTES = 1 << 20
#: the most bytes a container's header, zip directory or pickle may take
HEADER_BYTES = 1 << 20
#: a Zarr payload is read whole (its chunks only): larger ones are not previewed
MAX_ZARR_BYTES = 64 << 20
PREVIEW = 64
BINS = 32
_ZIP_END = b"PK\x05\x06"
_ZIP64_LOCATOR = b"PK\x06\x07"
_ZIP64_END = b"PK\x06\x06"
_CENTRAL = b"PK\x01\x02"
_LOCAL = b"PK\x03\x04"
_NPY_MAGIC = b"\x93NUMPY"


def tensor_view(data: Any, cell: int, name: str, side: str) -> dict:
    """{histogram, preview, shape, dtype} of the tensor behind row ``name`` of ``cell`` on ``side``;
    {"available": False, "why": ...} when the dump holds no tensor file for it."""
    if side not in ("target", "bench"):
        raise ConfigError(f"side must be target or bench, not {side!r}")
    found = data.query("SELECT record, name, bench_name, data_name FROM rows WHERE cell = ? AND name = ?",
                       [cell, name])
    if not found:
        raise ConfigError(f"no row {name!r} in this cell")
    row = found[0]
    dump, src = data.located(side, cell)
    if src is None or dump is None:
        return {"available": False, "why": f"the {side} dump cannot be opened from here"}
    files = _data_names(row["data_name"])
    if len(files) == 2:
        file = files[0 if side == "target" else 1]
    else:
        file = files[0] if files and side == "target" else None
    if not file:
        return {"available": False, "why": "no tensor file for this argument (a statistics dump)"}
    row_name = row["name"] if side == "target" else (row["bench_name"] or "")
    record = row["record"] if side == "target" else row_name[: len(row_name) - (len(row["name"]) - len(row["record"]))]
    try:
        rec = dump.record(record, step=src.step, rank=src.rank, run=src.run if src.run else ANY)
        ref = next((t for _, t in rec.tensors() if t.data_name == file), None)
        if ref is None:
            return {"available": False, "why": f"{record} holds no tensor file {file}"}
        values, total = _values_of(ref, src)
    except (MsprobeError, OSError, ValueError) as exc:
        return {"available": False, "why": str(exc)}
    return _summary(values, total, str(ref.dtype), list(ref.shape))


def _values_of(ref: Any, src: Any) -> tuple:
    """(the first elements as float64, the element count) of a record's tensor, by range reads."""
    import numpy as np

    store = src.tensor_store() if hasattr(src, "tensor_store") else None
    if store is not None:  # the Zarr store: its reader fetches the payload's chunks only
        from msprobe.format.dtypes import itemsize

        size = itemsize(ref.dtype) or 8
        if _numel(ref.shape) * size > MAX_ZARR_BYTES:
            raise TensorLoadError(f"{ref.data_name}: {_numel(ref.shape) * size} bytes, more than the "
                                  f"{MAX_ZARR_BYTES} a preview reads from a tensor store")
        flat = np.asarray(ref.load("numpy")).astype(np.float64, copy=False).ravel()
        return flat[: PREVIEW_BYTES // size], int(flat.size)
    key = ref.key
    if key is None:
        raise TensorLoadError(f"{ref.data_name}: no tensor file")
    return read_preview(src.store, key, ref.dtype, tuple(ref.shape))


def _summary(values: Any, total: int, dtype: str, shape: list) -> dict:
    import numpy as np

    finite = values[np.isfinite(values)]
    hist: dict = {"counts": [], "edges": []}
    if finite.size:
        counts, edges = np.histogram(finite, bins=BINS)
        hist = {"counts": counts.tolist(), "edges": edges.tolist()}
    return {"available": True, "dtype": dtype, "shape": shape, "histogram": hist,
            "elements": total, "elements_read": int(values.size),
            "nan": int(np.isnan(values).sum()), "inf": int(np.isinf(values).sum()),
            "preview": [_number(x) for x in values[:PREVIEW].tolist()]}


def _numel(shape: Any) -> int:
    try:
        dims = [int(d) for d in shape]
    except (TypeError, ValueError):
        raise TensorLoadError(f"the record's shape {shape!r} is not a list of integers") from None
    if any(d < 0 for d in dims):
        raise TensorLoadError(f"the record's shape {list(dims)} has a negative dimension")
    return math.prod(dims)


def read_preview(store: Any, key: str, dtype: Any, shape: tuple, budget: int = PREVIEW_BYTES) -> tuple:
    """(the first elements as a float64 array, the element count) of the tensor file ``key`` of
    ``store``, reading only its header and at most ``budget`` payload bytes by range.

    ``dtype`` and ``shape`` are the record's: they bound what is read (a hostile file cannot make
    the preview allocate more than ``budget`` bytes nor read past its declared size)."""
    from msprobe.format.dtypes import itemsize

    size = itemsize(dtype)
    if size is None:
        raise TensorLoadError(f"{key}: the record's dtype {dtype!r} is unknown: no preview")
    numel = _numel(shape)
    file_size = int(store.size(key))
    head = store.get_range(key, 0, min(file_size, 8))
    if head[:4] == _LOCAL:
        start, numel, order = _pt_payload(store, key, file_size, size, numel)
    elif head[:6] == _NPY_MAGIC:
        start, numel, dtype, order = _npy_payload(store, key, file_size, dtype, numel)
    else:
        start, order = 0, "<"
    count = min(numel, max(budget // size, 1))
    end = start + count * size
    if end > file_size:
        raise TensorLoadError(f"{key}: truncated: {file_size} bytes, the first {count} elements end at {end}")
    raw = store.get_range(key, start, end) if count else b""
    if len(raw) != count * size:
        raise TensorLoadError(f"{key}: {len(raw)} bytes read of {count * size}")
    return _decode(raw, dtype, order, key), numel


def _decode(raw: bytes, dtype: Any, order: Any, key: str) -> Any:
    """float64 values of little- (``<``) or big-endian (``>``) bytes of ``dtype``."""
    import numpy as np

    from msprobe.format.dtypes import canonical_dtype, numpy_dtype

    kind = canonical_dtype(dtype) if not isinstance(dtype, np.dtype) else None
    if kind == "bfloat16":
        bits = np.frombuffer(raw, dtype=np.dtype("uint16").newbyteorder(order)).astype(np.uint32)
        return (bits << 16).view(np.float32).astype(np.float64)
    npd = dtype if isinstance(dtype, np.dtype) else numpy_dtype(dtype)
    if npd is None:
        raise TensorLoadError(f"{key}: no preview of {dtype} values (numpy has no such type)")
    if npd.itemsize > 1:
        npd = npd.newbyteorder(order)
    values = np.frombuffer(raw, dtype=npd)
    if values.dtype.kind == "c":
        values = np.abs(values)
    return values.astype(np.float64)


def _range(store: Any, key: str, start: int, end: int, file_size: int, what: str) -> bytes:
    if start < 0 or end > file_size or end < start:
        raise TensorLoadError(f"{key}: {what} at bytes {start}..{end} lies outside the {file_size}-byte file")
    if end - start > HEADER_BYTES:
        raise TensorLoadError(f"{key}: {what} of {end - start} bytes, more than the {HEADER_BYTES} a preview reads")
    data = store.get_range(key, start, end)
    if len(data) != end - start:
        raise TensorLoadError(f"{key}: {what}: {len(data)} bytes read of {end - start}")
    return bytes(data)


def _npy_payload(store: Any, key: str, file_size: int, dtype: Any, numel: int) -> tuple:
    """(payload offset, element count, numpy dtype, byte order) from a .npy header."""
    import numpy as np

    head = _range(store, key, 0, min(file_size, 12), file_size, "the .npy header")
    major = head[6] if len(head) > 6 else 0
    length_bytes = 2 if major == 1 else 4
    if len(head) < 8 + length_bytes:
        raise TensorLoadError(f"{key}: truncated .npy header")
    header_len = int.from_bytes(head[8:8 + length_bytes], "little")
    start = 8 + length_bytes + header_len
    buf = io.BytesIO(_range(store, key, 0, start, file_size, "the .npy header"))
    try:
        version = np.lib.format.read_magic(buf)
        if version == (1, 0):
            shape, fortran, npd = np.lib.format.read_array_header_1_0(buf)
        else:
            shape, fortran, npd = np.lib.format.read_array_header_2_0(buf)
    except Exception as exc:  # noqa: BLE001 - any decoder failure is one TensorLoadError naming the file
        raise TensorLoadError(f"{key}: bad .npy header ({exc})") from None
    if npd.hasobject:
        raise TensorLoadError(f"{key}: refused: the .npy holds Python objects")
    if fortran and len(shape) > 1:
        raise TensorLoadError(f"{key}: a Fortran-ordered .npy: no preview of its first values")
    # the record declares the payload: no more is ever read than it says
    elements = min(_numel(shape), numel)
    order = ">" if npd.byteorder == ">" else "<"
    return start, elements, npd.newbyteorder("="), order


def _pt_payload(store: Any, key: str, file_size: int, size: int, numel: int) -> tuple:
    """(payload offset, element count, byte order) of the one tensor of a torch zip file."""
    members = _zip_directory(store, key, file_size)
    pickle_name = next((n for n in members if n.endswith("data.pkl")), None)
    if pickle_name is None:
        raise TensorLoadError(f"{key}: a zip without data.pkl: not a torch tensor file")
    prefix = pickle_name[: -len("data.pkl")]
    found = _pickled_tensor(_member(store, key, file_size, members[pickle_name], "data.pkl"), key)
    storage_key, offset, shape, stride = found
    if _numel(shape) != numel:
        raise TensorLoadError(f"{key}: the file holds shape {list(shape)}, the record declares {numel} elements")
    if not _contiguous(shape, stride):
        raise TensorLoadError(f"{key}: the stored tensor is not contiguous (a view): no preview of its first values")
    member = members.get(f"{prefix}data/{storage_key}")
    if member is None:
        raise TensorLoadError(f"{key}: no storage member data/{storage_key}")
    start, stored = _member_span(store, key, file_size, member)
    if (offset + numel) * size > stored:
        raise TensorLoadError(f"{key}: the storage holds {stored} bytes, less than the tensor's "
                              f"{(offset + numel) * size} at offset {offset}")
    order = "<"
    byteorder = members.get(f"{prefix}byteorder")
    if byteorder is not None and _member(store, key, file_size, byteorder, "byteorder").strip() == b"big":
        order = ">"
    return start + offset * size, numel, order


def _zip_directory(store: Any, key: str, file_size: int) -> dict:
    """name -> (compression method, stored size, local header offset) of a zip's central directory."""
    tail_len = min(file_size, 22 + 0xFFFF + 20)
    tail = _range(store, key, file_size - tail_len, file_size, file_size, "the zip's end record")
    pos = tail.rfind(_ZIP_END)
    if pos < 0 or pos + 22 > len(tail):
        raise TensorLoadError(f"{key}: no zip end record: not a torch zip file (or truncated)")
    entries, cd_size, cd_offset = struct.unpack_from("<HII", tail, pos + 10)
    if 0xFFFFFFFF in (cd_size, cd_offset) or entries == 0xFFFF:  # the zip64 end record holds them
        loc = pos - 20
        if loc < 0 or tail[loc:loc + 4] != _ZIP64_LOCATOR:
            raise TensorLoadError(f"{key}: a zip64 file without its locator")
        (end64,) = struct.unpack_from("<Q", tail, loc + 8)
        record = _range(store, key, end64, min(end64 + 56, file_size), file_size, "the zip64 end record")
        if record[:4] != _ZIP64_END or len(record) < 56:
            raise TensorLoadError(f"{key}: a bad zip64 end record")
        entries, cd_size, cd_offset = struct.unpack_from("<QQQ", record, 32)
    if entries > 10000:
        raise TensorLoadError(f"{key}: {entries} zip entries: not a tensor file")
    directory = _range(store, key, cd_offset, cd_offset + cd_size, file_size, "the zip directory")
    members: dict = {}
    pos = 0
    for _ in range(entries):
        if directory[pos:pos + 4] != _CENTRAL or pos + 46 > len(directory):
            raise TensorLoadError(f"{key}: a bad zip directory entry")
        method, = struct.unpack_from("<H", directory, pos + 10)
        stored, plain, name_len, extra_len, comment_len = struct.unpack_from("<IIHHH", directory, pos + 20)
        local, = struct.unpack_from("<I", directory, pos + 42)
        name = directory[pos + 46:pos + 46 + name_len].decode("utf-8", "replace")
        extra = directory[pos + 46 + name_len:pos + 46 + name_len + extra_len]
        stored, plain, local = _zip64_sizes(extra, stored, plain, local)
        members[name] = (method, stored, plain, local)
        pos += 46 + name_len + extra_len + comment_len
    return members


def _zip64_sizes(extra: bytes, stored: int, plain: int, local: int) -> tuple:
    """The sizes and offset a zip64 extra field holds for the fields marked 0xFFFFFFFF."""
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<HH", extra, pos)
        if tag == 1:
            values = list(struct.unpack_from(f"<{length // 8}Q", extra, pos + 4))
            if plain == 0xFFFFFFFF and values:
                plain = values.pop(0)
            if stored == 0xFFFFFFFF and values:
                stored = values.pop(0)
            if local == 0xFFFFFFFF and values:
                local = values.pop(0)
        pos += 4 + length
    return stored, plain, local


def _member_span(store: Any, key: str, file_size: int, member: tuple) -> tuple:
    """(offset of the member's data, its stored size); a compressed member is refused (torch never
    compresses: its data could not be read by range)."""
    method, stored, plain, local = member
    if method != 0 or stored != plain:
        raise TensorLoadError(f"{key}: a compressed zip member (method {method}): not written by torch")
    head = _range(store, key, local, min(local + 30, file_size), file_size, "a zip local header")
    if head[:4] != _LOCAL or len(head) < 30:
        raise TensorLoadError(f"{key}: a bad zip local header at {local}")
    name_len, extra_len = struct.unpack_from("<HH", head, 26)
    start = local + 30 + name_len + extra_len
    if start + stored > file_size:
        raise TensorLoadError(f"{key}: a zip member ends past the end of the file (truncated)")
    return start, stored


def _member(store: Any, key: str, file_size: int, member: tuple, what: str) -> bytes:
    start, stored = _member_span(store, key, file_size, member)
    return _range(store, key, start, start + stored, file_size, what)


def _pickled_tensor(blob: bytes, key: str) -> tuple:
    """(storage key, storage offset, shape, stride) of the tensor a torch data.pkl rebuilds, read
    with :func:`pickletools.genops` (which runs nothing): after the storage's persistent id come
    the offset, the shape and the strides."""
    import pickletools

    persistent = 0
    strings: list = []
    after: list = []  # the ops after the persistent id: ints and the tuples they make
    try:
        for op, arg, _ in pickletools.genops(blob):
            if op.name == "BINPERSID":
                persistent += 1
                storage_strings = list(strings)
                continue
            if persistent == 0:
                if isinstance(arg, str) and "UNICODE" in op.name:
                    strings.append(arg)
                continue
            if op.name in ("NEWTRUE", "NEWFALSE", "GLOBAL", "STACK_GLOBAL"):
                break
            if isinstance(arg, int) and not isinstance(arg, bool) and op.name.startswith(("BININT", "LONG", "INT")):
                after.append(arg)
            elif op.name in ("TUPLE1", "TUPLE2", "TUPLE3", "TUPLE", "EMPTY_TUPLE", "MARK"):
                after.append(op.name)
    except Exception as exc:  # noqa: BLE001 - any decoder failure is one TensorLoadError naming the file
        raise TensorLoadError(f"{key}: an unreadable data.pkl ({type(exc).__name__}: {exc})") from None
    if persistent != 1 or len(storage_strings) < 2 or not after or not isinstance(after[0], int):
        raise TensorLoadError(f"{key}: data.pkl does not rebuild one plain tensor: no preview")
    offset = after[0]
    groups = _int_tuples(after[1:])
    if len(groups) < 2:
        raise TensorLoadError(f"{key}: data.pkl holds no shape and strides: no preview")
    return storage_strings[-2], offset, groups[0], groups[1]


def _int_tuples(ops: list) -> list:
    """The int tuples of a run of pickle ops (MARK ints TUPLE, or ints TUPLEn, or EMPTY_TUPLE)."""
    groups: list = []
    pending: list = []
    for op in ops:
        if isinstance(op, int):
            pending.append(op)
        elif op == "MARK":
            pending = []
        elif op == "EMPTY_TUPLE":
            groups.append(())
        elif op in ("TUPLE1", "TUPLE2", "TUPLE3"):
            width = int(op[-1])
            groups.append(tuple(pending[-width:]))
            pending = pending[:-width]
        else:  # TUPLE: everything since the mark
            groups.append(tuple(pending))
            pending = []
    return groups


def _contiguous(shape: tuple, stride: tuple) -> bool:
    if len(shape) != len(stride):
        return False
    want = 1
    for dim, step in zip(reversed(shape), reversed(stride)):
        if dim != 1 and step != want:
            return False
        want *= dim
    return True


def _data_names(value: Any) -> list:
    """The tensor file names of a compare row's Data_name cell (``['a.pt', 'b.pt']``, one name, or N/A)."""
    import ast

    if not isinstance(value, str) or value in ("", "N/A", "-1"):
        return []
    if value.startswith("["):
        try:
            got = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return []
        return [name if isinstance(name, str) and name not in ("N/A", "-1") else None for name in got] \
            if isinstance(got, list) else []
    return [value]


def _number(value: float) -> Any:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Inf" if value > 0 else "-Inf"
    return value
