"""``msprobe run_ut_online -config config.json [-o OUT]``: the online run_ut checker
(also reached as ``msprobe run_ut --online`` / a config with ``is_online: true``)."""
from __future__ import annotations

import argparse
import json
import sys


def add_online_arguments(p: argparse.ArgumentParser, *, with_config: bool = True) -> None:
    """The online checker's options (shared with ``msprobe run_ut``)."""
    if with_config:
        p.add_argument("-config", "--config", dest="config", default=None,
                       help="config.json with task run_ut (is_online, nfs_path or host/port, rank_list, tls_path)")
    p.add_argument("--nfs-path", "--nfs_path", dest="nfs_path", default=None,
                   help="shared directory or URL to watch (overrides the config)")
    p.add_argument("--host", default=None, help="address to listen on (overrides the config)")
    p.add_argument("--port", type=int, default=None, help="port to listen on, 0 = any free port")
    p.add_argument("--tls-path", "--tls_path", dest="tls_path", default=None,
                   help="directory with server.key, server.crt, ca.crt; \"\" = plain TCP")
    p.add_argument("--rank-list", dest="rank_list", default=None, help="ranks to check, e.g. 0,1 (default 0)")
    p.add_argument("--keep-running", action="store_true",
                   help="keep waiting after every rank's training side closed")
    p.add_argument("--idle-timeout", type=float, default=None,
                   help="exit after this many seconds without a packet")
    if with_config:
        p.add_argument("--storage-options", default=None, help="JSON object of fsspec storage options")
    p.add_argument("--keep-packets", action="store_true",
                   help="shared store: keep processed packets (default: removed once recorded as checked)")
    p.add_argument("--port-file", default=None, help="write the listening port to this file (for scripts)")


def register(sub) -> None:
    p = sub.add_parser("run_ut_online", help="online run_ut: check APIs as the training side sends them")
    p.add_argument("-o", "--output-path", "--output_path", "--out_path", "--out-path", "--out", dest="out_path",
                   default="./", help="output directory")
    p.add_argument("--device-type", "--device", dest="device_type", default="auto",
                   help="device side: auto (CUDA, else NPU, else CPU in the recorded dtype), cpu, cuda:N, npu:N")
    # the old spelling; run_ut's -d is device ids, so it is not documented here
    p.add_argument("-d", dest="device_type", help=argparse.SUPPRESS)
    add_online_arguments(p)
    from msprobe.progress import add_progress_flag

    add_progress_flag(p, "-q", "--quiet")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import logging

    from msprobe.run_ut.online import OnlineChecker, install_signal_handlers, settings_from_config

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    settings, sec = settings_from_config(args.config, force_online=True) if args.config else (None, {})
    if settings is None:
        from msprobe.online.config import parse_online

        settings = parse_online({"is_online": True, "nfs_path": args.nfs_path or "", "host": args.host or "",
                                 "port": args.port if args.port is not None else -1,
                                 "tls_path": args.tls_path if args.tls_path is not None else "./"},
                                side="checker")
    else:
        for k in ("nfs_path", "host", "port", "tls_path"):
            v = getattr(args, k)
            if v is not None:
                setattr(settings, k, v)
    if args.rank_list:
        settings.rank_list = sorted({int(x) for x in args.rank_list.split(",") if x.strip()})
    if args.storage_options:
        settings.storage_options = json.loads(args.storage_options)
    from msprobe.run_ut.runner import pick_device

    device = pick_device(getattr(args, "device_type", "auto") or "auto", None)

    def on_listen(port: int) -> None:
        print(f"msprobe run_ut online: listening on {settings.host}:{port}", flush=True)
        if args.port_file:
            import os

            tmp = args.port_file + ".tmp"
            with open(tmp, "w") as fh:
                fh.write(str(port))
            os.replace(tmp, args.port_file)

    from msprobe.run_ut import load_run_ut_config

    lists = load_run_ut_config(args.config)
    checker = OnlineChecker(settings, args.out_path, white_list=lists.get("white_list", ()),
                            black_list=lists.get("black_list", ()), device=device,
                            keep_running=args.keep_running, idle_timeout=args.idle_timeout, on_listen=on_listen,
                            keep_packets=args.keep_packets, report_progress=getattr(args, "progress", None))
    install_signal_handlers(checker)
    s = checker.run()
    print(f"msprobe run_ut online: {s['apis']} APIs checked from {s['packets']} packets "
          f"({s['duplicates']} already checked, {s['ignored_rank']} of other ranks, "
          f"{s['dropped_by_sender']} shed by the training side)", flush=True)
    for rank, files in sorted(s["files"].items()):
        print(f"  {rank}: {files[0]}", flush=True)
    if s.get("refused_connections"):
        print(f"  refused connections: {s['refused_connections']}", file=sys.stderr, flush=True)
    return 0


def config_is_online(path) -> bool:
    """True when a config.json's run_ut section says ``is_online: true``."""
    if not path:
        return False
    try:
        with open(path, "rb") as fh:
            raw = json.loads(fh.read().decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return False  # run_ut reports the bad file itself
    sec = raw.get("run_ut") if isinstance(raw, dict) else None
    return isinstance(sec, dict) and sec.get("is_online") is True
