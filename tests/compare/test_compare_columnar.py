"""The compare engine (column-wise, every mode) writes the same bytes as the row-by-row oracle.

Every case runs :func:`msprobe.compare.compare` twice on the same dumps with the same timestamp,
as the product runs it and with ``tests/compare/row_oracle.py`` (one row at a time, the
reference) in place of the engine, and requires byte-identical CSVs, the same xlsx sheet and the
same summary.json (timing and file paths aside). The dumps are the real tools' fixtures of both frameworks (8.x and
26.x, statistics, md5, tensor, mix/structural, multi-rank) and seeded mutations of them that plant
what the metrics and rules branch on: NaN/+-Inf/-inf masks, None and string and bool and huge int
statistics, dtype/shape/requires_grad changes, scalar arguments, missing and extra records and
arguments, fused qkv names, the ignored APIs.
"""
from __future__ import annotations

import copy
import glob
import json
import os
import random
import shutil
import zipfile

import pytest

from msprobe.compare import compare
from tests.compare.row_oracle import oracle_compare

HERE = os.path.dirname(os.path.abspath(__file__))
REAL = os.path.join(os.path.dirname(HERE), "fixtures", "real")
TS = "20260101000000"


def _f(*parts: str) -> str:
    return os.path.join(REAL, *parts)


def _outputs(out: str) -> dict:
    """{file name: bytes} of a compare output (xlsx: its sheet and shared strings)."""
    got = {}
    for p in sorted(glob.glob(os.path.join(out, "*"))):
        name = os.path.basename(p)
        if name.endswith(".xlsx"):
            with zipfile.ZipFile(p) as z:
                for m in z.namelist():
                    if m.startswith("xl/"):
                        got[f"{name}:{m}"] = z.read(m)
        elif name == "summary.json":
            with open(p, encoding="utf-8") as fh:
                s = json.load(fh)
            s.pop("seconds")
            for r in s["pairs"]:
                r["files"] = [os.path.basename(x) for x in r["files"]]
            got[name] = json.dumps(s, sort_keys=True).replace(out, "OUT").encode()
        elif name.endswith(".csv"):
            with open(p, "rb") as fh:
                got[name] = fh.read()
    return got


def _both(tmp_path, monkeypatch, target: str, bench: str, **kw) -> dict:
    """Compare with the engine and with the row oracle; assert equal outputs; the engine's outputs."""
    runs = {}
    for engine in ("auto", "rows"):
        out = str(tmp_path / f"out_{engine}")
        shutil.rmtree(out, ignore_errors=True)
        if engine == "auto":
            compare(target, bench, out, timestamp=TS, plot=False, progress=False, **kw)
        else:
            oracle_compare(monkeypatch, target, bench, out, timestamp=TS, plot=False, progress=False, **kw)
        runs[engine] = _outputs(out)
    a, b = runs["auto"], runs["rows"]
    assert sorted(a) == sorted(b)
    for name in a:
        if a[name] != b[name]:
            la, lb = a[name].split(b"\n"), b[name].split(b"\n")
            bad = next(i for i, (x, y) in enumerate(zip(la + [b""], lb + [b""])) if x != y)
            raise AssertionError(f"{name} differs at line {bad}:\n engine: {la[bad][:400]!r}\n"
                                 f" oracle: {lb[bad][:400]!r}")
    assert any(n.endswith(".csv") for n in a)
    return a


REAL_PAIRS = [
    ("ms26/L1_statistics", "ms26/L1_statistics_perturbed"),
    ("ms26/L1_md5", "ms26/L1_md5_perturbed"),
    ("ms26/L1_statistics", "ms26/L1_md5"),
    ("ms26/mix_statistics", "ms26/L0_statistics"),
    ("ms26/L1_statistics", "ms8/L1_statistics"),
    ("ms8/L1_statistics", "ms8/L1_statistics_perturbed"),
    ("ms8/L1_md5", "ms26/L1_md5"),
    ("ms8/mix_statistics", "ms26/mix_statistics"),
    ("ms26/distributed_2rank", "ms8/distributed_2rank"),
    ("ms26/L1_tensor", "ms26/L1_tensor_perturbed"),
    ("ms26_mindspore/L1_statistics", "ms26_mindspore/train_L1_statistics"),
    ("ms26_mindspore/L1_md5", "ms26_mindspore/L1_md5"),
    ("ms26_mindspore/mix_statistics", "ms26_mindspore/train_mix_statistics"),
    ("zoo26/attention_L1", "zoo26/attention_mix"),
    ("zoo26/inplace_md5", "zoo26/inplace_L1"),
]


@pytest.mark.parametrize("target,bench", REAL_PAIRS, ids=[f"{a}-vs-{b}" for a, b in REAL_PAIRS])
def test_real_fixtures_same_bytes(tmp_path, monkeypatch, target, bench):
    t, b = _f(*target.split("/"), "step0"), _f(*bench.split("/"), "step0")
    if not (os.path.isdir(t) and os.path.isdir(b)):
        t, b = _f(*target.split("/")), _f(*bench.split("/"))
    _both(tmp_path, monkeypatch, t, b)


def test_tensor_dumps_in_statistics_mode_and_options(tmp_path, monkeypatch):
    t, b = _f("ms26", "L1_tensor", "step0"), _f("ms26", "L1_tensor_perturbed", "step0")
    _both(tmp_path, monkeypatch, t, b, mode="statistics", xlsx=True)
    t, b = _f("ms26", "L1_statistics", "step0"), _f("ms26", "L1_statistics_perturbed", "step0")
    _both(tmp_path, monkeypatch, t, b, stack=False, threshold=1e-6)
    _both(tmp_path, monkeypatch, t, b, threshold=0.0, xlsx=True)
    _both(tmp_path, monkeypatch, _f("ms26", "L1_md5", "step0"), _f("ms26", "L1_md5_perturbed", "step0"), xlsx=True,
          stack=False)


_ODD = [float("nan"), float("inf"), -float("inf"), None, "inf", " NaN", "x", True, False, 0, 0.0, -0.0, 7,
        2 ** 70, 10 ** 400, 1e308, -1e-310, 5e-324]


def _mutate(doc: dict, seed: int, side: str) -> dict:
    """A seeded copy of ``doc`` with odd values, changed leaves and records planted."""
    rng = random.Random(seed)
    doc = copy.deepcopy(doc)

    def leaf(v: dict) -> None:
        if "Max" in v:
            for k in ("Max", "Min", "Mean", "Norm"):
                r = rng.random()
                if r < 0.12:
                    v[k] = rng.choice(_ODD)
                elif r < 0.3 and isinstance(v.get(k), float):
                    v[k] = v[k] * (1 + rng.choice([1e-4, 1e-2, 0.7, 20.0]) * rng.uniform(-1, 1))
            r = rng.random()
            if r < 0.04:
                v["dtype"] = "torch.float16"
            elif r < 0.08:
                v["shape"] = [3, 3]
            elif r < 0.12:
                v["requires_grad"] = not v.get("requires_grad", False)
            elif r < 0.14:
                v.pop("requires_grad", None)
            elif r < 0.16:
                v["Max"] = v["Min"] = -float("inf")
            elif r < 0.18 and side == "b":
                v["md5"] = "%08x" % rng.getrandbits(32)
        elif "value" in v and rng.random() < 0.3:
            v["value"] = rng.choice([1, 2.5, "s", True, None, float("inf"), [1, 2]])

    def walk(v):
        if isinstance(v, dict):
            if "type" in v:
                leaf(v)
            else:
                for c in list(v.values()):
                    walk(c)
        elif isinstance(v, list):
            for c in v:
                walk(c)

    data = doc["data"]
    walk(data)
    names = list(data)
    for nm in names:
        r = rng.random()
        if r < 0.05:
            del data[nm]
        elif r < 0.08 and isinstance(data[nm], dict):
            args = data[nm].get("input_args")
            if isinstance(args, list) and args:
                args.pop(rng.randrange(len(args))) if rng.random() < 0.5 else args.append({"type": "int", "value": 3})
        elif r < 0.10 and isinstance(data[nm], dict):
            data[nm]["output"] = data[nm].get("output") or []
    # planted names: ignored APIs, a fused qkv bench name, a mask feeding an add
    neg = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 2], "Max": -float("inf"),
           "Min": -float("inf"), "Mean": -float("inf"), "Norm": float("inf"), "requires_grad": False}
    t = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 2], "Max": 1.0, "Min": 0.0, "Mean": 0.5,
         "Norm": 1.0 if side == "t" else 1.5, "requires_grad": False}
    data["Tensor.masked_fill.0.forward"] = {"input_args": [t], "input_kwargs": {}, "output": [neg]}
    data["Tensor.__add__.0.forward"] = {"input_args": [t, neg], "input_kwargs": {"attn_mask": neg}, "output": [neg]}
    data["Torch.empty.0.forward"] = {"input_args": [t], "input_kwargs": {}, "output": [dict(t, Max=9.0)]}
    data["Distributed._reduce_scatter_base.0.forward"] = {"input_args": [dict(t, Max=2.0 if side == "t" else 1.0)],
                                                           "input_kwargs": {}, "output": [dict(t, Norm=3.0)]}
    data[f"Functional.linear.{'1' if side == 't' else '2'}.forward"] = {"input_args": [t], "output": [t]}
    data["Module.qkv_proj.Linear.forward.0"] = {"input_args": [t], "input_kwargs": {},
                                                "output": [dict(t, dtype="torch.bfloat16" if side == "b" else
                                                                "torch.float32")]}
    data["Tensor.add.0.forward"] = {"input_args": [dict(t, Norm=0.0)], "input_kwargs": {}, "output": [dict(t, Norm=7.0)]}
    if side == "t":
        data["Tensor.only_target.0.forward"] = {"input_args": [t, None], "output": [t]}
    else:
        data["Tensor.only_bench.0.forward"] = {"input_args": [t], "output": [neg]}
    return doc


def _write(root: str, doc: dict, src_rank: str) -> str:
    rank = os.path.join(root, "step0", "rank0")
    os.makedirs(rank)
    with open(os.path.join(rank, "dump.json"), "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1)
    for name in ("stack.json", "construct.json"):
        src = os.path.join(src_rank, name)
        if os.path.exists(src):
            shutil.copy(src, rank)
    return os.path.join(root, "step0")


def mutated_pair(tmp_path, fixture: str, seed: int) -> tuple:
    """(target, bench) step directories: two seeded mutations of a fixture's document."""
    (rank,) = glob.glob(os.path.join(_f(*fixture.split("/")), "step0", "*"))
    with open(os.path.join(rank, "dump.json"), encoding="utf-8") as fh:
        doc = json.load(fh)
    return (_write(str(tmp_path / "t"), _mutate(doc, seed, "t"), rank),
            _write(str(tmp_path / "b"), _mutate(doc, seed + 100, "b"), rank))


MUTATED = ["ms26/L1_statistics", "ms26/L1_md5", "ms8/L1_statistics", "ms26/mix_statistics",
           "ms26_mindspore/L1_statistics", "ms26_mindspore/L1_md5", "zoo26/attention_mix"]


@pytest.mark.parametrize("fixture", MUTATED)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_mutated_dumps_same_bytes(tmp_path, monkeypatch, fixture, seed):
    t, b = mutated_pair(tmp_path, fixture, seed)
    got = _both(tmp_path, monkeypatch, t, b, xlsx=seed == 1)
    csv_bytes = next(v for k, v in got.items() if k.endswith(".csv"))
    assert b"error" in csv_bytes  # the planted changes reach the rules
    _both(tmp_path, monkeypatch, t, b, fuzzy=True, structural=False, threshold=0.001)
    if "md5" not in fixture:
        _both(tmp_path, monkeypatch, t, b, mode="statistics", stack=False,
              mapping={"Functional.linear.1.forward.input.0": "Functional.linear.2.forward.input.0",
                       "Tensor.only_target.0.forward.output.0": "Tensor.only_bench.0.forward.input.0"})


def test_generated_dump_with_non_finite_values(tmp_path, monkeypatch):
    """The benchmark's generator (NaN/Inf statistics, kwargs, parameters), 3 ranks."""
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench"))
    from bench_compare import synthesize

    t, b = synthesize(str(tmp_path / "gen"), 600, ranks=3)
    _both(tmp_path, monkeypatch, t, b)
    _both(tmp_path, monkeypatch, t, b, workers=2)


def test_garbage_collector_paused_during_compare_and_restored(tmp_path, monkeypatch):
    import gc

    import msprobe.compare._core as core

    seen = []
    real = core.match_records

    def spy(*a, **k):
        seen.append(gc.isenabled())
        return real(*a, **k)

    monkeypatch.setattr(core, "match_records", spy)
    t, b = _f("ms26", "L1_statistics", "step0"), _f("ms26", "L1_statistics_perturbed", "step0")
    assert gc.isenabled()
    compare(t, b, str(tmp_path / "a"), plot=False, progress=False)
    assert seen == [False] and gc.isenabled()
    with pytest.raises(Exception):
        compare(str(tmp_path / "missing"), b, str(tmp_path / "b"), plot=False, progress=False)
    assert gc.isenabled()
    gc.disable()
    try:
        compare(t, b, str(tmp_path / "c"), plot=False, progress=False)
        assert not gc.isenabled()  # a caller's own pause is kept
    finally:
        gc.enable()


def test_objects_made_while_paused_leave_the_youngest_generation_uncollected():
    """After the pause the objects made meanwhile are in the oldest generation (the first collection
    does not traverse them); objects a caller froze stay frozen."""
    import gc

    from msprobe.compare._runner import gc_paused

    assert gc.isenabled()
    with gc_paused():
        made = [[index] for index in range(50000)]
        assert gc.get_count()[0] >= 50000
    assert gc.isenabled() and gc.get_count()[0] < 1000 and gc.get_freeze_count() == 0
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with gc_paused():
            made.append([0])
        # still frozen (an unfreeze would leave 0; objects of other threads may die meanwhile: not ==)
        assert gc.get_freeze_count() > frozen // 2
    finally:
        gc.unfreeze()
    del made


@pytest.mark.parametrize("block", [1, 7])
def test_blocks_of_records_same_bytes(tmp_path, monkeypatch, block):
    """The columnar path builds and writes a pair block by block: small blocks, same bytes
    (rows, marks, first divergence, NaN/Inf entries across block boundaries)."""
    import msprobe.compare._columnar as columnar

    monkeypatch.setattr(columnar, "BLOCK_RECORDS", block)
    (rank,) = glob.glob(os.path.join(_f("ms26", "L1_statistics"), "step0", "*"))
    with open(os.path.join(rank, "dump.json"), encoding="utf-8") as fh:
        doc = json.load(fh)
    t = _write(str(tmp_path / "t"), _mutate(doc, 5, "t"), rank)
    b = _write(str(tmp_path / "b"), _mutate(doc, 105, "b"), rank)
    _both(tmp_path, monkeypatch, t, b, xlsx=True)
    _both(tmp_path, monkeypatch, t, b, mapping={"Functional.linear.1.forward.input.0": "Functional.linear.2.forward.input.0"},
          threshold=0.01)
    _both(tmp_path, monkeypatch, _f("ms26", "L1_md5", "step0"), _f("ms26", "L1_md5_perturbed", "step0"))


@pytest.mark.parametrize("workers", [2, 3])
def test_forked_chunks_of_one_pair_same_bytes(tmp_path, monkeypatch, workers):
    """compare -n on one rank pair forks chunks of its records (the columnar path too): same
    CSV as the row builder in one process, and the same summary fields the chunks can know."""
    import msprobe.compare._columnar as columnar
    import msprobe.compare._core as core

    monkeypatch.setattr(core, "CHUNK_MIN_RECORDS", 0)
    monkeypatch.setattr(columnar, "BLOCK_RECORDS", 5)
    forked = []
    real = core._run_forked
    monkeypatch.setattr(core, "_run_forked", lambda *a, **k: forked.append(1) or real(*a, **k))
    (rank,) = glob.glob(os.path.join(_f("ms26", "L1_statistics"), "step0", "*"))
    with open(os.path.join(rank, "dump.json"), encoding="utf-8") as fh:
        doc = json.load(fh)
    t = _write(str(tmp_path / "t"), _mutate(doc, 7, "t"), rank)
    b = _write(str(tmp_path / "b"), _mutate(doc, 107, "b"), rank)
    ref = oracle_compare(monkeypatch, t, b, str(tmp_path / "ref"), timestamp=TS, plot=False, progress=False)
    got = compare(t, b, str(tmp_path / "got"), timestamp=TS, plot=False, progress=False, workers=workers)
    assert forked == [1]
    (pr,), (pg,) = ref["pairs"], got["pairs"]
    with open(pr["files"][0], "rb") as f1, open(pg["files"][0], "rb") as f2:
        assert f1.read() == f2.read()
    for k in ("first_divergence", "first_nan_inf_target", "results", "rows", "matched_records", "unmatched_rows",
              "worst_rows"):
        assert pr[k] == pg[k], k


def test_stack_column_read_from_the_frames_index_once(tmp_path, monkeypatch):
    """The engine's NPU_Stack_Info cells come from the rank's frames index (stack.json's, read once), not
    from a frames_of call per record; the same bytes as the oracle's, and as where a source has no index."""
    from msprobe.readers._source import RankSource

    t, b = _f("ms26", "L1_statistics", "step0"), _f("ms26", "L1_statistics_perturbed", "step0")
    calls = []
    frames_of = RankSource.frames_of

    def counted(self, name):
        calls.append(name)
        return frames_of(self, name)

    monkeypatch.setattr(RankSource, "frames_of", counted)
    out = str(tmp_path / "counted")
    compare(t, b, out, timestamp=TS, plot=False, progress=False)
    assert calls == []
    got = _outputs(out)
    assert any(b"File " in text for name, text in got.items() if name.endswith(".csv"))  # stack cells are there
    monkeypatch.setattr(RankSource, "frames_of", frames_of)
    assert got == _both(tmp_path, monkeypatch, t, b)
    monkeypatch.setattr(RankSource, "frames_index", lambda self: None)  # e.g. a journal's stacks: one call a record
    out = str(tmp_path / "no_index")
    compare(t, b, out, timestamp=TS, plot=False, progress=False)
    assert _outputs(out) == got
