"""Conformance with the real msprobe 26.2.0 on MindSpore 2.10.0 (CPU, PyNative): our dump of the
seeded script tests/fixtures/real/scripts/ms_run_scenario.py gives the records of the committed
fixtures (tests/fixtures/real/ms26_mindspore, same script, same configs), in the same order,
with the same argument encodings and statistics (1e-5 relative), the same construct.json
parents, the same stack.json grouping and frames, and the same tensor files, up to the
deliberate differences of spec/FORMAT.md §20. Runs in the MindSpore venv (ms_venv.py)."""
from __future__ import annotations

import glob
import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from ms_common import REAL, diff_values, frame_key, load, normalize_real, rank_dir, run_script

CASES = ["L1_statistics", "L0_statistics", "mix_statistics", "L1_tensor", "L1_md5"]


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """Run the script once per config (two at a time), as the fixtures were made."""
    root = tmp_path_factory.mktemp("ms_conformance")

    def one(case):
        cwd = root / case
        cwd.mkdir()
        shutil.copy(os.path.join(REAL, "_configs", f"{case}.json"), cwd / "config.json")
        proc = run_script("ms_run_scenario.py", ["--config", "config.json"], str(cwd))
        assert proc.returncode == 0, proc.stdout[-3000:]
        return case, str(cwd / case), proc.stdout

    with ThreadPoolExecutor(2) as pool:
        return {case: (path, out) for case, path, out in pool.map(one, CASES)}


def user_frames(frames: list) -> list:
    """Deliberate difference (spec/FORMAT.md §20): 26.2.0 runs each API inside a Cell of its own and
    records its stack from that Cell's hook, so the stack starts with MindSpore's Cell.__call__
    frames (and the jit_forbidden wrapper); ours starts at the caller. Compared without that head."""
    keys = [frame_key(f) for f in frames]
    while keys and (keys[0].startswith("mindspore/nn/cell.py") or "check_jit_forbidden_api.py" in keys[0]):
        keys.pop(0)
    return keys


def _real(case):
    return os.path.join(REAL, case)


@pytest.mark.parametrize("case", CASES)
def test_dump_json_matches_real(dumps, case):
    ours = load(dumps[case][0])
    real = load(_real(case))
    for key in ("task", "level", "framework"):
        assert ours[key] == real[key]
    assert (ours["dump_data_dir"] is None) == (real["dump_data_dir"] is None)
    real_data = {normalize_real(k): v for k, v in real["data"].items()}
    assert list(ours["data"]) == list(real_data)
    problems = []
    for name, rec in real_data.items():
        problems += diff_values(ours["data"][name], rec, name)
    assert not problems, "\n".join(problems[:40])


@pytest.mark.parametrize("case", CASES)
def test_construct_and_stack_match_real(dumps, case):
    ours = load(dumps[case][0], "construct.json")
    real = {normalize_real(k): (normalize_real(v) if v else v) for k, v in load(_real(case), "construct.json").items()}
    assert ours == real
    ours_st, real_st = load(dumps[case][0], "stack.json"), load(_real(case), "stack.json")
    group = lambda st: sorted(sorted(v[0]) for v in st.values())  # noqa: E731
    assert group(ours_st) == group(real_st)
    frames = lambda st: {n: user_frames(v[1]) for v in st.values() for n in v[0]}  # noqa: E731
    assert frames(ours_st) == frames(real_st)


def test_tensor_files_match_real(dumps):
    ours_dir = os.path.join(rank_dir(dumps["L1_tensor"][0]), "dump_tensor_data")
    real_dir = os.path.join(rank_dir(_real("L1_tensor")), "dump_tensor_data")
    names = sorted(os.listdir(real_dir))
    assert sorted(os.listdir(ours_dir)) == names
    for n in names:
        a = np.load(os.path.join(ours_dir, n), allow_pickle=False)
        b = np.load(os.path.join(real_dir, n), allow_pickle=False)
        assert a.dtype == b.dtype and a.shape == b.shape, n
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8, err_msg=n)
    assert load(dumps["L1_tensor"][0])["dump_data_dir"] == ours_dir


def test_md5_matches_real(dumps):
    def md5s(doc):
        out = []

        def walk(v):
            if isinstance(v, dict):
                if "md5" in v:
                    out.append(v["md5"])
                for x in v.values():
                    walk(x)
            elif isinstance(v, list):
                for x in v:
                    walk(x)

        walk(doc["data"])
        return out

    ours, real = md5s(load(dumps["L1_md5"][0])), md5s(load(_real("L1_md5")))
    assert len(ours) == len(real) > 20
    assert ours == real


@pytest.mark.parametrize("case", CASES)
def test_readers_open_our_dump(dumps, case):
    import msprobe.readers

    dump = msprobe.readers.open(dumps[case][0])
    ours = load(dumps[case][0])
    recs = list(dump.records())
    assert [r.name for r in recs] == list(ours["data"])
    loaded = 0
    for r in recs:
        for _, t in r.tensors():
            if t.raw.get("data_name"):  # the .npy files load safely, with the record's dtype and shape
                arr = t.load("numpy")
                assert list(arr.shape) == list(t.raw["shape"]) and arr.dtype == np.float32
                loaded += 1
    assert loaded == (12 if case == "L1_tensor" else 0)


def test_losses_equal_to_the_real_run(dumps):
    """The dumper does not change the computation: the script's losses are those of a run without it."""
    for case, (_, out) in dumps.items():
        losses = [line for line in out.splitlines() if line.startswith("step ")]
        assert losses == ["step 0 loss 1.113591", "step 1 loss 1.395835"], (case, out[-2000:])
