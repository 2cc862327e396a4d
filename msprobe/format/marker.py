"""The format marker ``msprobe_lake.json`` (spec/FORMAT.md section 6): built, encoded, decoded
and rewritten here only.

The producer builds it at each publish (``dumpers.session``); recovery rewrites its
``document_crc32`` for the document it rebuilds and the producer sets ``final``
(``dumpers``); ``convert`` rewrites ``tensor_format``; readers decode it. Checking it is
``format.layout.validate_marker``.
"""
from __future__ import annotations

import json
import zlib
from typing import Any, Optional, Union

from msprobe.format.layout import FORMAT_VERSION, MARKER_FILE  # the marker's file name, re-exported here

__all__ = ["DIALECT", "MARKER_FILE", "build_marker", "encode_marker", "decode_marker", "document_crc32", "mark_final",
           "with_document", "with_tensor_format"]

#: the dialect an msprobe-lake producer writes (spec section 4)
DIALECT = "msprobe-lake"


def document_crc32(doc_bytes: bytes) -> str:
    """``"%08x"`` of the CRC-32 of the exact bytes of the document (the marker's ``document_crc32``)."""
    return f"{zlib.crc32(doc_bytes):08x}"


def build_marker(*, producer: str, framework: Optional[str], task: Optional[str], level: Optional[str],
                 step: Optional[int], rank: Optional[int], records: int, complete: bool, pid: int,
                 zarr: bool, final: bool, doc_bytes: bytes, files: dict) -> dict:
    """The marker of a published rank directory, keys in the order the producer writes them."""
    return {"format_version": FORMAT_VERSION, "dialect": DIALECT, "producer": producer,
            "framework": framework, "task": task, "level": level,
            "step": step, "rank": rank, "records": records,
            "complete": complete, "pid": pid,
            **({"tensor_format": "zarr"} if zarr else {}),
            # final: the documents hold the whole step; journal segments left behind by a
            # kill during the journal's deletion are stale (msprobe recover skips them)
            "final": bool(final),
            # what was written, so validate can tell a file or document that another
            # process overwrote (run_dir_policy "overwrite", section 6)
            "document_crc32": document_crc32(doc_bytes), "files": files}


def encode_marker(marker: dict) -> bytes:
    return json.dumps(marker, indent=1).encode("utf-8")


def decode_marker(raw: Union[bytes, str]) -> dict:
    """The marker as a consumer reads it: ``{}`` when it is not JSON or not an object (6.2: a
    consumer MAY ignore a malformed marker)."""
    try:
        m = json.loads(raw)
    except (ValueError, RecursionError):
        return {}
    return m if isinstance(m, dict) else {}


def mark_final(raw: Union[bytes, str]) -> bytes:
    """The marker with ``final: true`` (the journal is about to be deleted); raises on a marker
    that is not a JSON object, which is then left as it is."""
    marker: Any = json.loads(raw)
    marker["final"] = True
    return encode_marker(marker)


def with_document(marker: dict, doc_bytes: bytes) -> dict:
    """``marker`` now describing the document ``doc_bytes`` (recovery rebuilt it)."""
    marker["document_crc32"] = document_crc32(doc_bytes)
    return marker


def with_tensor_format(raw: bytes, zarr: bool) -> bytes:
    """The marker naming the tensor form after ``convert`` (``zarr``, or none for classic files);
    a marker that is not JSON is copied unchanged."""
    try:
        m = json.loads(raw)
    except ValueError:
        return raw
    if zarr:
        m["tensor_format"] = "zarr"
    else:
        m.pop("tensor_format", None)
    return encode_marker(m)
