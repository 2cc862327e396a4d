"""Generate msprobe/dumpers/mindspore/support_wrap_ops.yaml from MindSpore's own namespaces.

Rule: every public Python function of ``mindspore.ops``, ``mindspore.mint``,
``mindspore.mint.nn.functional``, the collectives of ``communication.comm_func`` and
``mint.distributed``, and the computing methods of ``mindspore.Tensor`` (plus the
arithmetic/comparison operators), minus metadata, conversion and autograd helpers.
Run in a venv with the pinned MindSpore (numpy<2):
``python scripts/gen_ms_api_list.py``. The YAML is the editable list afterwards.
"""
import inspect
import os

import mindspore
from mindspore import Tensor, mint, ops
from mindspore.mint.nn import functional as mint_f

OUT = os.path.join(os.path.dirname(__file__), "..", "msprobe", "dumpers", "mindspore", "support_wrap_ops.yaml")

# static constructors of Tensor from host data that are recorded (26.2.0 records them too: with
# Model.train, the dataset iterator's conversion of each batch)
STATIC_APIS = {"from_numpy"}
NOT_OPS = {
    # metadata, conversion, storage, autograd and hook helpers: not computations
    "asnumpy", "numpy", "tolist", "item", "itemset", "dim", "ndimension", "numel", "nelement", "size",
    "element_size", "stride", "storage_offset", "data_ptr", "is_contiguous", "is_floating_point", "is_complex",
    "is_signed", "is_persistent_data", "init_data", "set_init_flag", "set_dtype", "set_const_arg", "has_init",
    "register_hook", "remove_hook", "hooks", "backward", "retain_grad", "requires_grad_", "detach_", "flush_from_cache",
    "offload", "offload_file_path", "move_to", "assign_value", "assign_value_cpp", "data_sync",
    "contiguous", "is_init", "slice_num_of_persistent_data", "slice_shape_of_persistent_data",
    "_offload", "asnumpy_of_slice_persistent_data", "storage", "untyped_storage", "dtype", "shape", "device",
    "get_bytes", "dump_data", "param_info", "set_param_ps", "set_data", "copy_", "new_empty", "new_tensor",
    "is_neg", "is_conj", "type", "to", "cpu", "npu", "ascend", "pin_memory", "_convert_stub",
    # ops: dtype/context helpers
    "dtype_to_nptype", "dtype_to_pytype", "pytype_to_dtype", "get_vm_impl_fn", "constexpr", "primitive",
    "prim_attr_register", "signature", "grad", "value_and_grad", "vjp", "jvp", "jacfwd", "jacrev", "vmap",
    "stop_gradient", "depend", "print_", "tensor_dump", "custom_info_register", "kernel", "ms_kernel",
    "is_tensor", "isconstant", "is_floating_point", "is_complex", "is_nonzero", "typeof", "names",
    "shape", "rank", "dtype", "size", "numel", "get_grad", "_make_mint_func",
}
DUNDER_OPS = {
    "__add__", "__radd__", "__iadd__", "__sub__", "__rsub__", "__isub__", "__mul__", "__rmul__", "__imul__",
    "__truediv__", "__rtruediv__", "__itruediv__", "__floordiv__", "__rfloordiv__", "__ifloordiv__", "__mod__",
    "__rmod__", "__imod__", "__pow__", "__rpow__", "__matmul__", "__rmatmul__", "__imatmul__", "__and__",
    "__rand__", "__or__", "__ror__", "__xor__", "__rxor__", "__neg__", "__abs__", "__invert__", "__eq__",
    "__ne__", "__lt__", "__le__", "__gt__", "__ge__",
}
# (no barrier: it has no tensors, and msprobe does not wrap it either)
COMM = ["all_reduce", "all_gather_into_tensor", "reduce", "reduce_scatter_tensor", "broadcast", "gather_into_tensor",
        "scatter_tensor", "send", "recv", "isend", "irecv", "all_to_all_single_with_output_shape",
        "all_to_all_with_output_shape", "batch_isend_irecv", "all_gather", "gather", "scatter", "reduce_scatter",
        "all_to_all", "all_to_all_single"]


def functions(mod) -> list:
    out = []
    for name in dir(mod):
        if name.startswith("_") or name in NOT_OPS:
            continue
        obj = getattr(mod, name, None)
        if inspect.isfunction(obj) or inspect.isbuiltin(obj):
            out.append(name)
    return sorted(out)


def tensor_methods() -> list:
    out = []
    for name in dir(Tensor):
        if name in DUNDER_OPS:
            out.append(name)
            continue
        if name.startswith("_") or name in NOT_OPS:
            continue
        attr = inspect.getattr_static(Tensor, name, None)
        if isinstance(attr, staticmethod) and name in STATIC_APIS:
            out.append(name)
            continue
        if isinstance(attr, (property, staticmethod, classmethod)) or attr is None:
            continue
        if callable(attr):
            out.append(name)
    return sorted(out)


def comm(mod) -> list:
    return [n for n in COMM if callable(getattr(mod, n, None))]


def main() -> None:
    from mindspore.communication import comm_func
    from mindspore.mint import distributed

    sections = [
        ("ops", "Functional", functions(ops)),
        ("tensor", "Tensor", tensor_methods()),
        ("mint", "Mint", functions(mint)),
        ("mint.nn.functional", "MintFunctional", functions(mint_f)),
        ("communication.comm_func", "Distributed", comm(comm_func)),
        ("mint.distributed", "MintDistributed", comm(distributed)),
    ]
    lines = ["# APIs wrapped by the MindSpore dumper, per namespace (prefix in the comment).",
             f"# Generated by scripts/gen_ms_api_list.py from mindspore {mindspore.__version__}; edit freely.", ""]
    for key, prefix, names in sections:
        lines.append(f"{key}:  # {prefix}")
        lines.extend(f"  - {n}" for n in names)
        lines.append("")
    with open(OUT, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    print({k: len(n) for k, _, n in sections})


if __name__ == "__main__":
    main()
