"""Everyday commands agree with each other (issue 23 items 5, 6): one progress reporter and one
flag (``--progress/--no-progress``, old spellings kept), ``-o/--output-path`` everywhere,
``--json`` on validate/index/run_ut, steps in numeric order, hints that name the command's options."""
from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import shutil
import struct
import subprocess
import sys
import termios

import pytest

from msprobe.cli import build_parser, main
from msprobe.progress import Progress

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MS26 = os.path.join(HERE, "fixtures", "real", "ms26")
STATS = os.path.join(MS26, "L1_statistics")  # step0 and step1, one proc dir each


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=ROOT)


# -- progress ------------------------------------------------------------------------------------

def test_progress_in_a_log_is_lines_not_carriage_returns():
    buf = io.StringIO()
    with Progress(40, "index", "rank dirs", enabled=True, stream=buf) as p:
        for _ in range(40):
            p.update()
    out = buf.getvalue()
    assert "\r" not in out
    lines = out.splitlines()
    assert lines[-1] == "index: 40/40 rank dirs [100%]" and 10 <= len(lines) <= 11
    quiet = io.StringIO()
    with Progress(40, "index", "rank dirs", stream=quiet) as p:  # default: only on a terminal
        p.update(40)
    assert quiet.getvalue() == ""


def _index_stderr(tmp_path, args: list, tty: bool) -> str:
    dump = tmp_path / "dump"
    if not dump.exists():
        shutil.copytree(STATS, dump)
    cmd = [sys.executable, "-m", "msprobe", "index", str(dump), *args]
    if not tty:
        r = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)
        assert r.returncode == 0, r.stderr
        return r.stderr
    master, slave = pty.openpty()  # a real terminal on stderr, 100 columns wide
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=slave, env=dict(_env(), COLUMNS="100"), timeout=300)
        os.close(slave)
        slave = None
        chunks = []
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        assert r.returncode == 0
        return b"".join(chunks).decode(errors="replace")
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)


def test_index_progress_is_terminal_aware(tmp_path):
    pytest.importorskip("pyarrow")
    assert _index_stderr(tmp_path, [], tty=False) == ""  # a log gets nothing by default
    logged = _index_stderr(tmp_path, ["--progress"], tty=False)
    assert "\r" not in logged and "index: 2/2 rank dirs [100%]" in logged
    assert _index_stderr(tmp_path, ["--quiet"], tty=True) == ""  # the old spelling of --no-progress
    bar = _index_stderr(tmp_path, [], tty=True)
    assert "\r" in bar and "index" in bar and "2/2" in bar  # tqdm's bar


def _progress_lines(err: str, desc: str) -> list:
    return [line for line in err.splitlines() if line.startswith(f"{desc}: ")]


def _synth_lake(tmp_path) -> str:
    sys.path.insert(0, os.path.join(HERE, "lake"))
    import lake_synth

    return lake_synth.make_lake(str(tmp_path / "lake"), runs=("run_a", "run_b"), steps=2, ranks=2)


def test_lake_index_reports_rank_dirs_as_tasks_finish(tmp_path):
    pytest.importorskip("pyarrow")
    pytest.importorskip("duckdb")
    root = _synth_lake(tmp_path)
    cmd = [sys.executable, "-m", "msprobe", "lake", "index", root, "--no-cluster", "--refresh", "all"]
    quiet = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == "" and "indexed 8" in quiet.stdout  # a log gets nothing by default
    r = subprocess.run(cmd + ["--progress"], capture_output=True, text=True, env=_env(), timeout=300)
    assert r.returncode == 0, r.stderr
    lines = _progress_lines(r.stderr, "lake index")
    # one task per step (4): a line as each finishes, not one at the end
    assert lines == [f"lake index: {n}/8 rank dirs [{100 * n // 8}%]" for n in (2, 4, 6, 8)], r.stderr
    assert "\r" not in r.stderr and "lake: indexing 8 rank dir(s) in 4 task(s)" in r.stderr


def test_lake_index_progress_on_a_dask_scheduler(tmp_path, capsys):
    pytest.importorskip("pyarrow")
    pytest.importorskip("duckdb")
    distributed = pytest.importorskip("distributed")
    root = _synth_lake(tmp_path)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as lc:
        assert main(["lake", "index", root, "--scheduler", lc.scheduler_address, "--progress"]) == 0
    out = capsys.readouterr()
    assert "indexed 8" in out.out and "(client," in out.out
    lines = _progress_lines(out.err, "lake index")
    counts = [int(line.split(": ", 1)[1].split("/", 1)[0]) for line in lines]
    assert counts == sorted(counts) and counts[-1] == 8 and len(counts) == 4, out.err  # as_completed, per task


def _online_packets(nfs: str, n_api: int) -> None:
    torch = pytest.importorskip("torch")
    from msprobe.dumpers.pytorch._encode import tensor_bytes
    from msprobe.online.packet import encode_packet
    from msprobe.online.transport import StoreSink

    def t(name, x):
        return {"type": "torch.Tensor", "dtype": str(x.dtype), "shape": list(x.shape), "requires_grad": False,
                "data_name": name}

    sink = StoreSink(nfs)
    a, b = torch.randn(4), torch.randn(4)
    for k in range(n_api):
        name = f"Torch.add.{k}.forward"
        rec = {"input_args": [t(f"{name}.input.0.pt", a), t(f"{name}.input.1.pt", b)], "input_kwargs": {},
               "output": [t(f"{name}.output.0.pt", a + b)]}
        hdr = {"kind": "api", "run": "r", "rank": 0, "step": 0, "seq": k, "name": name, "record": rec}
        sink.send(encode_packet(hdr, [(f"{name}.input.0.pt", tensor_bytes(a)), (f"{name}.input.1.pt", tensor_bytes(b)),
                                      (f"{name}.output.0.pt", tensor_bytes(a + b))]), hdr)
    hdr = {"kind": "close", "run": "r", "rank": 0, "step": 0, "seq": n_api}
    sink.send(encode_packet(hdr), hdr)


def test_online_checker_reports_packets_checked(tmp_path):
    pytest.importorskip("msprobe.run_ut")
    out = []
    for i, flag in enumerate(([], ["--progress"])):
        nfs = str(tmp_path / f"nfs{i}")
        _online_packets(nfs, 5)
        cmd = [sys.executable, "-m", "msprobe", "run_ut", "--online", "--nfs-path", nfs, "-o", str(tmp_path / f"o{i}"),
               "--idle-timeout", "60", *flag]
        r = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)
        assert r.returncode == 0, r.stderr
        assert "5 APIs checked from 6 packets" in r.stdout, r.stdout
        out.append(r.stderr)
    assert _progress_lines(out[0], "run_ut online") == []  # nothing by default in a log
    lines = _progress_lines(out[1], "run_ut online")
    assert lines[0] == "run_ut online: 1 packets (1 APIs checked)", out[1]
    assert lines[-1] == "run_ut online: 6 packets (5 APIs checked)" and len(lines) == 4, out[1]  # 1, 2, 5, end
    assert "\r" not in out[1]


def test_one_progress_flag_and_old_spellings():
    parser = build_parser()
    for argv, want in [
        (["index", "x"], None), (["index", "x", "--no-progress"], False), (["index", "x", "--quiet"], False),
        (["index", "x", "-q"], False), (["index", "x", "--progress"], True),
        (["compare", "a", "b"], None), (["compare", "a", "b", "--no-progress"], False),
        (["run_ut", "-api_info", "x"], None), (["run_ut", "-api_info", "x", "-q"], False),
        (["run_ut", "-api_info", "x", "--quiet"], False), (["run_ut", "-api_info", "x", "--no-progress"], False),
        (["run_ut", "--online"], None), (["run_ut", "--online", "--progress"], True),
        (["run_ut_online"], None), (["run_ut_online", "-q"], False), (["run_ut_online", "--progress"], True),
        (["lake", "index", "x"], None), (["lake", "index", "x", "--progress"], True),
        (["lake", "ls", "x", "--no-progress"], False),
    ]:
        assert parser.parse_args(argv).progress is want, argv


def test_output_option_and_device_spellings():
    parser = build_parser()
    cases = {
        "compare": (["compare", "a", "b"], "out"), "run_ut": (["run_ut", "-api_info", "x"], "out_path"),
        "index": (["index", "x"], "out"), "convert": (["convert", "x", "--to", "zarr"], "out"),
        "api_precision_compare": (["api_precision_compare", "-npu", "a", "-gpu", "b"], "out_path"),
        "lake diverge": (["lake", "diverge", "root", "a", "b"], "out"),
        "run_ut_online": (["run_ut_online"], "out_path"),
    }
    for name, (argv, dest) in cases.items():
        for flag in ("-o", "--output-path", "--out"):
            assert getattr(parser.parse_args(argv + [flag, "D"]), dest) == "D", (name, flag)
    # device ids are -d in run_ut; the device type is --device-type in both checkers (old -d kept online)
    assert parser.parse_args(["run_ut", "-api_info", "x", "-d", "0", "1"]).devices == [0, 1]
    assert parser.parse_args(["run_ut", "-api_info", "x", "--device-type", "cpu"]).device_type == "cpu"
    assert parser.parse_args(["run_ut_online", "--device-type", "cpu"]).device_type == "cpu"
    assert parser.parse_args(["run_ut_online", "-d", "cpu"]).device_type == "cpu"


# -- --json --------------------------------------------------------------------------------------

def test_validate_and_index_print_json(tmp_path, capsys):
    assert main(["validate", STATS, "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["ok"] is True and "valid" in rep["summary"] and isinstance(rep["problems"], list)
    pytest.importorskip("pyarrow")
    dump = tmp_path / "d"
    shutil.copytree(STATS, dump)
    assert main(["index", str(dump), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rank_dirs"] == 2 and all(f.endswith("records.parquet") for f in out["files"])


def test_run_ut_json_and_one_count_per_api(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    from msprobe.pytorch import PrecisionDebugger

    PrecisionDebugger._reset()
    dbg = PrecisionDebugger(task="statistics", level="L1", dump_path=str(tmp_path / "dump"))
    dbg.start()
    x = torch.randn(3, 8, requires_grad=True)
    (torch.nn.functional.linear(x, torch.randn(4, 8)).relu().sum()).backward()
    dbg.stop()
    dbg.step()
    dbg.dumper.close()
    PrecisionDebugger._reset()
    rank = str(tmp_path / "dump" / "step0" / "rank")
    assert main(["run_ut", "-api_info", rank, "-o", str(tmp_path / "out"), "-n", "0", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["checked"] >= 2 and sum(s["api_counts"].values()) == s["checked"]
    assert main(["run_ut", "-api_info", rank, "-o", str(tmp_path / "out2"), "-n", "0"]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    counted = sum(int(part.split()[-1]) for part in line.split("[", 1)[1].split(",")[:-1] if part.split())
    assert f"{s['checked']} APIs checked" in line and counted == s["checked"], line


# -- order and hints -----------------------------------------------------------------------------

def test_steps_sort_as_numbers(tmp_path):
    from msprobe.compare import compare
    from msprobe.errors import ConfigError

    a, b = tmp_path / "a", tmp_path / "b"
    for s in (0, 1, 2, 10, 11):
        shutil.copytree(os.path.join(STATS, "step0"), a / f"step{s}")
    shutil.copytree(os.path.join(STATS, "step0"), b / "step0")
    shutil.copytree(os.path.join(STATS, "step0"), b / "step3")
    with pytest.raises(ConfigError, match=r"target \[0, 1, 2, 10, 11\], bench \[0, 3\]"):
        compare(str(a), str(b), str(tmp_path / "o"), step=7, plot=False)


def test_show_names_its_options_when_a_record_is_ambiguous(capsys):
    assert main(["show", STATS, "Functional.linear.0.forward"]) == 1
    err = capsys.readouterr().err
    assert "pass --step N and/or --rank R" in err and "step=" not in err.split("pass")[-1]


def test_ls_on_a_lake_root_points_to_lake_ls(tmp_path, capsys):
    root = tmp_path / "lake"
    shutil.copytree(STATS, root / "run_a")
    shutil.copytree(os.path.join(MS26, "L1_statistics_perturbed"), root / "run_b")
    assert main(["ls", str(root)]) == 1
    err = capsys.readouterr().err
    assert "holds 2 dump(s) (run_a, run_b)" in err and f"msprobe lake ls {root}" in err


def test_lake_ls_says_when_its_catalog_is_stale(tmp_path, capsys):
    pytest.importorskip("duckdb")
    root = tmp_path / "lake"
    shutil.copytree(STATS, root / "run_a")
    assert main(["lake", "ls", str(root), "--no-cluster"]) == 0
    capsys.readouterr()
    assert main(["lake", "ls", str(root)]) == 0
    assert "from the saved catalog" in capsys.readouterr().err
    shutil.copytree(STATS, root / "run_b")
    assert main(["lake", "ls", str(root), "--no-cluster"]) == 0  # stale: the runs are read again, as lake sql does
    out = capsys.readouterr()
    assert "run_b" in out.out and "run_a" in out.out
    assert "catalog was stale (not in it: run_b): reading the runs again" in out.err
    assert main(["lake", "ls", str(root)]) == 0  # and saved: the next listing is the catalog again
    out = capsys.readouterr()
    assert "run_b" in out.out and "from the saved catalog" in out.err
