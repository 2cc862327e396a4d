"""Per-record cost of the statistics path's crash journal (DumpSession.add_record + flush_journal).

    PYTHONPATH=. .venv/bin/python bench/bench_journal.py

Prints the best-of-3 CPU time (time.process_time) of 20 000 records with journal_flush=64 and of
5 000 records with journal_flush=1. Compare two checkouts by running it with each on PYTHONPATH,
alternating.
"""
import tempfile
import time

from msprobe.dumpers.config import DumpConfig
from msprobe.dumpers.session import DumpSession

_T = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4, 8], "Max": 1.0, "Min": 0.0, "Mean": 0.5,
      "Norm": 2.0, "requires_grad": False}


def main():
    res = {}
    for flush, n in ((64, 20000), (1, 5000)):
        best = float("inf")
        for _ in range(3):
            s = DumpSession(DumpConfig(task="statistics", level="L1", dump_path=tempfile.mkdtemp(), journal_flush=flush),
                            "pytorch", fetch_stats=lambda hs: [{} for _ in hs], render_stack=list, get_rank=lambda: None)
            t = time.process_time()
            for i in range(n):
                s.add_record(f"Functional.op.{i}.forward", {"input_args": [dict(_T)], "output": [dict(_T)]})
            best = min(best, time.process_time() - t)
            s.close()
        res[f"journal_flush={flush} ({n} records) s"] = round(best, 3)
    print(res)


if __name__ == "__main__":
    main()
