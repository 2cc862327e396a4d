"""A packet seen as a one-record rank of a dump, so run_ut's code that works on
:class:`msprobe.readers.DumpRecord` (``replay_inputs()``, ``TensorRef.load()``)
works on packets unchanged."""
from __future__ import annotations

import io
from typing import Any, Optional

from msprobe.errors import StorageNotFoundError
from msprobe.readers import DumpRecord

__all__ = ["PacketSource", "packet_record"]

_RAW_SUFFIX = ".raw"  # tensor keys end here: the readers decode raw bytes by the record's dtype and shape


class _PacketStore:
    """Read-only view of the packets' tensor bytes, keyed ``<data_name>.raw``."""

    is_local = False
    exact_mtimes = False
    cheap_requests = True
    read_only = True

    def __init__(self, packets: dict):
        self._packets = packets  # record name -> Packet

    @property
    def url(self) -> str:
        return "packet://"

    def _bytes(self, key: str) -> memoryview:
        data_name = key[: -len(_RAW_SUFFIX)] if key.endswith(_RAW_SUFFIX) else key
        for packet in self._packets.values():
            entry = packet.header.get("tensors", {}).get(data_name)
            if entry is not None:
                return packet.tensor_bytes(data_name)
        raise StorageNotFoundError(f"packet://{key}: no such tensor in the packet")

    def open_read(self, key: str) -> Any:
        return io.BytesIO(self._bytes(key).tobytes())

    def get(self, key: str) -> bytes:
        return self._bytes(key).tobytes()

    def exists(self, key: str) -> bool:
        try:
            self._bytes(key)
            return True
        except StorageNotFoundError:
            return False


class PacketSource:
    """The duck-typed ``RankSource`` of packet records: one step and rank, records from headers."""

    def __init__(self, packets: list):
        first = packets[0]
        self._packets = {packet.name: packet for packet in packets}
        self.store = _PacketStore(self._packets)
        self.step = first.step
        self.rank = first.rank
        self.rank_dir = "rank" if first.rank is None else f"rank{first.rank}"
        self.key = ("packet", first.run, self.rank_dir, first.step, first.seq)
        self.run = first.run

    def __repr__(self) -> str:
        return f"PacketSource(run={self.run!r}, {self.rank_dir}, step={self.step})"

    @property
    def url(self) -> str:
        return f"packet://{self.run}/step{self.step}/{self.rank_dir}"

    def tensor_key(self, data_name: str) -> str:
        return data_name + _RAW_SUFFIX

    def raw_record(self, name: str) -> Any:
        packet = self._packets.get(name)
        return None if packet is None else packet.header.get("record")

    def stack_ids(self) -> dict:
        return {}

    def frames_of(self, name: str) -> Optional[list]:
        packet = self._packets.get(name)
        return None if packet is None else packet.header.get("stack")

    def parents(self) -> dict:
        return {}

    def names(self) -> set:
        return set(self._packets)


def packet_record(packet: Any, seq: Optional[int] = None, *, source: Optional[PacketSource] = None) -> Any:
    src = source if source is not None else PacketSource([packet])
    return DumpRecord(packet.name, packet.seq if seq is None else seq, src)
