"""``msprobe validate PATH``: check a dump directory against the format specification."""
from __future__ import annotations

import json
import sys


def register(sub) -> None:
    p = sub.add_parser("validate", help="check a dump (any dialect) against the format spec")
    p.add_argument("path", help="dump root, step or rank directory, or a rank's dump.json (path or URL)")
    p.add_argument("--storage-options", default=None, help="JSON object of fsspec storage options")
    p.add_argument("--quiet", action="store_true", help="print only the summary line")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--tensors", dest="tensors", action="store_true", default=None,
                   help="load every tensor payload against its record (default: only where a rank "
                        "directory declares at most 256 MiB of tensors)")
    g.add_argument("--no-tensors", dest="tensors", action="store_false",
                   help="check only that each payload exists")
    p.add_argument("--json", action="store_true", help="print the report as JSON (ok, summary, problems)")
    p.set_defaults(func=run)


def run(args) -> int:
    from msprobe.backends import open_store
    from msprobe.format.layout import dump_dir_of
    from msprobe.format.naming import printable
    from msprobe.readers.validate import validate_store

    opts = json.loads(args.storage_options) if args.storage_options else None
    store = open_store(dump_dir_of(args.path), storage_options=opts, read_only=True, create=False)
    report = validate_store(store, tensors=args.tensors)
    if args.json:
        print(json.dumps({"ok": report.ok, "summary": report.summary(),
                          "problems": [{"severity": p.severity, "file": p.file, "location": p.location,
                                        "message": p.message} for p in report.problems]},
                         indent=1))
        return 0 if report.ok else 1
    if not args.quiet:
        for p in report.problems:  # names come from the dump: escaped for the terminal
            print(printable(str(p).replace("msprobe recover DUMP_PATH", f"msprobe recover {args.path}")),
                  file=sys.stderr if p.severity == "error" else sys.stdout)
    print(printable(report.summary()))
    return 0 if report.ok else 1
