"""Level-L2 (kernel dump) files: listed, never decoded.

A kernel dump (``level: "L2"``) is written by the Ascend runtime, not by msprobe:
``stepN/{timestamp}/{device}/[...]/{op_type}.{op_name}.{task_id}.{stream_id}.{timestamp}`` files in
the runtime's own binary dump format, plus ``stepN/kernel_config_{device}.json`` (the dump switch's
configuration). To msprobe-lake these files are opaque binaries: :func:`list_kernel_dumps` names
them (step, timestamp, device, the parts of the file name, size) and ``read_bytes()`` returns their
bytes; decoding them needs the Ascend toolkit's dump-parsing tools.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

from msprobe.format.layout import parse_step_dir
from msprobe.format.protocols import ReadableStore

__all__ = ["KernelDumpFile", "list_kernel_dumps", "has_kernel_dumps"]

_TIMESTAMP_DIR = re.compile(r"^\d{14}$")
_KERNEL_CONFIG = re.compile(r"^kernel_config_(\d+)\.json$")
_KERNEL_FILE = re.compile(r"^(?P<op_type>[^.]+)\.(?P<op_name>.+)\.(?P<task_id>\d+)\.(?P<stream_id>\d+)\.(?P<ts>\d+)$")


@dataclass(frozen=True)
class KernelDumpFile:
    """One kernel-dump file (opaque binary: the Ascend runtime's dump format, not decoded here)."""

    key: str  # the storage key, relative to the dump root
    step: int
    timestamp: str  # the runtime's directory name, YYYYmmddHHMMSS
    device: Optional[int]
    name: str
    op_type: Optional[str]
    op_name: Optional[str]
    task_id: Optional[int]
    stream_id: Optional[int]
    time: Optional[int]
    size: int
    store: Optional[ReadableStore] = None

    def read_bytes(self) -> bytes:
        """The file's raw bytes (undecoded)."""
        if self.store is None:
            raise ValueError(f"{self.key}: a kernel dump file listed without its store")
        return self.store.get(self.key)


def _step_dirs(store: ReadableStore) -> list:
    out = []
    for name in store.list_dir(""):
        step = parse_step_dir(name)
        if step is not None:
            out.append((step, name + "/"))
    if not out:
        return []
    return sorted(out)


def has_kernel_dumps(store: ReadableStore) -> bool:
    """True when some ``stepN/`` holds a kernel_config_*.json or a timestamp directory."""
    for _, prefix in _step_dirs(store):
        for name in store.list_dir(prefix):
            if _KERNEL_CONFIG.match(name) or _TIMESTAMP_DIR.match(name):
                return True
    return False


def list_kernel_dumps(store: ReadableStore, step: Any = None) -> list:
    """Every kernel-dump file under the store root, in (step, timestamp, device, key) order."""
    found = []
    for s, prefix in _step_dirs(store):
        if step is not None and s != step:
            continue
        for stamp in store.list_dir(prefix):
            if not _TIMESTAMP_DIR.match(stamp):
                continue
            for key in store.list_prefix(f"{prefix}{stamp}/"):
                rel = key[len(prefix) + len(stamp) + 1:]
                parts = rel.split("/")
                device = int(parts[0]) if len(parts) > 1 and parts[0].isdigit() else None
                name = parts[-1]
                match = _KERNEL_FILE.match(name)
                found.append(KernelDumpFile(
                    key=key, step=s, timestamp=stamp, device=device, name=name,
                    op_type=match.group("op_type") if match else None,
                    op_name=match.group("op_name") if match else None,
                    task_id=int(match.group("task_id")) if match else None,
                    stream_id=int(match.group("stream_id")) if match else None,
                    time=int(match.group("ts")) if match else None, size=store.size(key), store=store))
    found.sort(key=lambda f: (f.step, f.timestamp, f.device if f.device is not None else -1, f.key))
    return found


def kernel_configs(store: ReadableStore) -> dict:
    """{(step, device): key} of the kernel_config_{device}.json files."""
    out = {}
    for step, prefix in _step_dirs(store):
        for name in store.list_dir(prefix):
            match = _KERNEL_CONFIG.match(name)
            if match:
                out[(step, int(match.group(1)))] = prefix + name
    return out
