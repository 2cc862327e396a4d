"""``msprobe ls PATH``: steps, ranks, record counts, task/level/framework and dialect of a dump."""
from __future__ import annotations

import json

from msprobe.cli._text import say
from msprobe.format.layout import step_ranges


def register(sub) -> None:
    p = sub.add_parser("ls", help="list the steps, ranks and record counts of a dump (or an index lake)")
    p.add_argument("path", help="dump root, step or rank directory, or an index lake (path or URL)")
    p.add_argument("--engine", default=None, help="reading engine: msprobe or index (default: guess)")
    p.add_argument("--storage-options", default=None, help="JSON object of fsspec storage options")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--records", action="store_true",
                   help="list the record names instead (step, rank directory, name; in execution order)")
    p.add_argument("--step", type=int, default=None, help="with --records: only this step")
    p.add_argument("--rank", default=None, help="with --records: only this rank id or rank directory name")
    p.add_argument("--match", default=None, help="with --records: only names matching this glob, e.g. 'Module.head*'")
    p.set_defaults(func=run)


def run(args) -> int:
    import msprobe.readers
    from msprobe.errors import UnknownDialectError

    opts = json.loads(args.storage_options) if args.storage_options else None
    try:
        d = msprobe.readers.open(args.path, engine=args.engine, storage_options=opts)
    except UnknownDialectError as exc:
        runs = _runs_below(args.path, opts)
        if not runs:
            raise
        raise UnknownDialectError(f"{exc}. It is not one dump but holds {len(runs)} dump(s) "
                                  f"({', '.join(runs[:5])}{', ...' if len(runs) > 5 else ''}): a lake root; list "
                                  f"its runs with: msprobe lake ls {args.path}") from exc
    if args.records:
        return _list_records(d, args)
    if args.step is not None or args.rank is not None or args.match is not None:
        from msprobe.errors import ConfigError

        raise ConfigError("--step, --rank and --match select records: add --records")
    s = d.summary()
    kernel = d.kernel_dumps()
    if kernel:  # level L2: the Ascend runtime's files, listed but not decoded
        s["kernel_dumps"] = [{"step": k.step, "timestamp": k.timestamp, "device": k.device, "name": k.name,
                              "size": k.size} for k in kernel]
    if args.json:
        print(json.dumps(s, indent=1, default=str))
        return 0
    ranks = ", ".join("-" if r is None else str(r) for r in s["ranks"])
    say(f"{s['url']}")
    say(f"  engine {s['engine']}, dialect {s['dialect'] or 'unknown'}, framework {s['framework']}, "
          f"task {s['task']}, level {s['level']}")
    say(f"  {len(s['steps'])} step(s): {step_ranges(s['steps'])}; rank(s): {ranks}; "
          f"{len(s['rank_dirs'])} rank dir(s), {sum(r['records'] for r in s['rank_dirs'])} records")
    has_run = any(r["run"] and r["run"] != d.run for r in s["rank_dirs"])
    header = (["run"] if has_run else []) + ["step", "rank_dir", "records", "from"]
    rows = [([str(r["run"])] if has_run else [])
            + [("" if r["split"] is None else r["split"] + "/") + str(r["step"]), r["rank_dir"], str(r["records"]),
               r["source"]] for r in s["rank_dirs"]]
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
    say("  " + "  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for row in rows:
        say("  " + "  ".join(v.ljust(w) for v, w in zip(row, widths)))
    if kernel:
        steps = sorted({k.step for k in kernel})
        say(f"  kernel dump (L2): {len(kernel)} file(s), {sum(k.size for k in kernel)} bytes, step(s) "
              f"{step_ranges(steps)}; opaque binaries in the Ascend runtime's dump format (not decoded)")
    return 0


def _list_records(d, args) -> int:
    from msprobe.readers import ANY

    rank = ANY if args.rank is None else (int(args.rank) if args.rank.isdigit() else args.rank)
    recs = d.iter_records(step=ANY if args.step is None else args.step, rank=rank, name=args.match)
    if args.json:
        print(json.dumps([{"step": r.step, "rank_dir": r.rank_dir, "name": r.name, "kind": r.kind} for r in recs],
                         indent=1))
        return 0
    n = 0
    for r in recs:
        say(f"step{r.step}  {r.rank_dir}  {r.name}")
        n += 1
    if not n:
        from msprobe.errors import RecordNotFoundError

        what = f" matching {args.match!r}" if args.match else ""
        near = d.near_names(args.match, ANY if args.step is None else args.step, rank) if args.match else ""
        raise RecordNotFoundError(f"no record{what} in {d.url}{near}")
    return 0


def _runs_below(path: str, opts) -> list:
    """The first few sub-folders of ``path`` that open as dumps (a lake root holds one per run)."""
    import msprobe.readers
    from msprobe.backends import open_store
    from msprobe.errors import MsprobeError

    try:
        names = [n.rstrip("/") for n in open_store(path, storage_options=opts, read_only=True, create=False)
                 .list_dir("")]
    except (MsprobeError, OSError):
        return []
    runs = []
    for name in sorted(n for n in names if not n.startswith(("_", ".")))[:20]:
        try:
            msprobe.readers.open(f"{path.rstrip('/')}/{name}", storage_options=opts)
        except (MsprobeError, OSError):
            continue
        runs.append(name)
    return runs

