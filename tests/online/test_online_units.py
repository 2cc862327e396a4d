"""Online run_ut pieces in one process: packets, the sender's load shedding, config, framing."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from msprobe.errors import ConfigError
from msprobe.online.config import parse_online
from msprobe.online.packet import MAGIC, PacketError, decode_packet, encode_packet
from msprobe.online.sender import OnlineSender


def _api_header(name="Functional.linear.0.forward", **kw):
    h = {"kind": "api", "run": "r1", "rank": 0, "step": 0, "seq": 0, "name": name,
         "record": {"input_args": [], "input_kwargs": {}, "output": []}}
    h.update(kw)
    return h


# ----------------------------------------------------------------------------- packets
def test_packet_roundtrip_tensors_load_through_the_readers():
    torch = pytest.importorskip("torch")
    from msprobe.dumpers.pytorch._encode import tensor_bytes

    x = torch.randn(3, 4).to(torch.bfloat16)
    s = torch.tensor(2.5)
    i = torch.arange(6, dtype=torch.int64).reshape(2, 3)
    rec = {"input_args": [{"type": "torch.Tensor", "dtype": "torch.bfloat16", "shape": [3, 4],
                           "requires_grad": False, "data_name": "Torch.add.0.forward.input.0.pt"},
                          {"type": "torch.Tensor", "dtype": "torch.int64", "shape": [2, 3],
                           "requires_grad": False, "data_name": "Torch.add.0.forward.input.1.pt"},
                          {"type": "float", "value": 1.5}],
           "input_kwargs": {},
           "output": [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [],
                       "requires_grad": False, "data_name": "Torch.add.0.forward.output.0.pt"}]}
    data = encode_packet(_api_header("Torch.add.0.forward", record=rec),
                         [("Torch.add.0.forward.input.0.pt", tensor_bytes(x)),
                          ("Torch.add.0.forward.input.1.pt", tensor_bytes(i)),
                          ("Torch.add.0.forward.output.0.pt", tensor_bytes(s))])
    p = decode_packet(data)
    assert (p.kind, p.name, p.base, p.direction, p.ident) == ("api", "Torch.add.0.forward", "Torch.add.0",
                                                              "forward", "r1/rank0/0")
    r = p.record()
    args, kwargs = r.replay_inputs("real")
    assert args[0].dtype == torch.bfloat16 and torch.equal(args[0], x)
    assert torch.equal(args[1], i) and args[2] == 1.5 and kwargs == {}
    out = r.output[0].load("torch")
    assert out.shape == () and out.item() == 2.5


@pytest.mark.parametrize("mangle, why", [
    (lambda d: b"XXXXXXXX" + d[8:], "bad magic"),
    (lambda d: d[:10], "bad magic|header length"),
    (lambda d: d[:len(MAGIC)] + (10 ** 6).to_bytes(4, "big") + d[len(MAGIC) + 4:], "header length"),
    (lambda d: d[:-3], "offset, nbytes"),
])
def test_bad_packets_are_refused(mangle, why):
    data = encode_packet(_api_header(), [("a.pt", b"\0" * 16)])
    with pytest.raises(PacketError, match=why):
        decode_packet(mangle(data))


def test_bad_headers_are_refused():
    for hdr in ({"kind": "nope"}, _api_header(name="../x"), _api_header(record=None), _api_header(rank=-1),
                _api_header(seq="1"), dict(_api_header(), v=2)):
        data = encode_packet(hdr)
        if hdr.get("v") == 2:
            data = data.replace(b'"v":2', b'"v":2')
        with pytest.raises(PacketError):
            decode_packet(data)


def test_packets_hold_no_pickle():
    data = encode_packet(_api_header(), [("a.pt", b"\x80\x04K\x01.")])  # a pickle payload stays bytes
    p = decode_packet(data)
    assert bytes(p.tensor_bytes("a.pt")) == b"\x80\x04K\x01."


# ------------------------------------------------------------------------------ sender
class _SlowSink:
    def __init__(self, delay):
        self.delay = delay
        self.got = []

    def send(self, data, header):
        time.sleep(self.delay)
        self.got.append(header)

    def close(self):
        pass


def test_slow_checker_sheds_load_by_sampling_and_never_blocks():
    sink = _SlowSink(0.02)
    s = OnlineSender(sink, max_packets=8, flush_timeout=10)
    offered = 400
    t0 = time.perf_counter()
    for k in range(offered):
        if s.admit():
            h = _api_header(seq=k)
            s.submit(lambda h=h: (encode_packet(h), h), 10)
    producer = time.perf_counter() - t0
    s.submit(lambda: (b"", {"kind": "close"}), 0, control=True)
    s.close()
    st = s.stats
    assert st.dropped > 0 and st.max_sample_every > 1  # it went to sampling, and logged it
    assert st.sent == len(sink.got)
    assert st.sent + st.dropped + st.sampled_out == offered + 1  # every offered packet is accounted for
    assert sink.got[-1]["kind"] == "close"  # control packets are never shed
    # the producer never waited for the sink: it offered 400 packets while the sink sent a handful
    assert producer < offered * sink.delay / 4


def test_unreachable_checker_drops_instead_of_blocking():
    from msprobe.online.transport import SocketSink

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    s = OnlineSender(SocketSink("127.0.0.1", port, connect_timeout=0.5), max_packets=4, flush_timeout=5,
                     retry_backoff=0.05)
    for k in range(20):
        if s.admit():
            h = _api_header(seq=k)
            s.submit(lambda h=h: (encode_packet(h), h), 1)
    s.close(timeout=5)
    assert s.stats.sent == 0 and s.stats.dropped + s.stats.sampled_out == 20


# ------------------------------------------------------------------------------ config
def test_config_switches_and_validation(tmp_path):
    assert parse_online({"online_run_ut": False, "nfs_path": "/x"}, side="training") is None
    s = parse_online({"online_run_ut": True, "nfs_path": "s3://b/p", "host": "1.2.3.4", "port": 9}, side="training")
    assert s.transport == "store"  # nfs_path wins over host/port, as the docs say
    s = parse_online({"online_run_ut": True, "host": "127.0.0.1", "port": 9}, side="training")
    assert s.transport == "tls" and s.tls_path == "./"  # tls_path absent: the current directory
    s = parse_online({"online_run_ut": True, "host": "127.0.0.1", "port": 9, "tls_path": ""}, side="training")
    assert s.transport == "tcp"  # plain TCP only when configured empty
    s = parse_online({"is_online": True, "host": "127.0.0.1", "port": 0, "rank_list": [1, 0]}, side="checker")
    assert s.rank_list == [0, 1]
    for bad in ({"online_run_ut": "yes", "nfs_path": "/x"}, {"online_run_ut": True},
                {"online_run_ut": True, "host": "h", "port": 70000},
                {"online_run_ut": True, "host": "h", "port": -1},
                {"online_run_ut": True, "nfs_path": "/x", "online_run_ut_recompute": 1},
                {"online_run_ut": True, "nfs_path": "/x", "rank_list": [-1]},
                {"online_run_ut": True, "nfs_path": 3}):
        with pytest.raises(ConfigError):
            parse_online(bad, side="training")


def test_dump_config_keys(tmp_path):
    import json

    from msprobe.dumpers.config import load_config

    p = tmp_path / "c.json"
    p.write_text(json.dumps({"task": "tensor", "dump_path": "./d", "rank": [0], "step": [0], "level": "L1",
                             "tensor": {"scope": [], "list": [], "online_run_ut": True, "nfs_path": "/nfs/x",
                                        "host": "", "port": -1, "tls_path": "",
                                        "online_run_ut_recompute": True}}))
    cfg = load_config(str(p))
    assert cfg.online.nfs_path == "/nfs/x" and cfg.online.recompute
    p.write_text(json.dumps({"task": "tensor", "level": "mix", "tensor": {"online_run_ut": True, "nfs_path": "/x"}}))
    with pytest.raises(ConfigError, match="level"):
        load_config(str(p))
    p.write_text(json.dumps({"task": "tensor", "tensor": {"online_run_ut": True}}))
    with pytest.raises(ConfigError, match="nfs_path"):
        load_config(str(p))


def test_tls_path_without_certificates_is_a_config_error(tmp_path):
    from msprobe.online.transport import client_ssl_context, server_ssl_context

    with pytest.raises(ConfigError, match="client.key"):
        client_ssl_context(str(tmp_path))
    with pytest.raises(ConfigError, match="server.key"):
        server_ssl_context(str(tmp_path))
    with pytest.raises(ConfigError, match="directory"):
        client_ssl_context(str(tmp_path / "missing"))


def test_frames_over_a_socket_pair():
    from msprobe.online.transport import TransportError, recv_frame, send_frame

    a, b = socket.socketpair()
    with a, b:
        t = threading.Thread(target=lambda: [send_frame(a, b"x" * n) for n in (0, 1, 1 << 20)])
        t.start()
        assert [len(recv_frame(b)) for _ in range(3)] == [0, 1, 1 << 20]
        t.join()
        a.sendall(b"NOPE" + b"\0" * 8)
        with pytest.raises(TransportError, match="magic"):
            recv_frame(b)
        a.sendall(b"MSPF" + (100).to_bytes(8, "big"))
        with pytest.raises(TransportError, match="limit"):
            recv_frame(b, max_bytes=10)


def test_encrypted_key_is_unlocked_from_the_environment(tmp_path, tls_dirs, monkeypatch):
    pytest.importorskip("cryptography")
    import shutil

    from cryptography.hazmat.primitives import serialization

    from msprobe.online.transport import PASSWORD_ENV, client_ssl_context

    d = tmp_path / "enc"
    shutil.copytree(tls_dirs["client"], d)
    key = serialization.load_pem_private_key((d / "client.key").read_bytes(), password=None)
    (d / "client.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                     serialization.BestAvailableEncryption(b"s3cret-pass")))
    monkeypatch.setenv(PASSWORD_ENV, "s3cret-pass")
    assert client_ssl_context(str(d)).minimum_version.name == "TLSv1_2"
    monkeypatch.setenv(PASSWORD_ENV, "wrong")
    with pytest.raises(ConfigError, match="cannot load"):
        client_ssl_context(str(d))
