"""``msprobe merge_result -i INPUT_DIR -o OUTPUT_DIR -config config.yaml``: chosen APIs' compare
metrics of every rank in one table (8.x doc 10 section 4)."""
from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("merge_result", help="gather chosen APIs' compare metrics of every rank into one .xlsx")
    p.add_argument("-i", "--input_dir", dest="input_dir", required=True,
                   help="the output directory of a multi-rank compare (compare_result_rank<N>_*.csv)")
    p.add_argument("-o", "--output_dir", dest="output_dir", required=True, help="where the merged .xlsx goes")
    p.add_argument("-config", "--config-path", dest="config", required=True,
                   help="YAML with 'api' (names or prefixes) and optional 'compare_index' (metric columns)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from msprobe.compare.merge import merge_result

    s = merge_result(args.input_dir, args.output_dir, args.config)
    print(f"msprobe merge_result ({s['mode']}): {s['rows']} rows x ranks {s['ranks']}, sheets "
          f"{', '.join(s['metrics'])} -> {s['file']}")
    return 0
