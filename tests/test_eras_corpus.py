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
                "report": ["report", path, "-o", "r.html"], "run_ut": ["run_ut", "-api_info", path, "-o", "ut"]}
    for what, cmd in commands.items():
        r = _cli(*cmd, cwd=tmp_path)
        assert r.returncode != 0, (name, what, r.stdout)
        assert "Traceback" not in r.stderr, (name, what, r.stderr)
        said = r.stdout + r.stderr
        assert want["says"] in said, (name, what, said[-600:])
    assert not (tmp_path / "r.html").exists()
