"""Issue 22: one reader of JSON configuration files (config.json for the dumpers and run_ut,
the 8.x compare.json) and one shape of bad-value error, so each bad file is the same clear
one-line ConfigError whoever reads it."""
from __future__ import annotations

import ast
import os
import pathlib

import pytest

import msprobe
from msprobe.cli.compare import read_compare_json
from msprobe.dumpers.config import read_config_json
from msprobe.errors import MAX_CONFIG_BYTES, ConfigError, invalid_value
from msprobe.online.config import parse_online
from msprobe.run_ut.runner import load_run_ut_config

READERS = {"config_path": read_config_json, "-config": load_run_ut_config, "-i": read_compare_json}


def _files(tmp_path: pathlib.Path) -> dict:
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "bad.json").write_text("{\"task\": ")
    (tmp_path / "latin1.json").write_bytes(b'{"dump_path": "caf\xe9"}')
    (tmp_path / "adir.json").mkdir()
    with open(tmp_path / "huge.json", "wb") as f:
        f.truncate(MAX_CONFIG_BYTES + 1)  # sparse: nothing of it is read
    return {"missing": (tmp_path / "nope.json", "no such file"), "directory": (tmp_path / "adir.json", "directory"),
            "not JSON": (tmp_path / "bad.json", "not valid JSON"), "not UTF-8": (tmp_path / "latin1.json", "JSON"),
            "a list": (tmp_path / "list.json", "JSON object, not list"),
            "too large": (tmp_path / "huge.json", "larger than")}


@pytest.mark.parametrize("flag", sorted(READERS))
def test_every_reader_refuses_bad_files_alike(tmp_path, flag):
    for case, (path, said) in _files(tmp_path).items():
        with pytest.raises(ConfigError) as ei:
            READERS[flag](str(path))
        msg = str(ei.value)
        assert msg.startswith(f"{flag} {str(path)!r}: ") and said in msg, (case, msg)
        assert "\n" not in msg, (case, msg)


def test_every_reader_reads_an_object(tmp_path):
    p = tmp_path / "c.json"
    p.write_text('{"task": "statistics", "npu_path": "a", "bench_path": "b", "run_ut": {"white_list": ["conv2d"]}}')
    assert read_config_json(str(p))["task"] == "statistics"
    assert list(load_run_ut_config(str(p))["white_list"]) == ["conv2d"]
    assert read_compare_json(str(p))["npu_path"] == "a"


def test_one_bad_value_error():
    """Every config section raises the same shape for a bad value (the dumpers' and the online
    settings' ``_fail`` were two copies)."""
    with pytest.raises(ConfigError, match=r"^invalid config value port='x'; valid: "):
        parse_online({"online_run_ut": True, "host": "127.0.0.1", "port": "x"}, side="training")
    assert str(invalid_value("k", 1, "2")) == "invalid config value k=1; valid: 2"
    pkg = pathlib.Path(msprobe.__file__).parent
    spelled = []
    for path in sorted(pkg.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "invalid config value" in node.value:
                spelled.append(os.path.relpath(path, pkg))
    assert spelled == ["errors.py"], spelled
