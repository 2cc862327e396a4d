"""The explorer's overview and a communication call's receive buffer (issue 38): the content of a
``recv`` tensor, a non-root's ``broadcast`` tensor, ... before the call is whatever the memory held,
so a NaN or a wild value there never makes a step or a rank NaN/Inf, divergent or "worst"; a
broadcast root's tensor is data and still does."""
from __future__ import annotations

import json
import os

import pytest

from tests.view._make_cluster import NAN, _rec, _t, write_pipeline

pytest.importorskip("duckdb")


def _cells(view) -> dict:
    return {(c["step"], c["rank_dir"]): c for c in view.overview()["cells"]}


def _write(root: str, ranks: dict) -> str:
    for rank, data in ranks.items():
        rank_dir = os.path.join(root, "step0", f"rank{rank}")
        os.makedirs(rank_dir, exist_ok=True)
        doc = {"task": "statistics", "level": "mix", "framework": "pytorch", "dump_data_dir": None, "data": data}
        with open(os.path.join(rank_dir, "dump.json"), "w", encoding="utf-8") as handle:
            json.dump(doc, handle, indent=1)
    return root


def _broadcast_step(root: str, root_value: float, buffer_value: float, recv_buffer: float) -> str:
    """Rank 0 broadcasts a tensor holding ``root_value`` (data) to rank 1, whose tensor held
    ``buffer_value`` before the call; rank 1 then receives into a buffer that held ``recv_buffer``."""
    return _write(root, {
        0: {"Functional.linear.0.forward": _rec([_t(1.0)], [_t(root_value)]),
            "Distributed.broadcast.0.forward": _rec([_t(root_value)], [_t(root_value)], src=0),
            "Distributed.send.0.forward": _rec([_t(1.0)], [_t(1.0)], dst=1)},
        1: {"Distributed.broadcast.0.forward": _rec([_t(buffer_value)], [_t(root_value)], src=0),
            "Distributed.recv.0.forward": _rec([_t(recv_buffer)], [_t(1.0)], src=0),
            "Functional.relu.0.forward": _rec([_t(1.0)], [_t(1.0)])},
    })


def test_a_receive_buffers_nan_makes_no_step_nan(tmp_path):
    """One dump and a lake of it: rank 1's receive buffer held a NaN before the receive at healthy
    step 0 (tests/view/_make_cluster.py): step 0 is not NaN/Inf on rank 1; step 1's NaN is."""
    from msprobe.view import open_view

    target = write_pipeline(str(tmp_path / "lake" / "run_a"))
    for path in (target, str(tmp_path / "lake")):
        with open_view(path, work_dir=str(tmp_path / ("w" + str(len(path))))) as v:
            cells = _cells(v)
            assert cells[(0, "rank1")]["nan_inf"] == 0 and cells[(0, "rank0")]["nan_inf"] == 0
            assert cells[(0, "rank1")]["first_div"] is None and cells[(0, "rank1")]["max_score"] < 1e5
            assert cells[(1, "rank0")]["nan_inf"] > 0 and cells[(1, "rank1")]["nan_inf"] > 0
            # the row itself still shows what the buffer held
            rows = v.rows(cells[(0, "rank1")]["cell"], 0, 100, {"result": "nan_inf"})["rows"]
            assert [row["name"] for row in rows] == ["Distributed.recv.0.forward.input.0"]
            assert v.rows(cells[(0, "rank1")]["cell"], 0, 100, {"result": "divergent"})["total"] == 0


def test_a_broadcast_roots_nan_is_data_a_receivers_buffer_is_not(tmp_path):
    from msprobe.view import open_view

    # the root's tensor is data: its NaN makes rank 0 NaN; rank 1's own buffer (a NaN) does not
    _broadcast_step(str(tmp_path / "bad"), NAN, 1.0, 1.0)
    _broadcast_step(str(tmp_path / "leftover"), 1.0, NAN, float("inf"))
    with open_view(str(tmp_path / "bad"), work_dir=str(tmp_path / "w1")) as v:
        cells = _cells(v)
        assert cells[(0, "rank0")]["nan_inf"] == 3  # linear's output, broadcast's tensor and output
        assert cells[(0, "rank1")]["nan_inf"] == 1  # what the broadcast delivered (its output)
    with open_view(str(tmp_path / "leftover"), work_dir=str(tmp_path / "w2")) as v:
        cells = _cells(v)
        assert cells[(0, "rank1")]["nan_inf"] == 0 and cells[(0, "rank0")]["nan_inf"] == 0


def test_a_compare_of_receive_buffers_finds_no_divergence(tmp_path):
    """Two healthy runs whose receive buffers held different leftover memory (1e30 against 1.0,
    a NaN against 1.0): no cell is divergent, none has a worst error or a NaN/Inf from them."""
    from msprobe.view import open_view

    _broadcast_step(str(tmp_path / "target"), 1.0, 1e30, NAN)
    _broadcast_step(str(tmp_path / "bench"), 1.0, 1.0, 1.0)
    with open_view(str(tmp_path / "target"), str(tmp_path / "bench"), work_dir=str(tmp_path / "w")) as v:
        over = v.overview()
        rank1 = _cells(v)[(0, "rank1")]
        assert (rank1["nan_inf"], rank1["errors"], rank1["warnings"], rank1["first_div"]) == (0, 0, 0, None)
        assert not rank1["worst_norm_rel"] and rank1["max_score"] <= 1e6  # a pass
        assert over["first_cell"] is None
    # a real difference in the root's data still is one
    _broadcast_step(str(tmp_path / "target2"), 1.5, 1.0, 1.0)
    with open_view(str(tmp_path / "target2"), str(tmp_path / "bench"), work_dir=str(tmp_path / "w2")) as v:
        cells = _cells(v)
        assert cells[(0, "rank0")]["first_div"] is not None and cells[(0, "rank0")]["worst_norm_rel"] > 0.1
