"""Raw I/O of one rank directory: listings, documents, mapping.csv, tensor files, index.

Separate from the data model (tfdbg keeps its reader apart from its data objects):
everything here is lazy and cached, and :meth:`RankSource.refresh` drops what a
still-running dump may have changed.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from msprobe.errors import (
    DocumentError,
    MsprobeError,
    RecordNotFoundError,
    StorageNotFoundError,
    UnknownDialectError,
)
from msprobe.format.documents import (
    CONSTRUCT_JSON,
    DEBUG_JSON,
    DUMP_JSON,
    STACK_JSON,
    ConstructDocument,
    DumpDocument,
    StackDocument,
)
from msprobe.format.fastjson import loads_json_bytes
from msprobe.format.fragments import HEADER_KEYS, not_a_document, read_fragment
from msprobe.format.journal import Replay
from msprobe.format.layout import (
    INDEX_DIR,
    JOURNAL_DIR,
    MAPPING_CSV,
    STORE_DIR,
    TENSOR_DIR,
    RankLocation,
    join_key,
    read_mapping,
)
from msprobe.format.marker import MARKER_FILE, decode_marker
from msprobe.format.naming import check_file_name
from msprobe.format.protocols import ReadableStore
from msprobe.index.files import (
    INDEX_FILE,
    doc_stat,
    parse_partition_path,
    read_index_metadata,
    stale_reason,
    warn_stale,
)
from msprobe.readers._store import open_store

if TYPE_CHECKING:
    from msprobe.readers.protocols import DumpSource

__all__ = ["RankSource", "IndexSource", "INDEX_FILE", "records_of", "task_of", "loads_json_bytes"]

#: Major versions of the format (msprobe_lake.json ``format_version``) this reader accepts.
SUPPORTED_MAJORS = ("1",)


def _part_order(key: str) -> tuple:
    import re

    name = key.rsplit("/", 1)[-1]
    m = re.search(r"(\d+)\.parquet$", name)
    return (int(m.group(1)) if m else -1, name)


def parse_document(data: bytes, file: str) -> DumpDocument:
    """dump.json/debug.json for reading: a C JSON parser (:func:`loads_json_bytes`; NaN/Infinity
    accepted; about 4x faster than the validating :func:`msprobe.format.documents.loads_json`,
    which ``msprobe validate`` uses). Malformed input still raises a DocumentError naming the
    file (the validating parser is rerun to say where); duplicate keys are not checked."""
    try:
        obj = loads_json_bytes(data[3:] if data[:3] == b"\xef\xbb\xbf" else data)
    except RecursionError:
        raise DocumentError("JSON nested too deeply", file=file) from None
    except (ValueError, UnicodeDecodeError):
        from msprobe.format.documents import loads_json

        obj = loads_json(data, file)  # raises the precise DocumentError
    if not isinstance(obj, dict):
        raise DocumentError(f"expected a JSON object, got {type(obj).__name__}", file=file, location="$")
    if b"\\ud" in data or b"\\uD" in data:  # a \uD800-\uDFFF escape: perhaps a lone surrogate (valid JSON)
        try:
            obj = _escaped_lone_surrogates(obj)
        except RecursionError:
            raise DocumentError("JSON nested too deeply", file=file) from None
    if not any(key in obj for key in HEADER_KEYS):  # no header: an API-info fragment, or not a dump document
        fragment = read_fragment(obj)
        if fragment is None:
            raise not_a_document(obj, file)
        obj = fragment.document()
    return DumpDocument(obj, file)


def _escaped_lone_surrogates(obj: Any) -> Any:
    """``obj`` with each string (key or value) that holds a lone surrogate (``"\\ud800"`` in the JSON: valid
    JSON, but no UTF-8 text, so no CSV cell, CRC-32, Arrow string or terminal line can take it) written as the
    document writes it: the surrogate as its ``\\udXXX`` escape text. Nothing is lost (the text is the JSON's own
    spelling of it), both sides of a compare read it alike, and every other string is the same object."""
    if isinstance(obj, str):
        try:
            obj.encode("utf-8")
        except UnicodeEncodeError:
            return obj.encode("utf-8", "backslashreplace").decode("utf-8")
        return obj
    if isinstance(obj, dict):
        return {_escaped_lone_surrogates(k): _escaped_lone_surrogates(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_escaped_lone_surrogates(v) for v in obj]
    return obj


def _num(v: Optional[int]) -> int:
    return -1 if v is None else v


class RankSource:
    """One rank directory of a dump (``stepN/rank``, ``rank{R}``, ``proc{pid}``...).

    ``prefer_index``: answer rows and record digests from ``index/records.parquet``
    when the rank directory has one (see :attr:`use_index`).
    """

    index_only = False

    def __init__(self, store: ReadableStore, loc: RankLocation, *, run: Optional[str] = None, prefer_index: bool = False):
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

    def release(self) -> None:
        """Drop everything read so far (documents, listings, mapping); the next use reads again. Bounds memory
        when many ranks are walked one after another."""
        self._reset()

    @property
    def doc_size(self) -> Optional[int]:
        """The size in bytes of the dump document as last read; None before it is read."""
        return self._doc_size

    def has_mapping(self) -> bool:
        """Whether the rank has a mapping.csv (one listing of dump_tensor_data, cached)."""
        return self._has_mapping()

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
        self._index_keys: Optional[list] = None
        self._has_map: Optional[bool] = None
        self._journal_live: Optional[bool] = None
        self._journal: Optional[dict] = None
        self._tstore: Any = False  # False: not looked up yet; then a ZarrTensorReader or None
        self._view: Optional[tuple] = None  # (header, records) attached by a reader of the document's bytes

    @property
    def use_index(self) -> bool:
        """True when rows and digests come from this rank's Parquet index."""
        if self._use_index is None:
            # a live journal holds records the index cannot know about: read the documents then
            self._use_index = bool(self.prefer_index and self.has_index() and not self.has_journal()
                                   and self._index_covers())
        return self._use_index

    def _index_covers(self) -> bool:
        """False (with a StaleIndexWarning) when the document changed since the index was built."""
        if self.doc_name is None:
            return True
        size, mtime = doc_stat(self.store, self.doc_key)
        reason = stale_reason(self.index_metadata(), size, mtime, local=bool(getattr(self.store, "exact_mtimes", False)))
        if reason is not None:
            warn_stale(self.url, reason)
        return reason is None

    @property
    def index_store(self) -> Any:
        return self.store

    # -- identity -----------------------------------------------------------
    @property
    def key(self) -> tuple:
        """Sort key: split, step, rank (numerically; single-process directories first), name."""
        return ("", self.split or "", _num(self.step), _num(self.rank), self.rank_dir)

    def __repr__(self) -> str:
        return f"RankSource({self.url!r})"

    @property
    def url(self) -> str:
        base = self.store.url.rstrip("/")
        return f"{base}/{self.prefix}" if self.prefix else base

    def _k(self, *parts: str) -> str:
        return join_key(self.prefix, *parts)

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
        """Where this rank's index is written (``index/records.parquet``)."""
        return self._k(INDEX_FILE)

    def index_keys(self) -> list:
        """Every Parquet part under ``index/`` (``records.parquet``, or ``part-N.parquet``...)."""
        if self._index_keys is None:
            keys: list = []
            if INDEX_DIR in self.names():
                keys = [self._k(INDEX_DIR, n) for n in self.store.list_dir(self._k(INDEX_DIR))
                        if n.endswith(".parquet")]
            self._index_keys = sorted(keys, key=_part_order)
        return self._index_keys

    def has_index(self) -> bool:
        return bool(self.index_keys())

    # -- documents ------------------------------------------------------------
    def document(self) -> DumpDocument:
        """dump.json (or debug.json), parsed once; an empty document when neither exists yet.

        Records of the crash journal (``.journal/``, a dump still being written by
        msprobe-lake) that the document does not hold yet are appended to it."""
        if self._doc is None:
            self._check_marker()
            name = self.doc_name
            if name is None:
                m = self.marker()
                doc = DumpDocument.new(m.get("task"), m.get("level"), m.get("framework"))
                doc.file = self.doc_key
                self._doc = doc
            else:
                key = self._k(name)
                try:
                    data = self.store.get(key)
                except StorageNotFoundError:
                    self._names = None
                    raise
                self._doc_size = len(data)
                doc = parse_document(data, key)
                if "data" in doc.raw and not isinstance(doc.raw["data"], dict):
                    raise DocumentError("'data' must be an object", file=key, location="$.data")
                self._doc = doc
            if self.has_journal():
                self._merge_journal(self._doc)
        return self._doc

    def document_bytes(self) -> Optional[bytes]:
        """The document's bytes as :meth:`document` reads them (the marker's format version checked
        first), for a reader of its own (compare's scanner); None where there is no document yet or
        a journal adds records to it (those are in the parsed document alone)."""
        if self.doc_name is None or self.has_journal():
            return None
        self._check_marker()
        return self.store.get(self.doc_key)

    def attach_view(self, header: dict, records: Any) -> None:
        """A lighter view of the document that a reader of its bytes made (compare's scanner,
        :mod:`msprobe.compare._scanned`): its header (the top-level members but ``data``) and a
        mapping of its records parsed one by one; :meth:`document_view` answers with it until
        :meth:`release`, instead of parsing the whole document."""
        self._view = (header, records)

    def document_view(self) -> tuple:
        """(header, records) of the document: the attached view (:meth:`attach_view`) while the
        document is not parsed, else the parsed document's ``raw`` and ``data``."""
        if self._view is not None and self._doc is None:
            return self._view
        doc = self.document()
        return doc.raw, doc.data

    def has_journal(self) -> bool:
        """True when ``.journal/`` holds segments (a dump being written, or a killed one)."""
        if self._journal_live is None:
            self._journal_live = JOURNAL_DIR in self.names() and any(
                n.endswith(".jsonl") for n in self.store.list_dir(self._k(JOURNAL_DIR)))
        return self._journal_live

    def _check_marker(self) -> None:
        m = self.marker()
        v = m.get("format_version")
        if isinstance(v, str) and v.split(".", 1)[0] not in SUPPORTED_MAJORS:
            raise UnknownDialectError(f"{self._k(MARKER_FILE)}: format_version {v} is not supported "
                                      f"(this reader knows {', '.join(m + '.x' for m in SUPPORTED_MAJORS)})")

    def _merge_journal(self, doc: DumpDocument) -> None:
        """Append journaled records the document lacks (the documents win for the others)."""
        try:
            from msprobe.backends import read_journal

            j = Replay.of(read_journal(self.store, self._k(JOURNAL_DIR), on_truncated=lambda key, part: None))
        except MsprobeError:
            return
        data = doc.raw.setdefault("data", {})
        added = [n for n in j.records if n not in data]
        for n in added:
            data[n] = j.records[n]
        self._journal = {"records": len(added), "parents": {n: j.parents[n] for n in added if n in j.parents},
                         "stacks": {n: j.stacks[n] for n in added if n in j.stacks},
                         "stack_ids": {n: j.stack_ids[n] for n in added if n in j.stack_ids}}

    @property
    def live(self) -> bool:
        """True when records were taken from a crash journal (a dump being written)."""
        return bool(self._journal and self._journal.get("records"))

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
        ids = sd.ids_of() if sd is not None else {}
        if self._journal and self._journal["stacks"]:
            jids = self._journal["stack_ids"]
            ids = {**ids, **{n: jids.get(n, f"journal:{n}") for n in self._journal["stacks"]}}
        return ids

    def frames_of(self, name: str) -> Optional[list]:
        """The stack frames of a record (stack.json, else the journal)."""
        sd = self.stack()
        frames = sd.stack_of(name) if sd is not None else None
        if frames is None and self._journal:
            frames = self._journal["stacks"].get(name)
        return frames

    def frames_index(self) -> Optional[dict]:
        """{record name: frames} as :meth:`frames_of` gives them, for many names at once (stack.json's
        index, shared: not to be changed); None where a journal holds stacks too (ask frames_of)."""
        if self._journal and self._journal["stacks"]:
            return None
        sd = self.stack()
        return sd.frames_index() if sd is not None else {}

    def parents(self) -> dict:
        cd = self.construct()
        p = cd.raw if cd is not None else {}
        if self._journal and self._journal["parents"]:
            p = {**p, **self._journal["parents"]}
        return p

    def marker(self) -> dict:
        """Our ``msprobe_lake.json`` marker (``{}`` for dumps of the real tool)."""
        if self._marker is False:
            self._marker = {}
            if MARKER_FILE in self.names():
                try:
                    self._marker = decode_marker(self.store.get(self._k(MARKER_FILE)))
                except MsprobeError:
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
    def tensor_store(self) -> Any:
        """The rank's Zarr tensor store (:class:`msprobe.tensor_store.ZarrTensorReader`), or None."""
        if self._tstore is False:
            self._tstore = None
            if STORE_DIR in self.names():
                from msprobe.tensor_store import ZarrTensorReader

                self._tstore = ZarrTensorReader(self.store, self.prefix)
        return self._tstore

    def tensor_locations(self) -> Optional[dict]:
        """data name -> index ``location`` when the rank has a Zarr tensor store, else None."""
        ts = self.tensor_store()
        return None if ts is None else ts.locations()

    def tensor_key(self, data_name: str) -> str:
        """The storage key of a tensor file; refuses names that would escape dump_tensor_data."""
        check_file_name(data_name)
        mapped = self.mapping().get(data_name, data_name) if self._has_mapping() else data_name
        check_file_name(mapped)
        return self._k(TENSOR_DIR, mapped)

    def _has_mapping(self) -> bool:
        """Whether a mapping.csv exists (one listing of dump_tensor_data, cached)."""
        if self._mapping is not None:
            return bool(self._mapping)
        if self._has_map is None:
            if MAPPING_CSV in self.names():
                self._has_map = True
            else:
                try:
                    self._has_map = MAPPING_CSV in self.store.list_dir(self._k(TENSOR_DIR))
                except MsprobeError:
                    self._has_map = False
        return bool(self._has_map and self.mapping())

    # -- records ----------------------------------------------------------------
    def raw_record(self, name: str) -> Any:
        data = self.document().data
        if name not in data:
            raise RecordNotFoundError(f"no record {name!r} in {self.doc_key}")
        return data[name]

    # -- index ------------------------------------------------------------------
    def index_metadata(self) -> dict:
        """Key-value metadata of this rank's Parquet index ({} when there is none);
        ``records`` is summed over the parts."""
        if self._index_meta is False:
            keys = self.index_keys()
            meta = read_index_metadata(self.store, keys[0]) if keys else {}
            if len(keys) > 1 and meta.get("records") is not None:
                meta["records"] = sum(read_index_metadata(self.store, k).get("records") or 0 for k in keys)
            self._index_meta = meta
        return self._index_meta

    # -- live dumps ---------------------------------------------------------------
    def refresh(self) -> bool:
        """Forget cached listings and documents if dump.json changed; True when it did."""
        old_size, had_doc = self._doc_size, self._doc is not None
        old_names = self._names
        self._names = None
        self._journal_live = None
        changed = old_names is not None and self.names() != old_names
        changed = changed or (had_doc and self.has_journal())  # a live journal: re-read it
        if had_doc and self.doc_name is not None:
            try:
                changed = changed or self.store.size(self.doc_key) != old_size
            except StorageNotFoundError:
                changed = True
        if changed:
            self._reset()
        return changed


def records_of(src: DumpSource) -> dict:
    """The ``data`` object of a source's dump document; ``{}`` when the rank has no document."""
    try:
        return src.document().data
    except StorageNotFoundError:
        return {}


def task_of(src: DumpSource) -> Optional[str]:
    """The ``task`` of a source's dump document; None when it cannot be read."""
    try:
        return src.document().raw.get("task")
    except Exception:  # noqa: BLE001 - any unreadable document: no task (compare then picks by content)
        return None


class IndexSource:
    """One index file of an index-only lake (written by ``build_index(..., out=URL)``).

    Rows and record digests come from the file; full records, stacks and tensors
    from the rank directory it names in its metadata (``source``), opened on demand
    with the same storage options.
    """

    index_only = True

    def __init__(self, index_store: ReadableStore, index_key: str, *, storage_options: Optional[dict] = None):
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
        self._use_index: Optional[bool] = None

    @property
    def use_index(self) -> bool:
        """True unless the document it was built from changed since (a re-dump into the same
        path): then the rank directory is read instead, with a StaleIndexWarning. An index
        whose dump cannot be reached (moved, other credentials) is used as it is."""
        if self._use_index is None:
            self._use_index = True
            meta = self.index_metadata()
            if meta.get("doc") and (meta.get("doc_size") is not None or meta.get("doc_mtime") is not None):
                try:
                    rs = self.rank_source()
                    size, mtime = doc_stat(rs.store, meta["doc"])
                except MsprobeError:
                    size = mtime = None
                reason = stale_reason(meta, size, mtime, local=bool(getattr(self._rank and self._rank.store,
                                                                            "exact_mtimes", False)))
                if reason is not None:
                    warn_stale(f"{self.url} (of {meta.get('source')})", reason)
                    self._use_index = False
        return self._use_index

    @property
    def key(self) -> tuple:
        return (self.run or "", self.split or "", _num(self.step), _num(self.rank), self.rank_dir)

    def __repr__(self) -> str:
        return f"IndexSource({self.url!r})"

    @property
    def url(self) -> str:
        return f"{self.index_store.url.rstrip('/')}/{self.index_key}"

    def has_index(self) -> bool:
        return True

    def index_keys(self) -> list:
        return [self.index_key]

    def index_metadata(self) -> dict:
        if self._meta is None:
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

    def frames_of(self, name: str) -> Optional[list]:
        return self.rank_source().frames_of(name)

    def frames_index(self) -> Optional[dict]:
        return self.rank_source().frames_index()

    def mapping(self) -> dict:
        return self.rank_source().mapping()

    def marker(self) -> dict:
        return {}

    def release(self) -> None:
        """Drop what the rank directory it describes has read so far (the index metadata stays)."""
        if self._rank is not None:
            self._rank.release()

    def tensor_key(self, data_name: str) -> str:
        return self.rank_source().tensor_key(data_name)

    def tensor_store(self) -> Any:
        return self.rank_source().tensor_store()

    def tensor_locations(self) -> Optional[dict]:
        return self.rank_source().tensor_locations()

    @property
    def doc_name(self) -> Optional[str]:
        return self.index_metadata().get("doc")

    def refresh(self) -> bool:
        return False
