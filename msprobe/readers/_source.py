"""Raw I/O of one rank directory: listings, documents, mapping.csv, tensor files, index.

Separate from the data model (tfdbg keeps its reader apart from its data objects):
everything here is lazy and cached, and :meth:`RankSource.refresh` drops what a
still-running dump may have changed.
"""
from __future__ import annotations

import json
from typing import Any, Optional

from msprobe.errors import DocumentError, MsprobeError, RecordNotFoundError, StorageNotFoundError
from msprobe.format.documents import (
    CONSTRUCT_JSON,
    DEBUG_JSON,
    DUMP_JSON,
    STACK_JSON,
    ConstructDocument,
    DumpDocument,
    StackDocument,
)
from msprobe.format.layout import INDEX_DIR, MAPPING_CSV, MARKER_FILE, TENSOR_DIR
from msprobe.format.naming import check_file_name
from msprobe.format.validate import RankLocation, read_mapping

__all__ = ["RankSource", "INDEX_FILE", "join"]

#: The index file of a rank directory, relative to it.
INDEX_FILE = f"{INDEX_DIR}/records.parquet"


def join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


class RankSource:
    """One rank directory of a dump (``stepN/rank``, ``rank{R}``, ``proc{pid}``...).

    ``prefer_index``: answer rows and record digests from ``index/records.parquet``
    when the rank directory has one (see :attr:`use_index`).
    """

    index_only = False

    def __init__(self, store: Any, loc: RankLocation, *, run: Optional[str] = None, prefer_index: bool = False):
        self.store = store
        self.prefer_index = prefer_index
        self.loc = loc
        self.prefix = loc.prefix
        self.step: Optional[int] = loc.step
        self.rank: Optional[int] = loc.rank
        self.rank_dir: str = loc.rank_dir
        self.split: Optional[str] = loc.split
        self.run = run
        self._reset()

    def _reset(self) -> None:
        self._names: Optional[set] = None
        self._doc: Optional[DumpDocument] = None
        self._stack: Any = False
        self._construct: Any = False
        self._mapping: Optional[dict] = None
        self._marker: Any = False
        self._doc_size: Optional[int] = None
        self._index_meta: Any = False
        self._use_index: Optional[bool] = None

    @property
    def use_index(self) -> bool:
        """True when rows and digests come from this rank's Parquet index."""
        if self._use_index is None:
            self._use_index = bool(self.prefer_index and self.has_index())
        return self._use_index

    @property
    def index_store(self) -> Any:
        return self.store

    # -- identity -----------------------------------------------------------
    @property
    def key(self) -> tuple:
        return (self.split or "", self.step if self.step is not None else -1, self.rank_dir)

    def __repr__(self) -> str:
        return f"RankSource({self.url!r})"

    @property
    def url(self) -> str:
        base = self.store.url.rstrip("/")
        return f"{base}/{self.prefix}" if self.prefix else base

    def _k(self, *parts: str) -> str:
        return join(self.prefix, *parts)

    # -- listings -----------------------------------------------------------
    def names(self) -> set:
        if self._names is None:
            self._names = set(self.store.list_dir(self.prefix))
        return self._names

    @property
    def doc_name(self) -> Optional[str]:
        names = self.names()
        if DUMP_JSON in names:
            return DUMP_JSON
        if DEBUG_JSON in names:
            return DEBUG_JSON
        return None

    @property
    def doc_key(self) -> str:
        return self._k(self.doc_name or DUMP_JSON)

    @property
    def index_key(self) -> str:
        return self._k(INDEX_FILE)

    def has_index(self) -> bool:
        return INDEX_DIR in self.names() and self.store.exists(self.index_key)

    # -- documents ------------------------------------------------------------
    def document(self) -> DumpDocument:
        """dump.json (or debug.json), parsed once; an empty document when neither exists yet."""
        if self._doc is None:
            name = self.doc_name
            if name is None:
                self._doc = DumpDocument.new(None, None, None)  # type: ignore[arg-type]
                self._doc.file = self.doc_key
            else:
                key = self._k(name)
                try:
                    data = self.store.get(key)
                except StorageNotFoundError:
                    self._names = None
                    raise
                self._doc_size = len(data)
                doc = DumpDocument.loads(data, file=key, validate=False)
                if "data" in doc.raw and not isinstance(doc.raw["data"], dict):
                    raise DocumentError("'data' must be an object", file=key, location="$.data")
                self._doc = doc
        return self._doc

    @property
    def loaded(self) -> bool:
        return self._doc is not None

    def _optional_doc(self, name: str, cls: Any) -> Any:
        if name not in self.names():
            return None
        try:
            return cls.loads(self.store.get(self._k(name)), file=self._k(name), validate=False)
        except StorageNotFoundError:
            return None

    def stack(self) -> Optional[StackDocument]:
        if self._stack is False:
            self._stack = self._optional_doc(STACK_JSON, StackDocument)
        return self._stack

    def construct(self) -> Optional[ConstructDocument]:
        if self._construct is False:
            self._construct = self._optional_doc(CONSTRUCT_JSON, ConstructDocument)
        return self._construct

    def stack_ids(self) -> dict:
        sd = self.stack()
        return sd.ids_of() if sd is not None else {}

    def parents(self) -> dict:
        cd = self.construct()
        return cd.raw if cd is not None else {}

    def marker(self) -> dict:
        """Our ``msprobe_lake.json`` marker (``{}`` for dumps of the real tool)."""
        if self._marker is False:
            self._marker = {}
            if MARKER_FILE in self.names():
                try:
                    m = json.loads(self.store.get(self._k(MARKER_FILE)))
                    self._marker = m if isinstance(m, dict) else {}
                except (ValueError, MsprobeError):
                    self._marker = {}
        return self._marker

    def mapping(self) -> dict:
        """mapping.csv (original file name -> converted 32-digit name), in the tensor dir or the rank dir."""
        if self._mapping is None:
            self._mapping = {}
            for key in (self._k(TENSOR_DIR, MAPPING_CSV), self._k(MAPPING_CSV)):
                try:
                    self._mapping.update(read_mapping(self.store.get(key)))
                except StorageNotFoundError:
                    continue
        return self._mapping

    # -- tensors --------------------------------------------------------------
    def tensor_key(self, data_name: str) -> str:
        """The storage key of a tensor file; refuses names that would escape dump_tensor_data."""
        check_file_name(data_name)
        mapped = self.mapping().get(data_name, data_name) if self._has_mapping() else data_name
        check_file_name(mapped)
        return self._k(TENSOR_DIR, mapped)

    def _has_mapping(self) -> bool:
        if self._mapping is not None:
            return bool(self._mapping)
        if MAPPING_CSV in self.names():
            return bool(self.mapping())
        try:
            return MAPPING_CSV in self.store.list_dir(self._k(TENSOR_DIR)) and bool(self.mapping())
        except MsprobeError:
            return False

    # -- records ----------------------------------------------------------------
    def raw_record(self, name: str) -> Any:
        data = self.document().data
        if name not in data:
            raise RecordNotFoundError(f"no record {name!r} in {self.doc_key}")
        return data[name]

    # -- index ------------------------------------------------------------------
    def index_metadata(self) -> dict:
        """Key-value metadata of this rank's Parquet index ({} when there is none)."""
        if self._index_meta is False:
            from msprobe.readers.index import read_index_metadata

            self._index_meta = read_index_metadata(self.store, self.index_key) if self.has_index() else {}
        return self._index_meta

    # -- live dumps ---------------------------------------------------------------
    def refresh(self) -> bool:
        """Forget cached listings and documents if dump.json changed; True when it did."""
        old_size, had_doc = self._doc_size, self._doc is not None
        old_names = self._names
        self._names = None
        changed = old_names is not None and self.names() != old_names
        if had_doc and self.doc_name is not None:
            try:
                changed = changed or self.store.size(self.doc_key) != old_size
            except StorageNotFoundError:
                changed = True
        if changed:
            self._reset()
        return changed


def parse_partition_path(key: str) -> dict:
    """``run=a/step=0/rank=3/records.parquet`` -> {'run': 'a', 'step': 0, 'rank': 3, ...}."""
    out: dict = {}
    for part in key.split("/")[:-1]:
        if "=" in part:
            k, v = part.split("=", 1)
            out[k] = v
    if "step" in out:
        out["step"] = int(out["step"]) if out["step"].isdigit() else None
    if "rank" in out:
        r = out["rank"]
        if r.isdigit():
            out["rank"], out["rank_dir"] = int(r), f"rank{r}"
        else:
            from msprobe.format.layout import parse_rank_dir

            rd = parse_rank_dir(r)
            out["rank"], out["rank_dir"] = (rd.rank if rd else None), r
    return out


class IndexSource:
    """One index file of an index-only lake (written by ``build_index(..., out=URL)``).

    Rows and record digests come from the file; full records, stacks and tensors
    from the rank directory it names in its metadata (``source``), opened on demand
    with the same storage options.
    """

    index_only = True
    use_index = True

    def __init__(self, index_store: Any, index_key: str, *, storage_options: Optional[dict] = None):
        self.index_store = index_store
        self.index_key = index_key
        self._options = storage_options
        hints = parse_partition_path(index_key)
        self.run: Optional[str] = hints.get("run")
        self.split: Optional[str] = hints.get("split")
        self.step: Optional[int] = hints.get("step")
        self.rank: Optional[int] = hints.get("rank")
        self.rank_dir: str = hints.get("rank_dir") or index_key.rsplit("/", 1)[0]
        self._meta: Optional[dict] = None
        self._rank: Optional[RankSource] = None

    @property
    def key(self) -> tuple:
        return (self.run or "", self.split or "", self.step if self.step is not None else -1, self.rank_dir)

    def __repr__(self) -> str:
        return f"IndexSource({self.url!r})"

    @property
    def url(self) -> str:
        return f"{self.index_store.url.rstrip('/')}/{self.index_key}"

    def has_index(self) -> bool:
        return True

    def index_metadata(self) -> dict:
        if self._meta is None:
            from msprobe.readers.index import read_index_metadata

            self._meta = read_index_metadata(self.index_store, self.index_key)
            m = self._meta
            self.rank_dir = m.get("rank_dir") or self.rank_dir
        return self._meta

    def rank_source(self) -> RankSource:
        """The rank directory this index describes (opened on first use)."""
        if self._rank is None:
            source = self.index_metadata().get("source")
            if not source:
                raise StorageNotFoundError(f"index {self.url} does not say where its dump is (no 'source')")
            from msprobe.readers._store import open_store

            store = open_store(source, self._options, read_only=True)
            loc = RankLocation("", self.step, self.rank_dir, self.rank, self.split)
            self._rank = RankSource(store, loc, run=self.run)
        return self._rank

    # the rank directory's side, delegated
    @property
    def store(self) -> Any:
        return self.rank_source().store

    def document(self) -> DumpDocument:
        return self.rank_source().document()

    def raw_record(self, name: str) -> Any:
        return self.rank_source().raw_record(name)

    def stack(self) -> Optional[StackDocument]:
        return self.rank_source().stack()

    def construct(self) -> Optional[ConstructDocument]:
        return self.rank_source().construct()

    def stack_ids(self) -> dict:
        return self.rank_source().stack_ids()

    def parents(self) -> dict:
        return self.rank_source().parents()

    def mapping(self) -> dict:
        return self.rank_source().mapping()

    def marker(self) -> dict:
        return {}

    def tensor_key(self, data_name: str) -> str:
        return self.rank_source().tensor_key(data_name)

    @property
    def doc_name(self) -> Optional[str]:
        return self.index_metadata().get("doc")

    def refresh(self) -> bool:
        return False
