"""The marker's record of what its producer wrote (``document_crc32``, ``files``), checked
against what the rank directory holds: with ``run_dir_policy: "overwrite"`` (msprobe's
behaviour) two runs dumping into one directory at once leave files of one run next to the
records of the other; this finds them (spec/FORMAT.md section 6)."""
from __future__ import annotations

import zlib
from typing import Any, Callable

from msprobe.errors import MsprobeError
from msprobe.format.protocols import ReadableStore

__all__ = ["check_digests", "CRC_BUDGET"]

#: the most bytes of tensor files read per rank directory to compare CRC32s (sizes are always compared)
CRC_BUDGET = 1 << 30


def check_digests(store: ReadableStore, prefix: str, doc_key: str, marker: dict, tensor_files: set,
                  problem: Callable[[str, str, str, str], None], *, crc_budget: int = CRC_BUDGET) -> None:
    """Report (``problem(severity, file, location, message)``) every disagreement between the
    marker's digests and the stored document and tensor files."""
    want = marker.get("document_crc32")
    if isinstance(want, str):
        got = f"{zlib.crc32(store.get(doc_key)):08x}"
        if got != want:
            problem("error", doc_key, "", f"CRC32 {got} differs from {want} in the marker: the document and the "
                                          "marker come from different runs (two runs wrote this directory at once?)")
    files = marker.get("files")
    if not isinstance(files, dict):
        return
    budget = crc_budget
    for name, entry in sorted(files.items()):
        if not (isinstance(name, str) and isinstance(entry, list) and len(entry) == 2
                and isinstance(entry[0], int) and isinstance(entry[1], str)) or name not in tensor_files:
            continue  # a missing file is reported against its record
        key = f"{prefix}/dump_tensor_data/{name}" if prefix else f"dump_tensor_data/{name}"
        size = _read(store.size, key, problem)
        if size is None:
            continue
        if size != entry[0]:
            problem("error", key, "", f"{size} bytes, the producer wrote {entry[0]}: the file does not belong to "
                                      "the records of this directory (overwritten by another run?)")
            continue
        if size > budget:
            continue
        budget -= size
        data = _read(store.get, key, problem)
        if data is None:
            continue
        crc = f"{zlib.crc32(data):08x}"
        if crc != entry[1]:
            problem("error", key, "", f"CRC32 {crc} differs from {entry[1]} written by the producer: the file "
                                      "does not belong to the records of this directory (overwritten by another run?)")


def _read(fn: Callable[[str], Any], key: str, problem: Callable[[str, str, str, str], None]) -> Any:
    try:
        return fn(key)
    except MsprobeError as exc:
        problem("error", key, "", str(exc))
        return None
