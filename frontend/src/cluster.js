// The cluster view of one step: its ranks as lanes (a page of them), each lane's communication calls
// and anomalous records laid out in the step's communication order (the graph's levels: a level is a
// column group, so matched collectives line up and a send sits left of its receive), matched
// point-to-point calls as arrows, collectives as a bar through their members, the first anomaly ringed
// and its propagation path drawn over them. Names come from dumps: set as SVG text/attributes only.
//
// At the size of a real run (20,000 records a rank, most of them NaN after a NaN) a lane draws its
// communication calls, the anomaly and its path, and each run of anomalous records between them as
// one mark with its count (a click expands it into its records). The lane labels stay put (sticky)
// while the lanes scroll; the view opens zoomed and scrolled so that the anomaly and its whole path
// are on screen; a minimap shows the whole step and the window on it; only the columns near the
// window are in the DOM (it is painted again as the lanes scroll), so a long step costs no more nodes
// than a short one.

const SVGNS = "http://www.w3.org/2000/svg";
const COL_W = 30, LANE_H = 70, LABEL_W = 200, TOP = 30, PAD = 16, PAGE_LANES = 16;
const ZOOM_MIN = 0.02, ZOOM_MAX = 3;

function svg(tag, attrs = {}, text) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== undefined && v !== null && v !== false) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}

function resultOf(n) {
  return n.nan_inf || n.result === "nan_inf" ? "r-nan" : n.result === "error" ? "r-error" : n.result === "warning" ? "r-warning" : n.comm ? "r-comm" : "r-none";
}
function nodeClass(n) { return `cl-node k-${n.comm ? "comm" : n.kind === "run" ? "run" : "anomaly"} ${resultOf(n)}`; }
const COLORS = { "r-nan": "#7b2cbf", "r-error": "#e4572e", "r-warning": "#f2c14e", "r-comm": "#2563eb", "r-none": "#9ca3af" };

// the items of a lane: a node takes one column; an expanded run its mark and one column per member
function items(lane, expanded) {
  const out = [];
  for (const n of lane.nodes) {
    out.push({ n, key: `${lane.rank}:${n.i}` });
    if (n.kind === "run" && expanded.has(`${lane.rank}:${n.i}`)) {
      for (const m of n.members || []) out.push({ n: { ...m, level: n.level, member: true }, key: `${lane.rank}:${m.i}` });
      const rest = n.count - (n.members || []).length;
      if (rest > 0) out.push({ n: { kind: "more", i: n.i, count: rest, level: n.level, member: true }, key: `${lane.rank}:${n.i}:more` });
    }
  }
  return out;
}

// columns: each level gets as many as its widest lane needs; an item's column is its level's offset
// plus its place among its lane's items of that level
function layout(lanes, expanded) {
  const width = new Map();
  const laneItems = lanes.map((lane) => items(lane, expanded));
  for (const its of laneItems) {
    const count = new Map();
    for (const it of its) count.set(it.n.level, (count.get(it.n.level) || 0) + 1);
    for (const [lv, c] of count) width.set(lv, Math.max(width.get(lv) || 0, c));
  }
  const levels = [...width.keys()].sort((a, b) => a - b);
  const offset = new Map();
  let x = 0;
  for (const lv of levels) { offset.set(lv, x); x += width.get(lv) + 1; }
  const col = new Map();
  laneItems.forEach((its, k) => {
    const used = new Map();
    for (const it of its) {
      const at = used.get(it.n.level) || 0;
      used.set(it.n.level, at + 1);
      it.col = offset.get(it.n.level) + at;
      it.lane = k;
      col.set(it.key, [it.col, k]);
    }
  });
  return { laneItems, col, levels, offset, cols: x };
}

export function makeCluster(ctx) {
  const { el, api, state, pane, guard, openCell, openRecord, cellLabel, changed, openList } = ctx;
  const stepSel = el("select", { id: "cluster-step" });
  const prev = el("button", { id: "cluster-prev", text: "◀ ranks" });
  const next = el("button", { id: "cluster-next", text: "ranks ▶" });
  const toAnomaly = el("button", { id: "cluster-to-anomaly", text: "Lanes of the anomaly" });
  const range = el("span", { class: "hint", id: "cluster-range" });
  const zoomOut = el("button", { id: "cluster-zoom-out", title: "zoom out (ctrl + wheel)", text: "−" });
  const zoomIn = el("button", { id: "cluster-zoom-in", title: "zoom in (ctrl + wheel)", text: "+" });
  const zoomFit = el("button", { id: "cluster-zoom-fit", text: "Whole step" });
  const zoomPath = el("button", { id: "cluster-zoom-path", text: "Anomaly & path" });
  const zoomLabel = el("span", { class: "hint", id: "cluster-zoom" });
  const legend = el("span", { class: "legend" },
    ...[["r-comm", "communication"], ["r-nan", "NaN/Inf"], ["r-error", "error"], ["r-warning", "warning"]].map(([c, t]) => el("span", { class: "chip" }, el("i", { class: `dot ${c}` }), t)),
    el("span", { class: "chip" }, el("i", { class: "pill" }), "a run of anomalous records (click: expand)"),
    el("span", { class: "chip" }, el("i", { class: "dot ring" }), "anomaly"), el("span", { class: "chip" }, el("i", { class: "bar-path" }), "its path"));
  const facts = el("div", { class: "facts cluster-facts", id: "cluster-facts" });
  const minimap = el("canvas", { class: "cluster-minimap", id: "cluster-minimap", height: 44, title: "the whole step: click or drag to move the window" });
  const labels = el("div", { class: "cluster-labels", id: "cluster-labels" });
  const plot = svg("svg", { class: "cluster-svg", id: "cluster-svg" });
  const inner = el("div", { class: "cluster-inner" }, labels, plot);
  const box = el("div", { class: "cluster-box", id: "cluster-box" }, inner);
  pane.append(el("div", { class: "filters" }, el("label", {}, "step ", stepSel), prev, range, next, toAnomaly,
    el("span", { class: "zoom" }, zoomOut, zoomLabel, zoomIn, zoomFit, zoomPath)), legend, facts, minimap, box);
  let loaded = null, begin = 0, last = null, lay = null, zoom = 1, painted = null, expanded = new Set(), pending = false;

  function steps() {
    const seen = new Map();
    for (const c of state.meta.cells) {
      const key = `${c.run ?? ""}|${c.step ?? ""}`;
      if (!seen.has(key)) seen.set(key, c);
    }
    return seen;
  }
  function stepKey(cell) { const c = state.meta.cells.find((x) => x.cell === cell); return c ? `${c.run ?? ""}|${c.step ?? ""}` : ""; }
  function fillSteps() {
    if (stepSel.options.length) return;
    for (const [key, c] of steps()) stepSel.append(el("option", { value: c.cell, "data-key": key, text: `${c.run ? c.run + " / " : ""}step ${c.step ?? "-"}` }));
    // another step: its first cell becomes the page's cell (the list, the tree and the badge follow)
    stepSel.addEventListener("change", () => { openCell(Number(stepSel.value), null); load(Number(stepSel.value), null); });
  }
  // the cluster of the page's cell; ``lanes``: the first lane to show (null: the anomaly's page)
  async function ensure(lanes = null) {
    fillSteps();
    const key = stepKey(state.cell);
    if (key !== loaded || (lanes !== null && lanes !== begin)) await load(state.cell, lanes);
    else paint(true);  // shown again: the window as it is now (nothing is painted while hidden)
  }
  async function load(cell, laneBegin) {
    loaded = stepKey(cell);
    const first = laneBegin === null || laneBegin === undefined;
    begin = first ? 0 : Math.max(laneBegin, 0);
    for (const o of stepSel.options) if (o.dataset.key === loaded) stepSel.value = o.value;
    let r = await guard(() => api.cluster(cell, begin, begin + PAGE_LANES));
    if (!r || stepKey(cell) !== loaded) return;
    // a step opens on the page of lanes that holds its anomaly
    if (first && r.anomaly_lane !== null && r.anomaly_lane !== undefined && (r.anomaly_lane < r.lane_begin || r.anomaly_lane >= r.lane_end)) {
      begin = Math.floor(r.anomaly_lane / PAGE_LANES) * PAGE_LANES;
      r = await guard(() => api.cluster(cell, begin, begin + PAGE_LANES));
      if (!r || stepKey(cell) !== loaded) return;
    }
    last = { cell, r };
    expanded = new Set();
    draw(r, true);
    if (changed) changed();
  }
  prev.addEventListener("click", () => { if (last) load(last.cell, Math.max(begin - PAGE_LANES, 0)); });
  next.addEventListener("click", () => { if (last && begin + PAGE_LANES < last.r.ranks_total) load(last.cell, begin + PAGE_LANES); });
  toAnomaly.addEventListener("click", () => { if (last && last.r.anomaly_lane !== null) load(last.cell, Math.floor(last.r.anomaly_lane / PAGE_LANES) * PAGE_LANES); });

  function open(lane, n) { openCell(lane.cell, null); openRecord(n.record, n.row || null); }

  function drawFacts(r) {
    const a = r.anomaly;
    const lane = a ? (r.summary || []).find((l) => l.rank === a.rank) : null;
    facts.replaceChildren(...[
      el("div", { class: "fact" }, el("b", { text: "Step" }), ` ${r.step ?? "-"}${r.run ? " of " + r.run : ""} · ${r.ranks_total} ranks · communication levels ${r.levels}`),
      el("div", { class: "fact anomaly-fact", id: "cluster-anomaly" }, el("b", { text: a ? a.label : "No anomaly" }), " ",
        a && lane ? el("a", { href: "#", onclick: (e) => { e.preventDefault(); open(lane, { record: a.record, row: a.row }); }, text: `${a.rank_dir} · ${a.record}${a.row && a.row !== a.record ? " · " + a.row.slice(a.record.length + 1) : ""}` })
          : el("span", { text: "on this step" })),
      a && a.path_text ? el("div", { class: "fact path-fact mono", id: "cluster-path", text: a.path_text }) : null,
      ...(r.marks || []).slice(1).map((m) => el("div", { class: "fact hint", "data-mark": m.key }, el("b", { text: m.label }), ` ${m.rank_dir} · ${m.record}`)),
      r.note ? el("div", { class: "fact hint", text: r.note }) : null].filter(Boolean));
    range.textContent = `ranks ${r.lane_begin}–${Math.max(r.lane_end - 1, r.lane_begin)} of ${r.ranks_total}`;
    prev.disabled = r.lane_begin <= 0;
    next.disabled = r.lane_end >= r.ranks_total;
    toAnomaly.hidden = !a || r.anomaly_lane === null || (r.anomaly_lane >= r.lane_begin && r.anomaly_lane < r.lane_end);
  }

  // plot coordinates of a column and a lane at the current zoom
  const X = (c) => PAD + (c + 0.5) * COL_W * zoom;
  const Y = (k) => TOP + k * LANE_H + LANE_H / 2;
  const at = (rank, i) => { const p = lay && lay.col.get(`${rank}:${i}`); return p ? [X(p[0]), Y(p[1])] : null; };
  const plotWidth = () => Math.max(box.clientWidth - LABEL_W, 200);

  function drawLabels(r) {
    labels.style.height = `${TOP + r.lanes.length * LANE_H + 10}px`;
    labels.replaceChildren(...r.lanes.map((lane, k) => el("div", { class: `lane-label${k % 2 ? " odd" : ""}`, "data-rank-dir": lane.rank_dir, style: `top:${TOP + k * LANE_H}px;height:${LANE_H}px` },
      el("div", { class: "lane-name", text: lane.rank_dir }),
      el("div", { class: "lane-counts", text: `${lane.records} rec · ${lane.comm} comm · ${lane.anomalous} bad${lane.dropped ? " · " + lane.dropped + " not drawn" : ""}` }))));
  }

  // the columns of the anomaly and of the ends of every hop of its path, the lanes they are on, and
  // the pixels its label takes right of it
  function pathSpan(r) {
    const a = r.anomaly;
    if (!a || !lay) return null;
    const pts = [[a.rank, a.i], ...(a.path || []).flatMap((h) => [[h.from_rank, h.from_i], [h.to_rank, h.to_i]])]
      .map(([rk, i]) => lay.col.get(`${rk}:${i}`)).filter(Boolean);
    if (!pts.length) return null;
    const cs = pts.map((p) => p[0]), ks = pts.map((p) => p[1]);
    const o = lay.col.get(`${a.rank}:${a.i}`);
    return { c0: Math.min(...cs), c1: Math.max(...cs), oc: o ? o[0] : null, label: 7 * String(a.record || "").length + 10, k0: Math.min(...ks), k1: Math.max(...ks) };
  }
  // the zoom (at most 100%) and the window that show the anomaly and its whole path
  function showPath(s) {
    const w = plotWidth() - 2 * PAD;
    const need = (z) => Math.max((s.c1 - s.c0) * COL_W * z, s.oc !== null ? (s.oc - s.c0) * COL_W * z + s.label : 0) + COL_W;
    zoom = 1;
    if (need(1) > w) zoom = Math.max(Math.min((w - COL_W - (s.oc !== null && s.oc === s.c1 ? s.label : 0)) / Math.max((s.c1 - s.c0) * COL_W, 1), 1), ZOOM_MIN);
    relayout();
    const x0 = X(s.c0) - COL_W / 2 - PAD;
    box.scrollLeft = Math.max(x0 - Math.max((w - need(zoom)) / 4, 0), 0);
    const h = box.clientHeight || 600;
    const y0 = TOP + s.k0 * LANE_H - 6, y1 = TOP + (s.k1 + 1) * LANE_H;
    if (y1 - box.scrollTop > h || y0 < box.scrollTop) box.scrollTop = Math.max(y1 - y0 <= h ? y0 - (h - (y1 - y0)) / 2 : y0, 0);
    paint(true);
  }
  function setZoom(z, anchor) {
    const old = zoom;
    const ax = anchor === undefined ? box.scrollLeft + plotWidth() / 2 : anchor;  // plot x kept in place
    const screen = ax - box.scrollLeft;
    zoom = Math.min(Math.max(z, ZOOM_MIN), ZOOM_MAX);
    relayout();
    box.scrollLeft = Math.max(PAD + (ax - PAD) * (zoom / old) - screen, 0);
    paint(true);
  }
  zoomIn.addEventListener("click", () => setZoom(zoom * 1.5));
  zoomOut.addEventListener("click", () => setZoom(zoom / 1.5));
  zoomFit.addEventListener("click", () => { if (lay) setZoom((plotWidth() - 2 * PAD) / Math.max(lay.cols * COL_W, 1), PAD); });
  zoomPath.addEventListener("click", () => { const s = last && pathSpan(last.r); if (s) showPath(s); });
  box.addEventListener("wheel", (e) => {
    if (!e.ctrlKey || !lay) return;
    e.preventDefault();
    const rect = box.getBoundingClientRect();
    setZoom(zoom * (e.deltaY < 0 ? 1.25 : 0.8), box.scrollLeft + e.clientX - rect.left - LABEL_W);
  }, { passive: false });
  box.addEventListener("scroll", () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; paint(false); });
  });

  function relayout() {
    const W = X(lay.cols) + 40, H = TOP + last.r.lanes.length * LANE_H + 10;
    plot.setAttribute("width", W); plot.setAttribute("height", H);
    zoomLabel.textContent = `${Math.round(zoom * 100)}%`;
    painted = null;
  }

  function draw(r, first) {
    drawFacts(r);
    drawLabels(r);
    lay = layout(r.lanes, expanded);
    if (first) {
      zoom = 1;
      relayout();
      const s = pathSpan(r);
      if (s) showPath(s);
      else { box.scrollLeft = 0; box.scrollTop = 0; paint(true); }
    } else {
      relayout();
      paint(true);
    }
  }

  // the DOM holds the columns of the window and one window's width either side; painted again when
  // the window leaves that span (or the zoom, the page or an expanded run changes)
  function paint(force) {
    if (!lay || !last || !box.clientWidth) return;  // hidden: painted when shown again
    const w = plotWidth();
    const lo = box.scrollLeft, hi = lo + w;
    if (!force && painted && lo >= painted[0] + w / 4 && hi <= painted[1] - w / 4) { drawMinimap(); return; }
    if (!force && painted && lo >= painted[0] && hi <= painted[1] && painted[0] <= 0 && painted[1] >= X(lay.cols)) { drawMinimap(); return; }
    // zoomed out (a column under 12 px) the margin is half a window: the marks there are dense
    const margin = COL_W * zoom < 12 ? w / 2 : w;
    const x0 = lo - margin, x1 = hi + margin;
    painted = [x0, x1];
    const r = last.r;
    const W = X(lay.cols) + 40, H = TOP + r.lanes.length * LANE_H + 10;
    const inX = (x) => x >= x0 && x <= x1;
    const kids = [];
    const defs = svg("defs");
    for (const [id, color] of [["cl-arrow", "#2563eb"], ["cl-arrow-path", "#f97316"]]) {
      const m = svg("marker", { id, viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 9, markerHeight: 9, markerUnits: "userSpaceOnUse", orient: "auto-start-reverse" });
      m.append(svg("path", { d: "M0,0 L10,5 L0,10 z", fill: color }));
      defs.append(m);
    }
    kids.push(defs);
    r.lanes.forEach((lane, k) => {
      const y = TOP + k * LANE_H;
      const g = svg("g", { class: "cl-lane", "data-rank": lane.rank, "data-rank-dir": lane.rank_dir });
      g.append(svg("rect", { x: 0, y: y + 2, width: W, height: LANE_H - 4, class: k % 2 ? "lane-bg odd" : "lane-bg" }),
        svg("line", { x1: 0, x2: W - 20, y1: y + LANE_H / 2, y2: y + LANE_H / 2, class: "lane-axis" }));
      kids.push(g);
    });
    // levels: a label where there is room for it
    let lastX = -1e9;
    for (const lv of lay.levels) {
      const x = PAD + lay.offset.get(lv) * COL_W * zoom;
      if (!inX(x) || x - lastX < 24) continue;
      lastX = x;
      kids.push(svg("line", { x1: x - 2, x2: x - 2, y1: TOP - 8, y2: H - 6, class: "level-line" }), svg("text", { x, y: TOP - 12, class: "level-label" }, `L${lv}`));
    }
    const seen = (pts) => pts.some((p) => inX(p[0])) || (pts.length > 1 && Math.min(...pts.map((p) => p[0])) < x0 && Math.max(...pts.map((p) => p[0])) > x1);
    // collectives: one bar through the members shown
    for (const c of r.collectives || []) {
      const pts = c.members.map(([rk, i]) => at(rk, i)).filter(Boolean).sort((a, b) => a[1] - b[1]);
      if (pts.length < 2 || !seen(pts)) continue;
      const line = svg("polyline", { points: pts.map((p) => p.join(",")).join(" "), class: `cl-coll kind-${c.kind}`, "data-api": c.api });
      line.append(svg("title", {}, `${c.api} · ${c.group_size} members · level ${c.level}`));
      kids.push(line);
    }
    const anomaly = r.anomaly;
    const hops = (anomaly && anomaly.path) || [];
    const pathHops = new Set(hops.map((h) => `${h.from_rank}:${h.from_i}>${h.to_rank}:${h.to_i}`));
    // a hop between lanes: a curve left to right, or (a collective: one level) a straight line beside the bar
    const curve = (a, p) => {
      if (Math.abs(p[0] - a[0]) < 1) { const dx = p[1] > a[1] ? -5 : 5, dy = p[1] > a[1] ? -10 : 10; return `M${a[0] + dx},${a[1] - dy} L${p[0] + dx},${p[1] + dy}`; }
      const b = [p[0] + (p[0] >= a[0] ? -10 : 10), p[1]]; const mx = (a[0] + b[0]) / 2; return `M${a[0]},${a[1]} C${mx},${a[1]} ${mx},${b[1]} ${b[0]},${b[1]}`;
    };
    for (const e of r.p2p || []) {
      const a = at(e.from[0], e.from[1]), b = at(e.to[0], e.to[1]);
      if (!a || !b || !seen([a, b])) continue;
      const on = pathHops.has(`${e.from[0]}:${e.from[1]}>${e.to[0]}:${e.to[1]}`);
      kids.push(svg("path", { d: curve(a, b), class: `cl-edge${on ? " on-path" : ""}`, "data-from": `${e.from[0]}:${e.from[1]}`, "data-to": `${e.to[0]}:${e.to[1]}`, "marker-end": "url(#cl-arrow)" }));
    }
    // the anomaly's path: every hop of the window, over the edges (a dump's path through every later
    // collective of 64 ranks is thousands of hops: those far from the window are painted when it gets there)
    for (const h of hops) {
      const a = at(h.from_rank, h.from_i), b = at(h.to_rank, h.to_i);
      if (!a || !b || !seen([a, b])) continue;
      const p = svg("path", { d: curve(a, b), class: "cl-path", "data-from": `${h.from_rank}:${h.from_i}`, "data-to": `${h.to_rank}:${h.to_i}`, "marker-end": "url(#cl-arrow-path)" });
      p.append(svg("title", {}, `${h.via}: rank ${h.from_rank} ${h.from_record} → rank ${h.to_rank} ${h.to_record}`));
      kids.push(p);
    }
    // nodes: those of the window; zoomed out, one a few pixels (the anomaly, its path and
    // communication calls before runs), so the DOM never holds more marks than the lane has pixels
    const onPath = new Set(hops.flatMap((h) => [`${h.from_rank}:${h.from_i}`, `${h.to_rank}:${h.to_i}`]));
    const rank = (it) => (anomaly && anomaly.rank === r.lanes[it.lane].rank && anomaly.i === it.n.i && !it.n.member ? 4 : onPath.has(it.key) ? 3 : it.n.comm ? 2 : 1);
    const small = COL_W * zoom < 12;
    r.lanes.forEach((lane, k) => {
      const its = lay.laneItems[k].filter((it) => inX(X(it.col)));
      let shown = its;
      if (small) {
        const cell = new Map();
        for (const it of its) {
          const px = Math.round(X(it.col) / 8);
          const had = cell.get(px);
          if (!had || rank(it) > rank(had)) cell.set(px, it);
        }
        shown = [...cell.values()];
      }
      for (const it of shown) kids.push(nodeEl(lane, it, anomaly, onPath, small, Y(k)));
    });
    plot.replaceChildren(...kids);
    drawMinimap();
  }

  function nodeEl(lane, it, anomaly, onPath, small, y) {
    const n = it.n, x = X(it.col);
    if (n.kind === "more") {  // the records of an expanded run this view does not name: the rank's list has them
      const t = svg("text", { x: x - 8, y: y + 4, class: "run-more", "data-rank": lane.rank, "data-count": n.count, tabindex: 0 }, `+${n.count}`);
      t.append(svg("title", {}, `${n.count} more anomalous records of this run, not named here\nclick: the rank's NaN/Inf rows in the Divergences list`));
      t.addEventListener("click", () => openList(lane.cell, "nan_inf"));
      return t;
    }
    const isOrigin = anomaly && anomaly.rank === lane.rank && anomaly.i === n.i && !n.member && n.kind !== "run";
    const run = n.kind === "run" && !n.member;
    const open_ = run && expanded.has(it.key);
    const g = svg("g", { class: `${nodeClass(n)}${isOrigin ? " origin" : ""}${onPath.has(it.key) && !run ? " on-path" : ""}${n.member ? " member" : ""}${open_ ? " expanded" : ""}`,
      "data-rank": lane.rank, "data-i": n.i, "data-record": n.record || "", "data-cell": lane.cell, "data-count": run ? n.count : null, tabindex: 0 });
    if (isOrigin) g.append(svg("circle", { cx: x, cy: y, r: 14, class: "origin-ring" }));
    if (run) {
      const label = open_ ? `−${n.count}` : `×${n.count}`;
      const w = small ? 10 : Math.max(22, 7 * label.length + 6);
      g.append(svg("rect", { x: x - w / 2, y: y - 9, width: w, height: 18, rx: 9, class: "shape" }));
      if (!small) g.append(svg("text", { x, y: y + 4, class: "run-count" }, label));
    } else {
      g.append(n.comm ? svg("rect", { x: x - 8, y: y - 8, width: 16, height: 16, rx: 3, class: "shape" }) : svg("circle", { cx: x, cy: y, r: 6.5, class: "shape" }));
    }
    if (n.comm && !small) g.append(svg("text", { x, y: y + 22, class: "node-label" }, n.comm + (n.peer !== null && n.peer !== undefined && !n.is_root ? ` ${n.comm.includes("send") ? "→" : "←"}${n.peer}` : "")));
    const what = run ? `${n.count} anomalous records: ${n.record || "record " + n.i} … ${n.last_record || "record " + n.last}${(n.members || []).length < n.count ? ` (${(n.members || []).length} named)` : ""}\nclick: ${open_ ? "collapse" : "expand"}`
      : `${n.record || "record " + n.i} (record ${n.i}, level ${n.level})${n.row ? "\n" + n.row : ""}${n.result ? "\n" + n.result : ""}\nclick: open the record`;
    g.append(svg("title", {}, what));
    const act = () => { if (run) toggle(it.key); else if (n.record) open(lane, n); };
    g.addEventListener("click", act);
    g.addEventListener("keydown", (ev) => { if (ev.key === "Enter") act(); });
    if (isOrigin && !small) {
      const t = svg("text", { x: x - 10, y: y - 20, class: "origin-label" }, n.record);
      return wrap(g, t);
    }
    return g;
  }
  function wrap(...parts) { const g = svg("g"); g.append(...parts); return g; }

  // a run expanded (or collapsed): laid out again, the run kept where it was on screen
  function toggle(key) {
    const before = at(...key.split(":").map(Number));
    if (expanded.has(key)) expanded.delete(key); else expanded.add(key);
    lay = layout(last.r.lanes, expanded);
    relayout();
    const after = at(...key.split(":").map(Number));
    if (before && after) box.scrollLeft = Math.max(box.scrollLeft + after[0] - before[0], 0);
    paint(true);
  }

  // the minimap: every lane a row, every node a tick, the anomaly and its path in orange, the window
  // as a frame; a click or a drag moves the window there
  function drawMinimap() {
    if (!lay || !last) return;
    const w = Math.max(box.clientWidth, 100);
    if (minimap.width !== w) minimap.width = w;
    const h = minimap.height, n = last.r.lanes.length || 1;
    const full = X(lay.cols) + 40;
    const sx = w / full, rowH = Math.max((h - 4) / n, 1);
    const c = minimap.getContext("2d");
    if (!c) return;
    c.clearRect(0, 0, w, h);
    c.fillStyle = "#f8fafc"; c.fillRect(0, 0, w, h);
    lay.laneItems.forEach((its, k) => {
      for (const it of its) {
        c.fillStyle = COLORS[resultOf(it.n)] || "#9ca3af";
        c.fillRect(Math.floor(X(it.col) * sx), 2 + k * rowH, Math.max(1, it.n.kind === "run" ? 2 : 1), Math.max(rowH - 1, 1));
      }
    });
    const s = pathSpan(last.r);
    if (s) { c.fillStyle = "#f97316"; c.fillRect(Math.floor(X(s.c0) * sx) - 1, 0, Math.max((X(s.c1) - X(s.c0)) * sx, 3), 3); }
    c.strokeStyle = "#111827"; c.lineWidth = 1.5;
    c.strokeRect(box.scrollLeft * sx + 0.5, 0.5, Math.max(plotWidth() * sx, 3), h - 1);
  }
  function fromMinimap(e) {
    if (!lay) return;
    const rect = minimap.getBoundingClientRect();
    const full = X(lay.cols) + 40;
    box.scrollLeft = Math.max((e.clientX - rect.left) / rect.width * full - plotWidth() / 2, 0);
  }
  let dragging = false;
  minimap.addEventListener("mousedown", (e) => { dragging = true; fromMinimap(e); });
  window.addEventListener("mousemove", (e) => { if (dragging) fromMinimap(e); });
  window.addEventListener("mouseup", () => { dragging = false; });

  function invalidate() { loaded = null; }
  function where() { return { lanes: begin }; }
  return { ensure, load, invalidate, cellLabel, where, zoom: () => zoom };
}
