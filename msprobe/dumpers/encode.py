"""The framework-neutral part of an argument encoder: Python values -> record entries.

A framework encoder subclasses ``ValueEncoder`` and provides ``tensor_types`` (the classes
``tensor()`` handles), ``tensor(value, data_name_prefix, save)``, and optionally
``framework_value(value)`` (its own dtype/device/shape types; ``NotImplemented`` when the
value is not one) and ``_plain(v)`` for tensors used as slice bounds.
"""
from __future__ import annotations

import threading
from typing import Any

__all__ = ["ValueEncoder"]

MAX_DEPTH = 32


class ValueEncoder:
    tensor_types: tuple = ()

    def __init__(self, session, *, save_tensors: bool, summary_mode: str, tensor_list: list):
        self.session = session
        self.save_tensors = save_tensors
        self.summary_mode = summary_mode
        self.tensor_list = tensor_list
        self.check_overflow = False
        self._tls = threading.local()

    def wants_tensors(self, record: str) -> bool:
        return self.save_tensors or any(item in record for item in self.tensor_list)

    def framework_value(self, value: Any) -> Any:
        return NotImplemented

    def tensor(self, value: Any, data_name_prefix: str, save: bool) -> dict:
        raise NotImplementedError

    def encode(self, value: Any, data_prefix: str, save: bool, depth: int = 0) -> Any:
        if isinstance(value, self.tensor_types):
            return self.tensor(value, data_prefix, save)
        if value is None:
            return None
        if isinstance(value, bool):
            return {"type": "bool", "value": value}
        if isinstance(value, int):
            return {"type": "int", "value": value}
        if isinstance(value, float):
            return {"type": "float", "value": value}
        if isinstance(value, str):
            return {"type": "str", "value": value}
        special = self.framework_value(value)
        if special is not NotImplemented:
            return special
        if isinstance(value, (list, tuple)):
            if depth > MAX_DEPTH:
                return None
            return [self.encode(v, f"{data_prefix}.{i}", save, depth + 1) for i, v in enumerate(value)]
        if isinstance(value, dict):
            if depth > MAX_DEPTH:
                return None
            return {str(k): self.encode(v, f"{data_prefix}.{k}", save, depth + 1) for k, v in value.items()}
        if isinstance(value, slice):
            return {"type": "slice", "value": [self._plain(value.start), self._plain(value.stop),
                                               self._plain(value.step)]}
        if value is Ellipsis:
            return {"type": "ellipsis", "value": "..."}
        if isinstance(value, complex):
            return {"type": "complex", "value": [value.real, value.imag]}
        return self._special(value)

    def _plain(self, v: Any) -> Any:
        return v if v is None or isinstance(v, (int, float, str, bool)) else str(v)

    def _special(self, value: Any) -> Any:
        return None

    def encode_output(self, out: Any, prefix: str, save: bool, *, is_sequence=None) -> list:
        """A call's output as a list of entries (a tuple/list output one entry per element);
        an empty output tensor gets no file (as the real tool does)."""
        self._tls.in_output = True
        try:
            seq = isinstance(out, (list, tuple)) if is_sequence is None else is_sequence(out)
            if seq:
                return [self.encode(o, f"{prefix}.{i}", save) for i, o in enumerate(out)]
            return [self.encode(out, f"{prefix}.0", save)]
        finally:
            self._tls.in_output = False
