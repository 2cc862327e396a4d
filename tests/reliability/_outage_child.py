"""A training run whose S3 endpoint fails (run as a script by test_failing_storage.py).

``stop``: a moto server of its own serves the dump, and is stopped after ``stop_after`` steps
(every later request meets a refused connection). ``hang``: the dump goes through a
FaultProxy that, after ``stop_after`` steps, answers no request (each is held, then reset). ``refuse``: dump_path names a port where
nothing listens. Prints one JSON line: the wall time of each step (start() to step()), the
objects not written, and (``refuse``) the error PrecisionDebugger() raised and how long it took.
"""
import json
import os
import socket
import sys
import time


def start_moto(bucket):
    """A moto S3 server of this process on 127.0.0.1 with ``bucket`` made: (server, endpoint)."""
    import logging

    import s3fs
    from moto.server import ThreadedMotoServer

    from tests.conftest_s3 import s3_storage_options

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    s3fs.S3FileSystem(**s3_storage_options(endpoint)).mkdir(bucket)
    return server, endpoint


def main():
    mode, steps, stop_after = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    extra = json.loads(sys.argv[4])
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                 "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                 "AWS_EC2_METADATA_DISABLED": "true"}.items():
        os.environ[k] = v
    import torch
    import torch.nn as nn

    from msprobe.pytorch import PrecisionDebugger
    from tests.conftest_s3 import s3_storage_options

    server = None
    if mode == "refuse":
        with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
            s.bind(("127.0.0.1", 0))
            endpoint = f"http://127.0.0.1:{s.getsockname()[1]}"
    else:
        server, endpoint = start_moto("outage")
    proxy = None
    if mode == "hang":
        from tests.conftest_s3 import FaultProxy

        proxy = FaultProxy(endpoint, kinds=("timeout",), hold=600).start()
        endpoint = proxy.endpoint
    opts = s3_storage_options(endpoint)
    t0 = time.monotonic()
    try:
        dbg = PrecisionDebugger(task="tensor", level="L1", dump_path="s3://outage/run", storage_options=opts, **extra)
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        print(json.dumps({"init_error": f"{type(exc).__name__}: {exc}", "init_s": time.monotonic() - t0}), flush=True)
        return
    model = nn.Linear(64, 64)
    times = []
    for step in range(steps):
        if server is not None and step == stop_after:
            if proxy is not None:
                proxy.rate = 1.0  # every request from now on: no answer
            else:
                server.stop()
        t = time.monotonic()
        dbg.start(model)
        for _ in range(3):
            model(torch.randn(4, 64)).sum().backward()
        dbg.stop()
        dbg.step()
        times.append(time.monotonic() - t)
    session = dbg.dumper.session
    not_written = session.objects_not_written
    t = time.monotonic()
    PrecisionDebugger._reset()
    print(json.dumps({"steps": times, "not_written": not_written, "close_s": time.monotonic() - t}), flush=True)


if __name__ == "__main__":
    main()
