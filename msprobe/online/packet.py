"""API packets: what the training side sends and the checker consumes.

Wire layout (no pickle anywhere)::

    MAGIC (8 bytes) | header length (u32, big-endian) | header (UTF-8 JSON) | payload

The header is a JSON object::

    {"v": 1, "kind": "api" | "step_end" | "close",
     "run": "<run id>", "rank": 0, "step": 0, "seq": 17,
     "name": "Functional.linear.0.forward",          # api packets
     "record": {...},            # the record as dump.json holds it; tensors carry data_name
     "tensors": {"<data_name>": [offset, nbytes]},  # raw little-endian bytes in the payload
     "expects_backward": true,   # forward packets: a backward packet will follow
     "dropped": 3}               # the sender's drop count so far (reporting)

Tensor bytes are the contiguous element bytes in the record's dtype and shape,
so decoding needs nothing but the dtype table (``torch.frombuffer``-style); the
checker turns a packet into a :class:`msprobe.readers.DumpRecord` whose tensors
load through the readers' raw-bytes loader, size- and shape-checked.
"""
from __future__ import annotations

import json
import struct
from typing import Any, Iterable, Optional

from msprobe.errors import FormatError
from msprobe.online._source import packet_record

__all__ = ["MAGIC", "Packet", "PacketError", "encode_packet", "decode_packet", "KINDS", "MAX_HEADER_BYTES"]

MAGIC = b"MSPKT\x00\x01\n"
KINDS = ("api", "step_end", "close")
MAX_HEADER_BYTES = 64 << 20
_LEN = struct.Struct(">I")


class PacketError(FormatError):
    """A packet that is not one (bad magic, truncated, inconsistent header)."""


def encode_packet(header: dict, tensors: Iterable[tuple] = ()) -> bytes:
    """``header`` (JSON-ready) plus ``(data_name, bytes-like)`` tensors -> one packet.

    The ``tensors`` map of the header is filled in here.
    """
    parts: list = []
    index: dict = {}
    offset = 0
    for data_name, buf in tensors:
        mv = memoryview(buf).cast("B") if not isinstance(buf, bytes) else buf
        n = len(mv)
        index[data_name] = [offset, n]
        parts.append(mv)
        offset += n
    hdr = dict(header)
    hdr["tensors"] = index
    hdr.setdefault("v", 1)
    text = json.dumps(hdr, separators=(",", ":"), allow_nan=True).encode("utf-8")
    return b"".join([MAGIC, _LEN.pack(len(text)), text, *parts])


class Packet:
    """A decoded packet: ``header`` and the tensor bytes it indexes (zero-copy views)."""

    __slots__ = ("header", "payload", "key", "size")

    def __init__(self, header: dict, payload: memoryview, *, key: Optional[str] = None, size: int = 0):
        self.header = header
        self.payload = payload
        self.key = key  # where it came from (a store key), when it came from a store
        self.size = size

    kind = property(lambda self: self.header["kind"])
    name = property(lambda self: self.header.get("name"))
    run = property(lambda self: str(self.header.get("run", "")))
    rank = property(lambda self: self.header.get("rank"))
    step = property(lambda self: int(self.header.get("step", 0)))
    seq = property(lambda self: int(self.header.get("seq", 0)))

    @property
    def ident(self) -> str:
        """A stable id for progress tracking: run/rank/seq."""
        return f"{self.run}/{_rank_text(self.rank)}/{self.seq}"

    @property
    def direction(self) -> Optional[str]:
        name = self.name or ""
        if name.endswith(".forward") or ".forward." in name:
            return "forward"
        if name.endswith(".backward") or ".backward." in name:
            return "backward"
        return None

    @property
    def base(self) -> Optional[str]:
        """``Functional.linear.0`` for ``Functional.linear.0.forward`` / ``.backward``."""
        name = self.name or ""
        for suffix in (".forward", ".backward"):
            if name.endswith(suffix):
                return name[: -len(suffix)]
        return None

    def tensor_bytes(self, data_name: str) -> memoryview:
        entry = self.header.get("tensors", {}).get(data_name)
        if entry is None:
            raise PacketError(f"packet {self.name!r}: no tensor bytes for {data_name!r}")
        off, n = entry
        return self.payload[off: off + n]

    def record(self, seq: Optional[int] = None) -> Any:
        """This packet's record as a :class:`msprobe.readers.DumpRecord` (tensors load from the packet)."""
        return packet_record(self, seq)

    def __repr__(self) -> str:
        return f"Packet({self.kind!r}, {self.name!r}, run={self.run!r}, rank={self.rank}, step={self.step}, seq={self.seq})"


def _rank_text(rank: Any) -> str:
    return "rank" if rank is None else f"rank{rank}"


#: header fields every packet may carry -> (what they must be, the check); any other value is a PacketError,
#: so a hostile or buggy sender cannot make the checker fail on a packet it already accepted
_FIELDS = {
    "dropped": ("an integer >= 0", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0),
    "expects_backward": ("true or false", lambda v: isinstance(v, bool)),
    "run": ("a string", lambda v: isinstance(v, str) and len(v) <= 4096),
    "name": ("a string", lambda v: isinstance(v, str) and len(v) <= 4096),
    "record": ("an object", lambda v: isinstance(v, dict)),
    "stack": ("a list of strings or null", lambda v: v is None or (isinstance(v, list)
                                                                  and all(isinstance(x, str) for x in v))),
}


def _check_fields(header: dict, where: str) -> None:
    for field, (valid, ok) in _FIELDS.items():
        if field in header and not (header[field] is None and field in ("name", "stack")) and not ok(header[field]):
            raise PacketError(f"packet{where}: {field}={str(header[field])[:80]!r} is not {valid}")
    if not str(header.get("run", "")).isprintable():
        raise PacketError(f"packet{where}: run id {header['run']!r} holds control characters")


def decode_packet(data: Any, *, key: Optional[str] = None) -> Packet:
    """Parse and check one packet; :class:`PacketError` for anything malformed."""
    view = memoryview(data).cast("B")
    where = f" ({key})" if key else ""
    header, header_end = _parse_header(view, where)
    payload = view[header_end:]
    _check_header(header, len(payload), where)
    return Packet(header, payload, key=key, size=len(view))


def _parse_header(view: memoryview, where: str) -> tuple[Any, int]:
    """The packet's JSON header (not checked yet) and the offset where its payload starts."""
    if len(view) < len(MAGIC) + 4 or bytes(view[: len(MAGIC)]) != MAGIC:
        raise PacketError(f"not an msprobe online packet{where}: bad magic")
    (header_len,) = _LEN.unpack(view[len(MAGIC): len(MAGIC) + 4])
    start = len(MAGIC) + 4
    if header_len > MAX_HEADER_BYTES or start + header_len > len(view):
        raise PacketError(f"packet{where}: header length {header_len} exceeds the {len(view) - start} bytes present")
    try:
        header = json.loads(bytes(view[start: start + header_len]).decode("utf-8"))
    except RecursionError:
        raise PacketError(f"packet{where}: header JSON nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise PacketError(f"packet{where}: header is not JSON ({exc})") from None
    return header, start + header_len


def _check_header(header: Any, payload_len: int, where: str) -> None:
    if not isinstance(header, dict) or header.get("kind") not in KINDS:
        raise PacketError(f"packet{where}: header must be an object with kind in {list(KINDS)}")
    if header.get("v") != 1:
        raise PacketError(f"packet{where}: unsupported packet version {header.get('v')!r}")
    for field in ("step", "seq"):
        value = header.get(field, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise PacketError(f"packet{where}: {field}={value!r} is not an integer >= 0")
    rank = header.get("rank")
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 0):
        raise PacketError(f"packet{where}: rank={rank!r} is not an integer >= 0 or null")
    _check_fields(header, where)
    tensors = header.setdefault("tensors", {})
    if not isinstance(tensors, dict):
        raise PacketError(f"packet{where}: 'tensors' must be an object")
    for data_name, entry in tensors.items():
        if not (isinstance(entry, list) and len(entry) == 2 and all(isinstance(number, int)
                                                                  and not isinstance(number, bool)
                                                                  and number >= 0 for number in entry)
                and entry[0] + entry[1] <= payload_len):
            raise PacketError(f"packet{where}: tensor {data_name!r} has a bad [offset, nbytes] {entry!r} "
                              f"for a {payload_len}-byte payload")
    if header["kind"] == "api":
        name = header.get("name")
        if not isinstance(name, str) or not name or "/" in name:
            raise PacketError(f"packet{where}: api packet without a valid record name ({name!r})")
        if not isinstance(header.get("record"), dict):
            raise PacketError(f"packet{where}: api packet {name!r} without a record object")
