"""``msprobe index PATH [--out URL]``: build the Parquet side index of a dump."""
from __future__ import annotations

import json

from msprobe.progress import add_progress_flag


def register(sub) -> None:
    parser = sub.add_parser("index", help="build the Parquet index of a dump (one file per step and rank)")
    parser.add_argument("path", help="dump root, step or rank directory (path or URL)")
    parser.add_argument("-o", "--output-path", "--out", dest="out", default=None,
                   help="write run=/step=/rank= partitions under this URL instead of <rank dir>/index/")
    parser.add_argument("--run", default=None, help="run name for the 'run' column (default: the dump's directory name)")
    parser.add_argument("--storage-options", default=None, help="JSON object of fsspec storage options for PATH")
    parser.add_argument("--out-storage-options", default=None, help="JSON object of fsspec storage options for --out")
    parser.add_argument("--skip-existing", action="store_true", help="keep index files that already exist")
    add_progress_flag(parser, "--quiet", "-q")
    parser.add_argument("--json", action="store_true", help="print the written index files as JSON")
    parser.set_defaults(func=run)


def run(args) -> int:
    from msprobe.compare import write_compare_leaves
    from msprobe.readers.index import build_index

    opts = json.loads(args.storage_options) if args.storage_options else None
    out_opts = json.loads(args.out_storage_options) if args.out_storage_options else None
    written = build_index(args.path, args.out, storage_options=opts, out_storage_options=out_opts, run=args.run,
                          progress="auto" if args.progress is None else args.progress,
                          skip_existing=args.skip_existing, leaf_tables=write_compare_leaves)
    if args.json:
        print(json.dumps({"rank_dirs": len(written), "files": written}, indent=1))
    else:
        print(f"indexed {len(written)} rank dir(s)")
    return 0
