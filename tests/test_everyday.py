"""Everyday use (issue 31): nothing mixed or dropped without a word, mistakes caught early,
every answer explains itself. CLI behaviour is checked through the real command lines
(``msprobe.cli.main`` or a subprocess)."""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from msprobe.cli import build_parser, main
from tests.test_docs_examples import blocks

ROOT = Path(__file__).resolve().parent.parent
MS26 = ROOT / "tests" / "fixtures" / "real" / "ms26"
STATS = MS26 / "L1_statistics"  # a real 26.2.0 dump: step0 and step1, one proc dir each


def _train(dump_path: str, steps: int, *, config: dict = None, model_in_start: bool = True, **kw) -> list:
    """A tiny training loop under a fresh PrecisionDebugger; the warnings it gave."""
    import torch

    from msprobe.pytorch import PrecisionDebugger

    PrecisionDebugger._reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if config is not None:
            path = os.path.join(os.path.dirname(dump_path) or ".", "cfg.json")
            with open(path, "w") as fh:
                json.dump(dict(config, dump_path=dump_path), fh)
            dbg = PrecisionDebugger(config_path=path)
        else:
            dbg = PrecisionDebugger(dump_path=dump_path, **kw)
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        for _ in range(steps):
            dbg.start(m if model_in_start else None)
            m(torch.ones(2, 4)).sum().backward()
            dbg.stop()
            dbg.step()
        PrecisionDebugger._reset()
    return [str(w.message) for w in caught]


# -- runs mixed in silence ------------------------------------------------------------------------

def test_dumping_again_names_the_stale_steps_of_the_earlier_run(tmp_path):
    dp = str(tmp_path / "dp")
    first = subprocess.run(  # the earlier run: another process
        [sys.executable, "-W", "error::RuntimeWarning", "-c",
         "import sys; from tests.test_everyday import _train; "
         "assert not [w for w in _train(sys.argv[1], 3, task='statistics', level='L1') if 'earlier run' in w]", dp],
        capture_output=True, text=True, cwd=str(ROOT), env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300)
    assert first.returncode == 0, first.stderr
    said = [w for w in _train(dp, 1, task="statistics", level="L1") if "earlier run" in w]
    assert len(said) == 1, said
    assert "step(s) 1-2 of an earlier run in rank/ beside this run's step(s) 0" in said[0]
    assert "run_dir_policy 'clear'" in said[0]
    assert sorted(os.listdir(dp)) == ["step0", "step1", "step2"]  # default overwrite: kept, as msprobe does
    r = subprocess.run([sys.executable, "-m", "msprobe", "validate", dp], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert r.returncode == 0, r.stderr  # a warning, not an error: a resumed run writes so too
    assert re.search(r"rank/ was written by 2 processes: step\(s\) 0 by pid \d+; step\(s\) 1-2 by pid \d+", r.stdout)
    assert "1 warning(s)" in r.stdout


def test_run_dir_policy_clear_removes_the_earlier_run(tmp_path):
    dp = str(tmp_path / "dp")
    _train(dp, 3, task="statistics", level="L1")
    said = _train(dp, 1, task="statistics", level="L1", run_dir_policy="clear")
    assert not [w for w in said if "earlier run" in w]
    assert sorted(os.listdir(dp)) == ["step0"]
    assert main(["validate", dp, "--quiet"]) == 0


def test_run_dir_policy_refuse_and_valid_values(tmp_path):
    from msprobe.dumpers.config import load_config
    from msprobe.errors import ConfigError, StoragePermissionError

    with pytest.raises(ConfigError, match="overwrite.*clear.*refuse"):
        load_config(run_dir_policy="wipe")
    dp = str(tmp_path / "dp")
    _train(dp, 2, task="statistics", level="L1", run_dir_policy="refuse")
    with pytest.raises(StoragePermissionError, match="already holds a dump of another run"):
        _train(dp, 1, task="statistics", level="L1", run_dir_policy="refuse")


# -- config typos -----------------------------------------------------------------------------------

TYPO = {"task": "statistics", "levle": "mix", "steps": [1], "statistics": {"lsit": ["relu"]}}


def test_config_typo_warns_with_the_nearest_key(tmp_path):
    from msprobe.dumpers.config import load_config

    path = tmp_path / "c.json"
    path.write_text(json.dumps(TYPO))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_config(str(path))
    said = [str(w.message) for w in caught]
    assert "msprobe config: unknown key 'levle' ignored (did you mean 'level'?)" in said
    assert "msprobe config: unknown key 'steps' ignored (did you mean 'step'?)" in said
    assert "msprobe config: unknown key statistics.lsit ignored (did you mean 'list'?)" in said


def test_strict_config_refuses(tmp_path, monkeypatch):
    from msprobe.dumpers.config import load_config
    from msprobe.errors import ConfigError

    path = tmp_path / "c.json"
    path.write_text(json.dumps(dict(TYPO, strict_config=True)))
    with pytest.raises(ConfigError, match=r"unknown key 'levle' \(did you mean 'level'\?\)"):
        load_config(str(path))
    path.write_text(json.dumps(TYPO))
    monkeypatch.setenv("MSPROBE_STRICT_CONFIG", "1")
    with pytest.raises(ConfigError, match=r"unknown key 'steps' \(did you mean 'step'\?\)"):
        load_config(str(path))


def test_validate_config_command(tmp_path):
    bad, good = tmp_path / "bad.json", tmp_path / "good.json"
    bad.write_text(json.dumps(TYPO))
    good.write_text(json.dumps({"task": "statistics", "level": "mix", "step": [1, "3-4"], "dump_path": "./d"}))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "msprobe", "validate-config", str(bad)], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "unknown key 'levle' (did you mean 'level'?)" in r.stderr and "unknown key 'steps'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = subprocess.run([sys.executable, "-m", "msprobe", "validate-config", str(good)], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "valid; task statistics, level mix, step(s) 1,3,4" in r.stdout


# -- a debugger that records nothing --------------------------------------------------------------------

@pytest.mark.parametrize("config, model, expect", [
    ({"task": "statistics", "level": "L1", "statistics": {"list": ["lineer"]}}, True,
     "list ['lineer'] matched none of the 3 APIs/modules called (near: Functional.linear)"),
    ({"task": "statistics", "level": "mix", "statistics": {"scope": ["Module.x.X.forward.0", "Module.y.Y.forward.0"]}},
     True, "scope ['Module.x.X.forward.0', 'Module.y.Y.forward.0']: its start never ran"),
])
def test_a_step_that_records_nothing_names_the_filter(tmp_path, config, model, expect):
    said = [w for w in _train(str(tmp_path / "dp"), 2, config=config, model_in_start=model) if "recorded nothing" in w]
    assert len(said) == 1, said  # once, not each step
    assert said[0].startswith("msprobe: step 0 was dumped but recorded nothing: ") and expect in said[0], said[0]


def test_no_wrapped_call_is_said(tmp_path):
    import torch

    from msprobe.pytorch import PrecisionDebugger

    PrecisionDebugger._reset()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dp"), level="L1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dbg.start()
        torch.ones(3)  # a factory call, no wrapped API
        dbg.stop()
        dbg.step()
    PrecisionDebugger._reset()
    said = [str(w.message) for w in caught if "recorded nothing" in str(w.message)]
    assert said and "no call went through a wrapped API or a hooked module" in said[0]
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dp2"), level="L1")  # no step(): the process ends the step
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dbg.start()
        torch.ones(3)
        dbg.stop()
        PrecisionDebugger._reset()  # (what atexit does)
    assert [w for w in caught if "step 0 was dumped but recorded nothing" in str(w.message)]
    assert not [w for w in _train(str(tmp_path / "ok"), 1, task="statistics", level="L1") if "recorded nothing" in w]


# -- finding records --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def demo_dump(tmp_path_factory):
    d = tmp_path_factory.mktemp("demo")
    r = subprocess.run([sys.executable, "-m", "msprobe", "demo", "--steps", "2", "--dump-path", str(d / "demo_dump")],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300)
    assert r.returncode == 0, r.stderr
    return d / "demo_dump", r


def test_ls_records_and_show_globs(demo_dump, capsys):
    dump, _ = demo_dump
    assert main(["ls", str(dump), "--records", "--step", "0", "--match", "Module.head*"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["step0  rank  Module.head.Linear.forward.0", "step0  rank  Module.head.Linear.parameters_grad",
                     "step0  rank  Module.head.Linear.backward.0"]
    assert main(["show", str(dump), "Module.head*", "--step", "0"]) == 0
    out = capsys.readouterr().out
    assert out.count("\nModule.head.Linear.") == 2 and out.startswith("Module.head.Linear.forward.0\n")
    assert "(3 records match 'Module.head*')" in out
    assert main(["show", str(dump), "Module.head.Linear.forwrd.0", "--step", "0"]) == 1
    err = capsys.readouterr().err
    assert "no record 'Module.head.Linear.forwrd.0'" in err and "did you mean 'Module.head.Linear.forward.0'" in err
    assert main(["show", str(dump), "Module.haed*", "--step", "0"]) == 1
    assert "names near it: 'Module.head.Linear." in capsys.readouterr().err


def test_a_mistyped_option_is_named_with_its_command():
    r = subprocess.run([sys.executable, "-m", "msprobe", "compare", "a", "b", "--xslx"], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert r.returncode == 2
    assert "msprobe compare: error: unrecognized arguments: --xslx (did you mean --xlsx?)" in r.stderr
    assert r.stderr.startswith("usage: msprobe compare")
    with pytest.raises(SystemExit):
        main(["lake", "ls", "x", "--rebuidl"])


def test_every_subcommand_has_help_with_an_example(capsys):
    parser = build_parser()
    names = []
    for action in parser._subparsers._group_actions:
        for name, sp in action.choices.items():
            names.append(name)
            subs = [a for a in sp._actions if a.__class__.__name__ == "_SubParsersAction"]
            for sub in subs:
                names += [f"{name} {n}" for n in sub.choices]
    assert "validate-config" in names and "lake trend" in names
    for name in names:
        with pytest.raises(SystemExit):
            main([*name.split(), "--help"])
        out = capsys.readouterr().out
        assert "example:\n  msprobe " in out, name  # (EXAMPLES, or the subcommand's own epilog)


def test_lake_functions_have_docstrings_with_an_example():
    import inspect

    import msprobe.lake
    from msprobe.lake import _diverge, _questions

    public = [f.fget if isinstance(f, property) else f for n, f in inspect.getmembers(msprobe.lake.Lake)
              if not n.startswith("_")]
    assert len(public) >= 19
    for fn in [_questions.first_nan, _diverge.diverge, _questions.disagree, _questions.trend,
               msprobe.lake.open, msprobe.lake.read_catalog, *public]:
        assert fn.__doc__ and "Example" in fn.__doc__, fn.__qualname__


# -- answers that say where --------------------------------------------------------------------------------

def test_validate_on_a_killed_run_points_at_recover(tmp_path):
    dump = tmp_path / "killed"
    rank = dump / "step0" / "rank"
    (rank / ".journal").mkdir(parents=True)
    (rank / ".journal" / "records.jsonl").write_text("")
    r = subprocess.run([sys.executable, "-m", "msprobe", "validate", str(dump)], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert r.returncode == 1
    assert "missing dump.json" in r.stderr and f"msprobe recover {dump}" in r.stderr


def test_demo_says_rank_and_next_commands(demo_dump):
    _, r = demo_dump
    assert "ranks [None]" not in r.stdout and "DumpRecord(" not in r.stdout
    assert "ranks one process (no torch.distributed rank: rank directory 'rank')" in r.stdout
    nxt = r.stdout.split("next:\n", 1)[1].splitlines()
    assert re.match(r"\S*msprobe ls ", nxt[0].strip()) and any("msprobe show" in x for x in nxt), nxt
    cmd = nxt[0].split()[0]
    assert cmd == "msprobe" or os.path.isfile(cmd), cmd  # a command this installation runs


def test_compare_first_nan_names_the_step(tmp_path, capsys):
    import torch

    dp = str(tmp_path / "nan")
    from msprobe.pytorch import PrecisionDebugger

    PrecisionDebugger._reset()
    dbg = PrecisionDebugger(dump_path=dp, task="statistics", level="L1")
    for step in range(2):
        dbg.start()
        x = torch.ones(3) * (float("nan") if step == 1 else 1.0)
        torch.nn.functional.relu(x)
        dbg.stop()
        dbg.step()
    PrecisionDebugger._reset()
    assert main(["compare", dp, dp, "-o", str(tmp_path / "out"), "--no-plot"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("first NaN in target"))
    assert re.match(r"first NaN in target: \S+ \(step 1, rank\)", line), line


# -- the lake ------------------------------------------------------------------------------------------------

def test_lake_ls_writes_nothing_into_a_run_or_an_empty_folder(tmp_path, monkeypatch, capsys):
    pytest.importorskip("duckdb")
    monkeypatch.setenv("MSPROBE_LAKE_CACHE", str(tmp_path / "cache"))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["lake", "ls", str(empty), "--no-cluster"]) == 1
    err = capsys.readouterr().err
    assert "no runs" in err and os.listdir(empty) == []
    run = tmp_path / "run"
    shutil.copytree(STATS, run)
    before = sorted(os.listdir(run))
    assert main(["lake", "ls", str(run), "--no-cluster"]) == 0
    out = capsys.readouterr()
    assert sorted(os.listdir(run)) == before  # no _lake/ inside the dump
    assert "is only read (it is one run's dump" in out.err and "run" in out.out


def test_lake_disagree_on_one_rank_says_nothing_to_compare(tmp_path, capsys):
    pytest.importorskip("duckdb")
    root = tmp_path / "lake"
    shutil.copytree(STATS, root / "run_a")
    assert main(["lake", "disagree", str(root), "--no-cluster", "--kind", "all"]) == 0
    out = capsys.readouterr().out
    assert "nothing to compare" in out and "every rank agrees" not in out


def test_lake_diverge_speaks_compare_vocabulary(tmp_path):
    pytest.importorskip("duckdb")
    import torch

    import msprobe.lake

    root = tmp_path / "lake"
    for seed, run in ((1, "run_a"), (2, "run_b")):  # other initial weights: the runs diverge at once
        torch.manual_seed(seed)
        _train(str(root / run), 1, task="statistics", level="L1")
    with msprobe.lake.open(str(root), local=False) as lake:
        res = lake.diverge("run_a", "run_b")
    assert res["first_divergence"] is not None and res["first"] is res["first_divergence"]
    assert {"step", "rank_dir", "record"} <= set(res["first_divergence"])


# -- docs ------------------------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_everyday_doc_blocks_run(tmp_path):
    """docs/everyday.md's shell blocks, as written (``.venv/bin/`` is this interpreter's)."""
    pytest.importorskip("moto.server")
    pytest.importorskip("duckdb")
    bash = [b for lang, b in blocks(ROOT / "docs" / "everyday.md") if lang == "bash"]
    assert len(bash) == 3
    port = str(_free_port())
    script = "set -euo pipefail\n" + "\n".join(bash)
    script = script.replace(".venv/bin/msprobe", "@PY@ -m msprobe").replace(".venv/bin/python", "@PY@") \
        .replace("@PY@", sys.executable).replace("5555", port)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(PYTHONPATH=str(ROOT), MSPROBE_LAKE_CACHE=str(tmp_path / "cache"))
    r = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    out = r.stdout
    assert "refused" in out and "valid; task statistics, level mix, step(s) 1" in out
    assert "did you mean 'level'?" in r.stderr
    assert "step0  rank  Module.head.Linear.forward.0" in out
    assert "not found" in out and "usage error" in out
    assert "run_a" in out and "run_b" in out and "summary: s3://bucket/cmp/summary.json" in out
    assert "Traceback" not in r.stderr


# -- each warning once --------------------------------------------------------------------------------------------

def test_a_stale_index_and_a_lake_note_are_said_once(tmp_path):
    dump = tmp_path / "dump"
    shutil.copytree(STATS, dump)
    env = dict(os.environ, PYTHONPATH=str(ROOT), MSPROBE_LAKE_CACHE=str(tmp_path / "cache"))

    def msprobe(*args) -> subprocess.CompletedProcess:
        r = subprocess.run([sys.executable, "-m", "msprobe", *args], capture_output=True, text=True, env=env,
                           timeout=300)
        assert r.returncode == 0, r.stderr
        return r

    msprobe("index", str(dump))
    doc = next((dump / "step0").glob("*/dump.json"))
    doc.write_text(doc.read_text() + " ")  # the document changed since it was indexed
    assert msprobe("ls", str(dump)).stderr.count("stale Parquet index") == 1
    pytest.importorskip("duckdb")
    assert msprobe("lake", "ls", str(dump), "--no-cluster").stderr.count("is only read") == 1
