"""run_ut in bounded memory: the peak of checking one large API against its declared input bytes,
and the default ceiling of generated inputs (derived from the memory available, counted in the
summary when it skips an API)."""
from __future__ import annotations

import json
import os
import sys

import torch  # noqa: F401 - run_ut checks with torch: without it these tests fail, never skip

from msprobe.cli import main
from msprobe.run_ut import memory as M
from msprobe.run_ut import run_ut

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench"))

import bench_run_ut_memory as B  # noqa: E402


def test_one_large_api_peaks_below_six_times_its_input():
    """F.gelu over a 64 MiB float32 input, forward only: the checking process's RSS grows by at most
    6x the declared input bytes (it grew by 24x before: device copy, float64 temporaries per metric)."""
    r = B.measure(1 << 24)
    assert r["counts"] == {"pass": 1}, r
    assert r["growth_ratio"] <= 6.0, r


def _tensor(numel):
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [numel], "Max": 1.0, "Min": 0.0,
            "Mean": 0.5, "Norm": 1.0, "requires_grad": False}


def _dump(root, sizes):
    rank = os.path.join(root, "step0", "rank0")
    os.makedirs(rank)
    data = {f"Functional.relu.{i}.forward": {"input_args": [_tensor(n)], "input_kwargs": {}, "output": [_tensor(n)]}
            for i, n in enumerate(sizes)}
    with open(os.path.join(rank, "dump.json"), "w") as f:
        json.dump({"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None,
                   "data": data}, f)
    return rank


def test_meminfo_and_cgroup_figures(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n")
    assert M._meminfo_available(str(meminfo)) == 20000000 * 1024
    meminfo.write_text("MemTotal:       24000000 kB\n")
    assert M._meminfo_available(str(meminfo)) is None
    cg = tmp_path / "cg"
    cg.mkdir()
    assert M._cgroup_left(str(cg)) is None                     # no cgroup files: no limit
    (cg / "memory.max").write_text("max\n")
    assert M._cgroup_left(str(cg)) is None                     # v2 without a limit
    (cg / "memory.max").write_text(str(8 << 30))
    (cg / "memory.current").write_text(str(3 << 30))
    assert M._cgroup_left(str(cg)) == 5 << 30                  # v2: the limit less the usage
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text(str(1 << 62))
    assert M._cgroup_left(str(v1)) is None                     # v1's "no limit"
    (v1 / "memory" / "memory.limit_in_bytes").write_text(str(4 << 30))
    (v1 / "memory" / "memory.usage_in_bytes").write_text(str(5 << 30))
    assert M._cgroup_left(str(v1)) == 0                        # over the limit already: nothing left


def test_default_ceiling_is_the_memory_share_of_each_worker():
    avail, source = M.available_memory()
    assert avail > 0 and source
    one, how1 = M.default_input_ceiling(1)
    four, how4 = M.default_input_ceiling(4)
    # the figure is read again on each call: allow for what other processes did in between
    assert abs(one - avail // M.PEAK_FACTOR) < max(avail // M.PEAK_FACTOR // 10, 64 << 20), (one, avail)
    assert abs(four * 4 - one) < max(one // 10, 64 << 20), (one, four)
    assert f"/ ({M.PEAK_FACTOR} x 1 worker)" in how1 and f"/ ({M.PEAK_FACTOR} x 4 workers)" in how4
    assert one != 256 << 20


def test_summary_counts_the_apis_the_default_ceiling_skipped(tmp_path, capsys):
    # 2^40 float32 elements (4 TiB) is above any machine's share; 1000 elements is below it
    rank = _dump(str(tmp_path / "dump"), [1 << 40, 1000, 1 << 41])
    s = run_ut(rank, str(tmp_path / "a"), workers=0, progress=False)
    assert s["skipped_input_ceiling"] == 2 and s["api_counts"] == {"SKIP": 2, "pass": 1}, s
    avail, _ = M.available_memory()
    assert 0 < s["input_ceiling_bytes"] <= avail // M.PEAK_FACTOR * 1.1 + (64 << 20), s
    assert "1 worker)" in s["input_ceiling"] and "GiB" in s["input_ceiling"], s
    # two workers share the memory: the summary says so; the CLI prints the count and the reason
    rc = main(["run_ut", "-api_info", rank, "-o", str(tmp_path / "b"), "-n", "2", "-q"])
    out = capsys.readouterr().out
    assert rc == 0
    line = next(ln for ln in out.splitlines() if "skipped" in ln)
    assert line.startswith("2 APIs skipped") and "ceiling" in line and "x 2 workers" in line, out
    # an explicit ceiling is named as such and no API is skipped below it
    s = run_ut(rank, str(tmp_path / "c"), workers=0, progress=False, max_input_mb=1)
    assert s["skipped_input_ceiling"] == 2 and s["input_ceiling"] == "--max-input-mb 1", s
    small = _dump(str(tmp_path / "small"), [1000])
    s = run_ut(small, str(tmp_path / "d"), workers=0, progress=False)
    assert s["skipped_input_ceiling"] == 0 and s["api_counts"] == {"pass": 1}, s
