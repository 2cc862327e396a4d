"""``PrecisionDebugger`` with msprobe's documented PyTorch API."""
from __future__ import annotations

import os
import random
import threading
from typing import Any, Optional

from msprobe.dumpers.config import check_seed_args, load_config
from msprobe.errors import ConfigError

__all__ = ["PrecisionDebugger", "seed_all", "module_dump", "module_dump_end"]

_LOCK = threading.Lock()


class PrecisionDebugger:
    """One debugger per process: instantiating it again returns the same object (the docs' cross-file use)."""

    _instance: Optional["PrecisionDebugger"] = None

    def __new__(cls, *args: Any, **kwargs: Any) -> "PrecisionDebugger":
        with _LOCK:
            if cls._instance is None:
                inst = super().__new__(cls)
                inst._initialized = False
                cls._instance = inst
            return cls._instance

    def __init__(self, config_path: Optional[str] = None, task: Optional[str] = None,
                 dump_path: Optional[str] = None, level: Optional[str] = None, model: Any = None,
                 step: Optional[list] = None, storage_options: Optional[dict] = None, **kwargs: Any):
        if self._initialized:
            return
        if step is not None and not isinstance(step, list):
            raise ConfigError(f"invalid step={step!r}; valid: a list of integers or 'a-b' strings")
        self.config = load_config(config_path, task=task, dump_path=dump_path, level=level, step=step,
                                  storage_options=storage_options, **kwargs)
        self.dumper = self._new_dumper(self.config)
        self.model = model
        self._initialized = True
        import atexit

        atexit.register(self._at_exit)

    def _new_dumper(self, config):
        if config.level == "L2":
            from msprobe.dumpers.pytorch._kernel_dump import KernelDumper

            return KernelDumper(config)
        from msprobe.dumpers.pytorch._dumper import TorchDumper

        return TorchDumper(config)

    # documented API -------------------------------------------------------
    @classmethod
    def _get(cls) -> "PrecisionDebugger":
        if cls._instance is None or not cls._instance._initialized:
            raise ConfigError("PrecisionDebugger has not been created")
        return cls._instance

    @classmethod
    def start(cls, model: Any = None, token_range: Optional[list] = None) -> None:
        self = cls._get()
        self.dumper.start(model if model is not None else self.model, token_range)

    @classmethod
    def stop(cls) -> None:
        cls._get().dumper.stop()

    @classmethod
    def forward_backward_dump_end(cls) -> None:
        cls.stop()

    @classmethod
    def step(cls) -> None:
        cls._get().dumper.step()

    @classmethod
    def save(cls, variable: Any, name: str, save_backward: bool = True) -> None:
        self = cls._get()
        if self.config.level != "debug":
            return
        if not isinstance(name, str) or not name or "/" in name or ".." in name:
            raise ConfigError(f"invalid save name {name!r}; valid: a non-empty string without '/' or '..'")
        self.dumper.save(variable, name, save_backward)

    @classmethod
    def set_init_step(cls, step: int) -> None:
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ConfigError(f"invalid init step {step!r}; valid: an integer >= 0")
        cls._get().dumper.session.current_step = step

    @classmethod
    def register_custom_api(cls, module: Any, api_name: str, api_prefix: Optional[str] = None) -> None:
        self = cls._get()
        from msprobe.format.naming import register_prefix

        if not isinstance(api_name, str) or not callable(getattr(module, api_name, None)):
            raise ConfigError(f"invalid custom API {api_name!r}: {getattr(module, '__name__', module)!r} "
                              "has no such callable attribute")
        if api_prefix is not None and not isinstance(api_prefix, str):
            raise ConfigError(f"invalid api_prefix {api_prefix!r}; valid: a string")
        prefix = api_prefix or getattr(module, "__name__", type(module).__name__).split(".")[-1].capitalize()
        register_prefix(prefix)
        patcher = self.dumper.patcher
        patcher.extra[(id(module), api_name)] = (module, f"{prefix}.{api_name}")
        if patcher.installed:
            patcher._wrap(module, api_name, getattr(module, api_name), f"{prefix}.{api_name}", self.dumper._on_api)

    @classmethod
    def restore_custom_api(cls, module: Any, api_name: str) -> None:
        self = cls._get()
        patcher = self.dumper.patcher
        patcher.extra.pop((id(module), api_name), None)
        keep = []
        for item in patcher._saved:
            target, name, orig, owned = item
            if target is module and name == api_name:
                setattr(target, name, orig)
            else:
                keep.append(item)
        patcher._saved = keep

    def _at_exit(self) -> None:
        try:
            self.dumper.close()
        except Exception:
            pass

    @classmethod
    def _reset(cls) -> None:
        """Tear down the process's debugger (tests)."""
        if cls._instance is not None and cls._instance._initialized:
            cls._instance.dumper.close()
        cls._instance = None


def module_dump(module: Any, name: str) -> None:
    """Dump one module's forward/backward (and the APIs inside) under ``name``."""
    import torch

    dbg = PrecisionDebugger._get()
    d = dbg.dumper
    if not isinstance(module, torch.nn.Module):
        raise ConfigError(f"module_dump needs a torch.nn.Module, got {type(module).__name__}")
    if not any(module is m for m in d._hooked_models):
        d._hooked_models.append(module)
        d._hook_module(module, f"Module.{name}.{type(module).__name__}")
    d.enabled = True
    if d.L1 or d.config.level == "L0":
        d.patcher.install(d._on_api)


def module_dump_end() -> None:
    PrecisionDebugger._get().dumper.enabled = False


def seed_all(seed: int = 1234, mode: bool = False, rm_dropout: bool = True) -> None:
    """Fix every source of randomness the docs list, and optionally disable dropout."""
    check_seed_args(seed, mode, rm_dropout)
    import numpy as np
    import torch

    random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed(seed)
        torch.cuda.manual_seed_all(seed)
    from msprobe.dumpers.pytorch._npu import set_npu_seeds

    set_npu_seeds(seed, mode)  # torch_npu present: NPU seeds (+ deterministic collectives with mode)
    if mode:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.enabled = True
    torch.backends.cudnn.benchmark = False
    if rm_dropout:
        _remove_dropout()


def _remove_dropout() -> None:
    import torch.nn.functional as F

    def zero_p(fn):
        def wrapper(input, p=0.5, *args, **kwargs):
            return fn(input, 0.0, *args, **kwargs)

        wrapper.__name__ = getattr(fn, "__name__", "dropout")
        return wrapper

    for name in ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"):
        fn = getattr(F, name, None)
        if fn is not None and not getattr(fn, "__msprobe_no_dropout__", False):
            w = zero_p(fn)
            w.__msprobe_no_dropout__ = True
            setattr(F, name, w)
