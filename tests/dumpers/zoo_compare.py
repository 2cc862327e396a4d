"""What the two conformance zoos (test_zoo.py: committed real dumps; test_wild_zoo.py: the real tool
run live) share when they hold a rank directory of ours against the real tool's: the document
header, the record names and their order, the construct.json parents of forward records, the
figures file (MSPROBE_CONFORMANCE_FIGURES) and the markdown table of docs/conformance.md."""
from __future__ import annotations

import json
import os
import re
import sys
from typing import Callable, Optional


def header_problems(real_doc: dict, our_doc: dict) -> list:
    """("document", key, real, ours) for each of task/level/framework that differs."""
    return [("document", key, real_doc[key], our_doc[key]) for key in ("task", "level", "framework")
            if real_doc[key] != our_doc[key]]


def module_backward_kept(real: dict, ours: dict) -> list:
    """§20 item 10: the backward records we keep of a module whose output an in-place op modified."""
    return [name for name in ours if name not in real and name.startswith("Module.")
            and re.search(r"\.backward\.\d+$", name)]


def name_problems(real: dict, ours: dict, limit: Optional[int] = None) -> list:
    """("names", only real, only ours) when the record names differ, else ("order", first pairs out of
    place) when their order does; ``limit``: at most that many names of each side."""
    if set(real) != set(ours):
        return [("names", sorted(set(real) - set(ours))[:limit], sorted(set(ours) - set(real))[:limit])]
    if list(real) != list(ours):
        return [("order", [(real_name, our_name) for real_name, our_name in zip(real, ours)
                           if real_name != our_name][:5])]
    return []


def construct_problems(real_dir: str, our_dir: str, skip: Callable[[str], bool] = lambda name: False) -> list:
    """(child, real parent, our parent) of each forward record whose construct.json parent differs."""
    with open(os.path.join(real_dir, "construct.json")) as file:
        real_parents = json.load(file)
    with open(os.path.join(our_dir, "construct.json")) as file:
        our_parents = json.load(file)
    return [(child, parent, our_parents.get(child, "MISSING")) for child, parent in real_parents.items()
            if re.search(r"\.forward(\.\d+)?$", child) and not skip(child)
            and our_parents.get(child, "MISSING") != parent]


def _cut_short_module(rec) -> bool:
    """26.2.0's record of a module whose forward raised (a checkpoint recompute cut short, §20):
    output [null], its own parameters as usual (none for a container, a Linear's weight)."""
    return isinstance(rec, dict) and rec.get("output") == [None] and "parameters" in rec


def cut_short(real: dict, ours: dict) -> tuple:
    """(26.2.0's records of modules whose forward was cut short, our API forward records after the
    first API call cut short): spec/PRODUCER.md §20 item 27. 26.2.0 writes a module whose forward
    raised (a torch.utils.checkpoint recompute cut short) with output [null], we do not; after an
    API call cut short (inputs only, no output) it writes no API forward record for the rest of the
    step (its nesting counter stays raised), we go on (the optimizer's Tensor.add_ and the next
    recomputes' calls)."""
    cut = [n for n in real if n not in ours and _cut_short_module(real[n])]
    cut_api = [n for n, v in real.items() if n.endswith(".forward") and isinstance(v, dict) and "input_args" in v
               and "output" not in v]
    after: list = []
    if cut_api:
        names = list(ours)
        start = names.index(cut_api[0]) if cut_api[0] in names else len(names)
        after = [n for n in names[start + 1:] if n not in real and n.endswith(".forward")]
    return cut, after


#: the levels at which 26.2.0 changes the training it dumps (spec/PRODUCER.md §20 item 43): there it routes each
#: module's inputs and outputs through an identity autograd node (BackwardHook), which sums some gradients in
#: another order. At L1 it hooks an API's backward by a post hook on its output's node (grad_fn.register_hook),
#: which changes nothing: both tools see the same training there, bit for bit
PERTURBING_LEVELS = ("L0", "mix")
#: the fields of a tensor entry that are its values (the rest, type/dtype/shape/requires_grad, is its structure)
VALUE_FIELDS = ("Max", "Min", "Mean", "Norm", "md5")


def is_backward(name: str) -> bool:
    """A record written in the backward: an API's or a module's backward, a module's parameters_grad."""
    return ".backward" in name or ".parameters_grad" in name


def reached(level: str, names, before: bool = False, starts: Callable[[str], bool] = is_backward) -> dict:
    """name -> whether 26.2.0's perturbation can reach the record's values (spec/PRODUCER.md §20 item 43 (d)): at
    L0 and mix, every record from the first backward record of the run on (``before``: an earlier step of the
    same rank had one), in the order written. Before it nothing has read a gradient: the forward values are the
    same computation in both tools, bit for bit on any machine. From it on the gradients are 26.2.0's reordered
    sums, and so are whatever reads them later (the optimizer's calls, clip_grad_norm_, every later forward);
    how far the last-bit differences grow depends on the CPU's kernels and the thread count. ``starts``: whether a
    record starts the perturbation (a backward record; where the identity nodes make the model take another code
    path, §20 item 47, also the first record of that path)."""
    hit = before and level in PERTURBING_LEVELS
    out = {}
    for name in names:
        hit = hit or (level in PERTURBING_LEVELS and starts(name))
        out[name] = hit
    return out


def value_class(value):
    """What of a statistic or checksum no summation order can change: null or not, NaN, +-inf or finite."""
    if value is None or isinstance(value, bool):
        return value if value is None else "bool"
    if isinstance(value, str):
        return "checksum"
    return "nan" if value != value else "inf" if value == float("inf") else "-inf" if value == float("-inf") \
        else "finite"


def unvalued(record):
    """``record`` with each tensor entry's values (VALUE_FIELDS) replaced by their value_class: what is left is
    compared exactly (names, keys, argument encodings, dtype, shape, requires_grad, null/NaN/inf-ness)."""
    if isinstance(record, dict):
        tensor = "dtype" in record
        return {k: value_class(v) if tensor and k in VALUE_FIELDS else unvalued(v) for k, v in record.items()}
    if isinstance(record, list):
        return [unvalued(v) for v in record]
    return record


def values_in(record) -> int:
    """How many value fields (VALUE_FIELDS) the tensor entries of ``record`` hold (null ones included, as the
    "values compared" figure counts them)."""
    if isinstance(record, dict):
        tensor = "dtype" in record
        return sum(1 if tensor and k in VALUE_FIELDS else values_in(v) for k, v in record.items())
    if isinstance(record, list):
        return sum(values_in(v) for v in record)
    return 0


def write_figures(fig: dict, run: str) -> None:
    """Append one run's figures to the file MSPROBE_CONFORMANCE_FIGURES names (the problems counted)."""
    if os.environ.get("MSPROBE_CONFORMANCE_FIGURES"):  # the figures of docs/conformance.md
        with open(os.environ["MSPROBE_CONFORMANCE_FIGURES"], "a") as file:
            file.write(json.dumps(dict(fig, run=run, problems=len(fig["problems"]))) + "\n")


def notes_of(fig: dict, notes: list) -> str:
    """The §20 differences column: ``notes`` is (figure key, text after the count) in the order shown."""
    return "; ".join(f"{fig[key]} {text}" for key, text in notes if fig.get(key)) or "-"


def print_table(table: Callable[[list], str]) -> None:
    """``python tests/dumpers/<zoo>.py FIGURES.jsonl``: the table of docs/conformance.md."""
    with open(sys.argv[1]) as file:
        print(table(file.readlines()))
