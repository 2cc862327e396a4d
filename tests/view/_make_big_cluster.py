"""A step of a large run for the cluster view at scale, written as the real tool's dump.json
(statistics, mix): ``ranks`` ranks of ``records`` records each (default 64 x 20,000).

Every rank runs the same program: ``Functional.linear`` records, an ``all_reduce`` of the gradient
every 100 records, and every 1,000 records a pipeline hand-off (an even rank sends to the next, the
odd rank receives from it). Rank ``BAD_RANK``'s ``Tensor.masked_fill`` at record ``BAD_AT`` writes a
NaN; from there every record of that rank is NaN, and every rank's records are NaN after the next
``all_reduce`` (the NaN travels through it): so most records of the step are NaN, as in a real run
after a NaN. ``healthy=True`` writes the same step without the NaN.

Run as a script: ``python _make_big_cluster.py ROOT [RANKS RECORDS]`` writes ``ROOT/step0/rankN``.
"""
from __future__ import annotations

import json
import os
import sys

BAD_RANK = 5
BAD_AT = 5003
EVERY_COLL = 100
EVERY_P2P = 1000


def _tensor(value: float) -> str:
    v = "NaN" if value != value else repr(value)
    return ('{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4, 8], "Max": %s, "Min": %s, '
            '"Mean": %s, "Norm": %s, "requires_grad": false}' % (v, v, v, v))


def first_shared_nan(records: int) -> int:
    """The first all_reduce after the NaN: every rank's records are NaN from it on."""
    return next(k for k in range(BAD_AT, records) if k % EVERY_COLL == 50)


def rank_lines(rank: int, records: int, healthy: bool) -> list:
    """The ``"name": record`` entries of one rank's ``data``, in call order."""
    shared = first_shared_nan(records) if records > BAD_AT else records
    out = []
    counts: dict = {}
    for k in range(records):
        bad = not healthy and ((rank == BAD_RANK and k >= BAD_AT) or k >= shared)
        value = float("nan") if bad else 1.0 + (k % 7) / 10
        kw = ""
        if k % EVERY_COLL == 50:
            api = "Distributed.all_reduce"
        elif k % EVERY_P2P == 10:
            api = "Distributed.send" if rank % 2 == 0 else "Distributed.recv"
            kw = '"dst": {"type": "int", "value": %d}' % (rank + 1) if rank % 2 == 0 else \
                '"src": {"type": "int", "value": %d}' % (rank - 1)
        elif k == BAD_AT and rank == BAD_RANK:
            api = "Tensor.masked_fill"
        else:
            api = "Functional.linear"
        n = counts.get(api, 0)
        counts[api] = n + 1
        before = float("nan") if bad and not (k == BAD_AT and rank == BAD_RANK) else 1.0
        out.append('"%s.%d.forward": {"input_args": [%s], "input_kwargs": {%s}, "output": [%s]}'
                   % (api, n, _tensor(before), kw, _tensor(value)))
    return out


def write_step(root: str, ranks: int = 64, records: int = 20000, healthy: bool = False) -> str:
    """``root/step0/rank{0..ranks-1}/dump.json``; returns ``root``."""
    for rank in range(ranks):
        d = os.path.join(root, "step0", f"rank{rank}")
        os.makedirs(d, exist_ok=True)
        head = json.dumps({"task": "statistics", "level": "mix", "framework": "pytorch", "dump_data_dir": None})
        with open(os.path.join(d, "dump.json"), "w", encoding="utf-8") as handle:
            handle.write(head[:-1] + ', "data": {\n' + ",\n".join(rank_lines(rank, records, healthy)) + "\n}}\n")
    return root


if __name__ == "__main__":
    write_step(sys.argv[1], *(int(a) for a in sys.argv[2:4]))


def rank_records(rank: int, records: int = 20000, healthy: bool = False) -> dict:
    """One rank's ``data`` as :func:`write_step` writes it, parsed."""
    return json.loads("{" + ",".join(rank_lines(rank, records, healthy)) + "}")


def anomalous_rows(records: dict) -> tuple:
    """(communication rows, anomalous records) of one rank, as the view's tables answer them
    (msprobe.view._cluster._AnomalousRows): its records' NaN rows, a statistics dump's own
    (no bench: a NaN/Inf is the only anomaly)."""
    comm: list = []
    bad: list = []
    for record, body in records.items():
        rows = [(f"{record}.input.{k}", t) for k, t in enumerate(body["input_args"])] + \
            [(f"{record}.output.{k}", t) for k, t in enumerate(body["output"])]
        nans = [name for name, t in rows if t["Max"] != t["Max"]]
        if record.startswith("Distributed."):
            comm.extend({"record": record, "name": name, "result": "", "nan_inf": name in nans, "bad": name in nans}
                        for name, _ in rows)
        elif nans:
            bad.append((record, nans[0], True, 0))
    return comm, bad


def _with_peer(base: dict, rank: int) -> dict:
    """``base`` (a rank of the same parity) with this rank's send/recv peers."""
    out = dict(base)
    for name, body in base.items():
        if name.startswith(("Distributed.send.", "Distributed.recv.")):
            key = "dst" if name.startswith("Distributed.send.") else "src"
            out[name] = dict(body, input_kwargs={key: {"type": "int", "value": rank + 1 if key == "dst" else rank - 1}})
    return out


def step_model(ranks: int = 64, records: int = 20000) -> tuple:
    """(cells, rows, read, summary) of :func:`write_step`'s step for msprobe.view._cluster.assemble,
    without writing it: the ranks' records made in memory (one parse per rank parity), their
    anomalous rows as the tables answer them, and a compare summary naming the first NaN (rank
    ``BAD_RANK``'s masked_fill) with its path through the all_reduce to every other rank."""
    base = {parity: rank_records(parity, records) for parity in (0, 1)}
    bad = rank_records(BAD_RANK, records)
    rows_of = {parity: anomalous_rows(base[parity]) for parity in (0, 1)}
    cells = [{"cell": r, "rank": r, "rank_dir": f"rank{r}", "run": None, "step": 0} for r in range(ranks)]
    rows = {r: anomalous_rows(bad) if r == BAD_RANK else rows_of[r % 2] for r in range(ranks)}

    def read(cell_row: dict) -> tuple:
        r = cell_row["rank"]
        return None, (bad if r == BAD_RANK else _with_peer(base[r % 2], r))

    shared = f"Distributed.all_reduce.{first_shared_nan(records) // EVERY_COLL}.forward"
    origin = "Tensor.masked_fill.0.forward"
    hops = [{"from_rank": BAD_RANK, "from_record": shared, "to_rank": r, "to_record": shared, "via": "all_reduce"}
            for r in range(ranks) if r != BAD_RANK]
    summary = {"first_nan_inf_target": {
        "step": 0, "rank_dir": f"rank{BAD_RANK}", "record": origin, "record_index": BAD_AT, "kind": "nan",
        "path": [{"from_rank": BAD_RANK, "from_record": origin, "to_rank": BAD_RANK, "to_record": shared,
                  "via": "data"}] + hops,
        "path_text": f"rank {BAD_RANK} {origin} -> rank {BAD_RANK} {shared} -> every rank's {shared}"}}
    return cells, rows, read, summary
