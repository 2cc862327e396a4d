"""The ``msprobe`` command line.

Each subcommand lives in its own module under ``msprobe.cli`` with a
``register(subparsers)`` function that adds its parser and sets ``func``;
modules are imported lazily so ``msprobe --help`` stays fast.
"""
from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from typing import Any, Optional, Sequence, TypeVar

# numpy's OpenBLAS threads, once started (at numpy's import), spin 2**28 cycles before they sleep
# (OPENBLAS_THREAD_TIMEOUT 28, its default): ~40 ms of CPU in each command, though none calls BLAS
# then. 4: they sleep at once; a later BLAS call wakes them (as many threads as before). Set before
# numpy is imported (it is not yet: msprobe's package imports no numpy); a value the user set is kept.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

from msprobe.errors import MsprobeError

__all__ = ["main", "SUBCOMMAND_MODULES"]

#: subcommand modules, in the order shown by ``--help``
SUBCOMMAND_MODULES = [
    "msprobe.cli.validate",
    "msprobe.cli.validate_config",
    "msprobe.cli.demo",
    "msprobe.cli.ls",
    "msprobe.cli.show",
    "msprobe.cli.index",
    "msprobe.cli.recover",
    "msprobe.cli.compare",
    "msprobe.cli.merge_result",
    "msprobe.cli.overflow_check",
    "msprobe.cli.run_ut",
    "msprobe.cli.api_precision_compare",
    "msprobe.cli.lake",
    "msprobe.cli.convert",
    "msprobe.cli.run_ut_online",
    "msprobe.cli.view",
]


#: an example of each subcommand (its ``--help`` ends with them); ``lake`` questions by their name
EXAMPLES = {
    "validate": ["msprobe validate ./dump_path", "msprobe validate ./dump_path/step0/rank0 --json"],
    "validate-config": ["msprobe validate-config ./config.json"],
    "demo": ["msprobe demo", "msprobe demo --dump-path ./demo_dump --task tensor --steps 2"],
    "ls": ["msprobe ls ./dump_path", "msprobe ls ./dump_path --records --step 0"],
    "show": ["msprobe show ./dump_path Functional.linear.0.forward --step 0",
             "msprobe show ./dump_path 'Module.head*' --step 0"],
    "index": ["msprobe index ./dump_path"],
    "recover": ["msprobe recover ./dump_path"],
    "compare": ["msprobe compare ./npu_dump ./gpu_dump -o ./out",
                "msprobe compare -tp ./npu_dump/step0/rank0/dump.json -gp ./gpu_dump/step0/rank0/dump.json -o ./out"],
    "overflow_check": ["msprobe overflow_check -i ./dump_path/step0 -o ./output"],
    "merge_result": ["msprobe merge_result -i ./compare_out -o ./merged -config ./config.yaml"],
    "run_ut": ["msprobe run_ut -api_info ./dump_path/step0/rank0/dump.json -o ./ut"],
    "acc_check": ["msprobe acc_check -api_info ./dump_path/step0/rank0/dump.json -o ./ut"],
    "multi_run_ut": ["msprobe multi_run_ut -api_info ./dump_path/step0/rank0/dump.json -n 4 -d 0 1"],
    "api_precision_compare": ["msprobe api_precision_compare -npu ./npu/accuracy_checking_details_1.csv "
                              "-gpu ./gpu/accuracy_checking_details_1.csv -o ./out"],
    "convert": ["msprobe convert ./dump_path/step0 --to zarr", "msprobe convert ./dump_path/step0 --to classic"],
    "run_ut_online": ["msprobe run_ut_online -config ./config.json"],
    "lake": ["msprobe lake ls ./lake", "msprobe lake nan ./lake"],
    "lake ls": ["msprobe lake ls ./lake", "msprobe lake ls ./lake --rebuild"],
    "lake index": ["msprobe lake index ./lake"],
    "lake sql": ['msprobe lake sql ./lake "SELECT run, count(*) FROM lake GROUP BY run"'],
    "lake nan": ["msprobe lake nan ./lake", "msprobe lake nan ./lake --run run_npu --json"],
    "lake diverge": ["msprobe lake diverge ./lake run_npu run_gpu", "msprobe lake diverge ./lake run_npu run_gpu --step 0"],
    "lake disagree": ["msprobe lake disagree ./lake", "msprobe lake disagree ./lake --kind all --stat max"],
    "lake trend": ['msprobe lake trend ./lake "Module.head.Linear.parameters_grad" --arg weight.0 --plot norm.png'],
    "view": ["msprobe view ./npu_dump ./gpu_dump", "msprobe view ./compare_out --port 8765",
             "msprobe view s3://bucket/npu s3://bucket/gpu --storage-options '{\"anon\": false}'"],
    "report": ["msprobe report ./npu_dump ./gpu_dump -o report.html", "msprobe report ./compare_out -o report.html"],
}


_ActionT = TypeVar("_ActionT", bound=argparse.Action)


class Parser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` that keeps what the help and the errors of the command
    line read back: its subcommands and its option strings (argparse holds them only privately).
    Its subcommands' parsers are of this class too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.option_strings: list[str] = []  # before argparse adds -h/--help
        self.subcommands: dict[str, Parser] = {}  # an alias once under each of its names
        super().__init__(*args, **kwargs)

    def _add_action(self, action: _ActionT) -> _ActionT:  # every add_argument, in groups too
        self.option_strings.extend(action.option_strings)
        return super()._add_action(action)

    def add_subparsers(self, **kwargs: Any) -> Any:
        action = super().add_subparsers(**kwargs)
        self.subcommands = action.choices  # filled as the subcommands are added
        return action


def _add_examples(parser: Parser, prefix: str = "") -> None:
    for name, subparser in parser.subcommands.items():
        lines = EXAMPLES.get(prefix + name)
        if lines and not subparser.epilog:
            subparser.epilog = "example:\n" + "\n".join(f"  {line}" for line in lines)
            subparser.formatter_class = argparse.RawDescriptionHelpFormatter
        if not prefix:
            _add_examples(subparser, f"{name} ")


def _unrecognized(parser: Parser, argv: list, extra: list) -> None:
    """Unknown options: the error of the (sub)command they were given to, with its usage and
    the nearest option of that command (``--xslx``: did you mean --xlsx?)."""
    import difflib

    target, tokens = parser, list(argv)
    while tokens:  # the deepest subcommand named on the line
        subs = target.subcommands
        hit = next((token for token in tokens if token in subs), None)
        if hit is None:
            break
        target, tokens = subs[hit], tokens[tokens.index(hit) + 1:]
    options = target.option_strings
    said = []
    for arg in extra:
        close = difflib.get_close_matches(arg.split("=", 1)[0], options, n=1, cutoff=0.6) \
            if arg.startswith("-") else []
        said.append(f"{arg} (did you mean {close[0]}?)" if close else arg)
    target.error(f"unrecognized arguments: {' '.join(said)}")


def build_parser() -> Parser:
    from msprobe import __version__

    parser = Parser(prog="msprobe", description="msprobe-lake: precision-debugging dumps as a data lake")
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
    _add_examples(parser)
    return parser


#: exit status after the reader of stdout went away (``| head``): a SIGPIPE'd process's
EXIT_BROKEN_PIPE = 141


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``msprobe`` command line; a closed stdout (``msprobe ls ... | head``) ends it
    quietly with status 141, as a tool killed by SIGPIPE, without a traceback."""
    try:
        try:
            code: object = _main(argv)
        except SystemExit as exc:  # argparse's --help / usage errors: flushed first, then raised
            code = exc
        sys.stdout.flush()  # what is still buffered goes now, where a closed pipe is caught
    except BrokenPipeError:
        _stdout_to_devnull()
        return EXIT_BROKEN_PIPE
    if isinstance(code, SystemExit):
        raise code
    return code  # type: ignore[return-value]


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
    # the parser's modules and what they import (numpy among them) make no cycles worth collecting: the
    # collector paused meanwhile (its young collections ran ~30 times through the imports' objects),
    # those objects then moved to the oldest generation, where the command's collections leave them
    collecting = gc.isenabled()
    gc.disable()
    try:
        parser = build_parser()
        argv = list(sys.argv[1:] if argv is None else argv)
        args, extra = parser.parse_known_args(argv)
    finally:
        if collecting:
            from msprobe.format.gcpause import promote_all

            promote_all()
            gc.enable()
    if extra:
        _unrecognized(parser, argv, extra)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    opts = getattr(args, "storage_options", None)
    if isinstance(opts, str):  # checked once here, so no subcommand shows a traceback for it
        import json

        try:
            valid = isinstance(json.loads(opts), dict)
        except ValueError:
            valid = False
        if not valid:
            print(f"msprobe {args.command}: error: --storage-options must be a JSON object", file=sys.stderr)
            return 2
    from msprobe.format.naming import printable

    stdout, sys.stdout = sys.stdout, _EscapingStream(sys.stdout)  # names from dumps cannot drive the terminal
    try:
        code = args.func(args)
    except MsprobeError as exc:
        print(f"msprobe {args.command}: error: {printable(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        sys.stdout = stdout
    return int(code or 0)


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
