"""torch.distributed calls in the dump: receive buffers written ``null`` and asynchronous calls
recorded once their work completes (spec/PRODUCER.md section 24).

* The content of a receive buffer before the call (``recv``'s tensor, ``all_gather``'s output
  list, ``all_to_all_single``'s output, ...) is whatever the memory held: the record's inputs
  write ``null`` there, as 26.2.0 does (:func:`msprobe.format.comm.null_args` says which;
  :func:`receive_buffers` answers the adapter contract's ``receive_buffers``).
* An asynchronous call (``isend``/``irecv``, a collective with ``async_op=True``) returns a
  ``Work``; the record keeps its place (call order) and its ``output`` is encoded when the work's
  ``wait()`` returns, the buffers then holding what was received. ``Work.wait`` is patched once
  (at the first asynchronous call recorded) and runs the pending callback of its work.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Optional

from msprobe.dumpers.pytorch._apis import GUARD
from msprobe.format.comm import null_args

__all__ = ["receive_buffers", "is_work", "defer_until_wait", "record_after_wait", "drop_pending"]

_LOCK = threading.Lock()
_PENDING: dict = {}  # id(work) -> (work, callback)
_PATCHED: dict = {}  # "wait" -> the original Work.wait


def _work_class() -> Any:
    try:
        from torch._C._distributed_c10d import Work
    except Exception:  # noqa: BLE001 - torch without distributed
        return None
    return Work


def _plain(value: Any) -> Any:
    """What :func:`null_args` reads of an argument: ints as they are, a process group as its ranks."""
    if isinstance(value, (bool, int, str)) or value is None:
        return value
    try:
        import torch.distributed as dist

        if isinstance(value, dist.ProcessGroup):
            return {"group_ranks": list(dist.get_process_group_ranks(value))}
    except Exception:  # noqa: BLE001 - a group we cannot read: treated as the default group
        return None
    return "tensor"


def receive_buffers(api_key: str, args: tuple, kwargs: dict, rank: Optional[int]) -> frozenset:
    """The receive buffers of a ``Distributed.*`` call on this ``rank`` (positions and keyword
    names), from the API's argument roles and its root or peer: encoded ``null`` by the core."""
    name = api_key + ".0.forward"
    view = {"input_args": [_plain(a) for a in args], "input_kwargs": {k: _plain(v) for k, v in kwargs.items()}}
    return frozenset(null_args(name, view, -1 if rank is None else rank))


def is_work(value: Any) -> bool:
    """Whether a call returned a ``Work`` (an asynchronous call), or ``batch_isend_irecv``'s list of them."""
    cls = _work_class()
    if cls is None:
        return False
    if isinstance(value, list) and value:
        value = value[-1]  # the batch's last operation: waited on last
    return isinstance(value, cls)


def _patch() -> bool:
    if "wait" in _PATCHED:
        return True
    cls = _work_class()
    if cls is None:
        return False
    orig = cls.wait

    def wait(work, *args, **kwargs):
        result = orig(work, *args, **kwargs)
        with _LOCK:
            entry = _PENDING.pop(id(work), None)
        if entry is not None and entry[0] is work:
            entry[1]()
        return result

    try:
        cls.wait = wait
    except (AttributeError, TypeError):
        return False
    _PATCHED["wait"] = orig
    return True


def defer_until_wait(work: Any, callback: Callable[[], None]) -> bool:
    """Run ``callback`` once ``work.wait()`` returns; False when that cannot be arranged."""
    with _LOCK:
        if not _patch():
            return False
        _PENDING[id(work)] = (work, callback)
    return True


def record_after_wait(core: Any, rec: dict, fwd: str, work: Any, values: tuple, stack: Any, parent: Any) -> bool:
    """An asynchronous communication call (its ``Work``): its record takes its place now and gets
    its ``output`` (``values``: the call's arguments) when ``work.wait()`` returns, the statistics
    cache cleared first (gloo writes the buffers without a ``_version`` bump). False: nothing
    deferred, record it now."""
    if not core.is_on():
        return False
    step = core.current_step()
    core.record(fwd, rec, stack=stack, parent=parent, filtered=False)
    ref = weakref.ref(core)

    def completed() -> None:
        alive = ref()
        if alive is None or alive.current_step() != step or GUARD.inside:
            return
        GUARD.inside = True
        try:
            alive.encoder().cache.clear()
            alive.forward_output(rec, fwd, values)
            if not alive.record(fwd, rec, parent=parent, construct=False):
                alive.forget(fwd)
        except Exception:  # noqa: BLE001 - never break training for the dump
            pass
        finally:
            GUARD.inside = False

    return defer_until_wait(work[-1] if isinstance(work, list) else work, completed)


def drop_pending() -> None:
    """Forget every pending callback (the step is over: its records are published)."""
    with _LOCK:
        _PENDING.clear()
