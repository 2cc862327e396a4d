"""Online run_ut end to end: the training side and the checker as two processes on this machine."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from tests.conftest_s3 import s3_storage_options
from tests.online.conftest import (
    ThreadChecker,
    assert_covers,
    checker_config,
    details_rows,
    finish,
    result_rows,
    run_training,
    start_checker,
    start_training,
    training_config,
    training_result,
)

pytest.importorskip("torch")
pytest.importorskip("msprobe.run_ut.execute")


def _statuses(rows):
    return {r[1] for r in rows} | {r[2] for r in rows}


def test_shared_directory(tmp_path):
    nfs = str(tmp_path / "nfs")
    out = str(tmp_path / "out")
    checker = start_checker(checker_config(tmp_path, nfs_path=nfs, host="", port=-1, tls_path=""), out)
    sent = run_training(training_config(tmp_path, nfs_path=nfs, host="", port=-1, tls_path=""), steps=1)
    log = finish(checker)
    assert sent["stats"]["dropped"] == 0 and sent["stats"]["sampled_out"] == 0
    rows = assert_covers(out, sent)
    assert "error" not in _statuses(rows), rows
    assert any(r[2] == "pass" for r in rows), "backward APIs were checked too"
    assert "APIs checked" in log
    # processed packets are removed from the shared directory once recorded (as the real tool does)
    assert not [f for _, _, fs in os.walk(nfs) for f in fs if f.endswith(".pkt")]
    # the training side wrote no dump files: online mode sends packets instead
    assert not [f for _, _, fs in os.walk(tmp_path / "dump_unused") for f in fs]


@pytest.mark.s3
def test_s3_store(tmp_path, s3_server, s3_bucket_url):
    opts = s3_storage_options(s3_server, picklable=True)
    url = f"{s3_bucket_url}/online"
    out = str(tmp_path / "out")
    checker = ThreadChecker(checker_config(tmp_path, nfs_path=url, storage_options=opts, poll_interval=0.3), out)
    sent = run_training(training_config(tmp_path, nfs_path=url, storage_options=opts), steps=1)
    checker.join()
    assert sent["stats"]["dropped"] == 0
    assert_covers(out, sent)


def test_plain_tcp(tmp_path):
    out = str(tmp_path / "out")
    checker = ThreadChecker(checker_config(tmp_path, nfs_path="", host="127.0.0.1", port=0, tls_path=""), out)
    sent = run_training(training_config(tmp_path, nfs_path="", host="127.0.0.1", port=checker.port, tls_path=""),
                        steps=1)
    checker.join()
    assert sent["stats"]["dropped"] == 0 and sent["stats"]["failed"] == 0
    rows = assert_covers(out, sent)
    assert "error" not in _statuses(rows)


def test_tls_mutual_certificates_and_wrong_certificate_refused(tmp_path, tls_dirs):
    from msprobe.online.packet import encode_packet
    from msprobe.online.transport import SocketSink, TransportError, client_ssl_context

    out = str(tmp_path / "out")
    checker = ThreadChecker(checker_config(tmp_path, host="127.0.0.1", port=0, tls_path=tls_dirs["server"]), out)
    port = checker.port
    # a client whose certificate another CA signed is refused; so is one without a certificate
    hdr = {"kind": "close", "run": "rogue", "rank": 0, "step": 0, "seq": 0}
    rogue = SocketSink("127.0.0.1", port, ssl_context=client_ssl_context(tls_dirs["rogue"]))
    with pytest.raises(TransportError, match="refused|failed"):
        rogue.send(encode_packet(hdr), hdr)
    import ssl

    anon = ssl.create_default_context(cafile=os.path.join(tls_dirs["client"], "ca.crt"))
    anon.check_hostname = False
    with pytest.raises(TransportError, match="refused|failed"):
        SocketSink("127.0.0.1", port, ssl_context=anon).send(encode_packet(hdr), hdr)
    sent = run_training(training_config(tmp_path, host="127.0.0.1", port=port, tls_path=tls_dirs["client"]),
                        steps=1)
    summary = checker.join()
    assert sent["stats"]["dropped"] == 0
    assert_covers(out, sent)  # the rogue "close" packets were never accepted
    assert summary["refused_connections"] == 2


def test_two_ranks_over_tcp(tmp_path):
    """Two distributed training processes (gloo) send to one checker; rank_list [0, 1]: a CSV pair per rank."""
    import socket

    out = str(tmp_path / "out")
    cfg = json.load(open(checker_config(tmp_path, host="127.0.0.1", port=0, tls_path="")))
    cfg["run_ut"]["rank_list"] = [0, 1]
    ck = tmp_path / "ck2.json"
    ck.write_text(json.dumps(cfg))
    checker = ThreadChecker(str(ck), out)
    train_cfg = training_config(tmp_path, host="127.0.0.1", port=checker.port, tls_path="")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        master = s.getsockname()[1]
    procs = [start_training(train_cfg, 1, {"WORLD_SIZE": "2", "RANK": str(r), "MASTER_PORT": str(master)})
             for r in (0, 1)]
    sent = [training_result(p) for p in procs]
    summary = checker.join()
    for r in (0, 1):
        assert sent[r]["stats"]["dropped"] == 0
        assert_covers(out, sent[r], rank=r)
    assert sorted(summary["files"]) == ["rank0", "rank1"]


def test_tls_path_default_needs_certificates(tmp_path, monkeypatch):
    """tls_path absent means the current directory: without client.key there, a clear error (plain
    TCP only when tls_path is "" explicitly)."""
    from msprobe.dumpers.config import load_config
    from msprobe.dumpers.pytorch._online import make_sink
    from msprobe.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    cfg = load_config(training_config(tmp_path, host="127.0.0.1", port=5))
    assert cfg.online.transport == "tls"
    with pytest.raises(ConfigError, match="client.key"):
        make_sink(cfg.online)


def test_killed_checker_resumes(tmp_path):
    nfs = str(tmp_path / "nfs")
    out = str(tmp_path / "out")
    sent = run_training(training_config(tmp_path, nfs_path=nfs), steps=1)  # packets wait in the shared dir
    total = sum(sent["forward_counts"].values())
    cfg = checker_config(tmp_path, nfs_path=nfs)
    checker = start_checker(cfg, out)
    progress = os.path.join(out, "online_run_ut_progress.jsonl")
    deadline = time.monotonic() + 120
    while True:  # kill it hard in the middle of the run
        n = sum(1 for ln in open(progress) if '"done"' in ln) if os.path.exists(progress) else 0
        if n >= total // 3:
            break
        assert checker.poll() is None and time.monotonic() < deadline, checker.communicate()[0]
        time.sleep(0.02)
    checker.send_signal(signal.SIGKILL)
    checker.wait()
    partial = len(result_rows(out))
    assert 0 < partial < total
    log = finish(start_checker(cfg, out, "--online"))  # the flag form (is_online is in the config too)
    assert_covers(out, sent)  # no API twice, none missing
    assert f"{total - partial}" in log or "APIs checked" in log
    from msprobe.run_ut.csvio import api_of_row

    det_apis = {api_of_row(r[0]) for r in details_rows(out)}
    assert det_apis == set(sent["forward_counts"])  # every API has its details rows


def test_recompute_skips_backward_and_rank_list_filters(tmp_path):
    nfs = str(tmp_path / "nfs")
    out = str(tmp_path / "out")
    sent = run_training(training_config(tmp_path, nfs_path=nfs, online_run_ut_recompute=True), steps=1)
    names = [p for _, _, files in os.walk(nfs) for p in files]
    assert names and len(names) == sum(sent["forward_counts"].values()) + 2  # + step_end + close: no backward
    # a checker for rank 1 finds nothing to check in rank 0's packets
    cfg = json.load(open(checker_config(tmp_path, nfs_path=nfs)))
    cfg["run_ut"]["rank_list"] = [1]
    path = tmp_path / "ck1.json"
    path.write_text(json.dumps(cfg))
    summary = ThreadChecker(str(path), str(tmp_path / "out1"), idle_timeout=1).join()
    assert summary["ignored_rank"] == len(names) and summary["apis"] == 0
    assert not [f for f in os.listdir(tmp_path / "out1") if f.startswith("accuracy_checking_result")]
    ThreadChecker(checker_config(tmp_path, nfs_path=nfs), out).join()
    rows = assert_covers(out, sent)
    assert all(r[2].strip() == "" for r in rows), rows  # no backward checked


def test_checker_cli_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"task": "run_ut", "run_ut": {"is_online": True}}))
    p = subprocess.run([os.sys.executable, "-m", "msprobe", "run_ut", "--online", "-config", str(bad)],
                       capture_output=True, text=True, env=__import__("tests.online.conftest", fromlist=["env"]).env())
    assert p.returncode == 1 and "nfs_path" in p.stderr
