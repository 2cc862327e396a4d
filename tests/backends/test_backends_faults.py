"""Fault injection against a real S3 server: a proxy drops, delays and fails requests."""
from __future__ import annotations

import hashlib
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from msprobe.backends import BackgroundWriter, claim_run_dir, open_store
from msprobe.errors import StorageNotFoundError, StoragePermissionError
from tests.conftest_s3 import FAULT_KINDS, s3_etags, s3_storage_options

pytestmark = pytest.mark.s3


def faulty_store(url: str, proxy):
    """A store talking through the proxy, with the client's own retries turned off
    so that every fault reaches msprobe's retry layer."""
    options = s3_storage_options(
        proxy.endpoint,
        config_kwargs={"read_timeout": 0.4, "connect_timeout": 1, "retries": {"total_max_attempts": 1}},
    )
    store = open_store(url, options)
    store.fs.retries = 1  # s3fs: one attempt per call
    return store


def payloads(n: int, seed: int = 0) -> dict[str, bytes]:
    rng = np.random.default_rng(seed)
    return {f"rank{i % 4}/dump_tensor_data/t{i}.pt": rng.bytes(int(rng.integers(64, 4096))) for i in range(n)}


def verify_all(store, data: dict[str, bytes], *, sample_every: int = 10) -> None:
    """Every object: its server-side MD5 (ETag) equals the MD5 of what was submitted,
    and nothing else is there. One in ``sample_every``: read back in full, CRC32 compared.
    (Reading all 1,000 back through moto costs ~20 s; the ETags cover every byte.)"""
    etags = s3_etags(store.fs, store.root)
    assert etags == {k: hashlib.md5(v).hexdigest() for k, v in data.items()}
    sample = list(data)[::sample_every]
    with ThreadPoolExecutor(8) as pool:
        crcs = dict(zip(sample, pool.map(lambda k: zlib.crc32(store.get(k)), sample)))
    assert crcs == {k: zlib.crc32(data[k]) for k in sample}


def test_thousand_objects_through_faults(s3_bucket_url, s3_server, s3_fault_proxy) -> None:
    """~10% of requests fail (500, 503, resets before/after the server, timeouts):
    1,000 objects written through BackgroundWriter, none lost or corrupted."""
    proxy = s3_fault_proxy
    proxy.rate, proxy.hold = 0.10, 0.6
    store = faulty_store(f"{s3_bucket_url}/run", proxy)
    data = payloads(1000)
    with BackgroundWriter(
        store, workers=8, retries=10, backoff=(0.005, 0.05), error_log_key="rank0/dump_error_info.log"
    ) as w:
        for key, body in data.items():
            w.submit(key, body)
    clean = open_store(f"{s3_bucket_url}/run", s3_storage_options(s3_server))  # no proxy
    verify_all(clean, data)  # nothing lost or corrupted, nothing extra (no error log)
    stats = w.stats
    assert stats.failures == 0 and stats.objects_written == 1000
    assert proxy.faults >= 50 and all(proxy.counts[k] > 0 for k in FAULT_KINDS), proxy.counts
    assert stats.retries >= proxy.faults // 2  # our layer did (most of) the retrying


def test_exclusive_writes_survive_lost_responses(s3_bucket_url, s3_server, s3_fault_proxy) -> None:
    """overwrite=False + a response lost after the server stored the object: the retry
    finds the object, sees it is ours, and does not report a conflict."""
    proxy = s3_fault_proxy
    proxy.rate, proxy.kinds = 0.3, ("reset_after", "500", "reset_before")
    store = faulty_store(f"{s3_bucket_url}/x", proxy)
    data = payloads(100, seed=1)
    with BackgroundWriter(store, workers=4, retries=12, backoff=(0.002, 0.02), overwrite=False) as w:
        for key, body in data.items():
            w.submit(key, body)
    assert w.stats.failures == 0 and proxy.counts["reset_after"] > 3
    verify_all(open_store(f"{s3_bucket_url}/x", s3_storage_options(s3_server)), data, sample_every=5)


def test_claim_and_journal_through_faults(s3_bucket_url, s3_server, s3_fault_proxy) -> None:
    proxy = s3_fault_proxy
    proxy.rate, proxy.kinds = 0.25, ("reset_after", "503")
    store = faulty_store(s3_bucket_url, proxy)
    from msprobe.backends import RetryPolicy, read_journal

    policy = RetryPolicy(retries=12, backoff_base=0.002, backoff_max=0.02)
    assert claim_run_dir(store, "dump", retry_policy=policy) == "dump"
    j = store.journal("dump/rank0/journal", retry_policy=policy)
    for i in range(30):
        j.append(f'{{"seq": {i}}}'.encode())
        if i % 5 == 4:
            j.flush()
    j.close()
    proxy.rate = 0.0
    clean = open_store(s3_bucket_url, s3_storage_options(s3_server))
    assert list(read_journal(clean, "dump/rank0/journal")) == [f'{{"seq": {i}}}'.encode() for i in range(30)]
    with pytest.raises(StoragePermissionError):
        claim_run_dir(clean, "dump")


def test_permanent_403_is_reported_and_logged(s3_bucket_url, s3_server, s3_fault_proxy) -> None:
    proxy = s3_fault_proxy
    proxy.deny = __import__("re").compile(r"/forbidden/")
    store = faulty_store(f"{s3_bucket_url}/run", proxy)
    w = BackgroundWriter(store, retries=5, backoff=(0.2, 0.5), error_log_key="rank0/dump_error_info.log")
    for i in range(10):
        w.submit(f"rank0/ok{i}.pt", b"fine")
    for i in range(3):
        w.submit(f"rank0/forbidden/t{i}.pt", b"denied")
    with pytest.raises(StoragePermissionError) as info:
        w.close()
    assert sorted(info.value.failures) == [f"rank0/forbidden/t{i}.pt" for i in range(3)]
    # 403 is never retried: each denied object reached the server once (w.stats.retries is not
    # asserted: on a loaded machine an allowed write may time out once and be retried, rightly)
    assert proxy.counts["deny"] == 3
    clean = open_store(f"{s3_bucket_url}/run", s3_storage_options(s3_server))
    log = clean.get("rank0/dump_error_info.log").decode()
    for i in range(3):
        assert f"rank0/forbidden/t{i}.pt\tStoragePermissionError" in log
    assert "testing" not in log  # no credentials in the log
    assert clean.list_prefix("rank0") == sorted(
        [f"rank0/ok{i}.pt" for i in range(10)] + ["rank0/dump_error_info.log"]
    )


def test_missing_bucket_fails_fast(s3_server) -> None:
    store = open_store("s3://no-such-bucket-msprobe/run", s3_storage_options(s3_server))
    w = BackgroundWriter(store, retries=5, backoff=(0.5, 1.0), error_log_key="rank0/dump_error_info.log")
    w.submit("rank0/t.pt", b"x")
    with pytest.raises(StorageNotFoundError, match="rank0/t.pt"):
        w.close()
    assert w.stats.retries == 0
