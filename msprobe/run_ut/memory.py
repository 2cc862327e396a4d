"""The default ceiling of one API's generated inputs, from the memory this process may use.

run_ut's peak memory for one API is a multiple of the bytes its generated inputs declare
(docs/benchmarks.md: about 5.5x for a forward-only float32 API, 10.1x with its backward,
measured by ``bench/bench_run_ut_memory.py``). The default ceiling gives each worker process
an equal share of the memory available when the run starts, divided by :data:`PEAK_FACTOR`.
Available memory is the smaller of the kernel's ``MemAvailable`` and what the cgroup limit
(v2 ``memory.max``, v1 ``memory.limit_in_bytes``) leaves; where neither can be read
(not Linux) it is the free physical pages, else :data:`FALLBACK_BYTES`.
"""
from __future__ import annotations

import os
from typing import Optional

__all__ = ["PEAK_FACTOR", "FALLBACK_BYTES", "available_memory", "default_input_ceiling"]

#: peak bytes of checking one API per declared generated input byte that the default ceiling allows for
PEAK_FACTOR = 12
#: the memory assumed when none can be measured
FALLBACK_BYTES = 4 << 30


def _read_int(path: str) -> Optional[int]:
    try:
        with open(path) as fh:
            text = fh.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _meminfo_available(path: str = "/proc/meminfo") -> Optional[int]:
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    parts = line.split()
                    return int(parts[1]) * 1024 if len(parts) > 1 and parts[1].isdigit() else None
    except OSError:
        return None
    return None


def _cgroup_left(root: str = "/sys/fs/cgroup") -> Optional[int]:
    """What this process's cgroup limit leaves (None: no limit or none readable)."""
    for limit, usage in (("memory.max", "memory.current"),
                         ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        lim = _read_int(os.path.join(root, limit))
        if lim is None or lim >= 1 << 60:  # "max", or v1's "no limit" (a huge number)
            continue
        used = _read_int(os.path.join(root, usage)) or 0
        return max(0, lim - used)
    return None


def available_memory() -> tuple:
    """(bytes, where the figure comes from)."""
    avail = _meminfo_available()
    source = "MemAvailable"
    cg = _cgroup_left()
    if cg is not None and (avail is None or cg < avail):
        avail, source = cg, "the cgroup memory limit"
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
            source = "free physical memory"
        except (ValueError, OSError, AttributeError):
            avail, source = FALLBACK_BYTES, "no memory figure readable: assumed"
    return int(avail), source


def default_input_ceiling(workers: int = 1) -> tuple:
    """(ceiling in bytes, how it was derived) for ``workers`` processes checking at the same time."""
    avail, source = available_memory()
    w = max(1, int(workers))
    ceiling = max(1 << 20, avail // (PEAK_FACTOR * w))
    how = (f"{source} {avail / 2**30:.1f} GiB / ({PEAK_FACTOR} x {w} worker{'s' if w != 1 else ''}) = "
           f"{ceiling / 2**20:.0f} MiB")
    return ceiling, how
