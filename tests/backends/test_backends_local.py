"""LocalStore specifics: atomic publication, temp files, fallbacks, crash-safe journal."""
from __future__ import annotations

import errno
import io
import json
import mmap
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from msprobe.backends import LocalStore, open_store, read_journal
from msprobe.backends import _journal as journal_module
from msprobe.backends import _local as local_module
from msprobe.errors import (
    MsprobeError,
    StorageError,
    StorageNotFoundError,
    StoragePermissionError,
    StorageTransientError,
)

FIVE_MB = 5 * 2**20


def all_names(root) -> list[str]:
    """Every file below root, hidden ones included."""
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def test_reader_never_sees_partial_file(tmp_path) -> None:
    """A reader polling while 5 MB puts are in progress sees whole objects only."""
    store = LocalStore(tmp_path)
    stop = threading.Event()
    bad: list[str] = []
    seen = 0

    def poll() -> None:
        nonlocal seen
        reader = LocalStore(tmp_path, read_only=True)
        while not stop.is_set():
            try:
                data = reader.get("rank0/t.bin")
            except StorageNotFoundError:
                continue
            seen += 1
            if len(data) != FIVE_MB or data.count(data[:1]) != FIVE_MB:
                bad.append(f"partial or mixed object: {len(data)} bytes")
            if any(".msprobe-tmp-" in k for k in reader.list_prefix()):
                bad.append("temp file listed")

    thread = threading.Thread(target=poll)
    thread.start()
    try:
        for i in range(12):
            store.put("rank0/t.bin", bytes([i]) * FIVE_MB)
    finally:
        stop.set()
        thread.join()
    assert not bad and seen > 0
    assert all_names(tmp_path) == ["rank0/t.bin"]


def test_stream_in_progress_is_invisible(tmp_path) -> None:
    """While put_stream is half-way, the key does not exist and nothing is listed."""
    store = LocalStore(tmp_path)
    half_way, resume = threading.Event(), threading.Event()

    class Slow(io.RawIOBase):
        sent = 0

        def readable(self) -> bool:
            return True

        def readinto(self, b) -> int:
            if self.sent >= FIVE_MB:
                return 0
            if self.sent == 2**20 * 2:
                half_way.set()
                resume.wait(10)
            n = min(len(b), FIVE_MB - self.sent)
            b[:n] = b"s" * n
            self.sent += n
            return n

    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(store.put_stream("a/stream.bin", Slow())))
    t.start()
    assert half_way.wait(10)
    try:
        assert not store.exists("a/stream.bin")
        assert store.list_prefix() == [] and store.list_dir("a") == []
        assert any(".msprobe-tmp-" in n for n in all_names(tmp_path))  # it is being written, hidden
    finally:
        resume.set()
        t.join()
    assert result == [FIVE_MB] and store.size("a/stream.bin") == FIVE_MB
    assert all_names(tmp_path) == ["a/stream.bin"]


@pytest.mark.parametrize("where", ["fsync", "replace", "write"])
def test_injected_failure_leaves_no_temp(tmp_path, monkeypatch, where) -> None:
    store = LocalStore(tmp_path)
    store.put("k", b"old")

    def boom(*args, **kwargs):
        raise OSError(errno.EIO, "injected I/O error")

    if where == "write":
        real_write = os.write
        calls = {"n": 0}

        def flaky_write(fd, data):
            calls["n"] += 1
            if calls["n"] > 2:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_write(fd, data[: 2**20])

        monkeypatch.setattr(local_module.os, "write", flaky_write)
    else:
        monkeypatch.setattr(local_module.os, where, boom)
    with pytest.raises(StorageError) as info:
        store.put("k", b"n" * FIVE_MB)
    assert not isinstance(info.value, StorageTransientError)  # EIO / ENOSPC are permanent
    monkeypatch.undo()
    assert all_names(tmp_path) == ["k"]
    assert store.get("k") == b"old"


def test_exclusive_create_without_hard_links(tmp_path, monkeypatch) -> None:
    """Where os.link is refused (some FUSE/SMB mounts), O_EXCL still makes it exclusive."""

    def no_links(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(local_module.os, "link", no_links)
    store = LocalStore(tmp_path)
    store.put("m", b"first", overwrite=False)
    with pytest.raises(StoragePermissionError):
        store.put("m", b"second", overwrite=False)
    assert store.get("m") == b"first"
    assert all_names(tmp_path) == ["m"]


def test_mkdir_races_are_harmless(tmp_path) -> None:
    store = LocalStore(tmp_path)
    barrier = threading.Barrier(16)
    errors: list[BaseException] = []

    def write(i: int) -> None:
        barrier.wait()
        try:
            store.put(f"deep/new/dir/tree/{i}.bin", bytes([i]) * 10)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(store.list_dir("deep/new/dir/tree")) == 16


def test_open_store_local_forms(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert open_store("rel/dir").local_path() == str(tmp_path / "rel" / "dir")
    assert open_store(tmp_path / "p").local_path() == str(tmp_path / "p")
    assert open_store(f"file://{tmp_path}/u").local_path() == str(tmp_path / "u")
    with pytest.raises(StorageNotFoundError):
        open_store(tmp_path / "missing", create=False)
    with pytest.raises(StorageNotFoundError):
        open_store(tmp_path / "missing2", read_only=True)
    assert not (tmp_path / "missing2").exists()
    (tmp_path / "afile").write_bytes(b"x")
    with pytest.raises(StorageError):
        open_store(tmp_path / "afile")


def test_parent_is_a_file(tmp_path) -> None:
    store = LocalStore(tmp_path)
    store.put("a", b"x")
    with pytest.raises(StorageError):
        store.put("a/b", b"y")
    assert not store.exists("a/b") and store.list_prefix("a") == []


def test_journal_fsyncs_each_flush(tmp_path, monkeypatch) -> None:
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(journal_module.os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    store = LocalStore(tmp_path)
    with store.journal("j") as j:
        j.append(b"1")
        j.flush()
        j.append(b"2")
        j.flush()
    assert len(synced) == 2
    assert store.list_dir("j") == ["000001.jsonl"]  # one append file per journal


def test_journal_failed_flush_is_rolled_back(tmp_path, monkeypatch) -> None:
    """A flush that dies half-way is cut back, so the retry does not duplicate lines."""
    store = LocalStore(tmp_path)
    j = store.journal("j")
    j.append(b"a")
    j.flush()
    real_write = os.write
    state = {"fail": True}

    def half_write(fd, data):
        if state["fail"]:
            state["fail"] = False
            real_write(fd, bytes(data[:3]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(journal_module.os, "write", half_write)
    j.append(b"bbbb")
    j.append(b"cccc")
    with pytest.raises(StorageError):
        j.flush()
    j.flush()  # space is back: the buffered lines go out once
    j.close()
    assert list(read_journal(store, "j")) == [b"a", b"bbbb", b"cccc"]


_JOURNAL_CHILD = r"""
import sys, json
from msprobe.backends import LocalStore
store = LocalStore(sys.argv[1])
j = store.journal("rank0/journal")
i = 0
while True:
    j.append(json.dumps({"seq": i, "pad": "x" * (i % 50)}).encode())
    if i % 10 == 9:
        j.flush()
    i += 1
"""


def test_journal_survives_sigkill(tmp_path) -> None:
    """Kill -9 a process that journals; the records flushed before are recovered in order."""
    proc = subprocess.Popen([sys.executable, "-c", _JOURNAL_CHILD, str(tmp_path)])
    store = LocalStore(tmp_path)
    deadline = time.monotonic() + 30
    path = tmp_path / "rank0" / "journal" / "000001.jsonl"
    while time.monotonic() < deadline and (not path.exists() or path.stat().st_size < 100_000):
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    truncated: list[bytes] = []
    records = [json.loads(line) for line in read_journal(store, "rank0/journal", on_truncated=lambda k, t: truncated.append(t))]
    assert len(records) > 1000
    assert [r["seq"] for r in records] == list(range(len(records)))
    assert len(truncated) <= 1


_MAPPED_CHILD = r"""
import sys, json, os
from msprobe.backends import LocalStore
store = LocalStore(sys.argv[1])
j = store.journal("rank0/journal", fsync=False, mapped=True)
os.write(1, b"open\n")
i = 0
while True:
    j.append(json.dumps({"seq": i, "pad": "x" * (i % 50)}).encode())
    j.flush()
    os.write(1, b"%d\n" % i)  # flushed: the parent counts it as durable
    i += 1
"""


def test_mapped_journal_survives_sigkill(tmp_path) -> None:
    """A mapped journal (one copy into MAP_SHARED pages per flush, no write()): after kill -9 every
    line whose flush returned is read back, in order, and the segment's NUL tail is no torn line."""
    proc = subprocess.Popen([sys.executable, "-c", _MAPPED_CHILD, str(tmp_path)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"open\n"
    flushed = -1
    while flushed < 3000:  # 3,000 lines are ~200 KB: the windows of 64, 128 and 256 KiB
        flushed = int(proc.stdout.readline())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    store = LocalStore(tmp_path)
    path = tmp_path / "rank0" / "journal" / "000001.jsonl"
    raw = path.read_bytes()
    # the mapped windows, not writes: the file ends where the last window ends, NULs after the lines
    assert len(raw) % mmap.ALLOCATIONGRANULARITY == 0 and raw.endswith(b"\0")
    assert len(raw) > journal_module.Journal.MAP_FIRST
    truncated: list[bytes] = []
    records = [json.loads(line) for line in read_journal(store, "rank0/journal", on_truncated=lambda k, t: truncated.append(t))]
    assert [r["seq"] for r in records] == list(range(len(records)))
    assert len(records) > flushed  # every flushed line (and those flushed before the kill was read)
    assert truncated == []  # a whole line per copy: the kill leaves complete lines and NULs


def test_mapped_journal_is_cut_back_on_close(tmp_path) -> None:
    """Across several windows, the closed segment holds exactly the lines (the bytes a written journal
    holds), and its reading warns of nothing."""
    store = LocalStore(tmp_path)
    lines = [json.dumps({"seq": i, "pad": "y" * (i % 300)}).encode() for i in range(400)]
    with store.journal("w", fsync=False) as w:
        for line in lines:
            w.append(line)
            w.flush()
    j = store.journal("m", fsync=False, mapped=True)
    j.MAP_WINDOW = 4096  # a new window every few flushes
    for i, line in enumerate(lines):
        j.append(line)
        if i % 3 == 0 or len(line) > 200:
            j.flush()
        if i == 200:  # mid-way, the open segment: complete lines, then NULs
            raw = (tmp_path / "m" / "000001.jsonl").read_bytes()
            assert raw.rstrip(b"\0").endswith(b"\n") and raw.endswith(b"\0")
    j.close()
    assert (tmp_path / "m" / "000001.jsonl").read_bytes() == (tmp_path / "w" / "000001.jsonl").read_bytes()
    assert list(read_journal(store, "m")) == lines


def test_mapped_journal_windows_grow(tmp_path) -> None:
    """The first window is MAP_FIRST bytes (a step's few hundred records fit it), each next one twice the
    last up to MAP_WINDOW; the closed segment is its lines whatever the windows were."""
    store = LocalStore(tmp_path)
    j = store.journal("g", fsync=False, mapped=True)
    first = journal_module.Journal.MAP_FIRST
    path = tmp_path / "g" / "000001.jsonl"
    line = b"z" * 999
    j.extend([line], flush=True)
    assert path.stat().st_size == first  # (1 MiB before: one window for any segment)
    written = 1
    while written * 1000 <= first:
        j.extend([line], flush=True)
        written += 1
    # the second window: from the page holding the end of the lines before it, twice the first
    before = (written - 1) * 1000
    assert path.stat().st_size == before - before % mmap.ALLOCATIONGRANULARITY + 2 * first
    j.close()
    assert path.read_bytes() == (line + b"\n") * written
    assert list(read_journal(store, "g")) == [line] * written


def test_mapped_journal_discard_removes_without_cutting_back(tmp_path, monkeypatch) -> None:
    """A final dump's journal goes with its directory in one pass: its segments unlinked as they are (no
    ftruncate of the window's and the reserve's rest first: the blocks go with the file), the journal's
    directory and the empty one above removed (as LocalStore.delete_prefix); another file in the directory keeps both (False)."""
    store = LocalStore(tmp_path)
    j = store.journal("step0/rank0/.journal", fsync=False, mapped=True, reserve_bytes=8192)
    j.extend([b"r1"], flush=True)
    j.extend([b"r2"], flush=True)
    cuts = []
    real_ftruncate = os.ftruncate
    monkeypatch.setattr(os, "ftruncate", lambda fd, n: (cuts.append(n), real_ftruncate(fd, n)))
    assert j.discard() is True
    assert cuts == []
    assert os.listdir(tmp_path / "step0") == []  # (.journal and the emptied rank directory above it)
    with pytest.raises(MsprobeError):
        j.append(b"late")  # closed
    j.close()  # safe after discard

    k = store.journal("step1/rank0/.journal", fsync=False, mapped=True)
    k.extend([b"x"], flush=True)
    (tmp_path / "step1" / "rank0" / "dump.json").write_bytes(b"{}")
    (tmp_path / "step1" / "rank0" / ".journal" / "other").write_bytes(b"kept")
    assert k.discard() is False  # something else in the directory: the caller deletes the prefix
    assert (tmp_path / "step1" / "rank0" / ".journal" / "other").read_bytes() == b"kept"
    assert not (tmp_path / "step1" / "rank0" / ".journal" / "000001.jsonl").exists()

    m = store.journal("step2/rank0/.journal", fsync=False, mapped=True)
    m.extend([b"y"], flush=True)
    (tmp_path / "step2" / "rank0" / "dump.json").write_bytes(b"{}")
    assert m.discard() is True
    assert sorted(os.listdir(tmp_path / "step2" / "rank0")) == ["dump.json"]  # (the rank directory stays)


def test_put_into_an_existing_directory_makes_no_directories(tmp_path, monkeypatch) -> None:
    """A document's put tries its temporary file's open first: its directory there already (every put of a
    step after its first), no mkdir; a missing one is still made."""
    store = LocalStore(tmp_path)
    store.put("a/b/one.json", b"1")
    made = []
    real_makedirs = os.makedirs
    monkeypatch.setattr(os, "makedirs", lambda *a, **k: (made.append(a[0]), real_makedirs(*a, **k)))
    store.put("a/b/two.json", b"2")
    store.put("a/b/one.json", b"3")
    assert made == []
    store.put("a/c/d/three.json", b"4")
    assert made[0] == str(tmp_path / "a" / "c" / "d")
    assert store.get("a/b/one.json") == b"3" and store.get("a/c/d/three.json") == b"4"
    assert sorted(os.listdir(tmp_path / "a" / "b")) == ["one.json", "two.json"]  # (no temporary file left)


def test_mapped_journal_writes_when_no_window(tmp_path, monkeypatch) -> None:
    """No blocks for a window (ENOSPC from posix_fallocate): the journal writes instead, nothing lost or
    doubled; released reserve cuts the window's rest back."""
    store = LocalStore(tmp_path)
    j = store.journal("j", fsync=False, mapped=True, reserve_bytes=8192)
    j.append(b"a")
    j.flush()
    j.release_reserve()  # the disk is full: the segment is its lines again, later flushes write
    assert (tmp_path / "j" / "000001.jsonl").read_bytes() == b"a\n"
    j.append(b"b")
    j.flush()
    j.close()
    assert list(read_journal(store, "j")) == [b"a", b"b"]

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(journal_module.os, "posix_fallocate", full)
    k = store.journal("k", fsync=False, mapped=True)
    for line in (b"1", b"22", b"333"):
        k.append(line)
        k.flush()
        assert (tmp_path / "k" / "000001.jsonl").read_bytes().endswith(line + b"\n")
    k.close()
    assert (tmp_path / "k" / "000001.jsonl").read_bytes() == b"1\n22\n333\n"


def test_read_journal_ignores_a_nul_tail(tmp_path) -> None:
    """NUL bytes after a segment's last line are no line; a torn line before them is still reported."""
    store = LocalStore(tmp_path)
    store.put("j/000001.jsonl", b'{"a": 1}\n' + b"\0" * 5000)
    store.put("j/000002.jsonl", b'{"b": 2}\n{"c"' + b"\0" * 100)
    seen: list = []
    assert list(read_journal(store, "j", on_truncated=lambda k, t: seen.append((k, t)))) == [b'{"a": 1}', b'{"b": 2}']
    assert seen == [("j/000002.jsonl", b'{"c"')]


def test_read_journal_a_line_with_nul_bytes_is_torn(tmp_path) -> None:
    """A copy into the mapped window cut short can store a line's newline before the bytes ahead of
    it: the line holds NUL bytes, and it is a torn write, reported, never handed on as a line."""
    store = LocalStore(tmp_path)
    store.put("j/000001.jsonl", b'{"a": 1}\n{"b": \0\0\0\0\0"x"}\n' + b"\0" * 64)
    seen: list = []
    assert list(read_journal(store, "j", on_truncated=lambda k, t: seen.append((k, t)))) == [b'{"a": 1}']
    assert seen == [("j/000001.jsonl", b'{"b": \0\0\0\0\0"x"}')]


def test_extra_transient_errno(tmp_path, monkeypatch) -> None:
    """ENOSPC is permanent unless configured as transient (then the writer retries it)."""
    from msprobe.backends import BackgroundWriter

    store = LocalStore(tmp_path)
    real_replace = os.replace
    state = {"left": 2}

    def full_then_ok(src, dst):
        if state["left"]:
            state["left"] -= 1
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(local_module.os, "replace", full_then_ok)
    with BackgroundWriter(store, backoff=(0.001, 0.01), extra_transient_errnos=[errno.ENOSPC]) as w:
        w.submit("k", b"data")
    assert store.get("k") == b"data" and w.stats.retries == 2

    state["left"] = 1
    w2 = BackgroundWriter(store, backoff=(0.001, 0.01))
    w2.submit("k2", b"data")
    with pytest.raises(StorageError, match="k2"):
        w2.flush()
    w2.close()
    assert w2.stats.retries == 0 and not store.exists("k2")
