"""Every example of README.md and docs/*.md runs, as written, on dumps this package writes.

Each fenced block of those files is claimed by one handler below (an unclaimed block fails
``test_every_block_is_claimed``, so a new example needs a test). README's examples run in one
empty folder in order: the Python blocks (training under PrecisionDebugger, reading back), then
each command line of its bash blocks through ``python -m msprobe`` (``.venv/bin/msprobe`` in the
text). The only substitutions are what names a machine: the bucket ``s3://bucket`` is a real moto S3
server on 127.0.0.1 and ``tcp://host:8786`` a real Dask scheduler started here.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks(path: Path) -> list:
    """[(language, body)] of the fenced blocks of a Markdown file."""
    return [(m.group(1), m.group(2)) for m in _FENCE.finditer(path.read_text(encoding="utf-8"))]


def command_lines(body: str) -> list:
    """The shell commands of a block: continuation lines joined, comments dropped."""
    joined = body.replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in joined.splitlines() if shlex.split(line, comments=True)]


def _msprobe(args: list, cwd: Path, env: dict = None, timeout: float = 600) -> subprocess.CompletedProcess:
    e = dict(os.environ if env is None else env, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "msprobe", *args], cwd=str(cwd), capture_output=True, text=True,
                          env=e, timeout=timeout)


# -- which test runs each block ------------------------------------------------------------------

def _claim(name: str, lang: str, body: str) -> str:
    if name == "README.md":
        if body.startswith("bash scripts/demo.sh"):
            return "ci"  # .ci/run runs scripts/test.sh, which runs every test here; demo.sh: test_scripts_exist
        if "pip install 'msprobe-lake[torch]'" in body:
            return "install"  # tests/test_install.py: the wheel in a fresh venv, then msprobe demo
        if lang in ("python", "bash"):
            return "readme"
    if name == "run_ut.md":
        return "run_ut"
    if name == "online_run_ut.md":
        return "online"
    if name in ("reliability.md", "benchmarks.md"):
        return "commands"
    if name == "compare.md" and lang == "bash":
        return "compare_cli"  # test_compare_doc_commands_parse
    if name == "compare.md" and body.startswith("$ msprobe compare"):
        return "layout_transcript"  # tests/compare/test_compare_layouts.py::test_doc_transcripts_are_what_it_prints
    if name == "compare.md" and body.startswith("layout tp=2,pp=1,ep=2 (read from the dump) (step 1"):
        return "ep_tensor"  # tests/compare/test_layouts_megatron.py::test_tensor_mode_names_an_experts_nan_...
    if name == "everyday.md":
        return "everyday"  # tests/test_everyday.py::test_everyday_doc_blocks_run
    if name == "explorer.md" and body.startswith("error enters at: "):
        return "links"  # tests/view/test_view_links.py::test_compare_prints_the_link_of_a_running_view
    if name == "architecture.md":
        return "diagram"  # tests/test_architecture.py::test_data_path_names_real_code
    if name == "conformance.md" and "real-tool conformance" in body:
        return "output"  # the summary pytest prints at the end of every run (tests/conftest.py), not a command
    return ""


def test_every_block_is_claimed():
    unclaimed = [(p.name, body.splitlines()[0]) for p in DOCS for lang, body in blocks(p)
                 if not _claim(p.name, lang, body)]
    assert not unclaimed, f"examples without a test: {unclaimed}"


def test_scripts_exist():
    first = blocks(ROOT / "README.md")[0][1]
    assert [c[:2] for c in command_lines(first)] == [["bash", "scripts/demo.sh"], ["bash", "scripts/test.sh"]]
    assert (ROOT / "scripts" / "demo.sh").exists() and (ROOT / "scripts" / "test.sh").exists()
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


# -- README -------------------------------------------------------------------------------------

def _readme(kind: str) -> list:
    return [body for lang, body in blocks(ROOT / "README.md") if _claim("README.md", lang, body) == "readme"
            and lang == kind]


@pytest.fixture(scope="module")
def s3_lake_env(s3_server):
    """The bucket ``bucket`` and the options that reach it (the README's ``{"anon": false}`` plus the endpoint)."""
    import s3fs

    from tests.conftest_s3 import s3_storage_options

    opts = s3_storage_options(s3_server, picklable=True)
    fs = s3fs.S3FileSystem(**opts)
    if not fs.exists("bucket"):
        fs.mkdir("bucket")
    return fs, opts


def test_readme_examples_run(tmp_path, monkeypatch, s3_lake_env):
    pytest.importorskip("torch")
    pytest.importorskip("duckdb")
    pytest.importorskip("distributed")
    from distributed import LocalCluster

    from msprobe.pytorch import PrecisionDebugger

    monkeypatch.chdir(tmp_path)
    train, read = _readme("python")
    assert 'dump_path="./dump_path"' in train
    assert 'task="tensor"' in train
    for dump_path, task, seed in (("./dump_path", "tensor", "1234"), ("./lake/run_npu", "statistics", "1234"),
                                  ("./lake/run_gpu", "statistics", "4321")):
        PrecisionDebugger._reset()
        code = train.replace('"./dump_path"', f'"{dump_path}"').replace('"tensor"', f'"{task}"').replace("1234", seed)
        exec(compile(code, "README", "exec"), {})
    PrecisionDebugger._reset()
    ns: dict = {}
    exec(compile(read, "README", "exec"), ns)
    assert len(ns["df"]) > 0 and ns["rec"].input_args[0].load().shape == tuple(ns["rec"].input_args[0].shape)

    fs, opts = s3_lake_env
    fs.put(str(tmp_path / "lake" / "run_npu") + "/", "bucket/npu/", recursive=True)
    fs.put(str(tmp_path / "lake" / "run_gpu") + "/", "bucket/gpu/", recursive=True)
    lines = [c for body in _readme("bash") for c in command_lines(body)]
    assert all(c[0] == ".venv/bin/msprobe" for c in lines), lines
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True, host="127.0.0.1",
                      dashboard_address=":0") as cluster:
        for cmd in lines:
            args = [cluster.scheduler_address if a == "tcp://host:8786" else a for a in cmd[1:]]
            if "--storage-options" in args:
                i = args.index("--storage-options") + 1
                args[i] = json.dumps({**json.loads(args[i]), **opts})
            t0 = time.perf_counter()
            r = _msprobe(args, tmp_path)
            print(f"{time.perf_counter() - t0:6.1f}s {shlex.join(cmd)[:100]}")
            assert r.returncode == 0, (cmd, r.stdout[-2000:], r.stderr[-3000:])
            assert "Traceback" not in r.stderr, (cmd, r.stderr[-3000:])
    assert (tmp_path / "out" / "summary.json").exists()
    assert fs.exists("bucket/cmp/summary.json")
    assert (tmp_path / "norm.png").stat().st_size > 1000
    assert (tmp_path / "lake" / "_lake" / "catalog.json").exists()
    assert 'id="msprobe-data"' in (tmp_path / "report.html").read_text(encoding="utf-8")  # msprobe report


# -- docs/run_ut.md ------------------------------------------------------------------------------

def test_run_ut_doc_examples(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from msprobe.pytorch import PrecisionDebugger, seed_all

    monkeypatch.chdir(tmp_path)
    synopsis, snippet = [b for _, b in blocks(ROOT / "docs" / "run_ut.md")]
    # a small L1 tensor dump of one linear layer
    seed_all(0)
    PrecisionDebugger._reset()
    dbg = PrecisionDebugger(task="tensor", level="L1", dump_path=str(tmp_path / "dump"))
    lin = torch.nn.Linear(8, 4)
    dbg.start()
    lin(torch.randn(3, 8, requires_grad=True)).sum().backward()
    dbg.stop()
    dbg.step()
    dbg.dumper.close()
    PrecisionDebugger._reset()
    (tmp_path / "config.json").write_text(json.dumps({"task": "run_ut", "run_ut": {"white_list": ["linear"]}}))
    run_ut, apc = command_lines(synopsis)
    # the synopsis with its placeholders filled and its bracketed options given
    subst = {"DUMP": str(tmp_path / "dump" / "step0" / "rank"), "OUT": "out", "WORKERS": "1", "S": "60",
             "config.json": "config.json"}
    args = []
    for a in run_ut[1:]:
        a = a.strip("[]")
        if a in ("-save_error_data", "-f", "-csv_path", "RESULT_CSV", "-d", "DEVICE_ID", "...", "--preload",
                 "MODULE"):
            continue  # resume / device / preload options need an earlier run, a device, a module
        args.append(subst.get(a, a))
    r = _msprobe(args, tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    details = sorted((tmp_path / "out").glob("accuracy_checking_details_*.csv"))
    assert details
    apc_args = [{"NPU_DETAILS.csv": str(details[0]), "GPU_DETAILS.csv": str(details[0]), "OUT": "apc"}.get(
        a.strip("[]"), a.strip("[]")) for a in apc[1:]]
    r = _msprobe(apc_args, tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert any((tmp_path / "apc").iterdir())

    import msprobe.readers

    d = msprobe.readers.open(str(tmp_path / "dump"))
    a, b, g = torch.randn(3, 4, requires_grad=True), torch.randn(4, 5, requires_grad=True), torch.randn(3, 5)
    ns = {"record": d.record("Functional.linear.0.forward"), "bwd": d.record("Functional.linear.0.backward"),
          "a": a, "b": b, "g": g}
    exec(compile(snippet, "docs/run_ut.md", "exec"), ns)
    assert ns["res"] is not None and any((tmp_path / "out").iterdir())


# -- docs/online_run_ut.md ------------------------------------------------------------------------

def test_online_doc_examples_are_accepted(tmp_path):
    """The two config files load with the dumper's and the checker's own loaders, and each command
    line parses with the real CLI parser into the online checker (running it needs the peer)."""
    from msprobe.cli import build_parser
    from msprobe.dumpers.config import load_config
    from msprobe.run_ut.online import settings_from_config

    bl = blocks(ROOT / "docs" / "online_run_ut.md")
    dumper_cfg, checker_cfg = [json.loads(b) for lang, b in bl if lang == "json"]
    (tmp_path / "dump.json").write_text(json.dumps(dumper_cfg))
    cfg = load_config(str(tmp_path / "dump.json"))
    assert cfg.task == "tensor"
    (tmp_path / "checker.json").write_text(json.dumps(checker_cfg))
    settings_from_config(str(tmp_path / "checker.json"))
    parser = build_parser()
    (cmds,) = [b for lang, b in bl if lang == "bash"]
    for cmd in command_lines(cmds):
        args = parser.parse_args([a.replace("checker.json", str(tmp_path / "checker.json")) for a in cmd[1:]])
        assert callable(args.func), cmd


# -- docs/compare.md -------------------------------------------------------------------------------

def test_compare_doc_commands_parse():
    """Each command line of compare.md's bash blocks parses with the real CLI parser into compare."""
    from msprobe.cli import build_parser
    from msprobe.cli.compare import run as run_compare

    parser = build_parser()
    cmds = [c for lang, b in blocks(ROOT / "docs" / "compare.md") if lang == "bash" for c in command_lines(b)]
    assert len(cmds) >= 6
    for cmd in cmds:
        assert cmd[0] == "msprobe", cmd
        args = parser.parse_args(cmd[1:])
        assert args.func is run_compare, cmd


# -- docs/reliability.md, docs/benchmarks.md ---------------------------------------------------------

def test_documented_commands_name_what_exists():
    """These run the test suite's own files and the benchmarks: each path they name exists, each
    environment variable is read by the tests, each benchmark option is the script's."""
    for name in ("reliability.md", "benchmarks.md"):
        for _, body in blocks(ROOT / "docs" / name):
            for cmd in command_lines(body):
                for a in cmd:
                    if a.startswith(("tests/", "bench/")):
                        assert (ROOT / a).exists(), (name, a)
                    m = re.match(r"([A-Z_]+)=", a)
                    if m:
                        used = subprocess.run(["grep", "-rl", m.group(1), str(ROOT / "tests")], capture_output=True,
                                              text=True).stdout
                        assert used, (name, m.group(1))
                if "bench/bench_run_ut.py" in cmd:
                    script = (ROOT / "bench" / "bench_run_ut.py").read_text()
                    for opt in (a for a in cmd if a.startswith("--")):
                        assert f'"{opt}"' in script, (name, opt)
