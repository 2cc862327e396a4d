"""The tensors of a merged logical model (tensor mode, spec/FORMAT.md section 26.6): each merged
leaf names a *recipe* (``merged/N:what``) of the ranks' tensor files it is made of: one rank's file, the
shards concatenated along a dimension, a data-parallel replica's backward piece divided by dp, the
replicas' mean, the ranks' partial sums added. :class:`TensorRecipes` holds them and reads them as a store does (``open_read``
gives the ``.npy`` bytes of the made tensor), so compare's tensor mode reads a merged model's
tensors as it reads a rank's files, with the same bounds: each file read is bounded by its own
record's dtype and shape, and the made tensor by the merged leaf's."""
from __future__ import annotations

import io
from typing import Any, Optional

from msprobe.errors import StorageNotFoundError

__all__ = ["TensorRecipes", "TensorView", "PREFIX", "balanced_order"]

PREFIX = "merged/"


#: the longest description a recipe's name carries after its number
_TEXT = 160


def _text_of(name: str) -> str:
    return name.split(":", 1)[1] if ":" in name else name


class TensorRecipes:
    """The recipes of one merged step, by name: ``merged/N:what`` (``what`` says which ranks'
    files it is made of, for the reader of a CSV's Data_name column)."""

    def __init__(self) -> None:
        self.recipes: list = []
        #: the names of the tensors whose elements the merge cannot put in the other side's order
        #: (:meth:`unordered`): their tensor metrics are not computed
        self.unordered_names: set = set()

    def _add(self, recipe: tuple, text: str) -> str:
        self.recipes.append(recipe)
        if len(text) > _TEXT:
            text = text[:_TEXT - 3] + "..."
        return f"{PREFIX}{len(self.recipes) - 1}:{text}"

    def file(self, source: Any, data_name: str, leaf: dict) -> str:
        """A rank's own tensor file (``data_name`` in its dump_tensor_data)."""
        return self._add(("file", source, data_name, leaf.get("dtype"), tuple(leaf.get("shape") or ())),
                         f"rank{source.rank}/{data_name}")

    def made(self, how: str, parts: list, dim: int = 0, divisor: float = 1.0, groups: int = 1) -> Optional[str]:
        """``how``: ``cat`` (the parts joined along ``dim``), ``balanced`` (context-parallel pieces put in
        sequence order, :func:`balanced_order`; ``groups`` sequences, samples, along ``dim``),
        ``average`` (their mean) or ``sum`` (partial sums added: the whole each rank holds a part of,
        in the record's own layout), then divided by ``divisor``; None when a part has no tensor."""
        if not parts or any(not isinstance(part, str) or not part.startswith(PREFIX) for part in parts):
            return None
        if how == "cat" and len(parts) == 1 and divisor == 1.0:
            return parts[0]
        text = f"{how}({', '.join(_text_of(part) for part in parts)})" + (f"/{divisor:g}" if divisor != 1.0 else "")
        return self._add((how, tuple(parts), dim, divisor, groups), text)

    def scaled(self, part: Any, divisor: float) -> Optional[str]:
        return self.made("cat", [part], 0, divisor)

    def unordered(self, part: Any) -> Optional[str]:
        """``part``'s tensor marked as one whose elements the merge cannot put in the single card's
        order (``unordered(...)`` in its name; compare leaves its tensor metrics out): None when it
        has no tensor."""
        if not isinstance(part, str) or not part.startswith(PREFIX):
            return None
        name = self._add(("cat", (part,), 0, 1.0, 1), f"unordered({_text_of(part)})")
        self.unordered_names.add(name)
        return name

    def reordered(self, part: Any, order: list) -> Optional[str]:
        """``part``'s tensor with its rows (first dimension) taken in ``order`` (``routed(...)``: the
        MoE layers' tokens put in the single card's order); None when it has no tensor."""
        if not isinstance(part, str) or not part.startswith(PREFIX):
            return None
        return self._add(("take", (part,), 0, 1.0, tuple(int(i) for i in order)), f"routed({_text_of(part)})")

    def is_unordered(self, name: Any) -> bool:
        return name in self.unordered_names

    def array(self, name: str, record: str) -> Any:
        """The numpy array a recipe makes."""
        import numpy as np

        from msprobe.readers._tensor import load_tensor_file

        number = name[len(PREFIX):].split(":", 1)[0]
        index = int(number) if name.startswith(PREFIX) and number.isdigit() else -1
        if not 0 <= index < len(self.recipes):
            raise StorageNotFoundError(f"{name}: no such tensor of the merged model")
        recipe = self.recipes[index]
        if recipe[0] == "file":
            _, source, data_name, dtype, shape = recipe
            return load_tensor_file(source.store, source.tensor_key(data_name), record=record, dtype=dtype,
                                    shape=shape, framework="numpy")
        how, parts, dim, divisor, groups = recipe
        arrays = [self.array(part, record) for part in parts]
        if how in ("average", "sum"):
            if any(np.shape(a) != np.shape(arrays[0]) for a in arrays[1:]):
                raise StorageNotFoundError(f"{name}: the parts of a {how} differ in shape")
            reduce = np.mean if how == "average" else np.sum
            made = reduce(np.stack([np.asarray(a, dtype=np.float64) for a in arrays]), axis=0).astype(arrays[0].dtype)
        elif how == "take":
            if len(arrays[0]) != len(groups):
                raise StorageNotFoundError(f"{name}: {len(arrays[0])} rows to put in an order of {len(groups)}")
            made = arrays[0][np.asarray(groups, dtype=np.int64)]
        elif how == "balanced":
            made = np.concatenate(balanced_order(arrays, dim, groups), axis=dim)
        else:
            made = np.concatenate(arrays, axis=dim) if len(arrays) > 1 else arrays[0]
        if divisor != 1.0:
            made = (made / divisor).astype(arrays[0].dtype)
        return made

    def open_read(self, key: str) -> io.BytesIO:
        """The ``.npy`` bytes of the tensor recipe ``key`` makes (a store's read)."""
        import numpy as np

        buffer = io.BytesIO()
        np.save(buffer, self.array(key, key), allow_pickle=False)
        buffer.seek(0)
        return buffer


def balanced_order(arrays: list, dim: int, groups: int) -> list:
    """The pieces of ``C`` context-parallel ranks' ``arrays`` in sequence order: along ``dim`` each
    holds ``groups`` sequences (samples folded into the dimension), each of 2 chunks, Megatron's
    load-balanced chunks ``r`` and ``2C-1-r`` of rank ``r``; chunk ``k`` of a sequence is rank ``k``'s
    first (``k < C``) or rank ``2C-1-k``'s second."""
    import numpy as np

    count = len(arrays)
    split = [np.array_split(array, 2 * groups, axis=dim) for array in arrays]
    return [split[k if k < count else 2 * count - 1 - k][2 * sample + (0 if k < count else 1)]
            for sample in range(groups) for k in range(2 * count)]


def _qualified(node: Any, source: Any, recipes: TensorRecipes) -> Any:
    """``node`` with every tensor leaf's ``data_name`` a recipe of ``source``'s file."""
    if isinstance(node, dict):
        if isinstance(node.get("data_name"), str) and "dtype" in node and "shape" in node:
            return dict(node, data_name=recipes.file(source, node["data_name"], node))
        return {key: _qualified(value, source, recipes) for key, value in node.items()}
    if isinstance(node, list):
        return [_qualified(value, source, recipes) for value in node]
    return node


class TensorView:
    """A rank source whose records' tensor leaves name recipes of its files (a tensor dump merged)."""

    def __init__(self, source: Any, recipes: TensorRecipes):
        from msprobe.format.documents import DumpDocument

        self.source = source
        self.rank, self.step, self.url = source.rank, source.step, source.url
        self.rank_dir = getattr(source, "rank_dir", None)
        raw = dict(source.document().raw)
        raw["data"] = {name: _qualified(record, source, recipes) for name, record in source.document().data.items()}
        self._document = DumpDocument(raw)

    def document(self) -> Any:
        return self._document

    def parents(self) -> dict:
        return self.source.parents()

    def frames_of(self, name: str) -> Optional[list]:
        return self.source.frames_of(name)


def tensor_views(sources: list, recipes: TensorRecipes) -> list:
    """``sources`` as :class:`TensorView` when they are tensor dumps (their task), else as they are."""
    out = []
    for source in sources:
        try:
            task = source.document().task
        except Exception:  # noqa: BLE001 - a rank without a document holds no records
            task = None
        out.append(TensorView(source, recipes) if task == "tensor" else source)
    return out
