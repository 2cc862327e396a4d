"""``msprobe recover PATH``: rebuild the documents of a killed run from its crash journal."""
from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser("recover", help="rebuild dump.json/stack.json/construct.json from the crash journal")
    p.add_argument("path", help="dump root, step or rank directory (path or URL)")
    p.add_argument("--storage-options", default=None, help="JSON object of fsspec storage options")
    p.add_argument("--task", default=None)
    p.add_argument("--level", default=None)
    p.set_defaults(func=run)


def run(args) -> int:
    from msprobe.backends import open_store
    from msprobe.dumpers.recover import recover_store

    opts = json.loads(args.storage_options) if args.storage_options else None
    store = open_store(args.path, storage_options=opts, create=False)
    results = recover_store(store, task=args.task, level=args.level)
    if not results:
        import msprobe.readers

        dump = msprobe.readers.open(args.path, storage_options=opts)  # a folder that is no dump: UnknownDialectError
        if dump.sources:
            dump.sources[0].document()  # a document the readers cannot read: its DocumentError
        print("nothing to recover: no journal found")
        return 0
    for r in results:
        print(r.summary())
    return 0
