"""Generate msprobe/dumpers/mindspore/support_wrap_ops.yaml: the real tool's lists, plus EXTRAS.

Rule (issue 18 item 10): per namespace, the names mindstudio-probe 26.2.0 wraps (its
``support_wrap_ops.yaml``, a data file of the installed package) that are callable attributes
of the pinned MindSpore, plus the names in ``EXTRAS``, each listed with its reason in
spec/PRODUCER.md section 20 (item 25), where the names 26.2.0 lists that MindSpore 2.10.0 lacks
are listed too. tests/dumpers/test_ms_api_coverage.py checks the result against the installed
real tool, tests/dumpers/mindspore/ms_test_apilist.py against the installed MindSpore.

Run in the MindSpore venv (tests/dumpers/mindspore/ms_venv.py), with the real tool's list:

    python scripts/gen_ms_api_list.py PATH/TO/msprobe/mindspore/dump/dump_processor/hook_cell/support_wrap_ops.yaml

This module imports MindSpore only when a function needs it, so the tests of the main
environment (no MindSpore) can read its tables.
"""
import importlib
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, "msprobe", "dumpers", "mindspore", "support_wrap_ops.yaml")
SPEC = os.path.join(ROOT, "spec", "PRODUCER.md")
#: where the list lies in the installed real package
REAL_LIST = ("mindspore", "dump", "dump_processor", "hook_cell", "support_wrap_ops.yaml")

#: our yaml key -> (the real tool's yaml key, None for a namespace 26.2.0 does not wrap, record prefix,
#: "module" or "module:attribute" wrapped)
NAMESPACES = {
    "ops": ("ops", "Functional", "mindspore.ops"),
    "tensor": ("tensor", "Tensor", "mindspore:Tensor"),
    "mint": ("mint.ops", "Mint", "mindspore.mint"),
    "mint.nn.functional": ("mint.nn.functional", "MintFunctional", "mindspore.mint.nn.functional"),
    "communication.comm_func": ("communication.comm_func", "Distributed", "mindspore.communication.comm_func"),
    "mint.distributed": ("mint.distributed", "MintDistributed", "mindspore.mint.distributed"),
    "ops.communication": (None, "Communication", "mindspore.ops.communication"),
}
#: wrapped beyond 26.2.0's lists (spec/PRODUCER.md section 20, item 25): the communication namespace that
#: MindSpore 2.9's deprecation notices of ``communication.comm_func`` send users to, with the names of
#: 26.2.0's ``mint.distributed`` list (the same signatures) and those the notices name besides
EXTRAS: dict = {
    "ops.communication": ["send", "recv", "broadcast", "all_reduce", "reduce", "all_gather", "gather", "isend",
                          "irecv", "scatter", "reduce_scatter", "all_to_all_single", "all_to_all",
                          "all_gather_into_tensor", "reduce_scatter_tensor", "batch_isend_irecv",
                          "gather_into_tensor", "scatter_tensor", "all_to_all_v_c"],
}


def real_names(real: dict, key: str) -> list:
    """26.2.0's names for our namespace ``key``, in its order, once each (none: a namespace it does not wrap)."""
    real_key = NAMESPACES[key][0]
    return list(dict.fromkeys(real.get(real_key) or [])) if real_key is not None else []


def spec_names(kind: str, path: str = SPEC) -> dict:
    """our yaml key -> names, from the ``<!-- BEGIN api-KIND mindspore -->`` block of section 20,
    where each name is written as ``Prefix.name`` (the record prefix of its namespace)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    block = re.search(rf"<!-- BEGIN api-{kind} mindspore -->(.*?)<!-- END api-{kind} -->", text, re.S)
    if block is None:
        raise ValueError(f"{path}: no api-{kind} block for mindspore")
    by_prefix = {prefix: key for key, (_, prefix, _) in NAMESPACES.items()}
    out: dict = {}
    for prefix, name in re.findall(r"`(\w+)\.([^`]+)`", block.group(1)):
        if prefix not in by_prefix:
            raise ValueError(f"{path}: api-{kind}: `{prefix}.{name}`: {prefix} is no namespace's prefix")
        out.setdefault(by_prefix[prefix], set()).add(name)
    return out


def target(key: str):
    """The MindSpore object whose attributes namespace ``key`` wraps."""
    module, _, attr = NAMESPACES[key][2].partition(":")
    obj = importlib.import_module(module)
    return getattr(obj, attr) if attr else obj


def exists(obj, name: str) -> bool:
    """``name`` (``sub.attr`` for a submodule's attribute) is a callable attribute of ``obj``, as the
    real tool requires before it wraps a listed name."""
    sub, _, attr = name.rpartition(".")
    owner = getattr(obj, sub, None) if sub else obj
    return owner is not None and attr in dir(owner) and callable(getattr(owner, attr, None))


def build(real: dict) -> dict:
    lists = {}
    for key in NAMESPACES:
        obj = target(key)
        names = [n for n in real_names(real, key) if exists(obj, n)]
        lists[key] = names + [n for n in EXTRAS.get(key, []) if n not in names and exists(obj, n)]
    return lists


def main() -> None:
    import mindspore
    import yaml

    with open(sys.argv[1], encoding="utf-8") as f:
        real = yaml.safe_load(f)
    lists = build(real)
    lines = ["# APIs wrapped by the MindSpore dumper, per namespace (record prefix in the comment):",
             "# mindstudio-probe 26.2.0's lists (the names that are callable attributes of mindspore",
             f"# {mindspore.__version__}) plus the extras of spec/PRODUCER.md section 20, item 25.",
             "# Generated by scripts/gen_ms_api_list.py; tests/dumpers/test_ms_api_coverage.py checks it.", ""]
    for key, (_, prefix, _) in NAMESPACES.items():
        lines.append(f"{key}:  # {prefix}")
        lines.extend(f"  - {n}" for n in lists[key])
        lines.append("")
    with open(OUT, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    print({k: len(v) for k, v in lists.items()})
    for key in NAMESPACES:  # for the api-absent block of spec/PRODUCER.md section 20
        absent = [n for n in real_names(real, key) if n not in lists[key]]
        print(NAMESPACES[key][1], absent)


if __name__ == "__main__":
    main()
