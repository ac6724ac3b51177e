// calor ui: sortable tables, and the events page's live feed.
"use strict";

function sortTable(table, column, kind, descending) {
  const body = table.tBodies[0];
  const rows = Array.from(body.rows);
  const key = (row) => {
    const cell = row.cells[column];
    const raw = cell.dataset.value ?? cell.textContent.trim();
    return kind === "number" ? parseFloat(raw) || 0 : raw.toLowerCase();
  };
  rows.sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0) * (descending ? -1 : 1));
  rows.forEach((row) => body.appendChild(row));
}

document.querySelectorAll("table.sortable").forEach((table) => {
  table.querySelectorAll("th[data-sort]").forEach((th, column) => {
    th.addEventListener("click", () => {
      const descending = th.dataset.order !== "desc";
      th.dataset.order = descending ? "desc" : "asc";
      sortTable(table, column, th.dataset.sort, descending);
    });
  });
});

function calorEvents(streamUrl) {
  const form = document.getElementById("event-filter");
  const state = document.getElementById("stream-state");
  const body = document.querySelector("#events tbody");
  let source = null;
  const open = () => {
    if (source) source.close();
    const query = new URLSearchParams(new FormData(form));
    source = new EventSource(streamUrl + "?" + query.toString());
    state.textContent = "connecting…";
    source.addEventListener("ready", () => { state.textContent = "live"; });
    source.addEventListener("memory-event", (message) => {
      const event = JSON.parse(message.data);
      const row = body.insertRow(0);
      row.className = "fresh";
      row.dataset.kind = event.kind;
      row.dataset.memory = event.memory_id;
      for (const value of [event.seq, event.at, event.kind, event.channel, event.memory_id, event.message]) {
        row.insertCell().textContent = value;
      }
      while (body.rows.length > 500) body.deleteRow(-1);
    });
    source.onerror = () => { state.textContent = "reconnecting…"; };
  };
  form.addEventListener("submit", (e) => { e.preventDefault(); open(); });
  open();
}

// Times as the reader's locale writes them.
function calorTimes() {
  document.querySelectorAll("time[data-epoch]").forEach((el) => {
    const when = new Date(parseFloat(el.dataset.epoch) * 1000);
    el.dateTime = when.toISOString();
    el.textContent = when.toLocaleString();
  });
}
calorTimes();

const CURVE_COLOURS = {
  past: "#d9480f", floor: "#868e96", cold: "#1c7ed6", step: "#2b8a3e",
  floor_at: "#868e96", cold_at: "#1c7ed6", migration_at: "#7048e8", now: "#495057",
};

// A memory's heat curve (uPlot): past and projected heat, floor and cold threshold as
// lines across, recalls and other jumps as dots, and the solved moments as verticals.
function calorCurve(figure, curve) {
  // Both sides of a jump share a moment; the chart wants times that increase.
  const past = curve.past.map(([t, h], i, all) => [i + 1 < all.length && all[i + 1][0] <= t ? t - 1e-3 : t, h]);
  const times = Array.from(new Set([...past.map((p) => p[0]), ...curve.projected.map((p) => p[0])])).sort((a, b) => a - b);
  const column = (points) => {
    const at = new Map(points.map(([t, h]) => [t, h]));
    return times.map((t) => (at.has(t) ? at.get(t) : null));
  };
  const stepAt = new Map(curve.steps.map((s) => [s.at, s.after]));
  const steps = times.map((t) => (stepAt.has(t) ? stepAt.get(t) : null));
  const moments = ["floor_at", "cold_at", "migration_at"].filter((k) => curve[k] !== null);
  const labels = { floor_at: "floor", cold_at: "cold", migration_at: "cold storage" };
  const drawn = [];
  const verticals = (u) => {
    const ctx = u.ctx;
    const top = u.bbox.top, height = u.bbox.height;
    ctx.save();
    ctx.font = `${11 * devicePixelRatio}px system-ui, sans-serif`;
    for (const key of [...moments, "now"]) {
      const at = key === "now" ? curve.now : curve[key];
      const x = Math.round(u.valToPos(at, "x", true));
      if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
      ctx.strokeStyle = ctx.fillStyle = CURVE_COLOURS[key];
      ctx.lineWidth = 2 * devicePixelRatio;
      ctx.setLineDash(key === "now" ? [2 * devicePixelRatio, 3 * devicePixelRatio] : []);
      ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + height); ctx.stroke();
      ctx.fillText(key === "now" ? "now" : labels[key], x + 4 * devicePixelRatio, top + 12 * devicePixelRatio);
      drawn.push(key);
    }
    ctx.restore();
    figure.dataset.drawn = ["past", "projected", "floor", "cold-threshold", ...drawn].join(" ");
  };
  const dashed = (colour, dash) => ({ stroke: colour, width: 1.5, dash, points: { show: false } });
  const options = {
    width: Math.max(320, figure.clientWidth - 16), height: 300,
    scales: { x: { time: true }, y: { range: [0, 1.05] } },
    legend: { show: false },
    series: [
      {},
      { label: "past", stroke: CURVE_COLOURS.past, width: 2, points: { show: false } },
      { label: "projected", ...dashed(CURVE_COLOURS.past, [6, 4]) },
      { label: "floor", ...dashed(CURVE_COLOURS.floor, [2, 3]) },
      { label: "cold threshold", ...dashed(CURVE_COLOURS.cold, [6, 4]) },
      { label: "jumps", stroke: CURVE_COLOURS.step, paths: () => null,
        points: { show: true, size: 8, fill: CURVE_COLOURS.step } },
    ],
    axes: [{}, { label: "heat" }],
    hooks: { draw: [verticals] },
  };
  const data = [
    times, column(past), column(curve.projected),
    times.map(() => curve.floor), times.map(() => curve.cold_threshold), steps,
  ];
  window.calorCurveChart = new uPlot(options, data, figure);
}

// The graph once it comes into view: Cytoscape.js (the page's largest script by far)
// is fetched then, so a page whose graph is below the fold loads without it.
function calorGraphWhenSeen(container, graph, library) {
  const near = new IntersectionObserver((entries) => {
    if (!entries.some((entry) => entry.isIntersecting)) return;
    near.disconnect();
    const script = document.createElement("script");
    script.src = library;
    script.onload = () => calorGraph(container, graph);
    document.head.append(script);
  });
  near.observe(container);
}

// A memory's graph neighbourhood (Cytoscape.js): nodes coloured by heat, the memory
// itself outlined, edges as wide as their weight; a click opens a memory's page.
function calorGraph(container, graph) {
  const cy = cytoscape({
    container,
    elements: [...graph.nodes, ...graph.edges],
    layout: { name: "concentric", concentric: (n) => 3 - n.data("hop"), levelWidth: () => 1, minNodeSpacing: 30 },
    style: [
      { selector: "node", style: {
        "background-color": "mapData(heat, 0, 1, #1c7ed6, #d9480f)", label: "data(label)",
        "font-size": 9, "text-wrap": "ellipsis", "text-max-width": 140, width: 18, height: 18 } },
      { selector: "node[hop = 0]", style: { "border-width": 3, "border-color": "#20262d", width: 26, height: 26 } },
      { selector: "edge", style: {
        width: "mapData(weight, 0, 1, 1, 6)", "line-color": "#adb5bd", "curve-style": "bezier",
        label: "data(kind)", "font-size": 8, color: "#868e96" } },
    ],
  });
  cy.on("tap", "node", (event) => { window.location.href = event.target.data("url"); });
  container.dataset.nodes = String(cy.nodes().length);
  window.calorGraphView = cy;
}

// A page's heat sparklines (uPlot): each memory's heat a week back (solid) and a
// week ahead (dashed), on one scale so rows compare.
function calorSparklines(table, data) {
  const days = data.days;
  const middle = days.indexOf(0);
  let drawn = 0;
  const draw = (cell) => {
    const line = data.lines[cell.dataset.memory];
    const past = line.map((h, i) => (i <= middle ? h : null));
    const ahead = line.map((h, i) => (i >= middle ? h : null));
    new uPlot({
      width: 140, height: 30, legend: { show: false }, cursor: { show: false },
      scales: { x: { time: false }, y: { range: [0, 1] } }, axes: [{ show: false }, { show: false }],
      series: [{}, { stroke: "#d9480f", width: 1.5, points: { show: false } },
        { stroke: "#d9480f", width: 1, dash: [3, 3], points: { show: false } }],
    }, [days, past, ahead], cell);
    drawn += 1;
    table.dataset.sparklines = String(drawn);
  };
  // The rows in view are drawn now, the rest as they scroll near it (a page holds a
  // hundred: drawing them all would hold the page up for the ones nobody sees yet).
  const cells = [...table.querySelectorAll("td.spark")].filter((cell) => data.lines[cell.dataset.memory]);
  const fold = window.innerHeight;
  const below = new Set(cells.filter((cell) => cell.getBoundingClientRect().top > fold));
  cells.filter((cell) => !below.has(cell)).forEach(draw);
  table.dataset.sparklines = String(drawn);
  const near = new IntersectionObserver((entries) => {
    for (const entry of entries) {
      if (!entry.isIntersecting) continue;
      near.unobserve(entry.target);
      draw(entry.target);
    }
  }, { rootMargin: "300px 0px" });
  below.forEach((cell) => near.observe(cell));
}

// A channel's memories by tenth of heat, one small bar chart (uPlot) per type.
function calorHistograms(container, histograms) {
  const tenths = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9].map((k) => k / 10 + 0.05);
  for (const h of histograms) {
    const figure = container.querySelector(`figure[data-type="${h.type}"]`);
    new uPlot({
      width: 220, height: 110, legend: { show: false }, cursor: { show: false },
      scales: { x: { time: false, range: [0, 1] }, y: { range: (u, lo, hi) => [0, Math.max(1, hi)] } },
      axes: [{ size: 22, font: "10px system-ui", values: (u, v) => v.map((x) => x.toFixed(1)) },
        { size: 30, font: "10px system-ui" }],
      series: [{}, { fill: "#1c7ed6", stroke: "#1c7ed6", paths: uPlot.paths.bars({ size: [0.9, 40] }), points: { show: false } }],
    }, [tenths, h.counts], figure);
    figure.dataset.drawn = "1";
  }
}
