"""Refreshing a lake's own files: planned from plain data, then applied.

An open lists what is there (the runs' rank directories, the index files, the manifest) and
hands those listings to the planners, which read no storage and return frozen plans:

- :func:`plan_refresh`: which rank directories keep their manifest row, which get one back
  from their index file's metadata (a lost manifest), which are (re)indexed;
- :meth:`RefreshPlan.with_stale`: the indexes whose document changed since are re-indexed
  (or, ``refresh="none"``, left out); :func:`plan_doc_listings` and :func:`stale_reasons` are
  the listings that check and what they say;
- :func:`plan_builds`: the build tasks (``batch`` rank directories each; a whole step of up
  to ``batch`` ranks in one task that writes its compacted file too);
- :func:`plan_compaction`: the steps to compact, each manifest row's compacted file, and the
  files of rank directories or steps that went away.

:class:`Refresher` applies them: it runs the listings, recoveries, builds and compactions as
tasks of the lake's executor, deletes, and writes the manifest and the catalog.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from msprobe.backends import local_path_of
from msprobe.errors import MsprobeError
from msprobe.execution import Executor, star
from msprobe.format.protocols import ReadableStore
from msprobe.index import stale_reason, warn_stale
from msprobe.lake import _build, _catalog, _core, _discover, _graph
from msprobe.progress import Progress

__all__ = ["RefreshPlan", "BuildPlan", "CompactionPlan", "Places", "RefreshResult", "Refresher", "plan_refresh",
           "plan_builds", "plan_compaction", "plan_doc_listings", "stale_reasons", "needs_writing"]

#: manifest rows rebuilt per recovery task; rank prefixes per staleness listing task
RECOVER_BATCH = 256
LISTING_BATCH = 1024


@dataclass(frozen=True)
class RefreshPlan:
    """What an open does with each rank directory found (:func:`plan_refresh`).

    ``kept``: index key -> the manifest row read as it is; ``recover``: (run, run prefix,
    location) of index files that have no manifest row; ``build``: compact key (one step of one
    run) -> [(run, location)] to index, in the order found; ``members``: compact key -> how many
    rank directories the step has; ``located``: index key -> (run, location) of every rank
    directory found; ``run_prefixes``: run -> its prefix below the root. A location is the tuple
    (prefix, step, rank_dir, rank, split)."""

    refresh: str
    kept: dict
    recover: tuple
    build: dict
    members: dict
    located: dict
    run_prefixes: dict

    def with_stale(self, stale: dict) -> "RefreshPlan":
        """This plan with the stale indexes ``stale`` ({index key: why}) re-indexed (appended to
        their step's builds in ``stale``'s order); with ``refresh="none"`` nothing is built."""
        if self.refresh == "none" or not stale:
            return self
        build = {compact: list(items) for compact, items in self.build.items()}
        for key in stale:
            build.setdefault(_core.compact_key_of(key), []).append(self.located[key])
        return dataclasses.replace(self, build=build)


def plan_refresh(run_infos: list, indexed: set, manifest: dict, refresh: str) -> RefreshPlan:
    """The plan of an open from its listings alone: ``run_infos`` (what
    :func:`msprobe.lake._discover.discover_run` returns per run), ``indexed`` (the keys under the
    lake's ``index/``), ``manifest`` ({index key: row} of the manifest read) and ``refresh``
    (``"missing"``/``"check"``: index what has no index, ``"all"``: everything, ``"none"``:
    nothing). Reads no storage."""
    kept: dict = {}
    recover: list = []
    build: dict = {}
    members: dict = {}
    located: dict = {}
    for info in run_infos:
        run = info["run"]
        for loc in info["locs"]:
            prefix, step, rank_dir, rank, split = loc
            key = _core.index_key(run, step, rank, rank_dir, split)
            compact = _core.compact_key_of(key)
            members[compact] = members.get(compact, 0) + 1
            located[key] = (run, tuple(loc))
            if refresh == "all" or (key not in indexed and refresh != "none"):
                build.setdefault(compact, []).append((run, tuple(loc)))
            elif key in manifest:
                kept[key] = manifest[key]
            elif key in indexed:
                recover.append((run, info["run_prefix"], tuple(loc)))
    return RefreshPlan(refresh, kept, tuple(recover), build, members, located,
                       {info["run"]: info["run_prefix"] for info in run_infos})


@dataclass(frozen=True)
class BuildPlan:
    """The build tasks of a plan (:func:`plan_builds`): ``tasks`` are (run, run prefix,
    [locations], compact key or None) in compact-key order; ``direct``: the steps whose one task writes the
    compacted file as it indexes (every rank of the step, at least 2 and at most ``batch``)."""

    tasks: tuple
    direct: frozenset

    @property
    def rank_dirs(self) -> int:
        return sum(len(task[2]) for task in self.tasks)


def plan_builds(plan: RefreshPlan, batch: int) -> BuildPlan:
    """The build tasks of ``plan``'s ``build``: ``batch`` rank directories each."""
    tasks = []
    direct = set()
    for compact, items in sorted(plan.build.items()):
        run = items[0][0]
        whole = len(items) == plan.members[compact] and 2 <= len(items) <= batch
        if whole:
            direct.add(compact)
        for start in range(0, len(items), batch):
            chunk = items[start:start + batch]
            tasks.append((run, plan.run_prefixes[run], [loc for _, loc in chunk], compact if whole else None))
    return BuildPlan(tuple(tasks), frozenset(direct))


@dataclass(frozen=True)
class CompactionPlan:
    """What follows the builds (:func:`plan_compaction`): ``tasks`` (compact key, [index keys in
    rank order]) to write; ``compact_keys``: index key -> the manifest's ``compact_key`` (None:
    the rank's own file is read); ``deletes``: the index files of rank directories that went
    away (the first ``removed``), then the compacted files of steps no rank directory is left in."""

    tasks: tuple
    compact_keys: dict
    deletes: tuple
    removed: int


def _rank_order(row: dict) -> tuple:
    return (row["rank"] is None, row["rank"] or 0, row["rank_dir"])


def plan_compaction(rows: dict, *, manifest_keys: Any, indexed: set, changed: set, direct: frozenset,
                    refresh: str) -> CompactionPlan:
    """One compacted file per (run, step) of two or more ranks. ``rows``: index key -> manifest
    row after the builds; ``manifest_keys``: the keys of the manifest read at the start;
    ``indexed``: the keys listed under ``index/`` then; ``changed``: the compact keys of steps
    whose ranks were recovered, rebuilt or found stale; ``direct``: the steps whose build task
    wrote the compacted file. Reads no storage."""
    gone = [key for key in manifest_keys if key not in rows] if refresh != "none" else []
    changed = set(changed) | {_core.compact_key_of(key) for key in gone}
    groups: dict = {}
    for key in rows:
        groups.setdefault(_core.compact_key_of(key), []).append(key)
    tasks = []
    compact_keys: dict = {}
    for compact, keys in sorted(groups.items()):
        covered = all(rows[key].get("compact_key") == compact for key in keys)
        if compact in direct and covered:
            continue  # written by its build task
        keys.sort(key=lambda key: _rank_order(rows[key]))
        if len(keys) < 2:
            compact_keys.update(dict.fromkeys(keys))
            continue
        fresh = compact not in changed and compact in indexed and covered
        if not fresh and refresh != "none":
            tasks.append((compact, keys))
        compact_keys.update(dict.fromkeys(keys, compact if fresh or refresh != "none" else None))
    vanished = [compact for compact in sorted(changed) if compact not in groups and compact in indexed]
    return CompactionPlan(tuple(tasks), compact_keys, tuple(gone + vanished), len(gone))


def plan_doc_listings(rows: dict) -> list:
    """[(rank prefixes, flat step prefixes)]: the listing tasks that read the document size and
    time of each indexed rank directory (:func:`msprobe.lake._build.doc_stats`), at most
    :data:`LISTING_BATCH` prefixes each; a step whose rank directories hold few files (statistics
    dumps, two ranks or more) is listed with one recursive listing."""
    steps: dict = {}  # step prefix -> [rank prefixes]
    few: dict = {}
    for row in rows.values():
        step = row["prefix"].rsplit("/", 1)[0] if "/" in row["prefix"] else None
        steps.setdefault(step, []).append(row["prefix"])
        few[step] = few.get(step, True) and row.get("task") == "statistics" and not row.get("tensor_files")
    jobs: list = []
    chunk: list = []
    flat: list = []
    for step, prefixes in sorted(steps.items(), key=lambda item: item[0] or ""):
        chunk += prefixes
        if step is not None and few[step] and len(prefixes) > 1:
            flat.append(step)
        if len(chunk) >= LISTING_BATCH:
            jobs.append((chunk, tuple(flat)))
            chunk, flat = [], []
    if chunk:
        jobs.append((chunk, tuple(flat)))
    return jobs


def stale_reasons(rows: dict, now: dict, *, local: bool) -> dict:
    """{index key: why} of the rows whose document no longer has the size and modification
    time recorded when it was indexed; ``now``: rank prefix -> (document name, size, mtime) as
    listed (a prefix not listed went away: it is not stale, it is removed)."""
    out = {}
    for key, row in rows.items():
        if row["prefix"] not in now:
            continue
        name, size, mtime = now[row["prefix"]]
        if row.get("doc") and name and name != row["doc"]:
            out[key] = f"{name} replaced {row['doc']}"
            continue
        covered = {"doc_size": row.get("doc_size"), "doc_mtime": row.get("mtime")}
        reason = stale_reason(covered, size, mtime, local=local)
        if reason is not None:
            out[key] = reason
    return out


def needs_writing(*, builds: BuildPlan, plan: RefreshPlan, compaction: CompactionPlan, manifest_rows: int,
                  rows: int) -> bool:
    """Whether the manifest changes: something built, recovered, deleted or compacted, or rows
    left out."""
    return bool(builds.tasks or plan.recover or compaction.deletes or compaction.tasks or manifest_rows != rows)


def _manifest_order(row: dict) -> tuple:
    def number(value: Optional[int]) -> int:
        return -1 if value is None else value

    return (row["run"], row["split"] or "", number(row["step"]), number(row["rank"]), row["rank_dir"])


@dataclass(frozen=True)
class Places:
    """Where a refresh reads (the root) and writes (the lake directory), as tasks open them."""

    root_url: str
    storage_options: Optional[dict]
    lake_url: str
    lake_options: Optional[dict]


@dataclass
class RefreshResult:
    """What an open found and wrote: the runs, the manifest and catalog rows, counters, timings."""

    run_infos: list
    manifest_rows: list
    catalog_rows: list
    stats: dict
    timings: dict = field(default_factory=dict)
    graphs: dict = field(default_factory=dict)  # comm/ dir -> state entry (msprobe.lake._graph)


class Refresher:
    """The apply step of an open: listings, then the plans above, each carried out as tasks of
    ``runner``. ``writable()`` returns the lake's store to write (or raises: a read-only lake);
    ``say`` is given each step's note; ``report``: the build tasks' progress bar (``enabled=``)."""

    def __init__(self, places: Places, root: ReadableStore, lake: Optional[ReadableStore], runner: Executor, *,
                 batch: int, writable: Callable[[], Any], say: Callable[[str], None], report: Optional[bool]):
        self.places = places
        self.root = root
        self.lake = lake
        self.runner = runner
        self.batch = batch
        self.writable = writable
        self.say = say
        self.report = report
        self.marks: list = []
        self._seen = False  # the lake's folder checked visible to the workers of a given cluster

    def _for_tasks(self) -> Any:
        """The lake's store, writable, for tasks to write into: on a given Dask cluster, a folder
        of this machine is refused where a worker cannot see it (its files would land on the
        worker's disk, and the lake would name files it does not hold)."""
        store = self.writable()
        path = local_path_of(store.url)
        if not self._seen and path:
            self.runner.check_sees(path, "the lake's folder")
            self._seen = True
        return store

    def _lap(self) -> None:
        self.marks.append(time.perf_counter())

    def run(self, refresh: str, max_depth: int) -> RefreshResult:
        places = self.places
        self.marks = [time.perf_counter()]
        root_path = local_path_of(self.root.url)
        if root_path:  # the workers of a given cluster read it too
            self.runner.check_reads(root_path, "the lake root")
        found = _discover.discover_runs(self.root, max_depth)
        self.say(f"{len(found)} run(s)")
        infos = self.runner.map(star(_discover.discover_run),
                                [(places.root_url, places.storage_options, run, prefix) for run, prefix in found],
                                local_cluster=False)
        self._lap()
        indexed = set(self.lake.list_prefix(_core.INDEX_PREFIX)) if self.lake is not None else set()
        manifest = {row["index_key"]: row for row in _catalog.read_manifest(self.lake)} if self.lake is not None else {}
        self._lap()
        plan = plan_refresh(infos, indexed, manifest, refresh)
        rows = dict(plan.kept)
        changed: set = set()
        self._absorb(rows, changed, self._recover(plan.recover))
        # what each index covers (document size and time) against the documents now: a re-dump
        # into the same path makes an index stale; it is rebuilt (or, refresh="none", left out)
        stale = self._stale(rows)
        for key in stale:
            del rows[key]
            changed.add(_core.compact_key_of(key))
        if stale:
            first = sorted(stale)[0]
            warn_stale(f"of {places.root_url} ({len(stale)} rank dir(s) changed since they were indexed; first: "
                       f"{plan.located[first][1][0]})", stale[first],
                       "left out (refresh='none')" if refresh == "none" else "re-indexing them")
        plan = plan.with_stale(stale)
        builds = plan_builds(plan, self.batch)
        built, executor = self._build(builds)
        built_count = self._absorb(rows, changed, built)
        self._lap()
        compaction = plan_compaction(rows, manifest_keys=list(manifest), indexed=indexed, changed=changed,
                                     direct=builds.direct, refresh=refresh)
        self._compact(rows, compaction)
        self._lap()
        graphs = self._graphs(refresh, rows)
        self._lap()
        manifest_rows = sorted(rows.values(), key=_manifest_order)
        catalog_rows = _catalog.catalog_rows(manifest_rows, infos, places.root_url)
        self._write(refresh, manifest_rows, catalog_rows,
                    needs_writing(builds=builds, plan=plan, compaction=compaction, manifest_rows=len(manifest),
                                  rows=len(rows)))
        self._lap()
        stats = {"runs": len(infos), "rank_dirs": len(rows), "indexed": built_count, "recovered": len(plan.recover),
                 "removed": compaction.removed, "compacted": len(compaction.tasks) + len(builds.direct),
                 "stale": len(stale), "executor": executor}
        stats["graphs"] = sum(1 for entry in graphs.values() if entry.get("calls"))
        names = ("discover_s", "list_s", "index_s", "compact_s", "graph_s", "catalog_s")
        timings = {name: end - start for name, start, end in zip(names, self.marks, self.marks[1:])}
        timings["total_s"] = self.marks[-1] - self.marks[0]
        return RefreshResult(infos, manifest_rows, catalog_rows, stats, timings, graphs)

    @staticmethod
    def _absorb(rows: dict, changed: set, batches: list) -> int:
        """Task results (lists of manifest rows) into ``rows``; their steps are ``changed``."""
        count = 0
        for batch_rows in batches:
            for row in batch_rows:
                rows[row["index_key"]] = row
                changed.add(_core.compact_key_of(row["index_key"]))
                count += 1
        return count

    def _recover(self, recover: tuple) -> list:
        if not recover:
            return []
        places = self.places
        jobs = [(places.lake_url, places.lake_options, list(recover[start:start + RECOVER_BATCH]))
                for start in range(0, len(recover), RECOVER_BATCH)]
        return self.runner.map(star(_build.rebuild_rows), jobs, local_cluster=False)

    def _stale(self, rows: dict) -> dict:
        """{index key: why} of the indexed rank directories whose document changed (listings only, as tasks)."""
        if not rows:
            return {}
        places = self.places
        jobs = [(places.root_url, places.storage_options, prefixes, flat) for prefixes, flat in plan_doc_listings(rows)]
        now: dict = {}
        for part in self.runner.map(star(_build.doc_stats), jobs, local_cluster=False):
            now.update(part)
        return stale_reasons(rows, now, local=bool(getattr(self.root, "exact_mtimes", False)))

    def _build(self, builds: BuildPlan) -> tuple:
        """(the build tasks' row lists, the executor that ran them)."""
        if not builds.tasks:
            return [], "none"
        self._for_tasks()
        places = self.places
        jobs = [_build.BuildJob(places.root_url, places.storage_options, places.lake_url, places.lake_options, run,
                               run_prefix, locs, compact)
                for run, run_prefix, locs, compact in builds.tasks]
        self.say(f"indexing {builds.rank_dirs} rank dir(s) in {len(jobs)} task(s)")
        with Progress(builds.rank_dirs, "lake index", "rank dirs", enabled=self.report) as bar:
            built = self.runner.map(_build.build_batch, jobs, progress=bar, weight=lambda job: len(job.locs))
        return built, self.runner.last

    def _compact(self, rows: dict, compaction: CompactionPlan) -> None:
        for key, compact in compaction.compact_keys.items():
            rows[key]["compact_key"] = compact
        places = self.places
        if compaction.tasks:
            self._for_tasks()
            self.say(f"compacting {len(compaction.tasks)} step(s)")
            self.runner.map(_build.compact_group,
                            [_build.CompactJob(places.lake_url, places.lake_options, compact, keys)
                             for compact, keys in compaction.tasks])
        if compaction.deletes:
            store = self.writable()
            for key in compaction.deletes:
                try:
                    store.delete(key)
                except MsprobeError:
                    pass

    def _graphs(self, refresh: str, rows: dict) -> dict:
        """The communication graph of every step whose rank directories changed since it was built
        (:func:`msprobe.lake._graph.plan_graphs`), as tasks; returns {dir: state entry}."""
        state = _graph.read_state(self.lake)
        plan = _graph.plan_graphs(rows, state, refresh)
        graphs = dict(plan.keep)
        if plan.build:
            self._for_tasks()
            places = self.places
            jobs = [_graph.GraphJob(places.root_url, places.storage_options, places.lake_url, places.lake_options,
                                    run, split, step, locs, where, fingerprint)
                    for where, run, split, step, locs, fingerprint in plan.build]
            self.say(f"communication graph of {len(jobs)} step(s)")
            for entry in self.runner.map(_graph.build_graph, jobs):
                graphs[entry.pop("dir")] = entry
        if plan.deletes:
            store = self.writable()
            for key in plan.deletes:
                try:
                    store.delete(key)
                except MsprobeError:
                    pass
        if refresh != "none" and graphs != state:
            _graph.write_state(self.writable(), graphs)
        return graphs

    def _write(self, refresh: str, manifest_rows: list, catalog_rows: list, changed: bool) -> None:
        if refresh == "none":
            return
        if changed:
            _catalog.write_table(self.writable(), _core.MANIFEST_KEY, _catalog.manifest_table(manifest_rows))
        if changed or self.lake is None or _catalog.stale_catalog(self.lake, catalog_rows):
            _catalog.write_catalog(self.writable(), catalog_rows, self.places.root_url)
