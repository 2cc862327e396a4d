"""The corpus of dumps of every era (tests/fixtures/eras, written by its generate.py from the layouts
the seeds' documentation describes): each entry read (ls), validated, compared with itself and viewed,
against the answers written down in tests/fixtures/eras/expected.json. A folder that is no dump gets
a typed one-line error from every command, never an empty success."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ERAS = ROOT / "tests" / "fixtures" / "eras"
EXPECTED = json.loads((ERAS / "expected.json").read_text())


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), MSPROBE_LAKE_CACHE=str(cwd / "_cache"))
    return subprocess.run([sys.executable, "-m", "msprobe", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def _json(r: subprocess.CompletedProcess):
    assert "Traceback" not in r.stderr, r.stderr
    return json.loads(r.stdout)


def test_the_corpus_is_what_generate_writes(tmp_path):
    subprocess.run([sys.executable, str(ERAS / "generate.py"), str(tmp_path)], check=True, timeout=120,
                   env=dict(os.environ, PYTHONPATH=str(ROOT)))
    made = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    kept = sorted(p.relative_to(ERAS) for p in ERAS.rglob("*") if p.is_file()
                  and p.name not in ("generate.py", "expected.json"))
    assert made == kept
    for rel in made:
        assert (tmp_path / rel).read_bytes() == (ERAS / rel).read_bytes(), rel


def test_every_entry_has_its_answer():
    entries = {p.name for p in ERAS.iterdir() if p.is_dir()} | {"not-a-dump-empty-folder"}
    assert entries == set(EXPECTED["dumps"]) | set(EXPECTED["not_dumps"])


@pytest.mark.parametrize("name", sorted(EXPECTED["dumps"]))
def test_a_dump_of_every_era_reads_validates_compares_and_views(name, tmp_path):
    want = EXPECTED["dumps"][name]
    path = str(ERAS / name)
    ls = _json(_cli("ls", path, "--json", cwd=tmp_path))
    got = {"dialect": ls["dialect"], "framework": ls["framework"], "framework_source": ls["framework_source"],
           "fragment": bool(ls["fragment"]), "records": sum(entry["records"] for entry in ls["rank_dirs"]),
           "rank_dirs": len(ls["rank_dirs"])}
    assert got == want["ls"], name
    r = _cli("validate", path, "--json", cwd=tmp_path)
    report = _json(r)
    assert report["ok"] == want["validate"]["ok"] and r.returncode == (0 if report["ok"] else 1), name
    for text in want["validate"].get("says", []):
        assert text in json.dumps(report), (name, text)
    r = _cli("compare", path, path, "-o", "cmp", "--no-plot", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "cmp" / "summary.json").read_text())
    rows = sum(pair["rows"] for pair in summary["pairs"])
    passed = sum(pair["results"].get("pass", 0) for pair in summary["pairs"])
    assert (rows, passed) == (want["compare"]["rows"], want["compare"]["rows"]), name
    assert (summary.get("masked_inf_target") or 0) == want["compare"].get("masked", 0), name
    pytest.importorskip("duckdb")
    from msprobe.view import open_view

    data = open_view(path, work_dir=str(tmp_path / "view"))
    try:
        cells = data.overview()["cells"]
        seen = {"cells": len(cells), "rows": sum(cell["rows"] for cell in cells),
                "nan_inf": sum(cell["nan_inf"] for cell in cells), "masked": sum(cell["masked"] for cell in cells)}
    finally:
        data.close()
    assert seen == want["view"], name


@pytest.mark.parametrize("name", sorted(EXPECTED["not_dumps"]))
def test_a_folder_that_is_no_dump_is_a_typed_error_in_every_command(name, tmp_path):
    want = EXPECTED["not_dumps"][name]
    folder = ERAS / name
    if name == "not-a-dump-empty-folder":  # git keeps no empty folder
        folder = tmp_path / name
        folder.mkdir()
    path = str(folder)
    commands = {"ls": ["ls", path], "show": ["show", path, "Functional.relu.0.forward"], "index": ["index", path],
                "validate": ["validate", path], "compare": ["compare", path, path, "-o", "cmp", "--no-plot"],
                "report": ["report", path, "-o", "r.html"], "run_ut": ["run_ut", "-api_info", path, "-o", "ut"],
                "convert": ["convert", path, "--to", "zarr", "-o", "z"], "recover": ["recover", path]}
    for what, cmd in commands.items():
        r = _cli(*cmd, cwd=tmp_path)
        assert r.returncode != 0, (name, what, r.stdout)
        assert "Traceback" not in r.stderr, (name, what, r.stderr)
        said = r.stdout + r.stderr
        assert want["says"] in said, (name, what, said[-600:])
    assert not (tmp_path / "r.html").exists()


# -- the real 1.x ---------------------------------------------------------------------------------------------------

_DUMP_1X = """
import json, sys
import torch, torch.nn as nn
from msprobe.pytorch import PrecisionDebugger
out = sys.argv[1]
cfg = {"task": "statistics", "dump_path": out, "rank": [], "step": [], "level": "mix",
       "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"}}
json.dump(cfg, open(out + ".json", "w"))
dbg = PrecisionDebugger(config_path=out + ".json")
torch.manual_seed(0)
fc = nn.Linear(4, 3)
for step in range(2):
    dbg.start(fc)
    mask = torch.zeros(3, 3).masked_fill(torch.ones(3, 3, dtype=torch.bool).triu(1), float("-inf"))
    (fc(torch.randn(2, 4)).softmax(-1) + mask[0].exp() + torch.arange(3).float()).sum().backward()
    dbg.stop()
    dbg.step()
"""


@pytest.mark.real_tool
def test_a_dump_of_the_real_1x_is_the_1x_dialect(real_tool_1, tmp_path):
    """mindstudio-probe 1.1.1 (2024) writes no 'framework' and no 'is_recompute': msprobe-1 (the vote said
    msprobe-26), framework inferred, integer statistics floats (the 8.x rule), read, validated, compared, viewed."""
    script = tmp_path / "dump1x.py"
    script.write_text(_DUMP_1X)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    work = tmp_path / "work"
    work.mkdir()
    r = subprocess.run([real_tool_1, str(script), str(tmp_path / "d")], cwd=work, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    ls = _json(_cli("ls", "d", "--json", cwd=tmp_path))
    assert (ls["dialect"], ls["framework"], ls["framework_source"]) == (
        "msprobe-1", "pytorch", "inferred from entry type torch.Tensor")
    assert ls["steps"] == [0, 1] and all(entry["records"] > 5 for entry in ls["rank_dirs"])
    assert _json(_cli("validate", "d", "--json", cwd=tmp_path))["ok"]
    doc = json.loads((tmp_path / "d" / "step0" / "rank" / "dump.json").read_text())
    assert "framework" not in doc and not any("is_recompute" in rec for rec in doc["data"].values())
    arange = doc["data"]["Torch.arange.0.forward"]["output"][0]
    assert isinstance(arange["Max"], float)  # what the msprobe-1 statistics rule says of an int64 tensor
    r = _cli("compare", "d", "d", "-o", "cmp", "--no-plot", cwd=tmp_path)
    assert r.returncode == 0 and "masked_fill" in r.stdout, r.stderr
    summary = json.loads((tmp_path / "cmp" / "summary.json").read_text())
    assert summary["target_dialect"] == "msprobe-1" and all(set(p["results"]) == {"pass"} for p in summary["pairs"])
    pytest.importorskip("duckdb")
    from msprobe.view import open_view

    data = open_view(str(tmp_path / "d"), work_dir=str(tmp_path / "view"))
    try:
        cells = data.overview()["cells"]
        assert len(cells) == 2 and all(c["nan_inf"] == 0 and c["masked"] > 0 for c in cells), cells
    finally:
        data.close()
