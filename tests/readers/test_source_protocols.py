"""The readers' source contracts (msprobe/readers/protocols.py) hold for every source there is:
a rank directory, an index file of an index-only lake, and the packets of an online run; and a
record made from each answers through the contract alone."""
from __future__ import annotations

import pytest
from readers_synth import torch_dump

import msprobe.readers as readers
from msprobe.readers.protocols import DumpSource, RecordSource


def _dump_and_lake(tmp_path) -> tuple:
    """A rank directory's dump and an index-only lake of it."""
    pytest.importorskip("pyarrow")
    from msprobe.readers.index import build_index

    root = tmp_path / "run"
    torch_dump(str(root), steps=(0,))
    lake = tmp_path / "lake"
    build_index(str(root), out=str(lake))
    return root, lake


def test_rank_and_index_sources_are_dump_sources(tmp_path):
    for path in _dump_and_lake(tmp_path):
        d = readers.open(str(path))
        assert d.sources, path
        for src in d.sources:
            assert isinstance(src, DumpSource) and isinstance(src, RecordSource), type(src)
        rec = next(iter(d.iter_records()))
        assert rec.source.raw_record(rec.name) is not None and isinstance(rec.source.url, str)


def test_packet_source_is_a_record_source():
    torch = pytest.importorskip("torch")
    from msprobe.dumpers.pytorch._encode import tensor_bytes
    from msprobe.online._source import PacketSource, packet_record
    from msprobe.online.packet import decode_packet, encode_packet

    a = torch.ones(3)
    name = "Torch.neg.0.forward"
    entry = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [3], "requires_grad": False,
             "data_name": f"{name}.input.0.pt"}
    header = {"v": 1, "kind": "api", "run": "r", "rank": 0, "step": 0, "seq": 0, "dropped": 0, "name": name,
              "record": {"input_args": [entry], "input_kwargs": {}, "output": []}}
    packet = decode_packet(encode_packet(header, [(f"{name}.input.0.pt", tensor_bytes(a))]))
    src = PacketSource([packet])
    assert isinstance(src, RecordSource) and not isinstance(src, DumpSource)
    rec = packet_record(packet, source=src)
    assert rec.name == name and rec.source is src and src.raw_record(name) == header["record"]


def test_release_drops_what_was_read(tmp_path):
    """DumpSource.release() (compare calls it between rank pairs): an index file's source releases
    the documents of the rank directory it read them from, as a rank directory's source does."""
    for path in _dump_and_lake(tmp_path):
        src = readers.open(str(path)).sources[0]
        rank = src.rank_source() if src.index_only else src
        assert src.document().data and rank.loaded
        src.release()
        assert not rank.loaded, path
        assert src.document().data  # read again on the next use
