"""The compare plot drawn in a helper process, so that it does not hold up the CSVs.

Importing matplotlib costs about as much CPU as comparing 20,000 records column-wise, and
drawing about as much again. :class:`PlotProcess` starts a fresh interpreter when compare
starts; it imports matplotlib (on another core, while compare reads the dumps and writes the
CSVs) and then waits on its stdin for what to draw: the per-pair results as JSON (plain data:
series, marks, first divergence), never a pickle. Its answer is one JSON line, the PNG path and
the note. Whatever goes wrong with it (no interpreter, a crash, a bad answer, a timeout) the
plot is drawn in-process instead, as :func:`msprobe.compare._plot.plot_compare` always did.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Optional

import msprobe
from msprobe.compare._plot import plot_compare

__all__ = ["PlotProcess", "draw", "start"]

#: the helper: import matplotlib first (the slow part), then draw what stdin asks for
_SERVE = (
    "import json, sys\n"
    "try:\n"
    "    import matplotlib\n"
    "    matplotlib.use('Agg')\n"
    "    import matplotlib.pyplot\n"
    "except ImportError:\n"
    "    pass\n"
    "from msprobe.compare._plot import plot_compare\n"
    "req = json.loads(sys.stdin.read() or 'null')\n"
    "if req is not None:\n"
    "    got = plot_compare(req['results'], req['out_dir'], req['ts'], req['mode'], req['threshold'])\n"
    "    sys.stdout.write(json.dumps(list(got)) + '\\n')\n"
)
#: seconds the drawing may take in the helper before compare draws in-process instead
TIMEOUT = 300.0


class PlotProcess:
    """A helper interpreter importing matplotlib while compare runs (see the module doc)."""

    def __init__(self) -> None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(msprobe.__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        self.proc: Optional[subprocess.Popen] = None
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", _SERVE], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        except OSError:
            self.proc = None

    def draw(self, results: list, out_dir: str, ts: str, mode: str, threshold: float) -> Optional[tuple]:
        """(PNG path, note) from the helper, or None when it could not draw (then draw in-process)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        try:
            req = json.dumps({"results": results, "out_dir": out_dir, "ts": ts, "mode": mode,
                              "threshold": threshold})
            out, _ = proc.communicate(req.encode(), timeout=TIMEOUT)
            got = json.loads(out.decode().strip().splitlines()[-1]) if proc.returncode == 0 and out else None
        except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
            _end(proc)
            return None
        if not (isinstance(got, list) and len(got) == 2 and all(x is None or isinstance(x, str) for x in got)):
            return None
        if got[0] is not None and not os.path.exists(got[0]):
            return None
        return got[0], got[1]

    def close(self) -> None:
        """End the helper without drawing (compare failed before its plot)."""
        proc, self.proc = self.proc, None
        if proc is not None:
            _end(proc)


def start() -> Optional[PlotProcess]:
    """A helper, where this process could import matplotlib itself (else the in-process plot
    says why there is none)."""
    if "matplotlib" in sys.modules:
        ok = sys.modules["matplotlib"] is not None
    else:
        import importlib.util

        try:
            ok = importlib.util.find_spec("matplotlib") is not None
        except (ImportError, ValueError):
            ok = False
    return PlotProcess() if ok else None


def _end(proc: subprocess.Popen) -> None:
    try:
        proc.kill()
    except OSError:
        pass
    proc.wait()
    for fh in (proc.stdin, proc.stdout):
        if fh is not None:
            fh.close()


def draw(helper: Optional[PlotProcess], results: list, out_dir: str, ts: str, mode: str, threshold: float) -> tuple:
    """(PNG path, note): drawn by ``helper`` when it can, else in-process."""
    got = helper.draw(results, out_dir, ts, mode, threshold) if helper is not None else None
    return got if got is not None else plot_compare(results, out_dir, ts, mode, threshold)
