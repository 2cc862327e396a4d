"""Helpers of the format tests: spec paths and a read-only store over a directory."""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "spec"
VECTORS = SPEC / "vectors"
GOLDEN = SPEC / "golden"
REAL = ROOT / "tests" / "fixtures" / "real"

SCHEMA_FILES = {
    "dump": "dump.schema.json",
    "debug": "debug.schema.json",
    "stack": "stack.schema.json",
    "construct": "construct.schema.json",
    "msprobe_lake": "msprobe_lake.schema.json",
}


class DirStore:
    """The read side of a store over a local directory (used when msprobe.backends lacks open_store)."""

    def __init__(self, root):
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        return self.root / key if key else self.root

    def get(self, key: str) -> bytes:
        from msprobe.errors import StorageNotFoundError

        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise StorageNotFoundError(key) from None

    def exists(self, key: str) -> bool:
        return self._path(key).exists()

    def list_dir(self, prefix: str = "") -> list:
        p = self._path(prefix)
        return sorted(os.listdir(p)) if p.is_dir() else []


def open_dump(path):
    """A read-only store over ``path``: msprobe.backends.open_store when available."""
    try:
        from msprobe.backends import open_store
    except ImportError:
        return DirStore(path)
    return open_store(str(path), read_only=True, create=False)
