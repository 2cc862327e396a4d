"""validate loads the payloads (by default for small dumps, always with --tensors): tensor files
that cannot be loaded fail it; names with terminal escape codes are printed escaped by validate
and show."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from msprobe.cli import main as cli_main  # noqa: E402
from tests.readers.readers_synth import torch_dump  # noqa: E402
from tests.reliability._bombs import CPS_FLOAT32, read_shard, write_shard  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RANK = os.path.join("step0", "proc4242")
NAME = "Functional.linear.0.forward"
PT = os.path.join(RANK, "dump_tensor_data", f"{NAME}.input.0.pt")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("val") / "dump")
    torch_dump(root)
    return root


@pytest.fixture(scope="module")
def pristine_zarr(tmp_path_factory):
    from msprobe.convert import convert

    root = str(tmp_path_factory.mktemp("valz") / "dump")
    torch_dump(root)
    convert(root, "zarr")
    return root


def _edit(root, fn):
    p = os.path.join(root, RANK, "dump.json")
    with open(p) as f:
        doc = json.load(f)
    fn(doc)
    with open(p, "w") as f:
        json.dump(doc, f)


def _validate(root, *flags):
    p = subprocess.run([sys.executable, "-m", "msprobe", "validate", root, *flags], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    return p.returncode, p.stdout + p.stderr


def symlinked_pt(root, tmp):
    outside = os.path.join(tmp, "outside.pt")
    torch.save(torch.zeros(3, 4), outside)
    os.unlink(os.path.join(root, PT))
    os.symlink(outside, os.path.join(root, PT))


def truncated_pt(root, tmp):
    p = os.path.join(root, PT)
    with open(p, "rb") as f:
        data = f.read()
    with open(p, "wb") as f:
        f.write(data[: len(data) // 2])


def shape_mismatch(root, tmp):
    _edit(root, lambda d: d["data"][NAME]["input_args"][0].__setitem__("shape", [3, 5]))


def dtype_mismatch(root, tmp):
    torch.save(torch.zeros(3, 4, dtype=torch.float64), os.path.join(root, PT))


def pt_holds_a_dict(root, tmp):
    torch.save({"a": torch.zeros(3, 4)}, os.path.join(root, PT))


CLASSIC = [symlinked_pt, truncated_pt, shape_mismatch, dtype_mismatch, pt_holds_a_dict]


@pytest.mark.parametrize("case", CLASSIC, ids=[c.__name__ for c in CLASSIC])
def test_unloadable_tensor_files_fail_validate(pristine, tmp_path, case):
    root = str(tmp_path / "dump")
    shutil.copytree(pristine, root)
    assert _validate(root)[0] == 0
    case(root, str(tmp_path))
    rc, out = _validate(root)
    assert rc == 1 and "input_args.0" in out, out
    assert _validate(root, "--no-tensors")[0] == 0  # names only: the old check


def _zarr_index_outside(root):
    path = os.path.join(root, RANK, "tensors.zarr", "float32", "c", "0")
    chunks, rows = read_shard(path, CPS_FLOAT32)
    rows[0] = (1 << 40, rows[0][1])
    write_shard(path, chunks, rows)


def _zarr_index_crc(root):
    path = os.path.join(root, RANK, "tensors.zarr", "float32", "c", "0")
    with open(path, "r+b") as f:
        f.seek(-4, os.SEEK_END)
        crc = f.read(4)
        f.seek(-4, os.SEEK_END)
        f.write(bytes(b ^ 0x5A for b in crc))


@pytest.mark.parametrize("case", [_zarr_index_outside, _zarr_index_crc], ids=["entry-outside", "crc"])
def test_corrupt_zarr_index_fails_validate(pristine_zarr, tmp_path, case):
    root = str(tmp_path / "dump")
    shutil.copytree(pristine_zarr, root)
    rc, out = _validate(root)
    assert rc == 0 and "tensor(s) loaded" in out, out
    case(root)
    rc, out = _validate(root)
    assert rc == 1 and "shard" in out, out


def test_large_declared_dump_loads_only_with_tensors(pristine, tmp_path):
    """Records declaring more than 256 MiB: names only by default (said in the summary), every payload
    with --tensors (here the file is far smaller than its record: an error)."""
    root = str(tmp_path / "dump")
    shutil.copytree(pristine, root)
    _edit(root, lambda d: d["data"][NAME]["input_args"][0].__setitem__("shape", [1 << 27]))
    rc, out = _validate(root)
    assert rc == 0 and "not loaded" in out, out
    rc, out = _validate(root, "--tensors")
    assert rc == 1 and "input_args.0" in out, out


def test_escape_codes_in_names_are_printed_escaped(pristine, tmp_path, capsys):
    root = str(tmp_path / "dump")
    shutil.copytree(pristine, root)
    evil = "Functional.li\x1b[2J\x1b]0;pwned\x07near\r.0.forward"

    def add(doc):
        rec = json.loads(json.dumps(doc["data"][NAME]))
        rec["input_args"][0]["data_name"] = "missing\x1b[31m.pt"
        doc["data"][evil] = rec

    _edit(root, add)
    assert cli_main(["validate", root]) == 1
    cli_main(["show", root, evil])
    out = capsys.readouterr()
    text = out.out + out.err
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text, repr(text)
    assert "\\x1b[2J" in text and "missing\\x1b[31m.pt" in text


def test_every_command_prints_names_escaped(pristine, tmp_path, capsys):
    """compare prints record names too: stdout of every subcommand is escaped, and so is the error line."""
    root = str(tmp_path / "dump")
    shutil.copytree(pristine, root)
    evil = "Torch.a\x1b[2Jdd.0.forward"

    def add(doc):
        doc["data"][evil] = json.loads(json.dumps(doc["data"]["Torch.sum.0.forward"]))
        for t in doc["data"][evil]["input_args"] + doc["data"][evil]["output"]:
            t.pop("data_name", None)

    _edit(root, add)
    other = str(tmp_path / "other")
    shutil.copytree(root, other)
    _edit(other, lambda d: d["data"][evil]["output"][0].__setitem__("Max", 1e9))
    cli_main(["compare", root, other, "-o", str(tmp_path / "cmp"), "--no-plot", "--no-progress", "--mode",
              "statistics"])
    cli_main(["show", root, evil, "--step", "0"])
    cli_main(["show", root, "No\x1b[2J.such.0.forward", "--step", "0"])  # the error line names it
    out = capsys.readouterr()
    assert "\x1b" not in out.out + out.err, repr(out.out + out.err)
    assert "\\x1b[2J" in out.out and "\\x1b[2J" in out.err


def test_a_newline_in_a_name_cannot_fake_a_line(pristine, tmp_path, capsys):
    """Text views print one line per field: a raw newline in a name is escaped, never a new line
    (show, ls, compare); show --json stays JSON."""
    root = str(tmp_path / "dump")
    shutil.copytree(pristine, root)
    evil = "Torch.cat.0.forward\nfirst divergence: none\nTorch.x.0.forward"

    def add(doc):
        doc["data"][evil] = json.loads(json.dumps(doc["data"]["Torch.cat.0.forward"]))
        rec = doc["data"][evil]
        flat = [t for a in rec["input_args"] + rec["output"] for t in (a if isinstance(a, list) else [a])]
        for t in flat:
            if isinstance(t, dict):
                t.pop("data_name", None)
        flat[0]["dtype"] = "torch.float32\nkind forged"

    _edit(root, add)
    other = str(tmp_path / "other")
    shutil.copytree(root, other)
    _edit(other, lambda d: d["data"][evil]["output"][0].__setitem__("Norm", 1e9))  # (the rules judge Norm)
    capsys.readouterr()
    cli_main(["show", root, evil, "--step", "0"])
    out = capsys.readouterr().out
    assert "\nfirst divergence: none" not in out and "\nkind forged" not in out, out
    assert "\\nfirst divergence: none" in out and "\\nkind forged" in out, out
    cli_main(["show", root, evil, "--step", "0", "--json"])
    assert evil in json.loads(capsys.readouterr().out)
    cli_main(["compare", root, other, "-o", str(tmp_path / "cmp"), "--no-plot", "--no-progress", "--mode",
              "statistics"])
    out = capsys.readouterr().out
    firsts = [ln for ln in out.splitlines() if ln.startswith("first divergence")]
    assert len(firsts) == 1 and "\\nfirst divergence: none" in firsts[0], out  # the forged line stays inside
