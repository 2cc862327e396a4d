"""A small seeded training run under the PyTorch dumper, driven by the reliability tests.

Usage: python _train_child.py DUMP_PATH TASK STEPS STORAGE_OPTIONS_JSON [EXTRA_CONFIG_JSON]

Prints ``READY`` once the debugger exists, then after the forward and after the backward
of every training iteration ``MARK <step> <n> <time>`` where ``n`` is the number of records
of that step so far and ``time`` the wall-clock time (with the default journal_flush every one of them is
journaled at once on local stores, within journal_window seconds on object stores).
With WORLD_SIZE/RANK/MASTER_PORT in the environment it first joins a gloo
process group on 127.0.0.1, so the dumper takes its rank from torch.distributed.
Exit status 3 (and ``REFUSED`` on stdout) when the dumper refuses the run
directory (run_dir_policy="refuse").
"""
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from msprobe.errors import StoragePermissionError
from msprobe.pytorch import PrecisionDebugger, seed_all


def train(argv, out=sys.stdout):
    dump_path, task, steps = argv[0], argv[1], int(argv[2])
    storage_options = json.loads(argv[3]) or None
    extra = json.loads(argv[4]) if len(argv) > 4 else {}
    extra = dict(extra)
    if "WORLD_SIZE" in os.environ:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
                                rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    seed_all(extra.pop("seed", 7))
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16), nn.LayerNorm(16), nn.Linear(16, 4))
    iters = extra.pop("iters", 4)
    cfg = dict(extra)  # the defaults unless the test says otherwise
    dbg = PrecisionDebugger(task=task, level="mix", dump_path=dump_path, storage_options=storage_options, **cfg)
    print("READY", file=out, flush=True)
    session = dbg.dumper.session
    for step in range(steps):
        x = torch.randn(8, 16)
        try:
            dbg.start(model)
        except StoragePermissionError as exc:
            print("REFUSED", exc, file=out, flush=True)
            os._exit(3)
        for _ in range(iters):
            y = model(x)
            loss = F.cross_entropy(y, torch.zeros(8, dtype=torch.long))
            print(f"MARK {step} {len(session.data)} {time.time():.4f}", file=out, flush=True)  # forward done
            loss.backward()
            print(f"MARK {step} {len(session.data)} {time.time():.4f}", file=out, flush=True)
        with torch.no_grad():  # plain SGD (torch.optim imports torch._dynamo: seconds per process)
            for p in model.parameters():
                p -= 0.01 * p.grad
                p.grad = None
        dbg.stop()
        dbg.step()
    if "WORLD_SIZE" in os.environ:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    print("DONE", file=out, flush=True)


def serve():
    """Fork server: torch and msprobe are imported once; each stdin line (a JSON list:
    progress file, then the arguments of ``train``) runs in a forked child, whose pid
    is printed at once and whose exit status follows when it ends (``PID n``, ``EXIT n rc``).
    The progress file gets READY/MARK/DONE lines. The tests SIGKILL the child."""
    import s3fs  # noqa: F401 - imported before the fork, like torch

    for line in sys.stdin:
        args = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                with open(args[0], "w", buffering=1) as out:
                    train(args[1:], out)
            except BaseException:  # noqa: BLE001 - the traceback goes to the parent
                import traceback

                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            os._exit(code)
        print(f"PID {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"EXIT {pid} {os.waitstatus_to_exitcode(status)}", flush=True)


def race(argv):
    """``--race N START OUT_DIR`` then the arguments of ``train``: torch is imported once, then N
    processes are forked that all start ``train`` at the wall-clock time START, each with its
    own seed (different tensors); prints ``RC <i> <exit status>`` per process."""
    import s3fs  # noqa: F401 - imported before the fork, like torch

    n, start, out_dir = int(argv[0]), float(argv[1]), argv[2]

    def setup(i):
        args = list(argv[3:])
        args[4] = json.dumps({**json.loads(args[4]), "seed": 100 + i})
        time.sleep(max(0.0, start - time.time()))
        return args

    _fork_all(n, out_dir, "proc", setup)


def _fork_all(n, out_dir, name, setup):
    """Fork ``n`` processes running ``train(setup(i))`` (output in OUT_DIR/<name><i>.out, a
    traceback in .err); prints ``RC <i> <exit status>`` per process as they end."""
    pids = {}
    for i in range(n):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                args = setup(i)
                with open(os.path.join(out_dir, f"{name}{i}.out"), "w", buffering=1) as out:
                    train(args, out)
            except BaseException:  # noqa: BLE001 - the traceback goes to the parent
                import traceback

                with open(os.path.join(out_dir, f"{name}{i}.err"), "w") as err:
                    traceback.print_exc(file=err)
                code = 1
            os._exit(code)
        pids[pid] = i
    for _ in range(n):
        pid, status = os.wait()
        print(f"RC {pids[pid]} {os.waitstatus_to_exitcode(status)}", flush=True)


def ranks(argv):
    """``--ranks WORLD MASTER_PORT OUT_DIR`` then the arguments of ``train``: torch is imported
    once, then WORLD ranks are forked at once (RANK/WORLD_SIZE/MASTER_PORT set in each), each
    with its output in ``OUT_DIR/rank<R>.out``; prints ``RC <rank> <exit status>`` per rank."""
    import s3fs  # noqa: F401 - imported before the fork, like torch

    world, port, out_dir = int(argv[0]), argv[1], argv[2]

    def setup(rank):
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_PORT=port, MASTER_ADDR="127.0.0.1")
        return argv[3:]

    _fork_all(world, out_dir, "rank", setup)


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        serve()
    elif sys.argv[1] == "--ranks":
        ranks(sys.argv[2:])
    elif sys.argv[1] == "--race":
        race(sys.argv[2:])
    else:
        train(sys.argv[1:])
