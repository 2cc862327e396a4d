"""The merge of a 1,024-rank parallel layout (issue 47, item 5): wall and CPU time and peak memory
of merging one step of a synthesised tp=8, pp=16, dp=8 run (Megatron's rank order) into its logical
model against a whole-batch single-card reference, the data-parallel replicas joined.

Each rank holds ``--layers`` layers of its stage x ``--micro-batches`` micro-batches of a
column-parallel linear -> gelu -> row-parallel linear with its all_reduce, forward and backward, the
stages chained by send/recv, under stage-local names, with statistics made so that the shards and
replicas merge back into the reference's (a healthy pair: the merge must find nothing).

    python bench/bench_layout_scale.py [--tp 8 --pp 16 --dp 8 --layers 2 --micro-batches 8]

Prints the records per rank, the merged records, the findings (0 expected), the seconds and the peak
resident memory of the process (``ru_maxrss``) against the size of the documents it reads.
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from msprobe.format.documents import DumpDocument
from msprobe.format.parallel import Layout
from msprobe.readers._merged import merge_dump_step

H, S, B = 64, 16, 256  # hidden, sequence, global batch


def _leaf(shape: list, scale: float) -> dict:
    """A tensor whose shards' statistics merge back into the whole's: every element's magnitude is
    ``scale`` (Max scale, Min -scale, Mean 0), so a piece of n elements has Norm scale*sqrt(n)."""
    numel = 1
    for size in shape:
        numel *= size
    return {"type": "torch.Tensor", "dtype": "torch.float64", "shape": list(shape), "Max": scale, "Min": -scale,
            "Mean": 0.0, "Norm": scale * numel ** 0.5, "requires_grad": True}


class _Source:
    def __init__(self, rank: int, data: dict):
        self.rank, self.step, self.url, self.rank_dir = rank, 0, f"mem://rank{rank}", f"rank{rank}"
        self._doc = DumpDocument.new("statistics", "mix", "pytorch", data=data)

    def document(self):
        return self._doc

    def parents(self):
        return {}

    def frames_of(self, name):
        return None


def _p2p(peer: int, leaf: dict) -> dict:
    return {"input_args": [leaf, {"type": "int", "value": peer}], "input_kwargs": {}, "output": [leaf]}


def rank_records(stage: int, tp: int, dp: int, pp: int, layers: int, micro: int, peers: tuple, group: list) -> dict:
    """One rank's records (stage-local names) of one step."""
    b = B // dp // micro
    data: dict = {}
    count = {"linear": 0, "gelu": 0, "all_reduce": 0, "send": 0, "recv": 0}

    def api(head: str, key: str, record: dict) -> None:
        data[f"{head}.{count[key]}.forward"] = record
        count[key] += 1

    x = _leaf([b, S, H], 1.0)
    group_arg = {"type": "tuple", "value": group}
    for _ in range(micro):
        if stage > 0:
            api("Distributed.recv", "recv", _p2p(peers[0], x))
        for layer in range(layers):
            first = count["linear"]
            data[f"Functional.linear.{first}.forward"] = {
                "input_args": [x, _leaf([4 * H // tp, H], 0.02 * (layer + 1)), _leaf([4 * H // tp], 0.0)],
                "input_kwargs": {}, "output": [_leaf([b, S, 4 * H // tp], 2.0)]}
            api("Functional.gelu", "gelu", {"input_args": [_leaf([b, S, 4 * H // tp], 2.0)], "input_kwargs": {},
                                            "output": [_leaf([b, S, 4 * H // tp], 1.5)]})
            partial = dict(_leaf([b, S, H], 0.5), Mean=0.01 * (layer + 1) / tp)
            data[f"Functional.linear.{first + 1}.forward"] = {
                "input_args": [_leaf([b, S, 4 * H // tp], 1.5), _leaf([H, 4 * H // tp], 0.02)], "input_kwargs": {},
                "output": [partial]}
            count["linear"] += 2
            api("Distributed.all_reduce", "all_reduce",
                {"input_args": [partial, {"type": "str", "value": "sum"}, group_arg], "input_kwargs": {},
                 "output": [_leaf([b, S, H], 1.0)]})
        if stage < pp - 1:
            api("Distributed.send", "send", _p2p(peers[1], x))
    return data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--pp", type=int, default=16)
    ap.add_argument("--dp", type=int, default=8)
    ap.add_argument("--layers", type=int, default=2, help="layers of each stage")
    ap.add_argument("--micro-batches", type=int, default=8)
    args = ap.parse_args()
    tp, pp, dp = args.tp, args.pp, args.dp
    world = tp * pp * dp
    layout = Layout(tp=tp, pp=pp, dp=dp)
    sources = []
    size = 0
    for rank in range(world):
        c = layout.coordinates(rank, world)
        before = ((c["pp"] - 1) * dp + c["dp"]) * tp + c["tp"]
        after = ((c["pp"] + 1) * dp + c["dp"]) * tp + c["tp"]
        group = [(c["pp"] * dp + c["dp"]) * tp + t for t in range(tp)]
        data = rank_records(c["pp"], tp, dp, pp, args.layers, args.micro_batches, (before, after), group)
        size += len(json.dumps(data))
        sources.append(_Source(rank, data))
    whole = {name: record for name, record in
             rank_records(0, 1, 1, 1, args.layers * pp, args.micro_batches, (0, 0), [0]).items()
             if not name.startswith("Distributed.")}
    per_rank = len(sources[0].document().data)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started, cpu = time.perf_counter(), time.process_time()
    merged = merge_dump_step(sources, layout, whole)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    (model,) = merged
    records = model.document().data
    print(f"layout tp={tp},pp={pp},dp={dp}: {world} ranks x {per_rank} records ({size / 1e6:.1f} MB of JSON)")
    print(f"merged: {len(records)} logical records (reference {len(whole)}), "
          f"{len(model.report['findings'])} findings, {model.report['communication_left_out']} communication "
          f"records left out")
    print(f"merge: {wall:.1f} s wall, {cpu:.1f} s CPU; peak RSS {rss / 1024:.0f} MiB "
          f"(before the merge {rss_before / 1024:.0f} MiB, the synthesised documents included)")


if __name__ == "__main__":
    main()
