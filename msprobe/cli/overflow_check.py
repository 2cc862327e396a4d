"""``msprobe overflow_check -i STEP_DIR -o OUT``: the first anomaly (NaN/Inf) of one step over all its
ranks, in the order their communication implies, as 26.2.0's ``anomaly_analyze_{timestamp}.json``."""
from __future__ import annotations

import argparse
import sys


def register(sub) -> None:
    p = sub.add_parser("overflow_check",
                       help="the first NaN/Inf of one step over all its ranks (where it was born, following "
                            "send/recv and collectives) into OUT/anomaly_analyze_{timestamp}.json",
                       description="Finds the first anomaly (NaN/Inf) of one step over all its ranks: each rank's "
                                   "first record holding a NaN or an Inf (a mask's intended -inf and receive buffers "
                                   "before their receive left out), the one first in the order the step's "
                                   "communication implies (a send before its receive, a collective at once on all its "
                                   "members), and writes it as the real tool writes its answer: {\"rank_N\": "
                                   "[{op_name, data_info, construct_info, stack_info}]}; no anomaly: no file.")
    p.add_argument("-i", "--input_path", "--input-path", dest="input_path", required=True,
                   help="a step directory of the dump (its rank directories), e.g. ./dump/step0")
    p.add_argument("-o", "--output_path", "--output-path", dest="output_path", default="./output",
                   help="where anomaly_analyze_{timestamp}.json goes (created; default ./output)")
    p.add_argument("--storage-options", default=None, help="JSON object of fsspec storage options for the input")
    p.add_argument("--json", action="store_true", help="print the answer (rank, record, kind, path) as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    from msprobe.compare.overflow import analyze_step, write_anomaly_file

    found = analyze_step(args.input_path, storage_options=args.storage_options)
    if found is None:
        if args.json:
            print(json.dumps({"anomaly": None, "file": None}))
        else:
            print(f"msprobe overflow_check: no NaN/Inf in {args.input_path}: no anomaly file written")
        return 0
    path = write_anomaly_file(found["result"], args.output_path)
    a = found["anomaly"]
    if args.json:
        keep = ("rank", "record", "kind", "argument", "path", "path_text")
        print(json.dumps({"anomaly": {k: a.get(k) for k in keep}, "file": path}, default=str))
    else:
        print(f"msprobe overflow_check: first anomaly ({a['kind']}) at rank {a['rank']} {a['record']} "
              f"({a['argument']})")
        if a.get("path"):
            print(f"  propagation: {a['path_text']}")
        print(f"  written: {path}", file=sys.stdout)
    return 0
