"""stack.json's bytes made from each stack's JSON text kept per call site (the producer's publish) equal
the document encode_documents writes from the stack dict, and the publisher's table of texts is right
when the same lines come back under other ids and names."""
from __future__ import annotations

from msprobe.dumpers.session._documents import StackTable
from msprobe.format.documents import compact_json, encode_documents, encode_stack_entries

STACKS = {
    "0": [["Torch.add.0.forward", "Torch.add.0.backward"],
          ["File /x/train.py, line 3, in <module>, \n loss = model(x)", "File /x/m.py, line 9, in f, \n y = \"q\""]],
    "1": [["Tensor.__mul__.1.forward"], ["File /x/\u00e9t\u00e9.py, line 1, in g, \n z = '\u4e2d' \\ 2\t"]],
    "2": [[], []],
}


def _dict_layout(stack: dict) -> bytes:
    return dict(encode_documents({"data": {}}, debug=False, stack=stack, construct={}))["stack.json"]


def test_stack_entries_equal_the_dict_layout() -> None:
    for stack in (STACKS, {}, {"0": STACKS["0"]}, {"7": STACKS["1"], "10": STACKS["0"]}):
        entries = [(key, names, compact_json(lines)) for key, (names, lines) in stack.items()]
        assert encode_stack_entries(entries) == _dict_layout(stack)
        assert dict(encode_documents({"data": {}}, debug=False, stack=None, construct={},
                                     stack_bytes=encode_stack_entries(entries)))["stack.json"] == _dict_layout(stack)


def test_publisher_stack_bytes_equal_to_json_across_steps() -> None:
    from msprobe.dumpers.config import DumpConfig
    from msprobe.dumpers.session._publish import RankPublisher

    lines_of = {("a",): ["File a, line 1, in f, \n x"], ("b",): ["File b, line 2, in g, \n \"y\""], ("c",): []}
    publisher = RankPublisher(DumpConfig.__new__(DumpConfig), "pytorch", "msprobe-lake",
                              lambda frames: list(lines_of[frames]), storage=None, failures=None)  # type: ignore[arg-type]
    for order in ([("a",), ("b",), ("a",)], [("b",), ("c",), ("a",), ("b",)], [("c",)], []):  # steps: ids move
        table = StackTable()
        for i, frames in enumerate(order):
            table.add(f"Torch.op.{i}.forward", frames)
        want = _dict_layout(table.to_json(lambda frames: list(lines_of[frames])))
        assert publisher._stack_bytes(table) == want
