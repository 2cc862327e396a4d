"""The lake's refresh planners (msprobe.lake._refresh, issue 28 point 4): plain listings in, a
frozen plan out, no store and no executor involved."""
from __future__ import annotations

import dataclasses

import pytest

from msprobe.lake._core import compact_key_of, index_key
from msprobe.lake._refresh import (
    LISTING_BATCH,
    needs_writing,
    plan_builds,
    plan_compaction,
    plan_doc_listings,
    plan_refresh,
    stale_reasons,
)


def _info(run: str, steps: int, ranks: int) -> dict:
    locs = [(f"{run}/step{step}/rank{rank}", step, f"rank{rank}", rank, None)
            for step in range(steps) for rank in range(ranks)]
    return {"run": run, "run_prefix": run, "config": None, "locs": locs}


def _key(run: str, step: int, rank: int) -> str:
    return index_key(run, step, rank, f"rank{rank}", None)


def _row(run: str, step: int, rank: int, compact=None, **extra) -> dict:
    row = {"run": run, "step": step, "rank": rank, "rank_dir": f"rank{rank}", "split": None,
           "prefix": f"{run}/step{step}/rank{rank}", "index_key": _key(run, step, rank), "compact_key": compact,
           "doc": "dump.json", "doc_size": 100, "mtime": 1000.0, "task": "statistics", "tensor_files": 0}
    row.update(extra)
    return row


def test_a_new_root_builds_every_rank_dir_and_whole_steps_compact_as_they_build():
    plan = plan_refresh([_info("a", 2, 3)], set(), {}, "missing")
    assert plan.kept == {} and plan.recover == ()
    assert sorted(plan.build) == [compact_key_of(_key("a", 0, 0)), compact_key_of(_key("a", 1, 0))]
    assert plan.members == dict.fromkeys(plan.build, 3)
    assert plan.run_prefixes == {"a": "a"}
    builds = plan_builds(plan, batch=64)
    assert builds.direct == frozenset(plan.build)
    assert [(run, prefix, len(locs), compact) for run, prefix, locs, compact in builds.tasks] == [
        ("a", "a", 3, compact_key_of(_key("a", 0, 0))), ("a", "a", 3, compact_key_of(_key("a", 1, 0)))]
    assert builds.rank_dirs == 6


def test_a_step_larger_than_a_batch_is_split_and_compacted_after():
    plan = plan_refresh([_info("a", 1, 5)], set(), {}, "missing")
    builds = plan_builds(plan, batch=2)
    assert builds.direct == frozenset()
    assert [[loc[3] for loc in locs] for _, _, locs, _ in builds.tasks] == [[0, 1], [2, 3], [4]]
    assert all(compact is None for *_, compact in builds.tasks)


def test_one_rank_step_is_built_alone_and_never_compacted():
    plan = plan_refresh([_info("a", 1, 1)], set(), {}, "missing")
    builds = plan_builds(plan, batch=64)
    assert builds.direct == frozenset() and len(builds.tasks) == 1
    rows = {_key("a", 0, 0): _row("a", 0, 0)}
    compaction = plan_compaction(rows, manifest_keys=[], indexed=set(), changed={compact_key_of(_key("a", 0, 0))},
                                 direct=builds.direct, refresh="missing")
    assert compaction.tasks == () and compaction.compact_keys == {_key("a", 0, 0): None}


def test_manifest_rows_are_kept_index_files_without_rows_recovered():
    keys = [_key("a", 0, rank) for rank in range(3)]
    manifest = {keys[0]: _row("a", 0, 0)}
    plan = plan_refresh([_info("a", 1, 3)], set(keys[:2]), manifest, "missing")
    assert plan.kept == manifest
    assert plan.recover == (("a", "a", ("a/step0/rank1", 0, "rank1", 1, None)),)
    assert list(plan.build.values()) == [[("a", ("a/step0/rank2", 0, "rank2", 2, None))]]
    # refresh="none" builds nothing and keeps what is indexed; "all" rebuilds everything
    none = plan_refresh([_info("a", 1, 3)], set(keys[:2]), manifest, "none")
    assert none.build == {} and none.kept == manifest and len(none.recover) == 1
    every = plan_refresh([_info("a", 1, 3)], set(keys), manifest, "all")
    assert every.kept == {} and every.recover == () and sum(map(len, every.build.values())) == 3


def test_stale_indexes_are_appended_to_their_steps_builds_unless_refresh_is_none():
    keys = [_key("a", 0, rank) for rank in range(2)]
    manifest = {key: _row("a", 0, rank) for rank, key in enumerate(keys)}
    plan = plan_refresh([_info("a", 1, 2)], set(keys), manifest, "missing")
    assert plan.build == {}
    again = plan.with_stale({keys[1]: "another size"})
    assert again.build == {compact_key_of(keys[1]): [("a", ("a/step0/rank1", 0, "rank1", 1, None))]}
    assert plan.build == {}  # frozen: the first plan is unchanged
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.build = {}  # type: ignore[misc]
    none = plan_refresh([_info("a", 1, 2)], set(keys), manifest, "none")
    assert none.with_stale({keys[1]: "another size"}).build == {}


def test_compaction_keeps_fresh_steps_rewrites_changed_ones_and_deletes_what_went_away():
    step0 = [_key("a", 0, rank) for rank in range(2)]
    step1 = [_key("a", 1, rank) for rank in range(2)]
    compact0, compact1 = compact_key_of(step0[0]), compact_key_of(step1[0])
    gone_step = [_key("a", 2, rank) for rank in range(2)]
    rows = {key: _row("a", 0, rank, compact0) for rank, key in enumerate(step0)}
    rows.update({key: _row("a", 1, rank, compact1) for rank, key in reversed(list(enumerate(step1)))})
    indexed = set(step0) | set(step1) | set(gone_step) | {compact0, compact1, compact_key_of(gone_step[0])}
    compaction = plan_compaction(rows, manifest_keys=[*rows, *gone_step], indexed=indexed, changed={compact1},
                                 direct=frozenset(), refresh="missing")
    assert compaction.tasks == ((compact1, step1),)  # in rank order
    assert compaction.compact_keys == {**dict.fromkeys(step0, compact0), **dict.fromkeys(step1, compact1)}
    assert compaction.deletes == (*gone_step, compact_key_of(gone_step[0])) and compaction.removed == 2
    # refresh="none": nothing written or deleted; a step not fresh is read rank by rank
    none = plan_compaction(rows, manifest_keys=[*rows, *gone_step], indexed=indexed, changed={compact1},
                           direct=frozenset(), refresh="none")
    assert none.tasks == () and none.deletes == () and none.removed == 0
    assert none.compact_keys == {**dict.fromkeys(step0, compact0), **dict.fromkeys(step1)}
    # a step its build task compacted is left as it is
    direct = plan_compaction(rows, manifest_keys=list(rows), indexed=set(), changed={compact0, compact1},
                             direct=frozenset({compact0, compact1}), refresh="missing")
    assert direct.tasks == () and direct.compact_keys == {} and direct.deletes == ()


def test_what_changed_decides_whether_the_manifest_is_written():
    plan = plan_refresh([_info("a", 1, 2)], set(), {}, "missing")
    idle = plan_refresh([], set(), {}, "missing")
    builds, no_builds = plan_builds(plan, 64), plan_builds(idle, 64)
    nothing = plan_compaction({}, manifest_keys=[], indexed=set(), changed=set(), direct=frozenset(), refresh="none")
    assert needs_writing(builds=builds, plan=idle, compaction=nothing, manifest_rows=0, rows=0)
    assert not needs_writing(builds=no_builds, plan=idle, compaction=nothing, manifest_rows=3, rows=3)
    assert needs_writing(builds=no_builds, plan=idle, compaction=nothing, manifest_rows=3, rows=2)


def test_listings_group_statistics_steps_and_staleness_names_what_changed():
    rows = {_key("a", 0, rank): _row("a", 0, rank) for rank in range(3)}
    rows[_key("b", 0, 0)] = _row("b", 0, 0, task="tensor", tensor_files=4)
    rows[_key("b", 0, 1)] = _row("b", 0, 1)
    assert plan_doc_listings(rows) == [(["a/step0/rank0", "a/step0/rank1", "a/step0/rank2", "b/step0/rank0",
                                         "b/step0/rank1"], ("a/step0",))]
    many = {f"k{number}": {"prefix": f"s/step0/rank{number}", "task": "statistics"}
            for number in range(LISTING_BATCH + 1)}
    assert [len(prefixes) for prefixes, _ in plan_doc_listings(many)] == [LISTING_BATCH + 1]
    now = {"a/step0/rank0": ("dump.json", 100, 1000.0), "a/step0/rank1": ("debug.json", 100, 1000.0),
           "a/step0/rank2": ("dump.json", 101, 1000.0)}
    stale = stale_reasons(rows, now, local=True)
    assert set(stale) == {_key("a", 0, 1), _key("a", 0, 2)}  # b's rank dirs went away: not stale
    assert stale[_key("a", 0, 1)] == "debug.json replaced dump.json"
