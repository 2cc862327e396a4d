"""Benchmark: ``msprobe view`` in a real headless Chromium (Debian's package, driven by Playwright).

Two scenarios, each served by ``python -m msprobe view`` in its own process:

* ``pair``: two statistics dumps of --records records (``bench_compare``'s generator: ~3.5 rows a
  record), compared on the fly, with a construct.json that nests every two records in a module
  and every 200 modules in a layer (--records 100,000: a tree of ~50,000 module nodes + the
  records). Measured: the server's set-up (compare + tables, until it prints its URL), the first
  useful paint (navigation until the overview is drawn and the first cell's list has its rows),
  interaction latency (open a cell's list, jump to the middle of the list, filter the divergent
  rows, open the model trees, expand a layer of 200 modules: the target's and, synced, the
  bench's), and the server's peak RSS (VmHWM).
* ``lake``: a lake of --ranks ranks x --steps steps (``bench_lake``'s generator, --lake-records
  records a rank), indexed by msprobe.lake then viewed: set-up, first paint of the run x step x
  rank overview, opening a cell, peak RSS.

Targets (issue 27, on the 2-core machine): first paint <= 2 s for the pair and the lake overview,
tree expand <= 0.5 s, server RSS <= 500 MB.

    python bench/bench_view.py                                 # 100,000 records; 1,024 x 10 lake
    python bench/bench_view.py --records 10000 --ranks 64 --steps 4   # a quick run
    python bench/bench_view.py --only pair
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
TARGETS = {"first_paint_s": 2.0, "tree_expand_s": 0.5, "rss_mb": 500.0}


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
    """Start ``msprobe view``; (process, URL, seconds until it printed the URL)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "msprobe", "view", *args, "--work-dir", work],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT)
    line = proc.stdout.readline()
    m = re.match(r"msprobe view: (\S+)", line.strip())
    if not m:
        proc.kill()
        raise SystemExit(f"msprobe view did not start: {line!r} {proc.stderr.read()[-2000:]}")
    return proc, m.group(1), time.perf_counter() - t0


def _vmhwm_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


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
    page.wait_for_selector("body[data-ready]", state="attached", timeout=120000)
    _wait(page, "() => document.querySelectorAll('#rows .vrow').length > 0")
    return time.perf_counter() - t0


def _timed(page, action, js: str) -> float:
    t0 = time.perf_counter()
    action()
    _wait(page, js)
    return time.perf_counter() - t0


def _measured(browser, proc, url: str, out: dict, steps) -> dict:
    """Run ``steps(page, out)`` on a fresh page of the server ``proc``; then its peak RSS; then stop it."""
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        out["first_paint_s"] = _paint(page, url)
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


def bench_lake(browser, work: str, ranks: int, steps: int, records: int) -> dict:
    import bench_lake

    a = argparse.Namespace(ranks=ranks, steps=steps, records=records, nan_step=steps // 2, nan_rank=ranks // 3,
                           dis_step=-1, dis_rank=-1, div_rank=-1, procs=2)
    root = os.path.join(work, "lake")
    t0 = time.perf_counter()
    bench_lake.synthesize(root, a)
    shutil.rmtree(os.path.join(root, "twin"), ignore_errors=True)
    gen = time.perf_counter() - t0
    t0 = time.perf_counter()
    import msprobe.lake

    msprobe.lake.open(root, progress=False).close()  # the index, as `msprobe lake index` builds it
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lake-records", type=int, default=8)
    ap.add_argument("--only", choices=["pair", "lake"], default=None)
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
                results["lake"] = bench_lake(browser, work, a.ranks, a.steps, a.lake_records)
                print(json.dumps({"lake": results["lake"]}, indent=1), flush=True)
            browser.close()
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    for name, r in results.items():
        for key, target in (("first_paint_s", TARGETS["first_paint_s"]), ("tree_expand_layer_s", TARGETS["tree_expand_s"]),
                            ("server_rss_mb", TARGETS["rss_mb"])):
            if key in r:
                ok = r[key] <= target
                print(f"{name:5} {key:22} {r[key]:9.3f}  target <= {target}  {'ok' if ok else 'MISSED'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
