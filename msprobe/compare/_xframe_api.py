"""The built-in MindSpore-to-PyTorch API correspondences of ``-am`` (our own table).

Derived from MindSpore's public PyTorch-MindSpore API mapping (``mindspore.mint`` mirrors
``torch`` and ``mindspore.mint.nn.functional`` mirrors ``torch.nn.functional``;
``mindspore.ops.<f>`` is ``torch.<f>`` or ``torch.nn.functional.<f>``; ``mindspore.Tensor`` is
``torch.Tensor``) and from running the same small models in both frameworks and reading which
API each dump records for the same operation (``Dense`` calls ``MatMul`` and ``BiasAdd`` where
``Linear`` calls ``linear``; ``x + y`` is ``Tensor.__add__`` on both sides, ``mint.add`` is
``torch.add``).

``Primitive`` records (the primitives a Cell calls, ``MatMul`` and ``BiasAdd`` of a ``Dense``) pair
only through the table: most have no PyTorch record (``Linear`` calls one ``linear``).

A MindSpore API record ``<Type>.<api>`` is tried against the PyTorch API names in the order
:func:`mindspore_api` gives; the first one the PyTorch dump holds is its key.
"""
from __future__ import annotations

__all__ = ["BUILTIN", "BUILTIN_ARGS", "CELL_CLASSES", "PARAMETERS", "PT_TYPES", "mindspore_api"]

#: the API types of a PyTorch dump
PT_TYPES = ("Torch", "Functional", "Tensor", "NPU", "Distributed", "Aten", "VF")

_OPERATORS = {
    "add": "__add__", "sub": "__sub__", "mul": "__mul__", "div": "__truediv__", "matmul": "__matmul__",
    "neg": "__neg__", "pow": "__pow__", "logical_or": "__or__", "logical_and": "__and__",
    "bitwise_or": "__or__", "bitwise_and": "__and__", "eq": "__eq__", "ne": "__ne__", "lt": "__lt__",
    "le": "__le__", "gt": "__gt__", "ge": "__ge__", "getitem": "__getitem__", "floor_divide": "__floordiv__",
    "remainder": "__mod__",
}

#: MindSpore ``Type.api`` -> PyTorch ``Type.api`` names, most likely first, where the names differ
BUILTIN = {
    "Functional.dense": ("Functional.linear",),
    "MintFunctional.dense": ("Functional.linear",),
    "Functional.conv2d": ("Functional.conv2d",),
    "Primitive.relu": ("Functional.relu", "Torch.relu"),
    "Primitive.gelu": ("Functional.gelu",),
    "Primitive.softmax": ("Functional.softmax", "Torch.softmax"),
    "Primitive.layer_norm": ("Functional.layer_norm",),
    "Functional.layer_norm": ("Functional.layer_norm",),
    "Primitive.norm": ("NPU.npu_rms_norm",),
    "Functional.rms_norm": ("NPU.npu_rms_norm",),
    "Functional.flash_attention_score": ("NPU.npu_fusion_attention",),
    "Functional.reshape": ("Tensor.reshape", "Torch.reshape", "Tensor.view"),
    "Tensor.reshape": ("Tensor.reshape", "Tensor.view", "Torch.reshape"),
    "Tensor.view": ("Tensor.view", "Tensor.reshape"),
    "Functional.transpose": ("Tensor.permute", "Torch.permute", "Torch.transpose"),
    "Functional.swapaxes": ("Tensor.transpose", "Torch.transpose"),
    "Tensor.swapaxes": ("Tensor.transpose",),
    "Tensor.swapdims": ("Tensor.transpose",),
    "Functional.concat": ("Torch.cat",),
    "Functional.cat": ("Torch.cat",),
    "Functional.expand_dims": ("Tensor.unsqueeze", "Torch.unsqueeze"),
    "Functional.squeeze": ("Tensor.squeeze", "Torch.squeeze"),
    "Functional.cross_entropy": ("Functional.cross_entropy",),
    "Functional.mse_loss": ("Functional.mse_loss",),
    "Functional.max_pool2d": ("Functional.max_pool2d",),
    "Functional.avg_pool2d": ("Functional.avg_pool2d",),
    "Functional.dropout": ("Functional.dropout",),
    "Functional.tanh": ("Torch.tanh", "Tensor.tanh"),
    "Functional.sigmoid": ("Torch.sigmoid", "Functional.sigmoid", "Tensor.sigmoid"),
    "Functional.mean": ("Tensor.mean", "Torch.mean"),
    "Functional.sum": ("Tensor.sum", "Torch.sum"),
}


#: arguments that sit at other positions: {MindSpore ``Type.api``: {(direction, "input"/"output"):
#: (its indices, PyTorch's)}}. ``LayerNorm``'s primitive takes x, gamma, beta where ``layer_norm``
#: takes x, normalized_shape, weight, bias, eps; its backward record holds the gradients of beta,
#: gamma and x where PyTorch's holds those of x, weight and bias (read from both dumps of one model).
BUILTIN_ARGS = {"Primitive.layer_norm": {("forward", "input"): ((0, 1, 2), (0, 2, 3)),
                                         ("backward", "output"): ((0, 1, 2), (2, 1, 0))}}

#: MindSpore parameter names -> PyTorch's, where they differ (``LayerNorm``/``BatchNorm``, ``Embedding``)
PARAMETERS = {"gamma": "weight", "beta": "bias", "moving_mean": "running_mean", "moving_variance": "running_var",
              "embedding_table": "weight"}

#: MindSpore Cell classes -> the PyTorch Module classes of the same layer, where the names differ
CELL_CLASSES = {"Dense": "Linear", "SequentialCell": "Sequential", "CellList": "ModuleList", "CellDict": "ModuleDict",
                "BatchNorm2d": "BatchNorm2d", "Conv2dTranspose": "ConvTranspose2d", "LSTM": "LSTM",
                "GELU": "GELU", "SiLU": "SiLU", "Dropout": "Dropout"}


def _operator(api: str) -> tuple:
    dunder = _OPERATORS.get(api)
    return (f"Tensor.{dunder}",) if dunder else ()


def mindspore_api(kind: str, api: str, table: dict) -> tuple:
    """The PyTorch ``Type.api`` names a MindSpore API record of type ``kind`` may be, most likely first."""
    named = tuple(table.get(f"{kind}.{api}", ()))
    plain = api[2:-2] if api.startswith("__") and api.endswith("__") else api
    if kind == "Mint":
        generic: tuple = (f"Torch.{api}", f"Tensor.{api}", f"Functional.{api}") + _operator(api)
    elif kind in ("MintFunctional", "Functional"):
        generic = (f"Functional.{api}", f"Torch.{api}", f"Tensor.{api}") + _operator(api)
    elif kind == "Tensor":
        generic = (f"Tensor.{api}", f"Torch.{plain}", f"Tensor.{plain}")
    elif kind == "Primitive":  # a Cell's own primitives: only those of the table have a PyTorch counterpart
        generic = ()
    else:
        generic = (f"{kind}.{api}",)
    return named + generic
