"""``msprobe lake ls|index|sql|nan|diverge|disagree|trend ROOT``: the runs under a root as one lake."""
from __future__ import annotations

import functools
import json
import os
import sys

from msprobe.format.stats import NORM, STAT_COLUMNS
from msprobe.progress import add_progress_flag, resolve


def _common(parser, *, build: bool = True) -> None:
    parser.add_argument("root", help="the lake root (a directory or URL holding one directory per run)")
    parser.add_argument("--storage-options", default=None, help="JSON object of fsspec storage options")
    parser.add_argument("--json", action="store_true", help="print the answer as JSON")
    parser.add_argument("--lake-dir", default=None,
                   help="where the lake's own files (indexes, manifest, catalog) go (default: ROOT/_lake when ROOT "
                        "can be written, else a cache directory, said on stderr); the dumps are only read")
    parser.add_argument("--lake-storage-options", default=None,
                   help="JSON object of fsspec storage options for --lake-dir (default: those of ROOT for the "
                        "same protocol)")
    if build:
        parser.add_argument("--scheduler", default=None,
                       help="address of a Dask scheduler (tcp://host:8786) to run the tasks on")
        parser.add_argument("--workers", type=int, default=None,
                       help="worker processes of the LocalCluster started for big jobs (default: CPU count)")
        parser.add_argument("--no-cluster", action="store_true", help="never start a LocalCluster: run tasks here")
        parser.add_argument("--refresh", default="missing", choices=["missing", "check", "all", "none"],
                       help="which rank directories to (re)index before answering (default: missing: those "
                            "without an index and those whose dump.json changed since; none: build nothing and "
                            "leave out what is stale)")
        add_progress_flag(parser)


def register(sub) -> None:
    parser = sub.add_parser("lake", help="many runs x steps x ranks as one dataset: catalog, SQL and questions")
    lsub = parser.add_subparsers(dest="lake_command", metavar="QUESTION")
    cmd = lsub.add_parser("ls", help="the run catalog (read from ROOT/_lake/catalog.json; built when absent)")
    _common(cmd)
    cmd.add_argument("--rebuild", action="store_true", help="discover and index before listing")
    cmd.set_defaults(func=run_ls)
    cmd = lsub.add_parser("index", help="discover runs and build the missing Parquet indexes")
    _common(cmd)
    cmd.set_defaults(func=run_index)
    cmd = lsub.add_parser("sql", help="a DuckDB query over the views lake, lake_records, catalog, manifest, comm_calls "
                                      "(communication calls with their level in the step's order), comm_edges")
    _common(cmd)
    cmd.add_argument("query", help='e.g. "SELECT run, count(*) FROM lake GROUP BY run"')
    cmd.add_argument("--csv", default=None, help="write the result to this CSV file too")
    cmd.set_defaults(func=run_sql)
    cmd = lsub.add_parser("nan", help="the first NaN/Inf of each run and rank, in the step's communication order: "
                                      "the first row of a run is its origin (masks' -inf counted apart)")
    _common(cmd)
    cmd.add_argument("--run", action="append", default=None, help="only this run (repeatable)")
    cmd.add_argument("--kind", default="any", choices=["any", "nan", "inf"],
                   help="look for a NaN or an Inf (any, default), NaN only, or Inf only; an attention mask's "
                        "intended -inf is neither")
    cmd.set_defaults(func=run_nan)
    cmd = lsub.add_parser("diverge", help="the first record where two runs diverge, over all ranks (compare)")
    _common(cmd)
    cmd.add_argument("run_a", help="the target run")
    cmd.add_argument("run_b", help="the bench run")
    cmd.add_argument("--step", type=int, default=None)
    cmd.add_argument("--rank", type=int, default=None)
    cmd.add_argument("--mode", default="auto", choices=["auto", "statistics", "md5", "tensor"])
    cmd.add_argument("-o", "--output-path", "--out", dest="out", default=None, help="keep compare's CSVs in this directory")
    cmd.add_argument("--all-steps", action="store_true", help="compare every step, not only up to the first divergence")
    cmd.add_argument("--layout", default=None, metavar="tp=T,pp=P|auto",
                     help="run_a is a parallel run: merge its ranks into its logical model (as compare --layout)")
    cmd.add_argument("--bench-layout", dest="bench_layout", default=None, metavar="tp=T,pp=P|auto",
                     help="the same for run_b")
    cmd.set_defaults(func=run_diverge)
    cmd = lsub.add_parser("disagree", help="ranks whose statistic differs from what a majority of the ranks agree on")
    _common(cmd)
    cmd.add_argument("--run", action="append", default=None)
    cmd.add_argument("--step", type=int, action="append", default=None)
    cmd.add_argument("--kind", default="parameters_grad", help="record kind compared ('all' for every record)")
    cmd.add_argument("--record", default=None, help="a record name or glob")
    cmd.add_argument("--stat", default=NORM.column, choices=list(STAT_COLUMNS))
    cmd.add_argument("--rtol", type=float, default=1e-6)
    cmd.add_argument("--atol", type=float, default=0.0)
    cmd.add_argument("--no-consensus", action="store_true",
                   help="also list the rows where no majority of ranks agree (a DDP run's parameters_grad: "
                        "local gradients, recorded before the all-reduce), with consensus=false")
    cmd.set_defaults(func=run_disagree)
    cmd = lsub.add_parser("trend", help="a record's statistic over steps (table, and a PNG with --plot)")
    _common(cmd)
    cmd.add_argument("record", help="a record name or glob")
    cmd.add_argument("--stat", default=NORM.column, choices=list(STAT_COLUMNS))
    cmd.add_argument("--arg", default=None, help="the argument (output.0, weight.0...; default: output.0 or the first)")
    cmd.add_argument("--run", action="append", default=None)
    cmd.add_argument("--rank", type=int, action="append", default=None)
    cmd.add_argument("--plot", default=None, help="write the plot to this PNG file")
    cmd.set_defaults(func=run_trend)
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])


def _opts(args):
    return json.loads(args.storage_options) if args.storage_options else None


def _lake_opts(args):
    from msprobe.errors import ConfigError

    if not args.lake_storage_options:
        return None
    try:
        opts = json.loads(args.lake_storage_options)
    except ValueError:
        opts = None
    if not isinstance(opts, dict):
        raise ConfigError("--lake-storage-options must be a JSON object")
    return opts


def _open(args):
    import msprobe.lake

    report = getattr(args, "progress", None)  # --progress/--no-progress: the steps and the index count
    progress = None if args.json or not resolve(report) else (lambda what: print(f"lake: {what}", file=sys.stderr))
    lake = msprobe.lake.open(args.root, _opts(args), client=args.scheduler, workers=args.workers,
                             local=False if args.no_cluster else "auto", refresh=args.refresh, progress=progress,
                             report_progress=False if args.json else report,
                             lake_dir=args.lake_dir, lake_storage_options=_lake_opts(args))
    if lake.lake_note and progress is None:  # said by the progress callback otherwise
        print(f"lake: {lake.lake_note}", file=sys.stderr)
    return lake


def _with_lake(handler):
    """``fn(args, lake)`` with the lake opened from the arguments and closed afterwards."""
    @functools.wraps(handler)
    def run(args) -> int:
        lake = _open(args)
        try:
            if not lake.runs:  # a question on a root without a dump: an error, never an empty answer
                raise _no_runs(args.root)
            return handler(args, lake)
        finally:
            lake.close()
    return run


def _no_runs(root: str) -> Exception:
    from msprobe.errors import StorageNotFoundError

    return StorageNotFoundError(f"{root}: no runs (no dump below it; a lake root holds one directory per "
                                "run, e.g. ROOT/run1/step0/rank0/dump.json)")


def _print_table(frame, as_json: bool, empty: str = "") -> int:
    """Print a question's answer; ``empty``: what to say instead of an empty table."""
    if frame.empty and empty and not as_json:
        print(empty)
        return 0
    _print_df(frame, as_json)
    return 0


def _print_df(frame, as_json: bool) -> None:
    if as_json:
        print(frame.to_json(orient="records", indent=1, default_handler=str))
        return
    if frame.empty:
        print("(no rows)")
        return
    import pandas as pd

    from msprobe.cli._text import escape_cells

    with pd.option_context("display.max_rows", 200, "display.max_columns", 50, "display.width", 200):
        print(escape_cells(frame).to_string(index=False))


def _fmt_bytes(size) -> str:
    size = float(size or 0)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(size)


def run_ls(args) -> int:
    from msprobe.lake import read_catalog

    runs = None if args.rebuild else read_catalog(args.root, _opts(args), args.lake_dir, _lake_opts(args))
    if runs is not None and _catalog_hint(args.root, _opts(args), {str(run.get("run")) for run in runs}, args.json):
        runs = None  # stale: read the runs again, as sql and the questions do
    if runs is None:
        lake = _open(args)
        runs = lake.catalog_rows
        lake.close()
    if args.json:
        print(json.dumps(runs, indent=1, default=str))
        return 0
    if not runs:
        raise _no_runs(args.root)
    from msprobe.format.naming import printable

    head = ["run", "dialect", "framework", "task", "level", "steps", "ranks", "records", "bytes", "from", "to"]
    rows = [[printable(str(run.get("run"))), str(run.get("dialect")), str(run.get("framework")), str(run.get("task")),
             str(run.get("level")), f"{run.get('steps')} ({run.get('step_min')}-{run.get('step_max')})",
             str(run.get("ranks")), str(run.get("records")), _fmt_bytes(run.get("bytes")), str(run.get("time_start")),
             str(run.get("time_end"))] for run in runs]
    widths = [max(len(title), *(len(cells[column]) for cells in rows)) for column, title in enumerate(head)]
    print("  ".join(title.ljust(width) for title, width in zip(head, widths)))
    for cells in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(cells, widths)))
    return 0


def _catalog_hint(root: str, opts, listed: set, quiet: bool) -> bool:
    """Whether the saved catalog is stale (runs it misses or still lists), said on stderr
    (unless ``quiet``) either way."""
    from msprobe.backends import open_store
    from msprobe.errors import MsprobeError

    try:
        names = {name.rstrip("/") for name in open_store(root, storage_options=opts, read_only=True, create=False)
                 .list_dir("") if not name.startswith(("_", "."))}
    except (MsprobeError, OSError):
        names = None
    new, gone = (sorted(names - listed), sorted(listed - names)) if names is not None else ([], [])
    if new or gone:
        what = "; ".join(part for part in (f"not in it: {', '.join(new[:5])}" if new else "",
                                           f"gone: {', '.join(gone[:5])}" if gone else "") if part)
        if not quiet:
            print(f"lake ls: the saved catalog was stale ({what}): reading the runs again", file=sys.stderr)
        return True
    if not quiet:
        print(f"lake ls: from the saved catalog (msprobe lake ls {root} --rebuild re-reads the runs)", file=sys.stderr)
    return False


@_with_lake
def run_index(args, lake) -> int:
    stats = dict(lake.stats, seconds=round(lake.timings["total_s"], 3))
    print(json.dumps(stats) if args.json else
          f"{stats['runs']} run(s), {stats['rank_dirs']} rank dir(s): indexed {stats['indexed']}, "
          f"recovered {stats['recovered']}, removed {stats['removed']}, compacted {stats['compacted']} step(s) "
          f"({stats['executor']}, {stats['seconds']} s)")
    return 0


@_with_lake
def run_sql(args, lake) -> int:
    frame = lake.sql(args.query)
    if frame is None:
        return 0
    if args.csv:
        frame.to_csv(args.csv, index=False)
    return _print_table(frame, args.json)


@_with_lake
def run_nan(args, lake) -> int:
    frame = lake.first_nan(run=args.run, kind=args.kind)
    what = {"any": "no NaN or Inf", "nan": "no NaN", "inf": "no Inf"}[args.kind]
    shown = frame if args.json else frame.drop(columns=["path"])
    status = _print_table(shown, args.json, f"{what} in any statistic")
    if not args.json:
        from msprobe.format.naming import printable
        from msprobe.view.links import fragment, link_to

        for row in frame[frame["origin"]].itertuples():  # each run's first, in its step's happens-before order
            print(f"origin ({printable(str(row.run))}): step {row.step} {printable(str(row.rank_dir))} "
                  f"{printable(str(row.record))} {row.arg_path} ({row.kind}, first in the step's communication order)")
            print(f"  path: {printable(str(row.path))}")
            # a running msprobe view of the lake (or of that run) opens the record: its link
            link = link_to([args.root, os.path.join(str(args.root), str(row.run))],
                           fragment("record", run=row.run, step=row.step, rank=row.rank_dir, record=row.record))
            if link:
                print(f"  view: {link}")
    for masked in frame.attrs.get("masked_only", ()):
        print(f"note: {masked['run']} {masked['rank_dir']}: -inf only in attention masks and what they feed "
              f"({masked['masked_rows']} rows, as intended)", file=sys.stderr if args.json else sys.stdout)
    return status


@_with_lake
def run_diverge(args, lake) -> int:
    res = lake.diverge(args.run_a, args.run_b, step=args.step, rank=args.rank, mode=args.mode, out=args.out,
                       all_steps=args.all_steps, layout=args.layout, bench_layout=args.bench_layout)
    if args.json:
        print(json.dumps(res, indent=1, default=str))
        return 0
    first = res["first_divergence"]
    print(f"{res['run_a']} vs {res['run_b']} ({res['mode']}): {res['pairs_compared']} rank pair(s) in "
          f"step(s) {res['steps_compared']}")
    origin = res.get("origin")
    if origin is not None:
        from msprobe.compare import describe

        print(f"error enters at: step {origin['step']} {origin['rank_dir']} {describe(origin)} "
              f"(record #{origin['record_index']})")
        held = origin.get("layout")
        if held:
            print(f"  held by ranks {held['ranks']}" + (f"; suspect ranks {held['suspect_ranks']} (a shard that "
                  f"cannot be a piece of the bench's tensor)" if held["suspect_ranks"] else ""))
    if first is None:
        print("no divergence" if origin is None else "no row whose Result is not pass")
        return 0
    print(f"first divergence: step {first['step']} {first['rank_dir']} record {first['record']} (row {first['row']}, "
          f"record #{first['record_index']}, {first['result']})")
    nre = first["metrics"].get(NORM.relative)
    if nre is not None:
        print(f"  NormRelativeErr {nre}")
    if len(res["ranks"]) > 1:
        print("diverging ranks of that step:")
        for diverging in res["ranks"]:
            print(f"  step {diverging['step']} {diverging['rank_dir']}: {diverging['record']} "
                  f"(record #{diverging['record_index']})")
    return 0


@_with_lake
def run_disagree(args, lake) -> int:
    frame = lake.disagree(run=args.run, step=args.step, kind=None if args.kind == "all" else args.kind,
                       record=args.record, stat=args.stat, rtol=args.rtol, atol=args.atol,
                       no_consensus=args.no_consensus)
    note = frame.attrs.get("note")
    if note:  # what was compared and what was left out: on stderr with --json, after the table otherwise
        print(f"note: {note}", file=sys.stderr if args.json else sys.stdout)
    if frame.empty and frame.attrs.get("compared") == 0:
        kind = "" if args.kind == "all" else f" {args.kind}"
        print(f"nothing to compare: no{kind} record's {args.stat} is held by two or more ranks of the same run and "
              "step (each run and step selected has one rank)", file=sys.stderr if args.json else sys.stdout)
        if args.json:
            print("[]")
        return 0
    return _print_table(frame, args.json, "no rank disagrees with the others" if note else
                        f"every rank agrees ({frame.attrs.get('compared')} rows held by 2+ ranks compared)")


@_with_lake
def run_trend(args, lake) -> int:
    frame = lake.trend(args.record, stat=args.stat, arg=args.arg, run=args.run, rank=args.rank, plot=args.plot)
    if args.json:
        print(json.dumps({"record": args.record, "arg": frame.attrs["arg"], "stat": args.stat,
                          "plot": frame.attrs["plot"],
                          "plot_note": frame.attrs["plot_note"], "rows": json.loads(frame.to_json(orient="records"))},
                         indent=1))
        return 0
    cols = ["run", "rank_dir"] + (["record"] if len(frame.attrs["records"]) > 1 else [])
    if frame.groupby(["run", "rank_dir"]).ngroups > 12:  # many ranks: their spread, per run (and record)
        wide = frame.groupby(["step"] + cols[::2])["value"].agg(["mean", "min", "max"]).unstack(cols[::2])
    else:  # one column per run, rank directory (and matched record): never merged
        wide = frame.pivot_table(index="step", columns=cols, values="value", aggfunc="first", dropna=False)
    wide.index = wide.index.astype("Int64")
    print(f"{args.record} {frame.attrs['arg']} {args.stat} by step"
          + (f" ({len(frame.attrs['records'])} records):" if len(frame.attrs["records"]) > 1 else ":"))
    import pandas as pd

    from msprobe.format.naming import printable

    # the columns are run and rank directory names from the dumps: escaped, a label per line
    wide.columns = wide.columns.map(lambda label: tuple(printable(str(part)) for part in label)
                                    if isinstance(label, tuple)
                                    else printable(str(label)))
    with pd.option_context("display.max_columns", 20, "display.width", 200):
        print(wide.to_string())
    if frame.attrs["plot"]:
        print(f"plot: {frame.attrs['plot']}")
    elif args.plot:
        print(f"no plot: {frame.attrs['plot_note']}", file=sys.stderr)
    return 0
