"""open_store: URL forms, option checking, missing extras, redaction, lazy imports."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from msprobe.backends import FsspecStore, LocalStore, open_store, redact_options
from msprobe.errors import ConfigError, MissingDependencyError, StorageNotFoundError


def test_memory_and_passthrough(tmp_path) -> None:
    mem = open_store("memory://open-test/x")
    assert isinstance(mem, FsspecStore) and mem.url == "memory://open-test/x"
    local = open_store(tmp_path)
    assert isinstance(local, LocalStore)
    assert open_store(local) is local
    with pytest.raises(ConfigError):
        open_store(local, {"key": "k"})


def test_storage_options_rejected_for_local_paths(tmp_path) -> None:
    with pytest.raises(ConfigError, match="not used for the local path") as info:
        open_store(tmp_path, {"secret": "hunter2-secret"})
    assert "hunter2-secret" not in str(info.value)
    with pytest.raises(ConfigError):
        open_store(f"file://{tmp_path}", {"anon": True})


def test_unknown_protocol() -> None:
    with pytest.raises(MissingDependencyError, match=r"pip install 'msprobe-lake\[s3\]'"):
        open_store("nosuchproto://bucket/x")
    with pytest.raises(ImportError):  # MissingDependencyError is an ImportError too
        open_store("nosuchproto://bucket/x")


def _without(package: str, body: str) -> subprocess.CompletedProcess:
    """Run ``body`` in a fresh interpreter where ``package`` cannot be imported (installed or not)."""
    code = f"import sys\nsys.modules[{package!r}] = None  # as if not installed\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("url, extra, package", [("gs://bucket/x", "gcs", "gcsfs"), ("az://container/x", "azure", "adlfs")])
def test_missing_package_names_extra(url: str, extra: str, package: str) -> None:
    out = _without(package, f"""
        from msprobe.backends import open_store
        from msprobe.errors import MissingDependencyError
        try:
            open_store({url!r})
        except MissingDependencyError as exc:
            print("OK", exc)
        """)
    assert out.stdout.startswith("OK") and f"pip install 'msprobe-lake[{extra}]'" in out.stdout, out.stderr


def test_missing_s3fs_names_s3_extra() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["s3fs"] = None  # as if not installed
        from msprobe.backends import open_store
        from msprobe.errors import MissingDependencyError
        try:
            open_store("s3://bucket/x", {"anon": True})
        except MissingDependencyError as exc:
            print("OK", exc)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("OK") and "msprobe-lake[s3]" in out.stdout, out.stderr


def test_unknown_s3_option_is_a_config_error() -> None:
    pytest.importorskip("s3fs")
    with pytest.raises(ConfigError, match="bogus_option") as info:
        open_store("s3://bucket/x", {"bogus_option": 1, "secret": "do-not-show-me"})
    assert "do-not-show-me" not in str(info.value)


def test_s3_session_options_pass() -> None:
    pytest.importorskip("s3fs")
    store = open_store("s3://bucket/x", {"profile": "default", "anon": True, "skip_instance_cache": True})
    assert store.url == "s3://bucket/x"


def test_known_protocol_without_its_package() -> None:
    out = _without("paramiko", """
        from msprobe.backends import open_store
        from msprobe.errors import MissingDependencyError
        try:
            open_store("sftp://host/path")
        except MissingDependencyError as exc:
            print("OK", exc)
        """)
    assert out.stdout.startswith("OK") and "sftp" in out.stdout, out.stderr


def test_redact_options() -> None:
    options = {
        "key": "AKIA123",
        "secret": "s3cr3t",
        "token": "tok",
        "anon": False,
        "client_kwargs": {"endpoint_url": "http://x", "aws_secret_access_key": "inner", "region_name": "r"},
        "config_kwargs": {"retries": {"max_attempts": 3}},
        "password": "pw",
        "credentials": {"a": 1},
    }
    red = redact_options(options)
    text = repr(red)
    for secret in ("AKIA123", "s3cr3t", "tok'", "inner", "pw"):
        assert secret not in text
    assert red["client_kwargs"]["endpoint_url"] == "http://x" and red["anon"] is False
    assert red["config_kwargs"] == {"retries": {"max_attempts": 3}}
    assert options["key"] == "AKIA123"  # the input is not modified


def test_create_false_on_missing_memory_prefix() -> None:
    with pytest.raises(StorageNotFoundError):
        open_store("memory://never-written-prefix", create=False)
    open_store("memory://written-prefix").put("k", b"1")
    assert open_store("memory://written-prefix", create=False).get("k") == b"1"


def test_import_is_light() -> None:
    code = (
        "import sys, msprobe.backends, msprobe.backends._writer, msprobe.backends._journal;"
        "heavy = [m for m in ('s3fs', 'botocore', 'aiobotocore', 'torch', 'pyarrow', 'zarr', 'dask')"
        " if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
