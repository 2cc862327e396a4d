"""``msprobe show PATH RECORD``: one record with its statistics, stack and parent."""
from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser("show", help="show one record (or those a glob matches): arguments with statistics, stack, "
                                    "parent and children")
    p.add_argument("path", help="dump root, step or rank directory (path or URL)")
    p.add_argument("record", help="record name, e.g. Functional.linear.0.forward, or a glob such as 'Module.head*' "
                                  "(quoted; msprobe ls PATH --records lists the names)")
    p.add_argument("--step", type=int, default=None, help="step number (needed when several steps hold it)")
    p.add_argument("--rank", default=None,
                   help="rank id, or a rank directory name such as proc1234 (needed when several ranks hold it)")
    p.add_argument("--engine", default=None, help="reading engine: msprobe or index (default: guess)")
    p.add_argument("--storage-options", default=None, help="JSON object of fsspec storage options")
    p.add_argument("--json", action="store_true", help="print the record's JSON as dumped")
    p.set_defaults(func=run)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return "-" if v is None else str(v)


def run(args) -> int:
    import builtins

    import msprobe.readers
    from msprobe.cli._text import say as print  # every line holds names from the dump: one line each
    from msprobe.format.naming import printable
    from msprobe.readers import ANY, AmbiguousRecordError

    opts = json.loads(args.storage_options) if args.storage_options else None
    d = msprobe.readers.open(args.path, engine=args.engine, storage_options=opts)
    rank = ANY if args.rank is None else (int(args.rank) if args.rank.isdigit() else args.rank)
    step = ANY if args.step is None else args.step
    from msprobe.errors import RecordNotFoundError

    try:
        recs = [d.record(args.record, step=step, rank=rank)]  # a name first (names may hold '[' too)
    except AmbiguousRecordError as exc:  # the library's hint names its keywords; the command's are options
        raise AmbiguousRecordError(str(exc).replace("pass step= and rank=", "pass --step N and/or --rank R")) \
            from None
    except RecordNotFoundError:
        if not any(c in args.record for c in "*?["):
            raise
        recs = d.records(step=step, rank=rank, name=args.record)  # a glob: every record it matches
        if not recs:
            raise RecordNotFoundError(f"no record matches {args.record!r} in {d.url}"
                                      f"{d.near_names(args.record, step, rank)}") from None
    if args.json:  # (json escapes what its strings hold)
        builtins.print(json.dumps({recs[0].name: recs[0].to_json()} if len(recs) == 1 else
                                  [{"step": r.step, "rank_dir": r.rank_dir, "name": r.name, "record": r.to_json()}
                                   for r in recs[:SHOW_AT_MOST]], indent=1))
        return 0
    for i, rec in enumerate(recs[:SHOW_AT_MOST]):
        if i:
            print("")
        _show(rec, print, builtins.print, printable)
    if len(recs) > SHOW_AT_MOST:
        print(f"... and {len(recs) - SHOW_AT_MOST} more record(s) matching {args.record!r}: "
              f"msprobe ls {args.path} --records --match {args.record!r} lists them")
    elif len(recs) > 1:
        print(f"({len(recs)} records match {args.record!r})")
    return 0


#: a glob shows at most this many records in full
SHOW_AT_MOST = 10


def _show(rec, print_line, raw_print, printable) -> None:
    print = print_line  # noqa: A001 - every line below holds names from the dump: one escaped line each
    print(f"{rec.name}")
    print(f"  kind {rec.kind}, api_type {rec.api_type}, api_name {rec.api_name}, call {rec.call_index}, "
          f"direction {rec.direction or '-'}")
    print(f"  step {rec.step}, rank_dir {rec.rank_dir}, position {rec.seq}")
    tensors = rec.tensors()
    non_tensor = _non_tensors(rec)
    if tensors:
        print("  tensors:")
        for _io, t in tensors:
            st = t.stats
            extra = f" md5={t.md5}" if t.md5 else ""
            extra += f" file={t.data_name}" if t.data_name else ""
            stats = " ".join(f"{name}={_fmt(value)}" for name, value in st.items())
            print(f"    {t.path:<24} {t.dtype} {list(t.shape)} {stats} requires_grad={_fmt(t.requires_grad)}{extra}")
    if non_tensor:
        print("  other arguments:")
        for path, value in non_tensor:
            print(f"    {path:<24} {value}")
    print(f"  parent: {rec.parent_name or '-'}")
    kids = rec.children_names
    if kids:
        print(f"  children ({len(kids)}): {', '.join(kids[:12])}{', ...' if len(kids) > 12 else ''}")
    stack = rec.stack
    if stack:
        print(f"  stack ({rec.stack_id}):")
        for frame in stack if isinstance(stack, list) else [stack]:
            for line in printable(str(frame), keep_newlines=True).split("\n"):
                raw_print("    " + line)


def _non_tensors(rec) -> list:
    from msprobe.format.model import MappingArg, SequenceArg, TensorArg

    out = []

    def walk(arg) -> None:
        if isinstance(arg, TensorArg):
            return
        if isinstance(arg, (SequenceArg, MappingArg)):
            items = arg.items.values() if isinstance(arg, MappingArg) else arg.items
            for x in items:
                walk(x)
            return
        out.append((arg.path, json.dumps(arg.raw)))

    for arg in rec.args():
        walk(arg)
    return out
