"""The checker's view of a client certificate's purpose (extendedKeyUsage).

The real tool's online recipe (8.x doc 08) signs the *client* certificate with
``extendedKeyUsage = serverAuth``; OpenSSL's default check for a TLS client refuses it
("unsuitable certificate purpose"). The checker therefore lets OpenSSL verify the chain (the
certificate must still be signed by ``ca.crt``, unexpired, not revoked) with the purpose check
relaxed, and judges the purpose itself after the handshake:

- no extendedKeyUsage, ``clientAuth`` or ``anyExtendedKeyUsage``: accepted;
- ``serverAuth`` without ``clientAuth`` (the documented recipe): accepted, with a note (once
  per listener) that ``clientAuth`` is the usage a client certificate should name;
- anything else (e.g. ``codeSigning`` only): refused.

Relaxing needs ``SSL_CTX_set_purpose`` from the OpenSSL that Python's ``ssl`` uses (reached with
ctypes, after checking that the context pointer read is the right one); where that is not
possible the check stays OpenSSL's, strict, and the refusal says which usage is missing.
"""
from __future__ import annotations

import ctypes
import ssl
from typing import Optional

__all__ = ["relax_client_purpose", "client_purpose", "extended_key_usage", "EKU_SERVER_AUTH", "EKU_CLIENT_AUTH"]

EKU_SERVER_AUTH = "1.3.6.1.5.5.7.3.1"
EKU_CLIENT_AUTH = "1.3.6.1.5.5.7.3.2"
EKU_ANY = "2.5.29.37.0"
_EKU_EXTENSION = bytes([0x55, 0x1D, 0x25])  # 2.5.29.37
_X509_PURPOSE_ANY = 7
_VERIFY_PEER_REQUIRED = 3  # SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT: what CERT_REQUIRED sets
#: the attribute that marks a server context whose purpose check was relaxed
MARK = "_msprobe_client_purpose_relaxed"


def relax_client_purpose(ctx: ssl.SSLContext) -> bool:
    """Let ``ctx`` (a server context with CERT_REQUIRED) accept client certificates of any
    purpose, chain checks unchanged; True when done (the caller must then call
    :func:`client_purpose` on every accepted connection)."""
    try:
        import _ssl

        lib = ctypes.CDLL(_ssl.__file__)
        get_mode, set_purpose = lib.SSL_CTX_get_verify_mode, lib.SSL_CTX_set_purpose
    except (ImportError, OSError, AttributeError):
        return False
    get_mode.restype, get_mode.argtypes = ctypes.c_int, [ctypes.c_void_p]
    set_purpose.restype, set_purpose.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_int]
    # the SSL_CTX pointer is the first field after the object header; check it is the right one by
    # reading the verify mode back through OpenSSL, with two different modes
    ptr = ctypes.c_void_p.from_address(id(ctx) + object.__basicsize__).value
    if not ptr or ctx.verify_mode != ssl.CERT_REQUIRED or get_mode(ptr) != _VERIFY_PEER_REQUIRED:
        return False
    ctx.verify_mode = ssl.CERT_OPTIONAL
    ok = get_mode(ptr) == 1
    ctx.verify_mode = ssl.CERT_REQUIRED
    if not ok or get_mode(ptr) != _VERIFY_PEER_REQUIRED or set_purpose(ptr, _X509_PURPOSE_ANY) != 1:
        return False
    setattr(ctx, MARK, True)
    return True


def _tlv(buf: bytes, offset: int) -> tuple:
    """(tag, content start, content end) of the DER element at ``i``."""
    tag, length = buf[offset], buf[offset + 1]
    offset += 2
    if length & 0x80:
        k = length & 0x7F
        if not 0 < k <= 4:
            raise ValueError("bad DER length")
        length = int.from_bytes(buf[offset:offset + k], "big")
        offset += k
    if offset + length > len(buf):
        raise ValueError("DER element past the end")
    return tag, offset, offset + length


def _children(buf: bytes, start: int, end: int) -> list:
    out, offset = [], start
    while offset < end:
        t = _tlv(buf, offset)
        out.append(t)
        offset = t[2]
    return out


def _oid(raw: bytes) -> str:
    parts = [raw[0] // 40, raw[0] % 40]
    value = 0
    for byte in raw[1:]:
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            parts.append(value)
            value = 0
    return ".".join(map(str, parts))


def extended_key_usage(der: bytes) -> Optional[set]:
    """The extendedKeyUsage OIDs of a DER certificate, or None when it has no such extension."""
    _, s, e = _tlv(der, 0)          # Certificate
    _, ts, te = _tlv(der, s)        # tbsCertificate
    for tag, cs, _ in _children(der, ts, te):
        if tag != 0xA3:             # [3] extensions
            continue
        _, xs, xe = _tlv(der, cs)
        for _, es, ee in _children(der, xs, xe):
            parts = _children(der, es, ee)
            if der[parts[0][1]:parts[0][2]] == _EKU_EXTENSION:
                _, qs, qe = _tlv(der, parts[-1][1])  # the OCTET STRING holds a SEQUENCE of OIDs
                return {_oid(der[start:end]) for _, start, end in _children(der, qs, qe)}
    return None


def client_purpose(der: Optional[bytes]) -> tuple:
    """('ok' | 'server-auth' | 'refuse', reason) for the client certificate ``der``."""
    if not der:
        return "refuse", "no client certificate"
    try:
        eku = extended_key_usage(der)
    except (IndexError, ValueError) as exc:
        return "refuse", f"unreadable client certificate ({exc})"
    if eku is None or EKU_CLIENT_AUTH in eku or EKU_ANY in eku:
        return "ok", ""
    if EKU_SERVER_AUTH in eku:
        return "server-auth", ("the client certificate's extendedKeyUsage is serverAuth (the msprobe docs' "
                               "recipe): accepted; clientAuth is the usage a client certificate should name")
    return "refuse", (f"the client certificate's extendedKeyUsage ({', '.join(sorted(eku))}) names neither "
                      f"clientAuth nor serverAuth")
