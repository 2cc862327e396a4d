"""The communication graph of a step (msprobe.format.comm): matching, buffers, order."""
from msprobe.format.comm import buffer_args, build_step_graph, comm_api, is_buffer_leaf


def _t():
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": 1.0, "Min": 0.0,
            "Mean": 0.5, "Norm": 1.0}


def _i(v):
    return {"type": "int", "value": v}


def _rec(args, kwargs=None):
    return {"input_args": args, "input_kwargs": kwargs or {}, "output": [_t()] + [None] * (len(args) - 1)}


def test_pipeline_order_follows_send_and_recv():
    # rank 0: linear, send(dst=1), recv grad(src=1); rank 1: recv(src=0), linear, send(dst=0)
    r0 = [("Functional.linear.0.forward", _rec([_t()])),
          ("Distributed.send.0.forward", _rec([_t(), _i(1)])),
          ("Distributed.recv.0.forward", _rec([_t(), _i(1)])),
          ("Tensor.mul.0.forward", _rec([_t()]))]
    r1 = [("Distributed.recv.0.forward", _rec([_t(), _i(0)])),
          ("Functional.linear.0.forward", _rec([_t()])),
          ("Distributed.send.0.forward", _rec([_t()], {"dst": _i(0)}))]
    g = build_step_graph([(0, r0), (1, r1)])
    key = g.order_key
    assert key(0, 0) < key(0, 1) < key(1, 0) < key(1, 1) < key(1, 2) < key(0, 2) < key(0, 3)
    edges = {(e.src_rank, e.src_index, e.dst_rank, e.dst_index) for e in g.edges()}
    assert edges == {(0, 1, 1, 0), (1, 2, 0, 2)}
    assert not g.unmatched


def test_collectives_happen_at_once_and_buffers():
    grp = {"type": "torch.ProcessGroup", "group_ranks": [0, 1], "group_id": "x"}
    r0 = [("Functional.linear.0.forward", _rec([_t()])),
          ("Functional.linear.1.forward", _rec([_t()])),
          ("Distributed.all_reduce.0.forward", _rec([_t()], {"group": grp}))]
    r1 = [("Distributed.all_reduce.0.forward", _rec([_t()], {"group": grp})),
          ("Functional.relu.0.forward", _rec([_t()]))]
    g = build_step_graph([(0, r0), (1, r1)])
    assert g.calls[0][0].level == g.calls[1][0].level
    assert g.order_key(0, 1) < g.order_key(1, 1)
    assert len(list(g.edges())) == 2
    assert buffer_args("Distributed.recv.0.forward", _rec([_t(), _i(0)]), 1) == {0}
    assert buffer_args("Distributed.all_reduce.0.forward", _rec([_t()]), 1) == set()
    assert buffer_args("Distributed.all_gather.0.forward", _rec([[_t(), _t()], _t()]), 1) == {0}
    bc = _rec([_t(), _i(0)])
    assert buffer_args("Distributed.broadcast.0.forward", bc, 0) == set()
    assert buffer_args("Distributed.broadcast.0.forward", bc, 1) == {0}
    assert is_buffer_leaf("input.0.1", {0}) and not is_buffer_leaf("input.1", {0})
    assert is_buffer_leaf("input.tensor", {"tensor"}) and not is_buffer_leaf("output.0", {0})


def test_missing_peer_does_not_stall():
    r1 = [("Distributed.recv.0.forward", _rec([_t(), _i(0)])), ("Functional.relu.0.forward", _rec([_t()]))]
    r2 = [("Distributed.all_reduce.0.forward", _rec([_t()]))]
    g = build_step_graph([(1, r1), (2, r2)], world=(0, 1, 2))
    assert g.order_key(1, 1)[0] >= 1 and len(g.unmatched) == 2


def _nan():
    return dict(_t(), Max=float("nan"), Min=float("nan"), Mean=float("nan"), Norm=float("nan"))


def test_first_anomaly_is_where_it_is_born_not_where_it_arrives():
    from msprobe.format.cluster import first_anomaly

    def rec(args, out, kwargs=None):
        return {"input_args": args, "input_kwargs": kwargs or {}, "output": out}

    # stage 0 (rank 0) sends a healthy activation and receives a NaN gradient born on stage 1 (rank 1);
    # both receive buffers hold leftover NaN before the call (torch.empty)
    r0 = {"Functional.linear.0.forward": rec([_t()], [_t()]),
          "Distributed.send.0.forward": rec([_t()], [_t(), None], {"dst": _i(1)}),
          "Distributed.recv.0.forward": rec([_nan()], [_nan(), None], {"src": _i(1)}),
          "Tensor.mul.0.forward": rec([_nan()], [_nan()])}
    r1 = {"Distributed.recv.0.forward": rec([_nan()], [_t(), None], {"src": _i(0)}),
          "Functional.linear.0.forward": rec([_t()], [_t()]),
          "Tensor.log.0.forward": rec([_t()], [_nan()]),
          "Distributed.send.0.forward": rec([_nan()], [_nan(), None], {"dst": _i(0)})}
    got = first_anomaly([(0, r0), (1, r1)])
    assert (got["rank"], got["record"], got["kind"]) == (1, "Tensor.log.0.forward", "nan")
    assert [(hop["from_rank"], hop["to_rank"], hop["to_record"]) for hop in got["path"]] == \
        [(1, 0, "Distributed.recv.0.forward")]
    assert [entry["rank"] for entry in got["ranks"]] == [1, 0]
    # healthy: leftover NaN in the receive buffers alone is no anomaly
    r0["Distributed.recv.0.forward"]["output"] = [_t(), None]
    del r0["Tensor.mul.0.forward"]
    r1["Tensor.log.0.forward"]["output"] = [_t()]
    r1["Distributed.send.0.forward"] = rec([_t()], [_t(), None], {"dst": _i(0)})
    assert first_anomaly([(0, r0), (1, r1)]) is None


def test_describe_path_names_a_hop_once():
    """A hop that leaves from where the previous one arrived (an all_reduce's result sent on) is named
    once, not twice in a row."""
    from msprobe.format.comm import Edge, describe_path

    hops = [Edge(1, 3, "Distributed.all_reduce.0.forward", 0, 3, "Distributed.all_reduce.0.forward", "all_reduce"),
            Edge(0, 3, "Distributed.all_reduce.0.forward", 2, 0, "Distributed.recv.0.forward", "p2p")]
    text = describe_path((1, "Tensor.masked_fill.0.forward"), hops)
    assert text == ("rank 1 Tensor.masked_fill.0.forward -> rank 1 Distributed.all_reduce.0.forward -> rank 0 "
                    "Distributed.all_reduce.0.forward -> rank 2 Distributed.recv.0.forward")


def test_mindspore_ops_communication_names_of_its_own():
    """``Communication.*`` (mindspore.ops.communication) records are communication records; its
    ``gather_into_tensor``/``scatter_tensor`` take (output_tensor, input_tensor, root), where
    ``communication.comm_func``'s namesakes (``Distributed.*``) take other arguments and stay unmapped."""
    r0 = [("Communication.gather_into_tensor.0.forward", _rec([_t(), _t(), _i(0)])),
          ("Communication.scatter_tensor.0.forward", _rec([_t(), _t()], {"src": _i(1)}))]
    r1 = [("Communication.gather_into_tensor.0.forward", _rec([_t(), _t(), _i(0)])),
          ("Communication.scatter_tensor.0.forward", _rec([_t(), _t()], {"src": _i(1)}))]
    g = build_step_graph([(0, r0), (1, r1)])
    edges = {(e.src_rank, e.src_index, e.dst_rank, e.dst_index, e.kind) for e in g.edges()}
    assert (1, 0, 0, 0, "gather_into_tensor") in edges and (0, 0, 1, 0, "gather_into_tensor") not in edges
    assert (1, 1, 0, 1, "scatter_tensor") in edges and (0, 1, 1, 1, "scatter_tensor") not in edges
    rec = _rec([_t(), _t(), _i(0)])
    assert buffer_args("Communication.gather_into_tensor.0.forward", rec, 0) == {0}  # the root's output
    assert buffer_args("Communication.gather_into_tensor.0.forward", rec, 1) == set()
    assert buffer_args("Communication.scatter_tensor.0.forward", rec, 1) == {0}
    assert comm_api("Distributed.gather_into_tensor.0.forward") is None
    assert comm_api("Communication.all_reduce.0.forward")[1] is comm_api("MintDistributed.all_reduce.0.forward")[1]
