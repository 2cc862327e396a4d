"""Tensor loading on hostile or broken input: nothing is unpickled, everything fails typed."""
from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from readers_synth import torch_dump

import msprobe.readers as readers
from msprobe.errors import TensorLoadError, UnsafePathError

torch = pytest.importorskip("torch")

REC = "Functional.linear.0.forward"
FILE = f"{REC}.input.0.pt"


@pytest.fixture
def dump(tmp_path):
    root = tmp_path / "d"
    torch_dump(str(root), dialect="msprobe-8")
    return root, root / "step0" / "rank"


def _arg(root):
    return readers.open(str(root)).record(REC).input_args[0]


class _Evil:
    """Pickles to a call of exec() that writes a marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


def test_pickle_payload_in_pt_is_not_executed(dump, tmp_path):
    root, rank = dump
    marker = tmp_path / "PWNED"
    torch.save(_Evil(marker), rank / "dump_tensor_data" / FILE)
    with pytest.raises(TensorLoadError) as ei:
        _arg(root).load()
    assert REC in str(ei.value) and FILE in str(ei.value) and "refused" in str(ei.value)
    with pytest.raises(TensorLoadError):
        _arg(root).load(framework="torch")
    assert not marker.exists()
    # the payload is live: an unsafe loader would have run it
    legacy = tmp_path / "legacy.pkl"
    legacy.write_bytes(pickle.dumps(_Evil(tmp_path / "PROOF")))
    pickle.loads(legacy.read_bytes())
    assert (tmp_path / "PROOF").exists()


def test_legacy_pickle_pt_is_not_executed(dump, tmp_path):
    root, rank = dump
    marker = tmp_path / "PWNED2"
    (rank / "dump_tensor_data" / FILE).write_bytes(pickle.dumps(_Evil(marker), protocol=2))
    with pytest.raises(TensorLoadError, match=FILE):
        _arg(root).load()
    assert not marker.exists()


def test_pt_holding_something_else(dump):
    root, rank = dump
    torch.save({"a": torch.zeros(3, 4)}, rank / "dump_tensor_data" / FILE)
    with pytest.raises(TensorLoadError, match="not a tensor"):
        _arg(root).load()


def test_truncated_and_missing_pt(dump):
    root, rank = dump
    path = rank / "dump_tensor_data" / FILE
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TensorLoadError, match="truncated"):
        _arg(root).load()
    path.unlink()
    with pytest.raises(TensorLoadError, match="missing"):
        _arg(root).load()


def test_mismatching_shape_and_dtype(dump):
    root, rank = dump
    path = rank / "dump_tensor_data" / FILE
    torch.save(torch.zeros(4, 3), path)
    with pytest.raises(TensorLoadError, match=r"shape \[4, 3\] differs"):
        _arg(root).load()
    torch.save(torch.zeros(3, 4, dtype=torch.float64), path)
    with pytest.raises(TensorLoadError, match="dtype float64 differs"):
        _arg(root).load()
    assert _arg(root).load(check=False).dtype == np.float64


def test_oversized_file_refused_before_reading(dump):
    root, rank = dump
    path = rank / "dump_tensor_data" / FILE
    torch.save(torch.zeros(3, 4 * 1024 * 128), path)  # 6 MiB for a 48-byte record
    with pytest.raises(TensorLoadError, match="far more than"):
        _arg(root).load()
    with pytest.raises(TensorLoadError, match="shape"):  # read when allowed, then the shape check fails
        _arg(root).load(max_bytes=1 << 30)


def _edit_doc(rank, fn):
    p = rank / "dump.json"
    doc = json.loads(p.read_text())
    fn(doc["data"])
    p.write_text(json.dumps(doc))


@pytest.mark.parametrize("bad", ["../../../etc/passwd", "..", "sub/x.pt", "/abs.pt", "a\\b.pt"])
def test_unsafe_data_name(dump, bad):
    root, rank = dump
    _edit_doc(rank, lambda data: data[REC]["input_args"][0].__setitem__("data_name", bad))
    arg = _arg(root)
    with pytest.raises(UnsafePathError):
        arg.load()


def test_npy_object_array_refused(tmp_path):
    from readers_synth import mindspore_dump

    mindspore_dump(str(tmp_path / "ms"))
    rank = tmp_path / "ms" / "graph" / "step0" / "rank0"
    name = "Primitive.matmul.MatMul.0.forward.input.0.npy"
    np.save(rank / "dump_tensor_data" / name, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    d = readers.open(str(tmp_path / "ms"))
    arg = d.record("Primitive.matmul.MatMul.0.forward", split="graph").input_args[0]
    with pytest.raises(TensorLoadError, match="Python objects"):
        arg.load()
    # truncated .npy
    good = np.zeros((2, 3), dtype=np.float32)
    np.save(rank / "dump_tensor_data" / name, good)
    data = (rank / "dump_tensor_data" / name).read_bytes()
    (rank / "dump_tensor_data" / name).write_bytes(data[:-5])
    with pytest.raises(TensorLoadError, match="truncated"):
        arg.load()
    # raw bytes of the wrong length are neither .npy nor raw
    (rank / "dump_tensor_data" / name).write_bytes(b"\x00" * 7)
    with pytest.raises(TensorLoadError, match="not a .npy file"):
        arg.load()
    # exact raw bytes of the record's dtype/shape are accepted
    (rank / "dump_tensor_data" / name).write_bytes(np.arange(6, dtype="<f4").tobytes())
    np.testing.assert_array_equal(arg.load(), np.arange(6, dtype=np.float32).reshape(2, 3))


def test_mapping_csv_cannot_escape(tmp_path):
    from readers_synth import mindspore_dump

    mindspore_dump(str(tmp_path / "ms"))
    rank = tmp_path / "ms" / "graph" / "step0" / "rank0"
    m = rank / "dump_tensor_data" / "mapping.csv"
    rows = [line.split(",") for line in m.read_text().splitlines()]
    m.write_text("".join(f"../../../secret.npy,{orig}\n" for _, orig in rows))
    d = readers.open(str(tmp_path / "ms"))
    jit = [r for r in d.records(split="graph") if r.api_type == "Jit"][0]
    with pytest.raises(UnsafePathError):
        jit.input_args[0].load()
