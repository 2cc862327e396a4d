"""``PrecisionDebugger`` with msprobe's documented PyTorch API."""
from __future__ import annotations

import os
import random
import threading
from typing import Any, Optional

from msprobe.dumpers.config import check_seed_args, load_config
from msprobe.dumpers.pytorch._npu import set_npu_seeds
from msprobe.errors import ConfigError
from msprobe.format.naming import register_prefix

__all__ = ["PrecisionDebugger", "seed_all", "module_dump", "module_dump_end"]

_LOCK = threading.Lock()


class PrecisionDebugger:
    """One debugger per process: instantiating it again returns the same object (the docs' cross-file use)."""

    _instance: Optional["PrecisionDebugger"] = None
    initialized: bool = False  # per instance: set by __new__, then True once __init__ has run

    def __new__(cls, *args: Any, **kwargs: Any) -> "PrecisionDebugger":
        with _LOCK:
            if cls._instance is None:
                inst = super().__new__(cls)
                inst.initialized = False
                cls._instance = inst
            return cls._instance

    def __init__(self, config_path: Optional[str] = None, task: Optional[str] = None,
                 dump_path: Optional[str] = None, level: Optional[str] = None, model: Any = None,
                 step: Optional[list] = None, storage_options: Optional[dict] = None, **kwargs: Any):
        if self.initialized:
            return
        if step is not None and not isinstance(step, list):
            raise ConfigError(f"invalid step={step!r}; valid: a list of integers or 'a-b' strings")
        self.config = load_config(config_path, task=task, dump_path=dump_path, level=level, step=step,
                                  storage_options=storage_options, **kwargs)
        self.dumper = self._new_dumper(self.config)
        self.model = model
        self.initialized = True
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
    def current(cls) -> "PrecisionDebugger":
        """The process's debugger; :class:`ConfigError` when none has been created."""
        if cls._instance is None or not cls._instance.initialized:
            raise ConfigError("PrecisionDebugger has not been created")
        return cls._instance

    _get = current  # (its earlier name)

    @classmethod
    def start(cls, model: Any = None, token_range: Optional[list] = None) -> None:
        self = cls.current()
        self.dumper.start(model if model is not None else self.model, token_range)

    @classmethod
    def stop(cls) -> None:
        cls.current().dumper.stop()

    @classmethod
    def forward_backward_dump_end(cls) -> None:
        cls.stop()

    @classmethod
    def step(cls) -> None:
        cls.current().dumper.step()

    @classmethod
    def save(cls, variable: Any, name: str, save_backward: bool = True) -> None:
        self = cls.current()
        if self.config.level != "debug":
            return
        if not isinstance(name, str) or not name or "/" in name or ".." in name:
            raise ConfigError(f"invalid save name {name!r}; valid: a non-empty string without '/' or '..'")
        self.dumper.save(variable, name, save_backward)

    @classmethod
    def set_init_step(cls, step: int) -> None:
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ConfigError(f"invalid init step {step!r}; valid: an integer >= 0")
        cls.current().dumper.core.set_step(step)

    @classmethod
    def register_custom_api(cls, module: Any, api_name: str, api_prefix: Optional[str] = None) -> None:
        self = cls.current()

        if not isinstance(api_name, str) or not callable(getattr(module, api_name, None)):
            raise ConfigError(f"invalid custom API {api_name!r}: {getattr(module, '__name__', module)!r} "
                              "has no such callable attribute")
        if api_prefix is not None and not isinstance(api_prefix, str):
            raise ConfigError(f"invalid api_prefix {api_prefix!r}; valid: a string")
        prefix = api_prefix or getattr(module, "__name__", type(module).__name__).split(".")[-1].capitalize()
        register_prefix(prefix)
        self.dumper.patcher.set_custom(module, api_name, f"{prefix}.{api_name}")

    @classmethod
    def restore_custom_api(cls, module: Any, api_name: str) -> None:
        cls.current().dumper.patcher.drop_custom(module, api_name)

    def _at_exit(self) -> None:
        try:
            self.dumper.close()
        except Exception:  # noqa: BLE001 - closing must not hide the caller's own exception
            pass

    @classmethod
    def _reset(cls) -> None:
        """Tear down the process's debugger (tests)."""
        if cls._instance is not None and cls._instance.initialized:
            cls._instance.dumper.close()
        cls._instance = None


def module_dump(module: Any, name: str) -> None:
    """Dump ``module`` as one module under ``name`` (``Module.<name>.<Class>``: its forward and
    backward records), until :func:`module_dump_end`; the APIs and child modules called in
    between are not dumped. Use it between ``start()`` and ``stop()`` (the docs)."""
    import torch

    dbg = PrecisionDebugger.current()
    d = dbg.dumper
    if not isinstance(module, torch.nn.Module):
        raise ConfigError(f"module_dump needs a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"module_dump needs a non-empty str name, got {name!r}")
    key = f"Module.{name}.{type(module).__name__}"
    if d.core.dump_module(module, key):  # not hooked yet
        d.hook_module(module, key)


def module_dump_end() -> None:
    """End :func:`module_dump`: APIs and modules are dumped again, as usual, until ``stop()``."""
    PrecisionDebugger.current().dumper.core.end_module_dump()


def seed_all(seed: int = 1234, mode: bool = False, rm_dropout: bool = True, is_enhanced: bool = False) -> None:
    """Fix every source of randomness the docs' table lists; ``mode`` turns on deterministic
    algorithms; ``rm_dropout`` makes the dropout APIs use p=0; ``is_enhanced`` also fixes the
    random state (every random API call starts from the state seed_all left, as 26.2.0 does)."""
    check_seed_args(seed, mode, rm_dropout)
    if not isinstance(is_enhanced, bool):
        raise ConfigError(f"invalid is_enhanced {is_enhanced!r}; valid: true or false")
    import numpy as np
    import torch

    random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    # the docs' table (and 8.1.1): deterministic collectives, "True" with mode, else "False"
    os.environ["HCCL_DETERMINISTIC"] = str(mode)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed(seed)
        torch.cuda.manual_seed_all(seed)

    set_npu_seeds(seed, mode)  # torch_npu present: NPU seeds (+ deterministic collectives with mode)
    if mode:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    torch.use_deterministic_algorithms(mode)
    # the docs' table: cuDNN off, deterministic algorithm choice, deterministic convolutions only
    torch.backends.cudnn.enabled = False
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    if rm_dropout:
        _remove_dropout()
    if is_enhanced:
        _fix_random_state()


#: the random APIs whose state is_enhanced fixes: (module, names)
_RANDOM_APIS = (
    ("random", ("random", "randint", "randrange", "choice", "choices", "sample", "shuffle", "uniform", "gauss",
                "normalvariate", "getrandbits", "betavariate", "expovariate", "gammavariate", "lognormvariate",
                "paretovariate", "triangular", "vonmisesvariate", "weibullvariate")),
    ("numpy.random", ("rand", "randn", "randint", "random", "random_sample", "choice", "shuffle", "permutation",
                      "normal", "uniform", "binomial", "beta", "exponential", "poisson", "standard_normal")),
    ("torch", ("rand", "randn", "randint", "randperm", "normal", "bernoulli", "multinomial", "poisson",
               "rand_like", "randn_like", "randint_like")),
    ("torch.Tensor", ("uniform_", "normal_", "bernoulli_", "random_", "exponential_", "geometric_", "cauchy_",
                      "log_normal_", "bernoulli", "multinomial")),
)
_FIXED_STATE: dict = {}


def _fix_random_state() -> None:
    """Each call of a random API starts from the random state seed_all left (python, numpy,
    torch CPU and CUDA) and leaves it so: the same draws wherever the call sits in the run."""
    import importlib

    import numpy as np
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
             "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}
    _FIXED_STATE.clear()
    _FIXED_STATE.update(state)

    def restore():
        random.setstate(_FIXED_STATE["python"])
        np.random.set_state(_FIXED_STATE["numpy"])
        torch.set_rng_state(_FIXED_STATE["torch"])
        if _FIXED_STATE["cuda"] is not None:
            torch.cuda.set_rng_state_all(_FIXED_STATE["cuda"])

    def wrap(fn):
        def fixed(*args, **kwargs):
            restore()
            try:
                return fn(*args, **kwargs)
            finally:
                restore()

        fixed.__name__ = getattr(fn, "__name__", "random_api")
        fixed.__msprobe_fixed_random__ = fn
        return fixed

    for mod_name, names in _RANDOM_APIS:
        owner = torch.Tensor if mod_name == "torch.Tensor" else importlib.import_module(mod_name)
        for n in names:
            fn = getattr(owner, n, None)
            if fn is not None and not hasattr(fn, "__msprobe_fixed_random__"):
                setattr(owner, n, wrap(fn))


def _remove_dropout() -> None:
    import torch.nn.functional as F

    def zero_p(fn):
        def wrapper(input, p=0.5, *args, **kwargs):  # noqa: A002 - torch's own parameter name
            return fn(input, 0.0, *args, **kwargs)

        wrapper.__name__ = getattr(fn, "__name__", "dropout")
        return wrapper

    for name in ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"):
        fn = getattr(F, name, None)
        if fn is not None and not getattr(fn, "__msprobe_no_dropout__", False):
            w = zero_p(fn)
            w.__msprobe_no_dropout__ = True
            setattr(F, name, w)
