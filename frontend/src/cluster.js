// The cluster view of one step: its ranks as lanes (a page of them), each lane's communication calls
// and anomalous records laid out in the step's communication order (the graph's levels: a level is a
// column group, so matched collectives line up and a send sits left of its receive), matched
// point-to-point calls as arrows, collectives as a bar through their members, the first anomaly ringed
// and its propagation path drawn over them. Names come from dumps: set as SVG text/attributes only.

const SVGNS = "http://www.w3.org/2000/svg";
const COL_W = 30, LANE_H = 78, LEFT = 190, TOP = 34, PAGE_LANES = 16;

function svg(tag, attrs = {}, text) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== undefined && v !== null && v !== false) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}

function nodeClass(n) {
  const r = n.nan_inf || n.result === "nan_inf" ? "r-nan" : n.result === "error" ? "r-error" : n.result === "warning" ? "r-warning" : n.comm ? "r-comm" : "r-none";
  return `cl-node k-${n.comm ? "comm" : "anomaly"} ${r}`;
}

// columns: each level gets as many as its widest lane needs; a node's x is its level's offset plus
// its place among its lane's nodes of that level
function layout(lanes) {
  const width = new Map();
  for (const lane of lanes) {
    const count = new Map();
    for (const n of lane.nodes) count.set(n.level, (count.get(n.level) || 0) + 1);
    for (const [lv, c] of count) width.set(lv, Math.max(width.get(lv) || 0, c));
  }
  const levels = [...width.keys()].sort((a, b) => a - b);
  const offset = new Map();
  let x = 0;
  for (const lv of levels) { offset.set(lv, x); x += width.get(lv) + 1; }
  const pos = new Map();
  lanes.forEach((lane, k) => {
    const used = new Map();
    for (const n of lane.nodes) {
      const at = used.get(n.level) || 0;
      used.set(n.level, at + 1);
      pos.set(`${lane.rank}:${n.i}`, [LEFT + (offset.get(n.level) + at) * COL_W + COL_W / 2, TOP + k * LANE_H + LANE_H / 2]);
    }
  });
  return { pos, levels, offset, cols: x };
}

export function makeCluster(ctx) {
  const { el, api, state, pane, guard, openCell, openRecord, cellLabel } = ctx;
  const stepSel = el("select", { id: "cluster-step" });
  const prev = el("button", { id: "cluster-prev", text: "◀ ranks" });
  const next = el("button", { id: "cluster-next", text: "ranks ▶" });
  const toAnomaly = el("button", { id: "cluster-to-anomaly", text: "Lanes of the anomaly" });
  const range = el("span", { class: "hint", id: "cluster-range" });
  const legend = el("span", { class: "legend" },
    ...[["r-comm", "communication"], ["r-nan", "NaN/Inf"], ["r-error", "error"], ["r-warning", "warning"]].map(([c, t]) => el("span", { class: "chip" }, el("i", { class: `dot ${c}` }), t)),
    el("span", { class: "chip" }, el("i", { class: "dot ring" }), "anomaly"), el("span", { class: "chip" }, el("i", { class: "bar-path" }), "its path"));
  const facts = el("div", { class: "facts cluster-facts", id: "cluster-facts" });
  const box = el("div", { class: "cluster-box", id: "cluster-box" });
  pane.append(el("div", { class: "filters" }, el("label", {}, "step ", stepSel), prev, range, next, toAnomaly, legend), facts, box);
  let loaded = null, begin = 0, last = null;

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
    stepSel.addEventListener("change", () => { openCell(Number(stepSel.value), null); load(Number(stepSel.value), 0); });
  }
  async function ensure() {
    fillSteps();
    const key = stepKey(state.cell);
    if (key !== loaded) await load(state.cell, 0);
  }
  async function load(cell, laneBegin) {
    loaded = stepKey(cell);
    begin = Math.max(laneBegin, 0);
    for (const o of stepSel.options) if (o.dataset.key === loaded) stepSel.value = o.value;
    const r = await guard(() => api.cluster(cell, begin, begin + PAGE_LANES));
    if (!r || stepKey(cell) !== loaded) return;
    last = { cell, r };
    draw(r);
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

  function draw(r) {
    drawFacts(r);
    const { pos, levels, offset, cols } = layout(r.lanes);
    const W = LEFT + cols * COL_W + 40, H = TOP + r.lanes.length * LANE_H + 10;
    const root = svg("svg", { width: W, height: H, class: "cluster-svg", id: "cluster-svg" });
    const defs = svg("defs");
    for (const [id, color] of [["cl-arrow", "#2563eb"], ["cl-arrow-path", "#f97316"]]) {
      const m = svg("marker", { id, viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 9, markerHeight: 9, markerUnits: "userSpaceOnUse", orient: "auto-start-reverse" });
      m.append(svg("path", { d: "M0,0 L10,5 L0,10 z", fill: color }));
      defs.append(m);
    }
    root.append(defs);
    // lanes
    r.lanes.forEach((lane, k) => {
      const y = TOP + k * LANE_H;
      const g = svg("g", { class: "cl-lane", "data-rank": lane.rank, "data-rank-dir": lane.rank_dir });
      g.append(svg("rect", { x: 0, y: y + 2, width: W, height: LANE_H - 4, class: k % 2 ? "lane-bg odd" : "lane-bg" }),
        svg("text", { x: 10, y: y + LANE_H / 2 - 4, class: "lane-name" }, lane.rank_dir),
        svg("text", { x: 10, y: y + LANE_H / 2 + 12, class: "lane-counts" },
          `${lane.records} rec · ${lane.comm} comm · ${lane.anomalous} bad${lane.dropped ? " · " + lane.dropped + " not drawn" : ""}`),
        svg("line", { x1: LEFT - 6, x2: W - 20, y1: y + LANE_H / 2, y2: y + LANE_H / 2, class: "lane-axis" }));
      root.append(g);
    });
    // levels
    for (const lv of levels) {
      const x = LEFT + offset.get(lv) * COL_W;
      root.append(svg("line", { x1: x - 2, x2: x - 2, y1: TOP - 8, y2: H - 6, class: "level-line" }), svg("text", { x, y: TOP - 12, class: "level-label" }, `L${lv}`));
    }
    const at = (rank, i) => pos.get(`${rank}:${i}`);
    // collectives: one bar through the members shown
    for (const c of r.collectives || []) {
      const pts = c.members.map(([rk, i]) => at(rk, i)).filter(Boolean).sort((a, b) => a[1] - b[1]);
      if (pts.length < 2) continue;
      const line = svg("polyline", { points: pts.map((p) => p.join(",")).join(" "), class: `cl-coll kind-${c.kind}`, "data-api": c.api });
      line.append(svg("title", {}, `${c.api} · ${c.group_size} members · level ${c.level}`));
      root.append(line);
    }
    // point-to-point calls: an arrow from the send to its receive
    const pathHops = new Set(((r.anomaly && r.anomaly.path) || []).map((h) => `${h.from_rank}:${h.from_i}>${h.to_rank}:${h.to_i}`));
    // a hop between lanes: a curve left to right, or (a collective: one level) a straight line beside the bar
    const curve = (a, p) => {
      if (Math.abs(p[0] - a[0]) < 1) { const dx = p[1] > a[1] ? -5 : 5, dy = p[1] > a[1] ? -10 : 10; return `M${a[0] + dx},${a[1] - dy} L${p[0] + dx},${p[1] + dy}`; }
      const b = [p[0] + (p[0] >= a[0] ? -10 : 10), p[1]]; const mx = (a[0] + b[0]) / 2; return `M${a[0]},${a[1]} C${mx},${a[1]} ${mx},${b[1]} ${b[0]},${b[1]}`;
    };
    for (const e of r.p2p || []) {
      const a = at(e.from[0], e.from[1]), b = at(e.to[0], e.to[1]);
      if (!a || !b) continue;
      const on = pathHops.has(`${e.from[0]}:${e.from[1]}>${e.to[0]}:${e.to[1]}`);
      root.append(svg("path", { d: curve(a, b), class: `cl-edge${on ? " on-path" : ""}`, "data-from": `${e.from[0]}:${e.from[1]}`, "data-to": `${e.to[0]}:${e.to[1]}`, "marker-end": "url(#cl-arrow)" }));
    }
    // the anomaly's path: every hop, over the edges
    for (const h of (r.anomaly && r.anomaly.path) || []) {
      const a = at(h.from_rank, h.from_i), b = at(h.to_rank, h.to_i);
      if (!a || !b) continue;
      const p = svg("path", { d: curve(a, b), class: "cl-path", "data-from": `${h.from_rank}:${h.from_i}`, "data-to": `${h.to_rank}:${h.to_i}`, "marker-end": "url(#cl-arrow-path)" });
      p.append(svg("title", {}, `${h.via}: rank ${h.from_rank} ${h.from_record} → rank ${h.to_rank} ${h.to_record}`));
      root.append(p);
    }
    // nodes
    const anomaly = r.anomaly;
    const onPath = new Set(((anomaly && anomaly.path) || []).flatMap((h) => [`${h.from_rank}:${h.from_i}`, `${h.to_rank}:${h.to_i}`]));
    r.lanes.forEach((lane) => {
      for (const n of lane.nodes) {
        const [x, y] = at(lane.rank, n.i);
        const key = `${lane.rank}:${n.i}`;
        const isOrigin = anomaly && anomaly.rank === lane.rank && anomaly.i === n.i;
        const g = svg("g", { class: `${nodeClass(n)}${isOrigin ? " origin" : ""}${onPath.has(key) ? " on-path" : ""}`, "data-rank": lane.rank, "data-i": n.i, "data-record": n.record, "data-cell": lane.cell, tabindex: 0 });
        if (isOrigin) g.append(svg("circle", { cx: x, cy: y, r: 14, class: "origin-ring" }));
        g.append(n.comm ? svg("rect", { x: x - 8, y: y - 8, width: 16, height: 16, rx: 3, class: "shape" }) : svg("circle", { cx: x, cy: y, r: 6.5, class: "shape" }));
        if (n.comm) g.append(svg("text", { x, y: y + 22, class: "node-label" }, n.comm + (n.peer !== null && n.peer !== undefined && !n.is_root ? ` ${n.comm.includes("send") ? "→" : "←"}${n.peer}` : "")));
        g.append(svg("title", {}, `${n.record} (record ${n.i}, level ${n.level})${n.row ? "\n" + n.row : ""}${n.result ? "\n" + n.result : ""}\nclick: open the record`));
        g.addEventListener("click", () => open(lane, n));
        g.addEventListener("keydown", (ev) => { if (ev.key === "Enter") open(lane, n); });
        root.append(g);
        if (isOrigin) root.append(svg("text", { x: x - 10, y: y - 20, class: "origin-label" }, n.record));
      }
    });
    box.replaceChildren(root);
    const o = anomaly && at(anomaly.rank, anomaly.i);
    if (o) box.scrollLeft = Math.max(o[0] - 200, 0);
  }
  function invalidate() { loaded = null; }
  return { ensure, load, invalidate, cellLabel };
}
