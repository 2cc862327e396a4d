"""A first look while the view is built: the page in seconds, the rest after (issue 49 item 3).

``msprobe view``'s whole set-up (a pair compared, every row in the tables; a lake's index read into
them) takes tens of seconds at real sizes. A first look is served meanwhile:

- a pair: its cells (:func:`msprobe.compare.pair_sources`, no document parsed) and the first cell's
  first :data:`FIRST_RECORDS` records, compared with compare's own rules. Those records are read
  from the head of each side's ``dump.json`` (:func:`head_records`: the document's top-level fields
  and the first records of its ``data``, parsed one record at a time, the rest of the file unread),
  written as a small dump of the same step and rank directory, and compared by
  :func:`msprobe.compare.compare` into the first look's tables. The other cells are listed, empty,
  until the whole pair is compared;
- a lake: the overview of every (run, step, rank) from its index (one grouped query over the index
  files: rows and NaN/Inf rows a cell) and the rows of the first NaN/Inf cell (else the first cell).

The first look is labelled as such in the page (``meta.first_look``) and replaced by the whole view
when it is ready.
"""
from __future__ import annotations

import json
import os
from typing import Any, Optional

from msprobe.backends import local_path_of
from msprobe.view._load import sql_literal

__all__ = ["head_records", "FIRST_RECORDS", "pair_first_look", "lake_first_look"]

#: the records of the first cell a pair's first look compares
FIRST_RECORDS = 500
#: the most bytes of a dump.json read for them (a record of a big model's ``data`` is a few KiB)
_HEAD_BYTES = 64 << 20
_CHUNK = 1 << 20


class _Head:
    """A growing text buffer over the head of a file, read in chunks as the parser needs them."""

    def __init__(self, path: str) -> None:
        self.handle = open(path, "rb")
        self.text = ""
        self.read = 0
        self.at = 0
        self.ended = False

    def more(self) -> bool:
        if self.ended or self.read >= _HEAD_BYTES:
            return False
        chunk = self.handle.read(_CHUNK)
        self.read += len(chunk)
        if not chunk:
            self.ended = True
            return False
        # a chunk may end inside a UTF-8 sequence: its tail waits for the next chunk
        cut = len(chunk)
        while cut > 0 and cut > len(chunk) - 4 and (chunk[cut - 1] & 0xC0) == 0x80:
            cut -= 1
        if cut > 0 and chunk[cut - 1] >= 0xC0:
            cut -= 1
        if cut == 0:  # no whole character in the chunk: decoded as it is (a decode error: no dump document)
            cut = len(chunk)
        if cut < len(chunk):
            self.handle.seek(cut - len(chunk), os.SEEK_CUR)
            self.read -= len(chunk) - cut
            chunk = chunk[:cut]
        self.text = self.text[self.at:] + chunk.decode("utf-8")
        self.at = 0
        return True

    def skip(self) -> str:
        """The next character that is not white space (read as needed); '' at the end."""
        while True:
            while self.at < len(self.text) and self.text[self.at] in " \t\r\n":
                self.at += 1
            if self.at < len(self.text):
                return self.text[self.at]
            if not self.more():
                return ""

    def value(self, decoder: json.JSONDecoder) -> Any:
        """The next JSON value (read as needed); ValueError when the head ends inside it."""
        self.skip()
        while True:
            try:
                found, end = decoder.raw_decode(self.text, self.at)
            except ValueError:
                if not self.more():
                    raise
                continue
            if end >= len(self.text) and not self.ended and isinstance(found, (int, float)):
                if self.more():  # a number cut by the chunk's end: decode it again whole
                    continue
            self.at = end
            return found

    def close(self) -> None:
        self.handle.close()


def head_records(path: str, limit: int, wanted: Optional[set] = None) -> Optional[dict]:
    """The head of the dump document ``path``: its top-level fields before ``data`` and the first
    ``limit`` records of ``data`` (then, with ``wanted``, further records until every name of
    ``wanted`` is read or 2 x ``limit`` records are), parsed one record at a time; the rest of the
    file is never read. None when the file does not start as a dump document does (an object whose
    ``data`` is an object) or its head holds no record."""
    decoder = json.JSONDecoder()
    try:
        head = _Head(path)
    except OSError:
        return None
    try:
        return _read_head(head, decoder, limit, wanted)
    except (ValueError, UnicodeDecodeError):
        return None
    finally:
        head.close()


def _read_head(head: _Head, decoder: json.JSONDecoder, limit: int, wanted: Optional[set]) -> Optional[dict]:
    if head.skip() != "{":
        return None
    head.at += 1
    doc: dict = {}
    while head.skip() == '"':
        key = head.value(decoder)
        if head.skip() != ":":
            return None
        head.at += 1
        if key != "data":
            doc[key] = head.value(decoder)
        else:
            doc["data"] = _records(head, decoder, limit, wanted)
            return doc if doc["data"] else None
        if head.skip() == ",":
            head.at += 1
    return None


def _records(head: _Head, decoder: json.JSONDecoder, limit: int, wanted: Optional[set]) -> dict:
    data: dict = {}
    if head.skip() != "{":
        return data
    head.at += 1
    missing = set(wanted or ())
    while head.skip() == '"':
        if len(data) >= limit and (not missing or len(data) >= 2 * limit):
            break
        try:
            name = head.value(decoder)
            if head.skip() != ":":
                break
            head.at += 1
            data[name] = head.value(decoder)
        except ValueError:
            break  # the head ends inside a record: the records before it
        missing.discard(name)
        if head.skip() == ",":
            head.at += 1
    return data


def _write_head(source: Any, into: str, limit: int, wanted: Optional[set] = None) -> Optional[dict]:
    """The head of ``source``'s dump.json written as a dump of one rank directory under ``into``; the
    records written, or None when the source is not a local rank directory with a dump.json. Its
    construct.json and stack.json stay where they are (a 150,000-node construct.json costs compare
    seconds): the first look's records name by name, and its trees and stacks are read from the
    real rank directory."""
    folder = local_path_of(str(getattr(source, "url", "") or ""))
    if folder is None:
        return None
    path = os.path.join(folder, "dump.json")
    if not os.path.isfile(path):
        return None
    doc = head_records(path, limit, wanted)
    if doc is None:
        return None
    step = getattr(source, "step", None)
    out = os.path.join(into, f"step{step}", str(source.rank_dir)) if isinstance(step, int) else \
        os.path.join(into, str(source.rank_dir))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "dump.json"), "w", encoding="utf-8") as handle:
        handle.write(json.dumps(doc))  # json.dumps: the C encoder (json.dump encodes in Python)
    return doc["data"]


def pair_first_look(data: Any, path: str, bench: str, storage_options: Optional[dict],
                    threshold: Optional[float]) -> bool:
    """Fill ``data`` (a fresh ViewData) with a pair's first look: every cell the pair will have and the
    first cell's first :data:`FIRST_RECORDS` records compared. False (``data`` untouched) when the
    first cell's dump.json files are not local dump documents (the page then waits for the whole view)."""
    import msprobe.readers
    from msprobe.compare import compare, pair_sources

    pairs = pair_sources(msprobe.readers.open(path, storage_options=storage_options),
                         msprobe.readers.open(bench, storage_options=storage_options))
    head_dir = os.path.join(data.work_dir, "first_look")
    target = _write_head(pairs[0][0], os.path.join(head_dir, "target"), FIRST_RECORDS)
    if not target:
        return False
    if _write_head(pairs[0][1], os.path.join(head_dir, "bench"), FIRST_RECORDS, set(target)) is None:
        return False
    out = os.path.join(head_dir, "compare")
    compare(os.path.join(head_dir, "target"), os.path.join(head_dir, "bench"), out, plot=False, progress=False,
            threshold=threshold)
    data.target, data.bench = path, bench  # the records, stacks and cluster views read the real dumps
    data.load_compare_output(out)
    # the cells still being compared: listed (no rows) so the overview has its shape at once
    for cell, (target_source, bench_source) in enumerate(pairs[1:], start=1):
        data.add_cell(cell, target_source, bench_source)
    data.first_look = {"records": len(target), "cells_compared": 1, "cells": len(pairs),
                       "note": f"the first {len(target):,} records of the first cell compared; "
                               f"the whole pair is being compared"}
    return True


def dump_first_look(data: Any, path: str, dump: Any, storage_options: Optional[dict]) -> bool:
    """Fill ``data`` with one dump's first look: every cell (its rank directories: nothing parsed) and
    the first cell's first :data:`FIRST_RECORDS` records, read from the head of its dump.json as the
    whole view reads every record (their statistics and NaN/Inf). False when the first cell is not a
    local rank directory with a dump.json."""
    import msprobe.readers

    sources = list(dump.sources)
    if not sources:
        return False
    head_dir = os.path.join(data.work_dir, "first_look")
    records = _write_head(sources[0], head_dir, FIRST_RECORDS)
    if not records:
        return False
    head = msprobe.readers.open(head_dir)
    if len(head.sources) != 1:
        return False
    data.load_dump(head, keep=False)
    data.target = path  # the records, stacks and trees read the real dump
    for cell, source in enumerate(sources[1:], start=1):
        data.add_cell(cell, source)
    data.first_look = {"records": len(records), "cells": len(sources),
                       "note": f"the first {len(records):,} records of the first cell read; every record of "
                               f"the dump is being read"}
    return True


def lake_first_look(data: Any, root: str, storage_options: Optional[dict]) -> bool:
    """Fill ``data`` with a lake's first look from the index it already has (``ROOT/_lake/``: its
    manifest's index files and its catalog's runs, read without opening the lake, which would look
    for new or changed rank directories first): every cell with its rows and NaN/Inf rows counted and
    the rows of the first NaN/Inf cell (else the first). False (``data`` untouched) when the root is
    not a local folder with such an index (the page then waits for the whole view)."""
    import msprobe.lake

    folder = local_path_of(root)
    if folder is None:
        return False
    lake_dir = os.path.join(folder, msprobe.lake.LAKE_DIR)
    manifest = os.path.join(lake_dir, "manifest.parquet")
    if not os.path.isfile(manifest):
        return False
    catalog = msprobe.lake.read_catalog(root, storage_options) or []
    runs = {row["run"]: row["url"] for row in catalog if row.get("run") and row.get("url")}
    keys = [found["key"] for found in data.query(
        f"SELECT DISTINCT coalesce(compact_key, index_key) AS key FROM read_parquet({sql_literal(manifest)}) ORDER BY 1")
        if found["key"]]
    files = [os.path.join(lake_dir, key) for key in keys]
    if not runs or not files or not all(os.path.isfile(path) for path in files):
        return False
    data.target = root
    data.load_lake_overview(files, runs)
    data.first_look = {"cells": len(data.query("SELECT cell FROM cells")),
                       "note": "every cell counted from the lake's index as it is, the rows of "
                               "one cell read; the lake is being opened (new or changed rank directories "
                               "indexed) and loaded"}
    return True
