"""Issue 28: the crash journal (spec/FORMAT.md 17) is encoded and decoded in msprobe.format.journal
only, so the reader of a live dump and ``msprobe recover`` of a killed one read the same records
from the same lines, by the spec's validity rules."""
from __future__ import annotations

import json

import msprobe.readers
from msprobe.backends import LocalStore
from msprobe.dumpers.recover import recover_store
from msprobe.format.journal import NO_PARENT, RecordLine, Replay, StackLine, decode_line, encode_record, encode_stack

T = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": 1.0, "Min": 0.0, "Mean": 0.5,
     "Norm": 1.0, "requires_grad": False}
REC = {"input_args": [T], "input_kwargs": {}, "output": [T]}
A, B = ["File a.py, line 1, in f, \n f()"], ["File b.py, line 2, in g, \n g()"]


def _write(root, lines):
    store = LocalStore(root)
    j = store.journal("step0/rank0/.journal")
    for line in lines:
        j.append(line if isinstance(line, bytes) else json.dumps(line).encode("utf-8"))
    j.close()
    return store


# lines on which the three parsers of before (reader, recover, spec/check) disagreed
EDGE = [
    {"stack_id": 0, "frames": A},  # an integer id, named as "0" below: one id (spec/check and the reader)
    {"name": "Functional.relu.0.forward"},  # no "record" key: neither form, ignored (spec 17)
    {"name": "Functional.relu.1.forward", "record": REC, "parent": None, "stack_id": "0"},
    {"name": "Functional.gelu.0.forward", "record": REC, "parent": None, "stack": A},
    # the second half of gelu.0 has another stack: it replaces the first one's (spec 17)
    {"name": "Functional.gelu.0.forward", "record": REC, "parent": None, "stack": B},
    [1, 2],  # not an object
    {"unknown": "ignored"},
]


def test_recover_and_reader_apply_the_spec_rules(tmp_path):
    root = str(tmp_path / "dump")
    store = _write(root, EDGE)
    live = msprobe.readers.open(root)
    names = [r.name for r in live.records()]
    assert names == ["Functional.relu.1.forward", "Functional.gelu.0.forward"], names
    [res] = recover_store(store, "")
    assert res.written and res.records == 2, res.summary()
    doc = json.loads(store.get("step0/rank0/dump.json"))
    assert list(doc["data"]) == names  # the record without "record" is not replayed as null
    stack = json.loads(store.get("step0/rank0/stack.json"))
    # relu.1 found its frames through the integer stack id; gelu.0 is listed once, with its last stack
    assert stack == {"0": [["Functional.relu.1.forward"], A], "1": [["Functional.gelu.0.forward"], B]}, stack
    assert json.loads(store.get("step0/rank0/construct.json")) == dict.fromkeys(names)
    for name in ("dump.json", "stack.json", "construct.json"):  # recovery writes indent=1 (spec 8.4)
        raw = store.get(f"step0/rank0/{name}")
        assert raw == json.dumps(json.loads(raw), indent=1).encode(), name


def test_encode_decode_round_trip():
    line = encode_record("Functional.relu.0.forward", REC, parent=None, stack_id=3)
    assert line == json.dumps({"name": "Functional.relu.0.forward", "record": REC, "parent": None,
                               "stack_id": 3}).encode()
    assert decode_line(line) == RecordLine("Functional.relu.0.forward", REC, None, None, "3")
    bare = decode_line(encode_record("x", 1))
    assert isinstance(bare, RecordLine) and bare.parent is NO_PARENT and not bare.has_parent
    assert decode_line(encode_stack(3, A)) == StackLine("3", A)
    for ignored in (b'{"name": "x"', b"[1]", b'{"frames": "nope"}', b'{"name": 5, "record": 1}', b"\xff",
                    b"[" * 100_000 + b"]" * 100_000):
        assert decode_line(ignored) is None, ignored


def test_replay_keeps_the_first_position():
    lines = [encode_record("a", 1, parent=None), encode_record("b", 2), encode_record("a", 3, parent="b")]
    r = Replay.of(lines)
    assert r.records == {"a": 3, "b": 2} and list(r.records) == ["a", "b"] and r.parents == {"a": "b"}
