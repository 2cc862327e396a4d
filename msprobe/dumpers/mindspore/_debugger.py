"""``PrecisionDebugger``, ``MsprobeStep`` and ``seed_all`` with msprobe's documented MindSpore API."""
from __future__ import annotations

import os
import random
from typing import Any, Optional

from mindspore.train import Callback  # the base of MsprobeStep and MsprobeInitStep (this module needs MindSpore)

from msprobe.dumpers.config import check_seed_args
from msprobe.dumpers.pytorch._debugger import PrecisionDebugger as _BaseDebugger
from msprobe.errors import ConfigError

__all__ = ["PrecisionDebugger", "MsprobeStep", "seed_all"]


class PrecisionDebugger(_BaseDebugger):
    """One debugger per process (instantiating it again returns the same object); same
    methods as the PyTorch one: start(model, token_range), stop, step, save, set_init_step,
    register_custom_api / restore_custom_api."""

    _instance: Optional["PrecisionDebugger"] = None

    def _new_dumper(self, config):
        from msprobe.dumpers.mindspore._dumper import MindSporeDumper

        return MindSporeDumper(config)

    @classmethod
    def register_custom_api(cls, module: Any, api_name: str, api_prefix: Optional[str] = None) -> None:
        if api_prefix is None:  # the docs: the package name as a string by default
            api_prefix = getattr(module, "__name__", type(module).__name__).split(".")[0]
        super().register_custom_api(module, api_name, api_prefix)

    @classmethod
    def set_init_step(cls, step: int) -> None:
        """Also numbers the ``graph/`` session of the jit-Cell split (spec/PRODUCER.md §23.3) from ``step``."""
        super().set_init_step(step)
        split = cls.current().dumper.split_session
        if split is not None:
            split.set_step(step)


class MsprobeStep(Callback):
    """Model.train callback: ``start()`` when each step begins, ``stop()`` and ``step()`` when it ends."""

    def __init__(self, debugger: PrecisionDebugger):
        super().__init__()
        if not isinstance(debugger, PrecisionDebugger):
            raise ConfigError(f"MsprobeStep needs a msprobe.mindspore PrecisionDebugger, got {type(debugger).__name__}")
        self.debugger = debugger

    def on_train_begin(self, run_context):
        """Started before the first batch is fetched, so step 0 holds that fetch's APIs (as 26.2.0)."""
        self.debugger.start(self._network(run_context))

    def on_train_step_begin(self, run_context):
        self.debugger.start(self._network(run_context))

    def on_train_step_end(self, run_context):
        self.debugger.stop()
        self.debugger.step()

    def _network(self, run_context):
        """The model to hook: the debugger's, else none when ``start(model)`` already hooked one
        (the documented use), else Model.train's network at L0/mix."""
        if self.debugger.model is not None:
            return self.debugger.model
        if self.debugger.dumper.core.has_models():  # start(model) before Model.train (the docs' GRAPH_MODE use)
            return None
        if self.debugger.config.level in ("L0", "mix"):
            params = run_context.original_args()
            return getattr(params, "train_network", None) or getattr(params, "network", None)
        return None


class MsprobeInitStep(Callback):
    """Model.train callback for resumed training: numbers the dumped steps from the global step
    the run resumes at, through :meth:`PrecisionDebugger.set_init_step`, before the first step.

    The global step is read from Model.train's callback parameters when the first step begins:
    ``cur_step_num - 1`` (a step count the framework restored) or, with ``initial_epoch``, the
    steps of the epochs already done, ``(cur_epoch_num - 1) * batch_num``, whichever is larger.
    Put it before :class:`MsprobeStep` in the callback list."""

    def __init__(self):
        super().__init__()
        self._set = False

    def on_train_step_begin(self, run_context):
        if self._set:
            return
        self._set = True
        params = run_context.original_args()
        step_num = int(params.get("cur_step_num", 1) or 1)
        epoch = int(params.get("cur_epoch_num", 1) or 1)
        batches = int(params.get("batch_num", 0) or 0)
        PrecisionDebugger.set_init_step(max(step_num - 1, (epoch - 1) * batches, 0))


def seed_all(seed: int = 1234, mode: bool = False, rm_dropout: bool = True) -> None:
    """Fix the randomness the docs list (random, numpy, MindSpore's global seed, PYTHONHASHSEED);
    ``mode`` turns on deterministic kernels; ``rm_dropout`` makes the documented dropout APIs no-ops
    (call it before the Dropout layers are created)."""
    check_seed_args(seed, mode, rm_dropout)
    import mindspore
    import numpy as np

    random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    np.random.seed(seed)
    mindspore.set_seed(seed)
    # mode: deterministic kernels and reduce collectives (the docs); "False"/"OFF" without it (as 26.2.0)
    mindspore.set_context(deterministic="ON" if mode else "OFF")
    os.environ["HCCL_DETERMINISTIC"] = str(mode)
    if rm_dropout:
        _remove_dropout()


def _identity_first(fn):
    def no_dropout(*args, **kwargs):
        return args[0] if args else kwargs.get("input", kwargs.get("x"))

    no_dropout.__name__ = getattr(fn, "__name__", "dropout")
    no_dropout.__msprobe_no_dropout__ = True
    return no_dropout


def _remove_dropout() -> None:
    """ops.Dropout/Dropout2D/Dropout3D and mint.nn.Dropout keep their input; ops.Dropout returns
    (output, mask) so the mask is all ones; mint.nn.functional.dropout returns its input."""
    import mindspore
    from mindspore import mint, ops

    def prim_call(self, x, *args, **kwargs):
        return x, mindspore.ops.ones_like(x).astype(mindspore.bool_)

    for name in ("Dropout", "Dropout2D", "Dropout3D"):
        cls = getattr(ops, name, None)
        if cls is not None and not getattr(cls, "__msprobe_no_dropout__", False):
            cls.__call__ = prim_call
            cls.__msprobe_no_dropout__ = True
    mint_dropout = getattr(mint.nn, "Dropout", None)
    if mint_dropout is not None and not getattr(mint_dropout, "__msprobe_no_dropout__", False):
        mint_dropout.construct = lambda self, input: input
        mint_dropout.__msprobe_no_dropout__ = True
    f = mint.nn.functional
    if not getattr(f.dropout, "__msprobe_no_dropout__", False):
        f.dropout = _identity_first(f.dropout)
