"""Training-side cost of online run_ut with the checker attached, against the offline tensor dump.

    .venv/bin/python bench/bench_online.py --size opheavy --steps 5 --threads 1
    .venv/bin/python bench/bench_online.py --size gpt2 --steps 3 --threads 1 --modes none,tensor,online_tcp

Each measurement is a fresh training process (``--child``) running bench/gpt_model.py
(forward, backward, AdamW) inside start()/stop()/step(): 1 warm-up + N measured steps,
median process CPU time and wall time per step. ``tensor`` is the offline L1 tensor dump
into a local directory; ``online_nfs`` publishes packets into a shared directory and
``online_tcp`` sends them over TCP on 127.0.0.1, each with a checker process
(``msprobe run_ut -config``) running at the same time. The process CPU time of the
training side includes its sender thread (packet encoding and writes).
Prints a Markdown table; ratios are against the no-tool run of the same invocation.
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def child(args):
    sys.path.insert(0, HERE)
    import torch
    from gpt_model import GPT, SIZES, timed_steps

    if args.threads:
        torch.set_num_threads(args.threads)
    size = dict(SIZES[args.size])
    batch = size.pop("batch")
    torch.manual_seed(0)
    model = GPT(**size)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    dbg = None
    if args.mode != "none":
        from msprobe.pytorch import PrecisionDebugger

        sub = {"scope": [], "list": []}
        if args.mode.startswith("online") and args.queue:
            sub.update(online_queue_size=args.queue, online_queue_bytes=4 << 30)
        if args.mode == "online_nfs":
            sub.update(online_run_ut=True, nfs_path=os.path.join(args.dir, "nfs"))
        elif args.mode == "online_tcp":
            sub.update(online_run_ut=True, host="127.0.0.1", port=args.port, tls_path="")
        cfg = {"task": "tensor", "dump_path": os.path.join(args.dir, "dump"), "level": "L1", "tensor": sub}
        path = os.path.join(args.dir, "train.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        dbg = PrecisionDebugger(path)
    wall, cpu = timed_steps(model, opt, size, batch, args.warmup + args.steps, dbg)
    out = {"ms": statistics.median(wall[args.warmup:]), "cpu_ms": statistics.median(cpu[args.warmup:])}
    if dbg is not None:
        online = dbg.dumper.online
        t0 = time.perf_counter()
        dbg.dumper.close()  # drains the writer / the sender queue
        out["close_s"] = time.perf_counter() - t0
        if online is not None:
            out.update(online.stats.as_dict())
            out["apis"] = sum(online.forward_counts.values())
    print("RESULT " + json.dumps(out), flush=True)


def _env():
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    return e


def measure(args, mode):
    d = tempfile.mkdtemp(prefix=f"msprobe_online_{mode}_")
    checker = None
    port = 0
    try:
        if mode.startswith("online"):
            ck = {"task": "run_ut", "run_ut": {"is_online": True, "rank_list": [0], "tls_path": ""}}
            if mode == "online_nfs":
                ck["run_ut"].update(nfs_path=os.path.join(d, "nfs"))
            else:
                ck["run_ut"].update(host="127.0.0.1", port=0)
            with open(os.path.join(d, "ck.json"), "w") as f:
                json.dump(ck, f)
            port_file = os.path.join(d, "port")
            checker = subprocess.Popen([sys.executable, "-m", "msprobe", "run_ut", "-config", os.path.join(d, "ck.json"),
                                        "-o", os.path.join(d, "out"), "--port-file", port_file],
                                       env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if mode == "online_tcp":
                while not os.path.exists(port_file):
                    time.sleep(0.05)
                port = int(open(port_file).read())
        cmd = [sys.executable, __file__, "--child", "--mode", mode, "--size", args.size, "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--threads", str(args.threads), "--dir", d, "--port", str(port),
               "--queue", str(args.queue)]
        p = subprocess.run(cmd, env=_env(), capture_output=True, text=True)
        line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        if not line:
            raise SystemExit(p.stdout + p.stderr)
        res = json.loads(line[-1][7:])
        if checker is not None:
            t0 = time.perf_counter()
            try:  # the checker keeps checking what was sent; give it a bounded time, then stop it
                out, _ = checker.communicate(timeout=args.checker_wait)
            except subprocess.TimeoutExpired:
                checker.send_signal(signal.SIGTERM)
                out, _ = checker.communicate()
            res["checker_extra_s"] = time.perf_counter() - t0
            res["checker"] = [ln for ln in out.splitlines() if "APIs checked" in ln][-1:]
        return res
    finally:
        if checker is not None and checker.poll() is None:
            checker.kill()
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--mode", default="none")
    ap.add_argument("--modes", default="none,tensor,online_nfs,online_tcp")
    ap.add_argument("--size", default="opheavy")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--checker-wait", type=float, default=30.0)
    ap.add_argument("--queue", type=int, default=0, help="online_queue_size (0: the default, 256 packets)")
    args = ap.parse_args()
    if args.child:
        return child(args)
    results = {m: measure(args, m) for m in args.modes.split(",")}
    base = results.get("none")
    print(f"size {args.size}, {args.steps} measured steps, {args.threads} torch thread(s), queue "
          f"{args.queue or 256} packets, load {os.getloadavg()[0]:.1f}")
    print("| mode | CPU ms/step | ratio | wall ms/step | ratio | APIs queued | sent | dropped | sampled out |")
    print("|---|---|---|---|---|---|---|---|---|")
    for m, r in results.items():
        rc = r["cpu_ms"] / base["cpu_ms"] if base else float("nan")
        rw = r["ms"] / base["ms"] if base else float("nan")
        print(f"| {m} | {r['cpu_ms']:.1f} | {rc:.2f} | {r['ms']:.1f} | {rw:.2f} | {r.get('apis', '')} | "
              f"{r.get('sent', '')} | {r.get('dropped', '')} | {r.get('sampled_out', '')} |")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
