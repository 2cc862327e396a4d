"""``msprobe compare TARGET BENCH [-o OUT]``: compare two dumps (also ``-tp T -gp G``)."""
from __future__ import annotations

import argparse
import json
import os
import sys


def register(sub) -> None:
    p = sub.add_parser("compare", help="compare a target dump with a bench dump (statistics, md5 or tensor)")
    p.add_argument("target", nargs="?", help="target dump: root, step or rank directory, or URL")
    p.add_argument("bench", nargs="?", help="bench (golden) dump")
    p.add_argument("-tp", "--target_path", "--target-path", dest="target_path", default=None,
                   help="target dump (the real tool's spelling)")
    p.add_argument("-gp", "--golden_path", "--golden-path", dest="golden_path", default=None,
                   help="bench dump (the real tool's spelling)")
    p.add_argument("-o", "--output_path", "--output-path", "--out", dest="out", default="compare_output",
                   help="output directory (default ./compare_output)")
    p.add_argument("--xlsx", action="store_true", help="also write .xlsx files (needs openpyxl)")
    p.add_argument("--rank", type=int, default=None, help="compare only this rank")
    p.add_argument("--step", type=int, default=None, help="compare only this step")
    p.add_argument("--mode", default="auto", choices=["auto", "statistics", "md5", "tensor"],
                   help="compare mode (default: from the dumps)")
    p.add_argument("-n", "--workers", type=int, default=1, help="processes for multi-rank/multi-step compares")
    p.add_argument("--scheduler", default=None,
                   help="run the rank pairs as tasks on the Dask cluster at this address (tcp://host:port)")
    p.add_argument("--match", default="auto", choices=["auto", "names", "structure"],
                   help="record matching: names, then the construct tree when call counts differ (auto); "
                        "names only; or always the tree")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG plot")
    p.add_argument("--storage-options", default=None, help="JSON object of fsspec storage options")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--fail-on-divergence", action="store_true", help="exit 3 when a divergence is found")
    p.set_defaults(func=run, _parser=p)


def run(args: argparse.Namespace) -> int:
    from msprobe.compare import compare

    target = args.target_path or args.target
    bench = args.golden_path or args.bench
    if args.target_path and args.target and not args.bench:
        bench = bench or args.target
    if not target or not bench:
        args._parser.print_usage(sys.stderr)
        print("msprobe compare: error: a target and a bench dump are needed (TARGET BENCH or -tp T -gp G)",
              file=sys.stderr)
        return 2
    opts = json.loads(args.storage_options) if args.storage_options else None
    s = compare(target, bench, args.out, step=args.step, rank=args.rank, mode=args.mode, xlsx=args.xlsx,
                workers=max(1, args.workers), plot=not args.no_plot, storage_options=opts,
                scheduler=args.scheduler, progress=not args.no_progress,
                structural={"auto": "auto", "names": False, "structure": True}[args.match])
    if args.json:
        print(json.dumps(s, indent=1, default=str))
    else:
        print(f"msprobe compare ({s['mode']}, {s['backend']}): {target} vs {bench}")
        for r in s["pairs"]:
            res = ", ".join(f"{k} {v}" for k, v in sorted(r["results"].items()))
            print(f"  step {r['step']} {r['rank_dir']} vs {r['bench_rank_dir']}: {r['rows']} rows ({res}); "
                  f"records {r['matched_records']}/{r['records']} matched, {r['unmatched_bench_records']} "
                  f"bench-only -> {os.path.basename(r['files'][0])}")
            if r["matched_by"].get("structural") or r["matched_by"].get("dialect"):
                print(f"    matched by name {r['matched_by']['exact']}, across dialects {r['matched_by']['dialect']},"
                      f" by structure {r['matched_by']['structural']}")
        fd = s["first_divergence"]
        if fd:
            print(f"first divergence: {fd['row']} (step {fd['step']}, {fd['rank_dir']}, record #{fd['record_index']},"
                  f" {fd['result']})")
        else:
            print("first divergence: none")
        for side in ("target", "bench"):
            nf = s[f"first_nan_inf_{side}"]
            print(f"first NaN/Inf in {side}: " + (f"{nf['row']} ({nf['rank_dir']})" if nf else "none"))
        if s.get("plot_note"):
            print(f"note: {s['plot_note']}")
        print(f"summary: {s['summary_file']}")
    return 3 if args.fail_on_divergence and s["first_divergence"] else 0
