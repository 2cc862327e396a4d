// Where the page's data comes from: the msprobe view server (paged endpoints), or the data
// embedded in a msprobe report page (the same answers computed here over the bounded tables).

const FILTER_KEYS = ["dir", "kind", "result", "sort", "q"];

export function makeApi() {
  const embedded = document.getElementById("msprobe-data");
  if (embedded) return new LocalApi(JSON.parse(embedded.textContent));
  return new ServerApi();
}

class ServerApi {
  constructor() {
    const u = new URL(window.location.href);
    this.token = u.searchParams.get("token") || "";
    if (this.token) { u.searchParams.delete("token"); window.history.replaceState(null, "", u.toString()); }
    this.mode = "server";
  }
  async get(path, params = {}) {
    const u = new URL(path, window.location.href);
    for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null) u.searchParams.set(k, String(v));
    const r = await fetch(u, { headers: { "X-Msprobe-Token": this.token }, credentials: "same-origin" });
    const body = await r.json();
    // the server is still building the view (msprobe view's set-up): its progress, asked again later
    if (body && body.loading) throw Object.assign(new Error(body.error || `building the view: ${body.stage}`), { loading: body });
    if (!r.ok) throw new Error(body.error || r.statusText);
    return body;
  }
  meta() { return this.get("api/meta"); }
  overview() { return this.get("api/overview"); }
  // the set-up's progress while a first look is served ({loading: false} once the view is whole)
  async progress() {
    const r = await fetch(new URL("api/progress", window.location.href), { headers: { "X-Msprobe-Token": this.token }, credentials: "same-origin" });
    return await r.json();
  }
  rows(cell, begin, end, f) { return this.get("api/rows", { cell, begin, end, ...pick(f) }); }
  tree(cell, node, side = "target") { return this.get("api/tree", { cell, node: node || "", side }); }
  treePath(cell, record, side = "target") { return this.get("api/tree_path", { cell, record, side }); }
  search(cell, q) { return this.get("api/search", { cell, q }); }
  record(cell, record) { return this.get("api/record", { cell, record }); }
  trend(name, stat) { return this.get("api/trend", { name, stat }); }
  cluster(cell, laneBegin, laneEnd) { return this.get("api/cluster", { cell, lane_begin: laneBegin, lane_end: laneEnd }); }
  tensor(cell, name, side) { return this.get("api/tensor", { cell, name, side }); }
  async csv(cell, f) {
    const u = new URL("api/export.csv", window.location.href);
    u.searchParams.set("cell", cell);
    for (const [k, v] of Object.entries(pick(f))) u.searchParams.set(k, v);
    const r = await fetch(u, { headers: { "X-Msprobe-Token": this.token } });
    return await r.text();
  }
}

function pick(f) {
  const out = {};
  for (const k of FILTER_KEYS) if (f && f[k] !== undefined && f[k] !== "") out[k] = f[k];
  return out;
}

const SEV = { error: 3, warning: 2, pass: 1 };

class LocalApi {
  constructor(bundle) {
    this.b = bundle;
    this.mode = "report";
    this.cols = bundle.columns;
    this.byCell = {};
    for (const [cell, rows] of Object.entries(bundle.rows)) {
      this.byCell[cell] = rows.map((r) => Object.fromEntries(this.cols.map((c, i) => [c, r[i]])));
    }
  }
  async meta() { return this.b.meta; }
  async overview() { return this.b.overview; }
  divergent(r) {
    if (this.b.threshold !== null && this.b.threshold !== undefined) return r.norm_rel !== null && r.norm_rel > this.b.threshold;
    return (r.result && !["pass", "", "n/a"].includes(r.result)) || r.nan_inf;
  }
  filtered(cell, f) {
    let rows = this.byCell[cell] || [];
    if (f.dir && f.dir !== "all") rows = rows.filter((r) => r.dir === f.dir);
    if (f.kind && f.kind !== "all") rows = rows.filter((r) => r.kind === f.kind);
    if (f.result === "divergent") rows = rows.filter((r) => this.divergent(r));
    else if (f.result === "nan_inf") rows = rows.filter((r) => r.nan_inf);
    else if (f.result === "masked") rows = rows.filter((r) => r.masked);
    else if (f.result === "unmatched") rows = rows.filter((r) => !r.bench_name || r.bench_name === "N/A");
    if (f.q) { const q = f.q.toLowerCase(); rows = rows.filter((r) => r.name.toLowerCase().includes(q)); }
    const s = f.sort || "order";
    if (s === "score") rows = [...rows].sort((a, b) => b.score - a.score || a.i - b.i);
    else if (s === "norm_rel") rows = [...rows].sort((a, b) => (b.norm_rel ?? -1) - (a.norm_rel ?? -1) || a.i - b.i);
    else if (s === "name") rows = [...rows].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : a.i - b.i));
    return rows;
  }
  async rows(cell, begin, end, f) {
    const rows = this.filtered(cell, f);
    const all = this.byCell[cell] || [];
    const first = all.find((r) => this.divergent(r));
    return { total: rows.length, begin, rows: rows.slice(begin, end), first_div: first ? first.i : null };
  }
  sideTree(cell, side) {
    const t = (side === "bench" ? this.b.bench_trees || {} : this.b.trees)[cell];
    if (!t) throw new Error(`no ${side} tree in this report`);
    return t;
  }
  async tree(cell, node, side = "target") {
    const t = this.sideTree(cell, side);
    const kids = (t.children[node || ""] || []).map((n) => t.nodes[n]);
    const out = { parent: node || null, total: kids.length, begin: 0, nodes: kids };
    if (!node) out.bench_only = t.bench_only;
    return out;
  }
  async treePath(cell, record, side = "target") {
    const t = this.sideTree(cell, side);
    const up = {};
    for (const [p, kids] of Object.entries(t.children)) for (const k of kids) up[k] = p;
    const path = [];
    let cur = record;
    while (cur && !path.includes(cur)) { path.push(cur); cur = up[cur]; }
    if (!t.nodes[record]) throw new Error("no record in the tree");
    return { path: path.reverse() };
  }
  async search(cell, q) {
    const seen = new Map();
    const ql = q.toLowerCase();
    for (const r of this.byCell[cell] || []) {
      if (r.record.toLowerCase().includes(ql) && !seen.has(r.record)) seen.set(r.record, { record: r.record, i: r.i, score: r.score });
      if (seen.size >= 50) break;
    }
    return { hits: [...seen.values()] };
  }
  async record(cell, record) {
    const args = (this.byCell[cell] || []).filter((r) => r.record === record);
    if (!args.length) throw new Error("no record in this cell");
    const stack = (this.b.stacks[cell] || {})[record];
    return { record, args, stack: stack !== undefined ? this.b.stack_texts[stack] : [] };
  }
  async trend(name, stat) {
    const series = {};
    const steps = new Set();
    for (const c of this.b.meta.cells) {
      const r = (this.byCell[c.cell] || []).find((x) => x.name === name);
      if (!r) continue;
      const key = (c.run ? c.run + "/" : "") + c.rank_dir;
      (series[key] = series[key] || { rank: key, points: [] }).points.push({ step: c.step, target: r["npu_" + stat], bench: r["bench_" + stat] });
      steps.add(c.step);
    }
    return { name, stat, steps: [...steps].sort((a, b) => a - b), series: Object.values(series) };
  }
  // the report holds each step's first lanes (msprobe report's bound): a page is sliced from them
  async cluster(cell, laneBegin, laneEnd) {
    const key = (this.b.cluster_of || {})[cell];
    const whole = key !== undefined ? this.b.clusters[key] : null;
    if (!whole) throw new Error("this report holds no cluster view of this step");
    if (whole.error) throw new Error(whole.error);
    const lo = Math.max(laneBegin - whole.lane_begin, 0), hi = Math.max(laneEnd - whole.lane_begin, lo);
    const lanes = whole.lanes.slice(lo, hi);
    const held = whole.lane_end;
    return { ...whole, lanes, lane_begin: whole.lane_begin + lo, lane_end: whole.lane_begin + lo + lanes.length,
      note: [whole.note, held < whole.ranks_total ? `this report holds the first ${held} of ${whole.ranks_total} ranks' lanes; msprobe view shows every rank` : null].filter(Boolean).join(" · ") || null };
  }
  async tensor() { return { available: false, why: "a report holds no tensor data; use msprobe view" }; }
  async csv(cell, f) {
    const rows = this.filtered(cell, { ...f, sort: "order" });
    const esc = (v) => {
      if (v === null || v === undefined) return "";
      let s = String(v);
      if (/^[=+\-@\t\r]/.test(s)) s = "'" + s;
      return /[",\n\r]/.test(s) ? '"' + s.replace(/"/g, '""') + '"' : s;
    };
    return [this.b.csv_fields.join(","), ...rows.map((r) => this.b.csv_fields.map((k) => esc(r[k])).join(","))].join("\n") + "\n";
  }
}

export { SEV };
