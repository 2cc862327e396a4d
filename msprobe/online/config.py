"""The online keys of config.json, for both sides (docs: 08.accuracy_checker_online_PyTorch).

Training side, in the dump task's section (``"tensor": {...}``): ``online_run_ut``,
``nfs_path``, ``host``, ``port``, ``tls_path``, ``online_run_ut_recompute``.
Checker side, in ``"run_ut": {...}``: ``is_online``, ``nfs_path``, ``host``,
``port``, ``rank_list``, ``tls_path`` (and run_ut's ``white_list``,
``black_list``, ``error_data_path``).

``nfs_path`` wins over ``host``/``port`` (as the docs say). ``tls_path``
absent means the current directory; ``""`` means plain TCP, which is only
used when configured so explicitly. Our own keys: ``online_queue_size``
(packets, default 256), ``online_queue_bytes`` (default 256 MiB),
``online_flush_timeout`` (seconds ``stop``/exit waits for the queue, default 60),
``poll_interval`` (checker, seconds between store listings), ``online_max_packet_mb``
(checker, the largest packet accepted, default 1024), ``online_max_connections`` (checker,
TCP/TLS connections served at once, default 64) and ``online_idle_timeout`` (checker, seconds a
connection may stay silent before it is closed and its slot freed, default 300; the sender
reconnects when it has a packet again).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from msprobe.errors import ConfigError, invalid_value

__all__ = ["OnlineSettings", "parse_online", "ONLINE_KEYS"]

ONLINE_KEYS = ("online_run_ut", "is_online", "nfs_path", "host", "port", "tls_path", "online_run_ut_recompute",
               "rank_list", "online_queue_size", "online_queue_bytes", "online_flush_timeout", "poll_interval",
               "online_max_packet_mb", "online_max_connections",
               "online_idle_timeout")


@dataclass
class OnlineSettings:
    nfs_path: str = ""
    host: str = ""
    port: int = -1
    tls_path: str = "./"
    recompute: bool = False
    rank_list: list = field(default_factory=lambda: [0])
    queue_size: int = 256
    queue_bytes: int = 256 << 20
    flush_timeout: float = 60.0
    poll_interval: float = 0.2
    max_packet_bytes: int = 1 << 30  #: checker: the largest packet (frame) accepted; its bytes are read as they arrive
    max_connections: int = 64  #: checker: TCP/TLS connections served at once (one thread each); more are refused
    idle_timeout: float = 300.0  #: checker: seconds a connection may stay silent before it is closed
    storage_options: Optional[dict] = field(default=None, repr=False)

    @property
    def transport(self) -> str:
        """'store' (nfs_path set) or 'tls' / 'tcp'."""
        if self.nfs_path:
            return "store"
        return "tcp" if self.tls_path == "" else "tls"

    def describe(self) -> str:
        if self.transport == "store":
            return f"shared store {self.nfs_path}"
        return f"{self.transport.upper()} {self.host}:{self.port}"


def _bool(raw: dict, key: str, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise invalid_value(key, value, "true or false")
    return value


def _text(raw: dict, key: str, default: str, valid: str) -> str:
    value = raw.get(key, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise invalid_value(key, value, valid)
    return value


def _num(raw: dict, key: str, default: Any, *, minimum: float, integer: bool = True) -> Any:
    value = raw.get(key, default)
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if not ok or isinstance(value, bool) or value < minimum:
        raise invalid_value(key, value, f"{'an integer' if integer else 'a number'} >= {minimum}")
    return value


def parse_online(raw: dict, *, side: str, storage_options: Optional[dict] = None) -> Optional[OnlineSettings]:
    """Settings from a task section (top-level keys as fallback are merged by the caller).

    ``side``: 'training' (switch ``online_run_ut``) or 'checker' (switch ``is_online``, or
    forced by ``--online``: pass ``raw`` with ``is_online`` true). None when the switch is off.
    """
    switch = "online_run_ut" if side == "training" else "is_online"
    if not _bool(raw, switch, False):
        return None
    s = OnlineSettings(storage_options=storage_options)
    s.nfs_path = _text(raw, "nfs_path", "", "a directory path or URL string, or \"\"").strip()
    s.host = _text(raw, "host", "", "an IP address or host name string").strip()
    port = raw.get("port", -1)
    if port is None:
        port = -1
    if not isinstance(port, int) or isinstance(port, bool) or not (port == -1 or 0 <= port <= 65535):
        raise invalid_value("port", port, "an integer port 0..65535 (-1: not set)")
    s.port = port
    s.tls_path = _text(raw, "tls_path", "./", "a directory path, or \"\" for plain TCP")
    s.recompute = _bool(raw, "online_run_ut_recompute", False)
    ranks = raw.get("rank_list", [0])
    if ranks is None or ranks == []:
        ranks = [0]
    if not isinstance(ranks, list) or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks):
        raise invalid_value("rank_list", ranks, "a list of integers >= 0 (default [0])")
    s.rank_list = sorted(set(ranks))
    s.queue_size = _num(raw, "online_queue_size", s.queue_size, minimum=1)
    s.queue_bytes = _num(raw, "online_queue_bytes", s.queue_bytes, minimum=1)
    s.flush_timeout = float(_num(raw, "online_flush_timeout", s.flush_timeout, minimum=0, integer=False))
    s.poll_interval = float(_num(raw, "poll_interval", s.poll_interval, minimum=0.01, integer=False))
    s.max_packet_bytes = _num(raw, "online_max_packet_mb", s.max_packet_bytes >> 20, minimum=1) << 20
    s.max_connections = _num(raw, "online_max_connections", s.max_connections, minimum=1)
    s.idle_timeout = float(_num(raw, "online_idle_timeout", s.idle_timeout, minimum=0.01, integer=False))
    if not s.nfs_path:
        if not s.host:
            raise ConfigError(f"{switch} is true but neither nfs_path nor host/port is set; set nfs_path "
                              "(a shared directory or URL) or host and port")
        if side == "training" and s.port <= 0:
            raise invalid_value("port", s.port, "the checker's port, 1..65535")
        if side == "checker" and s.port < 0:
            raise invalid_value("port", s.port, "a port to listen on, 0..65535 (0: any free port)")
    return s


def section_with_fallback(raw: dict, task: str) -> dict:
    """The task section's keys over the online keys found at the top level."""
    merged = {k: raw[k] for k in ONLINE_KEYS if k in raw}
    sub = raw.get(task)
    if isinstance(sub, dict):
        merged.update(sub)
    return merged
