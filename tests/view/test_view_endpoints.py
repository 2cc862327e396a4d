"""The explorer's server through Starlette's TestClient, its tables and the self-contained report,
on a dump pair made by our PyTorch dumper with a NaN in fc2's weight on rank 1 at step 1."""
from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import subprocess
import sys

import pytest

from tests.view.conftest import ROOT, TOKEN

FAULT_ROW = "Functional.linear.1.forward.input.1"  # fc2's weight, the NaN, as Functional.linear's input 1
FAULT_RECORD = "Functional.linear.1.forward"
FAULT_MODULE = "Module.fc2.Linear.forward.0"


@pytest.fixture(scope="module")
def client(nan_view):
    from starlette.testclient import TestClient

    from msprobe.view import make_app

    with TestClient(make_app(nan_view, TOKEN), base_url="http://127.0.0.1") as c:
        c.headers["X-Msprobe-Token"] = TOKEN
        yield c


def _cell(client, step: int, rank_dir: str) -> int:
    cells = client.get("/api/meta").json()["cells"]
    return next(c["cell"] for c in cells if c["step"] == step and c["rank_dir"] == rank_dir)


def test_every_request_needs_the_token(nan_view):
    from starlette.testclient import TestClient

    from msprobe.view import make_app

    with TestClient(make_app(nan_view, TOKEN), base_url="http://127.0.0.1") as c:
        for path in ("/", "/static/app.js", "/api/meta", "/api/rows?cell=0", "/api/export.csv?cell=0"):
            assert c.get(path).status_code == 403, path
            assert c.get(path, headers={"X-Msprobe-Token": "wrong"}).status_code == 403, path
        # the page's URL carries the token once; the page then keeps it in a same-site, script-proof cookie
        r = c.get(f"/?token={TOKEN}")
        assert r.status_code == 200
        cookie = r.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie
        assert c.get("/api/meta").status_code == 200  # the cookie now answers


def test_responses_forbid_inline_script(client):
    for path in ("/", "/static/app.js", "/api/meta", "/api/nothing-here-404"):
        r = client.get(path)
        csp = r.headers.get("content-security-policy", "")
        if r.status_code == 404:  # Starlette's own not-found
            continue
        script = re.search(r"script-src ([^;]*)", csp).group(1)
        assert "'self'" in script and "unsafe-inline" not in script and "unsafe-eval" not in script, csp
        assert "default-src 'none'" in csp and r.headers["x-content-type-options"] == "nosniff"
    page = client.get("/").text
    assert "<script src=\"static/app.js\">" in page and not re.search(r"<script>[^<]", page)


def test_static_serves_only_the_built_assets(client):
    assert client.get("/static/app.js").headers["content-type"].startswith("text/javascript")
    assert "Apache" in client.get("/static/LICENSES.txt").text
    for bad in ("/static/..%2f_data.py", "/static/_data.py", "/static/%2e%2e%2f%2e%2e%2fpyproject.toml"):
        assert client.get(bad).status_code == 404, bad


def test_overview_marks_the_faulty_rank_and_step(client):
    o = client.get("/api/overview").json()
    bad = [c for c in o["cells"] if c["errors"] or c["nan_inf"]]
    assert [(c["step"], c["rank_dir"]) for c in bad] == [(1, "rank1")]
    first = next(c for c in o["cells"] if c["cell"] == o["first_cell"])
    assert (first["step"], first["rank_dir"]) == (1, "rank1") and first["first_div_name"] == FAULT_ROW
    assert all(c["rows"] > 20 for c in o["cells"])
    assert o["origin"]["row"] == FAULT_ROW and o["origin"]["cell"] == first["cell"]  # compare's localisation


def test_overview_names_where_a_scaled_weight_enters(scale_view):
    o = scale_view.overview()
    cell = next(c for c in o["cells"] if c["cell"] == o["origin"]["cell"])
    assert (cell["step"], cell["rank_dir"]) == (1, "rank1")
    assert o["origin"]["row"] == FAULT_ROW and o["origin"]["role"] == "parameter"


def test_rows_are_paged_filtered_and_sorted(client):
    cell = _cell(client, 1, "rank1")
    everything = client.get("/api/rows", params={"cell": cell, "begin": 0, "end": 1000}).json()
    n = everything["total"]
    assert n == len(everything["rows"]) > 40
    assert [r["i"] for r in everything["rows"]] == list(range(n))  # execution order
    page = client.get("/api/rows", params={"cell": cell, "begin": 10, "end": 15}).json()
    assert page["total"] == n and [r["i"] for r in page["rows"]] == [10, 11, 12, 13, 14]
    div = client.get("/api/rows", params={"cell": cell, "result": "divergent"}).json()
    assert div["rows"][0]["name"] == FAULT_ROW and div["rows"][0]["i"] == div["first_div"]
    assert div["rows"][0]["result"] == "error" and div["rows"][0]["nan_inf"] is True
    bwd = client.get("/api/rows", params={"cell": cell, "dir": "backward", "end": 1000}).json()["rows"]
    assert bwd and all(".backward" in r["name"] or "parameters_grad" in r["name"] for r in bwd)
    mods = client.get("/api/rows", params={"cell": cell, "kind": "module", "end": 1000}).json()["rows"]
    assert mods and all(r["name"].startswith("Module.") for r in mods)
    named = client.get("/api/rows", params={"cell": cell, "q": "LINEAR.1.forward", "end": 1000}).json()["rows"]
    assert named and all("linear.1.forward" in r["name"].lower() for r in named)
    worst = client.get("/api/rows", params={"cell": cell, "sort": "score", "end": 5}).json()["rows"]
    assert worst[0]["result"] == "error"
    healthy = client.get("/api/rows", params={"cell": _cell(client, 1, "rank0"), "result": "divergent"}).json()
    assert healthy["total"] == 0 and healthy["first_div"] is None


def test_the_bench_tree_is_the_benchs_own_hierarchy_with_peers(skew_view):
    """The bench calls the target's relu record gelu: each tree holds its own name, unmatched, under
    the module both sides share; every other node's peer is its counterpart."""
    from starlette.testclient import TestClient

    from msprobe.view import make_app

    relu = "Module.act.ReLU.forward.0"
    with TestClient(make_app(skew_view, TOKEN), base_url="http://127.0.0.1") as c:
        c.headers["X-Msprobe-Token"] = TOKEN
        cell = _cell(c, 1, "rank1")
        roots = {side: {n["name"]: n for n in c.get("/api/tree", params={"cell": cell, "side": side}).json()["nodes"]}
                 for side in ("target", "bench")}
        assert set(roots["target"]) == set(roots["bench"])  # the same modules at the top, no 'N/A' record
        for name, node in roots["bench"].items():
            assert node["side"] == "bench" and node["peer"] == name and node["matched"], node
            assert node["worst_result"] == roots["target"][name]["worst_result"]  # coloured as its peer
        kids = {side: c.get("/api/tree", params={"cell": cell, "side": side, "node": relu}).json()["nodes"]
                for side in ("target", "bench")}
        assert [(k["name"], k["peer"], k["matched"]) for k in kids["target"]] == [("Functional.relu.0.forward", None, False)]
        assert [(k["name"], k["peer"], k["matched"]) for k in kids["bench"]] == [("Functional.gelu.0.forward", None, False)]
        fault = c.get("/api/tree", params={"cell": cell, "side": "bench", "node": FAULT_MODULE}).json()["nodes"]
        assert [(k["name"], k["peer"], k["worst_result"]) for k in fault] == [(FAULT_RECORD, FAULT_RECORD, "error")]
        path = c.get("/api/tree_path", params={"cell": cell, "side": "bench", "record": "Functional.gelu.0.forward"})
        assert path.json()["path"] == [relu, "Functional.gelu.0.forward"]
        assert c.get("/api/tree", params={"cell": cell, "side": "left"}).status_code == 400


def test_a_view_without_bench_has_no_bench_tree(nan_pair):
    from msprobe.errors import ConfigError
    from msprobe.view import open_view

    with open_view(os.path.join(nan_pair, "target")) as v:
        assert v.tree(0).kids(None)["nodes"]
        with pytest.raises(ConfigError, match="no bench"):
            v.tree(0, "bench")


def test_bad_queries_get_a_400_with_a_message(client):
    for params in ({"cell": 0, "sort": "DROP TABLE rows"}, {"cell": "x"}, {"cell": 0, "result": "';--"}):
        r = client.get("/api/rows", params=params)
        assert r.status_code == 400 and r.json()["error"], params
    assert client.get("/api/record", params={"cell": 0, "record": "no.such"}).status_code == 400
    assert client.get("/api/tree", params={"cell": 0, "node": "no.such"}).status_code == 400
    assert client.get("/api/trend", params={"name": "x", "stat": "sum"}).status_code == 400


def test_tree_rolls_the_worst_result_up_the_module_path(client):
    cell = _cell(client, 1, "rank1")
    roots = client.get("/api/tree", params={"cell": cell}).json()
    by = {n["name"]: n for n in roots["nodes"]}
    assert by[FAULT_MODULE]["worst_result"] == "error" and by[FAULT_MODULE]["nan_inf"] is True
    assert by[FAULT_MODULE]["children"] >= 1
    assert by["Module.fc1.Linear.forward.0"]["worst_result"] == "pass"
    kids = client.get("/api/tree", params={"cell": cell, "node": FAULT_MODULE}).json()["nodes"]
    assert [k["name"] for k in kids] == [FAULT_RECORD] and kids[0]["bench"] == FAULT_RECORD
    path = client.get("/api/tree_path", params={"cell": cell, "record": FAULT_RECORD}).json()["path"]
    assert path == [FAULT_MODULE, FAULT_RECORD]
    hits = client.get("/api/search", params={"cell": cell, "q": "linear.1.f"}).json()["hits"]
    assert [h["record"] for h in hits] == [FAULT_RECORD]


def test_record_detail_has_every_argument_and_the_dumped_stack(client, nan_pair):
    cell = _cell(client, 1, "rank1")
    r = client.get("/api/record", params={"cell": cell, "record": FAULT_RECORD}).json()
    names = [a["name"] for a in r["args"]]
    assert names == [f"{FAULT_RECORD}.input.0", FAULT_ROW, f"{FAULT_RECORD}.input.2", f"{FAULT_RECORD}.output.0"]
    w = r["args"][1]
    assert w["npu_max"] == "NaN" or w["nan_inf"] is True
    assert w["bench_max"] is not None and w["npu_shape"] == "[4, 16]"
    with open(os.path.join(nan_pair, "target", "step1", "rank1", "stack.json"), encoding="utf-8") as f:
        stack = json.load(f)
    frames = next(v[1] for v in stack.values() if FAULT_RECORD in v[0])
    assert r["stack"] == frames


def test_trend_shows_the_jump(scale_view):
    t = scale_view.trend(f"{FAULT_RECORD}.output.0", "norm")
    assert t["steps"] == [0, 1, 2]
    series = {s["rank"]: s["points"] for s in t["series"]}
    r1 = {p["step"]: p for p in series["rank1"]}
    assert r1[1]["target"] > 20 * r1[1]["bench"]  # the scaled weight
    assert r1[0]["target"] == r1[0]["bench"] and r1[2]["target"] == r1[2]["bench"]
    assert all(p["target"] == p["bench"] for p in series["rank0"])


def test_export_csv_is_the_current_filter(client):
    cell = _cell(client, 1, "rank1")
    r = client.get("/api/export.csv", params={"cell": cell, "result": "divergent"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(r.text)))
    total = client.get("/api/rows", params={"cell": cell, "result": "divergent"}).json()["total"]
    assert len(rows) == total and rows[0]["name"] == FAULT_ROW


def test_a_compare_output_opens_as_the_pair_did(nan_pair, nan_view, tmp_path):
    from msprobe.compare import compare
    from msprobe.view import open_view

    out = str(tmp_path / "cmp")
    compare(os.path.join(nan_pair, "target"), os.path.join(nan_pair, "bench"), out, plot=False, progress=False)
    with open_view(out) as v:
        a, b = v.overview(), nan_view.overview()
        keep = ("step", "rank_dir", "rows", "errors", "nan_inf", "first_div_name")
        assert [{k: c[k] for k in keep} for c in a["cells"]] == [{k: c[k] for k in keep} for c in b["cells"]]
        assert v.target == os.path.join(nan_pair, "target")


def test_one_dump_without_a_bench_flags_its_nan(nan_pair):
    from msprobe.view import open_view

    with open_view(os.path.join(nan_pair, "target")) as v:
        o = v.overview()
        bad = [(c["step"], c["rank_dir"]) for c in o["cells"] if c["nan_inf"]]
        assert bad == [(1, "rank1")]
        first = next(c for c in o["cells"] if c["cell"] == o["first_cell"])
        assert first["first_div_name"] == FAULT_ROW
        assert v.meta()["has_bench"] is False


def _report_parts(html: str) -> tuple:
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html).group(1)
    scripts = re.findall(r"<script>(.*?)</script>", html, re.S)
    data = re.search(r'<script type="application/json" id="msprobe-data">(.*?)</script>', html, re.S).group(1)
    return csp, scripts, data


def test_report_is_one_self_contained_file(nan_view, tmp_path):
    from msprobe.view import write_report

    out = write_report(nan_view, str(tmp_path / "r.html"))
    html = open(out, encoding="utf-8").read()
    csp, scripts, data = _report_parts(html)
    assert len(scripts) == 1
    digest = base64.b64encode(hashlib.sha256(scripts[0].encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in csp and "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]
    assert not re.search(r'<(script|link|img)[^>]+(src|href)="(?!data:)', html)  # nothing to fetch
    bundle = json.loads(data)
    assert bundle["overview"]["first_cell"] == nan_view.overview()["first_cell"]
    assert sum(len(v) for v in bundle["rows"].values()) == nan_view.meta()["rows"]


def test_report_rows_are_bounded_keeping_divergent_rows(nan_view):
    from msprobe.view._report import report_bundle

    b = report_bundle(nan_view, max_rows=5)
    cell = str(nan_view.overview()["first_cell"])
    names = [r[b["columns"].index("name")] for r in b["rows"][cell]]
    assert len(names) == 5 and names[0] == FAULT_ROW
    assert b["meta"]["truncated_rows"] == nan_view.meta()["rows"] - 5 * len(b["rows"])


def test_report_escapes_what_could_end_its_data_block(hostile_view, tmp_path):
    from msprobe.view import write_report

    html = open(write_report(hostile_view, str(tmp_path / "h.html")), encoding="utf-8").read()
    _, scripts, data = _report_parts(html)
    assert len(scripts) == 1 and "<" not in data and "onerror" in data
    assert any("<script>window.__pwned" in json.dumps(r) for r in json.loads(data)["rows"].values())


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "msprobe", *args], capture_output=True, text=True, timeout=300,
                          env=env, cwd=ROOT)


def test_cli_report_and_typed_errors(nan_pair, tmp_path):
    out = tmp_path / "cli.html"
    r = _cli("report", os.path.join(nan_pair, "target"), os.path.join(nan_pair, "bench"), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert out.exists() and "msprobe-data" in out.read_text(encoding="utf-8")
    bad = _cli("report", str(tmp_path / "nothing"), "-o", str(tmp_path / "x.html"))
    assert bad.returncode == 1 and bad.stderr.startswith("msprobe report: error:") and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    # the pair's compare runs in a child process: its one-line error comes back as the command's
    pair = _cli("report", str(tmp_path / "nothing"), os.path.join(nan_pair, "bench"), "-o", str(tmp_path / "y.html"))
    assert pair.returncode == 1 and pair.stderr.startswith("msprobe report: error: msprobe compare: error:")
    assert len(pair.stderr.strip().splitlines()) == 1 and "nothing" in pair.stderr


def test_cli_view_prints_the_url_and_serves_it(nan_pair, tmp_path):
    import urllib.request

    proc = subprocess.Popen([sys.executable, "-m", "msprobe", "view", os.path.join(nan_pair, "target"),
                             os.path.join(nan_pair, "bench")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT)
    try:
        line = proc.stdout.readline()
        hint = proc.stdout.readline()
        m = re.match(r"msprobe view: (http://127\.0\.0\.1:(\d+)/\?token=([\w-]{20,}))$", line.strip())
        assert m, (line, proc.stderr.read() if proc.poll() is not None else "")
        assert f"ssh -L {m.group(2)}:127.0.0.1:{m.group(2)}" in hint
        import time

        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(m.group(1), timeout=5) as resp:
                    assert resp.status == 200 and b"static/app.js" in resp.read()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.2)
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{m.group(2)}/api/meta", timeout=5)
        assert e.value.code == 403
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_lake_of_runs_shows_run_by_step_by_rank(nan_pair, tmp_path):
    import shutil

    from msprobe.view import open_view

    root = tmp_path / "lake"
    shutil.copytree(os.path.join(nan_pair, "target"), root / "run_npu")
    shutil.copytree(os.path.join(nan_pair, "bench"), root / "run_gpu")
    with open_view(str(root)) as v:
        o = v.overview()
        assert len(o["cells"]) == 12 and {c["run"] for c in o["cells"]} == {"run_npu", "run_gpu"}
        bad = [(c["run"], c["step"], c["rank_dir"]) for c in o["cells"] if c["nan_inf"]]
        assert bad == [("run_npu", 1, "rank1")]
        first = next(c for c in o["cells"] if c["cell"] == o["first_cell"])
        assert first["run"] == "run_npu" and first["first_div_name"] == FAULT_ROW
        assert v.tree(first["cell"]).path(FAULT_RECORD) == [FAULT_MODULE, FAULT_RECORD]
        assert "linear.py" in v.record(first["cell"], FAULT_RECORD)["stack"][0]
        series = {s["rank"]: s["points"] for s in v.trend(f"{FAULT_RECORD}.output.0", "max")["series"]}
        assert series["run_npu/rank1"][1]["target"] == "NaN" and series["run_gpu/rank1"][1]["target"] != "NaN"


@pytest.mark.s3
def test_a_pair_in_a_bucket(nan_pair, nan_view, s3_server, s3_bucket_url):
    import s3fs

    from msprobe.view import open_view
    from tests.conftest_s3 import s3_storage_options

    opts = s3_storage_options(s3_server)
    fs = s3fs.S3FileSystem(**opts)
    for side in ("target", "bench"):
        fs.put(os.path.join(nan_pair, side) + "/", f"{s3_bucket_url}/{side}/", recursive=True)
    with open_view(f"{s3_bucket_url}/target", f"{s3_bucket_url}/bench", storage_options=opts) as v:
        keep = ("step", "rank_dir", "rows", "errors", "nan_inf", "first_div_name")
        assert [{k: c[k] for k in keep} for c in v.overview()["cells"]] == \
            [{k: c[k] for k in keep} for c in nan_view.overview()["cells"]]
        cell = v.overview()["first_cell"]
        assert "linear.py" in v.record(cell, FAULT_RECORD)["stack"][0]  # stack.json read from the bucket
        assert v.tree(cell).path(FAULT_RECORD) == [FAULT_MODULE, FAULT_RECORD]


REAL = os.path.join(ROOT, "tests", "fixtures", "real")


@pytest.mark.parametrize("target, bench, mode", [
    ("ms26/L1_statistics", "ms26/L1_statistics_perturbed", "statistics"),
    ("ms26/L1_md5", "ms26/L1_md5_perturbed", "md5"),
    ("ms8/L1_statistics", "ms8/L1_statistics_perturbed", "statistics"),
    # MindSpore dumps of the real 26.2.0 (its PyNative dialect), each against the other's statistics or itself
    ("ms26_mindspore/L1_statistics", "ms26_mindspore/L1_md5", "statistics"),
    ("ms26_mindspore/L1_md5", "ms26_mindspore/L1_md5", "md5"),
    ("ms26_mindspore/L1_tensor", "ms26_mindspore/L1_tensor", "tensor"),
])
def test_the_real_tools_dumps_view_as_compare_judges_them(target, bench, mode, tmp_path):
    from msprobe.compare import compare
    from msprobe.view import open_view

    t, b = os.path.join(REAL, target), os.path.join(REAL, bench)
    s = compare(t, b, str(tmp_path / "cmp"), plot=False, progress=False)
    with open_view(t, b) as v:
        assert v.meta()["mode"] == mode == s["mode"]
        o = v.overview()
        want = s["first_divergence"]
        got = next((c for c in o["cells"] if c["cell"] == o["first_cell"]), None)
        assert (got["first_div_name"] if got else None) == (want["row"] if want else None)
        rows = v.rows(o["cells"][0]["cell"], 0, 1000, {})["rows"]
        assert len(rows) == sum(p["rows"] for p in s["pairs"][:1])
        if mode == "md5":
            assert all(r["npu_md5"] for r in rows if r["npu_dtype"] not in (None, "N/A") and "torch." in r["npu_dtype"])


def test_a_tensor_dump_gives_each_sides_histogram(nan_view):
    from starlette.testclient import TestClient

    from msprobe.view import make_app, open_view

    t, b = os.path.join(REAL, "ms26", "L1_tensor"), os.path.join(REAL, "ms26", "L1_tensor_perturbed")
    with open_view(t, b) as v, TestClient(make_app(v, TOKEN), base_url="http://127.0.0.1") as c:
        c.headers["X-Msprobe-Token"] = TOKEN
        rows = c.get("/api/rows", params={"cell": 0, "end": 1000}).json()["rows"]
        row = next(r for r in rows if r["data_name"] and "float" in (r["npu_dtype"] or ""))
        assert row["cosine"] is not None
        for side in ("target", "bench"):
            got = c.get("/api/tensor", params={"cell": 0, "name": row["name"], "side": side}).json()
            assert got["available"] is True, got
            assert sum(got["histogram"]["counts"]) + got["nan"] + got["inf"] == __import__("math").prod(got["shape"])
            assert len(got["preview"]) == min(64, __import__("math").prod(got["shape"]))
        # a statistics dump has no tensor file: said, not an error
        stats = c.get("/api/tensor", params={"cell": 0, "name": row["name"], "side": "nope"})
        assert stats.status_code == 400


def test_meta_names_the_statistics_of_the_format(client):
    """The page takes its statistics from the server (format.stats.STATISTICS), not from a list of its own."""
    from msprobe.format.stats import STATISTICS

    assert client.get("/api/meta").json()["statistics"] == [{"key": s.key, "column": s.column} for s in STATISTICS]
