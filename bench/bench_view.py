"""Benchmark: ``msprobe view`` in a real headless Chromium (Debian's package, driven by Playwright).

Two scenarios, each served by ``python -m msprobe view`` in its own process:

* ``pair``: two statistics dumps of --records records (``bench_compare``'s generator: ~3.5 rows a
  record), compared on the fly, with a construct.json that nests every two records in a module
  and every 200 modules in a layer (--records 100,000: a tree of ~50,000 module nodes + the
  records). Measured: the time until the server prints its URL (``setup_s``), the first useful
  paint (a page opened at once, until the overview is drawn and the first cell's list has its
  rows: the first look's, msprobe.view._first), their sum (``command_to_first_paint_s``), the
  whole view (``whole_view_s``: command start until the page has taken the whole view) and a fresh
  page's first paint of it (``whole_view_first_paint_s``), then, on that page, interaction latency (open a cell's list, jump to the middle of the list, filter the divergent
  rows, open the model trees, expand a layer of 200 modules: the target's and, synced, the
  bench's), and the server's peak RSS (VmHWM).
* ``lake``: a lake of --ranks ranks x --steps steps (``bench_lake``'s generator, --lake-records
  records a rank), indexed by msprobe.lake then viewed: set-up, first paint of the run x step x
  rank overview, opening a cell, peak RSS.
* ``cluster``: the cluster view of one step of --cluster-ranks ranks x --cluster-records records
  (tests/view/_make_big_cluster.py: an all_reduce every 100 records, a pipeline hand-off every
  1,000, a NaN on rank 5 that reaches every rank, so most records are NaN). ``--cluster-source
  model`` (default) builds the step's cluster model in process (msprobe.view._cluster.assemble, the
  records made in memory) into a report page; ``view`` writes the dumps and serves them with
  ``msprobe view`` (its set-up and the model's first build are then timed too: minutes at 64 x
  20,000). Measured in the browser: first paint (a link to the step's cluster view opened until
  the origin is drawn), the DOM's element count then, scroll latency (the window moved to the
  step's end until its last all_reduce is drawn), zoom latency (the whole step, and back to the
  anomaly and its path), the next page of lanes.

Targets (issue 27, on the 2-core machine): first paint <= 2 s for the pair and the lake overview,
tree expand <= 0.5 s, server RSS <= 500 MB; issue 49: the cluster view's first paint <= 2 s and its
DOM under 20,000 elements at 64 ranks x 20,000 records; command start to first useful paint <= 5 s
(pair) and <= 10 s (lake).

    python bench/bench_view.py                                 # 100,000 records; 1,024 x 10 lake
    python bench/bench_view.py --records 10000 --ranks 64 --steps 4   # a quick run
    python bench/bench_view.py --only pair
    python bench/bench_view.py --only cluster                  # 64 ranks x 20,000 records, in process
    python bench/bench_view.py --only cluster --cluster-source view   # the same served by msprobe view
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-quic"]
TARGETS = {"first_paint_s": 2.0, "tree_expand_s": 0.5, "rss_mb": 500.0, "cluster_first_paint_s": 2.0,
           "cluster_dom_elements": 20000}


def _tree_construct(step_dir: str) -> int:
    """construct.json: two records a module, 200 modules a layer, every layer under the model."""
    n = 0
    for rank_dir in os.listdir(step_dir):
        d = os.path.join(step_dir, rank_dir)
        with open(os.path.join(d, "dump.json"), encoding="utf-8") as f:
            names = list(json.load(f)["data"])
        parents: dict = {}
        for i, name in enumerate(names):
            m, layer = i // 2, i // 400
            mod = f"Module.model.layers.{layer}.block.{m}.Block.forward.0"
            parents[name] = mod
            parents[mod] = f"Module.model.layers.{layer}.Layer.forward.0"
        for layer in {i // 400 for i in range(len(names))}:
            parents[f"Module.model.layers.{layer}.Layer.forward.0"] = "Module.model.Model.forward.0"
        parents["Module.model.Model.forward.0"] = None
        with open(os.path.join(d, "construct.json"), "w", encoding="utf-8") as f:
            json.dump(parents, f)
        n = len(set(parents) | {p for p in parents.values() if p})
    return n


def _serve(args: list, work: str) -> tuple:
    """Start ``msprobe view``; (process, URL, seconds until it printed the URL). The URL comes after
    the set-up's first second (the page is served while the view is built): the first paint then
    includes the rest of the set-up, and command start to first useful paint is the sum."""
    t0 = time.perf_counter()
    os.makedirs(work, exist_ok=True)
    log = os.path.join(work, "server.log")  # its progress and any error (a pipe nobody reads could fill)
    proc = subprocess.Popen([sys.executable, "-m", "msprobe", "view", *args, "--work-dir", work],
                            stdout=subprocess.PIPE, stderr=open(log, "w"), text=True,
                            env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT)
    line = proc.stdout.readline()
    m = re.match(r"msprobe view: (\S+)", line.strip())
    if not m:
        proc.kill()
        with open(log, encoding="utf-8") as f:
            raise SystemExit(f"msprobe view did not start: {line!r} {f.read()[-2000:]}")
    return proc, m.group(1), time.perf_counter() - t0


def _said(path: str, text: str) -> str:
    """The server's log when it holds ``text`` (else empty)."""
    try:
        with open(path, encoding="utf-8") as f:
            got = f.read()
    except OSError:
        return ""
    return got if text in got else ""


def _vmhwm_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_s(pid: int) -> float:
    """The CPU seconds (user + system) process ``pid`` has used so far (its children not counted)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait(page, js: str, timeout: float = 60.0) -> float:
    """Seconds until ``js`` (a function expression) is truthy (polled every 10 ms)."""
    t0 = time.perf_counter()
    while not page.evaluate(js):
        if time.perf_counter() - t0 > timeout:
            raise SystemExit(f"timed out: {js}")
        page.wait_for_timeout(10)
    return time.perf_counter() - t0


def _paint(page, url: str) -> float:
    """Navigation until the overview is drawn and the first cell's list holds rows."""
    t0 = time.perf_counter()
    page.goto(url)
    page.wait_for_selector("body[data-ready]", state="attached", timeout=1800000)
    _wait(page, "() => document.querySelectorAll('#rows .vrow').length > 0")
    return time.perf_counter() - t0


def _timed(page, action, js: str) -> float:
    t0 = time.perf_counter()
    action()
    _wait(page, js)
    return time.perf_counter() - t0


def _measured(browser, proc, url: str, out: dict, steps) -> dict:
    """Run ``steps(page, out)`` on a fresh page of the server ``proc`` (opened as soon as it printed its
    URL: the first paint is then a first look's, where the server serves one, and the command-to-first-
    paint time the sum of the two); the whole view awaited (``whole_view_s`` since the command started)
    and a second page's first paint of it; then its peak RSS; then stop it."""
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        t0 = time.perf_counter()
        out["first_paint_s"] = round(_paint(page, url), 2)
        # what the machine's load does not change: the server's own CPU time until then
        out["server_cpu_to_first_paint_s"] = round(_cpu_s(proc.pid), 2)
        if "setup_s" in out:
            out["command_to_first_paint_s"] = round(out["setup_s"] + out["first_paint_s"], 2)
        out["first_look"] = page.evaluate("() => !!window.__msprobe.state.meta.first_look")
        page.wait_for_selector("body[data-whole]", state="attached", timeout=3600000)
        out["whole_view_s"] = round(out.get("setup_s", 0) + time.perf_counter() - t0, 1)
        page.close()
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        out["whole_view_first_paint_s"] = round(_paint(page, url), 2)
        steps(page, out)
        out["server_rss_mb"] = round(_vmhwm_mb(proc.pid), 1)
        page.close()
    finally:
        proc.terminate()
        proc.wait(30)
    return out


def bench_pair(browser, work: str, records: int) -> dict:
    from bench_compare import synthesize

    t0 = time.perf_counter()
    target, bench = synthesize(os.path.join(work, "data"), records)
    nodes = _tree_construct(target)
    _tree_construct(bench)
    gen = time.perf_counter() - t0
    proc, url, setup = _serve([target, bench], os.path.join(work, "view"))
    out: dict = {"records": records, "tree_nodes": nodes, "generate_s": round(gen, 1), "setup_s": round(setup, 2)}

    def steps(page, out: dict) -> None:
        out["rows"] = page.evaluate("() => window.__msprobe.state.meta.rows")
        page.locator(".tab[data-view=list]").click()
        total = page.evaluate("() => parseInt(document.getElementById('row-count').textContent)")
        mid = total // 2
        out["list_jump_to_middle_s"] = _timed(
            page, lambda: page.evaluate(f"() => {{ document.getElementById('row-scroller').scrollTop = {mid * 28}; }}"),
            f"() => [...document.querySelectorAll('#rows .vrow')].some((r) => Math.abs(r.dataset.i - {mid}) < 30)")
        before = page.locator("#row-count").inner_text()
        out["list_filter_divergent_s"] = _timed(
            page, lambda: page.select_option("select[data-filter=result]", "divergent"),
            f"() => document.getElementById('row-count').textContent !== {json.dumps(before)}")
        out["list_sort_worst_first_s"] = _timed(
            page, lambda: page.select_option("select[data-filter=sort]", "score"),
            "() => document.querySelector('#rows .vrow') !== null")
        out["tree_open_s"] = _timed(page, lambda: page.locator(".tab[data-view=tree]").click(),
                                    "() => document.querySelectorAll('#tree .tnode').length > 0")
        out["tree_expand_root_s"] = _timed(page, lambda: page.locator("#tree .tnode .toggle").first.click(),
                                           "() => document.querySelectorAll('#tree .tnode').length > 1")
        n = page.locator("#tree .tnode").count()
        _wait(page, "() => document.querySelectorAll('#tree-bench .tnode').length > 1")  # the root's peer opened
        m = page.locator("#tree-bench .tnode").count()
        out["tree_expand_layer_s"] = _timed(  # a layer: 200 module children, on both sides (synced expand)
            page, lambda: page.locator("#tree .tkids .tnode .toggle").first.click(),
            f"() => document.querySelectorAll('#tree .tnode').length > {n} && "
            f"document.querySelectorAll('#tree-bench .tnode').length > {m}")
        out["tree_layer_children"] = page.locator("#tree .tnode").count() - n
        out["bench_tree_layer_children"] = page.locator("#tree-bench .tnode").count() - m

    return _measured(browser, proc, url, out, steps)


def bench_lake(browser, work: str, ranks: int, steps: int, records: int, root: str = "") -> dict:
    """``root``: a lake made and indexed before (by this function, kept with --keep) instead of a new one."""
    import bench_lake

    a = argparse.Namespace(ranks=ranks, steps=steps, records=records, nan_step=steps // 2, nan_rank=ranks // 3,
                           dis_step=-1, dis_rank=-1, div_rank=-1, procs=2)
    gen = 0.0
    if not root:
        root = os.path.join(work, "lake")
        t0 = time.perf_counter()
        bench_lake.synthesize(root, a)
        shutil.rmtree(os.path.join(root, "twin"), ignore_errors=True)
        gen = time.perf_counter() - t0
    t0 = time.perf_counter()
    import msprobe.lake

    msprobe.lake.open(root, progress=False).close()  # the index, as `msprobe lake index` builds it (or checks it)
    index_s = time.perf_counter() - t0
    proc, url, setup = _serve([root], os.path.join(work, "lake_view"))
    out: dict = {"ranks": ranks, "steps": steps, "records_per_rank": records, "generate_s": round(gen, 1),
                 "lake_index_s": round(index_s, 1), "setup_s": round(setup, 2)}

    def measure(page, out: dict) -> None:
        out["cells"] = page.evaluate("() => window.__msprobe.state.meta.cells.length")
        first = page.locator("#first-divergence").inner_text()
        out["first_nan_found"] = f"step {steps // 2} · rank{ranks // 3}" in first
        out["open_worst_cell_s"] = _timed(page, lambda: page.locator("#worst-cells tbody tr").first.click(),
                                          "() => document.querySelector('#view-list:not([hidden]) #rows .vrow')")

    return _measured(browser, proc, url, out, measure)


def _cluster_report(work: str, ranks: int, records: int) -> tuple:
    """A report page holding the step's cluster model (built in process); (URL, seconds to build)."""
    from msprobe.view._cluster import MAX_LANES, assemble
    from msprobe.view._data import ROW_FIELDS, json_safe
    from msprobe.view._report import render_report
    from tests.view import _make_big_cluster as big

    t0 = time.perf_counter()
    cells, rows, read, summary = big.step_model(ranks, records)
    model = assemble(None, 0, cells, rows, read, summary)
    built = time.perf_counter() - t0
    entries = [dict(c, rows=0, errors=0, warnings=0, nan_inf=1, masked=0, max_score=0.0, worst_norm_rel=None,
                    first_div_name=None) for c in cells]
    bundle = {"meta": {"title": f"{ranks} x {records}", "target": "synthetic", "bench": None, "has_bench": False,
                       "rows": 0, "mode": None, "cells": cells, "truncated_rows": 0},
              "overview": {"cells": entries, "first_cell": big.BAD_RANK, "origin": None},
              "columns": list(ROW_FIELDS), "rows": {}, "stacks": {}, "stack_texts": [], "trees": {}, "bench_trees": {},
              "threshold": None, "csv_fields": list(ROW_FIELDS), "clusters": {"0": json_safe(model.page(0, MAX_LANES))},
              "cluster_of": {str(c["cell"]): "0" for c in cells}}
    path = os.path.join(work, "cluster.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_report(bundle))
    return f"file://{path}", built


def bench_cluster(browser, work: str, ranks: int, records: int, source: str) -> dict:
    from tests.view import _make_big_cluster as big

    out: dict = {"ranks": ranks, "records_per_rank": records, "source": source}
    proc = None
    if source == "view":
        t0 = time.perf_counter()
        big.write_step(os.path.join(work, "big"), ranks, records)
        out["generate_s"] = round(time.perf_counter() - t0, 1)
        proc, url, setup = _serve([os.path.join(work, "big")], os.path.join(work, "big_view"))
        out["setup_s"] = round(setup, 2)
    else:
        url, built = _cluster_report(work, ranks, records)
        out["model_build_s"] = round(built, 1)
    link = url + f"#view=cluster&step=0&rank=rank{big.BAD_RANK}"
    origin = "() => document.querySelector('#cluster-svg .cl-node.origin') !== null"
    dom = "() => document.getElementsByTagName('*').length"
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        if proc is not None:  # the set-up, then the step's model (built on the first request): timed apart
            log = os.path.join(work, "big_view", "server.log")
            t0 = time.perf_counter()
            while not _said(log, "ready in"):
                if proc.poll() is not None or time.perf_counter() - t0 > 7200:
                    raise SystemExit(f"msprobe view ended or took too long: {_said(log, '')[-2000:]}")
                time.sleep(0.5)
            out["setup_ready_s"] = round(out["setup_s"] + time.perf_counter() - t0, 1)
            out["setup_rss_mb"] = round(_vmhwm_mb(proc.pid), 1)
            with open(f"/proc/{proc.pid}/clear_refs", "w") as f:  # the peak from here on: the model's
                f.write("5")
            t0 = time.perf_counter()
            page.goto(link)
            _wait(page, origin, timeout=3600)
            out["cold_first_paint_s"] = round(time.perf_counter() - t0, 2)
            page.close()
            page = browser.new_page(viewport={"width": 1400, "height": 900})
        t0 = time.perf_counter()
        page.goto(link)
        _wait(page, origin, timeout=600)
        out["cluster_first_paint_s"] = round(time.perf_counter() - t0, 3)
        out["cluster_dom_elements"] = page.evaluate(dom)
        last = f"Distributed.all_reduce.{records // 100 - 1}.forward"
        out["scroll_to_end_s"] = round(_timed(
            page, lambda: page.evaluate("() => { const b = document.getElementById('cluster-box'); b.scrollLeft = b.scrollWidth; }"),
            f"() => document.querySelector(\"#cluster-svg .cl-node[data-record='{last}']\") !== null"), 3)
        out["dom_at_end"] = page.evaluate(dom)
        out["zoom_whole_step_s"] = round(_timed(
            page, lambda: page.locator("#cluster-zoom-fit").click(),
            "() => document.querySelector(\"#cluster-svg .cl-node[data-record='Distributed.all_reduce.0.forward']\") !== null"), 3)
        out["dom_whole_step"] = page.evaluate(dom)
        out["zoom_back_to_path_s"] = round(_timed(page, lambda: page.locator("#cluster-zoom-path").click(),
                                                  "() => document.querySelector('#cluster-svg .cl-node.origin') !== null"), 3)
        if ranks > 16:
            out["next_lanes_s"] = round(_timed(page, lambda: page.locator("#cluster-next").click(),
                                               "() => document.getElementById('cluster-range').textContent.startsWith('ranks 16')"), 3)
            out["dom_next_lanes"] = page.evaluate(dom)
        if proc is not None:
            out["cluster_rss_mb"] = round(_vmhwm_mb(proc.pid), 1)  # the peak since the set-up was done
        page.close()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lake-records", type=int, default=8)
    ap.add_argument("--lake-root", default="", help="a lake of --ranks x --steps made before (bench_lake's generator), "
                    "indexed or not, used instead of a new one")
    ap.add_argument("--cluster-ranks", type=int, default=64)
    ap.add_argument("--cluster-records", type=int, default=20_000)
    ap.add_argument("--cluster-source", choices=["model", "view"], default="model")
    ap.add_argument("--only", choices=["pair", "lake", "cluster"], default=None)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    work = tempfile.mkdtemp(prefix="bench_view_")
    results: dict = {}
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            if a.only in (None, "pair"):
                results["pair"] = bench_pair(browser, work, a.records)
                print(json.dumps({"pair": results["pair"]}, indent=1), flush=True)
            if a.only in (None, "lake"):
                results["lake"] = bench_lake(browser, work, a.ranks, a.steps, a.lake_records, a.lake_root)
                print(json.dumps({"lake": results["lake"]}, indent=1), flush=True)
            if a.only in (None, "cluster"):
                results["cluster"] = bench_cluster(browser, work, a.cluster_ranks, a.cluster_records, a.cluster_source)
                print(json.dumps({"cluster": results["cluster"]}, indent=1), flush=True)
            browser.close()
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    for name, r in results.items():
        for key, target in (("whole_view_first_paint_s", TARGETS["first_paint_s"]),
                            ("first_paint_s", TARGETS["first_paint_s"]) if "whole_view_first_paint_s" not in r else ("-", 0),
                            ("tree_expand_layer_s", TARGETS["tree_expand_s"]),
                            ("server_rss_mb", TARGETS["rss_mb"]), ("cluster_first_paint_s", TARGETS["cluster_first_paint_s"]),
                            ("cluster_dom_elements", TARGETS["cluster_dom_elements"]),
                            ("command_to_first_paint_s", 5.0 if name == "pair" else 10.0)):
            if key in r:
                ok = r[key] < target if key == "cluster_dom_elements" else r[key] <= target
                print(f"{name:5} {key:22} {r[key]:9.3f}  target <= {target}  {'ok' if ok else 'MISSED'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
