"""``msprobe demo``: dump a small training run and read it back (the README's main job)."""
from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser("demo", help="dump a tiny training run under PrecisionDebugger and read it back")
    p.add_argument("--dump-path", default="./demo_dump", help="where to dump (path or URL, e.g. s3://bucket/run)")
    p.add_argument("--storage-options", default=None, help="JSON object of fsspec storage options")
    p.add_argument("--task", default="statistics", choices=["statistics", "tensor"])
    p.add_argument("--level", default="mix", choices=["L0", "L1", "mix"])
    p.add_argument("--steps", type=int, default=3)
    p.set_defaults(func=run)


def run(args) -> int:
    from msprobe.demo import run_demo

    opts = json.loads(args.storage_options) if args.storage_options else None
    result = run_demo(args.dump_path, args.task, args.level, args.steps, storage_options=opts)
    return 0 if result["ok"] else 1
