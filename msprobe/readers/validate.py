"""Check a dump (any dialect) against the format specification.

Works over any object with the read side of :class:`msprobe.backends.Store`
(``get``, ``exists``, ``list_dir``), so it stays free of storage imports. Where the records'
payloads are loaded, they are loaded the way :mod:`msprobe.readers` loads them (tensor files and
the Zarr tensor store, each bounded by what its record declares).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from msprobe.errors import FormatError, MissingDependencyError, MsprobeError
from msprobe.format import check_digests
from msprobe.format.dialects import detect_dialect
from msprobe.format.documents import DEBUG_JSON, DUMP_JSON, SIDE_DOCUMENTS, DebugDocument, DumpDocument, loads_json
from msprobe.format.dtypes import itemsize
from msprobe.format.layout import (
    JOURNAL_DIR,
    MAPPING_CSV,
    STORE_DIR,
    TENSOR_DIR,
    RankLocation,
    check_format_version,
    discover,
    join_key,
    read_mapping,
    step_ranges,
    validate_marker,
)
from msprobe.format.marker import MARKER_FILE
from msprobe.format.protocols import ReadableStore
from msprobe.readers._tensor import load_tensor_file
from msprobe.tensor_store import ZarrTensorReader

__all__ = ["Problem", "Report", "validate_store", "AUTO_TENSOR_BYTES", "AUTO_TENSOR_COUNT"]


@dataclass
class Problem:
    severity: str  # 'error' | 'warning'
    file: str
    location: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.location}" if self.location else self.file
        return f"{self.severity}: {where}: {self.message}"


@dataclass
class Report:
    ranks: list = field(default_factory=list)
    problems: list = field(default_factory=list)
    records: int = 0
    tensor_files: int = 0
    dialects: set = field(default_factory=set)
    tensors_loaded: int = 0  #: payloads loaded (``tensors``: every one, by default for small dumps)
    tensors_not_loaded: int = 0  #: rank dirs whose payloads were too large to load by default

    @property
    def errors(self) -> list:
        return [problem for problem in self.problems if problem.severity == "error"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def summary(self) -> str:
        steps = sorted({loc.step for loc in self.ranks if loc.step is not None})
        ranks = sorted({loc.rank_dir for loc in self.ranks})
        state = "valid" if self.ok else f"INVALID ({len(self.errors)} errors)"
        warn = sum(1 for problem in self.problems if problem.severity == "warning")
        return (f"{state}: {len(steps)} step(s), {len(ranks)} rank dir(s) ({', '.join(ranks)}), "
                f"{len(self.ranks)} rank dump(s), {self.records} records, {self.tensor_files} tensor files, "
                f"dialect {', '.join(sorted(self.dialects)) or 'unknown'}" + (f", {warn} warning(s)" if warn else "")
                + (f", {self.tensors_loaded} tensor(s) loaded" if self.tensors_loaded else "")
                + (f", payloads of {self.tensors_not_loaded} rank dir(s) not loaded (over "
                   f"{AUTO_TENSOR_BYTES >> 20} MiB or {AUTO_TENSOR_COUNT} payloads declared; --tensors loads them)"
                   if self.tensors_not_loaded else ""))


def _load(store: ReadableStore, key: str, cls: Any, report: Report) -> Optional[Any]:
    try:
        return cls.loads(store.get(key), file=key, validate=False)
    except FormatError as exc:
        report.problems.append(Problem("error", key, exc.location or "", exc.message))
    except MsprobeError as exc:
        report.problems.append(Problem("error", key, "", str(exc)))
    return None


#: by default (``tensors=None``) a rank directory's payloads are all loaded when its records declare at
#: most this many bytes of tensors in at most AUTO_TENSOR_COUNT payloads
AUTO_TENSOR_BYTES = 256 << 20
AUTO_TENSOR_COUNT = 2000


def validate_store(store: ReadableStore, prefix: str = "", *, tensors: Optional[bool] = None) -> Report:
    """Validate every rank directory under ``prefix``; never raises for bad input.

    ``tensors``: True loads every payload (tensor file or Zarr payload) against its record (a
    symlink out of the dump, a truncated or oversized file, a corrupt shard, a shape or dtype
    mismatch are errors); False checks only that each payload exists; None (default) loads them
    where a rank directory's records declare at most :data:`AUTO_TENSOR_BYTES` of tensors."""
    report = Report()
    try:
        locs = discover(store, prefix)
    except MsprobeError as exc:
        report.problems.append(Problem("error", prefix or ".", "", str(exc)))
        return report
    if not locs:
        report.problems.append(Problem("error", prefix or ".", "",
                                       "no dump found: expected step<N>/rank|rank<N>|proc<pid>/dump.json"))
        return report
    report.ranks = locs
    pids: dict = {}  # (split, rank_dir) -> {pid of its marker: [steps]}
    for loc in locs:
        marker = _validate_rank(store, loc, report, tensors)
        if marker is not None and isinstance(marker.get("pid"), int) and loc.step is not None:
            pids.setdefault((loc.split, loc.rank_dir), {}).setdefault(marker["pid"], []).append(loc.step)
    for (split, rank_dir), by_pid in sorted(pids.items(), key=lambda kv: (kv[0][0] or "", kv[0][1])):
        if len(by_pid) > 1:  # one rank directory written by several processes: several runs (or a resumed one)
            parts = sorted((sorted(steps), pid) for pid, steps in by_pid.items())
            report.problems.append(Problem(
                "warning", f"{split + '/' if split else ''}step*/{rank_dir}", "",
                f"{rank_dir}/ was written by {len(parts)} processes: "
                + "; ".join(f"step(s) {step_ranges(st)} by pid {pid}" for st, pid in parts)
                + ": runs mixed in one dump_path (unless a run was resumed); dump with run_dir_policy 'clear' "
                  "to start clean"))
    return report


def _validate_rank(store: ReadableStore, loc: RankLocation, report: Report,
                   load_tensors: Optional[bool] = None) -> Optional[dict]:
    """Check one rank directory into ``report``; its marker (``msprobe_lake.json``) when valid."""
    names = set(store.list_dir(loc.prefix))
    doc_name = DUMP_JSON if DUMP_JSON in names else DEBUG_JSON if DEBUG_JSON in names else None
    if doc_name is None:
        why = "missing dump.json (or debug.json)"
        if JOURNAL_DIR in {name.rstrip("/") for name in names}:  # a run killed before it published: the journal holds it
            why += (f"; its crash journal {JOURNAL_DIR}/ is there (a killed run): 'msprobe recover DUMP_PATH' "
                    "rebuilds the documents from it")
        report.problems.append(Problem("error", join_key(loc.prefix, DUMP_JSON), "", why))
        return None
    marker = _check_marker(store, join_key(loc.prefix, MARKER_FILE), report) if MARKER_FILE in names else None
    key = join_key(loc.prefix, doc_name)
    doc = _load(store, key, DebugDocument if doc_name == DEBUG_JSON else DumpDocument, report)
    if doc is None:
        return marker
    bad_locations = set()  # entries the document check rejected: their payloads are not loaded too
    for problem in doc.problems():
        report.problems.append(Problem("error", key, problem.location or "", problem.message))
        bad_locations.add(problem.location or "")
    data = doc.data
    report.records += len(data)
    try:
        if "data" in doc.raw or marker is not None:  # no dialect for a document without records (a fragment)
            report.dialects.add(detect_dialect([loc.rank_dir], data, marker, doc.raw))
    except MsprobeError:
        pass
    tensor_files, zarr, mapping = _tensor_files(store, loc.prefix, names, report)
    named, payloads = _check_data_names(doc, key, tensor_files, mapping, bad_locations, report)
    if payloads and _load_wanted(load_tensors, payloads, report, store):
        _load_payloads(store, loc.prefix, key, payloads, mapping, zarr, report)
    if marker is not None:  # what the producer wrote vs what is there (concurrent runs, section 6)
        check_digests(store, loc.prefix, key, marker, tensor_files,
                      lambda *fields: report.problems.append(Problem(*fields)))
    converted = set(mapping.values())
    for file_name in sorted(tensor_files - set(named) - converted):
        report.problems.append(Problem("warning", join_key(loc.prefix, TENSOR_DIR, file_name), "",
                                       "tensor file named by no record"))
    for side_name, side_class in SIDE_DOCUMENTS.items():
        if side_name in names:
            side_key = join_key(loc.prefix, side_name)
            side_doc = _load(store, side_key, side_class, report)
            if side_doc is not None:
                try:
                    side_doc.validate()
                except FormatError as exc:
                    report.problems.append(Problem("error", exc.file or side_key, exc.location or "", exc.message))
    return marker


def _tensor_files(store: ReadableStore, prefix: str, names: set, report: Report) -> tuple[set, Any, dict]:
    """The payload names of a rank directory (tensor files and the Zarr store's payloads, mapping.csv
    left out), its Zarr reader (None without one) and its mapping of data names to converted files."""
    tensor_files = set(store.list_dir(join_key(prefix, TENSOR_DIR))) if TENSOR_DIR in names else set()
    zarr = None
    if STORE_DIR in names:  # the Zarr tensor store (section 21): its manifest names the payloads
        try:
            zarr = ZarrTensorReader(store, prefix)
            tensor_files |= set(zarr.names())
        except MsprobeError as exc:
            report.problems.append(Problem("error", join_key(prefix, STORE_DIR), "", str(exc)))
    mapping: dict = {}
    if MAPPING_CSV in tensor_files:
        tensor_files.discard(MAPPING_CSV)
        mapping = read_mapping(store.get(join_key(prefix, TENSOR_DIR, MAPPING_CSV)))
    report.tensor_files += len(tensor_files)
    return tensor_files, zarr, mapping


def _check_data_names(doc: DumpDocument, key: str, tensor_files: set, mapping: dict, bad_locations: set,
                      report: Report) -> tuple[dict, list]:
    """Check every tensor entry's data_name (unique, under its record's name, with a payload);
    ``{data_name: record name}`` and the (record name, JSON location, tensor entry) of every payload present."""
    named: dict = {}
    payloads: list = []
    for rec in doc.records():
        try:
            tensors = list(rec.tensors())
        except MsprobeError:
            continue
        for tensor in tensors:
            data_name = tensor.data_name
            if not isinstance(data_name, str):
                continue
            loc_json = f'$.data["{rec.name}"].{tensor.path}'
            if data_name in named:
                report.problems.append(Problem("error", key, loc_json,
                                               f"data_name {data_name!r} also named by {named[data_name]!r}"))
            named[data_name] = rec.name
            if not data_name.startswith(rec.name + "."):
                report.problems.append(Problem("warning", key, loc_json,
                                               f"data_name {data_name!r} does not start with its record name"))
            if mapping.get(data_name, data_name) not in tensor_files:
                report.problems.append(Problem("error", key, loc_json,
                                               f"data_name {data_name!r} has no file in {TENSOR_DIR}/"))
            elif loc_json not in bad_locations and f'$.data["{rec.name}"]' not in bad_locations:
                payloads.append((rec.name, loc_json, tensor))
    return named, payloads


def _load_wanted(load_tensors: Optional[bool], payloads: list, report: Report, store: ReadableStore) -> bool:
    if not hasattr(store, "open_read"):  # a minimal read-only adapter: names only
        return False
    if load_tensors is not None:
        return load_tensors
    declared = 0
    for _, _, tensor in payloads:
        try:
            declared += tensor.numel * (itemsize(tensor.dtype) or 8)
        except MsprobeError:
            continue  # a bad shape: already an error of the document
    if len(payloads) <= AUTO_TENSOR_COUNT and declared <= AUTO_TENSOR_BYTES:
        return True
    report.tensors_not_loaded += 1
    return False


def _load_payloads(store: ReadableStore, prefix: str, key: str, payloads: list, mapping: dict, zarr: Any,
                   report: Report) -> None:
    """Load every payload against its record, one at a time (each bounded by what its record
    declares); every failure is an error naming the record's JSON location."""
    missing_dep: set = set()
    for rec_name, loc_json, tensor in payloads:
        data_name = tensor.data_name
        ext = data_name.rsplit(".", 1)[-1] if "." in data_name else ""
        if ext in missing_dep:
            continue
        try:
            if zarr is not None and data_name in zarr:
                zarr.load(data_name, "numpy", record=rec_name, dtype=tensor.dtype, shape=tensor.shape)
            else:
                load_tensor_file(store, join_key(prefix, TENSOR_DIR, mapping.get(data_name, data_name)),
                                 record=rec_name,
                                 dtype=tensor.dtype, shape=tensor.shape, framework="numpy")
            report.tensors_loaded += 1
        except MissingDependencyError as exc:
            missing_dep.add(ext)
            report.problems.append(Problem("warning", key, loc_json, f"payloads not loaded: {exc}"))
        except MsprobeError as exc:
            report.problems.append(Problem("error", key, loc_json, str(exc)))


def _check_marker(store: ReadableStore, key: str, report: Report) -> Optional[dict]:
    try:
        marker = validate_marker(loads_json(store.get(key), key), key)
        check_format_version(marker["format_version"], key)
        return marker
    except FormatError as exc:
        report.problems.append(Problem("error", key, exc.location or "", exc.message))
    except MsprobeError as exc:
        report.problems.append(Problem("error", key, "", str(exc)))
    return None
