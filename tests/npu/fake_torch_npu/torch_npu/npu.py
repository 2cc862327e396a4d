"""``torch_npu.npu`` (also ``torch.npu``) of the fake: device queries, seeds and the ACL dump interface."""
from __future__ import annotations

import json
import os
import time

import torch

from torch_npu import _backend

_seed = {"value": 0}
calls: list = []  # (name, argument) of every dump-interface call, for the tests
_dump: dict = {"initialized": False, "config": None}


def is_available() -> bool:
    return True


def device_count() -> int:
    return 1


def current_device() -> int:
    return 0


def set_device(device) -> None:
    pass


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def synchronize(device=None) -> None:
    calls.append(("synchronize", None))


def manual_seed(seed: int) -> None:
    _seed["value"] = int(seed)
    calls.append(("manual_seed", int(seed)))


def manual_seed_all(seed: int) -> None:
    _seed["value"] = int(seed)
    calls.append(("manual_seed_all", int(seed)))


def initial_seed() -> int:
    return _seed["value"]


def seed() -> None:
    pass


def get_rng_state(device=None) -> torch.Tensor:
    return torch.get_rng_state()


def set_rng_state(state, device=None) -> None:
    pass


# ----------------------------------------------------------- ACL kernel dump
def init_dump() -> None:
    calls.append(("init_dump", None))
    _dump["initialized"] = True


def set_dump(cfg_file: str) -> None:
    """Start dumping every kernel run on the device, as configured by the JSON file ``cfg_file``."""
    calls.append(("set_dump", cfg_file))
    if not _dump["initialized"]:
        raise RuntimeError("set_dump before init_dump")
    with open(cfg_file, encoding="utf-8") as f:
        cfg = json.load(f)["dump"]
    if cfg.get("dump_op_switch") != "on" or cfg.get("dump_mode") not in ("all", "input", "output"):
        raise RuntimeError(f"unsupported dump config {cfg}")
    _dump["config"] = cfg
    _backend.KERNELS["active"] = []


def finalize_dump() -> None:
    """Stop dumping and write one opaque binary file per kernel run since set_dump."""
    calls.append(("finalize_dump", None))
    kernels, _backend.KERNELS["active"] = _backend.KERNELS["active"], None
    cfg, _dump["config"] = _dump["config"], None
    _dump["initialized"] = False
    if cfg is None or not kernels:
        return
    stamp = time.strftime("%Y%m%d%H%M%S")
    out = os.path.join(cfg["dump_path"], stamp, str(current_device()))
    os.makedirs(out, exist_ok=True)
    for task_id, (op, args, _) in enumerate(kernels):
        base = op.__name__.split(".")[0].strip("_")
        op_type = "".join(p.capitalize() for p in base.split("_"))
        ts = time.time_ns() // 1000 + task_id
        name = f"{op_type}.{op_type}_{task_id}.{task_id + 1}.2.{ts}"
        payload = [b"FAKEACLDUMP\0", op.__name__.encode()]
        for a in args:
            raw = getattr(a.untyped_storage(), "raw", None) if isinstance(a, torch.Tensor) else None
            if isinstance(raw, torch.Tensor):
                payload.append(raw.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        with open(os.path.join(out, name), "wb") as f:
            f.write(b"".join(payload))
