"""The online TLS recipe of the real tool's docs (8.x doc 08): certificates made with the openssl
command line as documented (the client certificate carries ``extendedKeyUsage = serverAuth``), a
real listener and real sockets. The documented client certificate is accepted with a note that
clientAuth is preferred; certificates of another CA, or with another usage, are refused."""
from __future__ import annotations

import logging
import shutil
import subprocess
import time

import pytest

from msprobe.online._tls_purpose import EKU_SERVER_AUTH, extended_key_usage
from msprobe.online.packet import encode_packet
from msprobe.online.transport import (
    PASSWORD_ENV,
    SocketListener,
    SocketSink,
    TransportError,
    client_ssl_context,
    server_ssl_context,
)

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None or shutil.which("bash") is None,
                                reason="needs the openssl command line")

#: doc 08's commands (the CA, then a client and a server certificate; long lines continued), with the client's
#: extendedKeyUsage as a parameter ($EKU; the docs write serverAuth), the CA's name ($CA), and
#: $CLIENT_EXT: empty as in the docs (OpenSSL 3.0 then leaves the [v3_server] section out of the
#: client certificate: a v1 certificate, no usage) or "-extensions v3_server" (the usage is in it,
#: what other OpenSSL versions make of the docs' command)
RECIPE = r'''
set -e
openssl req -new -newkey rsa:3072 -passout pass:ca_password \
  -subj "/CN=*$CA.com/O=ca.Inc./C=CN/ST=Zhejiang/L=Hangzhou" -keyout ca.key -out ca.csr
openssl x509 -req -days 365 -in ca.csr -signkey ca.key -passin pass:ca_password -out ca.crt \
  -extensions v3_ca -extfile <(cat <<-EOF
[v3_ca]
basicConstraints = critical,CA:true
keyUsage = critical, keyCertSign, cRLSign
EOF
)
openssl genrsa -aes256 -passout pass:client_password -out client.key 3072
openssl req -new -key client.key -passin pass:client_password \
  -subj "/CN=*example.com/O=Test, Inc./C=CN/ST=Zhejiang/L=Hangzhou" -out client.csr
openssl x509 -req -days 180 -CA ca.crt -CAkey ca.key -passin pass:ca_password -in client.csr \
  -out client.crt -CAcreateserial $CLIENT_EXT -extfile <(cat <<-EOF
[v3_server]
basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = $EKU
EOF
)
openssl genrsa -aes256 -passout pass:server_password -out server.key 3072
openssl req -new -key server.key -passin pass:server_password \
  -subj "/CN=*example.com/O=Test, Inc./C=CN/ST=Zhejiang/L=Hangzhou" -out server.csr
openssl x509 -req -days 180 -CA ca.crt -CAkey ca.key -passin pass:ca_password -in server.csr \
  -out server.crt -CAcreateserial -extfile <(cat <<-EOF
[v3_server]
basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
EOF
)
'''
_ENV = {"PATH": "/usr/bin:/bin"}


def _recipe(d, eku: str, ca: str = "ca", ext: str = "-extensions v3_server") -> str:
    d.mkdir()
    subprocess.run(["bash", "-c", RECIPE], cwd=d, check=True, capture_output=True,
                   env=dict(_ENV, EKU=eku, CA=ca, CLIENT_EXT=ext))
    return str(d)


def _usage(tls_path: str):
    import ssl

    with open(f"{tls_path}/client.crt") as f:
        return extended_key_usage(ssl.PEM_cert_to_DER_cert(f.read()))


def _resign(base, name: str, eku: str) -> str:
    """``name``'s client key, with a certificate of usage ``eku`` signed by the doc's CA."""
    d = base / f"{name}_{eku}"
    d.mkdir()
    subprocess.run(["bash", "-c", "openssl x509 -req -days 180 -CA ../doc/ca.crt -CAkey ../doc/ca.key "
                    f"-passin pass:ca_password -in ../{name}/client.csr -out client.crt -CAcreateserial "
                    "-extfile <(printf 'basicConstraints = CA:FALSE\\nextendedKeyUsage = %s\\n' \"$EKU\")"],
                   cwd=d, check=True, capture_output=True, env=dict(_ENV, EKU=eku))
    shutil.copy(base / "doc" / "ca.crt", d / "ca.crt")
    shutil.copy(base / name / "client.key", d / "client.key")
    return str(d)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    base = tmp_path_factory.mktemp("recipe")
    out = {"doc": _recipe(base / "doc", "serverAuth"), "other_ca": _recipe(base / "other_ca", "serverAuth", ca="other"),
           "doc_verbatim": _recipe(base / "doc_verbatim", "serverAuth", ext="")}
    out["client_auth"] = _resign(base, "other_ca", "clientAuth")
    out["code_signing"] = _resign(base, "other_ca", "codeSigning")
    return out


def _ctx(kind: str, tls_path: str, monkeypatch):
    monkeypatch.setenv(PASSWORD_ENV, f"{kind}_password")
    return (client_ssl_context if kind == "client" else server_ssl_context)(tls_path)


def _send(port: int, ctx, run: str) -> None:
    hdr = {"kind": "close", "run": run, "rank": 0, "step": 0, "seq": 0}
    sink = SocketSink("127.0.0.1", port, ssl_context=ctx)
    try:
        sink.send(encode_packet(hdr), hdr)
    finally:
        sink.close()


def _got(listener, n: int, timeout: float = 10.0) -> list:
    import queue

    out, t0 = [], time.monotonic()
    while len(out) < n and time.monotonic() - t0 < timeout:
        try:
            out.append(listener.queue.get(timeout=0.2).header["run"])
        except queue.Empty:
            continue
    return out


def test_documented_client_certificate_accepted_with_a_note(certs, monkeypatch, caplog):
    assert _usage(certs["doc"]) == {EKU_SERVER_AUTH}  # what OpenSSL's client check refuses
    listener = SocketListener("127.0.0.1", 0, ssl_context=_ctx("server", certs["doc"], monkeypatch))
    try:
        with caplog.at_level(logging.WARNING):
            client = _ctx("client", certs["doc"], monkeypatch)
            _send(listener.port, client, "doc1")
            _send(listener.port, client, "doc2")
            assert _got(listener, 2) == ["doc1", "doc2"]
        assert listener.noted_server_auth, caplog.text
        notes = [r.getMessage() for r in caplog.records if "clientAuth is the usage" in r.getMessage()]
        assert len(notes) == 1 and "serverAuth" in notes[0]  # said once, not per connection
        assert listener.refused == []
    finally:
        listener.close()


def test_other_ca_and_other_usages_refused(certs, monkeypatch, caplog):
    listener = SocketListener("127.0.0.1", 0, ssl_context=_ctx("server", certs["doc"], monkeypatch))
    try:
        with caplog.at_level(logging.WARNING):
            with pytest.raises(TransportError, match="refused|failed"):
                _send(listener.port, _ctx("client", certs["other_ca"], monkeypatch), "other")
            with pytest.raises(TransportError, match="refused|failed"):
                _send(listener.port, _ctx("client", certs["code_signing"], monkeypatch), "code")
            _send(listener.port, _ctx("client", certs["client_auth"], monkeypatch), "ok")
            assert _got(listener, 1) == ["ok"]
        assert len(listener.refused) == 2
        assert "names neither clientAuth nor serverAuth" in listener.refused[1][1]
        assert not any("clientAuth is the usage" in r.getMessage() for r in caplog.records)
        assert _got(listener, 1, timeout=0.5) == []  # nothing from the refused clients
    finally:
        listener.close()


def test_documented_commands_verbatim(certs, monkeypatch, caplog):
    """The docs' commands as written: whatever this OpenSSL puts in the client certificate, the
    checker takes it (no note when the usage was left out)."""
    eku = _usage(certs["doc_verbatim"])
    listener = SocketListener("127.0.0.1", 0, ssl_context=_ctx("server", certs["doc_verbatim"], monkeypatch))
    try:
        _send(listener.port, _ctx("client", certs["doc_verbatim"], monkeypatch), "verbatim")
        assert _got(listener, 1) == ["verbatim"] and listener.refused == []
        assert listener.noted_server_auth == (eku == {EKU_SERVER_AUTH})
    finally:
        listener.close()
