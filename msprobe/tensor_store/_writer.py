"""ZarrTensorWriter: tensor payloads of one step and rank into a few large Zarr v3 shards.

Framework-neutral: it receives raw little-endian payload bytes with their logical dtype
and shape. Payloads are deduplicated by content (SHA-256 over the bytes, within one
array = one logical dtype), appended to the array of their dtype, and each full shard is
encoded (blosc) and published as one atomic object by worker threads. A payload is
*complete* once every shard it touches is stored; only then is it written to the
manifest journal, so a crash never exposes a payload whose bytes are not all there.
"""
from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional

from msprobe.backends import RetryPolicy, Store
from msprobe.errors import ConfigError, StorageError
from msprobe.format.layout import join_key
from msprobe.tensor_store._layout import (
    CODECS,
    LAYOUT_VERSION,
    MANIFEST_DIR,
    STORE_DIR,
    aligned_buffer,
    array_metadata,
    encode_shard_pieces,
    group_metadata,
    location,
    shard_key,
    storage_dtype,
)

__all__ = ["ZarrTensorWriter", "WriterSummary"]

log = logging.getLogger("msprobe.tensor_store")


class _Array:
    __slots__ = ("name", "dt", "isz", "chunk", "shard", "cps", "parts", "buffered", "buf_start", "next",
                 "data_end", "shards", "pending", "written_shape", "since")

    def __init__(self, name: str, shard_bytes: int, chunk_bytes: int) -> None:
        self.name = name
        self.dt = storage_dtype(name)
        self.isz = self.dt.itemsize
        self.chunk = max(1, chunk_bytes // self.isz)
        self.cps = max(1, shard_bytes // (self.chunk * self.isz))
        self.shard = self.chunk * self.cps
        self.parts: list = []  # memoryviews of the bytes not yet cut into shards
        self.buffered = 0
        self.buf_start = 0  # element index of the first buffered byte
        self.next = 0  # element index where the next payload goes
        self.data_end = 0
        self.shards: dict = {}  # shard number -> object size, once stored
        self.pending: list = []  # payload numbers not yet complete
        self.written_shape = -1
        self.since = 0.0  # when the oldest buffered byte arrived


class WriterSummary:
    """What a writer stored: counters for benchmarks and reports."""

    def __init__(self) -> None:
        self.payloads = 0  # distinct payloads stored
        self.names = 0  # data names accepted
        self.dedup_identity = 0  # names that were the same memory as an earlier one
        self.dedup_content = 0  # names whose bytes equalled an earlier payload's
        self.raw_bytes = 0  # bytes of every accepted name (what the classic layout would hold)
        self.stored_raw_bytes = 0  # bytes of the distinct payloads
        self.shard_bytes = 0  # encoded bytes of the shard objects
        self.shards = 0
        self.per_dtype: dict = {}  # dtype -> [raw stored bytes, encoded bytes of its shards]

    def as_dict(self) -> dict:
        return dict(vars(self))


class ZarrTensorWriter:
    """Write the payloads of one rank directory (``rank_prefix``) into ``tensors.zarr``.

    ``add()`` returns at once (back-pressure only beyond ``max_bytes_in_flight``);
    ``checkpoint()`` waits for everything, writes the partial last shards, the array
    metadata and the manifest (group attributes), and returns the data names' index
    locations. Storage failures are reported by ``checkpoint()`` as a StorageError;
    the payloads they concern are listed as incomplete, never as stored.
    """

    def __init__(self, store: Store, rank_prefix: str, *, compression: str = "lz4", shard_bytes: int = 128 << 20,
                 chunk_bytes: int = 256 << 10, max_bytes_in_flight: int = 1 << 30, workers: int = 2,
                 journal_fsync: bool = False, retries: int = 5, flush_window: Optional[float] = None) -> None:
        if compression not in CODECS:
            raise ConfigError(f"invalid tensor_compression {compression!r}; valid: {sorted(CODECS)}")
        if shard_bytes < chunk_bytes or chunk_bytes < 64:
            raise ConfigError(f"tensor store: shard_bytes={shard_bytes} must be >= chunk_bytes={chunk_bytes} >= 64")

        self.store = store
        self.prefix = rank_prefix.strip("/")
        self.compression = compression
        self.shard_bytes = int(shard_bytes)
        self.chunk_bytes = int(chunk_bytes)
        self.max_bytes = int(max_bytes_in_flight)
        self.journal_fsync = journal_fsync
        #: seconds a payload may wait in a partly filled shard: then the shard is published as it
        #: is (a kill loses at most that window, not the whole shard); None: only full shards
        self.flush_window = flush_window
        self.policy = RetryPolicy(retries=retries)
        self.summary = WriterSummary()
        self._arrays: dict = {}
        self._payloads: list = []  # [array, start, count, sha256, done]
        self._dedup: dict = {}
        self._names: dict = {}  # data_name -> (payload, shape)
        self._name_order: list = []
        self._waiting: dict = {}  # payload -> data names to journal when it completes
        self._failed: dict = {}  # shard key -> exception
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._queue: deque = deque()
        self._inflight = 0
        self._busy = 0  # queue items + shard jobs not finished
        #: the page-aligned buffers of shard objects written, reused for the next ones (at most one per
        #: worker: a fresh 128 MiB buffer's pages cost more to fault in than its copy)
        self._out_free: list = []
        self._out_keep = max(1, workers)
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="msprobe-zarr")
        self._packer: Optional[threading.Thread] = None
        self._journal: Any = None  # the manifest journal, opened with the first payload
        self._group_state: Optional[bool] = None  # the 'complete' flag last written to the group
        self._dirty = False  # payloads added since the last checkpoint
        self._names_unflushed = False  # names of stored payloads journaled, not yet flushed
        self._closed = False

    # ------------------------------------------------------------------ keys
    def _k(self, *parts: str) -> str:
        return join_key(self.prefix, *parts)

    # ----------------------------------------------------------------- input
    def add(self, data_name: str, logical: str, shape: tuple, produce: Callable[[], Any], nbytes: int,
            same_as: Optional[str] = None) -> None:
        """Queue one payload. ``produce()`` returns its contiguous little-endian bytes (called in the
        packer thread). ``same_as``: an earlier data name known to hold the same bytes (same memory,
        same version): no bytes are read again."""
        storage_dtype(logical)  # unsupported dtypes fail here, in the caller
        item = (data_name, logical, tuple(int(d) for d in shape), produce, int(nbytes), same_as)
        size = 0 if same_as is not None else int(nbytes)
        with self._cond:
            if self._closed:
                raise StorageError(f"tensor store writer for {self.prefix} is closed")
            while self._inflight and self._inflight + size > self.max_bytes:
                self._cond.wait()
            self._inflight += size
            self._busy += 1
            self._dirty = True
            self._queue.append(item)
            if self._packer is None or not self._packer.is_alive():
                self._packer = threading.Thread(target=self._pack_loop, name="msprobe-zarr-packer", daemon=True)
                self._packer.start()
            self._cond.notify_all()

    def _pack_loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    if not self._cond.wait(timeout=min(1.0, self.flush_window or 1.0)) and not self._queue:
                        if self.flush_window is not None:  # idle: publish the partly filled shards now
                            for arr in self._arrays.values():
                                self._cut(arr, final=True)
                        self._packer = None
                        return
                item = self._queue.popleft()
            try:
                self._pack(item)
            except BaseException as exc:  # noqa: BLE001 - reported by checkpoint()
                log.warning("tensor store: %s could not be stored: %s", item[0], exc)
                with self._cond:
                    self._failed[f"{item[0]}"] = exc
            finally:
                with self._cond:
                    if item[5] is None:
                        self._inflight -= item[4]
                    if self._names_unflushed and not self._queue:
                        self._flush_manifest_journal()
                    self._busy -= 1
                    self._cond.notify_all()

    def _flush_manifest_journal(self) -> None:
        """Make the manifest journal's lines durable (caller holds the lock)."""
        self._names_unflushed = False
        if self._journal is not None:
            try:
                self._journal.flush()
            except Exception as exc:  # noqa: BLE001 - reported by checkpoint()
                self._failed["manifest journal"] = exc

    def _ensure_started(self) -> None:
        """The group's zarr.json says 'incomplete' while payloads are being written (crash detection)."""
        if self._group_state is not False:
            self.store.put(self._k(STORE_DIR, "zarr.json"), group_metadata({"msprobe_lake": self._manifest(False)}))
            self._group_state = False
        if self._journal is None:
            self._journal = self.store.journal(self._k(STORE_DIR, MANIFEST_DIR), fsync=self.journal_fsync)

    def _pack(self, item: tuple) -> None:
        data_name, logical, shape, produce, nbytes, same_as = item
        with self._lock:
            self._ensure_started()
            s = self.summary
            s.names += 1
            if same_as is not None:
                if same_as not in self._names:
                    raise StorageError(f"{data_name}: its bytes were those of {same_as!r}, which was not stored")
                pidx = self._names[same_as][0]
                s.dedup_identity += 1
                s.raw_bytes += self._payloads[pidx][2] * storage_dtype(logical).itemsize
                self._name(data_name, pidx, shape)
                return
        data = produce()
        mv = memoryview(data).cast("B") if not isinstance(data, memoryview) or data.format != "B" else data
        sha = hashlib.sha256(mv).hexdigest()[:32]
        with self._lock:
            arr = self._arrays.get(logical)
            if arr is None:
                arr = self._arrays[logical] = _Array(logical, self.shard_bytes, self.chunk_bytes)
            if len(mv) % arr.isz:
                raise StorageError(f"{data_name}: {len(mv)} bytes are not a whole number of {logical} elements")
            s = self.summary
            s.raw_bytes += len(mv)
            key = (logical, len(mv), sha)
            pidx = self._dedup.get(key)
            if pidx is None:
                pidx = self._place(arr, mv, sha)
                self._dedup[key] = pidx
                s.payloads += 1
                s.stored_raw_bytes += len(mv)
                s.per_dtype.setdefault(logical, [0, 0])[0] += len(mv)
            else:
                s.dedup_content += 1
            self._name(data_name, pidx, shape)
            self._cut(arr, final=False)
            if self.flush_window is not None and arr.buffered and time.monotonic() - arr.since >= self.flush_window:
                self._cut(arr, final=True)

    def _name(self, data_name: str, pidx: int, shape: tuple) -> None:
        if data_name not in self._names:
            self._name_order.append(data_name)
        self._names[data_name] = (pidx, shape)
        if self._payloads[pidx][4]:
            self._journal_line({"name": data_name, "payload": pidx, "shape": list(shape)})
            self._names_unflushed = True  # flushed when the packer is idle (a dedup'd name is durable)
        else:
            self._waiting.setdefault(pidx, []).append(data_name)
            self._journal_line({"pending": data_name})

    def _journal_line(self, obj: dict) -> None:
        try:
            self._journal.append(json.dumps(obj, separators=(",", ":")))
        except Exception as exc:  # noqa: BLE001
            self._failed["manifest journal"] = exc

    def _place(self, arr: _Array, mv: memoryview, sha: str) -> int:
        count = len(mv) // arr.isz
        pos = arr.next
        in_shard = pos % arr.shard
        if count and in_shard and in_shard + count > arr.shard and count <= arr.shard:
            # keep a payload that fits in one shard inside one shard (one range read): pad to the boundary
            pad = arr.shard - in_shard
            self._append(arr, memoryview(bytes(pad * arr.isz)))
            arr.next += pad
        start = arr.next
        if count:
            self._append(arr, mv)
        arr.next += count
        arr.data_end = max(arr.data_end, arr.next)
        pidx = len(self._payloads)
        self._payloads.append([arr.name, start, count, sha, count == 0])
        if count:
            arr.pending.append(pidx)
        else:
            self._journal_line({"payload": pidx, "array": arr.name, "start": start, "count": 0, "sha256": sha})
        return pidx

    @staticmethod
    def _append(arr: _Array, mv: memoryview) -> None:
        if not arr.buffered:
            arr.since = time.monotonic()
        arr.parts.append(mv)
        arr.buffered += len(mv)

    def _cut(self, arr: _Array, *, final: bool) -> None:
        """Hand every full shard (and with ``final`` the partial last one) to the workers."""
        full = arr.shard * arr.isz
        while arr.buffered >= full or (final and arr.buffered):
            take = min(full, arr.buffered)
            pieces, got = [], 0
            while got < take:
                p = arr.parts[0]
                need = take - got
                if len(p) <= need:
                    pieces.append(p)
                    got += len(p)
                    arr.parts.pop(0)
                else:
                    pieces.append(p[:need])
                    arr.parts[0] = p[need:]
                    got += need
            arr.buffered -= take
            k = arr.buf_start // arr.shard
            arr.buf_start = (k + 1) * arr.shard
            self._busy += 1
            self._inflight += take  # the pieces stay referenced until the shard is encoded
            self._pool.submit(self._write_shard, arr, k, pieces, take)
        if final and arr.next % arr.shard:
            arr.next = arr.buf_start  # the last shard is published: new payloads start a fresh one

    def _write_shard(self, arr: _Array, k: int, pieces: list, nbytes: int) -> None:
        key = self._k(shard_key(arr.name, k))
        try:
            from msprobe.backends import put_retrying

            used: list = []
            obj = encode_shard_pieces(pieces, arr.dt, arr.chunk, arr.cps, self.compression,
                                      alloc=lambda size: self._out_buffer(size, used))
            pieces = []
            try:
                put_retrying(self.store, key, obj, overwrite=True, policy=self.policy)  # type: ignore[arg-type]  # a buffer
            finally:
                nobj = len(obj)
                del obj  # nothing reads the buffer after this
                self._out_return(used)
            with self._lock:
                arr.shards[k] = nobj
                self.summary.shards += 1
                self.summary.shard_bytes += nobj
                self.summary.per_dtype.setdefault(arr.name, [0, 0])[1] += nobj
                self._put_array_meta(arr)
                self._journal_line({"shard": [arr.name, k, nobj]})
                self._complete_payloads(arr)
                self._flush_manifest_journal()
        except BaseException as exc:  # noqa: BLE001 - reported by checkpoint()
            log.warning("tensor store: shard %s could not be written: %s", key, exc)
            with self._lock:
                self._failed[key] = exc
        finally:
            with self._cond:
                self._inflight -= nbytes
                self._busy -= 1
                self._cond.notify_all()

    def _out_buffer(self, size: int, used: list) -> Any:
        with self._lock:
            for i, buf in enumerate(self._out_free):
                if len(buf) >= size:
                    used.append(self._out_free.pop(i))
                    return used[0]
        used.append(aligned_buffer(-(-size // (1 << 20)) << 20))  # whole MiB: the next shard of about its size fits
        return used[0]

    def _out_return(self, used: list) -> None:
        with self._lock:
            for buf in used:
                if len(self._out_free) < self._out_keep:
                    self._out_free.append(buf)
            self._out_free.sort(key=len)  # the smallest that fits is taken

    def _put_array_meta(self, arr: _Array) -> None:
        """zarr.json of ``arr``: its shape covers the stored shards (or, finally, the data)."""
        stored_end = max(((k + 1) * arr.shard for k in arr.shards), default=0)
        shape = min(stored_end, arr.data_end)
        if shape != arr.written_shape:
            meta = array_metadata(arr.name, shape, arr.shard, arr.chunk, self.compression)
            self.store.put(self._k(STORE_DIR, arr.name, "zarr.json"), meta)
            arr.written_shape = shape

    def _complete_payloads(self, arr: _Array) -> None:
        still = []
        for pidx in arr.pending:
            _, start, count, sha, _ = self._payloads[pidx]
            first, last = start // arr.shard, (start + count - 1) // arr.shard
            if all(k in arr.shards for k in range(first, last + 1)):
                self._payloads[pidx][4] = True
                self._journal_line({"payload": pidx, "array": arr.name, "start": start, "count": count,
                                    "sha256": sha})
                for dn in self._waiting.pop(pidx, ()):
                    self._journal_line({"name": dn, "payload": pidx, "shape": list(self._names[dn][1])})
            else:
                still.append(pidx)
        arr.pending = still

    # ------------------------------------------------------------- manifest
    def _manifest(self, complete: bool) -> dict:
        names = {}
        incomplete = []
        for dn in self._name_order:
            pidx, shape = self._names[dn]
            if self._payloads[pidx][4]:
                names[dn] = [pidx, list(shape)]
            else:
                incomplete.append(dn)
        return {
            "layout_version": LAYOUT_VERSION, "complete": bool(complete and not incomplete),
            "compression": self.compression,
            "arrays": {a.name: {"shards": {str(k): v for k, v in sorted(a.shards.items())},
                                "shard_elements": a.shard, "chunk_elements": a.chunk,
                                "storage_dtype": a.dt.name, "compressed": CODECS[self.compression] is not None}
                       for a in self._arrays.values()},
            "payloads": [[p[0], p[1], p[2], p[3]] if p[4] else None for p in self._payloads],
            "tensors": names,
            "incomplete": incomplete,
        }

    def locations(self) -> dict:
        """data name -> ``location`` (index column) of every complete payload."""
        with self._lock:
            out = {}
            for dn, (pidx, _) in self._names.items():
                a, start, count, _, done = self._payloads[pidx]
                if done:
                    out[dn] = location(a, start, count)
            return out

    def wait(self) -> None:
        with self._cond:
            while self._busy:
                self._cond.wait()

    def checkpoint(self) -> dict:
        """Store everything added so far; write the manifest; return :meth:`locations`.
        Raises StorageError (after writing what is complete) when anything failed."""
        self.wait()
        with self._lock:
            for arr in self._arrays.values():
                self._cut(arr, final=True)
        self.wait()
        with self._lock:
            if self._group_state is None and not self._names:
                return {}
            if not self._dirty and not self._failed:
                return self.locations()
            self._dirty = False
            failed, self._failed = dict(self._failed), {}
            try:
                for arr in self._arrays.values():
                    self._put_array_meta(arr)
                manifest = self._manifest(not failed)
                self.store.put(self._k(STORE_DIR, "zarr.json"), group_metadata({"msprobe_lake": manifest}))
                self._group_state = manifest["complete"]
                if self._journal is not None:
                    self._journal.close()
                    self._journal = None
                    if manifest["complete"]:
                        self.store.delete_prefix(self._k(STORE_DIR, MANIFEST_DIR))
            except Exception as exc:  # noqa: BLE001
                failed["manifest"] = exc
            locs = self.locations()
        if failed:
            shown = "; ".join(f"{k} ({type(e).__name__}: {e})" for k, e in list(failed.items())[:10])
            err = StorageError(f"tensor store {self.store.url.rstrip('/')}/{self._k(STORE_DIR)}: "
                               f"{len(failed)} failure(s): {shown}")
            err.failures = failed  # type: ignore[attr-defined]
            raise err
        return locs

    def close(self) -> None:
        if self._closed:
            return
        try:
            self.checkpoint()
        finally:
            self._closed = True
            self._pool.shutdown(wait=True)
