"""The ``msprobe`` command line.

Each subcommand lives in its own module under ``msprobe.cli`` with a
``register(subparsers)`` function that adds its parser and sets ``func``;
modules are imported lazily so ``msprobe --help`` stays fast.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional, Sequence

from msprobe.errors import MsprobeError

__all__ = ["main", "SUBCOMMAND_MODULES"]

#: subcommand modules, in the order shown by ``--help``
SUBCOMMAND_MODULES = [
    "msprobe.cli.validate",
    "msprobe.cli.demo",
    "msprobe.cli.ls",
    "msprobe.cli.show",
    "msprobe.cli.index",
    "msprobe.cli.recover",
    "msprobe.cli.compare",
    "msprobe.cli.merge_result",
    "msprobe.cli.run_ut",
    "msprobe.cli.api_precision_compare",
    "msprobe.cli.lake",
    "msprobe.cli.convert",
    "msprobe.cli.run_ut_online",
]


def build_parser() -> argparse.ArgumentParser:
    from msprobe import __version__

    parser = argparse.ArgumentParser(prog="msprobe", description="msprobe-lake: precision-debugging dumps as a data lake")
    parser.add_argument("--version", action="version", version=f"msprobe-lake {__version__}")
    # the real tool's 8.x spelling ``msprobe -f pytorch <command>``: the framework is read from the dumps
    parser.add_argument("-f", "--framework", choices=["pytorch", "mindspore"], default=None,
                        help="accepted for compatibility with msprobe 8.x command lines (the dumps say which)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in SUBCOMMAND_MODULES:
        try:
            importlib.import_module(mod).register(sub)
        except ImportError:  # a subcommand whose module is absent in this build
            continue
    return parser


#: exit status after the reader of stdout went away (``| head``): a SIGPIPE'd process's
EXIT_BROKEN_PIPE = 141


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``msprobe`` command line; a closed stdout (``msprobe ls ... | head``) ends it
    quietly with status 141, as a tool killed by SIGPIPE, without a traceback."""
    try:
        try:
            rc: object = _main(argv)
        except SystemExit as exc:  # argparse's --help / usage errors: flushed first, then raised
            rc = exc
        sys.stdout.flush()  # what is still buffered goes now, where a closed pipe is caught
    except BrokenPipeError:
        _stdout_to_devnull()
        return EXIT_BROKEN_PIPE
    if isinstance(rc, SystemExit):
        raise rc
    return rc  # type: ignore[return-value]


def _stdout_to_devnull() -> None:
    """Point stdout's descriptor at /dev/null so the interpreter's final flush cannot fail."""
    import os

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):  # not a real file (captured): nothing to redirect
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _main(argv: Optional[Sequence[str]] = None) -> int:
    import msprobe

    if not hasattr(msprobe, "DistributionConflictWarning"):  # mindstudio-probe's __init__ replaced ours
        from msprobe._coexist import warn_if_mixed

        warn_if_mixed()
    for stream in (sys.stdout, sys.stderr):  # names that are not UTF-8 (surrogate escapes) print, escaped
        try:
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]  # TextIOWrapper
        except (AttributeError, ValueError, OSError):
            pass
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    opts = getattr(args, "storage_options", None)
    if isinstance(opts, str):  # checked once here, so no subcommand shows a traceback for it
        import json

        try:
            ok = isinstance(json.loads(opts), dict)
        except ValueError:
            ok = False
        if not ok:
            print(f"msprobe {args.command}: error: --storage-options must be a JSON object", file=sys.stderr)
            return 2
    from msprobe.format.naming import printable

    stdout, sys.stdout = sys.stdout, _EscapingStream(sys.stdout)  # names from dumps cannot drive the terminal
    try:
        rc = args.func(args)
    except MsprobeError as exc:
        print(f"msprobe {args.command}: error: {printable(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        sys.stdout = stdout
    return int(rc or 0)


class _EscapingStream:
    """stdout with control characters (ESC, BEL, CR, ...) written as escapes; newlines and tabs kept.
    Every subcommand prints record and file names taken from dumps (progress bars go to stderr)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        from msprobe.format.naming import printable

        return self._stream.write(printable(text, keep_newlines=True))

    def __getattr__(self, name: str):
        return getattr(self._stream, name)
