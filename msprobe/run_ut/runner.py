"""Run the pre-check over a whole dump: tasks, worker processes, timeouts, resume, error data.

The parent process lists the forward API records of one rank of a dump (it never
imports torch); worker processes (``spawn``) open the same dump, replay one API
at a time and send back its :class:`~msprobe.run_ut.execute.ApiResult`. A worker
that exceeds the per-API timeout is killed and one that dies is replaced: the API
is reported as SKIP with the reason and the run goes on. Results are written in
dump order, flushed after every API, so ``-csv_path`` resumes an interrupted run.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from typing import TYPE_CHECKING, Any, Optional

from msprobe import readers
from msprobe.backends import join_location, local_path_of, open_store, upload_files
from msprobe.errors import ConfigError, read_json_object
from msprobe.format.layout import dump_dir_of
from msprobe.format.stats import MAX, MIN, STAT_KEYS
from msprobe.progress import Progress
from msprobe.readers import InputTooLargeError
from msprobe.run_ut.csvio import ResultWriter
from msprobe.run_ut.execute import (
    AUTO_CEILING,
    ApiPacket,
    ApiResult,
    CheckOptions,
    check_packet,
    filter_reason,
    packet_from_record,
    skip_result,
    split_api_name,
)
from msprobe.run_ut.memory import default_input_ceiling
from msprobe.run_ut.metrics import worst

if TYPE_CHECKING:
    from msprobe.readers.protocols import DumpSource

__all__ = ["run_ut", "open_rank", "list_tasks", "load_run_ut_config", "check_api", "DEFAULT_TIMEOUT", "pick_device"]

DEFAULT_TIMEOUT = 300.0
_STAT_KEYS = {*STAT_KEYS, "md5", "data_name", f"{MAX.key}_except_inf_nan", f"{MIN.key}_except_inf_nan",
              "requires_grad"}


def open_rank(path: str, *, step: Optional[int] = None, rank: Any = None,
              storage_options: Optional[dict] = None) -> tuple:
    """(dump, source) for a dump.json, a rank directory or any dump root/URL holding one rank (or pick one)."""
    dump = readers.open(dump_dir_of(path), storage_options=storage_options)
    selection: dict = {}
    if step is not None:
        selection["step"] = step
    if rank is not None:
        selection["rank"] = rank
    sources = dump.select(**selection)
    if not sources:
        raise ConfigError(f"{path}: no rank directory matches step={step}, rank={rank}")
    if len(sources) > 1:
        where = ", ".join(f"step {source.step} {source.rank_dir}" for source in sources[:6])
        raise ConfigError(f"{path} holds {len(sources)} rank directories ({where}...): pass one dump.json or rank "
                          "directory, or choose with --step/--rank")
    return dump, sources[0]


def _no_api_records(path: str, src: DumpSource) -> None:
    """ConfigError for a dump with no forward API record to check (an L0 dump holds modules only)."""
    try:
        level = src.document().raw.get("level")
    except Exception:  # noqa: BLE001 - the message works without the level
        level = None
    if level == "L0":
        raise ConfigError(f"{path}: this is a level L0 dump (module records only): run_ut replays APIs and needs "
                          f"an L1 (or mix) dump; dump again with \"level\": \"L1\"")
    raise ConfigError(f"{path}: no forward API record to check (level {level or 'unknown'}); run_ut needs an L1 "
                      f"(or mix) dump of the APIs to replay")


def _records(dump: Any, src: DumpSource) -> list:
    return dump.records(step=src.step, rank=src.rank_dir, run=src.run, split=src.split)


def list_tasks(dump: Any, src: DumpSource, *, filter_api: bool = False) -> tuple:
    """([forward API record names in dump order], {names of backward records})."""
    recs = _records(dump, src)
    names = [rec.name for rec in recs if rec.kind == "api" and rec.direction == "forward"]
    backward = {rec.name for rec in recs if rec.kind == "api" and rec.direction == "backward"}
    if filter_api:
        by_name = {rec.name: rec for rec in recs}
        seen: set = set()
        kept = []
        for name in names:
            key = _structure_key(by_name[name])
            if key in seen:
                continue
            seen.add(key)
            kept.append(name)
        names = kept
    return names, backward


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _strip(item) for key, item in value.items() if key not in _STAT_KEYS}
    if isinstance(value, list):
        return [_strip(item) for item in value]
    return value


def _structure_key(rec: Any) -> str:
    """An API's name and arguments without their statistics (the docs' -filter_api rule)."""
    api_type, api_name, _ = split_api_name(rec.name)
    raw = rec.raw
    body = {key: raw.get(key) for key in ("input_args", "input_kwargs", "output")} if isinstance(raw, dict) else raw
    return json.dumps([api_type, api_name, _strip(body)], sort_keys=True, default=str)


def load_run_ut_config(path: Optional[str]) -> dict:
    """white_list / black_list / error_data_path / precision from a config.json (``run_ut`` section or top level)."""
    if not path:
        return {}
    doc = read_json_object(path, "-config")
    sec: dict = doc["run_ut"] if isinstance(doc.get("run_ut"), dict) else doc
    out: dict = {}
    for key in ("white_list", "black_list"):
        value = sec.get(key, [])
        if value is None:
            value = []
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise ConfigError(f"-config {path}: {key} must be a list of API names")
        out[key] = tuple(value)
    if sec.get("error_data_path") is not None:
        if not isinstance(sec["error_data_path"], str):
            raise ConfigError(f"-config {path}: error_data_path must be a string")
        out["error_data_path"] = sec["error_data_path"]
    if sec.get("max_input_mb") is not None:
        value = sec["max_input_mb"]
        if (not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0 or value != value
                or value == float("inf")):
            raise ConfigError(f"-config {path}: max_input_mb must be a number of MiB > 0 (the ceiling of an "
                              "API's generated inputs)")
        out["max_input_mb"] = value
    if sec.get("precision") is not None:
        precision = sec["precision"]
        if not isinstance(precision, int) or isinstance(precision, bool) or not 0 <= precision <= 20:
            raise ConfigError(f"-config {path}: precision must be an integer in 0..20")
        out["precision"] = precision
    return out


# -- checking one API (in any process) -------------------------------------------------------------------


def check_api(record: Any, options: Optional[CheckOptions] = None, *, backward_record: Any = None) -> ApiResult:
    """Check one forward record (a ``msprobe.readers`` record, or an ApiPacket): never raises for the API's faults."""
    options = options or CheckOptions()
    if isinstance(record, ApiPacket):
        return _guarded(lambda: check_packet(record, options), record.name, record.has_backward)
    name = record.name[: -len(".forward")] if record.name.endswith(".forward") else record.name
    has_bwd = backward_record is not None
    api_type, api_name, _ = split_api_name(name)
    reason = filter_reason(api_type, api_name, options)
    if reason:
        return skip_result(name, reason, has_bwd)

    def go() -> ApiResult:
        return check_packet(packet_from_record(record, backward_record, options), options, consume=True)

    return _guarded(go, name, has_bwd)


def _guarded(check: Any, name: str, has_bwd: bool) -> ApiResult:
    started = time.perf_counter()
    try:
        return check()
    except Exception as exc:  # noqa: BLE001 - one API's failure is a SKIP row, never the end of the run
        text = str(exc).strip().splitlines()
        reason = f"run_ut could not check the API: {type(exc).__name__}: {text[0] if text else ''}"[:500]
        result = skip_result(name, reason, has_bwd)
        if isinstance(exc, InputTooLargeError):
            result.skip_cause = "input_ceiling"
        result.seconds = time.perf_counter() - started
        return result


class _Checker:
    """The per-process state: the open dump and the options."""

    def __init__(self, dump_path: str, step: Any, rank: Any, storage_options: Optional[dict], options: CheckOptions,
                 error_data: Optional[str]):
        self.dump, self.src = open_rank(dump_path, step=step, rank=rank, storage_options=storage_options)
        self.by_name = {rec.name: rec for rec in _records(self.dump, self.src)}
        self.options = options
        self.error_data = error_data
        if error_data:
            self.options = CheckOptions(**{**options.__dict__, "keep_tensors": True})

    def check(self, fwd_name: str) -> ApiResult:
        rec = self.by_name[fwd_name]
        bname = fwd_name[: -len(".forward")] + ".backward"
        res = check_api(rec, self.options, backward_record=self.by_name.get(bname))
        if self.error_data and res.failed and res.tensors:
            try:
                save_error_data(self.error_data, res)
            except Exception as exc:  # noqa: BLE001 - saving must not lose the verdict
                res.message = (res.message + f" (saving error data failed: {exc})").strip()
        res.tensors = None
        return res


def save_error_data(url: str, result: ApiResult) -> list:
    """Write the inputs and both sides' outputs of a failing API under ``url`` (any backend), as .pt files."""
    import io

    import torch

    store = open_store(url, create=True)
    keys = []

    def put(prefix: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            buf = io.BytesIO()
            torch.save(value.detach().cpu().contiguous(), buf)
            key = f"{prefix}.pt"
            store.put(key, buf.getvalue())
            keys.append(key)
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                put(f"{prefix}.{index}", item)
        elif isinstance(value, dict):
            for k, item in value.items():
                put(f"{prefix}.{k}", item)

    for part, value in (result.tensors or {}).items():
        put(f"{result.name}.{part}", value)
    return keys


def _worker_main(conn: Any, init: tuple) -> None:  # pragma: no cover - runs in a child process
    try:
        import torch

        torch.set_num_threads(max(1, int(os.environ.get("MSPROBE_RUN_UT_THREADS", "1"))))
        dump_path, step, rank, storage_options, options, error_data, preload, device_id = init
        _preload(preload)
        options = CheckOptions(**{**options.__dict__, "device": pick_device(options.device, device_id)})
        checker = _Checker(dump_path, step, rank, storage_options, options, error_data)
        _warm_up()
        conn.send(("ready", None, None))
    except BaseException as exc:  # noqa: BLE001
        conn.send(("fatal", None, f"{type(exc).__name__}: {exc}"))
        return
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        idx, name = msg
        conn.send(("done", idx, checker.check(name)))


def _warm_up() -> None:
    """Pay torch's lazy imports (autograd, serialization) before the per-API timeout starts counting."""
    import io

    import torch

    leaf = torch.ones(2, requires_grad=True)
    (leaf * 2).sum().backward()
    buf = io.BytesIO()
    torch.save(torch.ones(1), buf)
    buf.seek(0)
    torch.load(buf, weights_only=True)


def _preload(modules: tuple) -> None:
    """Import the user's modules (custom ops, NPU plugins) before checking."""
    import importlib

    for module in modules or ():
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(f"--preload {module}: {exc}") from exc


def pick_device(device: str, device_id: Optional[int]) -> str:
    """The device to run on: ``device`` itself unless it is ``auto``/empty; then ``cuda:N`` or ``npu:N``
    (N = ``device_id``, 0 by default) where one is present, else ``cpu``."""
    if device not in ("auto", ""):
        return device
    import torch

    if torch.cuda.is_available():
        return f"cuda:{device_id or 0}"
    try:
        import torch_npu  # noqa: F401

        if torch.npu.is_available():  # type: ignore[attr-defined]
            return f"npu:{device_id or 0}"
    except Exception:  # noqa: BLE001
        pass
    return "cpu"


class _Worker:
    def __init__(self, ctx: Any, init: tuple):
        self.parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, init), daemon=True)
        self.proc.start()
        child.close()
        self.task: Optional[tuple] = None
        self.started = 0.0
        self.ready = False

    def send(self, idx: int, name: str) -> None:
        self.task = (idx, name)
        self.started = time.monotonic()
        self.parent.send((idx, name))

    def stop(self, kill: bool = False) -> None:
        if self.proc.is_alive():
            if kill:
                self.proc.kill()
            else:
                try:
                    self.parent.send(None)
                except (OSError, BrokenPipeError):
                    pass
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=5)


def run_ut(api_info: str, out_path: str = ".", *, workers: int = 1, devices: Optional[list] = None,
           config: Optional[str] = None, filter_api: bool = False, result_csv: Optional[str] = None,
           save_error_data_flag: bool = False, timeout: float = DEFAULT_TIMEOUT, step: Optional[int] = None,
           rank: Any = None, storage_options: Optional[dict] = None, options: Optional[CheckOptions] = None,
           progress: Optional[bool] = True, device: str = "auto", preload: tuple = (),
           max_input_mb: Optional[float] = None) -> dict:
    """Check every forward API record of one rank of ``api_info``; returns a summary dict.

    ``workers=0`` checks in this process (no timeout or crash isolation); ``workers>=1``
    uses that many worker processes, spread over ``devices`` (ids) when CUDA/NPU is present.
    ``preload``: modules every checking process imports first (custom ops, plugins).
    ``max_input_mb``: the ceiling of one API's generated inputs (over the config's ``max_input_mb``,
    over ``options.max_input_bytes``; by default the memory available at the start shared among the
    workers, :func:`msprobe.run_ut.memory.default_input_ceiling`); an API above it gets a SKIP row,
    counted in the summary's ``skipped_input_ceiling`` with the ceiling and how it was chosen.
    """
    started = time.perf_counter()
    cfg = load_run_ut_config(config)
    options = options or CheckOptions()
    options = CheckOptions(**{**options.__dict__, "white_list": cfg.get("white_list", options.white_list),
                              "black_list": cfg.get("black_list", options.black_list), "device": device})
    if max_input_mb is not None or "max_input_mb" in cfg:  # the CLI over the config over the default
        max_mb = max_input_mb if max_input_mb is not None else cfg["max_input_mb"]
        if not isinstance(max_mb, (int, float)) or isinstance(max_mb, bool) or not 0 < max_mb < float("inf"):
            raise ConfigError(f"max_input_mb={max_mb!r}: a number of MiB > 0 is needed")
        options.max_input_bytes = int(max_mb * (1 << 20))
        ceiling_how = f"{'--max-input-mb' if max_input_mb is not None else 'config max_input_mb'} {max_mb:g}"
    else:
        ceiling_how = "options.max_input_bytes"
    dump, src = open_rank(api_info, step=step, rank=rank, storage_options=storage_options)
    names, backward = list_tasks(dump, src, filter_api=filter_api)
    if not names:
        _no_api_records(api_info, src)
    # an out_path that is not a local directory (s3://..., a registered store's URL): the CSVs are
    # written in a temporary directory and published into its store at the end
    local_out = local_path_of(out_path)
    work_dir = local_out if local_out is not None else tempfile.mkdtemp(prefix="msprobe_run_ut_")
    try:
        writer = ResultWriter(work_dir, resume_from=result_csv, precision=cfg.get("precision", 14))
    except BaseException:
        _drop_work_dir(work_dir, local_out)
        raise
    error_data = None
    if save_error_data_flag:
        base = cfg.get("error_data_path", out_path)
        error_data = join_location(base, f"ut_error_data{time.strftime('%Y%m%d%H%M%S')}")
    todo = [(index, name) for index, name in enumerate(names) if name[: -len(".forward")] not in writer.done]
    resumed = len(names) - len(todo)
    if options.max_input_bytes == AUTO_CEILING:  # shared by the processes that check at the same time
        options.max_input_bytes, ceiling_how = default_input_ceiling(_pool_size(workers, len(todo)))
    prog = _Progress(len(todo), progress)
    init = (api_info, step, rank, storage_options, options, error_data, tuple(preload))
    try:
        if workers <= 0:
            _preload(tuple(preload))
            checker = _Checker(api_info, step, rank, storage_options,
                               CheckOptions(**{**options.__dict__, "device": pick_device(device, None)}), error_data)
            for _, name in todo:
                res = checker.check(name)
                writer.write(res)
                prog.tick(res)
        else:
            _run_pool(todo, init, workers, devices or [0], timeout, writer, prog, backward)
        writer.close()
        result_path, details_path = writer.result_path, writer.details_path
        if local_out is None and result_csv is None:
            result_path, details_path = upload_files(out_path, work_dir, [os.path.basename(result_path),
                                                                          os.path.basename(details_path)],
                                                     storage_options)
    finally:
        writer.close()
        prog.done()
        _drop_work_dir(work_dir, local_out)
    return {"result_csv": result_path, "details_csv": details_path, "apis": len(names),
            "checked": prog.n, "resumed": resumed, "counts": dict(writer.counts), "api_counts": dict(prog.counts),
            "error_data": error_data, "input_ceiling_bytes": options.max_input_bytes, "input_ceiling": ceiling_how,
            "skipped_input_ceiling": prog.causes.get("input_ceiling", 0),
            "seconds": time.perf_counter() - started, "apis_per_second": prog.n / max(prog.elapsed(), 1e-9)}


def _drop_work_dir(work_dir: str, local_out: Optional[str]) -> None:
    """Remove the temporary directory the CSVs of a non-local out_path were written in."""
    if local_out is None:
        shutil.rmtree(work_dir, ignore_errors=True)


def _pool_size(workers: int, tasks: int) -> int:
    """The processes checking at the same time: ``workers`` (0: this one), never more than the tasks or 64."""
    return max(1, min(workers, tasks or 1, 64))


def _run_pool(todo: list, init: tuple, n_workers: int, devices: list, timeout: float, writer: ResultWriter,
              prog: "_Progress", backward: set) -> None:
    import multiprocessing as mp
    from multiprocessing.connection import wait

    ctx = mp.get_context("spawn")
    n_workers = _pool_size(n_workers, len(todo))
    pool = [_Worker(ctx, init + (devices[index % len(devices)],)) for index in range(n_workers)]
    queue = list(todo)
    queue.reverse()
    pending: dict = {}
    next_idx = 0
    order = [index for index, _ in todo]

    def emit(idx: int, res: ApiResult) -> None:
        nonlocal next_idx
        pending[idx] = res
        while next_idx < len(order) and order[next_idx] in pending:
            result = pending.pop(order[next_idx])
            writer.write(result)
            prog.tick(result)
            next_idx += 1

    def fail(worker: _Worker, why: str) -> None:
        idx, name = worker.task  # type: ignore[misc]
        short = name[: -len(".forward")]
        has_bwd = short + ".backward" in backward
        emit(idx, skip_result(short, why, has_bwd))
        worker.task = None

    fatal: Optional[str] = None
    try:
        while queue or any(worker.task for worker in pool):
            for worker in pool:
                if worker.ready and worker.task is None and queue:
                    worker.send(*queue.pop())
            conns = [worker.parent for worker in pool] + [worker.proc.sentinel for worker in pool]
            ready = wait(conns, timeout=0.5)
            now = time.monotonic()
            for index, worker in enumerate(pool):
                got = False
                if worker.parent in ready:
                    try:
                        kind, idx, payload = worker.parent.recv()
                        got = True
                    except (EOFError, OSError):
                        kind = "dead"
                    if got and kind == "ready":
                        worker.ready = True
                    elif got and kind == "done":
                        worker.task = None
                        emit(idx, payload)
                    elif got and kind == "fatal":
                        fatal = payload
                        raise ConfigError(f"run_ut worker could not start: {payload}")
                if ((not got and worker.proc.sentinel in ready and not worker.proc.is_alive())
                        or (not got and worker.parent in ready)):
                    code = worker.proc.exitcode
                    if worker.task:
                        fail(worker, f"The worker process died while checking this API (exit code {code}); "
                                "the run went on.")
                    elif not worker.ready:
                        raise ConfigError(f"run_ut worker exited before it was ready (exit code {code})")
                    worker.stop(kill=True)
                    pool[index] = _Worker(ctx, init + (devices[index % len(devices)],))
                    continue
                if worker.task and now - worker.started > timeout:
                    fail(worker, f"Timed out: the API ran longer than {timeout:g} s; its worker was stopped and "
                                 "the run went on.")
                    worker.stop(kill=True)
                    pool[index] = _Worker(ctx, init + (devices[index % len(devices)],))
    finally:
        for worker in pool:
            worker.stop(kill=fatal is not None)


class _Progress:
    """run_ut's progress (:class:`msprobe.progress.Progress`): APIs done, each counted once by its
    worst status (forward, or backward when forward passes), the same counts the final line shows."""

    def __init__(self, total: int, enabled: Optional[bool]):
        self.n = 0
        self.t0 = time.perf_counter()
        self.counts: dict = {}
        self.causes: dict = {}  #: skip causes (ApiResult.skip_cause) -> APIs
        self._bar = Progress(total, "run_ut", "APIs", enabled=enabled)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def tick(self, res: ApiResult) -> None:
        self.n += 1
        status = res.forward if res.forward != "pass" or not res.backward else worst_of(res.forward, res.backward)
        self.counts[status] = self.counts.get(status, 0) + 1
        if res.skip_cause:
            self.causes[res.skip_cause] = self.causes.get(res.skip_cause, 0) + 1
        self._bar.set_postfix(", ".join(f"{key} {count}" for key, count in sorted(self.counts.items())))
        self._bar.update()

    def done(self) -> None:
        self._bar.close()


def worst_of(first: str, second: str) -> str:
    return worst([first, second])
