"""Pytest plugin: a real S3 server (moto) on 127.0.0.1, and a fault-injecting proxy.

Load it with ``pytest_plugins = ["tests.conftest_s3"]`` in ``tests/conftest.py``.

Fixtures
--------
``s3_server``      (session) endpoint URL of a ``moto.server.ThreadedMotoServer``
                   on 127.0.0.1 and a free port; AWS_* env vars are dummies.
``s3_bucket_url``  (function) ``s3://<fresh bucket>``; use it with
                   ``s3_storage_options(s3_server)``. The bucket is emptied and
                   deleted afterwards.
``s3_fault_proxy`` (function) a :class:`FaultProxy` in front of ``s3_server``:
                   an HTTP proxy that fails a chosen fraction of requests with
                   500 InternalError, 503 SlowDown, connection resets (before
                   or after the request reached the server) and timeouts, and
                   answers 403 AccessDenied for keys matching a pattern.

Tests that use them should be marked ``@pytest.mark.s3``. s3fs instances are
never shared between tests: the options carry ``skip_instance_cache=True`` and
the instance cache is cleared after each test.
"""
from __future__ import annotations

import http.client
import logging
import os
import random
import re
import socket
import struct
import threading
import time
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest

__all__ = ["s3_storage_options", "s3_etags", "FaultProxy", "FAULT_KINDS"]

_DUMMY_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SECURITY_TOKEN": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}


_SESSION: Any = None
_SESSION_LOCK = threading.Lock()


def _shared_session() -> Any:
    """One aiobotocore session per process: loading botocore's models once makes a
    new S3FileSystem cost ~0.1 s instead of ~0.5-1 s. Clients (and so connections
    and caches) are still per file system."""
    global _SESSION
    with _SESSION_LOCK:
        if _SESSION is None:
            from aiobotocore.session import AioSession

            _SESSION = AioSession()
        return _SESSION


def s3_storage_options(endpoint: str, *, picklable: bool = False, **extra: Any) -> dict[str, Any]:
    """storage_options for s3fs talking to the test server at ``endpoint``.

    ``extra`` is merged in; ``config_kwargs`` given there are merged with the
    defaults (short timeouts). ``picklable=True`` leaves out the shared
    session, for options sent to other processes.
    """
    config = {"connect_timeout": 5, "read_timeout": 30}
    config.update(extra.pop("config_kwargs", {}))
    options = {
        "client_kwargs": {"endpoint_url": endpoint},
        "key": "testing",
        "secret": "testing",
        "skip_instance_cache": True,
        "config_kwargs": config,
        **extra,
    }
    if not picklable:
        options.setdefault("session", _shared_session())
    return options


def s3_etags(fs: Any, prefix: str) -> dict[str, str]:
    """``{key relative to prefix: ETag}`` of every object below ``prefix`` (``bucket/path``),
    from one listing. For objects written with a single PUT the ETag is the MD5 of
    the bytes the server stored, so comparing it with ``hashlib.md5(data)`` checks
    every object's content without downloading it."""
    prefix = prefix.rstrip("/")
    fs.invalidate_cache(prefix)
    return {
        path[len(prefix) + 1 :]: info["ETag"].strip('"')
        for path, info in fs.find(prefix, detail=True).items()
    }


def _clear_s3fs_cache() -> None:
    try:
        from s3fs import S3FileSystem
    except ImportError:
        return
    S3FileSystem.clear_instance_cache()


def _speed_up_moto(mp: pytest.MonkeyPatch) -> None:
    """moto lists its own package directory (~180 stat calls) on every request to
    route it; the answer never changes, so compute it once (halves server time)."""
    try:
        from moto import backends
    except ImportError:
        return
    modules = tuple(backends.list_of_moto_modules())
    mp.setattr(backends, "list_of_moto_modules", lambda: modules)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """Endpoint URL of a moto S3 server on 127.0.0.1 (one per test process)."""
    pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    with pytest.MonkeyPatch.context() as mp:
        for name, value in _DUMMY_ENV.items():
            mp.setenv(name, value)
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no access log on stderr
        _speed_up_moto(mp)
        server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        try:
            yield f"http://{host}:{port}"
        finally:
            server.stop()
            _clear_s3fs_cache()


@pytest.fixture(scope="session")
def _s3_admin_fs(s3_server: str) -> Any:
    """A file system used only to create and remove test buckets."""
    import s3fs

    return s3fs.S3FileSystem(**s3_storage_options(s3_server))


@pytest.fixture
def s3_bucket_url(s3_server: str, _s3_admin_fs: Any) -> Iterator[str]:
    """``s3://<fresh bucket>`` on the test server.

    Buckets are not emptied afterwards: the server lives in memory for one test
    session, and listing plus deleting thousands of objects costs seconds.
    """
    bucket = f"test-{uuid.uuid4().hex[:20]}"
    _s3_admin_fs.mkdir(bucket)
    try:
        yield f"s3://{bucket}"
    finally:
        _s3_admin_fs.invalidate_cache()
        _clear_s3fs_cache()


# -- fault injection ---------------------------------------------------------

#: the faults a FaultProxy can inject
FAULT_KINDS = ("500", "503", "reset_before", "reset_after", "timeout")
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade", "expect"}
_ERROR_XML = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
    "<RequestId>{rid}</RequestId></Error>"
)


class FaultProxy:
    """An HTTP/1.1 proxy in front of an S3 endpoint that injects faults.

    ``rate`` is the probability that a request gets one of ``kinds`` (chosen
    uniformly): ``500`` (InternalError), ``503`` (SlowDown), ``reset_before``
    (connection reset before the request is forwarded), ``reset_after`` (the
    request reaches the server, the response is lost to a reset) and
    ``timeout`` (no answer for ``hold`` seconds, then a reset). Requests whose
    path matches ``deny`` always get 403 AccessDenied. ``counts`` records what
    happened; ``requests`` counts every request.
    """

    def __init__(self, upstream: str, *, rate: float = 0.0, kinds: tuple[str, ...] = FAULT_KINDS,
                 hold: float = 1.0, deny: str | None = None, seed: int = 0) -> None:
        self.upstream = upstream.split("://", 1)[1]
        self.rate, self.kinds, self.hold = rate, tuple(kinds), hold
        self.deny = re.compile(deny) if deny else None
        self.counts: Counter[str] = Counter()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        proxy = self

        class Handler(_ProxyHandler):
            fault_proxy = proxy

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._server.handle_error = lambda request, client_address: None  # resets are the point
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def requests(self) -> int:
        return self.counts["requests"]

    @property
    def faults(self) -> int:
        return sum(self.counts[k] for k in FAULT_KINDS)

    def start(self) -> "FaultProxy":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def choose(self, method: str, path: str) -> str | None:
        with self._lock:
            self.counts["requests"] += 1
            if self.deny is not None and method in ("PUT", "POST") and self.deny.search(path):
                self.counts["deny"] += 1
                return "deny"
            if self.rate and self._rng.random() < self.rate:
                kind = self._rng.choice(self.kinds)
                self.counts[kind] += 1
                return kind
        return None


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fault_proxy: FaultProxy
    _upstream: http.client.HTTPConnection | None = None

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass
        if self._upstream is not None:
            self._upstream.close()

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _reset(self) -> None:
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()  # RST, not FIN
        except OSError:
            pass

    def _error(self, status: int, code: str, message: str) -> None:
        body = _ERROR_XML.format(code=code, message=message, rid=uuid.uuid4().hex).encode()
        self.send_response_only(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        if self._upstream is None:
            self._upstream = http.client.HTTPConnection(self.fault_proxy.upstream, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            headers["Content-Length"] = str(len(body))
        try:
            self._upstream.request(self.command, self.path, body=body, headers=headers)
            resp = self._upstream.getresponse()
        except (OSError, http.client.HTTPException):
            self._upstream.close()
            self._upstream = http.client.HTTPConnection(self.fault_proxy.upstream, timeout=60)
            self._upstream.request(self.command, self.path, body=body, headers=headers)
            resp = self._upstream.getresponse()
        data = resp.read()
        return resp.status, resp.reason, resp.getheaders(), data

    def _handle(self) -> None:
        body = self._read_body()
        fault = self.fault_proxy.choose(self.command, self.path)
        if fault == "reset_before":
            return self._reset()
        if fault == "timeout":
            time.sleep(self.fault_proxy.hold)
            return self._reset()
        if fault == "500":
            return self._error(500, "InternalError", "We encountered an internal error. Please try again.")
        if fault == "503":
            return self._error(503, "SlowDown", "Please reduce your request rate.")
        if fault == "deny":
            return self._error(403, "AccessDenied", "Access Denied")
        status, reason, headers, data = self._forward(body)
        if fault == "reset_after":
            return self._reset()
        self.send_response_only(status, reason)
        for name, value in headers:
            if name.lower() in _HOP_BY_HOP or (name.lower() == "content-length" and self.command != "HEAD"):
                continue
            self.send_header(name, value)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle


@pytest.fixture
def s3_fault_proxy(s3_server: str) -> Iterator[FaultProxy]:
    """A :class:`FaultProxy` in front of the test server (no faults until configured)."""
    proxy = FaultProxy(s3_server).start()
    try:
        yield proxy
    finally:
        proxy.stop()
        _clear_s3fs_cache()
