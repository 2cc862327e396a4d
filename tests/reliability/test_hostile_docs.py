"""Hostile documents and journals: deep nesting past the cheap pre-check, shapes that are NaN,
infinite or beyond int64, a crash-journal line nested 100 000 deep. Every command answers with
a typed one-line error (never a traceback), and recover never publishes documents that
validate rejects."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("torch")

import msprobe.readers
from msprobe.cli import main as cli_main
from msprobe.errors import MsprobeError
from tests.readers.readers_synth import torch_dump

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RANK = os.path.join("step0", "proc4242")
NAME = "Functional.linear.0.forward"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("docs") / "dump")
    torch_dump(root)
    return root


def _copy(pristine, tmp_path):
    root = str(tmp_path / "dump")
    shutil.copytree(pristine, root)
    return root, os.path.join(root, RANK, "dump.json")


def _cli(argv):
    """In process: only MsprobeError may be raised inside (main() turns it into exit 1)."""
    return cli_main(argv)


def test_deep_nesting_in_a_large_dump_json(pristine, tmp_path):
    root, path = _copy(pristine, tmp_path)
    with open(path) as f:
        doc = json.load(f)
    deep = {"type": "int", "value": 1}
    for _ in range(900):
        deep = [deep]
    rec = doc["data"][NAME]
    rec["input_kwargs"]["pad"] = {"type": "str", "value": "x" * (1 << 20)}  # past the 1 MiB pre-check
    rec["input_args"].append(deep)
    with open(path, "w") as f:
        json.dump(doc, f)
    assert os.path.getsize(path) > 1 << 20
    env = dict(os.environ, PYTHONPATH=ROOT)
    for argv in (["validate", root], ["show", root, NAME], ["ls", root]):
        p = subprocess.run([sys.executable, "-m", "msprobe", *argv], capture_output=True, text=True, env=env,
                           timeout=120)
        assert "Traceback" not in p.stderr, (argv, p.stderr[-2000:])
        if argv[0] != "ls":
            assert p.returncode == 1 and "nested deeper than" in p.stderr, (argv, p.stderr)
            assert len(p.stderr.strip().splitlines()) == 1
    with pytest.raises(MsprobeError, match="nested deeper"):
        list(msprobe.readers.open(root).record(NAME).args())


@pytest.mark.parametrize("dim", ["NaN", "Infinity", str(1 << 63)], ids=["nan", "inf", "2^63"])
def test_absurd_shapes_are_typed_errors(pristine, tmp_path, dim, capsys):
    root, path = _copy(pristine, tmp_path)
    with open(path) as f:
        text = f.read()
    doc = json.loads(text)
    doc["data"][NAME]["input_args"][0]["shape"] = "@SHAPE@"
    with open(path, "w") as f:
        f.write(json.dumps(doc).replace('"@SHAPE@"', f"[{dim}, 12]" if dim != str(1 << 63) else f"[{dim}, 2]"))
    with pytest.raises(MsprobeError, match="shape"):
        msprobe.readers.open(root).record(NAME).input_args[0].load()
    assert _cli(["validate", root, "--quiet"]) == 1  # validate rejects all three
    assert _cli(["convert", root, "--to", "zarr", "--out", str(tmp_path / "z")]) == 1
    assert _cli(["index", root]) == 0  # the shape is indexed as null, the rest of the rank is indexed
    t = msprobe.readers.open(root, engine="index").to_pandas()
    row = t[(t["record"] == NAME) & (t["arg_path"] == "input_args.0")]
    assert row["numel"].isna().all() and row["shape"].isna().all()
    assert _cli(["lake", "nan", root]) in (0, 1)
    err = capsys.readouterr().err
    assert "Traceback" not in err


def _journal(root, lines):
    from msprobe.backends import LocalStore

    store = LocalStore(root)
    j = store.journal("step0/rank0/.journal")
    for line in lines:
        j.append(line)
    j.close()


def _entry(name, **kw):
    t = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [5, 12], "Max": 1.0, "Min": 0.0, "Mean": 0.5,
         "Norm": 1.0, "requires_grad": False}
    t.update(kw)
    return {"name": name, "record": {"input_args": [t], "input_kwargs": {}, "output": [t]}}


def test_hostile_journal_lines(tmp_path, capsys):
    root = str(tmp_path / "dump")
    good = json.dumps(_entry("Functional.relu.0.forward"))
    deep = '{"name": "Functional.relu.1.forward", "record": ' + "[" * 100_000 + "]" * 100_000 + "}"
    lines = [good, deep,
             json.dumps(_entry("Functional.relu.2.forward", shape=[float("nan"), 12])),
             json.dumps(_entry("Functional.relu.3.forward", shape=[1 << 63, 2])),
             json.dumps({"name": 5, "record": {}}),
             json.dumps({"name": "Functional.relu.4.forward", "record": "text"}),
             json.dumps(dict(_entry("Functional.relu.5.forward"), parent=[1])),
             json.dumps(dict(_entry("Functional.relu.6.forward"), stack="not frames")),
             json.dumps(_entry("Functional.re\x1b[2Jlu.7.forward"))]  # valid, printed escaped
    _journal(root, lines)
    assert _cli(["ls", root]) in (0, 1)  # the live dump, read through its journal
    assert _cli(["recover", root]) == 0
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    assert "malformed record(s) dropped" in out.out and "\x1b" not in out.out, out.out
    assert _cli(["validate", root]) == 0, capsys.readouterr()
    names = [r.name for r in msprobe.readers.open(root).records()]
    assert names == ["Functional.relu.0.forward", "Functional.re\x1b[2Jlu.7.forward"], names
