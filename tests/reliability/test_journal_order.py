"""Tensor mode: a record reaches the crash journal only once the writer has published every
tensor file it names, and the journal stays in execution order (a record waits for the ones
before it). A write held back by the storage keeps its record (and the later ones) out of the
journal; when the write fails for good the records are released (recovery then drops the one
whose file is missing). The statistics path holds nothing back."""
from __future__ import annotations

import json
import threading
import time

import pytest

from msprobe.backends import open_store, read_journal
from msprobe.dumpers.config import DumpConfig
from msprobe.dumpers.session import DumpSession
from msprobe.errors import StoragePermissionError


def _session(path, task="tensor"):
    cfg = DumpConfig(task=task, level="L1", dump_path=str(path), journal_flush=1)
    return DumpSession(cfg, "pytorch", fetch_stats=lambda hs: [{} for _ in hs], render_stack=list,
                       get_rank=lambda: None)


def _rec(*data_names):
    return {"input_args": [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [1], "Max": 1.0, "Min": 1.0,
                            "Mean": 1.0, "Norm": 1.0, "requires_grad": False, **({"data_name": dn} if dn else {})}
                           for dn in data_names] or [None]}


def _journaled(path):
    store = open_store(str(path), create=False)
    return [json.loads(line)["name"] for line in read_journal(store, "step0/rank/.journal")
            if b'"name"' in line]


def _wait(cond, timeout=20.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


class _Gate:
    """Holds the writer's put of one key until released (or makes it fail)."""

    def __init__(self, session, key_part, fail=False):
        self.open, self.fail, self.part = threading.Event(), fail, key_part
        store = session.writer.store
        real = store.put

        def put(key, data, **kw):
            if key_part in key:
                self.open.wait(30)
                if self.fail:
                    raise StoragePermissionError(f"put {key}: denied (test)")
            return real(key, data, **kw)

        store.put = put


def _save(session, dn):
    session.save_tensor(dn, lambda: b"x" * 8, 8)


def test_record_waits_for_its_tensor_and_order_is_kept(tmp_path):
    s = _session(tmp_path)
    gate = _Gate(s, "A.0.forward")
    _save(s, "Functional.A.0.forward.input.0.pt")
    s.add_record("Functional.A.0.forward", _rec("Functional.A.0.forward.input.0.pt"))
    s.add_record("Functional.B.0.forward", _rec(None))  # no tensor file, but after A
    _save(s, "Functional.C.0.forward.input.0.pt")
    s.add_record("Functional.C.0.forward", _rec("Functional.C.0.forward.input.0.pt"))
    tensor_dir = tmp_path / "step0" / "rank" / "dump_tensor_data"
    _wait(lambda: (tensor_dir / "Functional.C.0.forward.input.0.pt").exists())
    time.sleep(0.05)
    # A's file is not published: neither A nor anything after it is journaled
    assert _journaled(tmp_path) == []
    assert not (tensor_dir / "Functional.A.0.forward.input.0.pt").exists()
    gate.open.set()
    _wait(lambda: len(_journaled(tmp_path)) == 3)
    assert _journaled(tmp_path) == ["Functional.A.0.forward", "Functional.B.0.forward", "Functional.C.0.forward"]
    assert s.records_journaled == 3
    s.publish(final=True)
    assert s.errors == []
    s.close()


def test_every_journaled_record_has_its_files(tmp_path):
    """Many records, writes finishing in any order: at every moment each journaled record's files exist."""
    s = _session(tmp_path)
    names = [f"Functional.op{i}.0.forward" for i in range(60)]
    seen_bad = []
    stop = threading.Event()

    def watch():
        tensor_dir = tmp_path / "step0" / "rank" / "dump_tensor_data"
        while not stop.is_set():
            try:
                got = _journaled(tmp_path)
            except Exception:  # noqa: BLE001 - read while being written: a half line reads as nothing yet
                got = []
            files = set(p.name for p in tensor_dir.iterdir()) if tensor_dir.exists() else set()
            seen_bad.extend(n for n in got if f"{n}.input.0.pt" not in files)
            assert got == names[: len(got)]
            time.sleep(0.002)

    t = threading.Thread(target=watch)
    t.start()
    try:
        for n in names:
            _save(s, f"{n}.input.0.pt")
            s.add_record(n, _rec(f"{n}.input.0.pt"))
        s.writer.flush()
        _wait(lambda: len(_journaled(tmp_path)) == len(names))
    finally:
        stop.set()
        t.join()
    assert seen_bad == []
    assert _journaled(tmp_path) == names
    s.close()


def test_failed_write_releases_the_queue(tmp_path):
    s = _session(tmp_path)
    gate = _Gate(s, "A.0.forward", fail=True)
    _save(s, "Functional.A.0.forward.input.0.pt")
    s.add_record("Functional.A.0.forward", _rec("Functional.A.0.forward.input.0.pt"))
    s.add_record("Functional.B.0.forward", _rec(None))
    assert _journaled(tmp_path) == []
    gate.open.set()
    _wait(lambda: len(_journaled(tmp_path)) == 2)  # not stuck behind the failed write
    from msprobe.dumpers.recover import recover_store

    (res,) = recover_store(open_store(str(tmp_path)))
    assert res.dropped_missing_tensor == ["Functional.A.0.forward"] and res.records == 1
    s.close()


def test_a_file_written_twice_holds_its_records_until_the_last_write(tmp_path):
    """A gradient's file is written again after a second backward (same data name): the record of the
    second write must wait for that write too, not be released by the first one's."""
    s = _session(tmp_path)
    dn = "Module.fc.Linear.parameters_grad.weight.pt"
    first, second = threading.Event(), threading.Event()
    store = s.writer.store
    real = store.put

    def put(key, data, **kw):
        if dn in key:
            (first if bytes(data) == b"1" * 8 else second).wait(30)
        return real(key, data, **kw)

    store.put = put
    s.save_tensor(dn, lambda: b"1" * 8, 8)
    s.add_record("Module.fc.Linear.parameters_grad", _rec(dn))
    s.save_tensor(dn, lambda: b"2" * 8, 8)
    s.remove_record("Module.fc.Linear.parameters_grad")
    s.add_record("Module.fc.Linear.parameters_grad", _rec(dn))
    first.set()
    time.sleep(0.2)  # the first write is published (or skipped: superseded), the second is held
    assert _journaled(tmp_path) == []
    second.set()
    _wait(lambda: len(_journaled(tmp_path)) == 2)
    s.publish(final=True)
    assert (tmp_path / "step0" / "rank" / "dump_tensor_data" / dn).read_bytes() == b"2" * 8
    assert s.errors == []
    s.close()


@pytest.mark.parametrize("task", ["statistics"])
def test_statistics_path_holds_nothing(tmp_path, task):
    s = _session(tmp_path, task)
    for i in range(5):
        s.add_record(f"Functional.op{i}.0.forward", _rec(None))
        assert len(_journaled(tmp_path)) == i + 1  # journaled at once, in the calling thread
        assert not s._held and not s._inflight
    assert s._writer is None  # no writer was started
    s.close()
