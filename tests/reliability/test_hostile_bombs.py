"""Decompression bombs and size lies in dumped tensors, built for real: every entry point that
loads tensors (readers, compare, run_ut, convert) refuses them with a typed error before inflating,
and its peak memory stays bounded (measured in a fresh interpreter, after torch is imported)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.reliability._bombs import cli_measured, run_measured, write_pt_bomb  # noqa: E402

NAME = "Functional.relu.0.forward"
SHAPE = (256, 1024)  # 1 MiB of float32 declared: a 1 GiB storage is far past its limit
#: peak RSS growth allowed for refusing a bomb (the bombs inflate to 1 GiB)
BOUND_MIB = 200


def _entry(data_name):
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": list(SHAPE), "Max": 0.0, "Min": 0.0,
            "Mean": 0.0, "Norm": 0.0, "requires_grad": False, "data_name": data_name}


def _pt_bomb_dump(root):
    rank = os.path.join(root, "step0", "rank0")
    os.makedirs(os.path.join(rank, "dump_tensor_data"))
    doc = {"task": "tensor", "level": "L1", "framework": "pytorch",
           "dump_data_dir": os.path.join(rank, "dump_tensor_data"),
           "data": {NAME: {"input_args": [_entry(f"{NAME}.input.0.pt")], "input_kwargs": {},
                           "output": [_entry(f"{NAME}.output.0.pt")]}}}
    with open(os.path.join(rank, "dump.json"), "w") as f:
        json.dump(doc, f)
    size = 0
    for io_ in ("input", "output"):
        size = write_pt_bomb(os.path.join(rank, "dump_tensor_data", f"{NAME}.{io_}.0.pt"), SHAPE, 1 << 30)
    return rank, size


@pytest.fixture(scope="module")
def pt_bomb(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ptbomb") / "dump")
    rank, size = _pt_bomb_dump(root)
    return root, rank, size


def test_pt_bomb_is_real(pt_bomb):
    """The file is a genuine bomb: plain torch.load inflates it to 1 GiB (checked in a child)."""
    root, rank, size = pt_bomb
    assert size < 2 << 20
    path = os.path.join(rank, "dump_tensor_data", f"{NAME}.input.0.pt")
    rc, out, err, grown = run_measured(f"import torch; t = torch.load({path!r}, weights_only=True); "
                                       "print('NBYTES', t.untyped_storage().nbytes())")
    assert rc == 0, err
    # the child's peak RSS after the load holds the inflated GiB (its growth over the child's own earlier
    # peak is not used: on a busy machine that baseline peak can already be high)
    peak_after_kib = int(next(ln for ln in out.splitlines() if ln.startswith("PEAK_KIB")).split()[2])
    assert "NBYTES 1073741824" in out and peak_after_kib >= 1 << 20, (out, grown)


def test_pt_bomb_reader(pt_bomb, figures):
    root, rank, size = pt_bomb
    body = ("import torch, msprobe.readers\n"
            "    from msprobe.errors import TensorLoadError\n"
            f"    rec = msprobe.readers.open({root!r}).record({NAME!r}, step=0)\n"
            "    try:\n"
            "        rec.input_args[0].load()\n"
            "        print('LOADED')\n"
            "    except TensorLoadError as exc:\n"
            "        print('REFUSED', exc)")
    rc, out, err, grown = run_measured(body)
    assert rc == 0, err
    assert "REFUSED" in out and "decompression bomb" in out, out
    assert grown < BOUND_MIB, grown
    figures.setdefault("bomb_peak_mib", {})["pt_zip_bomb/reader"] = grown.figure()


def test_pt_bomb_compare(pt_bomb, tmp_path, figures):
    root, rank, size = pt_bomb
    rc, out, err, grown = cli_measured(["compare", root, root, "-o", str(tmp_path / "cmp"), "--no-plot",
                                        "--no-progress", "--mode", "tensor"])
    assert "Traceback" not in err, err[-3000:]
    assert rc in (0, 1), (rc, err[-2000:])
    assert grown < BOUND_MIB, grown
    figures.setdefault("bomb_peak_mib", {})["pt_zip_bomb/compare"] = grown.figure()


def test_pt_bomb_run_ut(pt_bomb, tmp_path, figures):
    root, rank, size = pt_bomb
    out_dir = tmp_path / "ut"
    rc, out, err, grown = cli_measured(["run_ut", "-api_info", rank, "-o", str(out_dir), "-n", "0", "-q"])
    assert rc == 0 and "Traceback" not in err, err[-3000:]
    details = [p for p in os.listdir(out_dir) if p.startswith("accuracy_checking_result")]
    with open(out_dir / details[0]) as f:
        text = f.read()
    assert "decompression bomb" in text and "SKIP" in text, text
    assert grown < BOUND_MIB, grown
    figures.setdefault("bomb_peak_mib", {})["pt_zip_bomb/run_ut"] = grown.figure()


def test_pt_bomb_convert(pt_bomb, tmp_path, figures):
    root, rank, size = pt_bomb
    rc, out, err, grown = cli_measured(["convert", root, "--to", "zarr", "--out", str(tmp_path / "z")])
    assert rc == 1 and "Traceback" not in err, (rc, err[-3000:])
    assert "decompression bomb" in err, err
    assert grown < BOUND_MIB, grown
    figures.setdefault("bomb_peak_mib", {})["pt_zip_bomb/convert"] = grown.figure()


def test_pt_deflated_but_honest_still_loads(tmp_path):
    """A deflated torch zip within the record's size still loads (only the declared sizes are bounded)."""
    import zipfile

    path = tmp_path / "t.pt"
    want = torch.arange(60, dtype=torch.float32).reshape(5, 12)
    torch.save(want, str(tmp_path / "plain.pt"))
    with zipfile.ZipFile(tmp_path / "plain.pt") as src, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as out:
        for info in src.infolist():
            out.writestr(info.filename, src.read(info.filename))
    from msprobe.backends import LocalStore
    from msprobe.readers._tensor import load_tensor_file

    got = load_tensor_file(LocalStore(str(tmp_path)), "t.pt", record="r", dtype="torch.float32", shape=(5, 12))
    assert np.array_equal(got, want.numpy())


# -- run_ut: a tiny statistics dump.json declaring huge inputs ------------------------------------
def _stats_dump(root, numel):
    rank = os.path.join(root, "step0", "rank0")
    os.makedirs(rank)
    t = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [numel], "Max": 1.0, "Min": 0.0, "Mean": 0.5,
         "Norm": 1.0, "requires_grad": False}
    doc = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None,
           "data": {NAME: {"input_args": [t], "input_kwargs": {}, "output": [t]}}}
    with open(os.path.join(rank, "dump.json"), "w") as f:
        json.dump(doc, f)
    return rank


def _result_rows(out_dir):
    name = [p for p in os.listdir(out_dir) if p.startswith("accuracy_checking_result")][0]
    with open(os.path.join(out_dir, name)) as f:
        return f.read()


@pytest.mark.parametrize("numel,argv,config", [
    (1 << 40, [], None),                                  # 4 TiB: above the default ceiling (a memory share)
    (1 << 25, ["--max-input-mb", "64"], None),            # 128 MiB: above a CLI ceiling
    (1 << 25, [], {"run_ut": {"max_input_mb": 64}}),      # ... and a config one
], ids=["2^40-default", "2^25-cli", "2^25-config"])
def test_run_ut_generated_input_ceiling(tmp_path, numel, argv, config, figures):
    rank = _stats_dump(str(tmp_path / "dump"), numel)
    assert os.path.getsize(os.path.join(rank, "dump.json")) < 1024
    if config is not None:
        with open(tmp_path / "config.json", "w") as f:
            json.dump(config, f)
        argv = argv + ["-config", str(tmp_path / "config.json")]
    out_dir = tmp_path / "ut"
    rc, out, err, grown = cli_measured(["run_ut", "-api_info", rank, "-o", str(out_dir), "-n", "0", "-q", *argv])
    assert rc == 0 and "Traceback" not in err, err[-3000:]
    text = _result_rows(out_dir)
    assert "SKIP" in text and "ceiling" in text, text
    assert grown < BOUND_MIB, grown
    how = "config max_input_mb 64" if config is not None else " ".join(argv[:2]) or "default ceiling"
    figures.setdefault("bomb_peak_mib", {})[f"run_ut_generated_input/[{numel}] {how}"] = grown.figure()


def test_run_ut_below_the_ceiling_still_checks(tmp_path):
    from msprobe.run_ut import run_ut

    rank = _stats_dump(str(tmp_path / "dump"), 1000)
    s = run_ut(rank, str(tmp_path / "a"), workers=0, progress=False, max_input_mb=1)
    assert s["counts"].get("SKIP", 0) == 0 and sum(s["counts"].values()) == 1, s["counts"]
    s = run_ut(rank, str(tmp_path / "b"), workers=0, progress=False, max_input_mb=0.001)  # 1 KiB < 4000 bytes
    assert s["counts"].get("SKIP") == 1 and "ceiling" in _result_rows(tmp_path / "b")


def test_run_ut_bad_ceiling_is_a_config_error(tmp_path):
    from msprobe.errors import ConfigError
    from msprobe.run_ut import run_ut

    rank = _stats_dump(str(tmp_path / "dump"), 10)
    with open(tmp_path / "c.json", "w") as f:
        json.dump({"run_ut": {"max_input_mb": "big"}}, f)
    with pytest.raises(ConfigError):
        run_ut(rank, str(tmp_path / "o"), workers=0, progress=False, config=str(tmp_path / "c.json"))
    with pytest.raises(ConfigError):
        run_ut(rank, str(tmp_path / "o"), workers=0, progress=False, max_input_mb=float("nan"))
