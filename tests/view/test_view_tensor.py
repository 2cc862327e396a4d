"""The record detail's tensor preview reads by range: the container's header and the first payload
bytes, never the whole file (counted through an fsspec file system that records every read)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from msprobe.backends._fsspec import FsspecStore
from msprobe.errors import TensorLoadError
from msprobe.view._tensor import HEADER_BYTES, PREVIEW_BYTES, read_preview


class Counted:
    """A local fsspec file system that counts the bytes each read hands back, and the reads of a
    whole file (a preview makes none)."""

    def __init__(self) -> None:
        from fsspec.implementations.local import LocalFileSystem

        outer = self

        class CountingFS(LocalFileSystem):
            def cat_file(self, path, start=None, end=None, **kwargs):
                data = super().cat_file(path, start=start, end=end, **kwargs)
                outer.reads.append((start, end, len(data)))
                outer.whole += start is None and end is None
                return data

        self.reads: list = []
        self.whole = 0
        self.fs = CountingFS()

    def store(self, root: str) -> FsspecStore:
        return FsspecStore(self.fs, root)

    @property
    def bytes_read(self) -> int:
        return sum(n for _, _, n in self.reads)


def test_a_pt_file_larger_than_the_old_cap_is_previewed_from_a_few_ranges(tmp_path):
    import torch

    numel = 20_000_000  # 80 MB of float32: more than the 64 MB a preview used to read whole
    torch.save(torch.arange(numel, dtype=torch.float32), tmp_path / "big.pt")
    size = os.path.getsize(tmp_path / "big.pt")
    assert size > 80_000_000
    counted = Counted()
    values, total = read_preview(counted.store(str(tmp_path)), "big.pt", "torch.float32", (numel,))
    assert total == numel and values.size == PREVIEW_BYTES // 4
    assert np.array_equal(values, np.arange(PREVIEW_BYTES // 4, dtype=np.float64))
    # the end record, the directory, data.pkl and two local headers, then the payload's first MB
    assert counted.whole == 0
    assert counted.bytes_read < PREVIEW_BYTES + 200_000, counted.reads
    assert counted.bytes_read < size / 50


def test_the_first_values_are_torchs_for_every_layout(tmp_path):
    import torch

    cases = {"f32.pt": (torch.randn(3, 5), "torch.float32"), "f16.pt": (torch.randn(7, 3).half(), "torch.float16"),
             "scalar.pt": (torch.tensor(2.5), "torch.float32"), "i64.pt": (torch.arange(-5, 40), "torch.int64"),
             "bf16.pt": (torch.randn(4, 4, 4).to(torch.bfloat16), "torch.bfloat16"),
             "bool.pt": (torch.tensor([True, False, True]), "torch.bool")}
    for name, (tensor, _) in cases.items():
        torch.save(tensor, tmp_path / name)
    counted = Counted()
    store = counted.store(str(tmp_path))
    for name, (tensor, dtype) in cases.items():
        values, total = read_preview(store, name, dtype, tuple(tensor.shape))
        assert total == tensor.numel()
        assert np.array_equal(values, tensor.float().numpy().ravel().astype(np.float64)), name
    assert counted.whole == 0


def test_npy_and_raw_files_are_read_after_their_header_only(tmp_path):
    big = np.arange(3_000_000, dtype=">f8")  # big-endian, 24 MB
    np.save(tmp_path / "big.npy", big)
    (tmp_path / "raw.bin").write_bytes(np.arange(10, dtype=np.float32).tobytes())
    counted = Counted()
    store = counted.store(str(tmp_path))
    values, total = read_preview(store, "big.npy", "float64", (3_000_000,))
    assert total == 3_000_000 and np.array_equal(values, np.arange(PREVIEW_BYTES // 8, dtype=np.float64))
    assert counted.bytes_read < PREVIEW_BYTES + 4096 and counted.whole == 0
    values, total = read_preview(store, "raw.bin", "float32", (10,))
    assert total == 10 and values.tolist() == list(range(10))


def test_hostile_files_are_refused_before_anything_large_is_read(tmp_path):
    import torch

    torch.save(torch.zeros(8), tmp_path / "small.pt")
    np.save(tmp_path / "small.npy", np.zeros(8, dtype=np.float32))
    counted = Counted()
    store = counted.store(str(tmp_path))
    # a record that declares a huge tensor: the file does not hold it, refused, nothing large read
    with pytest.raises(TensorLoadError, match="declares"):
        read_preview(store, "small.pt", "torch.float32", (1 << 40,))
    # a .npy cut short after its header, and a raw file shorter than its record: truncated
    (tmp_path / "cut.npy").write_bytes((tmp_path / "small.npy").read_bytes()[:-8])
    with pytest.raises(TensorLoadError, match="truncated"):
        read_preview(store, "cut.npy", "float32", (8,))
    (tmp_path / "short.bin").write_bytes(b"\0" * 16)
    with pytest.raises(TensorLoadError, match="truncated"):
        read_preview(store, "short.bin", "float32", (1 << 40,))
    assert counted.bytes_read < 4 * HEADER_BYTES
    # a .npy whose header claims a gigantic header length
    bad = bytearray((tmp_path / "small.npy").read_bytes())
    bad[8:10] = (0xFFFF).to_bytes(2, "little")
    (tmp_path / "badhead.npy").write_bytes(bytes(bad))
    with pytest.raises(TensorLoadError):
        read_preview(store, "badhead.npy", "float32", (8,))
    # a zip whose data.pkl is a pickle that would run code: parsed, never run, refused
    import zipfile

    with zipfile.ZipFile(tmp_path / "evil.pt", "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("evil/data.pkl", b"cos\nsystem\n(S'echo pwned'\ntR.")
        archive.writestr("evil/data/0", b"\0" * 32)
    with pytest.raises(TensorLoadError, match="one plain tensor"):
        read_preview(store, "evil.pt", "torch.float32", (8,))
    # a compressed member: torch never writes one, and it could not be read by range
    with zipfile.ZipFile(tmp_path / "deflated.pt", "w", zipfile.ZIP_DEFLATED) as archive:
        with zipfile.ZipFile(tmp_path / "small.pt") as source:
            for info in source.infolist():
                archive.writestr(info.filename, source.read(info.filename))
    with pytest.raises(TensorLoadError, match="compressed"):
        read_preview(store, "deflated.pt", "torch.float32", (8,))

