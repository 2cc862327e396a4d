"""``msprobe index PATH [--out URL]``: build the Parquet side index of a dump."""
from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser("index", help="build the Parquet index of a dump (one file per step and rank)")
    p.add_argument("path", help="dump root, step or rank directory (path or URL)")
    p.add_argument("--out", default=None,
                   help="write run=/step=/rank= partitions under this URL instead of <rank dir>/index/")
    p.add_argument("--run", default=None, help="run name for the 'run' column (default: the dump's directory name)")
    p.add_argument("--storage-options", default=None, help="JSON object of fsspec storage options for PATH")
    p.add_argument("--out-storage-options", default=None, help="JSON object of fsspec storage options for --out")
    p.add_argument("--skip-existing", action="store_true", help="keep index files that already exist")
    p.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run)


def run(args) -> int:
    from msprobe.readers.index import build_index

    opts = json.loads(args.storage_options) if args.storage_options else None
    out_opts = json.loads(args.out_storage_options) if args.out_storage_options else None
    written = build_index(args.path, args.out, storage_options=opts, out_storage_options=out_opts, run=args.run,
                          progress=not args.quiet, skip_existing=args.skip_existing)
    print(f"indexed {len(written)} rank dir(s)")
    return 0
