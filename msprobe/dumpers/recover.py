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

from dataclasses import dataclass, field
from typing import Any, Optional

from msprobe.backends import Store, read_journal
from msprobe.errors import FormatError, MsprobeError
from msprobe.format.documents import DEBUG_JSON, DUMP_JSON, encode_documents
from msprobe.format.journal import RecordLine, Replay, StackLine, decode_line
from msprobe.format.layout import (
    JOURNAL_DIR,
    MARKER_FILE,
    STORE_DIR,
    TENSOR_DIR,
    data_dir_url,
    parse_rank_dir,
    parse_step_dir,
)
from msprobe.format.marker import decode_marker, encode_marker, with_document
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
            index = parts.index(JOURNAL_DIR)
            if index >= 1 and parse_rank_dir(parts[index - 1]) is not None:
                out.add("/".join(parts[:index]))
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
        for index, part in enumerate(parts[1:], 1):
            if part in (JOURNAL_DIR, TENSOR_DIR, STORE_DIR) and parse_rank_dir(parts[index - 1]) is not None:
                (journals if part == JOURNAL_DIR else data).add("/".join(parts[:index]))
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
    replay = _replay_journal(store, rank_prefix, res)
    data = replay.records
    has_parent = bool(replay.parents)  # of every journaled record, the dropped ones included
    _remove_stale_temps(store, f"{rank_prefix}/{TENSOR_DIR}")
    files = set(store.list_dir(f"{rank_prefix}/{TENSOR_DIR}"))
    zarr = _zarr_names(store, rank_prefix, res)
    if zarr is not None:  # tensor_store "zarr": the payloads its manifest (and manifest journal) says are stored
        files |= zarr
    for name in list(data):
        missing = [data_name for data_name in Record(name, data[name]).data_names() if data_name not in files]
        if missing:
            res.dropped_missing_tensor.append(name)
            replay.drop(name)
    task = task or marker.get("task") or ("tensor" if files else "statistics")
    level = level or marker.get("level") or ("mix" if has_parent else "L1")
    debug = level == "debug" or bool(data and all(name.endswith(".debug") for name in data))
    step_dir = rank_prefix.rsplit("/", 1)[0] if "/" in rank_prefix else ""
    tensor_dir = STORE_DIR if zarr is not None else TENSOR_DIR
    local = data_dir_url(store, f"{rank_prefix}/{tensor_dir}") if files else None
    doc = {"task": task, "level": level, "framework": marker.get("framework", framework),
           "dump_data_dir": local, "data": data}
    (doc_name, doc_bytes), *others = encode_documents(doc, debug=debug, stack=replay.stack_groups(),
                                                      construct=replay.parents, records_layout=False)  # spec 8.4
    store.put(f"{rank_prefix}/{doc_name}", doc_bytes)
    if "document_crc32" in marker:  # a marker of an earlier publish of this step: it now describes our document
        store.put(f"{rank_prefix}/{MARKER_FILE}", encode_marker(with_document(marker, doc_bytes)))
    for name, body in others:  # stack.json, construct.json
        store.put(f"{rank_prefix}/{name}", body)
    res.records = len(data)
    res.written = True
    for key in store.list_prefix(f"{rank_prefix}/{JOURNAL_DIR}"):  # consumed: the documents now hold it
        store.delete(key)
    _ = parse_step_dir(step_dir.rsplit("/", 1)[-1]) if step_dir else None
    return res


def _replay_journal(store: Store, rank_prefix: str, res: RecoveryResult) -> Replay:
    """The rank directory's journal replayed: its valid lines, the torn and invalid ones counted in ``res``."""
    replay = Replay()

    def truncated(key: str, partial: bytes) -> None:
        res.truncated_lines += 1

    for line in read_journal(store, f"{rank_prefix}/{JOURNAL_DIR}", on_truncated=truncated):
        entry = decode_line(line)
        if entry is None or isinstance(entry, StackLine) and not _all_strings(entry.frames):
            res.truncated_lines += 1  # torn, hostile (nested 100k deep), or neither form: ignored (spec 17)
            continue
        problem = _invalid_entry(entry) if isinstance(entry, RecordLine) else None
        if problem:  # validate would reject the documents: the record is dropped, and said
            res.dropped_invalid.append(f"{getattr(entry, 'name', '')[:120]!r}: {problem}")
            continue
        replay.add(entry)
    replay.finish()
    return replay


def _all_strings(frames: Any) -> bool:
    return isinstance(frames, list) and all(isinstance(frame, str) for frame in frames)


def _invalid_entry(entry: RecordLine) -> Optional[str]:
    """Why a journaled record would make the rebuilt documents invalid (what ``validate`` checks), or None."""
    if entry.stack is not None and not _all_strings(entry.stack):
        return "stack frames must be a list of strings"
    if entry.parent is not None and entry.has_parent and not isinstance(entry.parent, str):
        return "its parent is not a record name"
    try:
        Record(entry.name, entry.record).check(None)
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


def _remove_stale_temps(store: Store, prefix: str) -> None:
    """Temp files of writes the kill interrupted (never visible under a final name): remove them
    (only a file system has any: Store.remove_temps)."""
    store.remove_temps(prefix)


def _marker(store: ReadableStore, rank_prefix: str) -> dict:
    try:
        return decode_marker(store.get(f"{rank_prefix}/{MARKER_FILE}"))
    except Exception:  # noqa: BLE001 - an unreadable marker: recovered without it
        return {}
