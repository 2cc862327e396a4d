"""The checker in this process, fed hand-made packets: pairing, step ends, ranks, resume bookkeeping."""
from __future__ import annotations

import csv
import glob
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("msprobe.run_ut")

from msprobe.dumpers.pytorch._encode import tensor_bytes  # noqa: E402
from msprobe.online.config import OnlineSettings  # noqa: E402
from msprobe.online.packet import decode_packet, encode_packet  # noqa: E402
from msprobe.run_ut.online import PROGRESS_FILE, OnlineChecker  # noqa: E402


def _t(name, t):
    return {"type": "torch.Tensor", "dtype": str(t.dtype), "shape": list(t.shape), "requires_grad": False,
            "data_name": name}


class _Feed:
    def __init__(self, run="r", rank=0):
        self.run, self.rank, self.seq = run, rank, 0

    def _hdr(self, kind, step, **kw):
        h = {"kind": kind, "run": self.run, "rank": self.rank, "step": step, "seq": self.seq}
        h.update(kw)
        self.seq += 1
        return h

    def add(self, step, k, a, b, *, backward=False, out=None):
        name = f"Torch.add.{k}.forward"
        out = a + b if out is None else out
        rec = {"input_args": [_t(f"{name}.input.0.pt", a), _t(f"{name}.input.1.pt", b)], "input_kwargs": {},
               "output": [_t(f"{name}.output.0.pt", out)]}
        return decode_packet(encode_packet(self._hdr("api", step, name=name, record=rec, expects_backward=backward),
                                           [(f"{name}.input.0.pt", tensor_bytes(a)),
                                            (f"{name}.input.1.pt", tensor_bytes(b)),
                                            (f"{name}.output.0.pt", tensor_bytes(out))]))

    def add_backward(self, step, k, g):
        name = f"Torch.add.{k}.backward"
        rec = {"input": [_t(f"{name}.input.0.pt", g)],
               "output": [_t(f"{name}.output.0.pt", g), _t(f"{name}.output.1.pt", g)]}
        return decode_packet(encode_packet(self._hdr("api", step, name=name, record=rec),
                                           [(f"{name}.input.0.pt", tensor_bytes(g)),
                                            (f"{name}.output.0.pt", tensor_bytes(g)),
                                            (f"{name}.output.1.pt", tensor_bytes(g))]))

    def control(self, kind, step):
        return decode_packet(encode_packet(self._hdr(kind, step)))


def _rows(out, rank):
    [path] = glob.glob(os.path.join(out, f"accuracy_checking_result_*_rank{rank}.csv"))
    with open(path, newline="", encoding="utf-8-sig") as fh:
        return list(csv.reader(fh))[1:]


def test_pairs_forward_with_backward_and_judges_recorded_outputs(tmp_path):
    out = str(tmp_path / "out")
    ck = OnlineChecker(OnlineSettings(nfs_path="unused", rank_list=[0, 1]), out)
    f0, f1 = _Feed(rank=0), _Feed(rank=1)
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    ck.handle(f0.add(0, 0, a, b, backward=True))
    assert ck.pending and not ck.writers  # waits for its backward
    ck.handle(f0.add(0, 1, a, b, out=a + b + 1.0))  # a wrong recorded output
    ck.handle(f0.add_backward(0, 0, torch.ones(4, 4)))
    ck.handle(f1.add(0, 0, a, b, backward=True))
    ck.handle(f1.control("step_end", 0))  # its backward never came: judged forward-only at the step's end
    ck.handle(f0.control("close", 0))
    ck.handle(f1.control("close", 0))
    assert ck._should_stop()
    ck.close()
    r0 = {r[0]: r for r in _rows(out, 0)}
    assert r0["Torch.add.0"][1:3] == ["pass", "pass"]
    assert r0["Torch.add.1"][1] == "error"  # the training side's output was wrong: caught
    r1 = _rows(out, 1)
    assert [r[:3] for r in r1] == [["Torch.add.0", "pass", " "]]
    assert ck.counts["apis"] == 3


def test_restart_cuts_a_half_written_api_and_skips_done_packets(tmp_path):
    out = str(tmp_path / "out")
    feed = _Feed()
    a, b = torch.randn(3), torch.randn(3)
    packets = [feed.add(0, k, a, b) for k in range(3)]
    ck = OnlineChecker(OnlineSettings(nfs_path="unused"), out)
    for p in packets[:2]:
        ck.handle(p)
    ck.close()
    [res] = glob.glob(os.path.join(out, "accuracy_checking_result_*"))
    with open(res, "a", encoding="utf-8") as fh:  # a row written after the last commit (a kill in between)
        fh.write("Torch.add.2,pass, ,\n")
    with open(os.path.join(out, PROGRESS_FILE), "a") as fh:
        fh.write('{"done": ["r/rank0/2"')  # and a cut progress line
    ck = OnlineChecker(OnlineSettings(nfs_path="unused"), out)
    for p in packets:
        ck.handle(p)
    ck.close()
    assert ck.counts["duplicates"] == 2 and ck.counts["apis"] == 1
    assert [r[0] for r in _rows(out, 0)] == ["Torch.add.0", "Torch.add.1", "Torch.add.2"]


def test_backward_without_forward_is_accounted_not_checked(tmp_path):
    out = str(tmp_path / "out")
    ck = OnlineChecker(OnlineSettings(nfs_path="unused"), out)
    ck.handle(_Feed().add_backward(0, 0, torch.ones(2)))
    ck.close()
    assert ck.counts["apis"] == 0 and len(ck.progress.done) == 1
