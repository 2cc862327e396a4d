"""Online run_ut: check APIs while training runs.

The training side (the PyTorch dumper with ``online_run_ut: true``) turns each
API call into a *packet* (its record, as dump.json would hold it, plus the raw
bytes of its input/output tensors; no pickle anywhere) and hands it to a
bounded background sender; the sender publishes packets atomically into a
shared store (``nfs_path``: a directory or any URL the backends open) or sends
them over TCP, TLS 1.2+ with mutual certificates when ``tls_path`` is set. The
checker (``msprobe run_ut --online``) consumes packets as they arrive, judges
each API with run_ut's judgement and appends to the result/details CSVs,
resuming after a kill; it lives with run_ut, whose judgement it uses
(:mod:`msprobe.run_ut.online`).

Importing this package imports neither torch nor s3fs.
"""
from __future__ import annotations

from msprobe.online._source import PacketSource, packet_record
from msprobe.online.packet import Packet, decode_packet, encode_packet

__all__ = ["Packet", "encode_packet", "decode_packet", "PacketSource", "packet_record"]
