"""Storage credentials (key, secret, token in storage_options) never appear in what a dump
writes, in logs, in dump_error_info.log, in reprs or in error messages, error paths included."""
from __future__ import annotations

import logging
import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("s3fs")

from msprobe.backends import open_store  # noqa: E402
from msprobe.errors import MsprobeError  # noqa: E402
from msprobe.pytorch import PrecisionDebugger  # noqa: E402
from tests.conftest_s3 import s3_storage_options  # noqa: E402
from tests.reliability._model import train  # noqa: E402

pytestmark = [pytest.mark.s3, pytest.mark.usefixtures("fresh_debugger")]

KEY = "AKIAZZZDISTINCTKEY42"
SECRET = "sEcReT/ZZZdistinct+value/4242"
TOKEN = "TOKENzzzDistinct0123456789"
SECRETS = (KEY, SECRET, TOKEN)


def _opts(endpoint):
    return s3_storage_options(endpoint, key=KEY, secret=SECRET, token=TOKEN)


def _assert_clean(text, where):
    for s in SECRETS:
        assert s not in text, f"credential found in {where}"


def test_no_credentials_anywhere(s3_server, s3_bucket_url, s3_fault_proxy, caplog, capfd):
    caplog.set_level(logging.DEBUG, logger="msprobe")
    # tensor writes are denied (403): the error path writes dump_error_info.log and logs warnings
    s3_fault_proxy.deny = re.compile(r"dump_tensor_data/")
    url = f"{s3_bucket_url}/sec"
    dbg = PrecisionDebugger(task="tensor", level="mix", dump_path=url, storage_options=_opts(s3_fault_proxy.endpoint))
    train(dbg, steps=1, iters=1)
    texts = {"session errors": "\n".join(dbg.dumper.session.errors),
             "repr(config)": repr(dbg.config), "repr(store)": repr(dbg.dumper.session.store),
             "str(store)": str(dbg.dumper.session.store)}
    PrecisionDebugger._reset()
    # strict: the raised error
    dbg = PrecisionDebugger(task="tensor", level="mix", dump_path=f"{s3_bucket_url}/sec2", strict=True,
                            storage_options=_opts(s3_fault_proxy.endpoint))
    with pytest.raises(MsprobeError) as info:
        train(dbg, steps=1, iters=1)
    texts["strict error"] = str(info.value) + repr(info.value)
    PrecisionDebugger._reset()
    # a bad option and an unreachable endpoint: the errors of open_store
    for bad in ({"no_such_option": 1}, {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}}):
        try:
            store = open_store(f"{s3_bucket_url}/x", storage_options={**_opts(s3_server), **bad}, create=False)
            store.get("nothing")
        except Exception as exc:  # noqa: BLE001 - every error type is checked
            texts[f"error {bad}"] = f"{exc} {exc!r}"
    texts["log records"] = "\n".join(r.getMessage() for r in caplog.records)
    out, err = capfd.readouterr()
    texts["stdout/stderr"] = out + err
    assert any("dump_error_info" in t or "could not" in t for t in texts.values())
    for where, text in texts.items():
        _assert_clean(text, where)
    # every object written, documents and error log included
    store = open_store(s3_bucket_url, storage_options=s3_storage_options(s3_server), read_only=True)
    keys = store.list_prefix("")
    assert any(k.endswith("dump_error_info.log") for k in keys) and any(k.endswith("dump.json") for k in keys)
    for k in keys:
        _assert_clean(store.get(k).decode("utf-8", "replace"), k)
