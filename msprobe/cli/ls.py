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
        doc = msprobe.readers.open(args.path, engine=args.engine, storage_options=opts)
    except UnknownDialectError as exc:
        runs = _runs_below(args.path, opts)
        if not runs:
            raise
        raise UnknownDialectError(f"{exc}. It is not one dump but holds {len(runs)} dump(s) "
                                  f"({', '.join(runs[:5])}{', ...' if len(runs) > 5 else ''}): a lake root; list "
                                  f"its runs with: msprobe lake ls {args.path}") from exc
    if args.records:
        return _list_records(doc, args)
    if args.step is not None or args.rank is not None or args.match is not None:
        from msprobe.errors import ConfigError

        raise ConfigError("--step, --rank and --match select records: add --records")
    summary = doc.summary()
    kernel = doc.kernel_dumps()
    if kernel:  # level L2: the Ascend runtime's files, listed but not decoded
        summary["kernel_dumps"] = [{"step": kernel_file.step, "timestamp": kernel_file.timestamp,
                                    "device": kernel_file.device, "name": kernel_file.name,
                              "size": kernel_file.size} for kernel_file in kernel]
    if args.json:
        print(json.dumps(summary, indent=1, default=str))
        return 0
    ranks = ", ".join("-" if entry is None else str(entry) for entry in summary["ranks"])
    say(f"{summary['url']}")
    _say_header(summary)
    say(f"  {len(summary['steps'])} step(s): {step_ranges(summary['steps'])}; rank(s): {ranks}; "
          f"{len(summary['rank_dirs'])} rank dir(s), {sum(entry['records'] for entry in summary['rank_dirs'])} records")
    has_run = any(entry["run"] and entry["run"] != doc.run for entry in summary["rank_dirs"])
    header = (["run"] if has_run else []) + ["step", "rank_dir", "records", "from"]
    rows = [([str(entry["run"])] if has_run else [])
            + [("" if entry["split"] is None else entry["split"] + "/") + str(entry["step"]), entry["rank_dir"],
               str(entry["records"]), entry["source"]] for entry in summary["rank_dirs"]]
    widths = [max(len(column), *(len(row[i]) for row in rows)) if rows else len(column)
              for i, column in enumerate(header)]
    say("  " + "  ".join(column.ljust(width) for column, width in zip(header, widths)))
    for row in rows:
        say("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)))
    if kernel:
        steps = sorted({kernel_file.step for kernel_file in kernel})
        say(f"  kernel dump (L2): {len(kernel)} file(s), {sum(kernel_file.size for kernel_file in kernel)} bytes, "
            f"step(s) "
              f"{step_ranges(steps)}; opaque binaries in the Ascend runtime's dump format (not decoded)")
    return 0


def _say_header(summary: dict) -> None:
    """The engine, dialect, framework (and where it came from when inferred), task and level; a fragment."""
    inferred = summary["framework_source"] not in (None, "declared")
    say(f"  engine {summary['engine']}, dialect {summary['dialect'] or 'unknown'}, framework {summary['framework']}"
        + (f" ({summary['framework_source']})" if inferred else "")
        + f", task {summary['task']}, level {summary['level']}")
    if summary["fragment"]:
        say(f"  an {summary['fragment']}: its records read as forward API records run_ut can replay")


def _list_records(doc, args) -> int:
    from msprobe.readers import ANY

    rank = ANY if args.rank is None else (int(args.rank) if args.rank.isdigit() else args.rank)
    recs = doc.iter_records(step=ANY if args.step is None else args.step, rank=rank, name=args.match)
    if args.json:
        print(json.dumps([{"step": rec.step, "rank_dir": rec.rank_dir, "name": rec.name, "kind": rec.kind}
                          for rec in recs],
                         indent=1))
        return 0
    count = 0
    for rec in recs:
        say(f"step{rec.step}  {rec.rank_dir}  {rec.name}")
        count += 1
    if not count:
        from msprobe.errors import RecordNotFoundError

        what = f" matching {args.match!r}" if args.match else ""
        near = doc.near_names(args.match, ANY if args.step is None else args.step, rank) if args.match else ""
        raise RecordNotFoundError(f"no record{what} in {doc.url}{near}")
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

