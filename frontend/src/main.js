// The msprobe explorer: overview heatmap, divergence list, model tree, trends, record detail.
// Every name, dtype and stack line comes from a dump (attacker-written): it is only ever set as
// text (textContent, ECharts labels escaped), never parsed as HTML.
import * as echarts from "echarts/core";
import { HeatmapChart, LineChart, BarChart } from "echarts/charts";
import { GridComponent, TooltipComponent, VisualMapComponent, LegendComponent, DataZoomComponent, MarkLineComponent } from "echarts/components";
import { CanvasRenderer, SVGRenderer } from "echarts/renderers";
import { makeApi } from "./api.js";
import { makeCluster } from "./cluster.js";
import "./style.css";

echarts.use([HeatmapChart, LineChart, BarChart, GridComponent, TooltipComponent, VisualMapComponent, LegendComponent,
  DataZoomComponent, MarkLineComponent, CanvasRenderer, SVGRenderer]);

const api = makeApi();
const state = { meta: null, overview: null, cell: 0, filters: { dir: "all", kind: "all", result: "all", sort: "order", q: "" },
  record: null, trendName: null, trendStat: "norm", view: "overview" };
const charts = {};
const timings = {};
const mark = (name) => { timings[name] = Math.round(performance.now()); };
// the statistics' names in the rows and lists ("max", ...): the server's (meta.statistics, from
// msprobe.format.stats.STATISTICS), never a list of the page's own
function statColumns() {
  return ((state.meta && state.meta.statistics) || []).map((s) => s.column);
}
window.__msprobe = { charts, state, timings };

// -- small DOM helpers (text only) ------------------------------------------------------------
function el(tag, attrs = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of kids.flat()) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
function fmt(v, pct = false) {
  if (v === null || v === undefined) return "";
  if (typeof v === "string") return v;
  if (typeof v === "boolean") return v ? "yes" : "";
  if (!isFinite(v)) return String(v);
  if (pct) return (v * 100).toPrecision(4) + "%";
  const a = Math.abs(v);
  return a !== 0 && (a < 1e-3 || a >= 1e6) ? v.toExponential(3) : String(Number(v.toPrecision(6)));
}
function cellLabel(c) { return `${c.run ? c.run + " / " : ""}step ${c.step ?? "-"} · ${c.rank_dir}`; }
function resultClass(r, nan) { return nan ? "r-nan" : r === "error" ? "r-error" : r === "warning" ? "r-warning" : r === "pass" ? "r-pass" : "r-none"; }
function download(name, href) { const a = el("a", { href, download: name }); document.body.append(a); a.click(); a.remove(); }
function downloadText(name, text, type) { const url = URL.createObjectURL(new Blob([text], { type })); download(name, url); setTimeout(() => URL.revokeObjectURL(url), 5000); }

// -- layout ---------------------------------------------------------------------------------------
const VIEWS = [["overview", "Overview"], ["cluster", "Cluster"], ["list", "Divergences"], ["tree", "Model tree"], ["trends", "Trends"], ["record", "Record"]];
const root = document.getElementById("app");
const header = el("header", { class: "top" });
const tabs = el("nav", { class: "tabs" });
const cellBadge = el("span", { class: "cell-badge", id: "cell-badge" });
const main = el("main", { class: "main" });
const panes = {};
for (const [id, label] of VIEWS) {
  tabs.append(el("button", { class: "tab", "data-view": id, onclick: () => { if (state.meta) show(id); }, text: label }));
  panes[id] = el("section", { class: "pane", id: `view-${id}`, hidden: true });
  main.append(panes[id]);
}
const status = el("div", { class: "status", id: "status" });
root.append(header, main, status);

function show(view, lanes = null) {
  state.view = view;
  if (view === "tree") tree.ensure();
  for (const [id] of VIEWS) {
    panes[id].hidden = id !== view;
    tabs.querySelector(`[data-view=${id}]`).classList.toggle("active", id === view);
  }
  resizeCharts();
  remember();
  // the cluster view is drawn once its pane has its size (the window on its lanes depends on it)
  if (view === "cluster") return cluster.ensure(lanes);
  return null;
}

// -- links: the view in the URL's fragment ----------------------------------------------------------
// #view=&run=&step=&rank=&record=&row=&lanes=&dir=&kind=&result=&sort=&q=&name=&stat= : the tab, the
// cell (by its run, step and rank directory, as a person names it), the record, the cluster's page of
// lanes, the list's filters and the trend. Every change a person makes is a history entry (back and
// forward walk them); a fragment is never sent to the server (the access token is a query value,
// taken out of the URL once the page has it); the report (file://) honours the same links.
let applying = 0;
function linkOf() {
  const p = new URLSearchParams();
  p.set("view", state.view);
  const c = state.meta && state.meta.cells.find((x) => x.cell === state.cell);
  if (c) { if (c.run) p.set("run", c.run); if (c.step !== null && c.step !== undefined) p.set("step", c.step); p.set("rank", c.rank_dir); }
  if (state.view === "record" && state.record) { p.set("record", state.record); if (state.row) p.set("row", state.row); }
  if (state.view === "cluster") p.set("lanes", cluster.where().lanes);
  if (state.view === "trends" && state.trendName) { p.set("name", state.trendName); p.set("stat", state.trendStat); }
  for (const [k, v] of Object.entries(state.filters)) if (v && v !== { dir: "all", kind: "all", result: "all", sort: "order", q: "" }[k]) p.set(k, v);
  return "#" + p.toString();
}
function remember() {
  if (applying || !state.meta) return;
  const h = linkOf();
  if (h === window.location.hash) return;
  try { window.history.pushState(null, "", h); } catch (e) { window.location.hash = h; }
}
function cellOf(p) {
  const cells = state.meta.cells;
  if (p.has("rank") || p.has("step") || p.has("run")) {
    // a value the link leaves out matches any (a link of one run's step 1, rank 0 needs no run)
    const found = cells.find((c) => (!p.has("run") || (c.run ?? "") === p.get("run")) && (!p.has("step") || String(c.step ?? "") === p.get("step"))
      && (!p.has("rank") || c.rank_dir === p.get("rank")));
    if (found) return found.cell;
    setStatus(`the link's cell (${p.get("run") ? p.get("run") + " / " : ""}step ${p.get("step") ?? "-"} · ${p.get("rank") ?? "-"}) is not in this view`, true);
  }
  return null;
}
// open the view a link names; false when it names none
async function follow(hash) {
  const p = new URLSearchParams((hash || "").replace(/^#/, ""));
  const view = p.get("view");
  if (!view || !VIEWS.some(([id]) => id === view)) return false;
  applying++;
  try {
    const filters = { dir: "all", kind: "all", result: "all", sort: "order", q: "" };
    for (const k of Object.keys(filters)) if (p.has(k)) filters[k] = p.get(k);
    const refilter = JSON.stringify(filters) !== JSON.stringify(state.filters);
    state.filters = filters;
    for (const e of document.querySelectorAll("[data-filter]")) e.value = filters[e.dataset.filter];
    const cell = cellOf(p);
    if (cell !== null && cell !== state.cell) openCell(cell, null);
    else if (refilter) list.reset();
    if (view === "record" && p.get("record")) await openRecord(p.get("record"), p.get("row"));
    else if (view === "trends" && p.get("name")) await trends.load(p.get("name"), p.get("stat") || "norm");
    else if (view === "tree" && p.get("record")) await tree.reveal(p.get("record"));
    else await show(view, p.has("lanes") ? Number(p.get("lanes")) || 0 : null);
  } finally {
    applying--;
  }
  return true;
}
window.addEventListener("popstate", () => { if (state.meta) follow(window.location.hash); });
// a chart is laid out again only when its box changed (a full redraw of 10,000 cells is not free)
function resizeCharts() {
  for (const c of Object.values(charts)) {
    if (!c || c.isDisposed()) continue;
    const dom = c.getDom();
    if (dom.offsetWidth && (dom.offsetWidth !== c.getWidth() || dom.offsetHeight !== c.getHeight())) c.resize();
  }
}
function setStatus(text, bad = false) { status.textContent = text; status.classList.toggle("bad", bad); }
async function guard(fn) { try { return await fn(); } catch (e) { setStatus(String(e.message || e), true); return null; } }

// -- overview -------------------------------------------------------------------------------------
function level(c) {
  if (c.nan_inf > 0) return 4;
  if (c.errors > 0) return 3;
  if (c.warnings > 0) return 2;
  if (c.rows > 0) return 1;
  return 0;
}
function renderOverview() {
  const p = panes.overview;
  p.replaceChildren();
  const o = state.overview;
  const cells = o.cells;
  const rankDirs = [...new Set(cells.map((c) => c.rank_dir))].sort((a, b) => (parseInt(a.replace(/\D/g, "")) || 0) - (parseInt(b.replace(/\D/g, "")) || 0) || (a < b ? -1 : 1));
  const rowKey = (c) => (c.run ? c.run + " / " : "") + "step " + (c.step ?? "-");
  const rowKeys = [...new Set(cells.map(rowKey))];
  const first = o.first_cell !== null ? cells.find((c) => c.cell === o.first_cell) : null;
  const m = state.meta;
  const facts = el("div", { class: "facts" },
    el("div", { class: "fact" }, el("b", { text: "Target" }), " ", el("span", { text: m.target || "-" })),
    m.has_bench ? el("div", { class: "fact" }, el("b", { text: "Bench" }), " ", el("span", { text: m.bench || "-" })) : null,
    el("div", { class: "fact" }, el("b", { text: "Cells" }), ` ${cells.length} · rows ${m.rows}`, m.mode ? ` · ${m.mode} mode` : ""),
    Object.keys(layouts()).length ? el("div", { class: "fact", id: "layouts" }, el("b", { text: "Merged layout" }), " ",
      el("span", { text: Object.entries(layouts()).map(([side, text]) => `${side} ${text}`).join(" · ") + " (one logical model a cell; each row names the ranks holding it)" })) : null,
    el("div", { class: "fact first-div-fact", id: "first-divergence", "data-cell": first ? first.cell : "" },
      el("b", { text: "First divergence" }), " ",
      first ? el("a", { href: "#", onclick: (e) => { e.preventDefault(); openCell(first.cell, "list"); }, text: `${cellLabel(first)} · ${first.first_div_name}` })
        : el("span", { text: m.has_bench ? "none" : "no bench: NaN/Inf only" })),
    o.origin && o.origin.cell !== null && o.origin.cell !== undefined ? el("div", { class: "fact origin-fact", id: "origin" },
      el("b", { text: "Error enters at" }), " ",
      el("a", { href: "#", onclick: (e) => { e.preventDefault(); openCell(o.origin.cell, null); openRecord(o.origin.record, o.origin.row); },
        text: `${cellLabel(cells.find((c) => c.cell === o.origin.cell))} · ${o.origin.row || o.origin.record}` }),
      el("span", { class: "hint", text: ` ${o.origin.role || ""}${o.origin.note ? " · " + o.origin.note : ""}` })) : null);
  const chartBox = el("div", { class: "chart", id: "overview-chart" });
  const legend = el("div", { class: "legend" }, ...[["r-pass", "pass"], ["r-warning", "warning"], ["r-error", "error"], ["r-nan", "NaN/Inf"], ["r-none", "no rows"]]
    .map(([c, t]) => el("span", { class: "chip" }, el("i", { class: `dot ${c}` }), t)), el("span", { class: "hint", text: "click a cell to open its records" }));
  const worst = [...cells].filter((c) => c.max_score > 1e6 || c.nan_inf > 0).sort((a, b) => b.max_score - a.max_score).slice(0, 10);
  const table = el("table", { class: "grid worst-cells", id: "worst-cells" },
    el("thead", {}, el("tr", {}, ...["cell", "rows", "errors", "warnings", "NaN/Inf", "worst rel. Norm err", "first divergent row"].map((h) => el("th", { text: h })))),
    el("tbody", {}, ...worst.map((c) => el("tr", { class: `clickable ${resultClass(c.errors ? "error" : c.warnings ? "warning" : "pass", c.nan_inf > 0)}`, "data-cell": c.cell, "data-step": c.step, "data-rank": c.rank_dir, onclick: () => openCell(c.cell, "list") },
      el("td", { text: cellLabel(c) }), el("td", { text: c.rows }), el("td", { text: c.errors }), el("td", { text: c.warnings }), el("td", { text: c.nan_inf }),
      el("td", { text: c.nan_inf > 0 ? "NaN/Inf" : fmt(c.worst_norm_rel, true) }), el("td", { class: "mono", text: c.first_div_name || "" })))));
  p.append(facts, legend, chartBox, el("h3", { text: worst.length ? "Worst cells" : "No divergent cell" }), table);
  mark("overview-dom");
  const xOf = new Map(rankDirs.map((r, k) => [r, k])), yOf = new Map(rowKeys.map((r, k) => [r, k]));
  // plain [x, y, level] triples (the cell by its data index): ECharts draws 10,000 of them in a few
  // tens of ms, while objects, split areas, borders and auto-spaced labels cost it ten times that
  const data = cells.map((c) => [xOf.get(c.rank_dir), yOf.get(rowKey(c)), level(c)]);
  const cellAt = (pt) => (pt && pt.dataIndex !== undefined ? cells[pt.dataIndex] : null);
  if (charts.overview && !charts.overview.isDisposed()) charts.overview.dispose();  // drawn again: the whole view
  const chart = echarts.init(chartBox, null, { renderer: "canvas" });
  charts.overview = chart;
  const dense = rankDirs.length * rowKeys.length > 400;
  chart.setOption({
    animation: false,
    tooltip: { formatter: (pt) => { const c = cellAt(pt); if (!c) return ""; return `<b>${esc(cellLabel(c))}</b><br>${c.rows} rows · ${c.errors} errors · ${c.warnings} warnings · ${c.nan_inf} NaN/Inf${c.masked ? ` · ${c.masked} mask -inf (as intended)` : ""}<br>worst rel. Norm err ${esc(fmt(c.worst_norm_rel, true))}${c.first_div_name ? "<br>first divergent: " + esc(c.first_div_name) : ""}`; } },
    grid: { left: 110, right: 30, top: 20, bottom: 60 },
    xAxis: { type: "category", data: rankDirs, name: "rank", nameLocation: "middle", nameGap: 35, splitArea: { show: !dense },
      axisTick: { show: !dense }, axisLabel: dense ? { interval: Math.max(Math.ceil(rankDirs.length / 32) - 1, 0) } : {} },
    yAxis: { type: "category", data: rowKeys, inverse: true, splitArea: { show: !dense },
      axisLabel: rowKeys.length > 40 ? { interval: Math.max(Math.ceil(rowKeys.length / 40) - 1, 0) } : {} },
    visualMap: { show: false, type: "piecewise", dimension: 2, pieces: [{ value: 0, color: "#e5e7eb" }, { value: 1, color: "#7cc48a" }, { value: 2, color: "#f2c14e" }, { value: 3, color: "#e4572e" }, { value: 4, color: "#7b2cbf" }] },
    dataZoom: dense ? [{ type: "inside", xAxisIndex: 0 }, { type: "slider", xAxisIndex: 0, bottom: 8 }] : [],
    series: [{ type: "heatmap", data, progressive: 5000,
      label: { show: !dense, formatter: (pt) => { const c = cellAt(pt); return c.nan_inf > 0 ? "NaN/Inf" : c.cell === o.first_cell ? "1st ▲" : c.errors ? `${c.errors} err` : c.warnings ? `${c.warnings} warn` : ""; }, color: "#111", fontSize: 11 },
      itemStyle: { borderColor: "#fff", borderWidth: dense ? 0 : 1 },
      emphasis: { itemStyle: { borderColor: "#111", borderWidth: 2 } } }],
  });
  mark("overview-chart");
  chart.on("click", (pt) => { const c = cellAt(pt); if (c) openCell(c.cell, "list"); });
  window.__msprobe.overviewIndex = { rankDirs, rowKeys, rowKey: (cell) => { const c = cells.find((x) => x.cell === cell); return [xOf.get(c.rank_dir), yOf.get(rowKey(c))]; } };
}

function openCell(cell, view) {
  const moved = cell !== state.cell;
  state.cell = cell;
  const c = state.meta.cells.find((x) => x.cell === cell);
  cellBadge.textContent = c ? cellLabel(c) : "";
  list.reset();
  tree.invalidate();
  if (view) show(view);
  else if (moved) remember();
}

// -- divergence list (virtual scroll over paged rows) ---------------------------------------------
const ROW_H = 28;
const PAGE = 200;
const COLS = [["i", "#", 60], ["name", "row", 420], ["result", "result", 130], ["norm_rel", "rel. Norm err", 110], ["max_rel", "rel. Max err", 100],
  ["cosine", "cosine", 80], ["npu_dtype", "dtype", 110], ["npu_shape", "shape", 120], ["bench_name", "bench row", 300], ["err", "message", 300]];
// a merged parallel layout (msprobe view --layout / --bench-layout): each row names the ranks holding it
const layouts = () => (state.meta && state.meta.layouts) || {};
function columns() {
  const extra = [];
  if (layouts().target) extra.push(["ranks", "ranks", 130]);
  if (layouts().bench) extra.push(["bench_ranks", "bench ranks", 110]);
  return [...COLS.slice(0, 2), ...extra, ...COLS.slice(2)];
}
function ranksText(ranks, suspects) { return ranks ? `${ranks}${suspects ? ` · suspect ${suspects}` : ""}` : ""; }
const list = (() => {
  let total = 0, firstDiv = null, pages = new Map(), gen = 0;
  const bar = el("div", { class: "filters" });
  const mkSel = (key, opts) => el("label", {}, key + " ", el("select", { "data-filter": key, onchange: (e) => { state.filters[key] = e.target.value; reset(); remember(); } },
    ...opts.map(([v, t]) => el("option", { value: v, text: t }))));
  bar.append(
    mkSel("dir", [["all", "all"], ["forward", "forward"], ["backward", "backward"]]),
    mkSel("kind", [["all", "API + module"], ["api", "API"], ["module", "module"]]),
    mkSel("result", [["all", "all rows"], ["divergent", "divergent"], ["nan_inf", "NaN/Inf"], ["masked", "mask -inf"], ["unmatched", "unmatched"]]),
    mkSel("sort", [["order", "execution order"], ["score", "worst first"], ["norm_rel", "rel. Norm err"], ["name", "name"]]),
    el("input", { type: "search", placeholder: "filter by name", "data-filter": "q", oninput: debounce((e) => { state.filters.q = e.target.value; reset(); remember(); }, 250) }),
    el("button", { id: "export-csv", onclick: () => guard(async () => downloadText(`msprobe_rows_cell${state.cell}.csv`, await api.csv(state.cell, state.filters), "text/csv")), text: "Export CSV" }),
    el("button", { onclick: () => { if (firstDiv !== null) jumpTo(firstDiv); }, text: "Go to first divergence" }));
  const count = el("div", { class: "count", id: "row-count" });
  const head = el("div", { class: "vhead" });
  const heads = () => head.replaceChildren(...columns().map(([, t, w]) => el("div", { class: "vcell", style: `width:${w}px`, text: t })));
  const scroller = el("div", { class: "vscroll", id: "row-scroller" });
  const spacer = el("div", { class: "vspacer" });
  const body = el("div", { class: "vbody", id: "rows" });
  spacer.append(body);
  scroller.append(spacer);
  panes.list.append(bar, count, el("div", { class: "vtable" }, head, scroller));
  scroller.addEventListener("scroll", () => render());

  function reset() {
    gen++; pages = new Map(); total = 0; firstDiv = null;
    heads();
    scroller.scrollTop = 0;
    // the rows of the previous cell (or filters) go at once: none is shown under the new cell's badge
    body.replaceChildren();
    spacer.style.height = "1px";
    count.textContent = "loading rows…";
    fetchPage(0).then(() => render());
  }
  async function fetchPage(n) {
    if (pages.has(n)) return pages.get(n);
    const g = gen;
    const pr = guard(() => api.rows(state.cell, n * PAGE, (n + 1) * PAGE, state.filters)).then((r) => {
      if (g !== gen || !r) return null;
      total = r.total; firstDiv = r.first_div;
      pages.set(n, r.rows);
      spacer.style.height = `${Math.max(total * ROW_H, 1)}px`;
      count.textContent = `${total} rows` + (firstDiv !== null ? ` · first divergent row #${firstDiv}` : "");
      return r.rows;
    });
    pages.set(n, pr);
    return pr;
  }
  function render() {
    const top = scroller.scrollTop, h = scroller.clientHeight || 600;
    const lo = Math.max(Math.floor(top / ROW_H) - 10, 0), hi = Math.min(Math.ceil((top + h) / ROW_H) + 10, total);
    const need = new Set();
    for (let k = Math.floor(lo / PAGE); k <= Math.floor(Math.max(hi - 1, 0) / PAGE); k++) need.add(k);
    const frag = [];
    let missing = false;
    for (let idx = lo; idx < hi; idx++) {
      const pg = pages.get(Math.floor(idx / PAGE));
      if (!Array.isArray(pg)) { missing = true; continue; }
      const r = pg[idx % PAGE];
      if (!r) continue;
      const div = r.i === firstDiv;
      const row = el("div", { class: `vrow ${resultClass(r.result, r.nan_inf)}${div ? " first-div" : ""}`, style: `top:${idx * ROW_H}px`, "data-name": r.name, "data-i": r.i, onclick: () => openRecord(r.record, r.name) });
      for (const [k, , w] of columns()) {
        let v = k === "norm_rel" || k === "max_rel" ? fmt(r[k], true) : k === "ranks" ? ranksText(r.ranks, r.suspects) : fmt(r[k]);
        if (k === "result" && r.nan_inf) v = (v ? v + " " : "") + "NaN/Inf";
        else if (k === "result" && r.masked) v = (v && v !== "masked" ? v + " " : "") + "mask -inf";
        const c = el("div", { class: `vcell${k === "name" || k === "bench_name" ? " mono" : ""}${k.endsWith("ranks") ? " ranks" : ""}`, style: `width:${w}px`, title: k === "name" || k === "err" ? String(r[k] ?? "") : null, text: v });
        if (k === "name" && div) c.prepend(el("span", { class: "badge", text: "first" }));
        row.append(c);
      }
      frag.push(row);
    }
    body.replaceChildren(...frag);
    if (missing) Promise.all([...need].map(fetchPage)).then(() => render());
  }
  async function jumpTo(i) {
    // the position of row i under the current filter: find it by paging (execution order: a direct jump)
    if (state.filters.sort === "order" && state.filters.result === "all" && state.filters.dir === "all" && state.filters.kind === "all" && !state.filters.q) {
      scroller.scrollTop = Math.max(i * ROW_H - 2 * ROW_H, 0);
    } else {
      for (let n = 0; n * PAGE < total; n++) {
        const pg = await fetchPage(n);
        const k = (pg || []).findIndex((r) => r.i === i);
        if (k >= 0) { scroller.scrollTop = Math.max((n * PAGE + k) * ROW_H - 2 * ROW_H, 0); break; }
      }
    }
    render();
  }
  return { reset, render };
})();

function debounce(fn, ms) { let t; return (...a) => { clearTimeout(t); t = setTimeout(() => fn(...a), ms); }; }

// -- model trees: target and bench side by side, expand synced ------------------------------------
// Each side is its dump's own construct.json hierarchy; a node's peer is its counterpart on the other
// side (the record compare matched, or the module of the same name). Expanding or collapsing a node
// does the same to its peer (opening the peer's ancestors first); a node without a peer is marked.
function treeSide(side, boxId) {
  const box = el("div", { class: `tree tree-${side}`, id: boxId });
  const nodes = new Map();
  const self = { side, box, nodes, other: null, gen: 0 };
  function nodeEl(n) {
    const li = el("li", { class: "tnode", "data-name": n.name, "data-peer": n.peer || "" });
    const toggle = el("span", { class: "toggle", text: n.children ? "▸" : "·" });
    const cls = resultClass(n.worst_result, n.nan_inf);
    const line = el("div", { class: `tline ${cls}${n.matched ? "" : " unmatched"}` },
      toggle, el("i", { class: `dot ${cls}` }),
      el("span", { class: "tcol-name mono", title: n.name, text: n.name }),
      n.matched ? null : el("span", { class: "tag-unmatched", text: side === "target" ? "no bench counterpart" : "no target counterpart" }),
      n.ranks ? el("span", { class: "tag-ranks", title: "the ranks holding this record in the merged layout", text: `ranks ${ranksText(n.ranks, n.suspects)}` }) : null,
      el("span", { class: "tcol-err", text: n.nan_inf ? "NaN/Inf" : fmt(n.worst_norm_rel, true) }));
    const kids = el("ul", { class: "tkids", hidden: true });
    li.append(line, kids);
    const entry = { n, li, kids, toggle, line, loaded: false, open: false };
    nodes.set(n.name, entry);
    toggle.addEventListener("click", (e) => { e.stopPropagation(); if (n.children) setOpen(entry, !entry.open, true); });
    line.addEventListener("click", () => {
      const rec = side === "target" ? n.name : n.peer;
      if (n.rows && rec) openRecord(rec); else if (n.children) setOpen(entry, !entry.open, true);
    });
    return li;
  }
  async function setOpen(entry, open, sync) {
    entry.open = open;
    entry.toggle.textContent = open ? "▾" : "▸";
    entry.kids.hidden = !open;
    const work = [];
    if (open && !entry.loaded) {
      entry.loaded = true;
      work.push(guard(() => api.tree(state.cell, entry.n.name, side)).then((r) => { if (r) entry.kids.replaceChildren(...r.nodes.map(nodeEl)); }));
    }
    if (sync && self.other && entry.n.peer) work.push(self.other.follow(entry.n.peer, open));
    await Promise.all(work);
  }
  // the peer's side: open the path down to the node (then the node itself), or close the node
  async function follow(name, open) {
    if (!open) { const entry = nodes.get(name); if (entry && entry.open) await setOpen(entry, false, false); return; }
    const path = await openPath(name, true);
    const entry = path && nodes.get(name);
    if (entry && entry.n.children && !entry.open) await setOpen(entry, true, false);
  }
  async function openPath(name, quiet = false) {
    // quiet when following the other side: a peer a bounded report left out is not an error
    const r = quiet ? await api.treePath(state.cell, name, side).catch(() => null) : await guard(() => api.treePath(state.cell, name, side));
    if (!r) return null;
    for (const up of r.path.slice(0, -1)) {
      const entry = nodes.get(up);
      if (!entry) return null;
      if (!entry.open) await setOpen(entry, true, false);
    }
    return r.path;
  }
  async function load() {
    const g = ++self.gen;
    nodes.clear();
    box.replaceChildren();
    const r = await guard(() => api.tree(state.cell, null, side));
    if (!r || g !== self.gen) return null;
    box.replaceChildren(el("ul", { class: "troot" }, ...r.nodes.map(nodeEl)));
    return r;
  }
  async function mark(name) {
    for (const e of box.querySelectorAll(".hl, .on-path")) e.classList.remove("hl", "on-path");
    const path = await openPath(name);
    if (!path) return false;
    for (const up of path.slice(0, -1)) nodes.get(up).line.classList.add("on-path");
    const last = nodes.get(name);
    if (last) { last.line.classList.add("hl"); last.line.scrollIntoView({ block: "center" }); }
    return !!last;
  }
  function clear() { self.gen++; nodes.clear(); box.replaceChildren(); }
  Object.assign(self, { load, follow, mark, clear });
  return self;
}

const tree = (() => {
  const bar = el("div", { class: "filters" });
  const input = el("input", { type: "search", id: "tree-search", placeholder: "search a module or API" });
  const hits = el("ul", { class: "hits", id: "tree-hits" });
  input.addEventListener("input", debounce(async () => {
    const q = input.value.trim();
    hits.replaceChildren();
    if (!q) return;
    const r = await guard(() => api.search(state.cell, q));
    if (!r) return;
    hits.replaceChildren(...r.hits.map((h) => el("li", { class: "clickable mono", onclick: () => reveal(h.record), text: h.record })));
  }, 250));
  const legend = el("span", { class: "legend" }, ...[["r-pass", "pass"], ["r-warning", "warning"], ["r-error", "error"], ["r-nan", "NaN/Inf"]]
    .map(([c, t]) => el("span", { class: "chip" }, el("i", { class: `dot ${c}` }), t)),
    el("span", { class: "chip" }, el("span", { class: "tag-unmatched", text: "no counterpart" })),
    el("span", { class: "hint", text: "colour: the worst result below each node · expanding one side expands the other" }));
  bar.append(input, legend);
  const target = treeSide("target", "tree");
  const bench = treeSide("bench", "tree-bench");
  target.other = bench; bench.other = target;
  const head = (title, sub) => el("div", { class: "thead" }, el("span", { class: "tcol-name", text: title }), el("span", { class: "hint", text: sub }), el("span", { class: "tcol-err", text: "worst rel. Norm err" }));
  const targetCol = el("div", { class: "tree-col" }, head("target", ""), target.box);
  const benchCol = el("div", { class: "tree-col", id: "bench-col" }, head("bench", ""), bench.box);
  const pair = el("div", { class: "tree-pair" }, targetCol, benchCol);
  const benchOnly = el("div", { class: "bench-only", id: "bench-only" });
  panes.tree.append(bar, hits, pair, benchOnly);

  // the trees of a cell are built on the server when first asked for: only when the view opens
  let loadedCell = null;
  function invalidate() { loadedCell = null; target.clear(); bench.clear(); benchOnly.replaceChildren(); if (state.view === "tree") load(); }
  async function ensure() { if (loadedCell !== state.cell) await load(); }
  async function load() {
    loadedCell = state.cell;
    benchCol.hidden = !state.meta.has_bench;
    pair.classList.toggle("single", !state.meta.has_bench);
    const [r] = await Promise.all([target.load(), state.meta.has_bench ? bench.load() : null]);
    benchOnly.replaceChildren();
    if (r && r.bench_only && r.bench_only.length) {
      benchOnly.append(el("h4", { text: `bench records without a target counterpart (${r.bench_only.length})` }),
        el("ul", {}, ...r.bench_only.map((b) => el("li", { class: "mono unmatched", text: b }))));
    }
  }
  async function reveal(record) {
    await ensure();
    const found = await target.mark(record);
    if (found && state.meta.has_bench) {
      const entry = target.nodes.get(record);
      for (const e of bench.box.querySelectorAll(".hl, .on-path")) e.classList.remove("hl", "on-path");
      if (entry && entry.n.peer) await bench.mark(entry.n.peer);
    }
    show("tree");
  }
  return { load, reveal, invalidate, ensure, target, bench };
})();
window.__msprobe.tree = tree;

// -- trends ---------------------------------------------------------------------------------------
const trends = (() => {
  const nameIn = el("input", { type: "text", id: "trend-name", placeholder: "a row name, e.g. Functional.linear.0.forward.output.0", size: 60 });
  const statSel = el("select", { id: "trend-stat" });  // its options: the server's statistics (setStats, once meta is in)
  const stepSel = el("select", { id: "spread-step" });
  const box = el("div", { class: "chart", id: "trend-chart" });
  const spread = el("div", { class: "chart short", id: "spread-chart" });
  const exports = (key, name) => el("span", { class: "exports" },
    el("button", { onclick: () => exportChart(key, name, "png"), text: "PNG" }), el("button", { onclick: () => exportChart(key, name, "svg"), text: "SVG" }));
  panes.trends.append(el("div", { class: "filters" }, nameIn, statSel, el("button", { onclick: () => load(nameIn.value.trim(), statSel.value), text: "Show" }), exports("trend", "trend")),
    box, el("div", { class: "filters" }, el("span", { text: "spread across ranks at step " }), stepSel, exports("spread", "spread")), spread);
  statSel.addEventListener("change", () => load(nameIn.value.trim(), statSel.value));
  stepSel.addEventListener("change", () => drawSpread());
  let last = null;
  async function load(name, stat) {
    if (!name) return;
    state.trendName = name; state.trendStat = stat;
    nameIn.value = name; statSel.value = stat;
    const r = await guard(() => api.trend(name, stat));
    if (!r) return;
    last = r;
    const num = (v) => (typeof v === "number" ? v : v === "NaN" || v === "Inf" || v === "-Inf" ? null : v);
    const series = [];
    const many = r.series.length > 16;
    for (const s of r.series.slice(0, 64)) {
      series.push({ name: `${s.rank} target`, type: "line", showSymbol: !many, data: s.points.map((p) => [p.step, num(p.target)]) });
      if (state.meta.has_bench) series.push({ name: `${s.rank} bench`, type: "line", showSymbol: !many, lineStyle: { type: "dashed" }, data: s.points.map((p) => [p.step, num(p.bench)]) });
    }
    const chart = charts.trend || (charts.trend = echarts.init(box));
    chart.setOption({ animation: false, title: { show: false },
      tooltip: { trigger: "axis", formatter: (pts) => pts.map((p) => `${esc(p.seriesName)}: ${esc(fmt(p.value[1]))}`).join("<br>") },
      legend: { type: "scroll", top: 0 }, grid: { left: 70, right: 30, top: 40, bottom: 40 },
      xAxis: { type: "value", name: "step", nameLocation: "middle", nameGap: 26, minInterval: 1 }, yAxis: { type: "value", name: stat, scale: true }, series }, true);
    stepSel.replaceChildren(...r.steps.map((s) => el("option", { value: s, text: s })));
    const cur = state.meta.cells.find((c) => c.cell === state.cell);
    if (cur && r.steps.includes(cur.step)) stepSel.value = String(cur.step);
    drawSpread();
    show("trends");
  }
  function drawSpread() {
    if (!last) return;
    const step = Number(stepSel.value);
    const ranks = [], tv = [], bv = [];
    for (const s of last.series) {
      const p = s.points.find((x) => x.step === step);
      if (!p) continue;
      ranks.push(s.rank); tv.push(typeof p.target === "number" ? p.target : null); bv.push(typeof p.bench === "number" ? p.bench : null);
    }
    const chart = charts.spread || (charts.spread = echarts.init(spread));
    chart.setOption({ animation: false, tooltip: { trigger: "axis" }, legend: { top: 0 }, grid: { left: 70, right: 30, top: 30, bottom: 40 },
      xAxis: { type: "category", data: ranks }, yAxis: { type: "value", scale: true },
      series: [{ name: "target", type: "bar", data: tv }, ...(state.meta.has_bench ? [{ name: "bench", type: "bar", data: bv }] : [])] }, true);
  }
  // the trend's statistic choices: the server's statistics (format.stats.STATISTICS), the Norm first
  function setStats(columns) {
    const ordered = [...columns.filter((c) => c === "norm"), ...columns.filter((c) => c !== "norm")];
    statSel.replaceChildren(...ordered.map((s) => el("option", { value: s, text: s })));
    if (ordered.includes(state.trendStat)) statSel.value = state.trendStat;
  }
  return { load, setStats };
})();

function exportChart(key, name, kind) {
  const chart = charts[key];
  if (!chart) return;
  if (kind === "png") { download(`${name}.png`, chart.getDataURL({ type: "png", pixelRatio: 2, backgroundColor: "#fff" })); return; }
  const div = el("div", { style: `width:${chart.getWidth()}px;height:${chart.getHeight()}px;position:absolute;left:-10000px` });
  document.body.append(div);
  const svg = echarts.init(div, null, { renderer: "svg" });
  svg.setOption({ ...chart.getOption(), animation: false });
  download(`${name}.svg`, svg.getDataURL({ type: "svg" }));
  svg.dispose(); div.remove();
}

// -- cluster view (frontend/src/cluster.js) --------------------------------------------------------
const cluster = makeCluster({ el, api, state, pane: panes.cluster, guard, openCell, openRecord, cellLabel, changed: () => remember(),
  openList: (cell, result) => {  // a cell's list under one result filter (the others as they are)
    state.filters.result = result;
    for (const e of document.querySelectorAll("[data-filter=result]")) e.value = result;
    if (cell !== state.cell) openCell(cell, "list"); else { list.reset(); show("list"); }
  } });
window.__msprobe.cluster = cluster;

// -- record detail -----------------------------------------------------------------------------
async function openRecord(record, rowName) {
  state.record = record;
  state.row = rowName || null;
  const r = await guard(() => api.record(state.cell, record));
  if (!r) return;
  const p = panes.record;
  const cur = state.meta.cells.find((c) => c.cell === state.cell);
  const stats = statColumns();
  const table = el("table", { class: "grid args", id: "record-args" },
    el("thead", {}, el("tr", {}, ...["argument", "result", "dtype", "shape", ...stats.map((s) => "target " + s), ...stats.map((s) => "bench " + s), "rel. Norm err", "cosine", "md5 target", "md5 bench", ""].map((h) => el("th", { text: h })))),
    el("tbody", {}, ...r.args.map((a) => el("tr", { class: `${resultClass(a.result, a.nan_inf)}${a.name === rowName ? " hl" : ""}`, "data-name": a.name },
      el("td", { class: "mono", text: a.name.slice(record.length + 1) || a.name }), el("td", { text: (a.result || "") + (a.nan_inf ? " NaN/Inf" : a.masked ? " mask -inf" : "") }),
      el("td", { text: a.npu_dtype + (a.bench_dtype && a.bench_dtype !== a.npu_dtype ? " | " + a.bench_dtype : "") }), el("td", { text: a.npu_shape }),
      ...stats.map((s) => el("td", { class: "num", text: fmt(a["npu_" + s]) })), ...stats.map((s) => el("td", { class: "num", text: fmt(a["bench_" + s]) })),
      el("td", { class: "num", text: fmt(a.norm_rel, true) }), el("td", { class: "num", text: fmt(a.cosine) }),
      el("td", { class: "mono", text: a.npu_md5 || "" }), el("td", { class: "mono", text: a.bench_md5 || "" }),
      el("td", {}, el("button", { onclick: () => trends.load(a.name, state.trendStat), text: "trend" }),
        a.data_name ? el("button", { onclick: () => showTensor(a.name), text: "tensor" }) : null)))));
  const err = r.args.map((a) => a.err).filter((e) => e && !["N/A", "None", "[]", "", "nan"].includes(String(e).trim()));
  p.replaceChildren(
    el("h2", { class: "mono", id: "record-name", text: record }),
    el("div", { class: "facts" }, el("span", { text: cur ? cellLabel(cur) : "" }),
      r.args[0].ranks ? el("span", { class: "tag-ranks", id: "record-ranks", text: `held by ranks ${ranksText(r.args[0].ranks, r.args[0].suspects)}${r.args[0].bench_ranks ? ` · bench ranks ${r.args[0].bench_ranks}` : ""}` }) : null,
      el("button", { id: "show-in-tree", onclick: () => tree.reveal(record), text: "Show in model tree" }),
      el("button", { onclick: () => trends.load(r.args[r.args.length - 1].name, state.trendStat), text: "Trend of its last output" })),
    el("div", { class: "hscroll" }, table),
    err.length ? el("div", { class: "errs" }, ...[...new Set(err)].map((e) => el("div", { class: "mono", text: e }))) : null,
    el("div", { class: "tensor", id: "tensor-box" }),
    el("h3", { text: "Stack" }),
    el("pre", { class: "stack", id: "record-stack", text: r.stack && r.stack.length ? r.stack.join("\n") : "(no stack recorded)" }));
  show("record");
}

async function showTensor(name) {
  const box = document.getElementById("tensor-box");
  box.replaceChildren(el("h3", { text: "Tensor " + name }));
  for (const side of state.meta.has_bench ? ["target", "bench"] : ["target"]) {
    const t = await guard(() => api.tensor(state.cell, name, side));
    if (!t) continue;
    if (!t.available) { box.append(el("div", { class: "hint", text: `${side}: ${t.why}` })); continue; }
    const c = el("div", { class: "chart short" });
    const part = t.elements_read < t.elements ? ` · histogram of the first ${t.elements_read} of ${t.elements} values (read by range)` : "";
    box.append(el("div", { text: `${side}: ${t.dtype} ${JSON.stringify(t.shape)} · NaN ${t.nan} · Inf ${t.inf}${part}` }), c,
      el("pre", { class: "preview", text: t.preview.map((v) => fmt(v)).join("  ") }));
    const h = t.histogram;
    const ch = echarts.init(c);
    ch.setOption({ animation: false, grid: { left: 60, right: 20, top: 10, bottom: 30 }, tooltip: {},
      xAxis: { type: "category", data: h.counts.map((_, k) => fmt((h.edges[k] + h.edges[k + 1]) / 2)) }, yAxis: { type: "value" },
      series: [{ type: "bar", data: h.counts }] });
  }
}

// -- start ---------------------------------------------------------------------------------------
// msprobe view serves the page while it builds the view: until its data is ready the page shows the
// set-up's stages and their times, asking again every half second (a failed set-up: its error)
async function firstAnswers() {
  let box = null;
  for (;;) {
    try {
      const answers = await Promise.all([api.meta(), api.overview()]);
      if (box) box.remove();
      return answers;
    } catch (e) {
      if (!e.loading) throw e;
      const l = e.loading;
      if (!box) { box = el("div", { class: "loading", id: "loading" }); main.prepend(box); }
      box.replaceChildren(el("h2", { text: l.error ? "The view could not be built" : "Building the view…" }),
        el("div", { class: "hint", text: l.error ? l.error : `${l.elapsed_s} s since msprobe view started` }),
        el("ol", {}, ...l.stages.map(([name, t], k) => el("li", { class: k === l.stages.length - 1 && !l.error ? "current" : "done", text: `${name} (${t} s)` }))));
      setStatus(l.error ? l.error : `building the view: ${l.stage}`, !!l.error);
      if (l.error) throw e;
      await new Promise((res) => setTimeout(res, 200));
    }
  }
}

// msprobe view serves a first look (a pair's first records compared, a lake's cells counted from its
// index) while it builds the whole view: a banner says so and what is being built; once the whole view
// is ready the page takes it in place (the same cell, tab and record)
async function whileFirstLook() {
  const box = el("div", { class: "first-look", id: "first-look" });
  main.prepend(box);
  for (;;) {
    let p = null;
    try { p = await api.progress(); } catch (e) { p = null; }
    if (p && p.error) {
      box.replaceChildren(el("b", { text: "The view could not be built" }), " ", el("span", { text: p.error }));
      setStatus(p.error, true);
      return;
    }
    if (p && !p.loading) break;
    box.replaceChildren(el("b", { text: "First look" }), " ", el("span", { text: state.meta.first_look.note }),
      el("span", { class: "hint", id: "first-look-stage", text: p ? ` · ${p.stage} (${p.elapsed_s} s since msprobe view started)` : "" }));
    await new Promise((res) => setTimeout(res, 1000));
  }
  const [meta, ov] = await Promise.all([api.meta(), api.overview()]);
  const was = state.meta.cells.find((c) => c.cell === state.cell);
  const same = was && meta.cells.find((c) => (c.run ?? "") === (was.run ?? "") && c.step === was.step && c.rank_dir === was.rank_dir);
  state.meta = meta; state.overview = ov;
  trends.setStats(statColumns());
  box.remove();
  applying++;
  try {
    renderOverview();
    openCell(same ? same.cell : ov.first_cell !== null ? ov.first_cell : (meta.cells[0] || { cell: 0 }).cell, null);
    cluster.invalidate();
    if (state.view === "record" && state.record) await openRecord(state.record, state.row);
    else show(state.view);
  } finally {
    applying--;
  }
  setStatus("the whole view is ready");
  document.body.setAttribute("data-whole", "1");
}

async function start() {
  const t0 = performance.now();
  header.append(el("span", { class: "brand", text: "msprobe" }), el("span", { class: "title", id: "title" }), tabs, cellBadge,
    el("span", { class: "mode", text: api.mode === "report" ? "report" : "live" }));
  mark("start");
  const [meta, ov] = await firstAnswers();
  mark("data");
  if (!meta || !ov) return;
  state.meta = meta; state.overview = ov;
  trends.setStats(statColumns());
  document.getElementById("title").textContent = meta.title || "";
  document.title = "msprobe · " + (meta.title || "");
  // a link opens its view; else the overview and the first divergent cell
  const link = window.location.hash;
  applying++;
  show("overview");
  // the first cell's list is asked for before the heatmap is drawn: the server answers meanwhile
  const firstCell = ov.first_cell !== null ? ov.first_cell : (meta.cells[0] || { cell: 0 }).cell;
  openCell(firstCell, null);
  renderOverview();
  applying--;
  mark("overview");
  const ms = Math.round(performance.now() - t0);
  setStatus(`ready in ${ms} ms`);
  if (!(await follow(link))) window.history.replaceState(null, "", linkOf());
  document.body.setAttribute("data-ready", String(Math.round(performance.now() - t0)));
  if (meta.first_look) whileFirstLook();
  else document.body.setAttribute("data-whole", "1");
}
start().catch((e) => setStatus(String(e.message || e), true));
window.addEventListener("resize", () => resizeCharts());
