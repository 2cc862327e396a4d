"""One progress reporter for every command: a tqdm bar on a terminal, plain lines in a log.

``Progress(total, desc, unit)`` draws a tqdm bar on stderr when stderr is a terminal; when it is
not (a log file, CI), it writes one plain line (no ``\\r``) at each tenth of the work and at the
end; with no ``total`` (None: an open-ended count, e.g. packets as they come) a line at 1, 2, 5,
10, 20, 50... and at the end. ``enabled``: None (the default) is that terminal check, True forces a report (lines when
not a terminal), False none. :func:`add_progress_flag` gives a command the one flag for it:
``--progress`` / ``--no-progress`` (default: a terminal's), with the command's older spellings
kept as aliases of ``--no-progress``.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Optional

__all__ = ["Progress", "add_progress_flag", "resolve"]


def add_progress_flag(parser: argparse.ArgumentParser, *old_no_progress: str) -> None:
    """``--progress/--no-progress`` into ``args.progress`` (None: when stderr is a terminal)."""
    parser.add_argument("--progress", dest="progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress on stderr: a bar on a terminal, a line per tenth in a log "
                             "(default: only on a terminal)")
    if old_no_progress:
        parser.add_argument(*old_no_progress, dest="progress", action="store_false", help=argparse.SUPPRESS)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def resolve(enabled: Optional[bool], stream: Any = None) -> bool:
    """Whether to report: ``enabled``, or (None) whether ``stream`` (stderr) is a terminal."""
    return _isatty(stream or sys.stderr) if enabled is None else bool(enabled)


class Progress:
    """Counts ``update()`` calls towards ``total``; reports them on stderr (see the module doc)."""

    def __init__(self, total: Optional[int], desc: str, unit: str = "", enabled: Optional[bool] = None,
                 stream: Any = None):
        self.total = None if total is None else max(int(total), 0)
        self.desc, self.unit, self.n = desc, unit, 0
        self._file = stream or sys.stderr
        self.tty = _isatty(self._file)
        self.enabled = resolve(enabled, self._file) and self.total != 0
        self._bar = None
        self._postfix = ""
        self._shown = -1
        self._next = 1  # open-ended count: the next n that gets a line
        if self.enabled and self.tty:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, desc=desc, unit=f" {unit}" if unit else "it", file=self._file,
                             leave=True, dynamic_ncols=True)

    def update(self, k: int = 1) -> None:
        self.n += k
        if self._bar is not None:
            self._bar.update(k)
        elif self.enabled and self.total is None:
            if self.n >= self._next:
                self._line()
                while self._next <= self.n:  # 1, 2, 5, 10, 20, 50, ...
                    self._next = self._next * 5 // 2 if str(self._next)[0] == "2" else self._next * 2
                self._shown = self.n
        elif self.enabled and self.total is not None:
            tenth = min(self.n * 10 // self.total, 10)
            if tenth != self._shown:
                self._shown = tenth
                self._line()

    def set_postfix(self, text: str) -> None:
        """A short note after the count (e.g. the results so far)."""
        self._postfix = text
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)

    def _line(self) -> None:
        note = f" ({self._postfix})" if self._postfix else ""
        if self.total is None:
            self._file.write(f"{self.desc}: {self.n} {self.unit}{note}\n")
            self._file.flush()
            return
        pct = 100 * self.n // self.total if self.total else 100
        self._file.write(f"{self.desc}: {self.n}/{self.total} {self.unit} [{pct}%]{note}\n")
        self._file.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self.enabled and self.n and self._shown != (self.n if self.total is None else 10):
            self._shown = self.n if self.total is None else 10
            self._line()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
