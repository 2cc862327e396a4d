"""Benchmark: writing tensor files through msprobe.backends.BackgroundWriter.

The bytes of a dump: ``--local-mb`` MiB (``--s3-mb`` for S3) of "tensors" of mixed,
realistic sizes from 4 KiB to 64 MiB (70% 4-256 KiB, 25% 256 KiB-8 MiB, 5% 8-64 MiB,
log-uniform within each band, fixed seed). Each tensor is a fresh ``bytes`` copy made
by the producer just before it is handed over, as a dumper copies a tensor off the
device, so memory held by the writer shows in RSS.

Local disk (``--dir``, default ``bench/out``):

* raw: a dd-like loop in one thread, ``open/write/fsync/close`` per file, the same
  bytes and file names: the floor to compare against;
* writer, 1 and 4 workers: ``BackgroundWriter(LocalStore(dir))`` (temp file, fsync,
  ``os.replace``, directory fsync per object) with ``max_bytes_in_flight=--bound-mb``;
* the same two without fsync (``--no-fsync-too``), for the page-cache ceiling.

S3: a moto server (``ThreadedMotoServer``) in its own process on 127.0.0.1, written
through s3fs by ``BackgroundWriter`` with 1 and 4 workers (``--skip-s3`` to leave out).

Each run is a fresh subprocess that reports its wall time, MB/s, its RSS just before
the timed loop (baseline: interpreter, imports, the 64 MiB source pool) and its peak
RSS (``ru_maxrss``); "RSS over baseline" is compared with the writer's bound, and the
writer's own ``peak_bytes_in_flight`` is reported too. The target is emptied and
``sync``ed between runs.

    python bench/bench_backends.py                        # 1 GiB local, 256 MiB S3
    python bench/bench_backends.py --local-mb 256 --s3-mb 64 --skip-s3   # quick
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

KIB, MIB = 1 << 10, 1 << 20
POOL_BYTES = 64 * MIB
BANDS = [(0.70, 4 * KIB, 256 * KIB), (0.25, 256 * KIB, 8 * MIB), (0.05, 8 * MIB, 64 * MIB)]


def tensor_sizes(total: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    sizes, acc = [], 0
    while acc < total:
        u, lo, hi = rng.random(), 0, 0
        for weight, lo, hi in BANDS:
            if u < weight:
                break
            u -= weight
        size = int(lo * (hi / lo) ** rng.random())
        size = min(size, total - acc) if total - acc >= 4 * KIB else 4 * KIB
        sizes.append(size)
        acc += size
    return sizes


def rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def tensors(sizes: list[int], pool: memoryview):
    """(key, fresh bytes) per tensor, cut from the random pool at varying offsets."""
    offset = 0
    for i, size in enumerate(sizes):
        if offset + size > len(pool):
            offset = 0
        yield f"rank{i % 8}/dump_tensor_data/Torch.op.{i}.forward.output.0.pt", bytes(pool[offset : offset + size])
        offset = (offset + size * 7 + 4096) % (len(pool) - 4 * KIB)


# -- one run, in its own process ---------------------------------------------------------

def run_phase(args: argparse.Namespace) -> dict:
    sizes = tensor_sizes(args.total_mb * MIB, args.seed)
    pool = memoryview(os.urandom(POOL_BYTES))
    from msprobe.backends import BackgroundWriter, LocalStore, open_store

    if args.phase.startswith("raw"):
        fsync = args.phase == "raw"
        root = args.target
        base = rss_now()
        start = time.perf_counter()
        made = set()
        for key, data in tensors(sizes, pool):
            path = os.path.join(root, *key.split("/"))
            parent = os.path.dirname(path)
            if parent not in made:
                os.makedirs(parent, exist_ok=True)
                made.add(parent)
            with open(path, "wb") as f:
                f.write(data)
                if fsync:
                    f.flush()
                    os.fsync(f.fileno())
        elapsed = time.perf_counter() - start
        stats = None
    else:
        if args.phase.startswith("s3"):
            from tests.conftest_s3 import s3_storage_options

            store = open_store(args.target, s3_storage_options(args.endpoint, picklable=True))
        else:
            store = LocalStore(args.target, fsync=not args.phase.endswith("nofsync"))
        bound = args.bound_mb * MIB
        base = rss_now()
        start = time.perf_counter()
        with BackgroundWriter(store, workers=args.workers, max_bytes_in_flight=bound) as writer:
            for key, data in tensors(sizes, pool):
                writer.submit(key, data)
                del data
        elapsed = time.perf_counter() - start
        stats = writer.stats
        assert stats.failures == 0 and stats.objects_written == len(sizes)
    total = sum(sizes)
    return {
        "phase": args.phase,
        "workers": args.workers,
        "objects": len(sizes),
        "bytes": total,
        "seconds": elapsed,
        "mb_per_s": total / MIB / elapsed,
        "rss_base": base,
        "rss_peak": peak_rss(),
        "peak_in_flight": stats.peak_bytes_in_flight if stats else None,
        "blocked_seconds": stats.blocked_seconds if stats else None,
    }


# -- orchestration -----------------------------------------------------------------------

def spawn_phase(phase: str, target: str, total_mb: int, workers: int, args, endpoint: str = "") -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--phase", phase, "--target", target,
           "--total-mb", str(total_mb), "--workers", str(workers), "--bound-mb", str(args.bound_mb),
           "--seed", str(args.seed), "--endpoint", endpoint]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{phase} failed:\n{out.stdout}\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def clear(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    os.sync()


def moto_server(conn) -> None:  # runs in its own process
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    from moto import backends
    from moto.server import ThreadedMotoServer

    modules = tuple(backends.list_of_moto_modules())
    backends.list_of_moto_modules = lambda: modules  # as in tests/conftest_s3.py
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    conn.send(server.get_host_and_port())
    conn.recv()  # until the parent is done
    server.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--local-mb", type=int, default=1024)
    p.add_argument("--s3-mb", type=int, default=256)
    p.add_argument("--bound-mb", type=int, default=256, help="BackgroundWriter max_bytes_in_flight")
    p.add_argument("--dir", default=os.path.join(ROOT, "bench", "out", "backends"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-s3", action="store_true")
    p.add_argument("--no-fsync-too", action="store_true", help="also run raw and writer without fsync")
    p.add_argument("--json", action="store_true", help="print the results as JSON too")
    # internal: one run
    p.add_argument("--phase", help=argparse.SUPPRESS)
    p.add_argument("--target", help=argparse.SUPPRESS)
    p.add_argument("--total-mb", type=int, help=argparse.SUPPRESS)
    p.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--endpoint", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.phase:
        print(json.dumps(run_phase(args)))
        return

    results = []
    sizes = tensor_sizes(args.local_mb * MIB, args.seed)
    print(f"# local: {len(sizes)} tensors, {sum(sizes) / MIB:.0f} MiB, sizes {min(sizes) // KIB} KiB"
          f"..{max(sizes) // MIB} MiB, median {sorted(sizes)[len(sizes) // 2] // KIB} KiB; "
          f"dir {args.dir}; bound {args.bound_mb} MiB", flush=True)
    os.makedirs(args.dir, exist_ok=True)
    phases = [("raw", 1), ("writer", 1), ("writer", 4)]
    if args.no_fsync_too:
        phases += [("raw-nofsync", 1), ("writer-nofsync", 4)]
    for phase, workers in phases:
        target = tempfile.mkdtemp(dir=args.dir)
        r = spawn_phase(phase, target, args.local_mb, workers, args)
        clear(target)
        results.append(r)
        print(f"  {phase:15s} workers={workers}: {r['mb_per_s']:8.1f} MB/s ({r['seconds']:.2f} s)", flush=True)

    if not args.skip_s3:
        import multiprocessing

        os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                           "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"})
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        server = ctx.Process(target=moto_server, args=(child,), daemon=True)
        server.start()
        host, port = parent.recv()
        endpoint = f"http://{host}:{port}"
        import s3fs

        from tests.conftest_s3 import s3_storage_options

        fs = s3fs.S3FileSystem(**s3_storage_options(endpoint, picklable=True))
        s3_sizes = tensor_sizes(args.s3_mb * MIB, args.seed)
        print(f"# s3 (moto, own process): {len(s3_sizes)} tensors, {sum(s3_sizes) / MIB:.0f} MiB", flush=True)
        for workers in (1, 4):
            bucket = f"bench-{workers}-{os.getpid()}"
            fs.mkdir(bucket)
            r = spawn_phase("s3-writer", f"s3://{bucket}/dump", args.s3_mb, workers, args, endpoint)
            fs.rm(bucket, recursive=True)
            results.append(r)
            print(f"  s3-writer       workers={workers}: {r['mb_per_s']:8.1f} MB/s ({r['seconds']:.2f} s)", flush=True)
        parent.send("stop")
        server.join(10)

    print()
    print(report(results, args))
    if args.json:
        print(json.dumps(results, indent=1))


def report(results: list[dict], args) -> str:
    raw = next(r for r in results if r["phase"] == "raw")
    s3_1 = next((r for r in results if r["phase"] == "s3-writer" and r["workers"] == 1), None)
    lines = [
        f"Machine: {os.cpu_count()} CPUs, {platform.platform()}, Python {platform.python_version()}",
        "",
        "| run | workers | objects | MiB | s | MB/s | vs baseline | RSS base MiB | RSS peak MiB | peak - base MiB | writer peak in flight MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ref = s3_1 if r["phase"].startswith("s3") else raw
        ratio = r["mb_per_s"] / ref["mb_per_s"]
        fl = "-" if r["peak_in_flight"] is None else f"{r['peak_in_flight'] / MIB:.0f}"
        lines.append(
            f"| {r['phase']} | {r['workers']} | {r['objects']} | {r['bytes'] / MIB:.0f} | {r['seconds']:.2f} | "
            f"{r['mb_per_s']:.1f} | {ratio:.2f}x | {r['rss_base'] / MIB:.0f} | {r['rss_peak'] / MIB:.0f} | "
            f"{(r['rss_peak'] - r['rss_base']) / MIB:.0f} | {fl} |"
        )
    lines.append("")
    lines.append(f"Baselines: local rows vs `raw` (sequential write+fsync per file); s3 rows vs s3 with 1 worker. "
                 f"Bound (max_bytes_in_flight) = {args.bound_mb} MiB.")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
