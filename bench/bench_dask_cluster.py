"""Benchmark: ``msprobe compare`` of N rank pairs on a Dask cluster that shares no disk, against
the same compare in one process.

``--ranks`` rank pairs of ``--records`` records each (the generator of ``bench_compare.py``) are
written to a local folder and to a moto S3 server (``python -m moto.server``, its own process).
A ``dask scheduler`` and ``--workers`` ``dask worker`` processes (one thread each) are started as
separate commands, each worker in a mount namespace of its own with a private tmpfs over the
client's folder (tests/_dask_processes.py: ``unshare -m``), so a worker's files reach the client
only through compare. Each run is a fresh ``python -m msprobe compare ... --no-plot``; its wall
time, process CPU and the client's peak RSS (VmHWM, sampled) are printed:

* ``local``: the local dumps, in this machine's process (``-n 1``);
* ``local from S3``: the S3 dumps, in one process;
* ``cluster``: the S3 dumps, ``--scheduler``, ``-o`` a local folder (the CSVs come back to it);
* ``cluster -o s3://``: the same, the CSVs uploaded by the workers to the bucket.

The cluster's CSVs are checked byte for byte against the local run's (their names differ only
by the timestamp). The cluster's start is timed apart.

    python bench/bench_dask_cluster.py --ranks 16 --records 2000
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, ROOT)
from bench_compare import _compile_ours, synthesize  # noqa: E402

from tests._dask_processes import NoPrivateMount, isolated_cluster, private_mount_prefix  # noqa: E402

_AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _vm_hwm_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _run(cmd: list, timeout: float) -> dict:
    """Wall, process CPU and peak RSS of ``cmd``. The peak is the process's own high-water mark
    (VmHWM, sampled every 20 ms): ``wait4``'s ru_maxrss would start from this process's size
    at the fork, which holds the synthesized dumps."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    log = tempfile.TemporaryFile()
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    peak = 0.0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        peak = max(peak, _vm_hwm_mb(proc.pid))
        if time.perf_counter() - started > timeout:
            proc.kill()
        time.sleep(0.02)
    wall = time.perf_counter() - started
    log.seek(0)
    tail = log.read().decode(errors="replace")[-600:]
    log.close()
    rc = os.waitstatus_to_exitcode(status)
    return {"wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mb": round(peak, 1), "rc": rc, "tail": tail if rc else ""}


def _csvs(folder: str) -> dict:
    out = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".csv"):
            with open(os.path.join(folder, name), "rb") as handle:
                out[name.rsplit("_", 1)[0]] = handle.read()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--ranks", type=int, default=16, help="rank pairs")
    ap.add_argument("--records", type=int, default=2000, help="records per rank")
    ap.add_argument("--workers", type=int, default=2, help="dask worker processes (one thread each)")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    os.environ.update(_AWS)
    work = args.workdir or tempfile.mkdtemp(prefix="bench_dask_cluster_")
    client_dir = os.path.join(work, "client")  # hidden from the workers
    aside = os.path.join(work, "cluster")
    os.makedirs(client_dir, exist_ok=True)
    os.makedirs(aside, exist_ok=True)
    try:
        prefix = private_mount_prefix(client_dir)
    except NoPrivateMount as exc:
        print(f"{exc}: no cluster without a shared disk", file=sys.stderr)
        return 2
    _compile_ours()
    target, bench = synthesize(client_dir, args.records, args.ranks)
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    moto = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import s3fs

        opts = {"client_kwargs": {"endpoint_url": endpoint}, "key": "testing", "secret": "testing",
                "skip_instance_cache": True}
        fs = s3fs.S3FileSystem(**opts)
        deadline = time.monotonic() + 60
        while True:
            try:
                fs.mkdir("bench")
                break
            except Exception:  # the server is still starting
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
        files = {}
        for side, step in (("a", target), ("b", bench)):
            for dirpath, _, names in os.walk(step):
                for name in names:
                    path = os.path.join(dirpath, name)
                    with open(path, "rb") as handle:
                        files[f"bench/{side}/step0/{os.path.relpath(path, step)}"] = handle.read()
        fs.pipe(files)
        del files
        s3 = ["-tp", "s3://bench/a/step0", "-gp", "s3://bench/b/step0", "--storage-options", json.dumps(opts)]
        py = [sys.executable, "-m", "msprobe", "compare", "--no-plot"]
        out = {name: os.path.join(client_dir, name) for name in ("local", "s3_local", "cluster")}
        results = {"local": _run([*py, "-tp", target, "-gp", bench, "-o", out["local"]], 3600),
                   "local from S3": _run([*py, *s3, "-o", out["s3_local"]], 3600)}
        started = time.perf_counter()
        with isolated_cluster(client_dir, aside, prefix, workers=args.workers) as address:
            start_s = time.perf_counter() - started
            results["cluster"] = _run([*py, *s3, "-o", out["cluster"], "--scheduler", address], 3600)
            results["cluster -o s3://"] = _run([*py, *s3, "-o", "s3://bench/out", "--scheduler", address], 3600)
        same = _csvs(out["cluster"]) == _csvs(out["local"]) and len(_csvs(out["local"])) == args.ranks
        fs.invalidate_cache()
        stored = len([p for p in fs.ls("bench/out") if p.endswith(".csv")])
    finally:
        moto.terminate()
        moto.wait()
    print(f"{args.ranks} rank pairs x {args.records} records; {args.workers} dask workers (cluster start "
          f"{start_s:.1f} s, not counted); load average {os.getloadavg()[0]:.1f}")
    print(f"{'run':<20} {'wall (s)':>9} {'CPU (s)':>8} {'client RSS (MiB)':>17} {'rc':>3}")
    for name, got in results.items():
        print(f"{name:<20} {got['wall_s']!s:>9} {got.get('cpu_s')!s:>8} {got['peak_rss_mb']!s:>17} {got['rc']!s:>3}")
        if got["rc"]:
            print(got.get("tail", ""))
    print(f"cluster CSVs byte-identical to the local run's: {same}; CSVs in s3://bench/out: {stored}")
    print(json.dumps({"ranks": args.ranks, "records": args.records, "workers": args.workers,
                      "cluster_start_s": round(start_s, 2), "same_csv_bytes": same, "stored_csvs": stored,
                      "runs": {name: {k: v for k, v in got.items() if k != "tail"} for name, got in results.items()}}))
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if same and stored == args.ranks and all(got["rc"] == 0 for got in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
