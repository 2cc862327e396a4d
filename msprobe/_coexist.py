"""Detect mindstudio-probe installed beside msprobe-lake (both ship the ``msprobe`` package).

Huawei's ``mindstudio-probe`` ships a package of the same name and an ``msprobe`` command;
installed into one environment, each overwrites the other's files. :func:`warn_if_mixed`
(run by ``import msprobe`` and by the ``msprobe`` command) then warns with a
:class:`DistributionConflictWarning` naming both distributions. Keep them in separate
virtual environments (README, "Next to mindstudio-probe"). Costs one directory listing
per ``sys.path`` entry; importlib.metadata is not imported.
"""
from __future__ import annotations

import os
import sys

__all__ = ["DistributionConflictWarning", "other_distribution", "warn_if_mixed"]

#: files and folders that only mindstudio-probe puts into the ``msprobe`` package
_THEIR_FILES = ("msprobe.py", "core", "msaccucmp", "visualization", "overflow_check")
_PREFIXES = ("mindstudio_probe-", "mindstudio-probe-")


class DistributionConflictWarning(UserWarning):
    """msprobe-lake and mindstudio-probe are installed into the same environment."""


def other_distribution() -> list:
    """Where mindstudio-probe shows beside us: its metadata on ``sys.path``, or its files
    mixed into this package's folder."""
    found = []
    here = os.path.dirname(os.path.abspath(__file__))
    mixed = [n for n in _THEIR_FILES if os.path.exists(os.path.join(here, n))]
    if mixed:
        found.append(f"its files {', '.join(mixed)} in {here}")
    seen = set()
    for entry in sys.path:
        entry = os.path.abspath(entry or ".")
        if entry in seen:
            continue
        seen.add(entry)
        try:
            names = os.listdir(entry)
        except OSError:  # a zip, a missing folder
            continue
        for n in names:
            low = n.lower()
            if low.startswith(_PREFIXES) and low.endswith((".dist-info", ".egg-info")):
                found.append(os.path.join(entry, n))
    return found


def warn_if_mixed(stacklevel: int = 2) -> bool:
    where = other_distribution()
    if where:
        import warnings

        warnings.warn(
            "msprobe-lake and mindstudio-probe are both installed in this environment "
            f"({'; '.join(where)}): they ship the same 'msprobe' package and 'msprobe' command, so the one "
            "installed last has overwritten files of the other. Keep each in its own virtual environment "
            "(python -m venv; see README, 'Next to mindstudio-probe').",
            DistributionConflictWarning, stacklevel=stacklevel + 1)
    return bool(where)
