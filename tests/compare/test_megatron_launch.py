"""The layouts' launcher (bench/megatron_layouts.py) on a machine where another process takes the rendezvous port:
``free_port()`` lets the port go before rank 0's TCPStore listens on it, so a busy machine (other multi-rank tests
beside this one) can lose it meanwhile and every rank fails at ``init_process_group``. The launcher then starts the
ranks again on another port, only when the ranks' output says so and nothing was written yet."""
from __future__ import annotations

import os
import socket
import sys

import pytest

pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench"))

import megatron_layouts as ml  # noqa: E402


def test_a_rendezvous_port_taken_by_another_process_is_tried_again(tmp_path, monkeypatch):
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()  # another process's server on the port free_port() hands out first
    ports = [str(held.getsockname()[1])]
    real = ml.free_port
    monkeypatch.setattr(ml, "free_port", lambda: ports.pop(0) if ports else real())
    try:
        truth = ml.launch(str(tmp_path / "dump"), str(tmp_path / "truth"), tp=2, steps=1, level="L1", timeout=300)
    finally:
        held.close()
    assert not ports  # the taken port was handed out first
    assert len(truth) == 2 and all(t["losses"] for t in truth), truth
    assert sorted(os.listdir(tmp_path / "dump" / "step0")) == ["rank0", "rank1"]


def test_only_a_lost_port_is_tried_again():
    assert ml.lost_the_port(["...failed to listen on any local network address. port: 1, useIpv6: 0, code: -98, "
                             "name: EADDRINUSE, message: address already in use"])
    assert not ml.lost_the_port(["RuntimeError: Connection reset by peer", "ValueError: nan"])
