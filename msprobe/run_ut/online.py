"""The checker side of online run_ut: consume packets, judge each API with run_ut, append to the CSVs.

Judgement is run_ut's own (:func:`msprobe.run_ut.execute.check_packet` on the
packet's records, the training side's outputs judged as the recorded ones);
the CSVs are run_ut's (:class:`msprobe.run_ut.csvio.ResultWriter`), one pair
per rank: ``accuracy_checking_result_{ts}_rank{R}.csv`` /
``accuracy_checking_details_{ts}_rank{R}.csv``.

A forward packet whose API will have a backward waits for its backward packet
(or for its step's end) so both are judged together, as offline run_ut does.

Progress (``online_run_ut_progress.jsonl`` in the output directory) makes a
killed checker resume: after each judged API the CSV sizes and the ids (and
store keys) of the packets it consumed are appended; on restart the CSVs are
cut back to the last recorded sizes (a half-written API goes), the files are
reused, and packets already recorded are not checked again.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from typing import Any, Callable, Optional

from msprobe.errors import invalid_value, read_json_object
from msprobe.online import PacketSource, packet_record
from msprobe.online.config import OnlineSettings, parse_online, section_with_fallback
from msprobe.online.packet import Packet
from msprobe.online.transport import SocketListener, StoreWatcher, server_ssl_context
from msprobe.progress import Progress
from msprobe.run_ut import csvio, execute
from msprobe.run_ut.runner import check_api

__all__ = ["OnlineChecker", "PROGRESS_FILE", "judge"]

log = logging.getLogger("msprobe.online")

PROGRESS_FILE = "online_run_ut_progress.jsonl"


def judge(forward_record: Any, backward_record: Any, options: Any) -> Any:
    """The one place the checker asks run_ut for a verdict: an ``ApiResult`` for one API
    (run_ut's :func:`~msprobe.run_ut.check_api`, which never raises for the API's faults)."""
    return check_api(forward_record, options, backward_record=backward_record)


class _Progress:
    """The append-only progress journal: {"files": ...}, {"done": [...], "sizes": {...}}, {"closed": ...}."""

    def __init__(self, out_dir: str):
        self.path = os.path.join(out_dir, PROGRESS_FILE)
        self.files: dict = {}  # rank text -> result csv path
        self.sizes: dict = {}  # csv path -> size after the last committed API
        self.done: set = set()  # packet ids
        self.keys: set = set()  # store keys of consumed packets
        self.closed: set = set()  # rank texts whose training side closed
        self.checked = 0
        if os.path.exists(self.path):
            self._load()
        self._fh = open(self.path, "a", encoding="utf-8")

    def _load(self) -> None:
        with open(self.path, "rb") as file:
            data = file.read()
        good = 0
        for line in data.split(b"\n"):
            if not line.strip():
                good += len(line) + 1
                continue
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):  # a line cut by a kill: everything after it is dropped
                break
            if not isinstance(obj, dict):
                break
            good += len(line) + 1
            if "files" in obj:
                self.files.update(obj["files"])
            if "done" in obj:
                self.done.update(obj["done"])
                self.keys.update(obj.get("keys", ()))
                self.sizes.update(obj.get("sizes", {}))
                self.checked += 1
            if "closed" in obj:
                self.closed.add(obj["closed"])
        if good < len(data):
            with open(self.path, "r+b") as file:
                file.truncate(min(good, len(data)))

    def _append(self, obj: dict) -> None:
        self._fh.write(json.dumps(obj, separators=(",", ":")) + "\n")
        self._fh.flush()

    def add_files(self, rank: str, result_path: str) -> None:
        self.files[rank] = result_path
        self._append({"files": {rank: result_path}})

    def commit(self, ids: list, keys: list, sizes: dict) -> None:
        self.done.update(ids)
        self.keys.update(key for key in keys if key)
        self.sizes.update(sizes)
        self.checked += 1
        self._append({"done": ids, "keys": [key for key in keys if key], "sizes": sizes})

    def close_rank(self, rank: str) -> None:
        if rank not in self.closed:
            self.closed.add(rank)
            self._append({"closed": rank})

    def close(self) -> None:
        try:
            self._fh.close()
        except OSError:
            pass


class OnlineChecker:
    """Run with :meth:`run`; stops when every rank of ``rank_list`` has closed (unless
    ``keep_running``), after ``idle_timeout`` seconds without a packet, or on :meth:`stop`."""

    def __init__(self, settings: OnlineSettings, out_dir: str = "./", *, white_list: Any = (),
                 black_list: Any = (), device: str = "cpu", keep_running: bool = False,
                 idle_timeout: Optional[float] = None, judge_fn: Optional[Callable] = None,
                 on_listen: Optional[Callable[[int], None]] = None, keep_packets: bool = False,
                 report_progress: Optional[bool] = False):
        self._csvio = csvio
        self.settings = settings
        self.out_dir = out_dir
        os.makedirs(out_dir, exist_ok=True)
        self.options = execute.CheckOptions(device=device, white_list=tuple(white_list or ()),
                                            black_list=tuple(black_list or ()), replay_mode="real")
        self.keep_running = keep_running
        self.keep_packets = keep_packets
        self.watcher: Any = None
        self.idle_timeout = idle_timeout
        self.judge = judge_fn or judge
        self.on_listen = on_listen
        self.progress = _Progress(out_dir)
        self.report_progress = report_progress  # the packets checked so far on stderr (msprobe.progress)
        self.writers: dict = {}
        self.pending: dict = {}  # (run, rank, step, base) -> forward Packet waiting for its backward
        self.counts = {"packets": 0, "apis": 0, "ignored_rank": 0, "duplicates": 0, "dropped_by_sender": 0,
                       "bad_packets": 0}
        self._stop = threading.Event()
        self._last_packet = time.monotonic()
        self.listener: Any = None
        self.port: Optional[int] = None
        self._restore_writers()

    # ---------------------------------------------------------------- outputs
    def _restore_writers(self) -> None:
        for rank, name in self.progress.files.items():
            result_path = os.path.join(self.out_dir, os.path.basename(name))  # the output dir may have moved
            if not os.path.exists(result_path):
                continue
            details = csvio.details_path_for(result_path)
            for path in (result_path, details):  # cut a half-written API off
                size = self.progress.sizes.get(os.path.basename(path))
                if size is not None and os.path.exists(path) and os.path.getsize(path) > size:
                    with open(path, "r+b") as file:
                        file.truncate(size)
            self.writers[rank] = csvio.ResultWriter(self.out_dir, resume_from=result_path)

    def _writer(self, rank: str) -> Any:
        writer = self.writers.get(rank)
        if writer is None:
            ts = time.strftime("%Y%m%d%H%M%S")
            writer = csvio.ResultWriter(self.out_dir, timestamp=f"{ts}_{rank}")
            self.writers[rank] = writer
            self.progress.add_files(rank, os.path.basename(writer.result_path))
        return writer

    # --------------------------------------------------------------- packets
    def _rank_text(self, packet: Packet) -> str:
        return f"rank{packet.rank if packet.rank is not None else 0}"

    def _wanted_rank(self, packet: Packet) -> bool:
        return (packet.rank if packet.rank is not None else 0) in self.settings.rank_list

    def handle(self, p: Packet) -> None:
        self.counts["packets"] += 1
        self._last_packet = time.monotonic()
        if p.ident in self.progress.done:
            self.counts["duplicates"] += 1
            return
        if not self._wanted_rank(p):
            self.counts["ignored_rank"] += 1
            return
        self.counts["dropped_by_sender"] = max(self.counts["dropped_by_sender"], int(p.header.get("dropped", 0)))
        if p.kind == "step_end":
            self._flush_pending(lambda k: k[:3] == (p.run, p.rank, p.step))
            self._commit([p], None)
            return
        if p.kind == "close":
            self._flush_pending(lambda k: k[:2] == (p.run, p.rank))
            self.progress.close_rank(self._rank_text(p))
            self._commit([p], None)
            return
        key = (p.run, p.rank, p.step, p.base)
        if p.direction == "forward":
            if p.header.get("expects_backward") and not self.settings.recompute:
                self.pending[key] = p
            else:
                self._check(p, None)
        elif p.direction == "backward":
            fwd = self.pending.pop(key, None)
            if fwd is None:
                log.info("msprobe online: %s arrived without its forward packet (shed by the sender); skipped",
                         p.name)
                self._commit([p], None)
                return
            self._check(fwd, p)
        else:
            self._commit([p], None)

    def handle_safely(self, p: Packet) -> None:
        """:meth:`handle`, but a packet that makes the checker fail is logged, counted and recorded as
        done, so neither this run nor a restart dies on it (any TCP client can send one)."""
        try:
            self.handle(p)
        except Exception as exc:  # noqa: BLE001 - one bad packet must not end the checker
            self.counts["bad_packets"] += 1
            log.warning("msprobe online: packet %s (%s) could not be processed and is skipped: %s: %s",
                        p.ident, str(p.name)[:200], type(exc).__name__, str(exc).splitlines()[0][:300] if str(exc) else "")
            try:
                self._commit([p], None)
            except Exception as exc2:  # noqa: BLE001
                log.warning("msprobe online: recording skipped packet %s failed: %s", p.ident, exc2)

    def _flush_pending(self, match: Callable[[tuple], bool]) -> None:
        for key in [key for key in self.pending if match(key)]:
            self._check(self.pending.pop(key), None)

    def _check(self, fwd: Packet, bwd: Optional[Packet]) -> None:
        src = PacketSource([fwd] + ([bwd] if bwd is not None else []))
        frec = packet_record(fwd, source=src)
        brec = packet_record(bwd, source=src) if bwd is not None else None
        result = self.judge(frec, brec, self.options)
        self._commit([fwd] + ([bwd] if bwd is not None else []), result)

    def _commit(self, packets: list, result: Any) -> None:
        rank = self._rank_text(packets[0])
        sizes: dict = {}
        if result is not None:
            writer = self._writer(rank)
            writer.write(result)
            self.counts["apis"] += 1
            sizes = {os.path.basename(writer.result_path): os.path.getsize(writer.result_path),
                     os.path.basename(writer.details_path): os.path.getsize(writer.details_path)}
        self.progress.commit([packet.ident for packet in packets], [packet.key for packet in packets], sizes)
        if self.watcher is not None and not self.keep_packets:  # recorded as done first: safe to remove
            self.watcher.remove([packet.key for packet in packets if packet.key])

    # -------------------------------------------------------------------- run
    def _all_closed(self) -> bool:
        return all(f"rank{rank}" in self.progress.closed for rank in self.settings.rank_list)

    def _should_stop(self) -> bool:
        if self._stop.is_set():
            return True
        if not self.keep_running and self._all_closed() and not self.pending:
            return True
        return self.idle_timeout is not None and time.monotonic() - self._last_packet > self.idle_timeout

    def stop(self) -> None:
        self._stop.set()

    def _source(self) -> Any:
        s = self.settings
        if s.transport == "store":
            self.watcher = StoreWatcher(s.nfs_path, storage_options=s.storage_options, interval=s.poll_interval,
                                        done=self.progress.keys, remove_done=not self.keep_packets,
                                        max_packet_bytes=s.max_packet_bytes)
            return self.watcher
        ctx = server_ssl_context(s.tls_path) if s.transport == "tls" else None
        self.listener = SocketListener(s.host, s.port, ssl_context=ctx, max_frame_bytes=s.max_packet_bytes,
                                       max_connections=s.max_connections, idle_timeout=s.idle_timeout)
        self.port = self.listener.port
        return self.listener

    def run(self) -> dict:
        """Check packets until a stop condition; returns a summary."""
        if self._all_closed() and not self.keep_running and self.settings.transport == "store":
            log.info("msprobe online: every rank of rank_list already closed in %s", self.out_dir)
        source = self._source()
        log.warning("msprobe online: checking packets from %s (ranks %s) into %s",
                    self.settings.describe() if self.port is None else
                    f"{self.settings.transport.upper()} {self.settings.host}:{self.port}",
                    self.settings.rank_list, self.out_dir)
        if self.on_listen is not None and self.port is not None:
            self.on_listen(self.port)
        bar = Progress(None, "run_ut online", "packets", enabled=self.report_progress)
        try:
            for packet in source.packets(self._should_stop):
                self.handle_safely(packet)
                bar.set_postfix(f"{self.counts['apis']} APIs checked")
                bar.update()
                if self._stop.is_set():
                    break
            if not self._stop.is_set():
                self._flush_pending(lambda key: True)
        finally:
            bar.set_postfix(f"{self.counts['apis']} APIs checked")
            bar.close()
            if self.listener is not None:
                self.listener.close()
            self.close()
        return self.summary()

    def summary(self) -> dict:
        out: dict = dict(self.counts)
        out["files"] = {rank: [writer.result_path, writer.details_path] for rank, writer in self.writers.items()}
        out["closed"] = sorted(self.progress.closed)
        out["pending"] = len(self.pending)
        if self.listener is not None:
            out["refused_connections"] = len(self.listener.refused)
        return out

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()
        self.progress.close()


def install_signal_handlers(checker: OnlineChecker) -> None:
    """SIGTERM/SIGINT stop the checker after the API being checked (the CSVs stay consistent)."""
    def handler(signum: int, frame: Any) -> None:
        checker.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            signal.signal(sig, handler)
        except (ValueError, OSError):
            pass


def settings_from_config(config_path: Optional[str], *, force_online: bool = False) -> tuple:
    """(OnlineSettings, run_ut section) from a checker config.json (task run_ut)."""
    raw: dict = read_json_object(config_path, "config_path") if config_path else {}
    task = raw.get("task", "run_ut")
    if task != "run_ut":
        raise invalid_value("task", task, "'run_ut' for the checker")
    sec = section_with_fallback(raw, "run_ut")
    if force_online:
        sec["is_online"] = True
    settings = parse_online(sec, side="checker", storage_options=raw.get("storage_options"))
    return settings, sec
