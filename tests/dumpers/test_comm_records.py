"""Communication records (spec/PRODUCER.md section 24): receive buffers written ``null`` as 26.2.0
writes them, asynchronous calls recorded with what their buffers hold after ``wait()``, no cached
statistics outliving gloo's writes, and ``P2POp`` accepting the wrapped ``isend``/``irecv``.
Real gloo processes over 127.0.0.1 (``_comm_child.py``), run under our dumper and, for
conformance, under the real 26.2.0."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from msprobe.format.comm import null_args

ROOT = str(Path(__file__).resolve().parents[2])
CHILD = str(Path(__file__).with_name("_comm_child.py"))
JUNK = 7777.0


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _run(tmp: Path, world: int, python: str, ours: bool) -> dict:
    """{rank: dump.json's data} of one run of the child (cwd outside the checkout for the real tool)."""
    tmp.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(OMP_NUM_THREADS="1", **({"PYTHONPATH": ROOT, "COMM_SINGLE": "1"} if ours else {}))
    dump = tmp / "dump"
    out = subprocess.run([python, CHILD, str(dump), _free_port(), str(world)], cwd=tmp, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return {r: json.loads((dump / "step0" / f"rank{r}" / "dump.json").read_text())["data"] for r in range(world)}


@pytest.fixture(scope="module", params=[2, 3])
def ours(request, tmp_path_factory):
    world = request.param
    return world, _run(tmp_path_factory.mktemp(f"ours{world}"), world, sys.executable, True)


def _comm(data: dict) -> dict:
    return {k: v for k, v in data.items() if k.startswith("Distributed.")}


def _max(entry) -> float:
    return entry["Max"]


def test_receive_buffers_are_null(ours):
    """Each buffer of the table (but broadcast's, recorded as 26.2.0 records it) is null in the
    inputs, and the data arguments are recorded."""
    world, data = ours
    for rank, records in data.items():
        comm = _comm(records)
        assert comm["Distributed.recv.0.forward"]["input_args"][0] is None if rank == 1 else True
        for name, rec in comm.items():
            nulls = null_args(name, rec, rank)
            for i, entry in enumerate(rec["input_args"]):
                if i in nulls:
                    assert entry is None, (rank, name, i)
        for name in ("all_gather.0", "all_gather_into_tensor.0", "_all_gather_base.0", "reduce_scatter_tensor.0",
                     "_reduce_scatter_base.0", "reduce_scatter.0", "all_to_all_single.0", "scatter.0",
                     "all_gather_single.0", "reduce_scatter_single.0"):
            rec = comm[f"Distributed.{name}.forward"]
            assert rec["input_args"][0] is None, (rank, name)
            assert rec["input_args"][1] is not None or name == "scatter.0", (rank, name)
        gather = comm["Distributed.gather.0.forward"]["input_args"]
        assert gather[0]["Max"] == rank + 1 and gather[1] is None
        bcast = comm["Distributed.broadcast.0.forward"]["input_args"][0]
        assert _max(bcast) == (1.0 if rank == 0 else JUNK)  # 26.2.0 records a receiver's buffer
        for name, rec in comm.items():  # no junk anywhere but broadcast's receivers (and P2POp objects)
            if ".broadcast." not in name and ".batch_isend_irecv." not in name:
                assert "7777" not in json.dumps(rec.get("input_args")), (rank, name)


def test_async_calls_recorded_after_wait(ours):
    world, data = ours
    total = world * (world + 1) / 2
    for rank, records in data.items():
        names = list(records)
        comm = _comm(records)
        assert _max(comm["Distributed.all_reduce.1.forward"]["output"][0]) == total
        assert _max(comm["Distributed.all_gather_into_tensor.1.forward"]["output"][0]) == world
        # the consumer after the wait reads the reduced tensor, not cached statistics of the call's input
        after = names[names.index("Distributed.all_reduce.1.forward") + 1]
        assert after.startswith("Tensor.add.") and _max(records[after]["input_args"][0]) == total
        batch = comm["Distributed.batch_isend_irecv.0.forward"]  # P2POp took the wrapped isend/irecv
        send_op, recv_op = batch["input_args"][0]
        assert (send_op["op"], send_op["peer"], _max(send_op["tensor"])) == ("isend", (rank + 1) % world, rank + 1)
        assert (recv_op["op"], recv_op["peer"], recv_op["tensor"]) == ("irecv", (rank - 1) % world, None)
        assert _max(batch["output"][0][1]["tensor"]) == (rank - 1) % world + 1  # after the wait
        if rank == 1:
            irecv = names.index("Distributed.irecv.0.forward")
            assert names[irecv + 1].startswith("Tensor.mul.")  # in call order, as 26.2.0
            assert comm["Distributed.irecv.0.forward"]["input_args"][0] is None
            assert _max(comm["Distributed.irecv.0.forward"]["output"][0]) == 1.0
            add = names[irecv + 2]
            assert add.startswith("Tensor.add.") and _max(records[add]["input_args"][0]) == 1.0


def test_torch_2_13s_single_tensor_collectives_are_recorded(ours):
    """``all_gather_single`` and ``reduce_scatter_single``, where torch 2.13's deprecation notices send
    the users of all_gather_into_tensor and reduce_scatter_tensor: recorded like them (the output
    buffer null in the inputs, what it holds after the call in the output), so the cluster answers
    see a run written the new way (spec/PRODUCER.md item 48)."""
    from msprobe.format.comm import comm_call

    world, data = ours
    for rank, records in data.items():
        comm = _comm(records)
        gathered = comm["Distributed.all_gather_single.0.forward"]
        assert gathered["input_args"][0] is None and _max(gathered["input_args"][1]) == rank + 1
        assert gathered["output"][0]["shape"] == [4 * world] and _max(gathered["output"][0]) == world
        scattered = comm["Distributed.reduce_scatter_single.0.forward"]
        assert scattered["output"][0]["shape"] == [4] and _max(scattered["output"][0]) == world * (world + 1) / 2
        names = list(records)
        for name in ("Distributed.all_gather_single.0.forward", "Distributed.reduce_scatter_single.0.forward"):
            call = comm_call(name, records[name], rank, names.index(name))
            assert call is not None and call.kind == "all", name


#: the records 26.2.0 does not make (its API list lacks torch 2.13's names, item 48)
_OURS_ONLY = ("Distributed.all_gather_single.", "Distributed.reduce_scatter_single.")


def _inputs(rec: dict) -> str:
    return json.dumps([rec.get("input_args"), rec.get("input_kwargs") or {}], sort_keys=True)


@pytest.mark.real_tool
def test_conforms_to_real_tool(ours, real_tool, tmp_path):
    """The same run under 26.2.0: the same communication records in the same order, the same
    inputs (nulls included: the per-API buffer rule), and after-wait outputs of the async calls.
    batch_isend_irecv's irecv op holds no buffer in ours (spec/PRODUCER.md item 46)."""
    world, data = ours
    real = _run(tmp_path, world, real_tool, False)
    for rank in range(world):
        mine = {name: rec for name, rec in _comm(data[rank]).items() if not name.startswith(_OURS_ONLY)}
        theirs = _comm(real[rank])
        assert list(mine) == list(theirs), rank
        for name, rec in theirs.items():
            if name.startswith("Distributed.batch_isend_irecv."):  # but the irecv op's buffer (item 46)
                mine_ops, real_ops = mine[name]["input_args"][0], rec["input_args"][0]
                assert mine_ops[0] == real_ops[0]
                assert {**mine_ops[1], "tensor": None} == {**real_ops[1], "tensor": None}
                continue
            assert _inputs(mine[name]) == _inputs(rec), (rank, name)
            first = rec["output"][0]
            if isinstance(first, dict) and "Max" in first:
                assert mine[name]["output"][0]["Max"] == first["Max"], (rank, name)
