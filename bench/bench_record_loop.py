"""Per-record CPU of the dumper alone: a loop of 1,500 ``torch.add`` calls of 64 x 64 tensors under
``PrecisionDebugger`` (statistics L1, md5, or ``hooks``: the hooks and records with nothing read or
written, as bench/run_step_bench.py's mode), 1 torch thread, process CPU, the best of 7 dumped loops
minus the same loop without the tool, over the records of a loop. Prints one JSON line.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_record_loop.py [L1|md5|hooks]
    py-spy record -r 1000 -f raw -o loop.raw -- .venv/bin/python bench/bench_record_loop.py L1   # the breakdown
"""
import json
import os
import shutil
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
CALLS = 1500


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "L1"
    if mode not in ("L1", "md5", "hooks"):
        raise SystemExit(f"mode must be L1, md5 or hooks, not {mode!r}")
    torch.set_num_threads(1)
    a, b = torch.randn(64, 64), torch.randn(64, 64)

    def loop() -> float:
        c0 = time.process_time()
        for _ in range(CALLS):
            torch.add(a, b)
        return time.process_time() - c0

    base = min(loop() for _ in range(5))
    if mode == "hooks":
        sys.path.insert(0, HERE)
        from run_step_bench import install_floor

        install_floor("none")
    from msprobe.pytorch import PrecisionDebugger

    root = tempfile.mkdtemp(prefix="record_loop_")
    try:
        cfg = {"task": "statistics", "dump_path": os.path.join(root, "dump"), "rank": [], "step": [], "level": "L1",
               "async_dump": False, "statistics": {"scope": [], "list": [], "data_mode": ["all"],
                                                   "summary_mode": "md5" if mode == "md5" else "statistics"}}
        with open(os.path.join(root, "config.json"), "w") as f:
            json.dump(cfg, f)
        dbg = PrecisionDebugger(config_path=os.path.join(root, "config.json"))
        best = float("inf")
        for _ in range(7):
            dbg.start()
            best = min(best, loop())
            dbg.stop()
            dbg.step()
        records = dbg.dumper.session.records_total
        dbg.dumper.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({"mode": mode, "us_per_record": round((best - base) / CALLS * 1e6, 2),
                      "us_per_call_without_tool": round(base / CALLS * 1e6, 2), "records": records}))


if __name__ == "__main__":
    main()
