"""Hostile senders against a real checker process on 127.0.0.1: malformed header fields, frames
announcing 1 GiB, hundreds of idle connections. The checker keeps working, allocates only what
arrives, and serves a bounded number of connections (threads)."""
from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("msprobe.run_ut.execute")

from msprobe.dumpers.pytorch._encode import tensor_bytes  # noqa: E402
from msprobe.online.packet import PacketError, decode_packet, encode_packet  # noqa: E402
from msprobe.online.transport import SocketSink, StoreSink  # noqa: E402
from tests.online.conftest import checker_config, env, result_rows, wait_for  # noqa: E402


@pytest.fixture
def figures(request):
    """The reliability suite's figures (printed/written when tests/reliability runs in the same session):
    the FIGURES of the conftest module pytest registered, else a throwaway dict."""
    for plugin in request.config.pluginmanager.get_plugins():
        path = getattr(plugin, "__file__", "") or ""
        if path.replace(os.sep, "/").endswith("reliability/conftest.py") and hasattr(plugin, "FIGURES"):
            return plugin.FIGURES
    return {}


BAD_DROPPED = ["abc", None, float("nan"), float("inf"), -1, True, 1.5]


def _hdr(kind, seq, **kw):
    return dict({"v": 1, "kind": kind, "run": "r", "rank": 0, "step": 0, "seq": seq, "dropped": 0}, **kw)


def _t(name, t):
    return {"type": "torch.Tensor", "dtype": str(t.dtype), "shape": list(t.shape), "requires_grad": False,
            "data_name": name}


def _good_api(seq):
    a, b = torch.ones(3), torch.full((3,), 2.0)
    name = "Torch.add.0.forward"
    rec = {"input_args": [_t(f"{name}.input.0.pt", a), _t(f"{name}.input.1.pt", b)], "input_kwargs": {},
           "output": [_t(f"{name}.output.0.pt", a + b)]}
    return encode_packet(_hdr("api", seq, name=name, record=rec),
                         [(f"{name}.input.0.pt", tensor_bytes(a)), (f"{name}.input.1.pt", tensor_bytes(b)),
                          (f"{name}.output.0.pt", tensor_bytes(a + b))])


def _stream():
    """Packets with a bad ``dropped`` each, then a good API packet and the rank's close packet."""
    bad = [encode_packet(_hdr("step_end", i, dropped=v)) for i, v in enumerate(BAD_DROPPED[:3])]
    n = len(bad)
    return bad + [_good_api(n), encode_packet(_hdr("close", n + 1))]


@pytest.mark.parametrize("value", BAD_DROPPED, ids=[repr(v) for v in BAD_DROPPED])
def test_every_header_field_is_validated(value):
    with pytest.raises(PacketError, match="dropped"):
        decode_packet(encode_packet(_hdr("step_end", 0, dropped=value)))
    for field, bad in (("expects_backward", "yes"), ("record", [1]), ("run", 5), ("stack", "x")):
        h = _hdr("api", 0, name="Torch.add.0.forward", record={})
        h[field] = bad
        with pytest.raises(PacketError, match=field):
            decode_packet(encode_packet(h))


def _start(tmp_path, out, **online):
    cfg = checker_config(tmp_path, **online)
    port_file = str(tmp_path / "port")
    if os.path.exists(port_file):
        os.unlink(port_file)
    p = subprocess.Popen([sys.executable, "-m", "msprobe", "run_ut", "-config", cfg, "-o", out, "--idle-timeout", "60",
                          "--port-file", port_file], env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    return p, port_file


def _finish(p, timeout=120):
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
    return p.returncode, out


@pytest.mark.parametrize("transport", ["store", "tcp"])
def test_bad_packets_neither_kill_the_checker_nor_its_restart(tmp_path, transport):
    out = str(tmp_path / "out")
    if transport == "store":
        nfs = str(tmp_path / "nfs")
        sink = StoreSink(nfs)
        for data in _stream():
            sink.send(data, json.loads(data[12:12 + struct.unpack(">I", data[8:12])[0]]))
        p, _ = _start(tmp_path, out, nfs_path=nfs, host="", port=-1, tls_path="")
    else:
        p, port_file = _start(tmp_path, out, nfs_path="", host="127.0.0.1", port=0, tls_path="")
        wait_for(port_file)
        time.sleep(0.2)
        sink = SocketSink("127.0.0.1", int(open(port_file).read().strip()))
        for data in _stream():
            sink.send(data, {})
        sink.close()
    rc, log = _finish(p)
    assert rc == 0 and "Traceback" not in log, log[-3000:]
    assert [r[0] for r in result_rows(out)] == ["Torch.add.0"]
    assert "dropped" in log  # the refused packets are named in the log
    if transport == "store":  # a restart on the same directory neither dies nor checks anything again
        p, _ = _start(tmp_path, out, nfs_path=nfs, host="", port=-1, tls_path="")
        rc, log = _finish(p)
        assert rc == 0 and "Traceback" not in log, log[-3000:]
        assert [r[0] for r in result_rows(out)] == ["Torch.add.0"]


def _proc_status(pid):
    with open(f"/proc/{pid}/status") as f:
        return {k: v.strip() for k, v in (ln.split(":", 1) for ln in f if ":" in ln)}


def _hwm_mib(pid):
    return int(_proc_status(pid)["VmHWM"].split()[0]) / 1024


def _connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    assert s.recv(4) == b"MSPA"
    return s


def test_frames_announcing_1_gib_allocate_nothing_until_bytes_arrive(tmp_path, figures):
    out = str(tmp_path / "out")
    p, port_file = _start(tmp_path, out, nfs_path="", host="127.0.0.1", port=0, tls_path="")
    try:
        wait_for(port_file)
        port = int(open(port_file).read().strip())
        time.sleep(1.0)
        before = _hwm_mib(p.pid)
        socks = []
        for _ in range(3):
            s = _connect(port)
            s.sendall(b"MSPF" + struct.pack(">Q", (1 << 30) - 1) + bytes(4096))
            socks.append(s)
        time.sleep(2.0)
        grown = _hwm_mib(p.pid) - before
        # a frame above online_max_packet_mb is refused from its header
        s = _connect(port)
        s.sendall(b"MSPF" + struct.pack(">Q", 1 << 40))
        s.settimeout(10)
        assert s.recv(1) == b""  # the checker closed it
        for s in socks:
            s.close()
        assert p.poll() is None, "the checker died"
        figures.setdefault("bomb_peak_mib", {})["online_frame_3x1GiB/checker"] = {"growth_mib": round(grown, 1)}
        assert grown < 64, grown
    finally:
        p.terminate()
        _finish(p)


def test_idle_connections_are_bounded(tmp_path, figures):
    out = str(tmp_path / "out")
    p, port_file = _start(tmp_path, out, nfs_path="", host="127.0.0.1", port=0, tls_path="",
                          online_max_connections=16)
    socks = []
    try:
        wait_for(port_file)
        port = int(open(port_file).read().strip())
        time.sleep(1.0)
        base = int(_proc_status(p.pid)["Threads"])
        for _ in range(300):
            try:
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=10))
            except OSError:
                break
        time.sleep(2.0)
        threads = int(_proc_status(p.pid)["Threads"])
        figures.setdefault("online_connections", {})["300_idle/threads_over_base"] = threads - base
        assert threads - base <= 16, (base, threads)
        for s in socks:
            s.close()
        socks = []
        time.sleep(1.0)
        # once they are gone, a real sender is served again
        sink = SocketSink("127.0.0.1", port)
        for data in [_good_api(0), encode_packet(_hdr("close", 1))]:
            sink.send(data, {})
        sink.close()
        rc, log = _finish(p)
        assert rc == 0, log[-3000:]
        assert [r[0] for r in result_rows(out)] == ["Torch.add.0"]
        assert "too many connections" in log or "connections are open already" in log
    finally:
        for s in socks:
            s.close()
        if p.poll() is None:
            p.terminate()
            _finish(p)


def test_silent_connections_give_their_slot_back_and_the_sender_reconnects():
    """A connection silent for online_idle_timeout is closed (its slot freed): a client that connects
    and sends nothing cannot hold the checker's slots; a real sender idle that long reconnects when
    it has a packet again, and no packet is lost."""
    from msprobe.online.transport import SocketListener

    listener = SocketListener("127.0.0.1", 0, max_connections=2, idle_timeout=0.5)
    try:
        idle = [_connect(listener.port) for _ in range(2)]  # served (greeted): both slots are taken
        for s in idle:
            assert s.recv(1) == b""  # closed by the checker after 0.5 s of silence
            s.close()
        assert listener.idle_closed == 2
        sink = SocketSink("127.0.0.1", listener.port)
        sink.send(_good_api(0), {})
        time.sleep(1.5)  # longer than the idle timeout: the checker closed the sender's connection
        sink.send(_good_api(1), {})
        sink.close()
        got = [listener.queue.get(timeout=10).header["seq"] for _ in range(2)]
        assert got == [0, 1] and listener.refused == []
    finally:
        listener.close()
