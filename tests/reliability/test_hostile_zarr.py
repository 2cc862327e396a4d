"""Hostile Zarr tensor stores, built for real from a converted dump: a blosc bomb, shard index
entries far outside the shard, zero and non-integer layout fields, lying payloads, a shard that
is a symlink out of the dump. Only TensorLoadError/FormatError come out, before anything is
decompressed or allocated, and `convert --to classic` never copies data from outside the dump."""
from __future__ import annotations

import json
import os
import resource
import shutil

import numpy as np
import pytest

pytest.importorskip("numcodecs")
pytest.importorskip("torch")

import msprobe.readers
from msprobe.cli import main as cli_main
from msprobe.errors import FormatError, MsprobeError, TensorLoadError, UnsafePathError
from tests.reliability._bombs import blosc_bomb, read_shard, run_measured, write_shard

RANK = os.path.join("step0", "proc4242")
NAME = "Functional.linear.0.forward"
ZARR = os.path.join(RANK, "tensors.zarr")
SHARD = os.path.join(ZARR, "float32", "c", "0")
CPS = 512  # float32: 33554432-element shards of 65536-element chunks


def _zarr_dump(root):
    from msprobe.convert import convert
    from tests.readers.readers_synth import torch_dump

    torch_dump(root)
    convert(root, "zarr")


@pytest.fixture(scope="module")
def zarr_pristine(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("zarr") / "dump")
    _zarr_dump(root)
    m = _manifest(root)
    assert m["arrays"]["float32"]["shard_elements"] // m["arrays"]["float32"]["chunk_elements"] == CPS
    return root


def _manifest(root):
    with open(os.path.join(root, ZARR, "zarr.json")) as f:
        return json.load(f)["attributes"]["msprobe_lake"]


def _edit_manifest(root, fn):
    p = os.path.join(root, ZARR, "zarr.json")
    with open(p) as f:
        group = json.load(f)
    fn(group["attributes"]["msprobe_lake"])
    with open(p, "w") as f:
        json.dump(group, f)


def _set_index_row(root, row):
    path = os.path.join(root, SHARD)
    chunks, rows = read_shard(path, CPS)
    rows[0] = row
    write_shard(path, chunks, rows)


# -- the hostile stores ------------------------------------------------------------------------
def index_offset_2_40(root):
    _set_index_row(root, (1 << 40, 1 << 40))


def index_length_2_62(root):
    _set_index_row(root, (0, 1 << 62))


def index_wraps_2_64(root):
    _set_index_row(root, ((1 << 64) - 16, 64))


def manifest_shard_size_2_64(root):
    _edit_manifest(root, lambda m: m["arrays"]["float32"]["shards"].__setitem__("0", (1 << 64) - 1))


def chunk_elements_zero(root):
    _edit_manifest(root, lambda m: m["arrays"]["float32"].__setitem__("chunk_elements", 0))


def chunk_elements_zero_in_array_json(root):
    """The manifest has no layout for the array, so the array's zarr.json is read: it says 0."""
    _edit_manifest(root, lambda m: [m["arrays"]["float32"].pop(k) for k in ("shard_elements", "chunk_elements")])
    p = os.path.join(root, ZARR, "float32", "zarr.json")
    with open(p) as f:
        meta = json.load(f)
    meta["codecs"][0]["configuration"]["chunk_shape"] = [0]
    with open(p, "w") as f:
        json.dump(meta, f)


def chunk_elements_float(root):
    _edit_manifest(root, lambda m: m["arrays"]["float32"].__setitem__("chunk_elements", 65536.5))


def shard_size_string(root):
    _edit_manifest(root, lambda m: m["arrays"]["float32"]["shards"].__setitem__("0", "8856"))


def payload_start_nan(root):
    _edit_manifest(root, lambda m: m["payloads"][0].__setitem__(1, float("nan")))


def payload_count_lies(root):
    _edit_manifest(root, lambda m: m["payloads"][0].__setitem__(2, 1 << 60))


def tensor_shape_infinity(root):
    _edit_manifest(root, lambda m: m["tensors"][f"{NAME}.input.0.pt"][1].__setitem__(0, float("inf")))


def tensor_shape_2_63(root):
    _edit_manifest(root, lambda m: m["tensors"].__setitem__(f"{NAME}.input.0.pt", [0, [1 << 63, 2]]))


def manifest_tensors_a_list(root):
    _edit_manifest(root, lambda m: m.__setitem__("tensors", [1, 2]))


def chunk_not_blosc(root):
    path = os.path.join(root, SHARD)
    chunks, rows = read_shard(path, CPS)
    chunks[0] = b"\x00" * len(chunks[0])
    write_shard(path, chunks)


CASES = [index_offset_2_40, index_length_2_62, index_wraps_2_64, manifest_shard_size_2_64, chunk_elements_zero,
         chunk_elements_zero_in_array_json, chunk_elements_float, shard_size_string, payload_start_nan,
         payload_count_lies, tensor_shape_infinity, tensor_shape_2_63, manifest_tensors_a_list, chunk_not_blosc]


def _bounded(fn):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        out = fn()
    except MsprobeError as exc:
        out = exc
    return out, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_corrupt_store_is_a_typed_error(zarr_pristine, tmp_path, case, capsys):
    root = str(tmp_path / "dump")
    shutil.copytree(zarr_pristine, root)
    case(root)
    out, grown = _bounded(lambda: msprobe.readers.open(root).record(NAME, step=0).input_args[0].load())
    assert isinstance(out, (TensorLoadError, FormatError)), f"{case.__name__}: {out!r}"
    assert grown < 64, grown
    assert len(str(out).splitlines()) == 1
    for argv in (["validate", root], ["show", root, NAME, "--step", "0"], ["ls", root]):
        rc, grown = _bounded(lambda: cli_main(argv))
        assert not isinstance(rc, MsprobeError) and grown < 64, (argv, rc, grown)
    assert "Traceback" not in capsys.readouterr().err


def test_blosc_bomb_refused_before_decompressing(zarr_pristine, tmp_path, figures):
    root = str(tmp_path / "dump")
    shutil.copytree(zarr_pristine, root)
    path = os.path.join(root, SHARD)
    chunks, _ = read_shard(path, CPS)
    bomb = blosc_bomb(1 << 30)
    assert len(bomb) < 64 << 10
    chunks[0] = bomb
    write_shard(path, chunks)
    _edit_manifest(root, lambda m: m["arrays"]["float32"]["shards"].__setitem__("0", os.path.getsize(path)))
    body = ("import torch, msprobe.readers\n"
            "    from msprobe.errors import MsprobeError\n"
            f"    rec = msprobe.readers.open({root!r}).record({NAME!r}, step=0)\n"
            "    try:\n"
            "        rec.input_args[0].load()\n"
            "        print('LOADED')\n"
            "    except MsprobeError as exc:\n"
            "        print('REFUSED', type(exc).__name__, exc)")
    rc, out, err, grown = run_measured(body)
    assert rc == 0, err[-3000:]
    assert "REFUSED FormatError" in out and "before decompressing" in out, out
    assert grown < 64, grown
    figures.setdefault("bomb_peak_mib", {})["zarr_blosc_bomb/reader"] = grown.figure()


def _outside_store(tmp_path):
    """A second, complete Zarr dump outside the first whose float32 shard holds 7.0 everywhere."""
    other = str(tmp_path / "outside")
    _zarr_dump(other)
    o_chunks, _ = read_shard(os.path.join(other, SHARD), CPS)
    from numcodecs import Blosc

    sevens = bytes(Blosc(cname="zstd", clevel=1, shuffle=Blosc.BITSHUFFLE).encode(np.full(65536, 7.0, np.float32)))
    write_shard(os.path.join(other, SHARD), [sevens] + [None] * (CPS - 1))
    return os.path.join(other, SHARD)


def test_symlinked_shard_out_of_the_dump_is_refused(zarr_pristine, tmp_path):
    root = str(tmp_path / "dump")
    shutil.copytree(zarr_pristine, root)
    outside = _outside_store(tmp_path)
    os.unlink(os.path.join(root, SHARD))
    os.symlink(outside, os.path.join(root, SHARD))

    def consistent(m):  # the manifest agrees with the outside shard, so only the symlink check stops it
        m["arrays"]["float32"]["shards"]["0"] = os.path.getsize(outside)
        for p in m["payloads"]:
            p[3] = None

    _edit_manifest(root, consistent)
    with pytest.raises(MsprobeError) as ei:
        msprobe.readers.open(root).record(NAME, step=0).input_args[0].load()
    assert isinstance(ei.value, (UnsafePathError, TensorLoadError)), repr(ei.value)
    assert "outside" in str(ei.value)
    out = str(tmp_path / "classic")
    rc = cli_main(["convert", root, "--to", "classic", "--out", out])
    assert rc == 1
    copied = []
    for dp, _, files in os.walk(out):
        for f in files:
            if f.endswith(".pt"):
                import torch

                t = torch.load(os.path.join(dp, f), weights_only=True)
                copied.append(f)
                assert not (t.numel() and bool((t == 7.0).all())), f"{f}: data from outside the dump"
    # in place: refused too, and the dump keeps its (symlinked) store untouched
    assert cli_main(["convert", root, "--to", "classic"]) == 1
    assert os.path.islink(os.path.join(root, SHARD))
