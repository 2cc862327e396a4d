"""A 2-rank pipeline step written as the real tool's dump.json (statistics, mix), for the cluster view.

Rank 0 runs stage 0 and sends its activations to rank 1 (``Distributed.send``, ``dst=1``), then
receives the input gradient back; rank 1 receives them into a buffer (``torch.empty``: its content
before the receive is leftover memory, here a NaN, which is never data), runs stage 1 and sends the
gradient back; both end the step with an ``all_reduce`` of a gradient. At step 1 of the target,
rank 0's ``Tensor.masked_fill.0.forward`` writes a NaN that reaches rank 1 through the send and comes
back through the gradient; step 0 is healthy. ``bench=True`` writes the healthy run (no NaN).
"""
from __future__ import annotations

import json
import os

NAN = float("nan")


def _t(value: float, shape: tuple = (4, 8)) -> dict:
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": list(shape), "Max": value, "Min": -value
            if value == value else value, "Mean": value / 10 if value == value else value,
            "Norm": abs(value) * 3 if value == value else value, "requires_grad": False}


def _rec(inputs: list, output: list, **kwargs: int) -> dict:
    return {"input_args": inputs, "input_kwargs": {k: {"type": "int", "value": v} for k, v in kwargs.items()},
            "output": output}


def _rank0(bad: bool) -> dict:
    act = NAN if bad else 1.5
    return {
        "Functional.linear.0.forward": _rec([_t(1.0), _t(0.5, (8, 8))], [_t(1.2)]),
        "Tensor.masked_fill.0.forward": _rec([_t(1.2)], [_t(act)]),
        "Distributed.send.0.forward": _rec([_t(act)], [_t(act)], dst=1),
        "Distributed.recv.0.forward": _rec([_t(7e25)], [_t(act)], src=1),
        "Functional.linear.0.backward": _rec([_t(act)], [_t(act)]),
        "Distributed.all_reduce.0.forward": _rec([_t(act)], [_t(act)]),
        "Tensor.add_.0.forward": _rec([_t(0.5, (8, 8)), _t(act, (8, 8))], [_t(act, (8, 8))]),
    }


def _rank1(bad: bool) -> dict:
    act = NAN if bad else 1.5
    return {
        # the receive buffer before the call held leftover memory (a NaN): no data, no anomaly
        "Distributed.recv.0.forward": _rec([_t(NAN)], [_t(act)], src=0),
        "Functional.linear.0.forward": _rec([_t(act), _t(0.5, (8, 8))], [_t(act)]),
        "Functional.relu.0.forward": _rec([_t(act)], [_t(act)]),
        "Tensor.mean.0.forward": _rec([_t(act)], [_t(act, ())]),
        "Distributed.send.0.forward": _rec([_t(act)], [_t(act)], dst=0),
        "Distributed.all_reduce.0.forward": _rec([_t(act)], [_t(act)]),
        "Tensor.add_.0.forward": _rec([_t(0.5, (8, 8)), _t(act, (8, 8))], [_t(act, (8, 8))]),
    }


def write_pipeline(root: str, bench: bool = False) -> str:
    """``root/step{0,1}/rank{0,1}/dump.json``; returns ``root``."""
    for step in (0, 1):
        for rank, make in ((0, _rank0), (1, _rank1)):
            rank_dir = os.path.join(root, f"step{step}", f"rank{rank}")
            os.makedirs(rank_dir, exist_ok=True)
            data = make(step == 1 and not bench)
            doc = {"task": "statistics", "level": "mix", "framework": "pytorch", "dump_data_dir": None, "data": data}
            with open(os.path.join(rank_dir, "dump.json"), "w", encoding="utf-8") as handle:
                json.dump(doc, handle, indent=1)
    return root
