"""``msprobe view PATH [BENCH]`` (a local explorer server) and ``msprobe report PATH [BENCH] -o FILE``
(the same views as one self-contained HTML file)."""
from __future__ import annotations

import json


def _common(p) -> None:
    p.add_argument("path", help="a dump (root, step or rank directory), a lake index or a compare output (path or URL)")
    p.add_argument("bench", nargs="?", default=None, help="the bench dump: the pair is compared on the fly")
    p.add_argument("--divergence-threshold", type=float, default=None, metavar="FRACTION",
                   help="the first divergence is the first row whose NormRelativeErr exceeds this "
                        "(default: the first row whose Result is not pass)")
    p.add_argument("--storage-options", default=None, help="JSON object of fsspec storage options")
    p.add_argument("--layout", default=None, metavar="tp=T,pp=P|auto",
                   help="with BENCH: PATH is a parallel run, compared and shown as its merged logical model "
                        "(as compare --layout)")
    p.add_argument("--bench-layout", dest="bench_layout", default=None, metavar="tp=T,pp=P|auto",
                   help="the same for BENCH")
    p.add_argument("--work-dir", default=None,
                   help="where the compare output and the view's tables go (default: a temporary directory)")
    p.add_argument("-am", "--api_mapping", dest="api_mapping", nargs="?", const=True, default=None,
                   help="a MindSpore dump against a PyTorch bench: compare's -am [api_mapping.yaml] (the built-in "
                        "API and Cell mappings apply by default to such a pair)")
    p.add_argument("-cm", "--cell_mapping", dest="cell_mapping", nargs="?", const=True, default=None,
                   help="compare's -cm [cell_mapping.yaml]")
    p.add_argument("-lm", "--layer_mapping", dest="layer_mapping", default=None, help="compare's -lm layer_mapping.yaml")


def register(sub) -> None:
    p = sub.add_parser("view", help="explore a dump, a pair, a lake or a compare output in the browser")
    _common(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    p.set_defaults(func=run_view)
    r = sub.add_parser("report", help="write the explorer's views as one self-contained HTML file")
    _common(r)
    r.add_argument("-o", "--output", required=True, help="the HTML file to write")
    r.add_argument("--max-rows", type=int, default=None, help="rows kept per step and rank (default 20000)")
    r.set_defaults(func=run_report)


def _open(args, stage=None, first_look=None):
    from msprobe.view import open_view

    opts = json.loads(args.storage_options) if args.storage_options else None
    flags: list = []
    for flag, value in (("-am", args.api_mapping), ("-cm", args.cell_mapping), ("-lm", args.layer_mapping)):
        if value is not None:
            flags += [flag] if value is True else [flag, value]
    return open_view(args.path, args.bench, storage_options=opts, work_dir=args.work_dir,
                     threshold=args.divergence_threshold, layout=args.layout, bench_layout=args.bench_layout,
                     compare_flags=flags, stage=stage, first_look=first_look)


def run_view(args) -> int:
    import sys

    from msprobe.cli._text import say
    from msprobe.view import serve

    def announce(line: str) -> None:
        say(line)
        sys.stdout.flush()

    def load(stage, look=None):  # in the server's set-up thread: the page is served meanwhile, with its
        return _open(args, stage, look)  # progress, and a first look as soon as one is made

    load.paths = [args.path, args.bench]  # type: ignore[attr-defined]
    load.first_look = True  # type: ignore[attr-defined]
    serve(host=args.host, port=args.port, announce=announce, loader=load,
          progress=lambda line: print(line, file=sys.stderr, flush=True))
    return 0


def run_report(args) -> int:
    from msprobe.cli._text import say
    from msprobe.view import MAX_ROWS_PER_CELL, write_report

    data = _open(args)
    try:
        out = write_report(data, args.output, args.max_rows or MAX_ROWS_PER_CELL)
    finally:
        data.close()
    say(f"report: {out}")
    return 0
