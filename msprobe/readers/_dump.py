"""The Dump: steps x ranks of records, answered from dump.json or from the Parquet index (its rows
as tables: :mod:`msprobe.readers._tables`)."""
from __future__ import annotations

import fnmatch
import re
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Optional

from msprobe.errors import MsprobeError, RecordNotFoundError, StorageNotFoundError
from msprobe.format.dialects import detect_dialect
from msprobe.format.model import infer_framework
from msprobe.format.protocols import ReadableStore
from msprobe.format.stats import NORM, STAT_COLUMNS
from msprobe.index.files import (
    concat_tables,
    read_index_table,
)
from msprobe.index.rows import DIGEST_COLUMNS
from msprobe.readers._kernel import kernel_configs, list_kernel_dumps
from msprobe.readers._record import DumpRecord
from msprobe.readers._tables import sources_table, table_to_pandas

if TYPE_CHECKING:
    from msprobe.readers.protocols import DumpSource

__all__ = ["Dump", "ANY", "AmbiguousRecordError"]


class _Any:
    __slots__ = ()

    def __repr__(self) -> str:
        return "ANY"

    def __bool__(self) -> bool:
        return False


#: "No constraint" for the ``step``/``rank``/``run`` selectors (``None`` means the
#: single-process rank directory, so it cannot mean "any").
ANY: Any = _Any()


class AmbiguousRecordError(RecordNotFoundError):
    """``record(name)`` matched the record in several steps or ranks: pass ``step=``/``rank=``."""


def _as_set(v: Any) -> Optional[set]:
    if v is None:
        return None
    if isinstance(v, str):
        return {v}
    return set(v)


class Dump:
    """An opened dump (or a lake of indexed dumps). Made by :func:`msprobe.readers.open`.

    Cheap to make: only directory listings happen up front; documents are parsed
    per rank on first use and tensors are read one at a time by ``arg.load()``.
    """

    def __init__(self, store: ReadableStore, sources: list, *, engine: str, url: str, storage_options: Optional[dict],
                 run: Optional[str], rediscover: Any = None, refresh_compacts: Any = None):
        self.store = store
        self.engine = engine
        self.url = url
        self.storage_options = storage_options
        self.run = run
        self._sources = sorted(sources, key=lambda s: s.key)
        self._rediscover = rediscover
        self._recs: dict = {}
        self._dialect: Any = False
        self._framework: Optional[tuple] = None
        #: index lakes: compacted file -> the index files it covers (see index.compact_index)
        self.compacts: dict = {}
        self._refresh_compacts = refresh_compacts  # index lakes: compacts again after a rediscovery

    # -- shape of the dump --------------------------------------------------------
    @property
    def sources(self) -> list:
        """The rank directories (or index files), in (run, split, step, rank) order."""
        return list(self._sources)

    @property
    def steps(self) -> list:
        """Step numbers present, sorted."""
        return sorted({s.step for s in self._sources if s.step is not None})

    @property
    def ranks(self) -> list:
        """Rank ids present, sorted; None stands for a single-process ``rank``/``proc<pid>`` directory."""
        found = {s.rank for s in self._sources}
        return sorted(found, key=lambda r: (r is not None, r if r is not None else 0))

    @property
    def runs(self) -> list:
        return sorted({s.run for s in self._sources if s.run})

    @property
    def rank_dirs(self) -> list:
        """(step, rank directory name) of every rank directory."""
        return [(s.step, s.rank_dir) for s in self._sources]

    def kernel_dumps(self, step: Any = ANY) -> list:
        """The level-L2 kernel-dump files (:class:`~msprobe.readers._kernel.KernelDumpFile`) under
        ``stepN/{timestamp}/{device}/``, optionally of one step. They are the Ascend runtime's binary
        dump format: listed with their name parts and sizes, readable as bytes, not decoded."""
        return list_kernel_dumps(self.store, None if step is ANY else step)

    def kernel_configs(self) -> dict:
        """{(step, device): key} of the ``kernel_config_{device}.json`` files of an L2 dump."""
        return kernel_configs(self.store)

    def _meta(self, key: str) -> Any:
        for s in self._sources:
            if s.use_index:
                v = s.index_metadata().get(key)
            else:
                try:
                    v = s.document().raw.get(key)
                except StorageNotFoundError:
                    continue
            if v is not None:
                return v
        return None

    @property
    def framework(self) -> Optional[str]:
        """'pytorch' | 'mindspore' | ...: the documents' ``framework``, else inferred from the entries'
        types (:attr:`framework_source` says which)."""
        return self.framework_found[0]

    @property
    def framework_found(self) -> tuple:
        """(framework, where it came from): ``("pytorch", "dump.json")``, ``("mindspore", "inferred from
        entry type mindspore.Tensor")``, ``(None, None)``."""
        if self._framework is None:
            self._framework = _framework_of(self._sources, self._meta("framework"))
        return self._framework

    framework_source = property(lambda self: self.framework_found[1], doc="where :attr:`framework` came from")
    task = property(lambda self: self._meta("task"), doc="'statistics' | 'tensor' | ...")
    level = property(lambda self: self._meta("level"), doc="'L0' | 'L1' | 'mix' | 'debug' | ...")

    @property
    def dialect(self) -> Optional[str]:
        """Producer dialect (``msprobe-8``, ``msprobe-26``, ``msprobe-lake``), from the first rank."""
        if self._dialect is False:
            self._dialect = self.dialect_of(self._sources[0]) if self._sources else None
        return self._dialect

    def dialect_of(self, src: DumpSource) -> Optional[str]:
        if src.use_index:
            d = src.index_metadata().get("dialect")
            if d:
                return d
        marker = src.marker()
        names = [s.rank_dir for s in self._sources]
        data = header = None
        if not src.use_index and not (marker and marker.get("dialect")):
            try:
                view = getattr(src, "document_view", None)  # a rank directory: a scanned view where one is attached
                header, data = view() if view is not None else (src.document().raw, src.document().data)
            except (StorageNotFoundError, MsprobeError):
                data = header = None
        if header is not None and header.get("fragment"):
            return None  # an API-info fragment (spec/FORMAT.md 9.5) was written by no dump producer
        try:
            return detect_dialect(names, data, marker, header)
        except MsprobeError:
            return None

    def __repr__(self) -> str:
        return (f"Dump({self.url!r}, engine={self.engine!r}, steps={self.steps}, "
                f"rank_dirs={len(self._sources)})")

    # -- selection ---------------------------------------------------------------------
    def select(self, step: Any = ANY, rank: Any = ANY, *, run: Any = ANY, split: Any = ANY) -> list:
        """The sources matching ``step``/``rank``/``run``/``split`` (each: a value, a list, or ANY;
        ``split`` is 'graph'/'pynative' for MindSpore jit dumps, None elsewhere).

        ``rank=None`` selects single-process directories; when a step has none but
        exactly one rank directory, that one. A string selects a rank directory by name.
        """
        out = []
        by_step: dict = {}
        for s in self._sources:
            by_step.setdefault((s.run, s.split, s.step), []).append(s)
        for s in self._sources:
            if step is not ANY and not _match(s.step, step):
                continue
            if run is not ANY and not _match(s.run, run):
                continue
            if split is not ANY and not _match(s.split, split):
                continue
            if rank is not ANY and not self._rank_match(s, rank, by_step[(s.run, s.split, s.step)]):
                continue
            out.append(s)
        return out

    @staticmethod
    def _rank_match(s: Any, rank: Any, peers: list) -> bool:
        wanted = rank if isinstance(rank, (list, tuple, set, frozenset)) else [rank]
        for r in wanted:
            if isinstance(r, str) and r == s.rank_dir:
                return True
            if r is None and (s.rank is None or len(peers) == 1):
                return True
            if isinstance(r, int) and not isinstance(r, bool) and s.rank == r:
                return True
        return False

    # -- records ---------------------------------------------------------------------------
    def _records_of(self, src: DumpSource) -> tuple:
        got = self._recs.get(id(src))
        if got is None:
            if src.use_index:
                recs = self._digests_from_index(src)
            else:
                try:
                    names = list(src.document().data)
                except StorageNotFoundError:
                    names = []
                recs = [DumpRecord(n, i, src, None, self) for i, n in enumerate(names)]
            got = (recs, {r.name: r for r in recs})
            self._recs[id(src)] = got
        return got

    def _digests_from_index(self, src: DumpSource) -> list:
        import pyarrow as pa
        import pyarrow.compute as pc

        parts = [read_index_table(src.index_store, k, columns=list(DIGEST_COLUMNS)) for k in src.index_keys()]
        t = concat_tables(parts) if len(parts) > 1 else parts[0]
        if t.num_rows == 0:
            return []
        seq = t.column("seq")
        if t.num_rows > 1:
            prev = pc.cast(seq.slice(0, t.num_rows - 1), "int64")
            first = pc.not_equal(seq.slice(1), prev)
            mask = pa.concat_arrays([pa.array([True]), first.combine_chunks()])
            t = t.filter(mask)
        cols = {c: t.column(c).to_pylist() for c in DIGEST_COLUMNS}
        out = []
        for i in range(t.num_rows):
            d = {c: cols[c][i] for c in DIGEST_COLUMNS}
            out.append(DumpRecord(d["record"], d["seq"], src, d, self))
        return out

    def record_in(self, src: DumpSource, name: str) -> Optional[DumpRecord]:
        """The record ``name`` of one of this dump's sources, or None."""
        return self._records_of(src)[1].get(name)

    def _count_one(self, src: DumpSource) -> int:
        if src.use_index and id(src) not in self._recs:
            c = src.index_metadata().get("records")
            if c is not None:
                return c
        return len(self._records_of(src)[0])

    def iter_records(self, step: Any = ANY, rank: Any = ANY, *, run: Any = ANY, split: Any = ANY, kind: Any = None,
                     prefix: Any = None, api_type: Any = None, api_name: Any = None, name: Any = None,
                     regex: Any = None, direction: Any = None) -> Iterator[DumpRecord]:
        """Like :meth:`records`, lazily."""
        kinds, types, dirs = _as_set(kind), _as_set(prefix if prefix is not None else api_type), _as_set(direction)
        api_names = _as_set(api_name)
        name_ok = _name_matcher(name, regex)
        for src in self.select(step, rank, run=run, split=split):
            for r in self._records_of(src)[0]:
                if name_ok is not None and not name_ok(r.name):
                    continue
                if kinds is not None and r.kind not in kinds:
                    continue
                if types is not None and r.api_type not in types:
                    continue
                if dirs is not None and r.direction not in dirs:
                    continue
                if api_names is not None and r.api_name not in api_names:
                    continue
                yield r

    def records(self, step: Any = ANY, rank: Any = ANY, *, run: Any = ANY, split: Any = ANY, kind: Any = None,
                prefix: Any = None, api_type: Any = None, api_name: Any = None, name: Any = None,
                regex: Any = None, direction: Any = None) -> list:
        """Records in execution order (per rank; ranks in (step, rank) order).

        Filters: ``kind`` ('api', 'module', 'parameters_grad', 'debug'), ``prefix``/``api_type``
        ('Functional', 'Module', ...), ``api_name``, ``direction`` ('forward'/'backward'),
        ``name`` (a glob like ``"Functional.*.forward"``, or a compiled regex), ``regex``
        (a regex string, searched). Each filter takes a value or a collection of values.
        """
        return list(self.iter_records(step, rank, run=run, split=split, kind=kind, prefix=prefix, api_type=api_type,
                                      api_name=api_name, name=name, regex=regex, direction=direction))

    def record(self, name: str, step: Any = ANY, rank: Any = ANY, *, run: Any = ANY, split: Any = ANY) -> DumpRecord:
        """The record called ``name``; :class:`RecordNotFoundError` if absent,
        :class:`AmbiguousRecordError` if several (step, rank) hold it."""
        found = []
        for src in self.select(step, rank, run=run, split=split):
            r = self.record_in(src, name)
            if r is not None:
                found.append(r)
        if not found:
            where = _where(step, rank)
            raise RecordNotFoundError(f"no record {name!r} in {self.url}{where}"
                                      + self.near_names(name, step, rank, run=run, split=split))
        if len(found) > 1:
            places = ", ".join(f"({_split(r)}step={r.step}, rank_dir={r.rank_dir!r})" for r in found[:6])
            raise AmbiguousRecordError(f"record {name!r} is in {len(found)} rank directories: {places}; "
                                       "pass step= and rank=")
        return found[0]

    def near_names(self, name: str, step: Any = ANY, rank: Any = ANY, *, run: Any = ANY, split: Any = ANY) -> str:
        """What to say after "no record NAME": for a glob, its matches (``record()`` takes one
        exact name) or the names nearest its literal start; else the closest names, or those
        holding ``name``; ``""`` when none is near."""
        import difflib

        names: set = set()
        for src in self.select(step, rank, run=run, split=split):
            names.update(self._records_of(src)[1])
        if any(c in name for c in "*?["):
            hits = sorted(n for n in names if fnmatch.fnmatchcase(n, name))
            if hits:
                return (f"; {name!r} is a glob matching {len(hits)} record(s) ({', '.join(hits[:3])}"
                        f"{', ...' if len(hits) > 3 else ''}): records(name=...) returns them all")
            head = re.split(r"[*?\[]", name)[0]
            starts = {n[:len(head)]: n for n in sorted(names, reverse=True)} if head else {}
            close = [starts[c] for c in difflib.get_close_matches(head, sorted(starts), n=3, cutoff=0.6)]
            return f"; names near it: {', '.join(repr(c) for c in close)}" if close else ""
        close = difflib.get_close_matches(name, sorted(names), n=3, cutoff=0.6)
        if not close:  # a part of a name: those holding it
            close = sorted(n for n in names if name in n)[:3]
        return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""

    def count(self, step: Any = ANY, rank: Any = ANY, *, run: Any = ANY, split: Any = ANY) -> int:
        """Number of records (from the index metadata when there is an index)."""
        return sum(self._count_one(src) for src in self.select(step, rank, run=run, split=split))

    def __iter__(self) -> Iterator[DumpRecord]:
        return self.iter_records()

    # -- tables -------------------------------------------------------------------------------
    def to_arrow(self, step: Any = ANY, rank: Any = ANY, *, run: Any = ANY, split: Any = ANY, filter: Any = None,  # noqa: A002 - the public keyword
                 columns: Optional[Iterable[str]] = None) -> Any:
        """One row per tensor-like argument (columns: :data:`msprobe.readers.COLUMNS`).

        ``filter``: a ``pyarrow.compute`` expression, pushed down into the Parquet
        scan when the index is used. ``columns``: a subset, in that order.
        """
        return sources_table(self.select(step, rank, run=run, split=split), columns, filter, self.compacts)

    def to_pandas(self, step: Any = ANY, rank: Any = ANY, *, run: Any = ANY, split: Any = ANY, filter: Any = None,  # noqa: A002 - the public keyword
                  columns: Optional[Iterable[str]] = None) -> Any:
        """:meth:`to_arrow` as a pandas DataFrame (nullable ints/bools, ``shape`` as tuples)."""
        return table_to_pandas(self.to_arrow(step, rank, run=run, split=split, filter=filter, columns=columns))

    def find_anomalies(self, norm_above: Optional[float] = None, *, step: Any = ANY, rank: Any = ANY,
                       run: Any = ANY, columns: Optional[Iterable[str]] = None, as_arrow: bool = False) -> Any:
        """Rows whose statistics hold a NaN or an Inf, or whose Norm exceeds ``norm_above``."""
        import pyarrow.compute as pc

        expr = pc.field("has_nan") | pc.field("has_inf")
        if norm_above is not None:
            expr = expr | (pc.field(NORM.column) > float(norm_above))
        cols = list(columns) if columns is not None else [
            "run", "step", "rank", "rank_dir", "seq", "record", "io", "arg_path", "dtype", *STAT_COLUMNS,
            "has_nan", "has_inf"]
        t = self.to_arrow(step, rank, run=run, filter=expr, columns=cols)
        return t if as_arrow else table_to_pandas(t)

    # -- live dumps ----------------------------------------------------------------------------
    def refresh(self) -> dict:
        """Re-read a dump that is still being written: new step/rank directories are
        added, ranks whose documents changed are re-read. Returns what changed."""
        changed = 0
        for src in self._sources:
            if src.refresh():
                self._recs.pop(id(src), None)
                changed += 1
        added = 0
        if self._rediscover is not None:
            known = {s.key for s in self._sources}
            for src in self._rediscover():
                if src.key not in known:
                    self._sources.append(src)
                    added += 1
            if added:
                self._sources.sort(key=lambda s: s.key)
            if self._refresh_compacts is not None:
                self.compacts = self._refresh_compacts()
        if changed or added:
            self._dialect = False
        return {"new_rank_dirs": added, "changed_rank_dirs": changed}

    update = refresh

    # -- summaries ---------------------------------------------------------------------------------
    def summary(self) -> dict:
        """What ``msprobe ls`` prints: one entry per rank directory."""
        rows = []
        for s in self._sources:
            rows.append({"run": s.run, "split": s.split, "step": s.step, "rank": s.rank, "rank_dir": s.rank_dir,
                         "records": self._count_one(s),
                         "source": "index" if s.use_index else (s.doc_name or "-")})
        return {"url": self.url, "engine": self.engine, "dialect": self.dialect, "framework": self.framework,
                "framework_source": self.framework_source, "fragment": self._meta("fragment"),
                "task": self.task, "level": self.level, "steps": self.steps, "ranks": self.ranks,
                "rank_dirs": rows}



def _framework_of(sources: list, declared: Optional[str]) -> tuple:
    """(framework, source) of a dump: declared by its documents (or index), else inferred from the
    entry types of the first rank directories' records (:func:`msprobe.format.model.infer_framework`)."""
    if declared is not None:
        return declared, "declared"
    for src in sources[:4]:
        if src.use_index:
            continue
        try:
            found = infer_framework(src.document().data)
        except (StorageNotFoundError, MsprobeError):
            continue
        if found is not None:
            return found[0], f"inferred from {found[1]}"
    return None, None


def _split(r: DumpRecord) -> str:
    sp = getattr(r.source, "split", None)  # (packet sources have none)
    return f"split={sp!r}, " if sp else ""


def _match(value: Any, want: Any) -> bool:
    if isinstance(want, (list, tuple, set, frozenset, range)):
        return value in want
    return value == want


def _where(step: Any, rank: Any) -> str:
    parts = []
    if step is not ANY:
        parts.append(f"step={step}")
    if rank is not ANY:
        parts.append(f"rank={rank}")
    return f" ({', '.join(parts)})" if parts else ""


def _name_matcher(name: Any, regex: Any) -> Any:
    tests: list = []
    if name is not None:
        if isinstance(name, re.Pattern):
            tests.append(name.search)
        elif isinstance(name, str):
            if any(c in name for c in "*?["):
                pat = re.compile(fnmatch.translate(name))
                tests.append(pat.match)
            else:
                tests.append(lambda n, _v=name: n == _v)
        else:
            names = set(name)
            tests.append(names.__contains__)
    if regex is not None:
        tests.append(re.compile(regex).search if isinstance(regex, str) else regex.search)
    if not tests:
        return None
    return lambda n: all(t(n) for t in tests)
