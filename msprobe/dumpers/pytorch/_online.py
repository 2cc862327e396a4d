"""online_run_ut on the training side: API calls become packets for the checker, never dump files.

The training thread only decides (``admit``: queue room and sampling), copies the
call's tensors (they may be changed in place right after) and queues the packet;
encoding and sending run on the sender's thread.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any

import torch

from msprobe.dumpers.pytorch._apis import GUARD
from msprobe.dumpers.pytorch._encode import Encoder, tensor_bytes
from msprobe.online.config import OnlineSettings
from msprobe.online.packet import encode_packet
from msprobe.online.sender import OnlineSender
from msprobe.online.transport import SocketSink, StoreSink, client_ssl_context

__all__ = ["OnlineRunUt", "make_sink"]


def make_sink(settings: OnlineSettings) -> Any:
    if settings.transport == "store":
        return StoreSink(settings.nfs_path, storage_options=settings.storage_options)
    ctx = client_ssl_context(settings.tls_path) if settings.transport == "tls" else None
    return SocketSink(settings.host, settings.port, ssl_context=ctx)


class _PacketEncoder(Encoder):
    """Encoder whose tensors are copied for a packet instead of being summarised or saved."""

    def __init__(self) -> None:
        super().__init__(None, save_tensors=False, summary_mode="statistics", tensor_list=[])
        self._mine = threading.local()  # backward hooks may run on autograd's threads

    @property
    def collected(self) -> list:
        c = getattr(self._mine, "c", None)
        if c is None:
            c = self._mine.c = []
        return c

    def tensor(self, t: torch.Tensor, data_name_prefix: str, save: bool) -> dict:
        entry: dict = {"type": "torch.Tensor", "dtype": str(t.dtype), "shape": list(t.shape),
                       "requires_grad": bool(t.requires_grad)}
        try:
            d = t.detach()
            if d.is_sparse or d.is_quantized or d.device.type == "meta":
                return entry
            c = d.to("cpu", copy=True) if d.device.type != "cpu" else d.clone()
            if c.is_conj():
                c = c.resolve_conj()
            c = c.contiguous()
        except RuntimeError:  # fake tensors, odd layouts: the checker will report what is missing
            return entry
        name = f"{data_name_prefix}.pt"
        entry["data_name"] = name
        self.collected.append((name, c))
        return entry

    def take(self) -> list:
        out = self.collected
        self._mine.c = []
        return out


def _on_sender_thread() -> None:
    GUARD.inside = True  # torch calls made while encoding are not the model's


class OnlineRunUt:
    """One per dumper: the sink, the sender and the packet sequence of this process."""

    def __init__(self, settings: OnlineSettings, get_rank: Any):
        self.settings = settings
        self.get_rank = get_rank
        self.run = time.strftime("run%Y%m%dT%H%M%S", time.gmtime()) + f"_{os.getpid()}_{os.urandom(3).hex()}"
        self.seq = 0
        self.encoder = _PacketEncoder()
        self.sender = OnlineSender(make_sink(settings), max_packets=settings.queue_size,
                                   max_bytes=settings.queue_bytes, flush_timeout=settings.flush_timeout,
                                   on_thread_start=_on_sender_thread)
        self.closed = False
        self.forward_counts: dict = {}  # API (without direction) -> forward packets queued

    @property
    def stats(self) -> Any:
        return self.sender.stats

    def admit(self) -> bool:
        return not self.closed and self.sender.admit()

    def _header(self, kind: str, step: int, **extra: Any) -> dict:
        h = {"v": 1, "kind": kind, "run": self.run, "rank": self.get_rank(), "step": step, "seq": self.seq,
             "dropped": self.sender.stats.dropped + self.sender.stats.sampled_out}
        h.update(extra)
        self.seq += 1
        return h

    def submit(self, name: str, record: dict, step: int, *, expects_backward: bool = False) -> None:
        tensors = self.encoder.take()
        header = self._header("api", step, name=name, record=record, expects_backward=expects_backward)
        nbytes = sum(c.numel() * c.element_size() for _, c in tensors)

        def build(header: dict = header, tensors: list = tensors) -> tuple:
            return encode_packet(header, [(n, tensor_bytes(c)) for n, c in tensors]), header

        self.sender.submit(build, nbytes)
        if name.endswith(".forward"):
            api = name[: -len(".forward")]
            self.forward_counts[api] = self.forward_counts.get(api, 0) + 1

    def discard(self) -> None:
        self.encoder.take()

    def control(self, kind: str, step: int) -> None:
        if self.closed:
            return
        header = self._header(kind, step)

        def build(header: dict = header) -> tuple:
            return encode_packet(header), header

        self.sender.submit(build, 0, control=True)

    def end_step(self, step: int) -> None:
        self.control("step_end", step)

    def close(self, step: int) -> None:
        if self.closed:
            return
        self.control("close", step)
        self.closed = True
        self.sender.close()
