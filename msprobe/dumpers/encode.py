"""The framework-neutral part of an argument encoder: Python values -> record entries.

A framework encoder subclasses ``ValueEncoder`` and provides ``tensor_types`` (the classes
``tensor()`` handles), ``tensor(value, data_name_prefix, save)``, and optionally
``framework_value(value)`` (its own dtype/device/shape types; ``NotImplemented`` when the
value is not one) and ``_plain(v)`` for tensors used as slice bounds; for overflow_check,
``_any_inf_nan(handles)`` and ``_write_tensor(entry, tensor, data_name)``.
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Any, Optional

__all__ = ["ValueEncoder"]

MAX_DEPTH = 32


def _fields(value: Any) -> Optional[tuple]:
    """The field names of a namedtuple or a dataclass instance (every field, also those holding None:
    a ModelOutput's dict holds only the others), else None."""
    if isinstance(value, tuple):
        names = getattr(type(value), "_fields", None)
        return tuple(names) if isinstance(names, tuple) else None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return tuple(field.name for field in dataclasses.fields(value))
    return None


class ValueEncoder:
    tensor_types: tuple = ()

    def __init__(self, session, *, save_tensors: bool, summary_mode: str, tensor_list: list):
        self.session = session
        self.save_tensors = save_tensors
        self.summary_mode = summary_mode
        self.tensor_list = tensor_list
        self.check_overflow = False
        self._tls = threading.local()
        #: overflow_check: (data name prefix, handle) of the float tensors encoded, and the tensors
        #: whose files wait for their record's verdict, (prefix, entry, tensor, data_name)
        self._overflow: list = []
        self._deferred: list = []
        #: what the encoder made whose values are still on the device: ``(entry, handle)`` pairs of
        #: statistics, handed to the session with the record they belong to (:meth:`take_stats`)
        self._stats: list = []

    def take_stats(self) -> list:
        """The ``(entry, stat handle)`` pairs made since the last call (the core hands them to the
        session with the record it adds; the session fills those entries once it fetches them)."""
        made = self._stats
        self._stats = []
        return made

    # ------------------------------------------------------------ overflow_check
    def _watch(self, prefix: str, handle: Any) -> None:
        self._overflow.append((prefix, handle))

    def _defer(self, prefix: str, entry: dict, tensor: Any, data_name: str) -> None:
        self._deferred.append((prefix, entry, tensor, data_name))

    @staticmethod
    def _split_by_record(record: str, items: list) -> tuple:
        """(the items of ``record``, the others): a record's tensors are named ``<record>.…``."""
        head = record + "."
        mine = [item for item in items if item[0].startswith(head)]
        return mine, [item for item in items if not item[0].startswith(head)]

    def take_overflow(self, record: str) -> bool:
        """True when a float tensor of ``record`` encoded so far holds Inf/NaN (syncs)."""
        mine, self._overflow = self._split_by_record(record, self._overflow)
        return bool(mine) and self._any_inf_nan([handle for _, handle in mine])

    def settle_overflow(self, record: str, *, keep: bool) -> None:
        """The record overflowed (``keep``): write its tensors' files (named in its entries);
        else forget them."""
        mine, self._deferred = self._split_by_record(record, self._deferred)
        if keep:
            for _, entry, tensor, data_name in mine:
                entry["data_name"] = data_name
                self._write_tensor(entry, tensor, data_name)

    def reset_overflow(self) -> None:
        self._overflow = []
        self._deferred = []

    def _any_inf_nan(self, handles: list) -> bool:
        raise NotImplementedError

    def _write_tensor(self, entry: dict, tensor: Any, data_name: str) -> None:
        raise NotImplementedError

    def wants_tensors(self, record: str) -> bool:
        return self.save_tensors or (bool(self.tensor_list) and any(item in record for item in self.tensor_list))

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
        fields = _fields(value)
        if fields is not None:  # a namedtuple or a dataclass (a transformers ModelOutput): by field, as 26.2.0
            if depth > MAX_DEPTH:
                return None
            return {field: self.encode(getattr(value, field, None), f"{data_prefix}.{field}", save, depth + 1)
                    for field in fields}
        if isinstance(value, (list, tuple)):
            if depth > MAX_DEPTH:
                return None
            return [self.encode(item, f"{data_prefix}.{index}", save, depth + 1) for index, item in enumerate(value)]
        if isinstance(value, dict):
            if depth > MAX_DEPTH:
                return None
            return {str(key): self.encode(item, f"{data_prefix}.{key}", save, depth + 1) for key, item in value.items()}
        if isinstance(value, slice):
            return {"type": "slice", "value": [self._plain(value.start), self._plain(value.stop),
                                               self._plain(value.step)]}
        if value is Ellipsis:
            return {"type": "ellipsis", "value": "..."}
        if isinstance(value, complex):
            return {"type": "complex", "value": [value.real, value.imag]}
        return self._special(value, data_prefix, save)

    def encode_list(self, values: Any, prefix: str, save: bool) -> list:
        """The entries of a call's positional arguments (``<prefix>.<index>`` each)."""
        encode = self.encode
        return [encode(value, f"{prefix}.{index}", save) for index, value in enumerate(values)]

    def encode_map(self, values: dict, prefix: str, save: bool) -> dict:
        """The entries of a call's keyword arguments (``<prefix>.<key>`` each)."""
        encode = self.encode
        return {key: encode(value, f"{prefix}.{key}", save) for key, value in values.items()}

    def _plain(self, bound: Any) -> Any:
        return bound if bound is None or isinstance(bound, (int, float, str, bool)) else str(bound)

    def _special(self, value: Any, data_prefix: str, save: bool) -> Any:
        return None

    def encode_output(self, out: Any, prefix: str, save: bool, *, is_sequence=None) -> Any:
        """A call's output as a list of entries (a tuple/list output one entry per element; a namedtuple
        is the tuple of the call and becomes its mapping by field, not a list, as 26.2.0 writes it);
        an empty output tensor gets no file (as the real tool does)."""
        self._tls.in_output = True
        try:
            if isinstance(out, tuple) and _fields(out) is not None:
                return self.encode(out, prefix, save)
            seq = isinstance(out, (list, tuple)) if is_sequence is None else is_sequence(out)
            if seq:
                return [self.encode(item, f"{prefix}.{index}", save) for index, item in enumerate(out)]
            return [self.encode(out, f"{prefix}.0", save)]
        finally:
            self._tls.in_output = False
