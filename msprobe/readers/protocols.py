"""The contracts of the readers' sources, as types.

A *record source* is where a :class:`~msprobe.readers.DumpRecord` takes its raw record,
its stack frames, its parent and its tensors' keys from: one rank directory of a dump
(:class:`~msprobe.readers._source.RankSource`), one index file of an index-only lake
(:class:`~msprobe.readers._source.IndexSource`), or the packets of an online run
(:class:`msprobe.online._source.PacketSource`). A *dump source* is a record source that is
a whole rank directory: its documents, its index and its tensor store. Both are structural
(``typing.Protocol``): a new source needs these members, not a base class.
"""
from __future__ import annotations

from typing import Any, Optional, Protocol, runtime_checkable

from msprobe.format.documents import ConstructDocument, DumpDocument, StackDocument

__all__ = ["RecordSource", "DumpSource"]


@runtime_checkable
class RecordSource(Protocol):
    """What a record needs of where it comes from."""

    @property
    def store(self) -> Any: ...  # a ReadableStore (packets: their own in-memory store)

    @property
    def step(self) -> Optional[int]: ...

    @property
    def rank(self) -> Optional[int]: ...

    @property
    def rank_dir(self) -> str: ...

    @property
    def key(self) -> tuple: ...  # identifies the source among a dump's (rank dirs, index files, packets)

    @property
    def url(self) -> str: ...

    def raw_record(self, name: str) -> Any: ...

    def tensor_key(self, data_name: str) -> str: ...

    def stack_ids(self) -> dict: ...

    def frames_of(self, name: str) -> Optional[list]: ...

    def parents(self) -> dict: ...


@runtime_checkable
class DumpSource(RecordSource, Protocol):
    """A rank directory (or its index file): documents, index and tensors."""

    @property
    def split(self) -> Optional[str]: ...

    @property
    def run(self) -> Optional[str]: ...

    @property
    def index_only(self) -> bool: ...

    @property
    def use_index(self) -> bool: ...

    @property
    def index_store(self) -> Any: ...

    @property
    def doc_name(self) -> Optional[str]: ...

    def document(self) -> DumpDocument: ...

    def stack(self) -> Optional[StackDocument]: ...

    def construct(self) -> Optional[ConstructDocument]: ...

    def mapping(self) -> dict: ...

    def marker(self) -> dict: ...

    def has_index(self) -> bool: ...

    def index_keys(self) -> list: ...

    def index_metadata(self) -> dict: ...

    def tensor_store(self) -> Any: ...

    def tensor_locations(self) -> Optional[dict]: ...

    def release(self) -> None:
        """Drop what was read so far (documents, listings); the next use reads again (bounds memory
        when many rank directories are walked one after another)."""
