"""Reading a parallel run's layout (spec/FORMAT.md 26.1, 26.2): the logical models of a step's
rank sources under a given :class:`~msprobe.format.parallel.Layout`, or read from the dump's
communication records (``--layout auto``: tensor-parallel groups, pipeline stages, context- and
expert-parallel sizes, virtual pipeline chunks)."""
from __future__ import annotations

import re
from typing import Any, Optional

from msprobe.errors import ConfigError
from msprobe.format.comm import comm_api, comm_call
from msprobe.format.parallel import Layout, LayoutError
from msprobe.readers._merge_chunks import chunk_count
from msprobe.readers._merge_experts import expert_groups
from msprobe.readers._merge_leaf import _is_backward, _last_backward, _leaves, _shape


def _records_of(source: Any) -> dict:
    try:
        return source.document().data
    except Exception:  # noqa: BLE001 - a rank without a document holds no records
        return {}


_TP_FORWARD = ("all_reduce", "reduce_scatter_tensor", "_reduce_scatter_base", "reduce_scatter_single", "reduce_scatter")


class _RankCalls:
    """What one rank's communication records say of its groups (:func:`_groups_of`)."""

    def __init__(self) -> None:
        self.forward_reduce: Optional[tuple] = None
        self.scattered: Optional[tuple] = None
        self.later: Optional[tuple] = None
        self.on_default = False
        self.gathered: list = []
        self.first_send: Optional[int] = None
        self.first_recv: Optional[tuple] = None

    def see(self, call: Any, index: int, last: int, forward: bool) -> None:
        group = tuple(call.group) if call.group else ()
        if call.api == "all_reduce" and self.forward_reduce is None and (index < last or last < 0):
            if not group:
                self.on_default = self.on_default or index < last
            elif self.later is None and len(group) > 1:
                self.later = group
        if forward and len(group) > 1:
            if call.api == "all_reduce" and self.forward_reduce is None:
                self.forward_reduce = group
            elif call.api in _TP_FORWARD and self.scattered is None:
                self.scattered = group
            elif call.api.startswith("all_gather"):
                self.gathered.append(group)
        if call.kind == "send" and self.first_send is None:
            self.first_send = index
        if call.kind == "recv" and self.first_recv is None:
            self.first_recv = (index, call.peer)

    def tp_group(self, world: tuple, default_world: bool) -> Optional[tuple]:
        found = self.forward_reduce or self.scattered or self.later
        return found if found is not None else (world if default_world and self.on_default else None)

    def previous(self) -> Optional[int]:
        recv, send = self.first_recv, self.first_send
        if recv is not None and recv[1] is not None and (send is None or recv[0] < send):
            return recv[1]
        return None


def _rank_calls(source: Any) -> _RankCalls:
    calls = _RankCalls()
    records = _records_of(source)
    last = _last_backward(list(records))
    forward = True
    for index, (name, record) in enumerate(records.items()):
        forward = forward and not _is_backward(name)
        call = comm_call(name, record, source.rank, index)
        if call is not None:
            calls.see(call, index, last, forward)
    return calls


def _groups_of(sources: list, default_world: bool = False, gathers: Optional[dict] = None) -> tuple:
    """({rank: its tensor-parallel group}, {rank: previous pipeline stage's rank}) as the dump says
    them: the group of a rank's first all_reduce that names one issued before its first backward
    record (a row-parallel layer's reduction), else of its first reduce_scatter there (sequence
    parallelism), else of its first all_reduce naming one before its last backward record (an
    all_reduce after it is the gradients' or the clip's, not tensor parallel's; any, without
    backward records); the peer of its first receive when that comes before its first send (the
    first stage sends first; later stages receive their input first). ``default_world``: a rank
    whose all_reduce calls name no group (the default group, every rank: MindSpore's collectives
    called without one, torch's without ``group``) and that calls one before its last backward
    record (a tensor-parallel reduction; a data-parallel gradient sum comes after it) has the
    step's ranks. ``gathers``, when given, receives {rank: the group of its first all_gather
    before its first backward record that is not its tensor-parallel group} (context parallelism's
    keys and values)."""
    tp_of: dict = {}
    prev: dict = {}
    world = tuple(sorted(source.rank for source in sources))
    for source in sources:
        calls = _rank_calls(source)
        group = calls.tp_group(world, default_world)
        if group is not None:
            tp_of[source.rank] = group
        before = calls.previous()
        if before is not None:
            prev[source.rank] = before
        if gathers is not None:
            mine = sorted(group or (source.rank,))
            other = next((found for found in calls.gathered if sorted(found) != mine), None)
            if other is not None:
                gathers[source.rank] = other
    return tp_of, prev


def read_layout(sources: list) -> tuple:
    """(text, [(key, stages)]) of the logical models the dump's communication records describe
    (``--layout auto``): tensor-parallel groups from the all_reduce calls' groups, the pipeline
    stages in model order from the point-to-point calls. ConfigError when they do not cover
    every rank once."""
    gathers: dict = {}
    tp_of, prev = _groups_of(sources, default_world=True, gathers=gathers)
    following = {before: rank for rank, before in prev.items()}
    ranks = sorted(source.rank for source in sources)
    models: dict = {}
    for head in (rank for rank in ranks if rank not in prev):
        chain, seen = [head], {head}
        while following.get(chain[-1]) is not None and following[chain[-1]] not in seen:
            chain.append(following[chain[-1]])
            seen.add(chain[-1])
        stages = tuple(tp_of.get(rank, (rank,)) for rank in chain)
        models.setdefault(min(stages[0]), stages)
    covered = sorted(rank for stages in models.values() for stage in stages for rank in stage)
    if covered != ranks:
        raise ConfigError(f"--layout auto: the dump's all_reduce groups and send/recv peers do not describe "
                          f"one layout of ranks {ranks} (they cover {covered}); give --layout tp=T,pp=P")
    ordered = [stages for _, stages in sorted(models.items())]
    text = f"tp={len(ordered[0][0])},pp={len(ordered[0])}"
    # (expert parallel gathers its token counts over the expert-parallel group: no context parallelism)
    cp = len(gathers.get(ordered[0][0][0], ())) if len(ordered) > 1 and _ep_size(sources, None) == 1 else 0
    if cp > 1 and len(ordered) % cp == 0:  # the models' ranks gather each other's tokens: context parallel
        text += f",cp={cp}" + (f",dp={len(ordered) // cp}" if len(ordered) > cp else "")
    else:
        cp = 1
        if len(ordered) > 1:
            text += f",dp={len(ordered)}"
    text += " (read from the dump)"
    return text, [((index // cp, index % cp, 0), [list(stage) for stage in stages])
                  for index, stages in enumerate(ordered)]


def _checked(models: list, sources: list) -> list:
    """Warnings where a layout's tensor-parallel groups are not the dump's all_reduce groups."""
    tp_of, _ = _groups_of(sources)
    out = []
    for _, stages in models:
        for stage in stages:
            for rank in stage:
                said = tp_of.get(rank)
                if said is not None and sorted(said) != sorted(stage):
                    out.append(f"rank {rank}: the layout's tensor-parallel group is {stage}, its first all_reduce's "
                               f"group is {list(said)}")
    return out


def _model_chunks(sources: list) -> Optional[tuple]:
    """(rank, how many model chunks) of the first rank whose module records carry more than one
    model chunk index (``Module.0.``, ``Module.1.``: Megatron's virtual pipeline), else None."""
    for source in sources:
        held = chunk_count(_records_of(source))
        if held > 1:
            return source.rank, held
    return None


def layout_models(sources: list, layout: Optional[Layout]) -> tuple:
    """(layout text, [(key, [[rank of each tp rank] per stage])], warnings, vpp) of one step's rank
    sources under ``layout`` (None: read from the dump, the virtual pipeline's size from the model
    chunks its ranks hold). ConfigError when they do not fit."""
    by_rank = {source.rank: source for source in sources}
    if None in by_rank or len(by_rank) != len(sources):
        raise ConfigError("a parallel layout needs rank directories (rank0, rank1, ...), one per rank")
    if sorted(by_rank) != list(range(len(by_rank))):
        raise ConfigError(f"a parallel layout needs ranks 0..{len(by_rank) - 1}, the dump has {sorted(by_rank)}")
    if layout is None:
        text, models = read_layout(sources)
        warnings: list = []
    else:
        try:
            text, models = layout.text(), layout.models(sorted(by_rank))
        except LayoutError as exc:
            raise ConfigError(str(exc)) from exc
        warnings = _checked(models, sources)
        found = _ep_size(sources, None)
        if found > 1 and layout.ep == 1:
            warnings.append(f"the ranks' all_to_all calls run over groups of {found} ranks: expert parallel? "
                            f"give ep={found} (or --layout auto): their experts are merged as replicas without it")
    pipeline = any(len(stages) > 1 for _, stages in models)
    chunked = _model_chunks(sources) if pipeline else None
    vpp = layout.vpp if layout is not None else (chunked[1] if chunked else 1)
    if vpp > 1 and not pipeline:
        raise ConfigError(f"layout {text}: virtual pipeline stages (vpp={vpp}) need a pipeline (pp > 1)")
    if chunked and vpp == 1:  # a pipeline whose ranks hold several chunks: merged as plain stages, it would be wrong
        raise ConfigError(f"rank {chunked[0]} holds {chunked[1]} model chunks (Module.0., Module.1., ...) of a "
                          f"pipeline: a virtual pipeline; give its size (vpp={chunked[1]}) or --layout auto")
    if layout is None and vpp > 1:
        text = text.replace(" (read from the dump)", f",vpp={vpp} (read from the dump)")
    ep = _ep_size(sources, layout)
    if layout is None and ep > 1:
        dp = len(models) // ep
        text = re.sub(r",dp=\d+", f",ep={ep}" + (f",dp={dp}" if dp > 1 else ""), text)
    return text, models, warnings, vpp


def _ep_size(sources: list, layout: Optional[Layout]) -> int:
    """The expert-parallel size: the layout's, else the size of the group of the ranks' all_to_all
    calls (the same on every rank), else 1."""
    if layout is not None:
        return layout.ep
    groups = {expert_groups(_records_of(source)) for source in sources}
    if not groups or None in groups:
        return 1
    sizes = {len(group) for group in groups if group is not None}
    return sizes.pop() if len(sizes) == 1 else 1


def _cp_tokens(source: Any, cp: int) -> int:
    """The tokens of a sequence a context-parallel rank holds: the first dimension (Megatron's
    [sequence, batch, ...]) of the input of its first all_gather over ``cp`` ranks before its first
    backward record (the keys and values it gathers), else 0."""
    for index, (name, record) in enumerate(_records_of(source).items()):
        if _is_backward(name):
            return 0
        found = comm_api(name)
        call = comm_call(name, record, source.rank, index) if found and found[0].startswith("all_gather") else None
        if call is None or len(call.group or ()) != cp:
            continue
        inputs = [_shape(leaf) for path, leaf in _leaves(record) if path.startswith("input")]
        outputs = [_shape(leaf) for path, leaf in _leaves(record) if path.startswith("output")]
        for shape in inputs:
            if shape and any(out[:1] == (shape[0] * cp,) and out[1:] == shape[1:] for out in outputs):
                return shape[0]
    return 0
