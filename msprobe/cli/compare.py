"""``msprobe compare TARGET BENCH [-o OUT]``: compare two dumps.

Also the real tool's command lines: 26.x ``msprobe compare -tp T -gp G -o OUT`` (T and G a step or
rank directory or a dump.json) and 8.x ``msprobe -f pytorch|mindspore compare -i compare.json -o OUT
[-s] [-c] [-f] [-dm data_mapping.yaml] [-am [api_mapping.yaml]] [-cm [cell_mapping.yaml]]
[-lm layer_mapping.yaml]``: the last three compare a MindSpore target with a PyTorch bench.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Optional

from msprobe.cli._text import say
from msprobe.progress import add_progress_flag


def register(sub) -> None:
    p = sub.add_parser("compare", help="compare a target dump with a bench dump (statistics, md5 or tensor)")
    p.add_argument("target", nargs="?", help="target dump: root, step or rank directory, dump.json, or URL")
    p.add_argument("bench", nargs="?", help="bench (golden) dump")
    p.add_argument("-tp", "--target_path", "--target-path", dest="target_path", default=None,
                   help="target dump (the real tool's spelling)")
    p.add_argument("-gp", "--golden_path", "--golden-path", dest="golden_path", default=None,
                   help="bench dump (the real tool's spelling)")
    p.add_argument("-i", "--input_path", "--input-path", dest="input_path", default=None,
                   help="8.x compare.json: npu_path, bench_path (dump.json files or step directories), "
                        "optional stack_path, is_print_compare_log")
    p.add_argument("-o", "--output_path", "--output-path", "--out", dest="out", default="./output",
                   help="output directory (default ./output, as the real tool)")
    p.add_argument("-s", "--stack_mode", dest="stack_mode", action="store_true",
                   help="with -i and a stack_path: show NPU_Stack_Info (without stack_path it is shown when "
                        "the target has stack.json, as 8.x does)")
    p.add_argument("-c", "--compare_only", dest="compare_only", action="store_true",
                   help="only the result tables: no first-divergence analysis printed")
    p.add_argument("-f", "-fm", "--fuzzy_match", dest="fuzzy", action="store_true",
                   help="records still unmatched pair with those of the same API/module whose call count differs")
    p.add_argument("-dm", "--data_mapping", dest="data_mapping", default=None,
                   help="YAML file of 'target row name: bench row name' pairs")
    p.add_argument("-am", "--api_mapping", dest="api_mapping", nargs="?", const=True, default=None,
                   help="MindSpore target against PyTorch bench: API records match through the built-in "
                        "MindSpore-PyTorch API mapping, overridden by api_mapping.yaml when given")
    p.add_argument("-cm", "--cell_mapping", dest="cell_mapping", nargs="?", const=True, default=None,
                   help="MindSpore target against PyTorch bench: Cell records match Module records (Cell -> "
                        "Module, and the renames of cell_mapping.yaml when given)")
    p.add_argument("-lm", "--layer_mapping", dest="layer_mapping", default=None,
                   help="MindSpore target against PyTorch bench: cells and APIs match under the layer renames "
                        "of layer_mapping.yaml")
    p.add_argument("--xlsx", action="store_true", help="also write .xlsx files (needs openpyxl)")
    p.add_argument("--rank", type=int, default=None, help="compare only this rank")
    p.add_argument("--step", type=int, default=None, help="compare only this step")
    p.add_argument("--mode", default="auto", choices=["auto", "statistics", "md5", "tensor"],
                   help="compare mode (default: from the dumps; a mode the dumps cannot support is refused)")
    p.add_argument("-n", "--workers", type=int, default=1, help="processes for multi-rank/multi-step compares")
    p.add_argument("--scheduler", default=None,
                   help="run the rank pairs as tasks on the Dask cluster at this address (tcp://host:port)")
    p.add_argument("--match", default="auto", choices=["auto", "names", "structure"],
                   help="record matching: names, then the construct tree when call counts differ (auto); "
                        "names only; or always the tree")
    add_progress_flag(p)
    p.add_argument("--no-plot", action="store_true", help="skip the PNG plot")
    p.add_argument("--storage-options", default=None, help="JSON object of fsspec storage options")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--divergence-threshold", dest="threshold", type=float, default=None, metavar="T",
                   help="the first divergence is the first row whose NormRelativeErr exceeds T (a fraction, "
                        "e.g. 1e-3) instead of the first row whose Result is not pass")
    p.add_argument("--layout", default=None, metavar="tp=T,pp=P[,dp=D][,order=tp-cp-ep-dp-pp]",
                   help="the target is a parallel run: merge its ranks into its logical model (pipeline stages "
                        "in model order, tensor-parallel shards merged) before comparing (statistics mode); auto: the "
                        "layout the dump's all_reduce groups and send/recv peers describe")
    p.add_argument("--bench-layout", dest="bench_layout", default=None, metavar="tp=T,pp=P",
                   help="the same for the bench")
    p.add_argument("--fail-on-divergence", action="store_true",
                   help="exit 3 when there is a first divergence (by default: a row whose Result is not pass, "
                        "the 10x rule's rows at float round-off passed over)")
    p.set_defaults(func=run, subparser=p)


_STRING_OR_COMMENT = re.compile(r'("(?:\\.|[^"\\])*")|#[^\n]*')


def _strip_comments(text: str) -> str:
    """The text without ``#`` comments outside strings (the docs' compare.json examples carry them)."""
    return _STRING_OR_COMMENT.sub(lambda m: m.group(1) or "", text)


def read_compare_json(path: str) -> dict:
    """The 8.x compare.json (``#`` comments allowed); ConfigError when unreadable or incomplete."""
    from msprobe.backends import local_path_of
    from msprobe.errors import ConfigError, read_json_object

    cfg = read_json_object(path, "-i", preprocess=_strip_comments)
    for key in ("npu_path", "bench_path"):
        if not isinstance(cfg.get(key), str) or not cfg[key]:
            raise ConfigError(f"-i {path}: '{key}' (a dump.json file or a step directory) is required")
    stack = cfg.get("stack_path")
    if stack is not None and not isinstance(stack, str):
        raise ConfigError(f"-i {path}: 'stack_path' must be a path")
    local_stack = local_path_of(stack) if stack else None
    if local_stack is not None and not os.path.isfile(local_stack):
        raise ConfigError(f"-i {path}: stack_path {stack} does not exist")
    return cfg


def read_data_mapping(path: str) -> dict:
    """{target row name: bench row name} from a data-mapping YAML file."""
    from msprobe.compare.merge import read_yaml
    from msprobe.errors import ConfigError

    m = read_yaml(path, "-dm")
    if m is None:
        m = {}
    if not isinstance(m, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in m.items()):
        raise ConfigError(f"-dm {path}: expected 'target row name: bench row name' lines")
    return m


def read_xframe(args: argparse.Namespace) -> Optional[dict]:
    """The cross-framework options of -am/-cm/-lm (None when none is given)."""
    from msprobe.compare import read_api_mapping, read_cell_mapping, read_layer_mapping

    out: dict = {}
    for name, reader in (("api", read_api_mapping), ("cell", read_cell_mapping), ("layer", read_layer_mapping)):
        given = getattr(args, f"{name}_mapping")
        if given is not None:
            out[name] = reader(given) if isinstance(given, str) else {}
    return out or None


def run(args: argparse.Namespace) -> int:
    from msprobe.compare import compare
    from msprobe.errors import ConfigError

    xframe = read_xframe(args)
    stack = True
    if args.input_path:
        if args.target or args.bench or args.target_path or args.golden_path:
            raise ConfigError("-i compare.json names both dumps: give no other dump paths")
        cfg = read_compare_json(args.input_path)
        target, bench = cfg["npu_path"], cfg["bench_path"]
        # 8.x: with a stack_path, -s decides; without one, stacks show when the dump has them
        stack = bool(args.stack_mode) if cfg.get("stack_path") else True
    else:
        target = args.target_path or args.target
        bench = args.golden_path or args.bench
        if args.target_path and args.target and not args.bench:
            bench = bench or args.target
    if not target or not bench:
        args.subparser.print_usage(sys.stderr)
        print("msprobe compare: error: a target and a bench dump are needed (TARGET BENCH, -tp T -gp G, "
              "or -i compare.json)", file=sys.stderr)
        return 2
    mapping = read_data_mapping(args.data_mapping) if args.data_mapping else None
    opts = json.loads(args.storage_options) if args.storage_options else None
    s = compare(target, bench, args.out, step=args.step, rank=args.rank, mode=args.mode, xlsx=args.xlsx,
                workers=max(1, args.workers), plot=not args.no_plot, storage_options=opts,
                scheduler=args.scheduler, progress=args.progress,
                structural={"auto": "auto", "names": False, "structure": True}[args.match],
                fuzzy=args.fuzzy, stack=stack, mapping=mapping, threshold=args.threshold, layout=args.layout,
                bench_layout=args.bench_layout, xframe=xframe)
    for line in s.get("warnings", ()):
        print(f"msprobe compare: warning: {line}", file=sys.stderr)
    if args.json:
        print(json.dumps(s, indent=1, default=str))
    else:
        _print_summary(s, target, bench, analysis=not args.compare_only)
    return 3 if args.fail_on_divergence and s["first_divergence"] else 0


def _print_summary(s: dict, target: str, bench: str, analysis: bool) -> None:
    say(f"msprobe compare ({s['mode']}, {s['backend']}): {target} vs {bench}")
    for r in s["pairs"]:
        res = ", ".join(f"{k} {v}" for k, v in sorted(r["results"].items()))
        say(f"  step {r['step']} {r['rank_dir']} vs {r['bench_rank_dir']}: {r['rows']} rows ({res}); "
              f"records {r['matched_records']}/{r['records']} matched, {r['unmatched_bench_records']} "
              f"bench-only -> {os.path.basename(r['files'][0])}")
        mb = r["matched_by"]
        if mb.get("mapping") is not None:
            say(f"    MindSpore against PyTorch: matched by name {mb['exact']}, through the API/Cell/layer "
                f"mappings {mb['mapping']}; records without a counterpart stay unmatched")
        elif mb.get("structural") or mb.get("dialect") or mb.get("fuzzy"):
            say(f"    matched by name {mb['exact']}, across dialects {mb['dialect']}, by structure "
                  f"{mb['structural']}" + (f", fuzzy {mb['fuzzy']}" if mb.get("fuzzy") else ""))
    if analysis:
        _print_divergence(s, target)
        for side in ("target", "bench"):
            parts = []
            for k, label in (("nan", "NaN"), ("inf", "+/-Inf")):
                nf = s.get(f"first_{k}_{side}")
                parts.append(f"first {label} in {side}: " + (f"{nf['row']} (step {nf['step']}, {_place(nf)})" if nf else "none"))
            masked = s.get(f"masked_inf_{side}", 0)
            if masked:
                parts.append(f"-inf only in masked_fill outputs and the masks they feed: {masked} rows, as intended")
            say("; ".join(parts))
    _print_layout(s.get("layout"))
    if s.get("plot_note"):
        say(f"note: {s['plot_note']}")
    say(f"summary: {s['summary_file']}")


def _place(answer: dict) -> str:
    """Where an answer is: its rank directory, and on a merged layout the ranks holding the record
    (and the one whose shard or replica alone carries the anomaly)."""
    if answer.get("ranks") is None:
        return str(answer["rank_dir"])
    suspects = answer.get("suspect_ranks") or []
    return f"{answer['rank_dir']} ranks {answer['ranks']}" + (f", on rank {suspects}" if suspects and
                                                               suspects != answer["ranks"] else "")


def _print_layout(layout: Optional[dict]) -> None:
    """The merged models (stages, communication records left out, replicas that disagree) and the
    ranks behind the origin of the divergence."""
    if not layout:
        return
    for model in layout["models"]:
        say(f"layout {model['layout']} (step {model['step']}, {model['side']} {model['rank_dir']}): stages {model['stages']}, "
            f"{model['records']} logical records, {model['communication_left_out']} communication records left out")
        for warning in model["warnings"]:
            say(f"  warning: {warning}")
        listed = 5
        if len(model["findings"]) > listed:
            say(f"  {len(model['findings'])} findings, the first {listed} in model order (all in summary.json "
                f"layout.models[].findings):")
        for finding in model["findings"][:listed]:
            say(f"  {finding['finding']}: {finding['record']} {finding['leaf']} on ranks {finding['ranks']}"
                + (f" (differ from the bench: {finding['differ_from_bench']})" if finding["differ_from_bench"] else ""))
    for key in ("origin", "first_divergence"):
        found = layout.get(key)
        if found:
            suspects = f", its shard on rank {found['suspect_ranks']} cannot be a piece of the bench's tensor" \
                if found["suspect_ranks"] else ""
            say(f"  {key.replace('_', ' ')} {found['record']}: held by ranks {found['ranks']}{suspects}")


def _print_link(target: str, place: dict) -> None:
    """The link to ``place``'s record on a running ``msprobe view`` of ``target``, when there is one."""
    from msprobe.view.links import fragment, link_to

    link = link_to([target], fragment("record", step=place.get("step"), rank=place.get("rank_dir"),
                                      record=place.get("record"), row=place.get("row")))
    if link:
        say(f"  view: {link}")


def _print_divergence(s: dict, target: str) -> None:
    """Each answer under its own name: where the error enters (summary.json's ``origin``, our
    localisation) and the first divergence (``first_divergence``: the first row of the Result
    column's rule, 26.2.0's, float round-off passed over, or of --divergence-threshold), with the
    rule it follows."""
    from msprobe.compare import describe

    o, fd = s.get("origin"), s["first_divergence"]
    if o:
        say(f"error enters at: {describe(o)}; step {o['step']}, {_place(o)}, record #{o['record_index']}")
        _print_link(target, o)
    if fd:
        why = fd["result"] if fd.get("err_message", "[]") == "[]" else f"{fd['result']} {fd['err_message']}"
        say(f"first divergence: {fd['row']} (step {fd['step']}, {_place(fd)}, record #{fd['record_index']}, "
            f"{why})")
        _print_link(target, fd)
    else:
        say("first divergence: none")
    say(f"  ({s['divergence']})")
