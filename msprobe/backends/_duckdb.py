"""DuckDB reading a store's objects itself: the httpfs extension set up with what the store's
S3 client resolved (:meth:`msprobe.backends.FsspecStore.duckdb_setup`). Imports neither duckdb
nor s3fs until asked."""
from __future__ import annotations

import logging
import os
import re
from typing import Any, Optional

__all__ = ["httpfs_file", "httpfs_setup", "s3_settings", "secret_sql"]

log = logging.getLogger("msprobe.lake")


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def httpfs_file(con: Any) -> Optional[str]:
    """The httpfs binary of the ``duckdb-extension-httpfs`` package built for this DuckDB
    (``extensions/<version>/httpfs.duckdb_extension``), or None: the package is not installed
    or was built for another DuckDB version (an extension loads only into its own version)."""
    try:
        import duckdb_extension_httpfs as pkg
    except ImportError:
        return None
    version = con.sql("PRAGMA version").fetchone()[0]
    path = os.path.join(os.path.dirname(pkg.__file__), "extensions", version, "httpfs.duckdb_extension")
    return path if os.path.isfile(path) else None


def _load_httpfs(con: Any) -> bool:
    """Load httpfs without downloading anything: the one installed in DuckDB's extension
    directory, else the binary of the ``duckdb-extension-httpfs`` package (loaded from where
    it lies, nothing is copied into the user's home)."""
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    try:
        con.execute("LOAD httpfs")
        return True
    except Exception:  # noqa: BLE001 - not in the extension directory
        pass
    path = httpfs_file(con)
    if path is None:
        return False
    try:
        con.execute(f"LOAD {_quote(path)}")
    except Exception:  # noqa: BLE001 - unsigned or incompatible: the caller falls back to pyarrow
        return False
    return True


def s3_settings(store: Any) -> dict:
    """What the S3 file system of ``store`` (s3fs) resolved through botocore: ``endpoint``
    (``AWS_ENDPOINT_URL``, ``endpoint_url`` options, the config file...), ``region``, and the
    credentials of its chain (options, environment, profile, instance role...), as the
    :class:`dict` ``{key, secret, token, endpoint, region, anon}``. The same settings the
    lake's listings and reads use, so DuckDB reads what s3fs reads."""
    from fsspec.asyn import sync

    filesystem, root = store.fsspec_location("") or (None, "")
    if filesystem is None:
        raise ValueError(f"{store.url}: not an fsspec file system, no S3 settings")
    bucket = (root or "").split("/", 1)[0] or None

    async def resolve() -> dict:
        client = await filesystem.get_s3(bucket) if hasattr(filesystem, "get_s3") else await filesystem.set_session()
        out = {"endpoint": client.meta.endpoint_url, "region": client.meta.region_name,
               "anon": bool(getattr(filesystem, "anon", False)), "key": None, "secret": None, "token": None}
        if not out["anon"]:
            out.update(await _credentials(filesystem))
        return out

    return sync(filesystem.loop, resolve)


async def _credentials(filesystem: Any) -> dict:
    """The credentials s3fs's client signs with, as botocore chooses them: the key and secret
    given (``key``/``secret``/``token`` options or ``client_kwargs``), else the session's chain
    (environment, profile, instance role...); {} when there are none."""
    import inspect

    given = getattr(filesystem, "client_kwargs", None) or {}
    key = getattr(filesystem, "key", None) or given.get("aws_access_key_id")
    secret = getattr(filesystem, "secret", None) or given.get("aws_secret_access_key")
    if key is not None and secret is not None:
        token = getattr(filesystem, "token", None) or given.get("aws_session_token")
        return {"key": key, "secret": secret, "token": token}
    session = getattr(filesystem, "session", None)
    chain = await session.get_credentials() if session is not None else None
    if chain is None:
        return {}
    frozen = chain.get_frozen_credentials()
    if inspect.isawaitable(frozen):
        frozen = await frozen
    return {"key": frozen.access_key, "secret": frozen.secret_key, "token": frozen.token}


def secret_sql(settings: dict) -> str:
    """``CREATE SECRET`` for DuckDB's httpfs from :func:`s3_settings`."""
    parts = ["TYPE s3"]
    if settings.get("key") and not settings.get("anon"):
        parts.append(f"KEY_ID {_quote(settings['key'])}")
        parts.append(f"SECRET {_quote(settings.get('secret') or '')}")
        if settings.get("token"):
            parts.append(f"SESSION_TOKEN {_quote(settings['token'])}")
    if settings.get("region"):
        parts.append(f"REGION {_quote(settings['region'])}")
    endpoint = settings.get("endpoint") or ""
    scheme, _, host = endpoint.partition("://")
    host = host.rstrip("/")
    if host and not re.fullmatch(r"s3[.-]([a-z0-9-]+[.])?amazonaws[.]com(\.cn)?", host.split("/", 1)[0]):
        # any endpoint but AWS's own: path-style URLs (MinIO, Ceph, moto... have no bucket hostnames)
        parts.append(f"ENDPOINT {_quote(host)}")
        parts.append("URL_STYLE 'path'")
        parts.append(f"USE_SSL {'true' if scheme == 'https' else 'false'}")
    return f"CREATE OR REPLACE SECRET msprobe_lake_s3 ({', '.join(parts)})"


def httpfs_setup(con: Any, store: Any) -> bool:
    """Load DuckDB's httpfs extension (installed beforehand; nothing is downloaded here) and
    give it the endpoint and credentials the store's s3fs resolved; False when it is not there
    or the settings cannot be resolved (the caller reads through pyarrow then)."""
    if store.fsspec_location("") is None or not _load_httpfs(con):
        return False
    try:
        settings = s3_settings(store)
    except Exception as exc:  # noqa: BLE001 - no client: the pyarrow route reports the cause
        log.debug("lake: S3 settings not resolved (%s); reading through pyarrow", exc)
        return False
    try:
        con.execute(secret_sql(settings))
    except Exception as exc:  # noqa: BLE001
        log.debug("lake: DuckDB refused the S3 secret (%s); reading through pyarrow", exc)
        return False
    return True
