"""One measurement: time training steps of bench/gpt_model.py under a given tool and mode.

Runs under whichever ``msprobe`` is importable (ours, or the real tool in its own venv):
``python bench/run_step_bench.py --tool none|msprobe --mode MODE --size gpt2 --dump-path DIR``.
Prints one JSON line: per-step milliseconds, bytes and files written.
"""
import argparse
import json
import os
import shutil
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
from gpt_model import GPT, SIZES, timed_steps

MODES = {
    "L1": dict(task="statistics", level="L1"),
    "mix": dict(task="statistics", level="mix"),
    "L0": dict(task="statistics", level="L0"),
    "md5": dict(task="statistics", level="L1", summary_mode="md5"),
    "tensor": dict(task="tensor", level="L1"),
    # ours only: the Zarr tensor store (spec section 21)
    "tensor_zarr": dict(task="tensor", level="L1", extra={"tensor_store": "zarr"}),  # default codec: lz4
    "tensor_zarr_zstd": dict(task="tensor", level="L1", extra={"tensor_store": "zarr", "tensor_compression": "zstd"}),
    "tensor_zarr_none": dict(task="tensor", level="L1", extra={"tensor_store": "zarr", "tensor_compression": "none"}),
    # ours only, the limits of statistics L1 in the same run: the same hooks and records, nothing written;
    # "floor" reads each recorded tensor once (one sum), "hooks" reads none
    "floor": dict(task="statistics", level="L1", floor="sum"),
    "hooks": dict(task="statistics", level="L1", floor="none"),
}


def install_floor(read: str) -> None:
    """Our dumper with its statistics replaced by one ``sum`` per tensor (``read="sum"``) or by nothing
    (``"none"``), and with nothing written: the journal and the documents are dropped after the pending
    statistics are resolved. The hooks, the argument encoding and the records are the real ones."""
    from msprobe.dumpers.pytorch import _encode
    from msprobe.dumpers.session import DumpSession

    def stat_handle(t):
        if read == "sum" and t.numel():
            t.detach().sum()  # (the encoder passes a tensor needing a gradient as it is: no graph for this read)
        return _encode.StatHandle(_encode._K_DONE, {"Max": None, "Min": None, "Mean": None, "Norm": None})

    def drop(self, **_):
        with self.lock:
            self.docs.pending.resolve(self.fetch_stats)
            self.journal.queue = []
            self._dirty = False

    _encode._stat_handle = stat_handle
    _encode.NATIVE_ENTRY = False  # (the C path of an entry reads the tensor: the floor takes the one above)
    DumpSession.flush_journal = drop
    DumpSession.publish = drop
    from msprobe.dumpers.session._journal import JournalPipeline

    if hasattr(JournalPipeline, "append_record"):  # (a record's line straight to the journal: dropped too)
        JournalPipeline.append_record = lambda self, *args: None


def zarr_stats(dump_path):
    """Per dtype: stored raw bytes (after dedup) and encoded shard bytes, from each rank's manifest."""
    out = {}
    for root, dirs, _ in os.walk(dump_path):
        if os.path.basename(root) != "tensors.zarr":
            continue
        with open(os.path.join(root, "zarr.json")) as f:
            m = json.load(f)["attributes"]["msprobe_lake"]
        seen = set()
        for p in m["payloads"]:
            if p is None:
                continue
            a, start, count, _ = p
            if (a, start) in seen:
                continue
            seen.add((a, start))
            with open(os.path.join(root, a, "zarr.json")) as f:
                isz = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "float16": 2, "int32": 4,
                       "uint32": 4, "float32": 4, "int64": 8, "uint64": 8, "float64": 8, "complex64": 8,
                       "complex128": 16}[json.load(f)["data_type"]]
            out.setdefault(a, [0, 0, 0])[0] += count * isz
        for a, info in m["arrays"].items():
            out.setdefault(a, [0, 0, 0])[1] += sum(info["shards"].values())
            out[a][2] += len(info["shards"])
        out.setdefault("_names", [0, 0, 0])[0] += len(m["tensors"])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", choices=["none", "msprobe"], required=True)
    ap.add_argument("--mode", default="L1", choices=sorted(MODES))
    ap.add_argument("--size", default="gpt2", choices=sorted(SIZES))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--dump-path", default="/tmp/msprobe_bench_dump")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda / cuda:N (bench/gpu/run.sh)")
    ap.add_argument("--window", default="step", choices=["step", "fwd_bwd"],
                    help="dump window: the whole step, or forward+backward (optimizer step outside)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    size = dict(SIZES[args.size])
    batch = size.pop("batch")
    torch.manual_seed(0)
    model = GPT(**size).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    shutil.rmtree(args.dump_path, ignore_errors=True)
    dbg = None
    if args.tool == "msprobe":
        from msprobe.pytorch import PrecisionDebugger

        m = MODES[args.mode]
        if "floor" in m:
            install_floor(m["floor"])
        cfg = {"task": m["task"], "dump_path": args.dump_path, "rank": [], "step": [], "level": m["level"],
               "async_dump": False, "risk_level": "ALL",
               **m.get("extra", {}),
               m["task"]: {"scope": [], "list": [], "data_mode": ["all"],
                           **({"summary_mode": m.get("summary_mode", "statistics")} if m["task"] == "statistics" else {})}}
        cfg_path = args.dump_path.rstrip("/") + ".config.json"
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        dbg = PrecisionDebugger(config_path=cfg_path)
    times, cpu = timed_steps(model, opt, size, batch, args.warmup + args.steps, dbg,
                             optimizer_in_window=args.window == "step", device=args.device)
    if dbg is not None and hasattr(dbg, "dumper"):  # ours: wait for the background writer
        dbg.dumper.close()
    nbytes = nfiles = records = 0
    for root, _, files in os.walk(args.dump_path):
        for fn in files:
            nfiles += 1
            nbytes += os.path.getsize(os.path.join(root, fn))
            if fn == "dump.json":
                with open(os.path.join(root, fn)) as f:
                    records += len(json.load(f).get("data", {}))
    if dbg is not None and "floor" in MODES[args.mode]:  # nothing written: count the records made
        records = dbg.dumper.session.records_total if hasattr(dbg, "dumper") else 0
    measured = times[args.warmup:]
    zs = zarr_stats(args.dump_path) if args.mode.startswith("tensor_zarr") else None
    print(json.dumps({"ms_median": statistics.median(measured), "ms": measured,
                      "cpu_ms_median": statistics.median(cpu[args.warmup:]), "bytes": nbytes, "files": nfiles,
                      "records": records, "steps_dumped": args.warmup + args.steps, "zarr": zs}))
    if not os.environ.get("MSPROBE_BENCH_KEEP"):
        shutil.rmtree(args.dump_path, ignore_errors=True)


if __name__ == "__main__":
    main()
