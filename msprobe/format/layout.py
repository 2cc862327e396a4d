"""Directory layout (the dialects, what each producer writes differently: :mod:`msprobe.format.dialects`).

A dump root holds ``step{N}/`` directories (optionally under ``graph/`` and
``pynative/`` for MindSpore jit at L0/mix); a step holds one directory per
process: ``rank`` (single process, msprobe 8.x and the docs), ``rank{R}``
(distributed) or ``proc{pid}`` (single process, msprobe 26.x); a rank
directory holds ``dump.json`` (or ``debug.json``), ``stack.json``,
``construct.json``, ``dump_tensor_data/`` and optionally ``mapping.csv``,
``dump_error_info.log`` and our own ``msprobe_lake.json`` and ``index/``.
"""
from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from msprobe import FORMAT_VERSION  # the one definition, re-exported here
from msprobe.errors import DocumentError, UnknownDialectError
from msprobe.format.protocols import ReadableStore

__all__ = [
    "RankLocation",
    "discover",
    "dump_dir_of",
    "read_mapping",
    "encode_mapping",
    "data_dir_url",
    "STEP_DIR_RE",
    "step_ranges",
    "RANK_DIR_RE",
    "TENSOR_DIR",
    "MARKER_FILE",
    "MAPPING_CSV",
    "ERROR_LOG",
    "JOURNAL_DIR",
    "INDEX_DIR",
    "GRAPH_SPLIT_DIRS",
    "RankDir",
    "parse_step_dir",
    "parse_rank_dir",
    "rank_dir_name",
    "FORMAT_VERSION",
    "STORE_DIR",
    "join_key",
    "FORMAT_VERSION_RE",
    "validate_marker",
    "check_format_version",
]

FORMAT_VERSION_RE = re.compile(r"^(?P<major>[0-9]+)\.(?P<minor>[0-9]+)$")

STEP_DIR_RE = re.compile(r"^step(?P<step>\d+)$")
RANK_DIR_RE = re.compile(r"^(?:rank(?P<rank>\d+)?|proc(?P<pid>\d+))$")
TENSOR_DIR = "dump_tensor_data"
MARKER_FILE = "msprobe_lake.json"
MAPPING_CSV = "mapping.csv"
ERROR_LOG = "dump_error_info.log"
JOURNAL_DIR = ".journal"
INDEX_DIR = "index"
#: the Zarr tensor store of a rank directory (spec section 21; :mod:`msprobe.tensor_store`)
STORE_DIR = "tensors.zarr"
GRAPH_SPLIT_DIRS = ("graph", "pynative")


def join_key(*parts: str) -> str:
    """Join storage key parts with ``/``: empty parts and the slashes around each are dropped
    (``join_key("", "step0/", "rank0")`` is ``"step0/rank0"``). The one key joiner of the package."""
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


def parse_step_dir(name: str) -> Optional[int]:
    match = STEP_DIR_RE.match(name)
    return int(match.group("step")) if match else None


@dataclass(frozen=True)
class RankDir:
    name: str
    rank: Optional[int]  # None for 'rank' and 'proc<pid>'
    pid: Optional[int] = None


def parse_rank_dir(name: str) -> Optional[RankDir]:
    match = RANK_DIR_RE.match(name)
    if not match:
        return None
    rank, pid = match.group("rank"), match.group("pid")
    return RankDir(name, None if rank is None else int(rank), None if pid is None else int(pid))


def step_ranges(nums: list) -> str:
    """Sorted step (or rank) numbers as ranges: ``[0, 1, 2, 5]`` -> ``"0-2,5"``; ``[]`` -> ``"-"``."""
    out: list = []
    for num in nums:
        if out and num == out[-1][1] + 1:
            out[-1][1] = num
        else:
            out.append([num, num])
    return ",".join(str(first) if first == last else f"{first}-{last}" for first, last in out) or "-"


def rank_dir_name(rank: Optional[int], *, pid: Optional[int] = None) -> str:
    if rank is not None:
        return f"rank{rank}"
    return f"proc{pid}" if pid is not None else "rank"


def read_marker(raw: Any) -> dict:
    return raw if isinstance(raw, dict) else {}


_MARKER_STRINGS = ("producer", "framework", "task", "level", "summary_mode", "tensor_format")


def validate_marker(raw: Any, file: Optional[str] = None) -> dict:
    """Check ``msprobe_lake.json`` (spec/FORMAT.md section 6); return it, or raise DocumentError."""
    if not isinstance(raw, dict):
        raise DocumentError(f"expected a JSON object, got {type(raw).__name__}", file=file, location="$")
    version = raw.get("format_version")
    if not isinstance(version, str) or not FORMAT_VERSION_RE.match(version):
        raise DocumentError(f"'format_version' must be a string 'MAJOR.MINOR', got {version!r}",
                            file=file, location="$.format_version")
    d = raw.get("dialect")
    if not isinstance(d, str) or not d:
        raise DocumentError(f"'dialect' must be a non-empty string, got {d!r}", file=file, location="$.dialect")
    for key in _MARKER_STRINGS:
        if key in raw and not isinstance(raw[key], str):
            raise DocumentError(f"'{key}' must be a string", file=file, location=f"$.{key}")
    for key, ok, want in _MARKER_TYPED:
        if key in raw and not ok(raw[key]):
            raise DocumentError(f"'{key}' must be {want}, got {raw[key]!r}", file=file, location=f"$.{key}")
    return raw


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


#: the typed keys of the marker (spec/FORMAT.md section 6): key, check, what it must be
_MARKER_TYPED = (
    ("step", lambda v: v is None or _count(v), "an integer >= 0 or null"),
    ("rank", lambda v: v is None or _count(v), "an integer >= 0 or null"),
    ("records", _count, "an integer >= 0"),
    ("complete", lambda v: isinstance(v, bool), "a boolean"),
    ("final", lambda v: isinstance(v, bool), "a boolean"),
    ("pid", lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    ("document_crc32", lambda v: isinstance(v, str) and re.fullmatch(r"[0-9a-f]{8}", v) is not None,
     "8 lowercase hex digits"),
    ("files", lambda v: isinstance(v, dict), "an object"),
)


def check_format_version(version: str, file: Optional[str] = None) -> None:
    """Refuse a major version other than ours (spec/FORMAT.md 2.3); any minor is accepted."""
    match = FORMAT_VERSION_RE.match(version or "")
    ours = FORMAT_VERSION_RE.match(FORMAT_VERSION)
    assert ours is not None
    if not match or match.group("major") != ours.group("major"):
        raise UnknownDialectError(f"format version {version!r} is not supported (this reader implements "
                                  f"{FORMAT_VERSION}; any {ours.group('major')}.x is accepted)", file=file)


# --- finding the rank directories of a dump in a store, and its mapping.csv ---


@dataclass
class RankLocation:
    """One rank directory of a dump: its key prefix and what it belongs to."""

    prefix: str  # key prefix of the rank directory ('' when the store is rooted at it)
    step: Optional[int]
    rank_dir: str
    rank: Optional[int]
    split: Optional[str] = None  # 'graph' | 'pynative' for MindSpore jit dumps


#: the documents a user may name instead of their rank directory (8.x and 26.x accept a dump.json)
def dump_dir_of(path: str) -> str:
    """The rank directory of ``path`` when it names a dump document (``.../dump.json``), else ``path``."""
    url = str(path).rstrip("/")
    head, _, base = url.rpartition("/")
    if base in ("dump.json", "debug.json"):
        return head or ("/" if url.startswith("/") else ".")
    return str(path)


def _is_rank_dir(store: ReadableStore, prefix: str) -> bool:
    names = store.list_dir(prefix)
    return "dump.json" in names or "debug.json" in names or TENSOR_DIR in names


def discover(store: ReadableStore, prefix: str = "") -> list[RankLocation]:
    """Every rank directory under ``prefix``: the prefix may be a dump root, a ``graph``/
    ``pynative`` split root, a step directory or a rank directory."""
    here = prefix.rstrip("/").rsplit("/", 1)[-1]
    if _is_rank_dir(store, prefix):
        rank_dir = parse_rank_dir(here)
        step_name = prefix.rstrip("/").rsplit("/", 2)[-2] if prefix.count("/") else ""
        return [RankLocation(prefix, parse_step_dir(step_name), here or ".", rank_dir.rank if rank_dir else None)]
    out: list[RankLocation] = []
    names = store.list_dir(prefix)
    steps = [(parse_step_dir(n), n) for n in names if parse_step_dir(n) is not None]
    if steps:
        for step, name in sorted(steps):
            out.extend(_ranks_of_step(store, join_key(prefix, name), step))
    elif any(parse_rank_dir(n) for n in names):
        out.extend(_ranks_of_step(store, prefix, parse_step_dir(here)))
    else:
        for split in GRAPH_SPLIT_DIRS:
            if split in names:
                for loc in discover(store, join_key(prefix, split)):
                    loc.split = split
                    out.append(loc)
    return out


def _ranks_of_step(store: ReadableStore, step_prefix: str, step: Optional[int]) -> Iterator[RankLocation]:
    found = []
    for name in store.list_dir(step_prefix):
        rank_dir = parse_rank_dir(name)
        if rank_dir is not None:
            found.append(RankLocation(join_key(step_prefix, name), step, name, rank_dir.rank))
    return iter(sorted(found, key=lambda r: (r.rank is None, r.rank or 0, r.rank_dir)))


_CONVERTED_RE = re.compile(r"^\d{32}(?:\.[A-Za-z0-9]+)?$")


def encode_mapping(mapping: dict) -> bytes:
    """{original file name: converted file name} -> mapping.csv, rows ``converted,original``
    (the real tool's column order, spec/FORMAT.md 14.3)."""
    return "".join(f"{file_name},{data_name}\n" for data_name, file_name in mapping.items()).encode("utf-8")


def data_dir_url(store: ReadableStore, key: str) -> str:
    """``dump_data_dir`` of a document: the local path of ``key`` (a tensor directory), else its URL."""
    return store.location(key)


def read_mapping(data: bytes) -> dict:
    """mapping.csv -> {original file name: converted file name}.

    Rows are ``converted,original`` (the real tool's column order, spec/FORMAT.md 14.3);
    the reverse order is accepted too, recognising the converted name (32 digits plus an
    extension). Header-like and short rows are skipped."""
    out = {}
    for row in csv.reader(io.StringIO(data.decode("utf-8", errors="replace"))):
        if len(row) < 2:
            continue
        data_name, file_name = row[0].strip(), row[1].strip()
        if not data_name or not file_name:
            continue
        if _CONVERTED_RE.match(data_name) and not _CONVERTED_RE.match(file_name):
            out[file_name] = data_name
        elif _CONVERTED_RE.match(file_name) and not _CONVERTED_RE.match(data_name):
            out[data_name] = file_name
        elif not data_name.lower().startswith(("original", "converted", "hash")):
            out[file_name] = data_name  # real-tool order by default
    return out
