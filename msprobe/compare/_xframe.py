"""Match a MindSpore dump (target) with a PyTorch dump (bench): the cross-framework mappings.

The real tool's ``-am [api_mapping.yaml]``, ``-cm [cell_mapping.yaml]`` and ``-lm layer_mapping.yaml``
(its MindSpore compare doc, sections 2.5-2.7 and 4.3-4.6):

- **API records** (``Mint.add.0.forward``, ``Functional.softmax.0.forward``, ``Tensor.__add__.0.forward``,
  ``Primitive.matmul.MatMul.0.forward``) are keyed by the PyTorch API they correspond to
  (:data:`msprobe.compare._xframe_api.BUILTIN`, our own table, overridden by a user's api_mapping
  file) and direction; the n-th call of a key on the MindSpore side pairs with the n-th call of
  it on the PyTorch side. ``Distributed.*`` and every name the two frameworks share pair as they are.
- **Cell records** (``Cell.<path>.<Class>.forward.<n>``, ``...parameters_grad``) become
  ``Module.<path>.<Class>...``; a cell_mapping file renames ``<cell path>.<Class>`` (whole or as a
  suffix of the path), a layer_mapping file renames the layers of the path (each path component
  the file maps, ``Cell: {network_with_loss: module}`` the top one).
- A layer_mapping file may also name APIs (``logical_or: __or__``, a Primitive's class
  ``RmsNorm: npu_rms_norm``): those pair as the file says.
- The per-argument mappings of an api_mapping file (``ms_args``/``pt_args``,
  ``ms_outputs``/``pt_outputs``) become row mappings, as a data_mapping file's.

A record with no counterpart stays unmatched (N/A on the other side, and listed in the summary).
"""
from __future__ import annotations

from typing import Any, Optional

from msprobe.compare._xframe_api import BUILTIN, BUILTIN_ARGS, CELL_CLASSES, PARAMETERS, PT_TYPES, mindspore_api

__all__ = ["XFrame", "match_xframe", "mindspore_against_pytorch", "read_api_mapping", "read_cell_mapping",
           "read_layer_mapping"]

_DIRS = ("forward", "backward")


class XFrame(dict):
    """The cross-framework options: ``api`` ({ms api: entry} of a user file, {} for the built-in
    table only, absent when -am is not given), ``cell`` ({ms cell path.Class: pt module path.Class}),
    ``layer`` ({ms layer name: pt layer name})."""


def _yaml(path: str, flag: str) -> Any:
    from msprobe.compare.merge import read_yaml

    return read_yaml(path, flag)


def read_api_mapping(path: str) -> dict:
    """{ms api: {pt_api, ms_args, pt_args, ms_outputs, pt_outputs}} of an api_mapping file (one
    entry, or a list of them)."""
    from msprobe.errors import ConfigError

    got = _yaml(path, "-am")
    entries = got if isinstance(got, list) else [got] if got else []
    out = {}
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("ms_api"), str) \
                or not isinstance(entry.get("pt_api"), str):
            raise ConfigError(f"-am {path}: each entry needs ms_api and pt_api ({{api_type}}.{{api_name}})")
        for side in ("args", "outputs"):
            ms, pt = entry.get(f"ms_{side}") or [], entry.get(f"pt_{side}") or []
            if len(ms) != len(pt) or len(set(ms)) != len(ms) or len(set(pt)) != len(pt) \
                    or not all(isinstance(i, int) and i >= 0 for i in list(ms) + list(pt)):
                raise ConfigError(f"-am {path}: {entry['ms_api']}: ms_{side} and pt_{side} must be lists of "
                                  f"distinct indices of the same length")
        out[entry["ms_api"]] = entry
    return out


def read_cell_mapping(path: str) -> dict:
    """{ms ``cell_path.Class``: pt ``module_path.Class``} of a cell_mapping file."""
    from msprobe.errors import ConfigError

    got = _yaml(path, "-cm") or {}
    if not isinstance(got, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in got.items()):
        raise ConfigError(f"-cm {path}: expected '{{cell_name}}.{{class_name}}: {{module_name}}.{{class_name}}' lines")
    return got


def read_layer_mapping(path: str) -> dict:
    """{ms layer name: pt layer name}: the union of a layer_mapping file's layers."""
    from msprobe.errors import ConfigError

    got = _yaml(path, "-lm") or {}
    if not isinstance(got, dict) or not all(isinstance(v, dict) for v in got.values()):
        raise ConfigError(f"-lm {path}: expected '<Layer>:' keys, each holding 'ms name: pt name' lines")
    out: dict = {}
    for layer in got.values():
        for ms, pt in layer.items():
            if not isinstance(ms, str) or not isinstance(pt, str):
                raise ConfigError(f"-lm {path}: expected 'ms name: pt name' lines")
            out[ms] = pt
    return out


# ---------------------------------------------------------------- names

def _split_api(name: str) -> Optional[tuple]:
    """(type, api, direction) of an API record name, or None (a module, or no call count)."""
    parts = name.split(".")
    if len(parts) < 4 or parts[0] in ("Cell", "Module") or parts[-1] not in _DIRS or not parts[-2].isdigit():
        return None
    api = parts[1:-2]
    if parts[0] == "Primitive" and len(api) > 1:  # Primitive.<api>.<Class>
        api = api[:-1]
    return parts[0], ".".join(api), parts[-1]


def _module_path(name: str, prefix: str) -> Optional[tuple]:
    """(path.Class, tail) of a module/cell record name: tail ``forward.0``, ``parameters_grad...``."""
    if not name.startswith(prefix + "."):
        return None
    rest = name[len(prefix) + 1:]
    for marker in (".forward.", ".backward.", ".parameters_grad"):
        at = rest.rfind(marker)
        if at > 0:
            return rest[:at], rest[at + 1:]
    return None


def _cell_key(name: str, xf: XFrame) -> Optional[str]:
    """The PyTorch name a MindSpore Cell record corresponds to, or None when it is no Cell record."""
    split = _module_path(name, "Cell")
    if split is None:
        return None
    path, tail = split
    cells = xf.get("cell") or {}
    if path in cells:
        path = cells[path]
    else:
        for ms, pt in cells.items():
            if path.endswith("." + ms):
                path = path[: -len(ms)] + pt
                break
    layers = xf.get("layer") or {}
    if layers:
        parts = path.split(".")
        parts[:-1] = [layers.get(part, part) for part in parts[:-1]]
        path = ".".join(parts)
    return f"Module.{path}.{tail}"


def _renamed_class(module: str) -> str:
    """``module`` (a PyTorch module record name) with a MindSpore Cell class renamed to its Module class."""
    split = _module_path(module, "Module")
    if split is None:
        return module
    path, tail = split
    head, _, cls = path.rpartition(".")
    return f"Module.{head}.{CELL_CLASSES[cls]}.{tail}" if cls in CELL_CLASSES and head else module


def _api_key(name: str, xf: XFrame, bench_apis: set) -> Optional[tuple]:
    """(PyTorch ``Type.api``, direction) a MindSpore API record corresponds to."""
    split = _split_api(name)
    if split is None:
        return None
    kind, api, direction = split
    user = (xf.get("api") or {}).get(f"{kind}.{api}")
    if user is not None:
        return user["pt_api"], direction
    named = _layer_api(name, xf.get("layer") or {}, bench_apis)
    if named is not None:
        return named, direction
    for candidate in mindspore_api(kind, api, BUILTIN):
        if candidate in bench_apis:
            return candidate, direction
    return (f"{kind}.{api}", direction) if kind in PT_TYPES and kind not in ("Functional", "Tensor") else None


def _layer_api(name: str, layers: dict, bench_apis: set) -> Optional[str]:
    """The PyTorch ``Type.api`` a layer_mapping file names for an API record (``logical_or: __or__``,
    a Primitive's class ``RmsNorm: npu_rms_norm``; a dotted name by its last part), if the bench has it."""
    if not layers:
        return None
    parts = name.split(".")
    for ms, pt in layers.items():
        if ms.rsplit(".", 1)[-1] in parts[1:-2]:
            target = pt.rsplit(".", 1)[-1]
            for kind in PT_TYPES:
                if f"{kind}.{target}" in bench_apis:
                    return f"{kind}.{target}"
    return None


def _bench_api_key(name: str) -> Optional[tuple]:
    split = _split_api(name)
    if split is None or split[0] not in PT_TYPES:
        return None
    return f"{split[0]}.{split[1]}", split[2]


# ---------------------------------------------------------------- matching

def mindspore_against_pytorch(target_data: Any, bench_data: Any) -> bool:
    """Whether the target's records are MindSpore's and the bench's PyTorch's (by their tensor types)."""
    from msprobe.format.model import infer_framework

    target, bench = (getattr(data, "framework", None) for data in (target_data, bench_data))  # a leaf table's
    if target is None or bench is None:
        target, bench = ((found[0] if found else "") for found in (infer_framework(target_data),
                                                                  infer_framework(bench_data)))
    return target == "mindspore" and bench == "pytorch"


def _bench_index(bench_data: dict) -> tuple:
    """({(pt api, direction): [records in order]}, {pt api})."""
    by_key: dict = {}
    for name in bench_data:
        key = _bench_api_key(name)
        if key is not None:
            by_key.setdefault(key, []).append(name)
    return by_key, {key[0] for key in by_key}


def match_xframe(target_data: dict, bench_data: dict, xf: XFrame) -> tuple:
    """([(target name, bench name or None)] in target order, [bench-only names], {how: count},
    {target row: bench row} of the api_mapping file's argument indices)."""
    by_key, bench_apis = _bench_index(bench_data)
    taken = {key: 0 for key in by_key}
    used: set = set()
    how = {"exact": 0, "dialect": 0, "structural": 0, "mapping": 0}
    pairs = []
    for name in target_data:
        got = _counterpart(name, target_data, bench_data, xf, by_key, bench_apis, taken, used)
        if got is not None:
            used.add(got)
            how["exact" if got == name else "mapping"] += 1
        pairs.append((name, got))
    rest = [name for name in bench_data if name not in used]
    return pairs, rest, how, _row_mapping(pairs, target_data, xf)


def _counterpart(name: str, target_data: dict, bench_data: dict, xf: XFrame, by_key: dict, bench_apis: set,
                 taken: dict, used: set) -> Optional[str]:
    cell = _cell_key(name, xf) if ("cell" in xf or "layer" in xf) else None
    if cell is not None:
        for candidate in (cell, _renamed_class(cell)):
            if candidate in bench_data and candidate not in used:
                return candidate
        return None
    key = _api_key(name, xf, bench_apis) if ("api" in xf or "layer" in xf) else None
    if key is not None and key in by_key:
        candidates, position = by_key[key], taken[key]
        while position < len(candidates) and candidates[position] in used:
            position += 1
        taken[key] = position
        shape = _first_shape(target_data[name])
        for candidate in candidates[position:]:  # the next call of the API whose first tensor has the shape
            if candidate not in used and _compatible(shape, _first_shape(bench_data[candidate])):
                return candidate
        return None
    if name in bench_data and name not in used:  # Distributed.*, or a name both frameworks use
        return name
    return None


def _first_shape(raw: Any) -> Optional[tuple]:
    """The shape of a record's first tensor argument (of its gradients for a backward), or None."""
    if not isinstance(raw, dict):
        return None
    for key in ("input_args", "input"):
        for value in raw.get(key) or ():
            if isinstance(value, dict) and isinstance(value.get("shape"), list) and "dtype" in value:
                return tuple(value["shape"])
    return None


def _compatible(target: Optional[tuple], bench: Optional[tuple]) -> bool:
    return target is None or bench is None or target == bench


def _row_mapping(pairs: list, target_data: dict, xf: XFrame) -> dict:
    """{target row: bench row} from the argument and output indices of the user api_mapping entries
    (and of the built-in table's forward arguments, :data:`BUILTIN_ARGS`)."""
    user = xf.get("api") or {}
    out: dict = {}
    for name, bench in pairs:
        split = _split_api(name) if bench is not None else None
        if split is None:
            if bench is not None and name.startswith("Cell."):
                out.update(_parameter_rows(name, bench, target_data[name]))
            continue
        api = f"{split[0]}.{split[1]}"
        entry = user.get(api)
        if entry is not None:
            indices = {io: (entry.get(f"ms_{side}") or [], entry.get(f"pt_{side}") or [])
                       for io, side in (("input", "args"), ("output", "outputs"))}
        else:
            indices = {io: got for (direction, io), got in BUILTIN_ARGS.get(api, {}).items() if direction == split[2]}
        for io, (ms_indices, pt_indices) in indices.items():
            for ms, pt in zip(ms_indices, pt_indices):
                out[f"{name}.{io}.{ms}"] = f"{bench}.{io}.{pt}"
    return out


def _parameter_rows(name: str, bench: str, raw: Any) -> dict:
    """{target row: bench row} of a Cell's parameters whose PyTorch names differ (``gamma`` -> ``weight``)."""
    out = {}
    if name.endswith(".parameters_grad") and isinstance(raw, dict):
        for param in raw:
            if param in PARAMETERS:
                out[f"{name}.{param}"] = f"{bench}.{PARAMETERS[param]}"
    elif isinstance(raw, dict) and isinstance(raw.get("parameters"), dict):
        for param in raw["parameters"]:
            if param in PARAMETERS:
                out[f"{name}.parameters.{param}"] = f"{bench}.parameters.{PARAMETERS[param]}"
    return out
