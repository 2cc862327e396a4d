"""config.json as msprobe documents it (02.config_introduction), validated up front.

Arguments of ``PrecisionDebugger`` override the file. Every invalid value is a
:class:`ConfigError` naming the key, the bad value and the valid values.
Unknown keys warn, naming the nearest valid key (``unknown key 'levle' ignored; did you
mean 'level'?``): newer msprobe releases add keys such as ``risk_level`` and
``extra_info``. In strict mode (``"strict_config": true`` in config.json, or the
environment variable ``MSPROBE_STRICT_CONFIG=1``; ``msprobe validate-config`` always checks
so) an unknown key is a :class:`ConfigError` instead.
"""
from __future__ import annotations

import builtins
import difflib
import functools
import os
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

from msprobe.errors import ConfigError, invalid_value, read_json_object
from msprobe.online.config import parse_online, section_with_fallback

__all__ = ["DumpConfig", "load_config", "parse_int_list", "unknown_keys", "TASKS", "LEVELS", "SUMMARY_MODES",
           "DATA_MODES"]

TASKS = ("statistics", "tensor", "structure", "overflow_check")
DUMP_TASKS = ("statistics", "tensor", "structure", "overflow_check")
#: tasks of config.json that PrecisionDebugger does not run here: refused, saying so
NOT_DEBUGGER_TASKS = {
    "run_ut": "task 'run_ut' is not a dump task: dump with task 'statistics' or 'tensor' (level L1), then run "
              "'msprobe run_ut -api_info DUMP' (docs/run_ut.md); online checking: 'online_run_ut' in the "
              "dump task's section",
    "acc_check": "task 'acc_check' is not a dump task: dump with task 'statistics' or 'tensor' (level L1), then "
                 "run 'msprobe acc_check -api_info DUMP' (docs/run_ut.md)",
    "free_benchmark": "task 'free_benchmark' (no-benchmark perturbation checking) is not implemented by "
                      "msprobe-lake's PrecisionDebugger; valid tasks: statistics, tensor, structure, overflow_check",
    "grad_probe": "task 'grad_probe' (gradient monitoring) is not implemented by msprobe-lake's "
                  "PrecisionDebugger; valid tasks: statistics, tensor, structure, overflow_check",
}
LEVELS = ("L0", "L1", "mix", "L2", "debug")
SUMMARY_MODES = ("statistics", "md5", "xor")
DATA_MODES = ("all", "forward", "backward", "input", "output")
TENSOR_STORES = ("files", "zarr")
RUN_DIR_POLICIES = ("overwrite", "clear", "refuse")

_TOP_KEYS = {
    "task", "dump_path", "rank", "step", "level", "enable_dataloader", "async_dump", "seed", "is_deterministic",
    "acl_config", "framework", "precision", "storage_options", "journal_flush", "journal_fsync", "fsync_tensors", "index", "tensor_store",
    "tensor_compression", "tensor_shard_mb", "stack", "run_dir_policy", "dialect", "max_bytes_in_flight", "writer_workers", "strict",
    "storage_timeout", "journal_window", "strict_config",
    # known keys of newer/older msprobe releases that we accept and ignore
    "risk_level", "extra_info", "dump_enable", "online_run_ut", "nfs_path", "host", "port", "tls_path",
    "online_run_ut_recompute", "dump_generate", "is_online",
    "rank_list", "online_queue_size", "online_queue_bytes", "online_flush_timeout", "poll_interval",
}
_TASK_KEYS = {
    "scope", "list", "tensor_list", "data_mode", "summary_mode", "file_format", "online_run_ut", "nfs_path", "host",
    "port", "tls_path", "online_run_ut_recompute", "overflow_nums", "check_mode", "device", "precision",
    "white_list", "black_list", "error_data_path", "is_online", "rank_list", "bench_path", "diff_nums",
    "async_dump", "jit_level", "fuzz_device", "pert_mode", "handler_type", "fuzz_level", "fuzz_stage", "if_preheat",
    "preheat_step", "max_sample", "grad_level", "param_list", "bounds",
    # our online_run_ut keys (msprobe.online.config)
    "online_queue_size", "online_queue_bytes", "online_flush_timeout", "poll_interval",
}


def parse_int_list(key: str, value: Any) -> Optional[set]:
    """``[0, 2, "4-6"]`` -> {0, 2, 4, 5, 6}; ``[]``/None -> None (all)."""
    if value is None or value == []:
        return None
    if not isinstance(value, list):
        raise invalid_value(key, value, "a list of integers >= 0 and 'a-b' range strings, e.g. [0, 2, \"4-6\"]")
    out: set = set()
    for item in value:
        if isinstance(item, bool):
            raise invalid_value(key, item, "integers >= 0 or 'a-b' strings")
        if isinstance(item, int):
            if item < 0:
                raise invalid_value(key, item, "integers >= 0 or 'a-b' strings")
            out.add(item)
        elif isinstance(item, str) and re.fullmatch(r"\d+-\d+", item.strip()):
            a, b = (int(x) for x in item.strip().split("-"))
            if a > b:
                raise invalid_value(key, item, "a range 'a-b' with a <= b")
            out.update(range(a, b + 1))
        elif isinstance(item, str) and item.strip().isdigit():
            out.add(int(item))
        else:
            raise invalid_value(key, item, "integers >= 0 or 'a-b' strings")
    return out


@dataclass
class DumpConfig:
    task: str = "statistics"
    dump_path: str = "./dump_path"
    rank: Optional[set] = None
    step: Optional[set] = None
    level: str = "L1"
    async_dump: bool = False
    scope: list = field(default_factory=builtins.list)
    list: list = field(default_factory=builtins.list)
    tensor_list: builtins.list = field(default_factory=builtins.list)
    data_mode: builtins.list = field(default_factory=lambda: ["all"])
    summary_mode: str = "statistics"
    overflow_nums: int = 1
    storage_options: Optional[dict] = field(default=None, repr=False)  # credentials: never in a repr
    # our own keys (spec/FORMAT.md, "Producer options")
    # records per journal flush; None (default): 1 on local/shared directories (each record is
    # os.write'n as it completes: a SIGKILL loses none), 64 on object stores (plus journal_window)
    journal_flush: Optional[int] = None
    journal_window: float = 1.0  # object stores: seconds a completed record may wait for its journal flush
    storage_timeout: float = 30.0  # seconds per storage operation of the dumper, retries included
    journal_fsync: bool = False  # fsync each journal flush and published document (power-loss safety) or not (process-kill safety)
    fsync_tensors: bool = False  # fsync each tensor file (power-loss safety); renames stay atomic either way
    index: bool = False  # write the Parquet side index at publish
    tensor_store: str = "files"  # "files": one .pt per tensor (msprobe); "zarr": tensors.zarr (section 21)
    tensor_compression: str = "lz4"  # zarr store: "lz4" (blosc lz4 + byte shuffle), "zstd" (blosc zstd-1 bitshuffle), "zstd-byteshuffle", "none"
    tensor_shard_mb: int = 128  # zarr store: raw MiB per shard object
    stack: bool = True  # capture stack.json
    # 'overwrite' (msprobe's behaviour; the steps of an earlier run this run does not write are named in a
    # warning at the end) | 'clear' (this rank directory of every step is removed at the first write) | 'refuse'
    run_dir_policy: str = "overwrite"
    max_bytes_in_flight: int = 1 << 30
    writer_workers: int = 4
    strict: bool = False  # storage errors raise at step()/stop() when True
    extra: dict = field(default_factory=dict)
    online: Any = None  # msprobe.online.config.OnlineSettings when online_run_ut is on

    def validate(self) -> "DumpConfig":
        """The config itself, once each field passed its rule of ``_RULES`` (the first failing one
        raises the :class:`ConfigError` naming its key, its value and the valid values)."""
        if self.task in NOT_DEBUGGER_TASKS:
            raise ConfigError(NOT_DEBUGGER_TASKS[self.task])
        for key, accepts, valid in _RULES:
            value = getattr(self, key)
            if not accepts(value):
                raise invalid_value(key, "<redacted>" if key in _SECRET_FIELDS else value, valid)
        return self

    @property
    def forward_enabled(self) -> bool:
        return _directions(self.data_mode)[0]

    @property
    def backward_enabled(self) -> bool:
        return _directions(self.data_mode)[1]

    @property
    def input_enabled(self) -> bool:
        return _directions(self.data_mode)[2]

    @property
    def output_enabled(self) -> bool:
        return _directions(self.data_mode)[3]


def _directions(data_mode: Any) -> tuple:
    """(forward, backward, input, output) enabled by ``data_mode`` (asked at every call: computed once)."""
    if type(data_mode) is list and len(data_mode) == 1:  # the common case (["all"]): no tuple, no lru_cache
        known = _ONE_MODE.get(data_mode[0]) if type(data_mode[0]) is str else None
        if known is not None:
            return known
    if type(data_mode) in (list, tuple):  # (a str would be read as its characters by the cache key)
        try:
            return _directions_of(tuple(data_mode))
        except TypeError:  # an unhashable item (not validated yet)
            pass
    return _directions_of.__wrapped__(data_mode)


@functools.lru_cache(maxsize=64)
def _directions_of(data_mode: Any) -> tuple:
    fb = not ({"forward", "backward"} & set(data_mode))
    io = not ({"input", "output"} & set(data_mode))
    return ("all" in data_mode or "forward" in data_mode or fb, "all" in data_mode or "backward" in data_mode or fb,
            "all" in data_mode or "input" in data_mode or io, "all" in data_mode or "output" in data_mode or io)


#: the directions of each one-item data_mode
_ONE_MODE = {mode: _directions_of((mode,)) for mode in DATA_MODES}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_seconds(value: Any, top: int) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= top


def _names(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) and item for item in value)


_COMPRESSIONS = ["zstd", "zstd-byteshuffle", "lz4", "none"]
#: fields whose value an error never shows
_SECRET_FIELDS = {"storage_options"}
#: ``DumpConfig.validate``'s rules, in the order they are checked: (field, whether a value is
#: accepted, the valid values as the error names them)
_RULES: tuple = (
    ("task", lambda value: value in TASKS, list(DUMP_TASKS)),
    ("level", lambda value: value in LEVELS, list(LEVELS)),
    ("summary_mode", lambda value: value in SUMMARY_MODES, list(SUMMARY_MODES)),
    ("data_mode", lambda value: isinstance(value, list) and bool(value) and all(mode in DATA_MODES for mode in value),
     f"a non-empty list of {list(DATA_MODES)}"),
    ("data_mode", lambda value: "all" not in value or len(value) == 1, "'all' alone, or a combination of the others"),
    ("scope", _names, "a list of non-empty strings"),
    ("list", _names, "a list of non-empty strings"),
    ("tensor_list", _names, "a list of non-empty strings"),
    ("scope", lambda value: not value or len(value) == 2, "exactly two names [start, end]"),
    ("dump_path", lambda value: isinstance(value, str) and bool(value), "a non-empty path or URL string"),
    ("async_dump", lambda value: isinstance(value, bool), "true or false"),
    ("overflow_nums", lambda value: _is_int(value) and (value >= 1 or value == -1),
     "an integer >= 1, or -1 for no limit"),
    ("tensor_store", lambda value: value in TENSOR_STORES, list(TENSOR_STORES)),
    ("tensor_compression", lambda value: value in _COMPRESSIONS, _COMPRESSIONS),
    ("tensor_shard_mb", lambda value: _is_int(value) and 1 <= value <= 4096,
     "an integer from 1 to 4096 (MiB per shard)"),
    ("run_dir_policy", lambda value: value in RUN_DIR_POLICIES, list(RUN_DIR_POLICIES)),
    ("journal_flush", lambda value: value is None or _is_int(value) and value >= 1,
     "an integer >= 1 (records per flush), or null (auto)"),
    ("journal_window", lambda value: _is_seconds(value, 3600), "a number of seconds in (0, 3600]"),
    ("storage_timeout", lambda value: _is_seconds(value, 3600), "a number of seconds in (0, 3600]"),
    ("storage_options", lambda value: value is None or isinstance(value, dict), "a JSON object"),
)


def read_config_json(config_path: str) -> dict:
    """The JSON object of a config.json; :class:`ConfigError` when it is missing or not one."""
    return read_json_object(config_path, "config_path")


def check_seed_args(seed: Any, mode: Any, rm_dropout: Any) -> None:
    """The arguments of ``seed_all(seed, mode, rm_dropout)`` (both frameworks)."""
    if not isinstance(seed, int) or isinstance(seed, bool) or not (0 <= seed <= 2 ** 32 - 1):
        raise ConfigError(f"invalid seed {seed!r}; valid: an integer in [0, 4294967295]")
    if not isinstance(mode, bool) or not isinstance(rm_dropout, bool):
        raise ConfigError("mode and rm_dropout must be booleans")


def _did_you_mean(key: str, known: Any) -> str:
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_keys(raw: dict) -> list:
    """(key, hint) for each key of the config object ``raw`` that this dumper does not know: the
    key as ``'levle'`` or ``statistics.lsit``, the hint naming the nearest valid key
    (`` (did you mean 'level'?)``) or empty."""
    top = _TOP_KEYS | set(TASKS) | set(NOT_DEBUGGER_TASKS)
    out = [(repr(k), _did_you_mean(k, top)) for k in raw if k not in top]
    task = raw.get("task", "statistics")
    sub = raw.get(task) if isinstance(task, str) else None
    if isinstance(sub, dict):
        out += [(f"{task}.{k}", _did_you_mean(k, _TASK_KEYS)) for k in sub if k not in _TASK_KEYS]
    return out


def strict_config(raw: dict) -> bool:
    """Strict mode: ``"strict_config": true`` in the config, or ``MSPROBE_STRICT_CONFIG=1``."""
    flag = raw.get("strict_config", False)
    if not isinstance(flag, bool):
        raise invalid_value("strict_config", flag, "true or false")
    return flag or os.environ.get("MSPROBE_STRICT_CONFIG", "") not in ("", "0")


def load_config(config_path: Optional[str] = None, **overrides: Any) -> DumpConfig:
    """Read config.json (if given) and apply non-None ``overrides`` (task, dump_path, level, step, ...).

    An unknown key warns, naming the nearest valid key; in strict mode (:func:`strict_config`)
    it raises :class:`ConfigError`."""
    raw: dict = read_config_json(config_path) if config_path is not None else {}
    for k, v in overrides.items():
        if v is not None:
            raw[k] = v
    cfg = DumpConfig()
    unknown = unknown_keys(raw)
    if unknown and strict_config(raw):
        where = f" of {config_path}" if config_path is not None else ""
        raise ConfigError(f"msprobe config{where} (strict_config): "
                          + "; ".join(f"unknown key {k}{hint}" for k, hint in unknown))
    for k, hint in unknown:
        warnings.warn(f"msprobe config: unknown key {k} ignored{hint}", stacklevel=3)
    task = raw.get("task", "statistics")
    cfg.task = task
    if "dump_path" in raw:
        cfg.dump_path = raw["dump_path"]
    cfg.rank = parse_int_list("rank", raw.get("rank"))
    cfg.step = parse_int_list("step", raw.get("step"))
    cfg.level = raw.get("level", "L1")
    if task == "structure" and cfg.level == "L1":  # as 8.1.1: the structure of an API-level dump is mix's
        warnings.warn("msprobe config: task 'structure' with level 'L1' has no structure to dump; "
                      "level 'mix' is used", stacklevel=3)
        cfg.level = "mix"
    if raw.get("enable_dataloader", False) is not False:
        raise invalid_value("enable_dataloader", raw["enable_dataloader"],
                    "false (the automatic DataLoader-driven dump is not implemented here, and deprecated by "
                    "msprobe; call start/stop/step)")
    cfg.async_dump = raw.get("async_dump", False)
    for key in ("storage_options", "journal_flush", "journal_fsync", "fsync_tensors", "index", "tensor_store", "tensor_compression",
                "tensor_shard_mb", "stack", "run_dir_policy",
                "max_bytes_in_flight", "writer_workers", "strict", "storage_timeout", "journal_window"):
        if key in raw:
            setattr(cfg, key, raw[key])
    sub = raw.get(task) if isinstance(task, str) else None
    if sub is not None and not isinstance(sub, dict):
        raise invalid_value(task, sub, "a JSON object of task options")
    for k, v in (sub or {}).items():
        if k not in _TASK_KEYS:  # (warned above)
            continue
        if k in ("scope", "list", "tensor_list", "data_mode", "summary_mode", "overflow_nums"):
            setattr(cfg, k, v)
        else:
            cfg.extra[k] = v
    if isinstance(cfg.data_mode, str):
        cfg.data_mode = [cfg.data_mode]
    _online(cfg, raw, task)
    return cfg.validate()


def _online(cfg: DumpConfig, raw: dict, task: Any) -> None:
    """online_run_ut (docs 08): API packets go to a checker instead of dump files."""
    sec = section_with_fallback(raw, task if isinstance(task, str) else "")
    cfg.online = parse_online(sec, side="training", storage_options=cfg.storage_options)
    if cfg.online is not None:
        if task not in ("tensor", "statistics"):
            raise invalid_value("task", task, "'tensor' (or 'statistics') with online_run_ut")
        if raw.get("level", "L1") != "L1":
            raise invalid_value("level", raw["level"], "'L1' with online_run_ut (API-level packets)")
