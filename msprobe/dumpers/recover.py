"""Rebuild dump.json / stack.json / construct.json of a killed run from its crash journal.

Each rank directory that was being written holds ``.journal/`` (JSON lines,
one record per line, see spec/FORMAT.md). Recovery replays the lines in
order (a later line for the same record replaces the earlier one, as
parameters_grad records grow), keeps only records whose tensor files all
exist (with ``tensor_store: "zarr"``: whose payloads the store's manifest and
manifest journal list as complete, spec/FORMAT.md 21.5), and publishes
the documents atomically. A truncated last line is skipped and counted.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional

from msprobe.backends import read_journal
from msprobe.backends._base import Store
from msprobe.backends._keys import is_temp_name
from msprobe.errors import FormatError, MsprobeError
from msprobe.format.documents import CONSTRUCT_JSON, DEBUG_JSON, DUMP_JSON, STACK_JSON, dumps_json
from msprobe.format.layout import JOURNAL_DIR, MARKER_FILE, STORE_DIR, TENSOR_DIR, parse_rank_dir, parse_step_dir
from msprobe.format.model import Record
from msprobe.format.protocols import ReadableStore
from msprobe.tensor_store import ZarrTensorReader

__all__ = ["RecoveryResult", "recover_store", "find_journals"]


@dataclass
class RecoveryResult:
    rank_prefix: str
    records: int = 0
    dropped_missing_tensor: list = field(default_factory=list)
    truncated_lines: int = 0
    written: bool = False
    stale_journal: bool = False
    tensor_store_error: Optional[str] = None
    dropped_invalid: list = field(default_factory=list)  #: journaled records validate would reject (why)

    def summary(self) -> str:
        if self.stale_journal:
            return f"{self.rank_prefix}: already complete ({self.records} records); stale journal removed"
        out = (f"{self.rank_prefix}: {self.records} records recovered, {self.truncated_lines} truncated line(s) "
               f"skipped, {len(self.dropped_missing_tensor)} record(s) dropped for missing tensor files"
               " (or payloads not complete in tensors.zarr)")
        if self.tensor_store_error:
            out += f"; tensor store unreadable: {self.tensor_store_error}"
        if self.dropped_invalid:
            out += (f"; {len(self.dropped_invalid)} malformed record(s) dropped (e.g. "
                    f"{self.dropped_invalid[0][:200].encode('unicode_escape').decode('ascii')})")
        return out


def find_journals(store: ReadableStore, prefix: str = "") -> list:
    """Rank prefixes under ``prefix`` that hold a non-empty journal."""
    out = set()
    for key in store.list_prefix(prefix):
        parts = key.split("/")
        if JOURNAL_DIR in parts:
            i = parts.index(JOURNAL_DIR)
            if i >= 1 and parse_rank_dir(parts[i - 1]) is not None:
                out.add("/".join(parts[:i]))
    return sorted(out)


def find_unfinished(store: ReadableStore, prefix: str = "") -> list:
    """Rank prefixes under ``prefix`` holding a journal, or tensor data without any document: a run
    killed after a record's tensor files were published but before the record was journaled
    leaves the latter (no journal yet), whose step still needs its documents."""
    journals: set[str] = set()
    data: set[str] = set()
    docs: set[str] = set()
    for key in store.list_prefix(prefix):
        parts = key.split("/")
        for i, part in enumerate(parts[1:], 1):
            if part in (JOURNAL_DIR, TENSOR_DIR, STORE_DIR) and parse_rank_dir(parts[i - 1]) is not None:
                (journals if part == JOURNAL_DIR else data).add("/".join(parts[:i]))
                break
        else:
            if parts[-1] in (DUMP_JSON, DEBUG_JSON):
                docs.add("/".join(parts[:-1]))
    return sorted(journals | (data - docs))


def recover_store(store: Store, prefix: str = "", *, task: Optional[str] = None, level: Optional[str] = None,
                  framework: str = "pytorch") -> list:
    results = []
    for rank_prefix in find_unfinished(store, prefix):
        results.append(_recover_rank(store, rank_prefix, task, level, framework))
    return results


def _recover_rank(store: Store, rank_prefix: str, task: Optional[str], level: Optional[str],
                  framework: str) -> RecoveryResult:
    res = RecoveryResult(rank_prefix)
    marker = _marker(store, rank_prefix)
    if marker.get("final") is True and (store.exists(f"{rank_prefix}/{DUMP_JSON}")
                                        or store.exists(f"{rank_prefix}/{DEBUG_JSON}")):
        # the step was published whole; the kill hit while its journal was being deleted:
        # the leftovers are a stale part of what the documents already hold
        res.records = int(marker.get("records") or 0)
        res.stale_journal = True
        for key in store.list_prefix(f"{rank_prefix}/{JOURNAL_DIR}"):
            store.delete(key)
        return res
    data: dict = {}
    construct: dict = {}
    stacks: dict = {}  # frames tuple -> [names]
    frames_of: dict = {}  # stack id -> frames
    has_parent = False

    def truncated(key: str, partial: bytes) -> None:
        res.truncated_lines += 1

    for line in read_journal(store, f"{rank_prefix}/{JOURNAL_DIR}", on_truncated=truncated):
        try:
            entry = json.loads(line)
            if "frames" in entry and "name" not in entry:
                frames_of[entry["stack_id"]] = tuple(_frames(entry["frames"]))
                continue
            name = entry["name"]
            problem = _invalid_entry(entry)
        except (ValueError, KeyError, TypeError, RecursionError):  # torn, or hostile (nested 100k deep)
            res.truncated_lines += 1
            continue
        if problem:  # validate would reject the documents: the record is dropped, and said
            res.dropped_invalid.append(f"{str(name)[:120]!r}: {problem}")
            continue
        data[name] = entry.get("record")
        if "parent" in entry:
            has_parent = True
            construct[name] = entry["parent"]
        frames = tuple(entry["stack"]) if entry.get("stack") is not None else frames_of.get(entry.get("stack_id"))
        if frames is not None:
            names = stacks.setdefault(frames, [])
            if name not in names:
                names.append(name)
    _remove_stale_temps(store, f"{rank_prefix}/{TENSOR_DIR}")
    files = set(store.list_dir(f"{rank_prefix}/{TENSOR_DIR}"))
    zarr = _zarr_names(store, rank_prefix, res)
    if zarr is not None:  # tensor_store "zarr": the payloads its manifest (and manifest journal) says are stored
        files |= zarr
    for name in list(data):
        missing = [dn for dn in Record(name, data[name]).data_names() if dn not in files]
        if missing:
            res.dropped_missing_tensor.append(name)
            del data[name]
            construct.pop(name, None)
    task = task or marker.get("task") or ("tensor" if files else "statistics")
    level = level or marker.get("level") or ("mix" if has_parent else "L1")
    debug = level == "debug" or (data and all(n.endswith(".debug") for n in data))
    step_dir = rank_prefix.rsplit("/", 1)[0] if "/" in rank_prefix else ""
    tdir = STORE_DIR if zarr is not None else TENSOR_DIR
    local = (store.local_path(f"{rank_prefix}/{tdir}") or f"{store.url.rstrip('/')}/{rank_prefix}/{tdir}"
             if files else None)
    doc = {"task": task, "level": level, "framework": marker.get("framework", framework),
           "dump_data_dir": local, "data": data}
    doc_bytes = dumps_json(doc).encode("utf-8")
    store.put(f"{rank_prefix}/{DEBUG_JSON if debug else DUMP_JSON}", doc_bytes)
    if "document_crc32" in marker:  # a marker of an earlier publish of this step: it now describes our document
        import zlib

        from msprobe.format.layout import MARKER_FILE

        marker["document_crc32"] = f"{zlib.crc32(doc_bytes):08x}"
        store.put(f"{rank_prefix}/{MARKER_FILE}", json.dumps(marker, indent=1).encode("utf-8"))
    if not debug:
        stack_doc = {str(i): [names, list(frames)] for i, (frames, names) in enumerate(stacks.items())}
        store.put(f"{rank_prefix}/{STACK_JSON}", dumps_json(stack_doc).encode("utf-8"))
        store.put(f"{rank_prefix}/{CONSTRUCT_JSON}", dumps_json(construct).encode("utf-8"))
    res.records = len(data)
    res.written = True
    for key in store.list_prefix(f"{rank_prefix}/{JOURNAL_DIR}"):  # consumed: the documents now hold it
        store.delete(key)
    _ = parse_step_dir(step_dir.rsplit("/", 1)[-1]) if step_dir else None
    return res


def _frames(frames: Any) -> list:
    if not isinstance(frames, list) or not all(isinstance(f, str) for f in frames):
        raise TypeError("stack frames must be a list of strings")
    return frames


def _invalid_entry(entry: dict) -> Optional[str]:
    """Why a journaled record would make the rebuilt documents invalid (what ``validate`` checks), or None."""
    name = entry.get("name")
    if not isinstance(name, str):
        return "the record name is not a string"
    if entry.get("stack") is not None:
        try:
            _frames(entry["stack"])
        except TypeError as exc:
            return str(exc)
    if "parent" in entry and entry["parent"] is not None and not isinstance(entry["parent"], str):
        return "its parent is not a record name"
    try:
        Record(name, entry.get("record")).check(None)
    except FormatError as exc:
        return exc.message
    except RecursionError:
        return "nested too deeply"
    return None


def _zarr_names(store: ReadableStore, rank_prefix: str, res: RecoveryResult) -> Optional[set]:
    """The data names whose payloads are complete in the rank's Zarr tensor store (spec 21.5:
    the group manifest merged with its manifest journal), or None when there is no store."""
    if not store.exists(f"{rank_prefix}/{STORE_DIR}/zarr.json"):
        return None

    try:
        return set(ZarrTensorReader(store, rank_prefix).names())
    except MsprobeError as exc:  # an unreadable manifest: no payload can be trusted
        res.tensor_store_error = str(exc)
        return set()


def _remove_stale_temps(store: ReadableStore, prefix: str) -> None:
    """Temp files of writes the kill interrupted (never visible under a final name): remove them."""
    import os

    local = store.local_path(prefix) if getattr(store, "is_local", False) else None
    if not local or not os.path.isdir(local):
        return
    for fn in os.listdir(local):
        if is_temp_name(fn):
            try:
                os.unlink(os.path.join(local, fn))
            except OSError:
                pass


def _marker(store: ReadableStore, rank_prefix: str) -> dict:
    try:
        raw = json.loads(store.get(f"{rank_prefix}/{MARKER_FILE}"))
        return raw if isinstance(raw, dict) else {}
    except Exception:  # noqa: BLE001 - an unreadable marker: recovered without it
        return {}
