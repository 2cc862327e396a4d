"""LocalStore(direct=True): a large put from a page-aligned writable buffer goes to the disk with
O_DIRECT (its last partial block through the page cache); the bytes, the temporary name and the
rename are those of any put, and a file system that refuses O_DIRECT is written the usual way."""
from __future__ import annotations

import errno
import os

import pytest

from msprobe.backends import BackgroundWriter, LocalStore
from msprobe.backends import _local as local_module

pytestmark = pytest.mark.skipif(not local_module._O_DIRECT, reason="no O_DIRECT on this platform")

torch = pytest.importorskip("torch")


def _aligned(nbytes: int, seed: int = 0) -> memoryview:
    """A writable buffer of ``nbytes`` random bytes starting on a 4096-byte boundary."""
    raw = torch.empty(nbytes + 4095, dtype=torch.uint8)
    start = -raw.data_ptr() % 4096
    buf = raw[start:start + nbytes]
    buf.copy_(torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)))
    mv = memoryview(buf.numpy().data)
    assert local_module._address(mv) % 4096 == 0
    return mv


@pytest.fixture
def opened(monkeypatch):
    """The flags of every file LocalStore opens for writing."""
    flags = []
    real = os.open

    def spy(path, f, *a, **k):
        flags.append(f)
        return real(path, f, *a, **k)

    monkeypatch.setattr(local_module.os, "open", spy)
    return flags


@pytest.mark.parametrize("nbytes", [1 << 20, (1 << 20) + 1, 3 * (1 << 20) + 4095, 5 * (1 << 20) + 123])
def test_direct_put_writes_the_same_bytes(tmp_path, opened, nbytes) -> None:
    store = LocalStore(tmp_path, fsync=False, direct=True)
    view = _aligned(nbytes)
    store.put("a/b.pt", view)
    assert (tmp_path / "a" / "b.pt").read_bytes() == bytes(view)
    assert any(f & local_module._O_DIRECT for f in opened)
    assert not [n for n in os.listdir(tmp_path / "a") if n != "b.pt"]  # no temporary left


def test_small_unaligned_or_read_only_puts_take_the_page_cache(tmp_path, opened) -> None:
    store = LocalStore(tmp_path, fsync=False, direct=True)
    big = _aligned(2 << 20)
    store.put("small", big[:4096])  # below the threshold
    store.put("unaligned", big[1:])  # does not start on a block boundary
    store.put("readonly", bytes(big))  # read-only buffer
    assert not any(f & local_module._O_DIRECT for f in opened)
    assert (tmp_path / "small").read_bytes() == bytes(big[:4096])
    assert (tmp_path / "unaligned").read_bytes() == bytes(big[1:])
    assert (tmp_path / "readonly").read_bytes() == bytes(big)
    off = LocalStore(tmp_path / "off", fsync=False)  # direct is off by default
    off.put("x", big)
    assert not any(f & local_module._O_DIRECT for f in opened)


def test_a_file_system_refusing_o_direct_at_open(tmp_path, monkeypatch) -> None:
    real = os.open

    def no_direct(path, f, *a, **k):
        if f & local_module._O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(path, f, *a, **k)

    monkeypatch.setattr(local_module.os, "open", no_direct)
    store = LocalStore(tmp_path, fsync=False, direct=True)
    view = _aligned((2 << 20) + 77)
    store.put("x", view)
    assert (tmp_path / "x").read_bytes() == bytes(view)
    assert not store._direct  # not tried again
    assert os.listdir(tmp_path) == ["x"]


def test_a_file_system_refusing_the_direct_write(tmp_path, monkeypatch) -> None:
    """EINVAL from the direct write (after some bytes landed): the object is rewritten from its
    start through the page cache."""
    real = local_module._write_all
    calls = []

    def refuse_direct(fd, view):
        import fcntl

        calls.append(len(view))
        if fcntl.fcntl(fd, fcntl.F_GETFL) & local_module._O_DIRECT:
            os.write(fd, view[:8192])
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, view)

    monkeypatch.setattr(local_module, "_write_all", refuse_direct)
    store = LocalStore(tmp_path, fsync=False, direct=True)
    view = _aligned((2 << 20) + 5)
    store.put("x", view)
    assert (tmp_path / "x").read_bytes() == bytes(view)
    assert not store._direct


def test_a_retried_write_after_a_partial_failure_has_the_right_bytes(tmp_path, monkeypatch) -> None:
    """The first attempt writes part of the object direct, then fails (transient): the retry
    writes it whole, the file holds exactly the submitted bytes, no temporary is left."""
    real = local_module._write_all
    failed = []

    def flaky(fd, view):
        if not failed:
            failed.append(1)
            os.write(fd, view[:4096])
            raise OSError(errno.ETIMEDOUT, "timed out")
        return real(fd, view)

    monkeypatch.setattr(local_module, "_write_all", flaky)
    store = LocalStore(tmp_path, fsync=False, direct=True)
    views = {f"k{i}": _aligned((1 << 20) + 1000 * i, seed=i) for i in range(3)}
    with BackgroundWriter(store, workers=2, backoff=(0.001, 0.002), digests=True) as writer:
        for key, view in views.items():
            writer.submit(key, view)
    assert failed and writer.stats.retries == 1
    for key, view in views.items():
        assert (tmp_path / key).read_bytes() == bytes(view)
    assert sorted(os.listdir(tmp_path)) == sorted(views)
    assert store._direct


def test_file_sink_releases_each_buffer_once_the_writer_is_done(tmp_path) -> None:
    """``release`` runs once per queued file: written, failed for good, or replaced by a later
    submission of its key (the pool may then reuse the buffer)."""
    from msprobe.dumpers.session._sinks import FileSink
    from msprobe.errors import StorageError

    class Journal:
        def __init__(self):
            self.done = []

        def expect(self, name):
            pass

        def tensor_done(self, name):
            self.done.append(name)

    journal = Journal()
    sink = FileSink(None, None, None, journal)  # type: ignore[arg-type]
    store = LocalStore(tmp_path, fsync=False, direct=True)
    sink._writer = BackgroundWriter(store, workers=1, retries=0)
    released = []
    sink.save("a", "a", lambda: b"1", 1, lambda: released.append("a"))
    sink.save("a", "a2", lambda: b"2", 1, lambda: released.append("a2"))  # may replace the first
    sink.save("b", "b", lambda: 1 / 0, 1, lambda: released.append("b"))  # fails for good
    sink.save("c", "c", lambda: b"3", 1)  # no release
    try:
        sink.settle()
    except StorageError:
        pass
    sink.close()
    assert sorted(released) == ["a", "a2", "b"]
    assert sorted(journal.done) == ["a", "a2", "b", "c"]
    assert (tmp_path / "a").read_bytes() == b"2"
