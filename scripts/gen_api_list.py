"""Generate msprobe/dumpers/pytorch/support_wrap_ops.yaml from torch's own namespaces.

Rule: every public callable that computes on tensors, minus metadata/introspection
helpers. Run with the pinned torch: ``.venv/bin/python scripts/gen_api_list.py``.
The YAML is then edited by hand when needed (it is the editable list).
"""
import inspect
import os

import torch
import torch.nn.functional as F

NOT_OPS = {
    "size", "dim", "stride", "data_ptr", "item", "tolist", "numpy", "element_size", "nelement", "numel", "ndimension",
    "storage", "untyped_storage", "storage_offset", "storage_type", "register_hook", "register_post_accumulate_grad_hook",
    "backward", "retain_grad", "requires_grad_", "type", "get_device", "is_contiguous", "is_complex",
    "is_floating_point", "is_signed", "is_inference", "is_set_to", "is_shared", "is_pinned", "is_same_size",
    "is_nonzero", "is_coalesced", "is_conj", "is_neg", "is_leaf", "dim_order", "share_memory_", "pin_memory",
    "apply_", "map_", "map2_", "new", "record_stream", "module_load", "has_names", "refine_names", "rename",
    "rename_", "align_to", "align_as", "unflatten", "to_dlpack", "__dlpack__", "__dlpack_device__", "data",
    "grad", "untyped_storage", "_typed_storage", "smm", "is_distributed", "nbytes", "itemsize", "as_subclass",
    "tensor_split", "type_as", "set_", "dense_dim", "sparse_dim", "values", "indices", "crow_indices",
    "col_indices", "row_indices", "ccol_indices", "coalesce", "_values", "_indices", "q_scale", "q_zero_point",
    "q_per_channel_scales", "q_per_channel_zero_points", "q_per_channel_axis", "qscheme", "int_repr",
}
DUNDER_OPS = {
    "__add__", "__radd__", "__iadd__", "__sub__", "__rsub__", "__isub__", "__mul__", "__rmul__", "__imul__",
    "__truediv__", "__rtruediv__", "__itruediv__", "__div__", "__rdiv__", "__idiv__", "__floordiv__",
    "__rfloordiv__", "__ifloordiv__", "__mod__", "__rmod__", "__imod__", "__pow__", "__rpow__", "__ipow__",
    "__matmul__", "__rmatmul__", "__and__", "__rand__", "__iand__", "__or__", "__ror__", "__ior__", "__xor__",
    "__rxor__", "__ixor__", "__lshift__", "__rlshift__", "__ilshift__", "__rshift__", "__rrshift__",
    "__irshift__", "__neg__", "__pos__", "__abs__", "__invert__", "__eq__", "__ne__", "__lt__", "__le__",
    "__gt__", "__ge__", "__setitem__",
}
F_SKIP = {"boolean_dispatch", "has_torch_function", "handle_torch_function", "has_torch_function_unary",
          "has_torch_function_variadic", "assert_int_or_pair", "reproducibility_notes", "sparse_support_notes",
          "tf32_notes", "native_channel_shuffle", "_in_projection_packed", "_in_projection"}
TORCH_SKIP = {"is_tensor", "is_storage", "is_complex", "is_floating_point", "is_nonzero", "is_grad_enabled",
              "is_inference_mode_enabled", "is_autocast_enabled", "set_grad_enabled", "get_default_dtype",
              "set_default_dtype", "numel", "typename", "compile", "manual_seed", "seed", "initial_seed",
              "get_rng_state", "set_rng_state", "use_deterministic_algorithms", "load", "save", "set_printoptions",
              "is_same_size", "is_conj", "is_neg", "is_inference", "is_signed", "result_type", "can_cast",
              "promote_types", "get_num_threads", "set_num_threads", "get_num_interop_threads",
              "set_num_interop_threads", "is_vulkan_available", "is_distributed", "set_flush_denormal",
              "is_anomaly_enabled", "is_anomaly_check_nan_enabled", "are_deterministic_algorithms_enabled",
              "is_deterministic_algorithms_warn_only_enabled", "from_numpy", "frombuffer", "from_dlpack",
              "sym_int", "sym_float", "sym_max", "sym_min", "sym_not", "sym_ite", "sym_sum", "sym_fresh_size",
              "is_warn_always_enabled", "set_warn_always", "vmap", "cond", "export", "while_loop",
              "set_default_device", "get_default_device", "get_device_module", "unravel_index",
              "align_tensors", "broadcast_shapes", "chain_matmul", "get_autocast_dtype", "set_autocast_dtype",
              "autocast_increment_nesting", "autocast_decrement_nesting", "clear_autocast_cache",
              "set_autocast_enabled", "is_autocast_cache_enabled", "set_autocast_cache_enabled",
              "empty_strided", "promote_types", "get_file_path", "prepare_multiprocessing_environment",
              "fork_rng", "set_float32_matmul_precision", "get_float32_matmul_precision",
              "_assert", "_assert_async", "use_deterministic_algorithms", "get_deterministic_debug_mode",
              "set_deterministic_debug_mode", "classproperty", "is_nested_int"}
#: kept out of every namespace so that our records match what msprobe 26.x records for the same
#: script (tests/dumpers/test_conformance.py): copies/bookkeeping it does not dump
NOT_RECORDED = {"clone", "detach", "detach_", "tensor", "ones_like", "as_tensor", "view", "contiguous", "ones",
                "zeros_like", "__invert__"}
DIST = ["all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce",
        "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter", "send", "recv", "isend", "irecv",
        "barrier", "all_to_all", "all_to_all_single", "batch_isend_irecv", "broadcast_object_list",
        "_all_gather_base", "_reduce_scatter_base"]
#: torch_npu helpers that move or describe memory rather than compute: not wrapped
NPU_SKIP = {"npu_format_cast", "npu_format_cast_", "empty_with_swapped_memory", "npu_prefetch",
            "npu_alloc_float_status", "npu_get_float_status", "npu_clear_float_status"}
NPU_OPS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "torch_npu_ops.txt")
VF = ["lstm", "gru", "rnn_tanh", "rnn_relu", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell"]


def public_ops(ns, skip):
    out = []
    for name in sorted(dir(ns)):
        if name.startswith("_") or name in skip:
            continue
        obj = getattr(ns, name, None)
        if inspect.isclass(obj) or inspect.ismodule(obj) or not callable(obj):
            continue
        out.append(name)
    return out


def npu_ops(path: str = NPU_OPS) -> list:
    """The public torch_npu operators (scripts/data/torch_npu_ops.txt, extracted from the torch-npu wheel by
    scripts/extract_torch_npu_ops.py): recorded as ``NPU.{op}.{n}.{forward|backward}``."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            name, kind, _ = line.rstrip("\n").split("\t", 2)
            if kind == "public" and name not in NPU_SKIP:
                out.append(name)
    return sorted(out)


def main():
    functional = [n for n in public_ops(F, F_SKIP) if getattr(getattr(F, n), "__module__", "") in
                  ("torch.nn.functional", "torch._C._nn", None, "torch._jit_internal")
                  or inspect.isbuiltin(getattr(F, n))]
    tensor = sorted({n for n in dir(torch.Tensor) if (not n.startswith("_") and n not in NOT_OPS
                                                      and callable(getattr(torch.Tensor, n, None))
                                                      and not isinstance(getattr(torch.Tensor, n), property)
                                                      and not n.startswith("is_") and not n.startswith("to_sparse")
                                                      and not n.startswith("_"))} | DUNDER_OPS
                    | {"npu"})  # Tensor.npu exists once torch_npu is imported: recorded like Tensor.cuda
    vf_names = set(dir(torch._C._VariableFunctions))
    import torch.functional as tf
    torch_ops = sorted({n for n in public_ops(torch, TORCH_SKIP)
                        if n in vf_names or n in getattr(tf, "__all__", [])} - {"is_tensor"})
    lines = ["# APIs wrapped by the PyTorch dumper, per namespace (prefix in brackets).",
             "# Generated by scripts/gen_api_list.py from torch's namespaces; edit freely.", ""]
    functional = [n for n in functional if n not in NOT_RECORDED]
    tensor = [n for n in tensor if n not in NOT_RECORDED]
    torch_ops = [n for n in torch_ops if n not in NOT_RECORDED]
    for key, names in (("functional", functional), ("tensor", tensor), ("torch", torch_ops), ("vf", VF),
                       ("aten", []), ("distributed", DIST), ("npu", npu_ops())):
        lines.append(f"{key}:" + (" []" if not names else ""))
        lines.extend(f"  - {n}" for n in names)
    out = os.path.join(os.path.dirname(__file__), "..", "msprobe", "dumpers", "pytorch", "support_wrap_ops.yaml")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print({k: len(v) for k, v in (("functional", functional), ("tensor", tensor), ("torch", torch_ops),
                                  ("npu", npu_ops()))})


if __name__ == "__main__":
    main()
