"""The training side's non-blocking sender: a bounded queue drained by one background thread.

``admit()`` is asked *before* a packet is built (so a shed packet costs no tensor
copy): it says no when the queue is full (counted in ``dropped``) and, once that
has happened, lets only every ``sample_every``-th packet through (counted in
``sampled_out``): each overflow doubles the interval, each time the queue
drains below a quarter the interval halves back toward 1. Training never waits
for the checker; only :meth:`close` waits, at most ``flush_timeout`` seconds.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any, Callable, Optional

__all__ = ["OnlineSender", "SenderStats"]

log = logging.getLogger("msprobe.online")

MAX_SAMPLE_EVERY = 1024


class SenderStats:
    __slots__ = ("sent", "dropped", "sampled_out", "failed", "bytes_sent", "sample_every", "max_sample_every")

    def __init__(self) -> None:
        self.sent = self.dropped = self.sampled_out = self.failed = self.bytes_sent = 0
        self.sample_every = self.max_sample_every = 1

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


class OnlineSender:
    """``sink.send(bytes, header)`` runs on the background thread; ``build()`` of each
    queued item (header, tensors -> bytes) too."""

    def __init__(self, sink: Any, *, max_packets: int = 256, max_bytes: int = 256 << 20,
                 flush_timeout: float = 60.0, retry_backoff: float = 0.5,
                 on_thread_start: Optional[Callable[[], None]] = None):
        self.sink = sink
        self._on_thread_start = on_thread_start
        self.max_packets = max(1, int(max_packets))
        self.max_bytes = max(1, int(max_bytes))
        self.flush_timeout = flush_timeout
        self.retry_backoff = retry_backoff
        self.stats = SenderStats()
        self._q: deque = deque()
        self._bytes = 0
        self._counter = 0
        self._cond = threading.Condition()
        self._closing = False
        self._busy = False
        self._last_error: Optional[str] = None
        self._down_until = 0.0
        self._thread = threading.Thread(target=self._run, name="msprobe-online-sender", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ training thread
    def admit(self, nbytes: int = 0) -> bool:
        """Whether to build the next packet (never blocks)."""
        st = self.stats
        with self._cond:
            n = len(self._q)
            if st.sample_every > 1 and n <= self.max_packets // 4 and self._bytes <= self.max_bytes // 4:
                st.sample_every //= 2
                if st.sample_every == 1:
                    log.warning("msprobe online: the checker keeps up again; sending every API "
                                "(%d dropped, %d sampled out so far)", st.dropped, st.sampled_out)
            if n >= self.max_packets or self._bytes + nbytes > self.max_bytes and n:
                st.dropped += 1
                if st.sample_every < MAX_SAMPLE_EVERY:
                    st.sample_every *= 2
                    st.max_sample_every = max(st.max_sample_every, st.sample_every)
                    log.warning("msprobe online: the checker is slower than training; sampling 1 API in %d "
                                "(%d dropped so far)", st.sample_every, st.dropped)
                return False
            self._counter += 1
            if st.sample_every > 1 and self._counter % st.sample_every:
                st.sampled_out += 1
                return False
            return True

    def submit(self, build: Callable[[], tuple], nbytes: int, control: bool = False) -> None:
        """Queue ``build() -> (bytes, header)``; control packets (step end, close) are never shed."""
        with self._cond:
            if self._closing and not control:
                return
            self._q.append((build, nbytes))
            self._bytes += nbytes
            self._cond.notify_all()

    # --------------------------------------------------------------- background
    def _run(self) -> None:
        if self._on_thread_start is not None:
            self._on_thread_start()
        while True:
            with self._cond:
                while not self._q and not self._closing:
                    self._cond.wait()
                if not self._q:
                    return
                build, nbytes = self._q.popleft()
                self._busy = True
            try:
                self._send_one(build)
            finally:
                with self._cond:
                    self._bytes -= nbytes
                    self._busy = False
                    self._cond.notify_all()

    def _send_one(self, build: Callable[[], tuple]) -> None:
        try:
            data, header = build()
        except Exception as exc:  # noqa: BLE001 - a packet that cannot be built is reported, never raised into training
            self.stats.failed += 1
            self._note(f"building a packet failed: {type(exc).__name__}: {exc}")
            return
        control = header.get("kind") != "api"
        attempts = 0
        while True:
            now = time.monotonic()
            if not control and now < self._down_until:  # the checker is unreachable: shed API packets
                self.stats.dropped += 1
                return
            try:
                self.sink.send(data, header)
                self.stats.sent += 1
                self.stats.bytes_sent += len(data)
                self._down_until = 0.0
                return
            except Exception as exc:  # noqa: BLE001 - never raise into training: the failure is counted and logged
                attempts += 1
                self._note(f"sending {header.get('name') or header.get('kind')} failed: {exc}")
                if not control or attempts >= 3 or self._closing and attempts >= 2:
                    self._down_until = time.monotonic() + self.retry_backoff
                    if control:
                        self.stats.failed += 1
                    else:
                        self.stats.dropped += 1
                    return
                time.sleep(self.retry_backoff)

    def _note(self, msg: str) -> None:
        if msg != self._last_error:
            log.warning("msprobe online: %s", msg)
            self._last_error = msg

    # ------------------------------------------------------------------ lifecycle
    def pending(self) -> int:
        with self._cond:
            return len(self._q) + (1 if self._busy else 0)

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Wait until the queue is empty (at most ``timeout`` s); True when it is."""
        deadline = time.monotonic() + (self.flush_timeout if timeout is None else timeout)
        with self._cond:
            while self._q or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout: Optional[float] = None) -> None:
        drained = self.flush(timeout)
        with self._cond:
            self._closing = True
            if not drained:  # give up on what is left: it counts as dropped
                left = len(self._q)
                self._q.clear()
                self._bytes = 0
                self.stats.dropped += left
            self._cond.notify_all()
        self._thread.join(timeout=5.0)
        try:
            self.sink.close()
        except Exception:  # noqa: BLE001 - never raise into training: the failure is counted and logged
            pass
        st = self.stats
        if st.dropped or st.sampled_out or st.failed:
            log.warning("msprobe online: sent %d packets; %d dropped, %d sampled out, %d failed "
                        "(the checker was slower than training or unreachable)",
                        st.sent, st.dropped, st.sampled_out, st.failed)
