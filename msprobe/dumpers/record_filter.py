"""Which calls a dumper records: the ``scope`` range, the ``list`` of names, the ``data_mode``
directions, ``token_range`` and the overflow gating of ``overflow_check``."""
from __future__ import annotations

import re
from typing import Any, Optional

from msprobe.dumpers.config import DumpConfig
from msprobe.errors import ConfigError

__all__ = ["RecordFilter"]

#: a record name's direction: API ``....forward``/``....backward``, module ``....forward.<n>``
_DIRECTION = re.compile(r"\.(forward|backward)(?:\.\d+)?$")
_MODULE_NAME = re.compile(r"^(Module|Cell)\..*\.(forward|backward)\.\d+$")
_SCOPE_BEFORE, _SCOPE_INSIDE, _SCOPE_AFTER = 0, 1, 2


class RecordFilter:
    """Which calls are recorded: the ``scope`` range (in execution order), the ``list`` of names,
    the ``data_mode`` directions, ``token_range`` (forward calls of the root model counted) and
    ``overflow_check``'s gating (up to ``overflow_nums`` records over the run). ``module_stack``
    and ``bw_stack``: the dumper's forward and backward module stacks (for ``list`` at mix level)."""

    def __init__(self, config: DumpConfig, module_stack: list, bw_stack: list) -> None:
        self.config = config
        self.module_stack = module_stack
        self.bw_stack = bw_stack
        self.modules_dumped = config.level in ("L0", "mix")
        self.scope_state = _SCOPE_BEFORE
        self.token_range: Optional[tuple] = None
        self.token_count = -1
        self.overflow_count = 0  # overflow_check: overflowing records over the whole run
        self.overflow_done = False  # overflow_nums reached: no more detection for the run
        #: (inputs dumped, outputs dumped) of each direction: data_mode's answers, asked at every record
        self._io = {direction: self._io_of(direction) for direction in ("forward", "backward")}
        #: no scope, list, data_mode direction or overflow gating: every call of a dump that is on is
        #: recorded (token_range apart): :meth:`wanted` answers ``on`` without asking them one by one
        self._all = (not config.scope and not config.list and config.task != "overflow_check"
                     and config.forward_enabled and config.backward_enabled)

    def set_token_range(self, model: Any, token_range: Optional[list]) -> None:
        if token_range is None:
            return
        if model is None:
            raise ConfigError("token_range requires model")
        if not (isinstance(token_range, (list, tuple)) and len(token_range) == 2
                and all(isinstance(bound, int) and bound >= 0 for bound in token_range)
                and token_range[0] <= token_range[1]):
            raise ConfigError(f"invalid token_range={token_range!r}; valid: [start, end] integers, start <= end")
        self.token_range = tuple(token_range)

    def count_token(self, module: Any, args: Any) -> None:
        """The root model's forward pre-hook (with a token_range): one more token."""
        self.token_count += 1

    def end_step(self) -> None:
        self.scope_state = _SCOPE_BEFORE
        self.token_count = -1

    def in_token_range(self) -> bool:
        return self.token_range is None or self.token_range[0] <= self.token_count <= self.token_range[1]

    def in_scope(self, name: str) -> bool:
        """The scope range, in execution order (a backward name as its backward runs). A range
        that ends at a module (L0/mix) ends when that module's call ends: its inner calls are in
        it (8.1.1/26.2.0); one that ends at an API ends with that API."""
        scope = self.config.scope
        if not scope:
            return True
        if self.scope_state == _SCOPE_BEFORE and name == scope[0]:
            self.scope_state = _SCOPE_INSIDE
        if self.scope_state == _SCOPE_INSIDE:
            if name == scope[1] and not (self.modules_dumped and _MODULE_NAME.match(name)):
                self.scope_state = _SCOPE_AFTER
            return True
        return False

    def scope_enter(self, name: str) -> None:
        """A module's call begins (a backward one: when its output gradients arrive)."""
        scope = self.config.scope
        if scope and self.scope_state == _SCOPE_BEFORE and name == scope[0]:
            self.scope_state = _SCOPE_INSIDE

    def scope_leave(self, name: str) -> None:
        """A module's call ends: a scope ending at it ends here."""
        scope = self.config.scope
        if scope and self.scope_state == _SCOPE_INSIDE and name == scope[1]:
            self.scope_state = _SCOPE_AFTER

    def listed(self, name: str) -> bool:
        """``list``: a full record name (forward or backward), or a part of names (``"relu"``)."""
        names = self.config.list
        return not names or any(item == name or item in name for item in names)

    def direction_on(self, name: str) -> bool:
        """``data_mode`` forward/backward: whether records of ``name``'s direction are dumped."""
        if name.endswith(".forward"):  # (an API's name: the regular expression's commonest match)
            return self.config.forward_enabled
        match = _DIRECTION.search(name)
        if match is not None:
            return self.config.forward_enabled if match.group(1) == "forward" else self.config.backward_enabled
        if "parameters_grad" in name:
            return self.config.backward_enabled
        return True

    def wanted(self, name: str, on: bool, inside_listed: Optional[bool] = None) -> bool:
        """Whether the call ``name`` is recorded: ``on`` (the dump is on, or the step of its
        forward call is still dumped), inside token_range and scope, listed, of a dumped
        direction. ``inside_listed``: whether the call sits in a module named by ``list`` (mix
        level); None = look at the current module stack (forward). The scope is consulted for
        every call, in execution order, so that ``scope`` + ``list`` is their intersection."""
        if self.wants_all():  # (each question below would say yes)
            return bool(on)
        if not on or self.overflow_done:
            return False
        if not self.in_token_range():
            return False
        if not self.in_scope(name):
            return False
        if not self.direction_on(name):
            return False
        if not self.listed(name):
            if inside_listed is None:
                inside_listed = self.config.level == "mix" and self.inside_listed_module()
            if not inside_listed:
                return False
        return True

    def wants_all(self) -> bool:
        """Whether every call of a dump that is on is recorded (no filter but ``on`` applies)."""
        return self._all and self.token_range is None

    def backward_listed(self, bwd: str, inside_listed: bool = False) -> bool:
        """At a forward call: whether its backward ``bwd`` may be recorded (hook it then), by
        ``list`` and ``data_mode``; the scope is decided when the backward runs."""
        return self.config.backward_enabled and not self.overflow_done and (inside_listed or self.listed(bwd))

    def mix_listed(self) -> bool:
        """mix with a ``list``: a backward may sit in a listed module's backward (known only then)."""
        return self.config.level == "mix" and bool(self.config.list)

    def inside_listed_module(self, stack: Optional[list] = None) -> bool:
        """Whether a module on ``stack`` (default: the forward module stack) is named by ``list``."""
        names = self.config.list
        return bool(names) and any(any(item == module or item in module for item in names)
                                   for module in (self.module_stack if stack is None else stack))

    def inside_listed_backward(self) -> bool:
        """mix: whether a module backward in progress is named by ``list`` (a backward runs
        inside its module's backward, which ``list`` names separately from its forward)."""
        return self.config.level == "mix" and self.inside_listed_module(self.bw_stack)

    def io(self, direction: str) -> tuple:
        """(inputs dumped, outputs dumped) of the records of ``direction`` (``data_mode``)."""
        known = self._io.get(direction)
        return known if known is not None else self._io_of(direction)

    def _io_of(self, direction: str) -> tuple:
        config = self.config
        enabled = config.forward_enabled if direction == "forward" else config.backward_enabled
        return enabled and config.input_enabled, enabled and config.output_enabled

    def keep(self, rec: dict, name: str, encoder: Any) -> bool:
        """overflow_check keeps only records whose tensors hold Inf/NaN, with their tensor files
        (the docs: the inputs and outputs of an overflowing API are dumped), up to
        ``overflow_nums`` records over the whole run (-1: no limit). ``encoder``: the one that
        encoded the record."""
        if self.config.task != "overflow_check":
            return True
        found = encoder.take_overflow(name) and not self.overflow_done
        encoder.settle_overflow(name, keep=found)
        if not found:
            return False
        self.overflow_count += 1
        limit = self.config.overflow_nums
        if limit != -1 and self.overflow_count >= limit:
            self.overflow_done = True
        return True

    def nothing_recorded(self, seen: list) -> list:
        """Why a dumped step recorded nothing: the filters that excluded every call (``seen``: the
        APIs and modules called), empty when none did."""
        config = self.config
        why = []
        if config.list:
            import difflib

            short = {**{name.split(".", 1)[-1]: name for name in seen}, **{name: name for name in seen}}
            near = sorted({short[match] for item in config.list
                           for match in difflib.get_close_matches(item, list(short), n=2, cutoff=0.6)})
            why.append(f"list {config.list} matched none of the {len(seen)} APIs/modules called"
                       + (f" (near: {', '.join(near[:4])})" if near else
                          f" ({', '.join(seen[:4])}{', ...' if len(seen) > 4 else ''})" if seen else ""))
        if config.scope:
            state = ("its start never ran" if self.scope_state == _SCOPE_BEFORE
                     else "it opened but nothing in it was dumped")
            why.append(f"scope {config.scope}: {state}")
        if config.data_mode != ["all"]:
            why.append(f"data_mode {config.data_mode}")
        if self.token_range is not None:
            why.append(f"token_range {list(self.token_range)} (forward calls counted: {self.token_count + 1})")
        return why
