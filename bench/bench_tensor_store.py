"""Tensor mode, one step of the GPT-2-like model: (a) our classic .pt files, (b) our Zarr tensor
store (dedup + compression), (c) the real msprobe 26.2.0 — bytes, objects and step overhead,
side by side in one run; then the S3 requests needed to read one tensor back from (b).

    .venv/bin/python bench/bench_tensor_store.py [--rounds 1] [--steps 1] [--metric cpu --threads 1]
        [--real-python /work/venvs/ms26/bin/python] [--zarr-modes tensor_zarr,tensor_zarr_zstd,tensor_zarr_none]

Each measurement is a fresh process (bench/run_step_bench.py: 1 warm-up step + ``--steps``
measured, median); bytes and objects are per dumped step (every step is dumped). The
overhead is the step time over the no-tool run of the same interpreter, minus one.
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
OURS = sys.executable


def measure(python, tool, mode, steps, dump_path, threads, keep=False):
    env = dict(os.environ)
    if python != OURS:
        env.pop("PYTHONPATH", None)
    else:
        env["PYTHONPATH"] = ROOT
    if keep:
        env["MSPROBE_BENCH_KEEP"] = "1"
    cmd = [python, os.path.join(HERE, "run_step_bench.py"), "--tool", tool, "--mode", mode, "--size", "gpt2",
           "--steps", str(steps), "--dump-path", dump_path, "--threads", str(threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd="/tmp", timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"{cmd} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def s3_reads(dump_path, samples=20):
    """Upload one rank directory of (b) to a local moto S3 server and count the requests per tensor read
    (through a counting HTTP proxy in front of the server)."""
    from moto.server import ThreadedMotoServer

    from msprobe.backends import open_store
    from msprobe.tensor_store import ZarrTensorReader
    from tests.conftest_s3 import _DUMMY_ENV, FaultProxy, s3_storage_options

    os.environ.update(_DUMMY_ENV)
    import logging
    import socket

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # the server's request log

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        import s3fs

        fs = s3fs.S3FileSystem(**s3_storage_options(endpoint))
        fs.mkdir("bench-zarr")
        rank = os.path.join(dump_path, "step1", "rank")
        fs.put(rank + "/", "bench-zarr/step1/rank/", recursive=True)
        proxy = FaultProxy(endpoint, rate=0.0).start()
        try:
            opts = s3_storage_options(proxy.endpoint)
            store = open_store("s3://bench-zarr", storage_options=opts, read_only=True)
            names = ZarrTensorReader(store, "step1/rank").names()
            rng = random.Random(0)
            pick = rng.sample(names, min(samples, len(names)))
            cold, warm, sizes = [], [], []
            for n in pick:
                r = ZarrTensorReader(store, "step1/rank")  # a fresh reader: no cached shard index
                before = proxy.requests
                v = r.load(n)
                cold.append(proxy.requests - before)
                before = proxy.requests
                r.load(n)
                warm.append(proxy.requests - before)
                sizes.append(v.nbytes)
        finally:
            proxy.stop()
    finally:
        server.stop()
    return {"tensors": len(pick), "cold_requests": cold, "warm_requests": warm,
            "bytes_min": min(sizes), "bytes_max": max(sizes)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--metric", default="cpu", choices=["wall", "cpu"])
    ap.add_argument("--zarr-modes", default="tensor_zarr,tensor_zarr_zstd",
                    help="comma list of run_step_bench modes for (b): tensor_zarr (the default codec, lz4), "
                         "tensor_zarr_zstd, tensor_zarr_none")
    ap.add_argument("--no-real", action="store_true", help="skip (c), the real tool")
    ap.add_argument("--real-python", default=os.environ.get("MSPROBE_REAL_PYTHON", "/work/venvs/ms26/bin/python"))
    args = ap.parse_args()
    mkey = "ms_median" if args.metric == "wall" else "cpu_ms_median"
    work = tempfile.mkdtemp(prefix="bench_tstore_")
    zmodes = args.zarr_modes.split(",")
    runs = [("ours", OURS, "none"), ("ours", OURS, "tensor")] + [("ours", OURS, m) for m in zmodes]
    if args.real_python and os.path.exists(args.real_python) and not args.no_real:
        runs += [("real", args.real_python, "none"), ("real", args.real_python, "tensor")]
    res: dict = {}
    zarr_dump = os.path.join(work, f"ours_{args.zarr_modes.split(',')[0]}")
    for r in range(args.rounds):
        for label, py, mode in runs:
            keep = mode == zmodes[0] and r == args.rounds - 1
            t0 = time.time()
            out = measure(py, "none" if mode == "none" else "msprobe", mode if mode != "none" else "L1",
                          args.steps, os.path.join(work, f"{label}_{mode}"), args.threads, keep=keep)
            res.setdefault((label, mode), []).append(out)
            print(f"round {r} {label} {mode}: {out[mkey]:.0f} ms/step ({time.time() - t0:.0f} s)", file=sys.stderr)
    print(f"GPT-2-like model, tensor L1, metric={args.metric} (ms/step, median of {args.rounds} round(s) x "
          f"{args.steps} measured step(s)), threads={args.threads}")
    print(f"{'run':28s} {'ms/step':>9s} {'overhead':>9s} {'wall ms':>9s} {'wall ovh':>9s} {'MB/step':>9s} "
          f"{'objects/step':>13s}")
    table = {}
    for label, _, mode in runs:
        rs = res[(label, mode)]
        ms = statistics.median(x[mkey] for x in rs)
        base = statistics.median(x[mkey] for x in res[(label, "none")])
        steps = rs[0]["steps_dumped"]
        mb = rs[0]["bytes"] / steps / 1e6
        objs = rs[0]["files"] / steps
        wall = statistics.median(x["ms_median"] for x in rs)
        wbase = statistics.median(x["ms_median"] for x in res[(label, "none")])
        table[(label, mode)] = (ms, ms / base - 1, mb, objs, wall / wbase - 1)
        name = {("ours", "none"): "none (ours' venv)", ("ours", "tensor"): "(a) ours, classic .pt",
                ("ours", "tensor_zarr"): "(b) ours, zarr+dedup, lz4", ("ours", "tensor_zarr_zstd"): "(b') zarr+dedup, zstd",
                ("ours", "tensor_zarr_none"): "(b'') zarr+dedup, no codec", ("real", "none"): "none (real's venv)",
                ("real", "tensor"): "(c) msprobe 26.2.0"}[(label, mode)]
        ov = "" if mode == "none" else f"{ms / base - 1:9.2f}"
        wov = "" if mode == "none" else f"{wall / wbase - 1:9.2f}"
        print(f"{name:28s} {ms:9.1f} {ov:>9s} {wall:9.1f} {wov:>9s} {'' if mode == 'none' else f'{mb:9.1f}'} "
              f"{'' if mode == 'none' else f'{objs:13.1f}'}")
    a = table[("ours", "tensor")]
    c = table.get(("real", "tensor"))
    for zm in zmodes:
        b = table[("ours", zm)]
        print(f"\n{zm}/(a): bytes {b[2] / a[2]:.3f}, objects {b[3] / a[3]:.4f}, overhead {b[1] / a[1]:.2f} "
              f"(target <= 1; wall {b[4] / a[4]:.2f})")
        if c:
            print(f"{zm}/(c): bytes {b[2] / c[2]:.3f} (target <= 0.5), objects {b[3] / c[3]:.4f} (target <= 0.05), "
                  f"overhead {b[1] / c[1]:.2f} (wall {b[4] / c[4]:.2f})")
    b = table[("ours", zmodes[0])]
    z = res[("ours", zmodes[0])][-1]["zarr"]
    steps = res[("ours", zmodes[0])][-1]["steps_dumped"]
    print(f"\nzarr store per step: {z['_names'][0] / steps:.0f} data names")
    print(f"{'dtype':10s} {'stored raw MB':>14s} {'encoded MB':>11s} {'ratio':>7s} {'shards':>7s}")
    for a_name, (raw, enc, shards) in sorted(z.items()):
        if a_name == "_names":
            continue
        print(f"{a_name:10s} {raw / steps / 1e6:14.2f} {enc / steps / 1e6:11.2f} {raw / enc if enc else 0:7.2f} "
              f"{shards / steps:7.1f}")
    classic_mb = a[2]
    raw_total = sum(v[0] for k, v in z.items() if k != "_names") / steps / 1e6
    print(f"dedup: classic payload bytes {classic_mb:.1f} MB/step -> {raw_total:.1f} MB distinct "
          f"({classic_mb / raw_total:.2f}x); compression on top: {raw_total / b[2]:.2f}x")
    reads = s3_reads(zarr_dump)
    print(f"\nS3 reads of {reads['tensors']} random tensors ({reads['bytes_min']}..{reads['bytes_max']} bytes) from "
          f"(b) on the local S3 server: cold {sorted(reads['cold_requests'])}, warm {sorted(reads['warm_requests'])} "
          "requests per tensor")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
