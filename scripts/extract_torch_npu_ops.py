"""Extract the public ``torch_npu`` operators and their schemas from an unpacked torch-npu wheel.

Writes ``scripts/data/torch_npu_ops.txt`` (``name<TAB>schema`` per line), the small committed input of
``scripts/gen_api_list.py``. The wheel itself is never committed::

    pip download --no-deps torch-npu==2.13.0 -d /tmp/npuwheel
    unzip -q /tmp/npuwheel/torch_npu-*.whl 'torch_npu/utils/exposed_api.py' \
        'torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml' -d /tmp/npuwheel/x
    python scripts/extract_torch_npu_ops.py /tmp/npuwheel/x 2.13.0

Sources inside the wheel: ``torch_npu/utils/exposed_api.py`` (``public_npu_functions``: what
``torch_npu`` exports) and ``torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml`` (the
``func:`` schema of every ``torch.ops.npu`` operator).
"""
import ast
import os
import re
import sys


def public_names(root: str) -> list:
    with open(os.path.join(root, "torch_npu", "utils", "exposed_api.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "public_npu_functions" for t in node.targets):
            return sorted(ast.literal_eval(node.value))
    raise SystemExit("public_npu_functions not found in exposed_api.py")


def schemas(root: str) -> dict:
    """Default-overload schema per operator name (``name(...)``, not ``name.overload(...)``)."""
    path = os.path.join(root, "torch_npu", "csrc", "aten", "npu_native_functions_by_codegen.yaml")
    out: dict = {}
    pat = re.compile(r"^\s*(?:- )?\s*func:\s*(.+?)\s*$")
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = pat.match(line)
            if not m:
                continue
            schema = m.group(1)
            head = schema.split("(", 1)[0]
            name, _, overload = head.partition(".")
            if not overload:
                out[name] = schema
            else:  # only overloads (npu_max.dim): keep the first one
                out.setdefault(name, schema)
    return out


def main(argv: list) -> None:
    if len(argv) != 3:
        raise SystemExit("usage: extract_torch_npu_ops.py UNPACKED_WHEEL_DIR TORCH_NPU_VERSION")
    root, version = argv[1], argv[2]
    names, sch = public_names(root), schemas(root)
    here = os.path.dirname(os.path.abspath(__file__))
    lines = [f"# Public torch_npu operators and their schemas, from the torch-npu=={version} wheel",
             "# (torch_npu/utils/exposed_api.py + torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml).",
             "# Regenerate with scripts/extract_torch_npu_ops.py; read by scripts/gen_api_list.py.",
             "# name<TAB>kind<TAB>schema; kind: public (exported by torch_npu) or backward (the operator",
             "# a public one's autograd formula calls); schema empty: no operator schema in the wheel"]
    for n in names:
        lines.append(f"{n}\tpublic\t{sch.get(n, '')}")
    for n in names:
        for b in (n + "_backward", n + "_grad"):
            if b in sch and b not in names:
                lines.append(f"{b}\tbackward\t{sch[b]}")
    with open(os.path.join(here, "data", "torch_npu_ops.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{len(names)} public names, {sum(1 for n in names if n in sch)} with a schema, "
          f"{sum(1 for n in names if n + '_backward' in sch)} backward operators")


if __name__ == "__main__":
    main(sys.argv)
