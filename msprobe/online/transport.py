"""Moving packets: a shared store (``nfs_path``: directory or URL) or TCP, TLS 1.2+ with mutual certificates.

Training side (senders): :class:`StoreSink` publishes each packet atomically as
``<run>/rank<R>/<seq>.pkt`` through :mod:`msprobe.backends` (temp file + rename
locally, single PUT / completed multipart upload on object stores), so a
watcher never reads half a packet. :class:`SocketSink` sends length-prefixed
frames to the checker's listener.

Checker side (receivers): :class:`StoreWatcher` polls the store for packets it
has not processed yet; :class:`SocketListener` accepts connections (one thread
each) and hands decoded packets to a bounded queue, so a slow checker
back-pressures the TCP stream instead of growing without bound.

Certificates (the docs' naming): the training side (client) reads
``client.key``, ``client.crt`` and ``ca.crt`` from ``tls_path``; the checker
(server) reads ``server.key``, ``server.crt`` and ``ca.crt``; ``crl.pem``, when
present, is checked on both sides. Each side requires and verifies the other's
certificate against ``ca.crt`` (the docs' certificates name no host, so host
names are not matched). An encrypted private key is unlocked with the password
in the environment variable ``MSPROBE_TLS_KEY_PASSWORD``.
"""
from __future__ import annotations

import logging
import os
import queue
import select
import socket
import ssl
import struct
import threading
import time
from typing import Any, Callable, Iterator, NoReturn, Optional

from msprobe.backends import open_store
from msprobe.errors import ConfigError, MsprobeError, invalid_value
from msprobe.online._tls_purpose import MARK, client_purpose, relax_client_purpose
from msprobe.online.packet import Packet, PacketError, decode_packet

__all__ = [
    "client_ssl_context",
    "server_ssl_context",
    "send_frame",
    "recv_frame",
    "StoreSink",
    "SocketSink",
    "StoreWatcher",
    "SocketListener",
    "TransportError",
    "PACKET_SUFFIX",
    "MAX_FRAME_BYTES",
]

log = logging.getLogger("msprobe.online")

PACKET_SUFFIX = ".pkt"
#: the default largest frame (config ``online_max_packet_mb``)
MAX_FRAME_BYTES = 1 << 30
_FRAME = struct.Struct(">Q")
_FRAME_MAGIC = b"MSPF"
_ACCEPT = b"MSPA"  # the checker's greeting: it accepted the connection (after the TLS handshake)
PASSWORD_ENV = "MSPROBE_TLS_KEY_PASSWORD"


class TransportError(MsprobeError, OSError):
    """Sending or receiving packets failed (connection refused, reset, TLS handshake)."""


# ----------------------------------------------------------------------------- TLS
def _tls_files(tls_path: str, role: str) -> tuple:
    if not os.path.isdir(tls_path):
        raise invalid_value("tls_path", tls_path, f"a directory holding {role}.key, {role}.crt and ca.crt, "
                                                  "or \"\" for plain TCP")
    key, crt, ca = (os.path.join(tls_path, file_name) for file_name in (f"{role}.key", f"{role}.crt", "ca.crt"))
    missing = [os.path.basename(path) for path in (key, crt, ca) if not os.path.isfile(path)]
    if missing:
        raise invalid_value("tls_path", tls_path, f"a directory holding {role}.key, {role}.crt and ca.crt "
                                                  f"(this one lacks {', '.join(missing)}), or \"\" for plain TCP")
    crl = os.path.join(tls_path, "crl.pem")
    return key, crt, ca, crl if os.path.isfile(crl) else None


def _context(tls_path: str, role: str) -> ssl.SSLContext:
    key, crt, ca, crl = _tls_files(tls_path, role)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if role == "server" else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    try:
        ctx.load_cert_chain(crt, key, password=os.environ.get(PASSWORD_ENV))
        ctx.load_verify_locations(cafile=ca)
        if crl:
            ctx.load_verify_locations(cafile=crl)
            ctx.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"tls_path={tls_path!r}: cannot load the {role} certificate/key or ca.crt: {exc}") from None
    return ctx


def client_ssl_context(tls_path: str) -> ssl.SSLContext:
    """The training side's context: presents client.crt, verifies the checker against ca.crt."""
    return _context(tls_path, "client")


def server_ssl_context(tls_path: str) -> ssl.SSLContext:
    """The checker's context: presents server.crt, requires a client certificate signed by ca.crt
    (whose extendedKeyUsage the listener judges: :mod:`msprobe.online._tls_purpose`)."""
    ctx = _context(tls_path, "server")
    relax_client_purpose(ctx)
    return ctx


# -------------------------------------------------------------------------- framing
def send_frame(sock: Any, data: bytes) -> None:
    sock.sendall(_FRAME_MAGIC + _FRAME.pack(len(data)))
    sock.sendall(data)


_RECV_STEP = 1 << 20


def _recv_exact(sock: Any, count: int) -> Optional[bytearray]:
    """``n`` bytes; the buffer grows as bytes arrive (a header announcing 1 GiB costs nothing
    until the bytes come)."""
    buf = bytearray()
    while len(buf) < count:
        chunk = sock.recv(min(count - len(buf), _RECV_STEP))
        if not chunk:
            return None if not buf else _truncated(len(buf), count)
        buf += chunk
    return buf


def _truncated(got: int, count: int) -> NoReturn:
    raise TransportError(f"connection closed in the middle of a frame ({got} of {count} bytes)")


def recv_frame(sock: Any, max_bytes: int = MAX_FRAME_BYTES) -> Optional[bytearray]:
    """The next frame's bytes, or None at a clean end of stream."""
    head = _recv_exact(sock, len(_FRAME_MAGIC) + _FRAME.size)
    if head is None:
        return None
    if bytes(head[:4]) != _FRAME_MAGIC:
        raise TransportError("not an msprobe online stream (bad frame magic)")
    (count,) = _FRAME.unpack(bytes(head[4:]))
    if count > max_bytes:
        raise TransportError(f"frame of {count} bytes exceeds the limit of {max_bytes}")
    body = _recv_exact(sock, count)
    if body is None:
        raise TransportError("connection closed before a frame's body")
    return body


# ---------------------------------------------------------------------- senders
class StoreSink:
    """Publishes packets into a shared store: ``<run>/rank<R>/<seq:09d>.pkt``."""

    def __init__(self, url: str, *, storage_options: Optional[dict] = None):
        self.url = url
        # still atomic (a file system: temp file + rename), without an fsync per packet (they are transient)
        self.store = open_store(url, storage_options=storage_options).without_fsync()

    @staticmethod
    def key_for(run: str, rank: Any, seq: int) -> str:
        rank_dir = "rank" if rank is None else f"rank{rank}"
        return f"{run}/{rank_dir}/{seq:09d}{PACKET_SUFFIX}"

    def send(self, data: bytes, header: dict) -> None:
        self.store.put(self.key_for(header["run"], header.get("rank"), header["seq"]), data)

    def close(self) -> None:
        pass


class SocketSink:
    """Sends frames to ``host:port`` (TLS when ``ssl_context`` is given); connects lazily,
    and reconnects after a failure (the frame that failed is reported, not retried)."""

    def __init__(self, host: str, port: int, *, ssl_context: Optional[ssl.SSLContext] = None,
                 connect_timeout: float = 5.0):
        self.host, self.port = host, int(port)
        self.ssl_context = ssl_context
        self.connect_timeout = connect_timeout
        self._sock: Any = None

    def _connect(self) -> Any:
        try:
            raw = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
        except OSError as exc:
            raise TransportError(f"cannot connect to the checker at {self.host}:{self.port}: {exc}") from None
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock = raw
        if self.ssl_context is not None:
            try:
                sock = self.ssl_context.wrap_socket(raw, server_hostname=self.host)
            except (ssl.SSLError, OSError) as exc:
                raw.close()
                raise TransportError(f"TLS handshake with {self.host}:{self.port} failed: {exc}") from None
        try:  # wait for the greeting: with TLS 1.3 a refused client certificate shows only here
            got = _recv_exact(sock, len(_ACCEPT))
        except (ssl.SSLError, OSError, TransportError) as exc:
            sock.close()
            raise TransportError(f"the checker at {self.host}:{self.port} refused the connection: {exc}") from None
        if got is None or bytes(got) != _ACCEPT:
            sock.close()
            raise TransportError(f"the checker at {self.host}:{self.port} closed the connection "
                                 "(refused, or not an msprobe online checker)")
        sock.settimeout(None)
        return sock

    def send(self, data: bytes, header: dict) -> None:
        if self._sock is not None and _peer_closed(self._sock):  # e.g. closed by the checker when idle
            self._drop()
        if self._sock is None:
            self._sock = self._connect()
        try:
            send_frame(self._sock, data)
        except (OSError, ssl.SSLError) as exc:
            self._drop()
            raise TransportError(f"sending to {self.host}:{self.port} failed: {exc}") from None

    def _drop(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None

    def close(self) -> None:
        if self._sock is not None:
            try:
                if isinstance(self._sock, ssl.SSLSocket):
                    self._sock.unwrap()
            except (OSError, ssl.SSLError, ValueError):
                pass
        self._drop()


def _peer_closed(sock: Any) -> bool:
    """True when the checker closed the connection: the socket is readable at end of stream
    (the checker never sends after its greeting; TLS records such as session tickets are read
    and dropped). A frame sent there would be lost without an error."""
    try:
        if not select.select([sock], [], [], 0)[0]:
            return False
        sock.setblocking(False)
        try:
            while True:
                if not sock.recv(4096):
                    return True
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return False
        finally:
            sock.setblocking(True)
    except (OSError, ValueError, ssl.SSLError):
        return True


# --------------------------------------------------------------------- receivers
class StoreWatcher:
    """Polls a store for new ``*.pkt`` packets, in (run, rank, seq) order.

    ``done`` holds the keys already processed (the checker's progress journal); a
    packet is yielded once per watcher. ``interval``: seconds between listings.
    """

    def __init__(self, url: str, *, storage_options: Optional[dict] = None, interval: float = 0.2,
                 done: Optional[set] = None, max_packet_bytes: int = MAX_FRAME_BYTES, remove_done: bool = False):
        self.url = url
        self.store = open_store(url, storage_options=storage_options)
        self.interval = interval
        self.done: set = done if done is not None else set()  # live: the checker adds what it recorded
        self.seen: set = set(self.done)
        self.max_packet_bytes = max_packet_bytes
        self.remove_done = remove_done
        self.bad: list = []

    def poll(self) -> list:
        """Keys of packets present and not yet seen, in order."""
        try:
            keys = self.store.list_prefix("")
        except Exception as exc:  # noqa: BLE001 - a transient listing error: try again at the next poll
            log.warning("msprobe online: listing %s failed: %s", self.url, exc)
            return []
        new = [key for key in keys if key.endswith(PACKET_SUFFIX) and key not in self.seen]
        if self.remove_done:  # left behind by a checker killed between recording and removing them
            self.remove([key for key in keys if key.endswith(PACKET_SUFFIX) and key in self.done])
        return sorted(new, key=_packet_order)

    def remove(self, keys: list) -> None:
        """Delete processed packets (the checker recorded them first); failures only warn."""
        for key in keys:
            try:
                self.store.delete(key)
            except Exception as exc:  # noqa: BLE001 - a packet left behind is skipped by the progress record
                log.warning("msprobe online: could not remove processed packet %s: %s", key, exc)

    def read(self, key: str) -> Optional[Packet]:
        self.seen.add(key)
        try:
            size = self.store.size(key)
            if size > self.max_packet_bytes:
                raise PacketError(f"{key}: {size} bytes exceeds the packet limit {self.max_packet_bytes}")
            return decode_packet(self.store.get(key), key=key)
        except (PacketError, MsprobeError) as exc:
            log.warning("msprobe online: skipping %s: %s", key, exc)
            self.bad.append((key, str(exc)))
            return None

    def packets(self, stop: Callable[[], bool]) -> Iterator[Packet]:
        """Packets as they appear, until ``stop()`` is true at an idle moment."""
        while True:
            keys = self.poll()
            for key in keys:
                packet = self.read(key)
                if packet is not None:
                    yield packet
            if not keys:
                if stop():
                    return
                time.sleep(self.interval)


def _packet_order(key: str) -> tuple:
    parts = key.split("/")
    stem = parts[-1][: -len(PACKET_SUFFIX)]
    return (tuple(parts[:-1]), int(stem) if stem.isdigit() else -1, stem)


class SocketListener:
    """Listens on ``host:port``; every connection's frames are decoded into ``self.queue``.

    The queue is bounded (``max_queued`` packets): a reader thread blocks when it
    is full, and TCP flow control slows the sender down, whose own bounded queue
    then sheds load by sampling. Connections that fail the TLS handshake (a wrong
    or missing certificate) are refused and counted in ``refused``.
    """

    def __init__(self, host: str, port: int, *, ssl_context: Optional[ssl.SSLContext] = None,
                 max_queued: int = 64, max_frame_bytes: int = MAX_FRAME_BYTES, max_connections: int = 64,
                 idle_timeout: float = 300.0):
        self.host = host
        self.idle_timeout = idle_timeout  # a silent connection is closed after this (its slot is freed)
        self.idle_closed = 0
        self.max_connections = max_connections
        self._active = threading.BoundedSemaphore(max_connections)
        self.ssl_context = ssl_context
        self.max_frame_bytes = max_frame_bytes
        self.queue: "queue.Queue" = queue.Queue(maxsize=max_queued)
        self.refused: list = []
        self.connections = 0
        self.noted_server_auth = False  # the note about a serverAuth client certificate was given
        self._closed = threading.Event()
        try:
            self._sock = socket.create_server((host, int(port)), reuse_port=False)
        except OSError as exc:
            raise TransportError(f"cannot listen on {host}:{port}: {exc}") from None
        self.port = self._sock.getsockname()[1]
        self._sock.settimeout(0.2)
        self._thread = threading.Thread(target=self._accept_loop, name="msprobe-online-listener", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, addr = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                if self._closed.is_set():
                    return
                continue
            if not self._active.acquire(blocking=False):  # bounded: one thread per connection, at most this many
                log.warning("msprobe online: refused a connection from %s: %d connections are open already "
                            "(online_max_connections)", addr, self.max_connections)
                self.refused.append((addr, "too many connections"))
                try:
                    conn.close()
                except OSError:
                    pass
                continue
            threading.Thread(target=self._serve_bounded, args=(conn, addr), name="msprobe-online-conn",
                             daemon=True).start()

    def _serve_bounded(self, conn: Any, addr: Any) -> None:
        try:
            self._serve(conn, addr)
        finally:
            self._active.release()

    def _serve(self, conn: Any, addr: Any) -> None:
        conn.settimeout(30.0)
        if self.ssl_context is not None:
            try:
                conn = self.ssl_context.wrap_socket(conn, server_side=True)
            except (ssl.SSLError, OSError) as exc:
                hint = " (a client certificate needs extendedKeyUsage clientAuth)" \
                    if "unsuitable certificate purpose" in str(exc) else ""
                log.warning("msprobe online: refused a connection from %s: TLS handshake failed: %s%s", addr, exc, hint)
                self.refused.append((addr, str(exc)))
                conn.close()
                return
            if not self._purpose_ok(conn, addr):
                return
        try:
            conn.sendall(_ACCEPT)
        except (ssl.SSLError, OSError) as exc:
            log.warning("msprobe online: refused a connection from %s: %s", addr, exc)
            self.refused.append((addr, str(exc)))
            conn.close()
            return
        conn.settimeout(self.idle_timeout)  # each read: a client silent for that long gives its slot back
        self.connections += 1
        try:
            while not self._closed.is_set():
                try:
                    frame = recv_frame(conn, self.max_frame_bytes)
                except socket.timeout:
                    self.idle_closed += 1
                    log.info("msprobe online: closed a connection from %s silent for %.0f s (online_idle_timeout)",
                             addr, self.idle_timeout)
                    return
                if frame is None:
                    return
                try:
                    packet = decode_packet(frame)
                except PacketError as exc:
                    log.warning("msprobe online: bad packet from %s: %s", addr, exc)
                    continue
                while not self._closed.is_set():
                    try:
                        self.queue.put(packet, timeout=0.5)
                        break
                    except queue.Full:
                        continue
        except (TransportError, OSError, ssl.SSLError) as exc:
            log.warning("msprobe online: connection from %s ended: %s", addr, exc)
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def _purpose_ok(self, conn: Any, addr: Any) -> bool:
        """The client certificate's extendedKeyUsage, when the context left it to the listener."""
        if not getattr(self.ssl_context, MARK, False):
            return True
        verdict, why = client_purpose(conn.getpeercert(binary_form=True))
        if verdict == "server-auth" and not self.noted_server_auth:
            self.noted_server_auth = True
            log.warning("msprobe online: note: %s", why)
        if verdict != "refuse":
            return True
        log.warning("msprobe online: refused a connection from %s: %s", addr, why)
        self.refused.append((addr, why))
        conn.close()
        return False

    def packets(self, stop: Callable[[], bool], poll: float = 0.2) -> Iterator[Packet]:
        while True:
            try:
                yield self.queue.get(timeout=poll)
            except queue.Empty:
                if stop():
                    return

    def close(self) -> None:
        self._closed.set()
        try:
            self._sock.close()
        except OSError:
            pass
