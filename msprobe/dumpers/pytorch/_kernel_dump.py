"""Level L2: kernel dump of one API per step through torch_npu's ACL dump interface.

torch_npu exposes the Ascend runtime's dump switch as ``torch_npu.npu.init_dump()``,
``set_dump(config_json)`` and ``finalize_dump()``: between ``set_dump`` and ``finalize_dump`` the
runtime writes every kernel the NPU runs to ``{dump_path}/{timestamp}/{device}/...`` as
``{op_type}.{op_name}.{task_id}.{stream_id}.{timestamp}`` files. This module opens that window
around exactly one API call per step, the one named in ``list``:

- ``{api}.{n}.forward``: around the API call itself;
- ``{api}.{n}.backward``: around the autograd node that produced the API's first output
  (pre-hook opens, hook closes), so the kernels of that node's backward are dumped.

Per step it writes ``dump_path/step{N}/kernel_config_{device}.json`` (the runtime's dump
configuration, pointing at ``dump_path/step{N}``). Without torch_npu, or without an NPU, creating
it raises MissingDependencyError / ConfigError. The kernel files are produced by the Ascend
runtime, not by us: msprobe-lake lists them but does not decode them.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Optional

from msprobe.backends import local_path_of
from msprobe.dumpers.config import DumpConfig
from msprobe.dumpers.pytorch._apis import GUARD, ApiPatcher
from msprobe.dumpers.pytorch._dumper import _get_rank
from msprobe.dumpers.pytorch._npu import torch_npu_module
from msprobe.dumpers.pytorch._values import first_tensor
from msprobe.dumpers.session import DumpSession
from msprobe.errors import ConfigError, MissingDependencyError

__all__ = ["KernelDumper", "KERNEL_CONFIG_NAME"]

KERNEL_CONFIG_NAME = "kernel_config_{device}.json"
_API_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*\.[^\s/]+\.\d+\.(forward|backward)$")


def _say(msg: str) -> None:
    print(f"[msprobe] {msg}", flush=True)


def _on_npu(values: Any) -> bool:
    """Whether any tensor in (nested) ``values`` is on an NPU."""
    import torch

    stack = [values]
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            if v.device.type == "npu":
                return True
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
    return False


class KernelDumper:
    """The dumper of ``level: "L2"`` (same control surface as TorchDumper: start/stop/step/close)."""

    def __init__(self, config: DumpConfig):
        if len(config.list) != 1 or not _API_NAME.match(config.list[0]):
            raise ConfigError(
                f"level 'L2' dumps the kernels of exactly one API per step: list={config.list!r}; valid: one "
                "name as in dump.json, '{api_type}.{api_name}.{n}.{forward|backward}', "
                "e.g. [\"NPU.npu_rms_norm.0.forward\"]")
        if config.task != "tensor":
            raise ConfigError(f"level 'L2' needs task 'tensor', got {config.task!r}")
        root = config.dump_path
        local_root = local_path_of(root)
        if local_root is None:
            raise ConfigError(f"level 'L2': the Ascend runtime writes kernel dumps to a local directory; "
                              f"dump_path={root!r} is not local")
        npu = torch_npu_module()
        if npu is None:
            raise MissingDependencyError(
                "level 'L2' (kernel dump) drives torch_npu's init_dump/set_dump/finalize_dump: torch_npu is "
                "not installed or cannot be imported (it needs Ascend hardware and the CANN libraries)")
        self.torch_npu = npu
        try:
            available = bool(self.torch_npu.npu.is_available())
        except Exception:  # noqa: BLE001 - torch_npu without a usable device: as if absent
            available = False
        if not available:
            raise ConfigError("level 'L2' (kernel dump) needs an Ascend NPU: torch.npu.is_available() is False")

        self.config = config
        self.root = local_root
        self.target = config.list[0]
        self.session = DumpSession(config, "pytorch", fetch_stats=lambda hs: [], render_stack=lambda f: [],
                                   get_rank=_get_rank)
        self.patcher = ApiPatcher()
        self.enabled = False
        self.L1 = True
        self._config_path: Optional[str] = None
        self._done_step: Optional[int] = None  # the step whose API has been dumped (or refused)
        self.dumped: list = []  # (step, api name) of every successful kernel dump, in order

    # ------------------------------------------------------------------ control
    def start(self, model: Any = None, token_range: Optional[list] = None) -> None:
        if token_range is not None:
            raise ConfigError("level 'L2' does not support token_range")
        if not (self.session.step_enabled() and self.session.rank_enabled()):
            self.enabled = False
            return
        self._config_path = self._write_kernel_config()
        self.patcher.install(self._on_api)
        self.enabled = True
        GUARD.on = True

    def stop(self) -> None:
        self.enabled = False

    def step(self) -> None:
        self.stop()
        if self._config_path is not None and self._done_step != self.session.current_step:
            _say(f"kernel dump: {self.target} was not called in step {self.session.current_step}; nothing dumped")
        self._config_path = None
        self.session.end_step()

    def close(self) -> None:
        self.stop()
        self.patcher.uninstall()

    def save(self, *args: Any, **kwargs: Any) -> None:  # debug level only
        return None

    # ----------------------------------------------------------------- helpers
    def _device(self) -> int:
        try:
            return int(self.torch_npu.npu.current_device())
        except Exception:  # noqa: BLE001 - torch_npu without a usable device: as if absent
            return 0

    def _write_kernel_config(self) -> str:
        step_dir = os.path.abspath(os.path.join(self.root, f"step{self.session.current_step}"))
        os.makedirs(step_dir, exist_ok=True)
        path = os.path.join(step_dir, KERNEL_CONFIG_NAME.format(device=self._device()))
        cfg = {"dump": {"dump_list": [], "dump_path": step_dir, "dump_mode": "all", "dump_op_switch": "on"}}
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(cfg, f, indent=4)
        os.replace(tmp, path)
        return path

    def _open(self) -> None:
        npu = self.torch_npu.npu
        npu.synchronize()
        npu.init_dump()
        npu.set_dump(self._config_path)
        npu.synchronize()

    def _close(self) -> None:
        npu = self.torch_npu.npu
        npu.synchronize()
        npu.finalize_dump()
        npu.synchronize()

    def _refuse(self, name: str, why: str) -> None:
        self._done_step = self.session.current_step
        _say(f"kernel dump cannot dump {name}: {why}")

    def _succeeded(self, name: str, step: int) -> None:
        self.dumped.append((step, name))
        _say(f"kernel dump: the kernels of {name} were dumped (step {step})")

    # -------------------------------------------------------------------- APIs
    def _on_api(self, orig, api_key: str, args: tuple, kwargs: dict):
        if not self.enabled or self._done_step == self.session.current_step:
            return orig(*args, **kwargs)
        GUARD.inside = True
        try:
            base, _ = self.session.next_api_name(api_key)
            if self.target == base + ".forward":
                return self._dump_forward(base + ".forward", orig, args, kwargs)
            out = orig(*args, **kwargs)
            if self.target == base + ".backward":
                self._arm_backward(base + ".backward", args, kwargs, out)
            return out
        finally:
            GUARD.inside = False

    def _dump_forward(self, name: str, orig, args: tuple, kwargs: dict):
        if not _on_npu((args, kwargs)):
            self._refuse(name, "none of its tensors is on an NPU, so no NPU kernel runs")
            return orig(*args, **kwargs)
        self._done_step = step = self.session.current_step
        self._open()
        try:
            out = orig(*args, **kwargs)
        finally:
            self._close()
        self._succeeded(name, step)
        return out

    def _arm_backward(self, name: str, args: tuple, kwargs: dict, out: Any) -> None:
        t = first_tensor(out)
        if t is None or t.grad_fn is None:
            self._refuse(name, "its output does not require grad, so it has no backward")
            return
        if not _on_npu((args, kwargs, out)):
            self._refuse(name, "none of its tensors is on an NPU, so no NPU kernel runs")
            return
        step = self._done_step = self.session.current_step
        state = {"open": False}

        def pre(grad_outputs):
            if not state["open"]:
                state["open"] = True
                self._open()
            return None

        def post(grad_inputs, grad_outputs):
            if state["open"]:
                state["open"] = False
                self._close()
                self._succeeded(name, step)
            return None

        t.grad_fn.register_prehook(pre)
        t.grad_fn.register_hook(post)

