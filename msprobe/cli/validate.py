"""``msprobe validate PATH``: check a dump directory against the format specification."""
from __future__ import annotations

import json
import sys


def register(sub) -> None:
    p = sub.add_parser("validate", help="check a dump (any dialect) against the format spec")
    p.add_argument("path", help="dump root, step or rank directory, or a rank's dump.json (path or URL)")
    p.add_argument("--storage-options", default=None, help="JSON object of fsspec storage options")
    p.add_argument("--quiet", action="store_true", help="print only the summary line")
    p.set_defaults(func=run)


def run(args) -> int:
    from msprobe.backends import open_store
    from msprobe.compare._core import dump_dir_of
    from msprobe.format.validate import validate_store

    opts = json.loads(args.storage_options) if args.storage_options else None
    store = open_store(dump_dir_of(args.path), storage_options=opts, read_only=True, create=False)
    report = validate_store(store)
    if not args.quiet:
        for p in report.problems:
            print(p, file=sys.stderr if p.severity == "error" else sys.stdout)
    print(report.summary())
    return 0 if report.ok else 1
