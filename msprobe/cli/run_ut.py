"""``msprobe run_ut -api_info DUMP [-o OUT] ...`` (alias ``acc_check``): the offline precision pre-check;
``msprobe multi_run_ut -api_info DUMP -n N -d 0 1 ...``: the same over N worker processes (default 8)."""
from __future__ import annotations

import argparse
import json

from msprobe.progress import add_progress_flag


def register(sub) -> None:
    p = sub.add_parser("run_ut", aliases=["acc_check"],
                       help="replay every API of an L1 dump on the device and a CPU float64 benchmark and judge it")
    _check_arguments(p, workers=1)
    p.add_argument("--online", action="store_true",
                   help="online run_ut: check APIs as the training side sends them (also: is_online in -config)")
    from msprobe.cli.run_ut_online import add_online_arguments

    add_online_arguments(p, with_config=False)
    p.set_defaults(func=run, subparser=p)
    m = sub.add_parser("multi_run_ut", help="run_ut over several worker processes (8.x's multi-device run_ut)")
    _check_arguments(m, workers=8)
    m.set_defaults(func=run, subparser=m, online=False)


def _check_arguments(p, *, workers: int) -> None:
    """The options run_ut and multi_run_ut share (the real tool's spellings first)."""
    p.add_argument("-api_info", "--api_info_file", dest="api_info", default=None,
                   help="dump.json, a rank directory, or any dump URL holding one rank (not with --online)")
    p.add_argument("-o", "--output-path", "--output_path", "--out_path", "--out", dest="out_path", default="./", help="output directory (default ./)")
    p.add_argument("-save_error_data", "--save_error_data", dest="save_error_data", action="store_true",
                   help="save inputs/outputs of failing APIs (under error_data_path, any storage URL)")
    p.add_argument("-f", "--filter_api", dest="filter_api", action="store_true",
                   help="check one API per distinct name and argument structure (statistics ignored)")
    p.add_argument("-csv_path", "--result_csv_path", dest="result_csv", default=None,
                   help="resume: the accuracy_checking_result_{ts}.csv of the interrupted run")
    p.add_argument("-config", "--config_path", dest="config", default=None,
                   help="config.json with white_list / black_list / error_data_path (run_ut section)")
    p.add_argument("-n", "--num_splits", dest="workers", type=int, default=workers,
                   help=f"worker processes, at most {MAX_WORKERS} (default {workers}; 0 = in this process, without "
                        "timeout/crash isolation); never more than the APIs to check")
    p.add_argument("-d", "--device", dest="devices", type=int, nargs="+", default=[0],
                   help="device ids for the device side when CUDA/NPU is present (default 0)")
    p.add_argument("-j", "--jit_compile", dest="jit_compile", action="store_true",
                   help="accepted for compatibility (no effect)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one API may run (default 300)")
    p.add_argument("--device-type", dest="device_type", default="auto",
                   help="device side: auto (CUDA, else NPU, else CPU in the recorded dtype), cpu, cuda:N, npu:N")
    p.add_argument("--step", type=int, default=None, help="the step to check when DUMP holds several")
    p.add_argument("--rank", default=None, help="the rank (number or directory name) when DUMP holds several")
    p.add_argument("--replay-mode", dest="replay_mode", default="auto", choices=["auto", "real", "random"],
                   help="inputs: dumped tensors where present (auto), only dumped (real), all generated (random)")
    p.add_argument("--no-recorded-check", dest="recorded", action="store_false",
                   help="do not judge the dumped outputs against the benchmark")
    p.add_argument("--max-input-mb", dest="max_input_mb", type=float, default=None,
                   help="ceiling of one API's generated inputs in MiB (default: derived from the memory available at "
                        "the start, shared among the workers; or max_input_mb in -config); an API above it gets a "
                        "SKIP row, counted in the summary")
    p.add_argument("--storage-options", default=None, help="JSON object of fsspec storage options")
    p.add_argument("--preload", action="append", default=[], metavar="MODULE",
                   help="a module every checking process imports first (custom ops); repeatable")
    add_progress_flag(p, "-q", "--quiet")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


#: the real tool's bound on -n/--num_splits
MAX_WORKERS = 64


def run(args: argparse.Namespace) -> int:
    from msprobe.cli.run_ut_online import config_is_online
    from msprobe.errors import ConfigError

    if not 0 <= args.workers <= MAX_WORKERS:
        raise ConfigError(f"-n/--num_splits must be between 0 and {MAX_WORKERS}, not {args.workers}")
    if args.online or (args.api_info is None and config_is_online(args.config)):
        from msprobe.cli.run_ut_online import run as run_online

        return run_online(args)
    if args.api_info is None:
        args.subparser.print_usage()
        print("msprobe run_ut: error: -api_info is required (or --online / is_online in -config)")
        return 2
    from msprobe.run_ut import CheckOptions, run_ut

    rank = args.rank
    if isinstance(rank, str) and rank.isdigit():
        rank = int(rank)
    opts = json.loads(args.storage_options) if args.storage_options else None
    options = CheckOptions(replay_mode=args.replay_mode, check_recorded=args.recorded)
    s = run_ut(args.api_info, args.out_path, workers=args.workers, devices=args.devices, config=args.config,
               filter_api=args.filter_api, result_csv=args.result_csv, save_error_data_flag=args.save_error_data,
               timeout=args.timeout, step=args.step, rank=rank, storage_options=opts, options=options,
               progress=args.progress, device=args.device_type, preload=tuple(args.preload),
               max_input_mb=args.max_input_mb)
    if getattr(args, "json", False):
        print(json.dumps(s, indent=1, default=str))
        return 0
    counts = ", ".join(f"{k} {v}" for k, v in sorted(s["api_counts"].items()))
    print(f"msprobe run_ut: {s['checked']} APIs checked ({s['resumed']} resumed) in {s['seconds']:.1f} s "
          f"[{counts}, each API by its worst of forward/backward]")
    print(f"result csv: {s['result_csv']}")
    print(f"details csv: {s['details_csv']}")
    if s.get("skipped_input_ceiling"):
        print(f"{s['skipped_input_ceiling']} APIs skipped (SKIP rows): their generated inputs exceed the ceiling of "
              f"{s['input_ceiling_bytes'] / 2**20:.0f} MiB ({s['input_ceiling']}); raise it with --max-input-mb")
    if s.get("error_data"):
        print(f"error data: {s['error_data']}")
    return 0
