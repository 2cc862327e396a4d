"""8 real processes start one dump into the same directory at the same instant (issue 19,
item 5). run_dir_policy "refuse": exactly one gets the directory (exclusive create locally, a
conditional put on the S3 server), the others are refused. Default "overwrite": when the
processes' tensor files end up mixed, validate says so (marker digests), checked against an
independent oracle: the statistics in dump.json against the tensors in the files."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from tests.conftest_s3 import s3_storage_options  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_train_child.py")
N = 8


def _race(url, opts, extra, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    # torch is imported before the fork (seconds): the processes start at a wall-clock time after it
    p = subprocess.Popen([sys.executable, CHILD, "--race", str(N), "0", out_dir, url, "tensor", "1",
                          json.dumps(opts), json.dumps(extra)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
    out, err = p.communicate(timeout=600)
    rcs = {int(i): int(c) for _, i, c in (ln.split() for ln in out.splitlines() if ln.startswith("RC "))}
    assert sorted(rcs) == list(range(N)), (out, err[-2000:])
    return rcs


def _mismatches(store, prefix):
    """Tensor files whose content disagrees with the statistics of their record (the oracle)."""
    import io

    from msprobe.format.model import Record

    data = json.loads(store.get(f"{prefix}/dump.json"))["data"]
    bad = 0
    for name, raw in data.items():
        for t in Record(name, raw).tensors():
            entry = t.raw if hasattr(t, "raw") else None
            tensor = torch.load(io.BytesIO(store.get(f"{prefix}/dump_tensor_data/{t.data_name}")), weights_only=True)
            want = (entry or {}).get("Max")
            if want is not None and tensor.numel() and tensor.dtype.is_floating_point:
                bad += abs(float(tensor.max()) - float(want)) > 1e-6 * max(1.0, abs(float(want)))
    return bad


@pytest.mark.parametrize("where", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_refuse_claims_the_rank_dir_atomically(where, tmp_path, request, figures):
    from msprobe.backends import open_store
    from msprobe.readers.validate import validate_store

    if where == "local":
        url, opts, ropts = str(tmp_path / "d"), {}, None
    else:
        server = request.getfixturevalue("s3_server")
        url = f"{request.getfixturevalue('s3_bucket_url')}/race"
        opts, ropts = s3_storage_options(server, picklable=True), s3_storage_options(server)
    rcs = _race(url, opts, {"run_dir_policy": "refuse", "iters": 2}, str(tmp_path / "out"))
    won = [i for i, c in rcs.items() if c == 0]
    refused = [i for i, c in rcs.items() if c == 3]
    assert len(won) == 1 and len(refused) == N - 1, rcs
    for i in refused:
        assert "already holds a dump of another run" in (tmp_path / "out" / f"proc{i}.out").read_text()
    store = open_store(url, storage_options=ropts, read_only=True)
    report = validate_store(store)
    assert report.ok, [str(p) for p in report.errors][:5]
    assert _mismatches(store, "step0/rank") == 0
    figures[f"8 processes, run_dir_policy=refuse, {where}"] = {"won": len(won), "refused": len(refused)}


def test_overwrite_mixed_files_are_detected(tmp_path, figures):
    from msprobe.backends import open_store
    from msprobe.readers.validate import validate_store

    tries, mixed_seen = 0, 0
    while tries < 3 and not mixed_seen:
        tries += 1
        url = str(tmp_path / f"d{tries}")
        rcs = _race(url, {}, {"iters": 2}, str(tmp_path / f"out{tries}"))
        assert set(rcs.values()) == {0}, rcs
        store = open_store(url, read_only=True)
        bad = _mismatches(store, "step0/rank")
        report = validate_store(store)
        flagged = [p for p in report.errors if "another run" in p.message or "different runs" in p.message]
        assert bool(flagged) == (not report.ok)
        if bad:
            mixed_seen += 1
            assert flagged, "files disagree with their records and validate passes"
        figures.setdefault("8 processes, run_dir_policy=overwrite, local", []).append(
            {"files_disagreeing_with_records": bad, "validate_errors": len(flagged)})
    assert mixed_seen, "8 processes never overlapped in 3 tries"
