"""Fuzz the JSON and name parsers and the tensor loaders (hypothesis, bounded): only
MsprobeError subclasses may escape."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from msprobe.errors import MsprobeError  # noqa: E402
from msprobe.format.documents import DumpDocument  # noqa: E402
from msprobe.format.naming import parse_data_name, parse_record_name  # noqa: E402
from msprobe.readers._tensor import load_tensor_file  # noqa: E402

FUZZ = settings(max_examples=200, deadline=2000, suppress_health_check=[HealthCheck.too_slow], derandomize=True)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=30)
names = st.one_of(
    st.text(max_size=80),
    st.from_regex(r"(Torch|Tensor|Functional|Module|Distributed|Aten)\.[a-z_.0-9]{0,20}\.(forward|backward)"
                  r"(\.(input|output|parameters_grad)(\.[0-9]{1,3}){0,3})?(\.pt|\.npy)?", fullmatch=True),
)


def _only_msprobe(fn, *args):
    try:
        fn(*args)
    except MsprobeError:
        pass


@FUZZ
@given(st.binary(max_size=300))
def test_document_loads_bytes(data):
    _only_msprobe(DumpDocument.loads, data)


@FUZZ
@given(json_values, st.dictionaries(names, json_values, max_size=4))
def test_document_loads_structures(top, data):
    doc = {"task": "tensor", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "data": data}
    if isinstance(top, dict):
        doc.update(top)
    _only_msprobe(DumpDocument.loads, json.dumps(doc))
    _only_msprobe(DumpDocument.loads, json.dumps(top))


@FUZZ
@given(names)
def test_name_parsers(name):
    _only_msprobe(parse_record_name, name)
    _only_msprobe(lambda n: parse_record_name(n, strict=False), name)
    _only_msprobe(parse_data_name, name)


def _npy(arr):
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from msprobe.backends import open_store

    try:  # imported here, not inside the first (timed) example
        import torch  # noqa: F401
    except ImportError:
        pass
    return open_store(str(tmp_path_factory.mktemp("fuzzstore")))


@FUZZ
@given(st.sampled_from(["x.pt", "x.npy", "x.bin", "x"]),
       st.one_of(st.binary(max_size=400), st.builds(lambda n: _npy(np.arange(n, dtype=np.float32)),
                                                    st.integers(0, 20))),
       st.sampled_from(["torch.float32", "torch.bfloat16", "torch.int64", "float16", "torch.bool", "nonsense", 5]),
       st.lists(st.integers(-3, 2 ** 62), max_size=4),
       st.integers(0, 50))
def test_tensor_loader(store, key, data, dtype, shape, flip):
    if data and flip < len(data):
        data = data[:flip] + bytes([data[flip] ^ 0xFF]) + data[flip + 1:]
    store.put(key, data)
    _only_msprobe(lambda: load_tensor_file(store, key, record="R", dtype=dtype, shape=tuple(shape)))
