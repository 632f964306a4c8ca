// Drawing with uPlot, and the state each chart reports for people and for the browser test.
//
// Each chart's <figure> carries data-state (idle, loading, ready, empty, absent, error),
// data-points (values plotted, all series together) and data-series (JSON: points per series
// label). "absent" hides a figure whose subject does not exist here (no HPA for this workload).

import { bytes, cores, count, percent } from "./words.js";

export const COLOR = {
  usage: "#1f77b4", peak: "#86b7e0", request: "#2ca02c", limit: "#d62728",
  target: "#ff7f0e", hpa: "#7b3fbf", lend: "#8c564b", capacity: "#555555",
  bound: "#9a6fd0", action: "#e6550d", transition: "#f0a020", offline: "#8c564b",
  reclaim: "#17a2b8",
};
// Axis steps for bytes: powers of two of each binary unit, so ticks land on 256Mi, 1Gi, ...
export const BINARY_INCRS = [0, 10, 20, 30, 40].flatMap((e) => [1, 2, 4, 8, 16, 32, 64, 128, 256, 512].map((m) => m * 2 ** e));
const HEIGHT = 240;
const charts = new Map();
const $ = (id) => document.getElementById(id);

export const FORMAT = { cores, bytes, percent, count };

export function setFigure(id, st, message = "", counts = {}) {
  const fig = $(id);
  fig.dataset.state = st;
  fig.hidden = st === "absent";
  fig.dataset.points = String(Object.values(counts).reduce((a, b) => a + b, 0));
  fig.dataset.series = JSON.stringify(counts);
  let note = fig.querySelector(".note");
  if (!note) { note = document.createElement("p"); note.className = "note"; fig.appendChild(note); }
  note.textContent = message;
  if (st === "empty" || st === "absent" || st === "error") forget(id);
}

function forget(id) {
  const old = charts.get(id);
  if (old) { old.destroy(); charts.delete(id); }
}

export function yRange(u, min, max) {
  if (min == null || max == null) return [0, 1];
  const lo = Math.min(0, min);
  const hi = max > lo ? max * 1.1 : lo + 1;
  return [lo < 0 ? lo * 1.1 : lo, hi];
}

// A y range from some of the series only: points that lie outside it (a reading far off the line)
// are cut rather than squashing the lines to the bottom.
function rangeOf(series) {
  const values = series.flatMap((s) => s.values.filter((v) => v != null));
  return (u, min, max) => yRange(u, values.length ? Math.min(...values) : min, values.length ? Math.max(...values) : max);
}

// Number labels drawn by a marker series' points, e.g. "1", "2" for the scaling actions listed
// under the chart: above the point, else below it when that would overlap a label already drawn,
// else left out (the list still has it).
function markerLabels(series) {
  return (u) => {
    const ctx = u.ctx;
    const ratio = uPlot.pxRatio || 1;
    const size = 11 * ratio;
    const drawn = [];
    const free = (box) => drawn.every((b) => box.x1 < b.x0 || box.x0 > b.x1 || box.y1 < b.y0 || box.y0 > b.y1);
    ctx.save();
    ctx.font = `600 ${size}px system-ui, sans-serif`;
    ctx.textAlign = "center";
    ctx.textBaseline = "middle";
    series.forEach((s, k) => {
      if (!s.labels || !u.series[k + 1].show) return;
      ctx.fillStyle = s.color;
      s.values.forEach((v, i) => {
        const label = s.labels[i];
        if (v == null || !label) return;
        const x = u.valToPos(u.data[0][i], "x", true);
        const y = u.valToPos(v, "y", true);
        const half = ctx.measureText(label).width / 2 + 2 * ratio;
        for (const cy of [y - size, y + size]) {
          const box = { x0: x - half, x1: x + half, y0: cy - size / 2, y1: cy + size / 2 };
          if (!free(box)) continue;
          ctx.fillText(label, x, cy);
          drawn.push(box);
          break;
        }
      });
    });
    ctx.restore();
  };
}

// series: [{label, values, color, fmt?, dash?, width?, bars?, pointsOnly?, withPoints?, stepped?,
//           labels? (text above each point), value? (legend text for index i)}]
// opts: {fmt, incrs?, hours?, xLabel?, note?, emptyNote?, bands? ([[upper label, lower label]]), bandFill?,
//        rangeFrom? (labels of the series the y range is taken from; default all)}
export function draw(id, x, series, opts) {
  forget(id);
  const counts = {};
  for (const s of series) counts[s.label] = s.values.filter((v) => v != null).length;
  const total = Object.values(counts).reduce((a, b) => a + b, 0);
  if (total === 0) { setFigure(id, "empty", opts.emptyNote || "no data in this range", counts); return; }
  let newest = -1;
  for (const s of series) {
    for (let i = s.values.length - 1; i > newest; i--) if (s.values[i] != null) { newest = i; break; }
  }
  const fig = $(id);
  fig.hidden = false;
  const el = fig.querySelector(".plot");
  const fmt = opts.fmt;
  const stepped = uPlot.paths.stepped({ align: 1 });
  const bars = uPlot.paths.bars({ size: [0.7, 40] });
  const u = new uPlot({
    width: Math.max(300, el.clientWidth), height: HEIGHT,
    cursor: opts.hours ? {} : { sync: { key: "time" } },
    scales: {
      x: opts.hours ? { time: false, range: [-0.5, 23.5] } : { time: true },
      y: { range: opts.rangeFrom ? rangeOf(series.filter((s) => opts.rangeFrom.includes(s.label))) : yRange },
    },
    axes: [
      opts.hours ? { label: opts.xLabel, values: (u, vs) => vs.map((v) => `${v}h`), incrs: [1, 2, 3, 6] } : {},
      { size: 64, values: (u, vs) => vs.map(fmt), incrs: opts.incrs },
    ],
    series: [
      opts.hours ? { label: "hour", value: (u, v) => (v == null ? "–" : `${v}:00`) } : {},
      ...series.map((s) => ({
        label: s.label, stroke: s.color, width: s.width || 2, dash: s.dash,
        fill: s.bars ? s.color + "99" : undefined, spanGaps: !!s.spanGaps,
        paths: s.bars ? bars : s.pointsOnly ? () => null : s.stepped ? stepped : undefined,
        points: s.pointsOnly || s.withPoints
          ? { show: true, size: s.pointSize || 7, fill: s.hollow ? "#fff" : s.color, stroke: s.color, width: 2 }
          : { show: false },
        value: s.value ? (u, v, si, i) => (i == null ? "–" : s.value(i, v)) : (u, v) => (s.fmt || fmt)(v),
      })),
    ],
    bands: (opts.bands || []).map(([hi, lo]) => ({
      series: [series.findIndex((s) => s.label === hi) + 1, series.findIndex((s) => s.label === lo) + 1],
      fill: opts.bandFill || "rgba(123, 63, 191, 0.10)",
    })).filter((b) => b.series[0] > 0 && b.series[1] > 0),
    hooks: {
      draw: series.some((s) => s.labels) ? [markerLabels(series)] : [],
      // Away from the cursor, the legend shows the newest values rather than dashes.
      setCursor: opts.hours ? [] : [(u) => { if (u.cursor.idx == null && newest >= 0) u.setLegend({ idx: newest }); }],
    },
  }, [x, ...series.map((s) => s.values)], el);
  if (!opts.hours && newest >= 0) u.setLegend({ idx: newest });
  charts.set(id, u);
  setFigure(id, "ready", opts.note || "", counts);
}

export function resizeAll() {
  for (const [id, u] of charts) {
    const el = $(id).querySelector(".plot");
    if (el.clientWidth > 0) u.setSize({ width: Math.max(300, el.clientWidth), height: HEIGHT });
  }
}
