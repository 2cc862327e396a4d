"""The atomic publish of a rank directory's documents: dump.json (or debug.json), stack.json,
construct.json, mapping.csv, the marker ``msprobe_lake.json`` and the optional index, each one
atomic put with the session's retries; and the marker's ``final`` once the dump is over."""
from __future__ import annotations

import os
from typing import Any, Callable, Optional

from msprobe import __version__
from msprobe.dumpers.config import DumpConfig
from msprobe.dumpers.session._documents import StepDocuments
from msprobe.dumpers.session._failures import FailureLog
from msprobe.dumpers.session._storage import RetryingPut, SessionStorage
from msprobe.format.documents import compact_json, encode_documents, encode_stack_entries
from msprobe.format.layout import MAPPING_CSV, MARKER_FILE, TENSOR_DIR, data_dir_url, encode_mapping, join_key
from msprobe.format.marker import build_marker, encode_marker, mark_final

__all__ = ["RankPublisher"]


class RankPublisher:
    """Writes the documents of one rank directory of one step."""

    def __init__(self, config: DumpConfig, framework: str, producer: str, render_stack: Callable[[tuple], list],
                 storage: SessionStorage, failures: FailureLog) -> None:
        self.config = config
        self.framework = framework
        self.producer = f"{producer} {__version__}"
        self.render_stack = render_stack
        self.storage = storage
        self.failures = failures
        #: (prefix, the marker's bytes) of the last publish that wrote its marker: mark_final's starting point
        self._marker: Optional[tuple] = None
        #: a stack's rendered lines -> their JSON text in stack.json (the same call sites step after step)
        self._lines_text: dict = {}

    def write(self, prefix: str, docs: StepDocuments, *, step: int, rank: Optional[int], complete: bool,
              final: bool, zarr: bool, digests: Callable[[str], dict], locations: dict) -> Optional[Exception]:
        """Publish ``docs`` under ``prefix``; the storage error met (recorded in the error log,
        never raised), else None."""
        cfg = self.config
        debug = cfg.level == "debug"
        doc = {"task": cfg.task, "level": cfg.level, "framework": self.framework,
               "dump_data_dir": self.dump_data_dir(prefix, docs), "data": docs.data}
        try:
            # each document: one atomic put, transient failures retried
            store = RetryingPut(self.storage.document_store(), self.storage.policy())
            stack = None if debug else self._stack_bytes(docs.stacks)
            encoded = encode_documents(doc, debug=debug, stack=None, construct=docs.construct, encoded=docs.encoded,
                                       stack_bytes=stack)
            for name, body in encoded:
                store.put(f"{prefix}/{name}", body)
            doc_bytes = encoded[0][1]
            if docs.mapping:
                store.put(join_key(prefix, TENSOR_DIR, MAPPING_CSV), encode_mapping(docs.mapping))
            marker = build_marker(producer=self.producer, framework=self.framework, task=cfg.task,
                                  level=cfg.level, step=step, rank=rank, records=len(docs.data), complete=complete,
                                  pid=os.getpid(), zarr=zarr, final=final, doc_bytes=doc_bytes, files=digests(prefix))
            marker_bytes = encode_marker(marker)
            self._marker = None
            store.put(f"{prefix}/{MARKER_FILE}", marker_bytes)
            self._marker = (prefix, marker_bytes)  # (what mark_final would read back)
            if cfg.index and not debug:
                self._write_index(prefix, doc, docs, step=step, rank=rank, locations=locations)
        except Exception as exc:  # noqa: BLE001 - never crash training for the dump
            self.failures.note("publish", exc)
            return exc
        self.failures.copy_to_store(prefix)
        return None

    #: rendered stacks whose JSON text is kept at most (the table starts again when full)
    LINES_TEXT_MAX = 4096

    def _stack_bytes(self, stacks: Any) -> bytes:
        """stack.json's bytes, as ``encode_documents`` writes ``stacks.to_json(render_stack)``: each stack's
        lines rendered (render_stack keeps them per call site) and their JSON text kept by those lines."""
        texts, render = self._lines_text, self.render_stack
        entries = []
        for sid in sorted(stacks.names):
            lines = tuple(render(stacks.frames[sid]))
            text = texts.get(lines)
            if text is None:
                if len(texts) >= self.LINES_TEXT_MAX:
                    texts.clear()
                text = texts[lines] = compact_json(list(lines))
            entries.append((str(sid), stacks.names[sid], text))
        return encode_stack_entries(entries)

    def _write_index(self, prefix: str, doc: dict, docs: StepDocuments, *, step: int, rank: Optional[int],
                     locations: dict) -> None:
        try:
            from msprobe.index import write_rank_index
        except ImportError as exc:
            self.failures.note("index", exc)
            return
        try:
            write_rank_index(self.storage.store, prefix, doc, step=step, rank=rank,
                             stack=docs.stacks.to_json(self.render_stack), construct=docs.construct,
                             locations=locations or None)
        except Exception as exc:  # noqa: BLE001 - never crash training for the dump: the failure is counted and logged
            self.failures.note("index", exc)

    def dump_data_dir(self, prefix: str, docs: StepDocuments) -> Optional[str]:
        """The documents' ``dump_data_dir``: where the step's tensors are (None without any)."""
        if self.config.task != "tensor" and not docs.files:
            return None
        sub = TENSOR_DIR
        if self.config.tensor_store == "zarr":
            from msprobe.format.layout import STORE_DIR as sub
        return data_dir_url(self.storage.store, f"{prefix}/{sub}")

    def mark_final(self, prefix: str) -> None:
        """Published already (at stop()): say so in the marker before the journal is deleted."""
        key = f"{prefix}/{MARKER_FILE}"
        storage = self.storage
        kept, self._marker = self._marker, None
        try:
            if kept is not None and kept[0] == prefix:  # the marker this publisher wrote last: not read back
                RetryingPut(storage.document_store(), storage.policy()).put(key, mark_final(kept[1]))
                return
            policy = storage.policy()  # the marker is read back with the same retries as every publish
            if policy.call(lambda: storage.store.exists(key)):
                final = mark_final(policy.call(lambda: storage.store.get(key)))
                RetryingPut(storage.document_store(), storage.policy()).put(key, final)
        except Exception as exc:  # noqa: BLE001 - never crash training for the dump: the failure is counted and logged
            self.failures.note("marker", exc)
