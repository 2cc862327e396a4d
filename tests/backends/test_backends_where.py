"""Where a path or URL is (msprobe.backends._where): the answers callers used to read from a
URL's text themselves, a registered protocol included."""
from __future__ import annotations

import os

import pytest

from msprobe.backends import (
    join_location,
    local_path_of,
    open_store,
    register_store,
    shares_options,
    upload_files,
    url_path,
)
from tests.backends.test_backends_counting import CountingStore

OBJECTS: dict = {}
register_store("wherecount", lambda url, options, *, read_only, create: CountingStore(
    OBJECTS, url.split("://", 1)[1].strip("/"), read_only=read_only))


@pytest.mark.parametrize(("location", "local"), [
    ("run/a", "run/a"), ("/abs/run", "/abs/run"), ("file:///abs/run", "/abs/run"), ("local://rel/x", "rel/x"),
    ("s3://bucket/run", None), ("memory://x", None), ("simplecache::s3://bucket/x", None),
    ("wherecount://a/b", None),
])
def test_local_path_of(location, local):
    assert local_path_of(location) == local


def test_local_path_of_takes_a_pathlike(tmp_path):
    assert local_path_of(tmp_path) == str(tmp_path)


def test_shares_options():
    assert shares_options("s3://b/lake", "s3://a/root")
    assert not shares_options("gs://b/lake", "s3://a/root")
    assert not shares_options("/tmp/lake", "/data/root")  # local paths take no options
    assert shares_options("wherecount://own", "wherecount://root")


def test_url_path_and_join_location():
    assert url_path("s3://bucket/a/run1/") == "bucket/a/run1"
    assert url_path("./runs/run1") == "./runs/run1"
    assert join_location("out", "x.csv") == os.path.join("out", "x.csv")
    assert join_location("s3://bucket/out/", "x.csv") == "s3://bucket/out/x.csv"
    assert join_location("wherecount://o", "x.csv") == "wherecount://o/x.csv"


def test_upload_files_into_a_registered_store(tmp_path):
    (tmp_path / "a.csv").write_bytes(b"1,2\n")
    assert upload_files("wherecount://up", str(tmp_path), ["a.csv"], None) == ["wherecount://up/a.csv"]
    assert open_store("wherecount://up").get("a.csv") == b"1,2\n"
