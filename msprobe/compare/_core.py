"""Compare two dumps: pair steps and ranks, match records, build each rank pair's rows, write results."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
from typing import TYPE_CHECKING, Any, Optional

import msprobe.readers
from msprobe.backends import local_path_of, upload_files
from msprobe.compare import _columnar
from msprobe.compare._cluster import add_paths, comm_report, order_results
from msprobe.compare._columnar import PairContext
from msprobe.compare._indexed import forget as _forget_indexed
from msprobe.compare._indexed import indexed_side
from msprobe.compare._indexed import records as _data
from msprobe.compare._indexed import task as _task
from msprobe.compare._layouts import layout_mode, layout_pairs, layout_summary
from msprobe.compare._match import match_records
from msprobe.compare._options import CompareOptions, PairJob
from msprobe.compare._origin import earliest, find_origin
from msprobe.compare._plotproc import draw as draw_plot
from msprobe.compare._plotproc import start as start_plotter
from msprobe.compare._rows import COLUMNS, _first_tensor_leaves, _has_md5
from msprobe.compare._runner import concatenate_parts, fork_available, gc_paused, in_out_dir
from msprobe.compare._runner import run_forked as _run_forked
from msprobe.compare._summary import FIRST_KEYS, PairSummary
from msprobe.compare._verdict import ROUNDOFF_RULE
from msprobe.compare._write import XLSX_FILLS, write_header, write_xlsx
from msprobe.compare._xframe import XFrame, match_xframe, mindspore_against_pytorch
from msprobe.errors import ConfigError, MissingDependencyError
from msprobe.execution import Executor, Outbox, Shipment, ship
from msprobe.format.layout import dump_dir_of
from msprobe.progress import Progress
from msprobe.readers import records_of

if TYPE_CHECKING:
    from msprobe.readers.protocols import RecordSource

__all__ = ["compare", "compare_pair", "dump_dir_of", "detect_mode", "pair_sources", "NORM_REL_THRESHOLD",
           "MOSTLY_UNMATCHED", "CompareOptions", "PairJob", "XLSX_FILLS", "gc_paused"]

#: the reference line of the plot (relative Norm error); the first divergence follows the Result
#: column unless compare(threshold=...) is given
NORM_REL_THRESHOLD = 1e-3
#: a single rank pair is split over ``workers`` forked processes from this many records on
CHUNK_MIN_RECORDS = 2000
#: a rank pair where fewer than this share of the target records found a bench record is
#: reported (the dumps are probably of different models or settings)
MOSTLY_UNMATCHED = 0.5
#: unmatched record names listed per side and rank pair in the summary (all are in the CSV)
UNMATCHED_LISTED = 1000


def _open(path: str, storage_options: Optional[dict] = None) -> Any:
    return msprobe.readers.open(dump_dir_of(path), storage_options=storage_options)


def detect_mode(target_data: dict, bench_data: dict, target_task: Optional[str], bench_task: Optional[str]) -> str:
    """'tensor' when both dumps hold tensor files, 'md5' when both hold CRC-32 values, else 'statistics'."""
    if target_task == "tensor" and bench_task == "tensor":
        return "tensor"
    if _has_md5(target_data) and _has_md5(bench_data):
        return "md5"
    return "statistics"


def _step_order(step: Any) -> tuple:
    """Steps in numeric order (``[0, 1, 2, 10]``, not as text), None last."""
    return (step is None, step if isinstance(step, int) else 0, str(step))


def _paired_steps(target_steps: set, bench_steps: set, step: Any) -> list:
    if step is not None:
        if step in target_steps and step in bench_steps:
            return [(step, step)]
        raise ConfigError(f"step {step} is not in both dumps (target {sorted(target_steps, key=_step_order)}, "
                          f"bench {sorted(bench_steps, key=_step_order)})")
    if len(target_steps) == 1 and len(bench_steps) == 1:
        return [(next(iter(target_steps)), next(iter(bench_steps)))]
    common = sorted(target_steps & bench_steps, key=lambda shared: (shared is None, shared or 0))
    if not common:
        raise ConfigError(f"the dumps share no step (target {sorted(target_steps, key=_step_order)}, "
                          f"bench {sorted(bench_steps, key=_step_order)}); pass --step")
    return [(shared, shared) for shared in common]


def pair_sources(target_dump: Any, bench_dump: Any, *, step: Any = None, rank: Any = None) -> list:
    """[(target source, bench source)] pairing steps, then ranks (a lone rank/proc directory
    pairs with the other side's lone directory, whatever its name)."""
    steps = _paired_steps({source.step for source in target_dump.sources},
                          {source.step for source in bench_dump.sources}, step)
    pairs = []
    for target_step, bench_step in steps:
        targets = [source for source in target_dump.sources if source.step == target_step]
        benches = [source for source in bench_dump.sources if source.step == bench_step]
        if len(targets) == 1 and len(benches) == 1:
            found = [(targets[0], benches[0])]
        else:
            by_rank = {source.rank: source for source in benches}
            found = [(source, by_rank[source.rank]) for source in targets if source.rank in by_rank]
        if rank is not None:
            found = [(target, bench) for target, bench in found
                     if target.rank == rank or (target.rank is None and len(found) == 1)]
        pairs.extend(found)
    if not pairs:
        ranks = [sorted({s.rank for s in dump.sources if s.rank is not None}) for dump in (target_dump, bench_dump)]
        hint = ""
        if rank is None and len(ranks[0]) != len(ranks[1]):
            hint = (f" (the target holds {len(ranks[0]) or 1} rank(s), the bench {len(ranks[1]) or 1}: runs of two "
                    f"parallel layouts pair up merged, with --layout tp=T,pp=P[,dp=D] or --layout auto, and "
                    f"--bench-layout for a parallel bench)")
        raise ConfigError("no rank directories pair up between the two dumps"
                          + (f" for rank {rank}" if rank is not None else "") + hint)
    return pairs


def _parents(source: RecordSource) -> dict:
    try:
        return source.parents() or {}
    except Exception:  # noqa: BLE001 - no or unreadable construct.json: match by names
        return {}


def _csv_name(source: Any, timestamp: str, multi_step: bool) -> str:
    step = f"step{source.step}_" if multi_step and source.step is not None else ""
    return f"compare_result_{step}{source.rank_dir}_{timestamp}.csv"


def compare_pair(target_source: Any, bench_source: Any, *, mode: str, out_dir: str, ts: str,
                 multi_step: bool = False, xlsx: bool = False, chunks: int = 1, progress: Any = None,
                 structural: Any = "auto", fuzzy: bool = False, stack: bool = True, mapping: Optional[dict] = None,
                 threshold: Optional[float] = None, engine: str = "auto", xframe: Optional[dict] = None) -> dict:
    """Compare one target rank directory with one bench rank directory; writes its CSV
    (and .xlsx) and returns its summary (with ``series``: the NormRelativeErr per row).

    ``chunks`` > 1 splits the records over forked processes (Linux; the dumps are shared
    copy-on-write), each writing a part of the CSV that is then concatenated in order.
    ``stack=False`` leaves out the NPU_Stack_Info column; ``mapping`` maps target row names to
    bench row names (a data-mapping file); ``threshold``: see :func:`compare`; ``engine`` is
    accepted for compatibility (there is one engine)."""
    options = CompareOptions(mode=mode, timestamp=ts, multi_step=multi_step, xlsx=xlsx, structural=structural,
                             fuzzy=fuzzy, stack=stack, mapping=mapping, threshold=threshold, chunks=chunks,
                             xframe=xframe)
    return compare_rank_pair(target_source, bench_source, out_dir, options, progress)


def compare_rank_pair(target_source: Any, bench_source: Any, out_dir: str, options: CompareOptions,
                      progress: Any = None) -> dict:
    """:func:`compare_pair` with its options as one :class:`CompareOptions`."""
    mapping = options.mapping
    xframe = options.xframe
    # both rank directories' leaf tables, where they are up to date and this compare can take them
    indexed = _indexed_pair(target_source, bench_source, options)
    target_data, bench_data = (records_of(source) if side is None else side.records
                               for side, source in zip(indexed or (None, None), (target_source, bench_source)))
    if xframe is None and options.structural == "auto" and mindspore_against_pytorch(target_data, bench_data):
        xframe = {"api": {}, "cell": {}}  # as -am -cm: names alone pair almost nothing across frameworks
        options = dataclasses.replace(options, xframe=xframe)
        indexed = None
        target_data, bench_data = records_of(target_source), records_of(bench_source)
    if xframe is not None:
        pairs, rest, how, rows = match_xframe(target_data, bench_data, XFrame(xframe))
        mapping = {**rows, **(mapping or {})} or None
    else:
        pairs, rest, how = match_records(target_data, bench_data, _parents(target_source), _parents(bench_source),
                                         options.structural, fuzzy=options.fuzzy)
    context = PairContext(target_data=target_data, bench_data=bench_data, pairs=pairs, rest=rest,
                          target_source=target_source, bench_source=bench_source, mode=options.mode,
                          stack=options.stack, mapping=mapping, threshold=options.threshold,
                          across_frameworks=options.xframe is not None, indexed=indexed)
    header = [name for name in COLUMNS[options.mode] if options.stack or name != "NPU_Stack_Info"]
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, _csv_name(target_source, options.timestamp, options.multi_step))
    files = [path]
    if options.chunks > 1 and len(pairs) >= CHUNK_MIN_RECORDS and not options.xlsx and fork_available():
        try:
            summary = PairSummary.merged(_run_forked(context, len(pairs), options.chunks, path, progress))
        finally:
            concatenate_parts(path, header, options.chunks)
    else:
        write_header(path, header)
        context.progress = progress
        summary, rows = _columnar.columnar_pair(context, path, keep_rows=options.xlsx)
        if options.xlsx:
            files.append(write_xlsx(path[:-4] + ".xlsx", header, rows))
    report = _pair_report(target_source, bench_source, files, summary, pairs, rest, how,
                          find_origin(target_data, bench_data, pairs, rest, options.mode, options.threshold,
                                      target_source.rank, across_frameworks=options.xframe is not None,
                                      rows=mapping if options.xframe is not None else None,
                                      tolerant=any(getattr(source, "report", None) is not None
                                                   for source in (target_source, bench_source)),
                                      departing=context.departing))
    report["comm"] = comm_report(target_data, bench_data, pairs, target_source.rank, options.mode, options.threshold)
    return report


def _indexed_pair(target_source: Any, bench_source: Any, options: CompareOptions) -> Optional[tuple]:
    """(target, bench): each rank directory's up-to-date leaf table (:mod:`msprobe.compare._indexed`),
    or None for a side whose document is read; None where this compare takes no table (tensor mode,
    a mapping) or neither side has one."""
    if options.mode == "tensor" or options.mapping or options.xframe is not None:
        return None
    sides = (indexed_side(target_source), indexed_side(bench_source))
    return None if sides == (None, None) else sides


def _pair_report(target_source: Any, bench_source: Any, files: list, summary: PairSummary, pairs: list, rest: list,
                 how: Any, origin: Optional[dict]) -> dict:
    """One rank pair's entry of summary.json (with its series and plot marks, taken out later)."""
    return {
        "step": target_source.step, "rank": target_source.rank, "rank_dir": target_source.rank_dir,
        "bench_step": bench_source.step, "bench_rank_dir": bench_source.rank_dir,
        "files": files, "rows": summary.rows,
        "records": len(_data(target_source)), "bench_records": len(_data(bench_source)),
        "matched_records": summary.matched_records,
        "unmatched_records": len(pairs) - summary.matched_records, "unmatched_bench_records": len(rest),
        "unmatched_rows": summary.unmatched_rows, "results": summary.results, "matched_by": how,
        "unmatched": {"target": [name for name, bench in pairs if bench is None][:UNMATCHED_LISTED],
                      "bench": rest[:UNMATCHED_LISTED]},
        **{key: getattr(summary, key) for key in FIRST_KEYS}, "origin": origin,
        "masked_inf_target": summary.masked_inf_target, "masked_inf_bench": summary.masked_inf_bench,
        "series": summary.series, "marks": summary.marks.as_dict(),
    }


def _run_pair(target_source: Any, bench_source: Any, out_dir: str, storage_options: Optional[dict],
              options: CompareOptions, progress: Any = None) -> dict:
    """One rank pair into ``out_dir`` (uploaded when it is remote)."""
    return in_out_dir(lambda directory: compare_rank_pair(target_source, bench_source, directory, options, progress),
                      out_dir, storage_options)


def _open_one(url: str, storage_options: Optional[dict]) -> Any:
    sources = _open(url, storage_options).sources
    if len(sources) != 1:
        raise ConfigError(f"{url} holds {len(sources)} rank directories, expected one")
    return sources[0]


def _pair_task(job: PairJob) -> Any:
    """One rank pair, opened from its URLs through msprobe.readers (nothing is shared with
    the caller but the job); with an outbox, its report in a :class:`Shipment` (with the files
    when this machine does not see the caller's folder)."""
    storage_options = job.storage_options
    with gc_paused():
        target, bench = _open_one(job.target_url, storage_options), _open_one(job.bench_url, storage_options)
        options = CompareOptions.of(job.options)
        if job.outbox is None:
            return _run_pair(target, bench, job.out_dir, storage_options, options)
        return ship(job.outbox, lambda folder: compare_rank_pair(target, bench, folder, options),
                    lambda report: report["files"])


def _received(outbox: Outbox, shipment: Shipment) -> dict:
    """A rank pair's report, its files written into the outbox here and named as they lie there."""
    report = outbox.receive(shipment)
    report["files"] = [outbox.name(path) for path in report["files"]]
    return report


def compare(target: str, bench: str, out_dir: str, *, step: Optional[int] = None, rank: Optional[int] = None,
            mode: str = "auto", xlsx: bool = False, workers: int = 1, plot: bool = True,
            storage_options: Optional[dict] = None, timestamp: Optional[str] = None,
            client: Any = None, scheduler: Optional[str] = None, progress: Optional[bool] = None,
            structural: Any = "auto", fuzzy: bool = False, stack: bool = True, mapping: Optional[dict] = None,
            threshold: Optional[float] = None, engine: str = "auto", layout: Optional[str] = None,
            bench_layout: Optional[str] = None, xframe: Optional[dict] = None) -> dict:
    """Compare ``target`` with ``bench`` (paths or URLs of any dialect); writes one CSV per
    (step,) rank, ``summary.json`` and ``compare_plot.png`` into ``out_dir`` (a path, or a URL:
    files are then uploaded there); returns the summary.

    Rank pairs run in-process (``workers=1``), in a local process pool (``workers`` > 1), or as
    Dask tasks on ``client`` (a ``dask.distributed.Client``) or on a cluster at ``scheduler``
    (``tcp://host:port``). Each pool or Dask task opens its two rank directories from their URLs
    through :func:`msprobe.readers.open`, so workers share nothing but storage (pass picklable
    ``storage_options``). ``progress``: a progress bar on stderr (default: when stderr is a terminal).

    Records match by full name, then across dialects, then (``structural="auto"``, module-level
    dumps whose call counts differ) by the construct tree and execution order; ``True`` forces the
    tree alignment, ``False`` names only (see :mod:`msprobe.compare._match`). ``fuzzy``: records
    still unmatched then pair in order with the other side's of the same API or module whose call
    count differs (the real tool's fuzzy match). ``mapping``: {target row name: bench row name}
    (a data-mapping file). ``stack=False`` leaves out the NPU_Stack_Info column. ``xframe``: a
    MindSpore target against a PyTorch bench, records matched through the cross-framework mappings
    (``{"api": {...}, "cell": {...}, "layer": {...}}``, see :mod:`msprobe.compare._xframe`).

    Result and Err_message follow 26.2.0's per-record rules (:mod:`msprobe.compare._verdict`).
    The first divergence is the first row, in execution order, whose Result is not ``pass``, passing
    over the rows only 26.2.0's 10x rule flags where every output of the record differs by float
    round-off (:data:`msprobe.compare._verdict.ROUNDOFF_FLOOR`; their Result stays); with
    ``threshold`` it is instead the first row whose NormRelativeErr exceeds ``threshold`` (a
    fraction), whatever its Result. A forced ``mode`` the dumps cannot support is refused.

    ``engine`` (``"auto"`` or ``"rows"``) is accepted for compatibility: every mode is built by
    the one column-wise engine (:mod:`msprobe.compare._columnar`).

    ``layout`` / ``bench_layout`` (``"tp=2,pp=2"``, :func:`msprobe.format.parallel.parse_layout`):
    that side's ranks are merged into its logical model(s) first (``"auto"``: the layout the
    dump's all_reduce groups and send/recv peers describe) (:mod:`msprobe.compare._layouts`);
    merged sides compare in statistics mode, in this process, and summary.json gets ``layout``.
    """
    if xlsx:
        try:
            import openpyxl  # noqa: F401
        except ImportError as exc:
            raise MissingDependencyError("--xlsx needs openpyxl: pip install 'msprobe-lake[xlsx]'") from exc
    started = time.perf_counter()
    plotter = start_plotter() if plot else None  # imports matplotlib while the dumps are compared
    try:
        with gc_paused():
            target_dump, bench_dump = _open(target, storage_options), _open(bench, storage_options)
            merged = None
            if layout or bench_layout:
                if client is not None or scheduler is not None:
                    raise ConfigError("--layout merges the ranks in this process: no --scheduler")
                merged = pairs = layout_pairs(target_dump, bench_dump, _paired_steps(
                    {s.step for s in target_dump.sources}, {s.step for s in bench_dump.sources}, step),
                    layout, bench_layout, xframe)
                mode, workers = layout_mode(mode, [(_task(t), _task(b)) for t, b in pairs]), 1
                if xframe is None and structural == "auto" and \
                        mindspore_against_pytorch(records_of(pairs[0][0]), records_of(pairs[0][1])):
                    xframe = {"api": {}, "cell": {}}  # as without a layout: the frameworks' names paired as -am -cm
                if structural == "auto":  # merged names are the logical model's, one card's: by name
                    structural = False
            else:
                pairs = pair_sources(target_dump, bench_dump, step=step, rank=rank)
            options = _options(pairs, mode, timestamp, xlsx, structural, fuzzy, stack, mapping, threshold, engine)
            if xframe is not None:
                options = dataclasses.replace(options, xframe=dict(xframe))
            results, backend = _run_pairs(pairs, out_dir, storage_options, options, workers, client, scheduler,
                                          progress)
            summary = {"target": target, "bench": bench, "mode": options.mode, "timestamp": options.timestamp,
                       "target_dialect": target_dump.dialect, "bench_dialect": bench_dump.dialect}
            return _finish(summary, results, backend, out_dir, storage_options, options, plotter if plot else None,
                           plot, started, merged)
    finally:
        if plotter is not None:
            plotter.close()


def _options(pairs: list, mode: str, timestamp: Optional[str], xlsx: bool, structural: Any, fuzzy: bool,
             stack: bool, mapping: Optional[dict], threshold: Optional[float], engine: str) -> CompareOptions:
    """The options every rank pair shares: the mode detected from the first pair (a forced one
    checked against it), then the rest checked."""
    forced = mode != "auto"
    if mode == "auto":
        target, bench = pairs[0]
        mode = detect_mode(_data(target), _data(bench), _task(target), _task(bench))
    if mode not in COLUMNS:
        raise ConfigError(f"unknown mode {mode!r}: statistics, md5, tensor or auto")
    if forced:
        check_mode(mode, pairs[0])
    options = CompareOptions(mode=mode, timestamp=timestamp or time.strftime("%Y%m%d%H%M%S"),
                             multi_step=len({target.step for target, _ in pairs}) > 1, xlsx=xlsx, structural=structural,
                             fuzzy=fuzzy, stack=stack, mapping=mapping, threshold=threshold)
    if engine not in ("auto", "rows"):
        raise ConfigError(f"engine must be 'auto' or 'rows', not {engine!r}")
    return options


def _run_pairs(pairs: list, out_dir: str, storage_options: Optional[dict], options: CompareOptions, workers: int,
               client: Any, scheduler: Optional[str], progress: Optional[bool]) -> tuple:
    """(the rank pairs' reports, the backend): in-process one after the other (a lone pair split
    over ``workers`` forked chunks), or as :class:`PairJob` tasks of an :class:`Executor`."""
    executor = Executor(client if client is not None else scheduler, processes=max(int(workers), 1))
    backend = executor.backend(len(pairs))
    try:
        if backend == "dask":  # the workers of a given cluster may not share this machine's disk
            for source in pairs[0]:
                source_dir = local_path_of(source.url)
                if source_dir is not None:
                    executor.check_reads(source_dir, "the dump folder")
        local_out = local_path_of(out_dir)
        if backend == "dask" and local_out is not None:
            with Outbox.opened(local_out) as outbox, \
                    Progress(len(pairs), "compare", "rank pairs", progress) as bar:
                jobs = [PairJob(target.url, bench.url, storage_options, out_dir, options, outbox)
                        for target, bench in pairs]
                return executor.map(_pair_task, jobs, progress=bar,
                                    sink=lambda shipment: _received(outbox, shipment)), backend
        if backend != "in-process":
            jobs = [PairJob(target.url, bench.url, storage_options, out_dir, options) for target, bench in pairs]
            with Progress(len(pairs), "compare", "rank pairs", progress) as bar:
                return executor.map(_pair_task, jobs, progress=bar), backend
        if len(pairs) == 1:
            target, bench = pairs[0]
            with Progress(len(_data(target)), "compare", "records", progress) as bar:
                return [_run_pair(target, bench, out_dir, storage_options, options.with_chunks(workers),
                                  progress=bar)], backend
        results = []
        with Progress(len(pairs), "compare", "rank pairs", progress) as bar:
            for target, bench in pairs:
                results.append(_run_pair(target, bench, out_dir, storage_options, options))
                for source in (target, bench):  # parsed documents are not kept across rank pairs
                    source.release()
                    _forget_indexed(source)
                bar.update()
        return results, backend
    finally:
        executor.close()


def _finish(summary: dict, results: list, backend: str, out_dir: str, storage_options: Optional[dict],
            options: CompareOptions, plotter: Any, plot: bool, started: float, merged: Optional[list] = None) -> dict:
    """The whole compare's summary (the earliest divergence, origin and NaN/Inf over the rank
    pairs), the plot and summary.json written (uploaded when ``out_dir`` is remote)."""
    # across rank pairs: the earliest step, then the earliest in the step's happens-before order
    graphs = order_results(results)
    first, origin = (_located(earliest(results, key), key) for key in ("first_divergence", "origin"))
    local_out = local_path_of(out_dir)
    remote = local_out is None
    local = tempfile.mkdtemp(prefix="msprobe_compare_") if local_out is None else local_out
    plot_file = plot_note = None
    threshold = options.threshold
    if plot:
        plot_file, plot_note = draw_plot(plotter, results, local, options.timestamp, options.mode,
                                         threshold or NORM_REL_THRESHOLD)
    for result in results:
        result.pop("series")
        result.pop("comm", None)
        result["worst_rows"] = result.pop("marks")["worst"]
    summary.update({
        "divergence": (ROUNDOFF_RULE if threshold is None
                       else f"first row whose NormRelativeErr > {threshold}"),
        "warnings": _warnings(results),
        "pairs": results, "first_divergence": first, "origin": origin,
        "first_nan_inf_target": _located(earliest(results, "first_nan_inf_target"), "first_nan_inf_target"),
        "first_nan_inf_bench": _located(earliest(results, "first_nan_inf_bench"), "first_nan_inf_bench", "bench_"),
        **_firsts_across(results),
        "plot": (f"{out_dir.rstrip('/')}/{os.path.basename(plot_file)}" if plot_file and remote else plot_file),
        "plot_note": plot_note, "backend": backend,
        "seconds": round(time.perf_counter() - started, 3),
    })
    add_paths({key: summary[key] for key in ("origin", "first_divergence", "first_nan_inf_target",
                                             "first_nan_target", "first_inf_target")}, graphs)
    if merged is not None:
        summary["layout"] = layout_summary(merged, summary)
    os.makedirs(local, exist_ok=True)
    with open(os.path.join(local, "summary.json"), "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=1, default=str)
    if remote:
        try:
            names = ["summary.json"] + ([os.path.basename(plot_file)] if plot_file else [])
            summary["summary_file"] = upload_files(out_dir, local, names, storage_options)[0]
        finally:
            shutil.rmtree(local, ignore_errors=True)
    else:
        summary["summary_file"] = os.path.join(local, "summary.json")
    return summary


def check_mode(mode: str, pair: tuple) -> None:
    """Refuse (ConfigError) a forced mode the first rank pair cannot support: md5 needs CRC-32
    values on both sides, tensor needs tensor files on both sides."""
    for side, source in zip(("target", "bench"), pair):
        data = _data(source)
        if mode == "md5" and not _has_leaf(data, lambda leaf: isinstance(leaf.get("md5"), str)):
            raise ConfigError(f"--mode md5: the {side} dump ({source.rank_dir}) holds no md5 (CRC-32) values; "
                              f"dump it with summary_mode md5, or compare in statistics mode")
        if mode == "tensor" and (_task(source) != "tensor" or
                                 not _has_leaf(data, lambda leaf: isinstance(leaf.get("data_name"), str))):
            raise ConfigError(f"--mode tensor: the {side} dump ({source.rank_dir}) holds no tensor files; "
                              f"dump it with task tensor, or compare in statistics mode")


def _has_leaf(data: dict, test: Any, limit: int = 200) -> bool:
    """Whether one of the first ``limit`` records holds a tensor leaf for which ``test`` is true."""
    return any(test(leaf) for leaves in _first_tensor_leaves(data, limit) for leaf in leaves)


def _warnings(results: list) -> list:
    """Lines worth a user's attention: rank pairs where most target records found no bench record."""
    out = []
    for result in results:
        if result["matched_by"].get("mapping") is not None:
            continue  # across frameworks each side has records of its own (listed per record as unmatched)
        if result["records"] and result["matched_records"] < MOSTLY_UNMATCHED * result["records"]:
            out.append(f"step {result['step']} {result['rank_dir']} vs {result['bench_rank_dir']}: only "
                       f"{result['matched_records']} of {result['records']} target records matched a bench record "
                       f"(different models, levels or settings?); the {result['unmatched_rows']} unmatched rows "
                       f"are not compared")
    return out


def _located(result: Optional[dict], key: str, side: str = "") -> Optional[dict]:
    """Result ``result``'s ``key`` entry with the step, rank and rank directory of its side added."""
    if result is None:
        return None
    return dict(result[key], step=result[f"{side}step"], rank=result["rank"], rank_dir=result[f"{side}rank_dir"])


def _firsts_across(results: list) -> dict:
    """The first NaN and first +/-Inf of each side over the rank pairs (:func:`earliest`), and the
    masks' -inf counts."""
    out: dict = {}
    for side, prefix in (("target", ""), ("bench", "bench_")):
        for kind in ("nan", "inf"):
            key = f"first_{kind}_{side}"
            out[key] = _located(earliest(results, key), key, prefix)
        out[f"masked_inf_{side}"] = sum(result.get(f"masked_inf_{side}", 0) for result in results)
    return out
