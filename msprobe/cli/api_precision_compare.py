"""``msprobe api_precision_compare -npu CSV -gpu CSV [-o OUT]``: judge NPU run_ut details against GPU ones."""
from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("api_precision_compare",
                       help="compare the run_ut details CSV of an NPU run with that of a GPU run")
    p.add_argument("-npu", "--npu_csv_path", dest="npu", required=True, help="NPU accuracy_checking_details CSV")
    p.add_argument("-gpu", "--gpu_csv_path", dest="gpu", required=True, help="GPU accuracy_checking_details CSV")
    p.add_argument("-o", "--output-path", "--output_path", "--out_path", "--out", dest="out_path", default="./", help="output directory (default ./)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from msprobe.run_ut.precision_compare import api_precision_compare

    s = api_precision_compare(args.npu, args.gpu, args.out_path)
    counts = ", ".join(f"{k} {v}" for k, v in sorted(s["counts"].items()))
    print(f"msprobe api_precision_compare: {s['apis']} APIs [{counts}]")
    if s["unmatched"]:
        print(f"  {len(s['unmatched'])} NPU rows have no GPU row (SKIP)")
    print(f"result csv: {s['result_csv']}")
    print(f"details csv: {s['details_csv']}")
    return 0
