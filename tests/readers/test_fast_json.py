"""dump.json through orjson gives exactly json.loads' objects (NaN/Infinity tokens included), or
json.loads decides (msprobe.format.fastjson.loads_json_bytes)."""
from __future__ import annotations

import json
import math
import random

import pytest

from msprobe.format.fastjson import _orjson_loads, loads_json_bytes


def _same(a, b) -> bool:
    """Equal values of equal types, NaN equal to NaN, and dict keys in the same order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


def _json_answer(data: bytes):
    try:
        return "ok", json.loads(data)
    except (ValueError, RecursionError) as exc:
        return "error", type(exc)


def _ours(data: bytes):
    try:
        return "ok", loads_json_bytes(data)
    except (ValueError, RecursionError) as exc:
        return "error", type(exc)


TRICKY = [
    b'{"a": NaN, "b": Infinity, "c": -Infinity, "d": [NaN, -Infinity, 1.5]}',
    b'{"name": "NaN", "x": NaN}',                        # a token inside a string, beside a bare one
    b'{"name": "a NaN b -Infinity", "x": 1}',           # tokens inside strings only
    b'{"k\\"NaN": NaN}',                                 # after an escaped quote
    b'{"s": "\\u0000N", "x": NaN}',                      # a string that looks like a stand-in
    b'{"s": "\\u0000N"}',
    b'{NaN: 1}',                                         # a bare token as a key: not JSON
    b'{"a": NaNa}', b'{"a": -NaN}', b'{"a": --Infinity}', b'[Infinityx]',
    b'{"big": 123456789012345678901234567890, "x": NaN}',  # beyond 64 bits: json keeps the int
    b'{"big": -9223372036854775809}', b'{"u": 18446744073709551615}',
    b'{"f": 0.0001293263998358413, "g": 1e-400, "h": 1E5, "i": -0.0, "j": 1.0000000000000002}',
    b'{"f": 1e999}', b'{"a": 1, "a": 2}',
    b'{"a": 12345678901234567890, "b": 1234567890123456789012.5, "c": [0.00000000000000000001234, NaN]}',
    b'[1e0000000000000000000005, 0.1000000000000000055511151231257827, 98765432109876543210987]',
    b'123456789012345678901',
    b'{"s": "\\ud800"}',                                # a lone surrogate: json keeps it
    b'"NaN"', b'NaN', b'[1, 2', b'{"a": 1}  ', b'\n{"a": [ ]}\n',
    '{"a": "\u00e9"}'.encode("utf-16"),                 # UTF-16: json.loads detects it
    b'[' * 3000 + b']' * 3000,                           # deeper than either parser goes
    b'{"x": ' + b'[' * 200 + b'NaN' + b']' * 200 + b'}',
]


@pytest.mark.parametrize("data", TRICKY, ids=range(len(TRICKY)))
def test_same_objects_or_the_same_error_as_json(data):
    want, got = _json_answer(data), _ours(data)
    assert want[0] == got[0]
    assert _same(want[1], got[1]) if want[0] == "ok" else want[1] == got[1]


def test_random_dump_documents_parse_to_the_same_objects():
    rng = random.Random(5)
    odd = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 5e-324, 1e308, 2 ** 63, -(2 ** 63), 10 ** 30,
           "NaN", "Infinity", "x\"y", "\u00e9", True, None]
    for _ in range(30):
        data = {}
        for i in range(rng.randrange(1, 60)):
            leaf = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [rng.randrange(9), 3],
                    "Max": rng.choice(odd + [rng.uniform(-1e6, 1e6)] * 8), "Min": rng.uniform(-1, 1) * 10 ** rng.randrange(-320, 300),
                    "Mean": rng.choice(odd + [rng.random()] * 8), "Norm": rng.random(), "requires_grad": rng.random() < .5}
            data[f"Torch.op{i}.{i}.forward"] = {"input_args": [leaf, {"type": "int", "value": rng.randrange(-9, 9)}],
                                                "output": [dict(leaf)]}
        text = json.dumps({"task": "statistics", "data": data}, indent=rng.choice([None, 1])).encode()
        assert _same(json.loads(text), loads_json_bytes(text))


def test_orjson_takes_documents_with_nonfinite_tokens():
    """The fast path is really taken for a dump with NaN/Infinity (not a silent fallback)."""
    pytest.importorskip("orjson")
    text = json.dumps({"data": {"r": {"Max": float("nan"), "Min": -float("inf"), "v": [float("inf"), 1]}}}).encode()
    got = _orjson_loads(text)
    assert got is not None and _same(got, json.loads(text))
    assert got["data"]["r"]["Max"] is json.loads(text)["data"]["r"]["Max"]  # json's own NaN object
    assert _orjson_loads(b'{"big": 123456789012345678901234567890}') is None
    assert _orjson_loads(b'{"tiny": 0.00000000000000000001234, "wide": 1234567890123456789012.5}') is not None
    assert _orjson_loads(b'{"s": "\\u0000N", "x": NaN}') is None


LONG_INTEGERS = [
    b'12345678901234567890', b'-12345678901234567890', b'[12345678901234567890]', b'[1,12345678901234567890]',
    b'{"a":12345678901234567890}', b'{"a" :\t12345678901234567890}', b'[\n12345678901234567890\r]',
    b'{"s": "x 12345678901234567890", "n": NaN}',       # in a string after a space: json.loads decides
    b'{"s": "x12345678901234567890"}',                  # in a string after a letter: no integer
    b'[1.12345678901234567890, 0.000000000000000000001]',  # fractions
    b'[12345678901234567890.5, 12345678901234567890e3, 12345678901234567890E-3]',
    b'[1e12345678901234567890, 1e+12345678901234567890, 1e-12345678901234567890]',  # exponents
    b'[9223372036854775807, 18446744073709551615, 1844674407370955161]',
]


@pytest.mark.parametrize("data", LONG_INTEGERS, ids=range(len(LONG_INTEGERS)))
def test_long_integers_parse_as_json_does(data):
    want, got = _json_answer(data), _ours(data)
    assert want[0] == got[0]
    assert _same(want[1], got[1]) if want[0] == "ok" else want[1] == got[1]


def _counting_stand_in_writes(monkeypatch) -> list:
    """Counts the orjson writes of containers looking for stand-ins (the slow search) of the Python
    code (the C scans of msprobe/format/_leafwalk.c walk every container instead: set aside here)."""
    from msprobe.format import fastjson

    monkeypatch.setattr(fastjson, "leafwalk", lambda: None)
    calls: list = []
    real = fastjson._holds_stand_in
    monkeypatch.setattr(fastjson, "_holds_stand_in", lambda obj: calls.append(1) or real(obj))
    return calls


def test_records_holding_nonfinite_tokens_are_found_by_their_keys(monkeypatch):
    """The records that hold a NaN/Infinity are found from the tokens' positions and the records'
    keys in the text: no record is written out to look for stand-ins."""
    pytest.importorskip("orjson")
    calls = _counting_stand_in_writes(monkeypatch)
    data = {f"Torch.op{i}.{i}.forward": {"output": [{"type": "torch.Tensor", "Max": 1.5, "Min": 0.5}]}
            for i in range(500)}
    for i in (0, 7, 250, 499):
        data[f"Torch.op{i}.{i}.forward"]["output"][0]["Max"] = float(("nan", "inf", "-inf", "nan")[i % 4])
    for indent in (None, 1):
        text = json.dumps({"task": "statistics", "data": data}, indent=indent).encode()
        got = _orjson_loads(text)
        assert got is not None and _same(got, json.loads(text))
    assert calls == []


def test_a_key_met_inside_an_earlier_record_still_restores_every_token(monkeypatch):
    """A record's key text met first inside an earlier record (a nested key of the same name)
    makes the guess miss a stand-in: the count says so and every container is looked at."""
    pytest.importorskip("orjson")
    calls = _counting_stand_in_writes(monkeypatch)
    text = b'{"data": {"a": {"b": 1, "x": NaN, "y": [Infinity]}, "b": {"z": -Infinity}, "c": {"w": 2}}}'
    got = _orjson_loads(text)
    assert got is not None and _same(got, json.loads(text))
    assert calls  # the slow search ran
    text = b'{"data": {"r\\u00e9c": {"x": NaN}, "b": {"x": 1}}}'  # a key escaped otherwise than orjson writes it
    got = _orjson_loads(text)
    assert got is not None and _same(got, json.loads(text))


def test_the_decoder_is_the_format_layers():
    """The readers parse documents with the format layer's decoder; their raw I/O holds none of its own."""
    from pathlib import Path

    import msprobe.format
    import msprobe.format.fastjson
    import msprobe.readers._source as source

    assert source.loads_json_bytes is msprobe.format.fastjson.loads_json_bytes is msprobe.format.loads_json_bytes
    text = Path(source.__file__).read_text(encoding="utf-8")
    assert "orjson" not in text and "NaN" not in text.replace("NaN/Infinity", "")
