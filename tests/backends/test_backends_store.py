"""The shipped Store suite (:class:`msprobe.testing.StoreTests`), run against every backend
msprobe ships: local directories, NFS-style shared directories, fsspec's memory:// and S3
(moto). tests/backends/test_backends_counting.py runs it on a backend written only there."""
from __future__ import annotations

import io
import uuid

import numpy as np
import pytest

from msprobe.backends import (
    LocalStore,
    Store,
    open_store,
)
from msprobe.errors import (
    StorageError,
    StorageNotFoundError,
)
from msprobe.testing import StoreTests
from tests.conftest_s3 import s3_storage_options


class TestLocalStore(StoreTests):
    @pytest.fixture
    def store(self, tmp_path) -> Store:
        return open_store(tmp_path / "root")

    @pytest.fixture
    def other(self, store: Store) -> Store:
        return LocalStore(store.local_path())

    def reopen(self, store: Store, *, read_only: bool) -> Store:
        return LocalStore(store.local_path(), read_only=read_only)

    def test_is_local(self, store: Store) -> None:
        assert store.is_local and store.local_path("a/b").endswith("a/b")
        assert store.url.startswith("file://")


class TestSharedDirStore(StoreTests):
    """An NFS-style shared directory: opened by URL, two independent handles."""

    @pytest.fixture
    def store(self, tmp_path) -> Store:
        shared = tmp_path / "shared"
        shared.mkdir()
        return open_store(f"file://{shared}", create=False)

    @pytest.fixture
    def other(self, store: Store) -> Store:
        return open_store(store.url, create=False)

    def reopen(self, store: Store, *, read_only: bool) -> Store:
        return open_store(store.url, read_only=read_only)


class TestMemoryStore(StoreTests):
    @pytest.fixture
    def store(self) -> Store:
        name = f"memory://test-{uuid.uuid4().hex}"
        store = open_store(name)
        yield store
        store.fs.rm(store.root, recursive=True) if store.list_dir() else None

    @pytest.fixture
    def other(self, store: Store) -> Store:
        return open_store(store.url)

    def reopen(self, store: Store, *, read_only: bool) -> Store:
        return open_store(store.url, read_only=read_only)

    def test_not_local(self, store: Store) -> None:
        assert not store.is_local and store.local_path("a") is None


@pytest.mark.s3
class TestS3Store(StoreTests):
    """s3fs against a real S3 server (moto) on 127.0.0.1."""

    writer_objects = 16

    @pytest.fixture
    def store(self, s3_bucket_url: str, s3_server: str) -> Store:
        return open_store(f"{s3_bucket_url}/root", s3_storage_options(s3_server))

    @pytest.fixture
    def other(self, store: Store, s3_server: str) -> Store:
        return open_store(store.url, s3_storage_options(s3_server))

    def reopen(self, store: Store, *, read_only: bool) -> Store:
        endpoint = store.fs.client_kwargs["endpoint_url"]
        return open_store(store.url, s3_storage_options(endpoint), read_only=read_only)

    def test_handles_do_not_share_instances(self, store: Store, other: Store) -> None:
        assert store.fs is not other.fs

    def test_multipart_put_stream(self, s3_bucket_url: str, s3_server: str) -> None:
        """> 10 MB through put_stream with 5 MB blocks: a real multipart upload."""
        store = open_store(s3_bucket_url, s3_storage_options(s3_server, default_block_size=5 * 2**20))
        payload = np.random.default_rng(1).bytes(11 * 2**20 + 123)
        assert store.put_stream("big/tensor.bin", io.BytesIO(payload)) == len(payload)
        etag = store.fs.info(f"{store.root}/big/tensor.bin")["ETag"].strip('"')
        assert etag.endswith("-3")  # S3's mark of an object completed from 3 parts
        assert store.get("big/tensor.bin") == payload
        assert store.get_range("big/tensor.bin", 5 * 2**20 - 3, 5 * 2**20 + 3) == payload[5 * 2**20 - 3 : 5 * 2**20 + 3]

    def test_multipart_abort_publishes_nothing(self, s3_bucket_url: str, s3_server: str) -> None:
        store = open_store(s3_bucket_url, s3_storage_options(s3_server, default_block_size=5 * 2**20))

        class Dies(io.RawIOBase):
            sent = 0

            def readable(self) -> bool:
                return True

            def readinto(self, b: bytearray) -> int:  # type: ignore[override]
                if self.sent >= 12 * 2**20:
                    raise OSError("producer died")
                b[:] = b"z" * len(b)
                self.sent += len(b)
                return len(b)

        with pytest.raises(StorageError):
            store.put_stream("big/partial.bin", Dies())
        assert not store.exists("big/partial.bin")
        bucket = s3_bucket_url[len("s3://"):]
        uploads = store.fs.call_s3("list_multipart_uploads", Bucket=bucket).get("Uploads", [])
        assert uploads == []  # aborted, not left dangling

    def test_secrets_never_shown(self, s3_bucket_url: str, s3_server: str) -> None:
        options = s3_storage_options(s3_server)
        options.update(key="AKIAMSPROBESECRETID", secret="msprobe-very-secret-value")
        store = open_store(f"{s3_bucket_url}/root", options)
        assert "secret" not in repr(store).lower() and "AKIA" not in store.url
        with pytest.raises(StorageNotFoundError) as info:
            store.get("missing")
        text = f"{info.value} {info.value!r}"
        assert "msprobe-very-secret-value" not in text and "AKIAMSPROBESECRETID" not in text
