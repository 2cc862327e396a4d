"""``msprobe lake ls|index|sql|nan|diverge|disagree|trend ROOT``: the runs under a root as one lake."""
from __future__ import annotations

import functools
import json
import sys

from msprobe.progress import add_progress_flag, resolve


def _common(p, *, build: bool = True) -> None:
    p.add_argument("root", help="the lake root (a directory or URL holding one directory per run)")
    p.add_argument("--storage-options", default=None, help="JSON object of fsspec storage options")
    p.add_argument("--json", action="store_true", help="print the answer as JSON")
    p.add_argument("--lake-dir", default=None,
                   help="where the lake's own files (indexes, manifest, catalog) go (default: ROOT/_lake when ROOT "
                        "can be written, else a cache directory, said on stderr); the dumps are only read")
    p.add_argument("--lake-storage-options", default=None,
                   help="JSON object of fsspec storage options for --lake-dir (default: those of ROOT for the "
                        "same protocol)")
    if build:
        p.add_argument("--scheduler", default=None,
                       help="address of a Dask scheduler (tcp://host:8786) to run the tasks on")
        p.add_argument("--workers", type=int, default=None,
                       help="worker processes of the LocalCluster started for big jobs (default: CPU count)")
        p.add_argument("--no-cluster", action="store_true", help="never start a LocalCluster: run tasks here")
        p.add_argument("--refresh", default="missing", choices=["missing", "check", "all", "none"],
                       help="which rank directories to (re)index before answering (default: missing: those "
                            "without an index and those whose dump.json changed since; none: build nothing and "
                            "leave out what is stale)")
        add_progress_flag(p)


def register(sub) -> None:
    p = sub.add_parser("lake", help="many runs x steps x ranks as one dataset: catalog, SQL and questions")
    lsub = p.add_subparsers(dest="lake_command", metavar="QUESTION")
    q = lsub.add_parser("ls", help="the run catalog (read from ROOT/_lake/catalog.json; built when absent)")
    _common(q)
    q.add_argument("--rebuild", action="store_true", help="discover and index before listing")
    q.set_defaults(func=run_ls)
    q = lsub.add_parser("index", help="discover runs and build the missing Parquet indexes")
    _common(q)
    q.set_defaults(func=run_index)
    q = lsub.add_parser("sql", help="a DuckDB query over the views lake, lake_records, catalog, manifest")
    _common(q)
    q.add_argument("query", help='e.g. "SELECT run, count(*) FROM lake GROUP BY run"')
    q.add_argument("--csv", default=None, help="write the result to this CSV file too")
    q.set_defaults(func=run_sql)
    q = lsub.add_parser("nan", help="the first NaN/Inf of each run and rank (attention masks' -inf counted apart)")
    _common(q)
    q.add_argument("--run", action="append", default=None, help="only this run (repeatable)")
    q.add_argument("--kind", default="any", choices=["any", "nan", "inf"],
                   help="look for a NaN or an Inf (any, default), NaN only, or Inf only; an attention mask's "
                        "intended -inf is neither")
    q.set_defaults(func=run_nan)
    q = lsub.add_parser("diverge", help="the first record where two runs diverge, over all ranks (compare)")
    _common(q)
    q.add_argument("run_a", help="the target run")
    q.add_argument("run_b", help="the bench run")
    q.add_argument("--step", type=int, default=None)
    q.add_argument("--rank", type=int, default=None)
    q.add_argument("--mode", default="auto", choices=["auto", "statistics", "md5", "tensor"])
    q.add_argument("-o", "--output-path", "--out", dest="out", default=None, help="keep compare's CSVs in this directory")
    q.add_argument("--all-steps", action="store_true", help="compare every step, not only up to the first divergence")
    q.set_defaults(func=run_diverge)
    q = lsub.add_parser("disagree", help="ranks whose statistic differs from what a majority of the ranks agree on")
    _common(q)
    q.add_argument("--run", action="append", default=None)
    q.add_argument("--step", type=int, action="append", default=None)
    q.add_argument("--kind", default="parameters_grad", help="record kind compared ('all' for every record)")
    q.add_argument("--record", default=None, help="a record name or glob")
    q.add_argument("--stat", default="norm", choices=["max", "min", "mean", "norm"])
    q.add_argument("--rtol", type=float, default=1e-6)
    q.add_argument("--atol", type=float, default=0.0)
    q.add_argument("--no-consensus", action="store_true",
                   help="also list the rows where no majority of ranks agree (a DDP run's parameters_grad: "
                        "local gradients, recorded before the all-reduce), with consensus=false")
    q.set_defaults(func=run_disagree)
    q = lsub.add_parser("trend", help="a record's statistic over steps (table, and a PNG with --plot)")
    _common(q)
    q.add_argument("record", help="a record name or glob")
    q.add_argument("--stat", default="norm", choices=["max", "min", "mean", "norm"])
    q.add_argument("--arg", default=None, help="the argument (output.0, weight.0...; default: output.0 or the first)")
    q.add_argument("--run", action="append", default=None)
    q.add_argument("--rank", type=int, action="append", default=None)
    q.add_argument("--plot", default=None, help="write the plot to this PNG file")
    q.set_defaults(func=run_trend)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


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


def _with_lake(fn):
    """``fn(args, lake)`` with the lake opened from the arguments and closed afterwards."""
    @functools.wraps(fn)
    def run(args) -> int:
        lake = _open(args)
        try:
            return fn(args, lake)
        finally:
            lake.close()
    return run


def _print_table(df, as_json: bool, empty: str = "") -> int:
    """Print a question's answer; ``empty``: what to say instead of an empty table."""
    if df.empty and empty and not as_json:
        print(empty)
        return 0
    _print_df(df, as_json)
    return 0


def _print_df(df, as_json: bool) -> None:
    if as_json:
        print(df.to_json(orient="records", indent=1, default_handler=str))
        return
    if df.empty:
        print("(no rows)")
        return
    import pandas as pd

    from msprobe.cli._text import escape_cells

    with pd.option_context("display.max_rows", 200, "display.max_columns", 50, "display.width", 200):
        print(escape_cells(df).to_string(index=False))


def _fmt_bytes(n) -> str:
    n = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def run_ls(args) -> int:
    from msprobe.lake import read_catalog

    runs = None if args.rebuild else read_catalog(args.root, _opts(args), args.lake_dir, _lake_opts(args))
    if runs is not None and _catalog_hint(args.root, _opts(args), {str(r.get("run")) for r in runs}, args.json):
        runs = None  # stale: read the runs again, as sql and the questions do
    if runs is None:
        lake = _open(args)
        runs = lake.catalog_rows
        lake.close()
    if args.json:
        print(json.dumps(runs, indent=1, default=str))
        return 0
    if not runs:
        from msprobe.errors import StorageNotFoundError

        raise StorageNotFoundError(f"{args.root}: no runs (no dump below it; a lake root holds one directory per "
                                   "run, e.g. ROOT/run1/step0/rank0/dump.json)")
    from msprobe.format.naming import printable

    head = ["run", "dialect", "framework", "task", "level", "steps", "ranks", "records", "bytes", "from", "to"]
    rows = [[printable(str(r.get("run"))), str(r.get("dialect")), str(r.get("framework")), str(r.get("task")), str(r.get("level")),
             f"{r.get('steps')} ({r.get('step_min')}-{r.get('step_max')})", str(r.get("ranks")), str(r.get("records")),
             _fmt_bytes(r.get("bytes")), str(r.get("time_start")), str(r.get("time_end"))] for r in runs]
    widths = [max(len(h), *(len(x[i]) for x in rows)) for i, h in enumerate(head)]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    for x in rows:
        print("  ".join(v.ljust(w) for v, w in zip(x, widths)))
    return 0


def _catalog_hint(root: str, opts, listed: set, quiet: bool) -> bool:
    """Whether the saved catalog is stale (runs it misses or still lists), said on stderr
    (unless ``quiet``) either way."""
    from msprobe.backends import open_store
    from msprobe.errors import MsprobeError

    try:
        names = {n.rstrip("/") for n in open_store(root, storage_options=opts, read_only=True, create=False)
                 .list_dir("") if not n.startswith(("_", "."))}
    except (MsprobeError, OSError):
        names = None
    new, gone = (sorted(names - listed), sorted(listed - names)) if names is not None else ([], [])
    if new or gone:
        what = "; ".join(x for x in (f"not in it: {', '.join(new[:5])}" if new else "",
                                     f"gone: {', '.join(gone[:5])}" if gone else "") if x)
        if not quiet:
            print(f"lake ls: the saved catalog was stale ({what}): reading the runs again", file=sys.stderr)
        return True
    if not quiet:
        print(f"lake ls: from the saved catalog (msprobe lake ls {root} --rebuild re-reads the runs)", file=sys.stderr)
    return False


@_with_lake
def run_index(args, lake) -> int:
    s = dict(lake.stats, seconds=round(lake.timings["total_s"], 3))
    print(json.dumps(s) if args.json else
          f"{s['runs']} run(s), {s['rank_dirs']} rank dir(s): indexed {s['indexed']}, "
          f"recovered {s['recovered']}, removed {s['removed']}, compacted {s['compacted']} step(s) "
          f"({s['executor']}, {s['seconds']} s)")
    return 0


@_with_lake
def run_sql(args, lake) -> int:
    df = lake.sql(args.query)
    if df is None:
        return 0
    if args.csv:
        df.to_csv(args.csv, index=False)
    return _print_table(df, args.json)


@_with_lake
def run_nan(args, lake) -> int:
    df = lake.first_nan(run=args.run, kind=args.kind)
    what = {"any": "no NaN or Inf", "nan": "no NaN", "inf": "no Inf"}[args.kind]
    rc = _print_table(df, args.json, f"{what} in any statistic")
    for m in df.attrs.get("masked_only", ()):
        print(f"note: {m['run']} {m['rank_dir']}: -inf only in attention masks and what they feed "
              f"({m['masked_rows']} rows, as intended)", file=sys.stderr if args.json else sys.stdout)
    return rc


@_with_lake
def run_diverge(args, lake) -> int:
    res = lake.diverge(args.run_a, args.run_b, step=args.step, rank=args.rank, mode=args.mode, out=args.out,
                       all_steps=args.all_steps)
    if args.json:
        print(json.dumps(res, indent=1, default=str))
        return 0
    f = res["first_divergence"]
    print(f"{res['run_a']} vs {res['run_b']} ({res['mode']}): {res['pairs_compared']} rank pair(s) in "
          f"step(s) {res['steps_compared']}")
    o = res.get("origin")
    if o is not None:
        from msprobe.compare._origin import describe

        print(f"error introduced at: step {o['step']} {o['rank_dir']} {describe(o)} (record #{o['record_index']})")
    if f is None:
        print("no divergence" if o is None else "no row whose Result is not pass")
        return 0
    print(f"first divergence: step {f['step']} {f['rank_dir']} record {f['record']} (row {f['row']}, "
          f"record #{f['record_index']}, {f['result']})")
    nre = f["metrics"].get("NormRelativeErr")
    if nre is not None:
        print(f"  NormRelativeErr {nre}")
    if len(res["ranks"]) > 1:
        print("diverging ranks of that step:")
        for r in res["ranks"]:
            print(f"  step {r['step']} {r['rank_dir']}: {r['record']} (record #{r['record_index']})")
    return 0


@_with_lake
def run_disagree(args, lake) -> int:
    df = lake.disagree(run=args.run, step=args.step, kind=None if args.kind == "all" else args.kind,
                       record=args.record, stat=args.stat, rtol=args.rtol, atol=args.atol,
                       no_consensus=args.no_consensus)
    note = df.attrs.get("note")
    if note:  # what was compared and what was left out: on stderr with --json, after the table otherwise
        print(f"note: {note}", file=sys.stderr if args.json else sys.stdout)
    if df.empty and df.attrs.get("compared") == 0:
        kind = "" if args.kind == "all" else f" {args.kind}"
        print(f"nothing to compare: no{kind} record's {args.stat} is held by two or more ranks of the same run and "
              "step (each run and step selected has one rank)", file=sys.stderr if args.json else sys.stdout)
        if args.json:
            print("[]")
        return 0
    return _print_table(df, args.json, "no rank disagrees with the others" if note else
                        f"every rank agrees ({df.attrs.get('compared')} rows held by 2+ ranks compared)")


@_with_lake
def run_trend(args, lake) -> int:
    df = lake.trend(args.record, stat=args.stat, arg=args.arg, run=args.run, rank=args.rank, plot=args.plot)
    if args.json:
        print(json.dumps({"record": args.record, "arg": df.attrs["arg"], "stat": args.stat, "plot": df.attrs["plot"],
                          "plot_note": df.attrs["plot_note"], "rows": json.loads(df.to_json(orient="records"))},
                         indent=1))
        return 0
    cols = ["run", "rank_dir"] + (["record"] if len(df.attrs["records"]) > 1 else [])
    if df.groupby(["run", "rank_dir"]).ngroups > 12:  # many ranks: their spread, per run (and record)
        wide = df.groupby(["step"] + cols[::2])["value"].agg(["mean", "min", "max"]).unstack(cols[::2])
    else:  # one column per run, rank directory (and matched record): never merged
        wide = df.pivot_table(index="step", columns=cols, values="value", aggfunc="first", dropna=False)
    wide.index = wide.index.astype("Int64")
    print(f"{args.record} {df.attrs['arg']} {args.stat} by step"
          + (f" ({len(df.attrs['records'])} records):" if len(df.attrs["records"]) > 1 else ":"))
    import pandas as pd

    from msprobe.format.naming import printable

    # the columns are run and rank directory names from the dumps: escaped, a label per line
    wide.columns = wide.columns.map(lambda c: tuple(printable(str(x)) for x in c) if isinstance(c, tuple)
                                    else printable(str(c)))
    with pd.option_context("display.max_columns", 20, "display.width", 200):
        print(wide.to_string())
    if df.attrs["plot"]:
        print(f"plot: {df.attrs['plot']}")
    elif args.plot:
        print(f"no plot: {df.attrs['plot_note']}", file=sys.stderr)
    return 0
