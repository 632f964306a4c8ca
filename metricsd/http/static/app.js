// metricsd's dashboard: one workload's pods over time, its busiest pods, and the cluster's
// hour-of-day usage. It reads the Prometheus query API (PromQL), the native JSON API and the
// consumers' status documents of the server that serves this page; uPlot draws the charts.
//
// Each chart's <figure> carries data-state (idle, loading, ready, empty, error), data-points
// (values plotted, all series together) and data-series (JSON: points per series label), and
// <body data-loaded="namespace/workload"> is set once everything for a selection is drawn, so a
// browser test (tests/http/test_dashboard_browser.py) can tell a drawn chart from an empty one.
"use strict";

(() => {
  const REFRESH_MS = 30000;
  const STEPS = [10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600];
  const COLOR = {
    usage: "#1f77b4", peak: "#86b7e0", request: "#2ca02c", limit: "#d62728",
    target: "#ff7f0e", hpa: "#7b3fbf", lend: "#8c564b", capacity: "#555555",
  };
  // Axis steps for bytes: powers of two of each binary unit, so ticks land on 256Mi, 1Gi, ...
  const BINARY_INCRS = [0, 10, 20, 30, 40].flatMap((e) => [1, 2, 4, 8, 16, 32, 64, 128, 256, 512].map((m) => m * 2 ** e));
  const state = { seq: 0, charts: new Map(), skewMs: 0, timer: null };
  const $ = (id) => document.getElementById(id);

  // ---- data access ---------------------------------------------------------------------------

  async function getJSON(path, params = {}, optional = false) {
    const url = new URL(path, document.baseURI);
    for (const [k, v] of Object.entries(params)) url.searchParams.append(k, String(v));
    const resp = await fetch(url, { headers: { Accept: "application/json" } });
    const date = resp.headers.get("Date");
    if (date) state.skewMs = Date.parse(date) - Date.now(); // draw on the server's clock
    if (optional && resp.status === 404) return null;
    const body = await resp.json();
    if (!resp.ok || body.status === "error") throw new Error(body.error || `${resp.status} ${resp.statusText}`);
    return body;
  }

  const quote = (s) => '"' + s.replace(/\\/g, "\\\\").replace(/"/g, '\\"') + '"';

  async function labelValues(name, match) {
    return (await getJSON(`api/v1/label/${name}/values`, { "match[]": match })).data;
  }

  // A PromQL range query reduced to one series, laid onto the grid start, start+step, ..., end.
  async function promRange(query, grid) {
    const body = await getJSON("api/v1/query_range", { query, start: grid.start, end: grid.end, step: grid.step });
    const out = new Array(grid.x.length).fill(null);
    const series = body.data.result[0];
    if (!series) return out;
    for (const [t, v] of series.values) {
      const i = Math.round((t - grid.start) / grid.step);
      const f = parseFloat(v);
      if (i >= 0 && i < out.length && Number.isFinite(f)) out[i] = f;
    }
    return out;
  }

  function timeGrid(rangeS) {
    const step = STEPS.find((s) => s >= rangeS / 300) || STEPS[STEPS.length - 1];
    const now = (Date.now() + state.skewMs) / 1000;
    const end = Math.floor(now / step) * step; // a later end would cut rate() windows short
    const start = end - Math.floor(rangeS / step) * step;
    const x = [];
    for (let t = start; t <= end; t += step) x.push(t);
    return { start, end, step, x, window: `${Math.max(60, step)}s` };
  }

  // ---- formatting ----------------------------------------------------------------------------

  function cores(v) {
    if (v == null) return "–";
    return Math.abs(v) < 1 ? `${Math.round(v * 1000)}m` : v.toFixed(2);
  }
  function bytes(v) {
    if (v == null) return "–";
    const units = ["B", "Ki", "Mi", "Gi", "Ti"];
    let i = 0;
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return `${v.toFixed(v >= 100 || i === 0 ? 0 : 1)}${units[i]}`;
  }
  const percent = (v) => (v == null ? "–" : `${v.toFixed(0)}%`);
  const plain = (v) => (v == null ? "–" : v.toFixed(1));

  // ---- charts --------------------------------------------------------------------------------

  function setFigure(id, st, message = "", counts = {}) {
    const fig = $(id);
    fig.dataset.state = st;
    fig.dataset.points = String(Object.values(counts).reduce((a, b) => a + b, 0));
    fig.dataset.series = JSON.stringify(counts);
    let note = fig.querySelector(".note");
    if (!note) { note = document.createElement("p"); note.className = "note"; fig.appendChild(note); }
    note.textContent = message;
  }

  // series: [{label, values, color, fmt?, dash?, width?, bars?, pointsOnly?}]
  function draw(id, x, series, opts) {
    const old = state.charts.get(id);
    if (old) { old.destroy(); state.charts.delete(id); }
    const counts = {};
    for (const s of series) counts[s.label] = s.values.filter((v) => v != null).length;
    const total = Object.values(counts).reduce((a, b) => a + b, 0);
    if (total === 0) { setFigure(id, "empty", "no data in this range", counts); return; }
    const el = $(id).querySelector(".plot");
    const fmt = opts.fmt;
    const u = new uPlot({
      width: Math.max(300, el.clientWidth), height: 240,
      scales: { x: opts.hours ? { time: false, range: [-0.5, 23.5] } : { time: true }, y: { range: yRange } },
      axes: [
        opts.hours ? { label: opts.xLabel, values: (u, vs) => vs.map((v) => `${v}h`), incrs: [1, 2, 3, 6] } : {},
        { size: 64, values: (u, vs) => vs.map(fmt), incrs: opts.incrs },
      ],
      series: [
        opts.hours ? { label: "hour", value: (u, v) => (v == null ? "–" : `${v}:00`) } : {},
        ...series.map((s) => ({
          label: s.label, stroke: s.color, width: s.width || 2, dash: s.dash,
          fill: s.bars ? s.color + "99" : undefined, spanGaps: !!s.spanGaps,
          paths: s.bars ? uPlot.paths.bars({ size: [0.7, 40] }) : s.pointsOnly ? () => null : undefined,
          points: s.pointsOnly || s.withPoints ? { show: true, size: 7, fill: s.color } : { show: false },
          value: (u, v) => (s.fmt || fmt)(v),
        })),
      ],
    }, [x, ...series.map((s) => s.values)], el);
    state.charts.set(id, u);
    setFigure(id, "ready", opts.note || "", counts);
  }

  function yRange(u, min, max) {
    if (min == null || max == null) return [0, 1];
    const lo = Math.min(0, min);
    const hi = max > lo ? max * 1.1 : lo + 1;
    return [lo, hi];
  }

  // ---- the workload's consumers ---------------------------------------------------------------

  // The HPA aimed at this workload and the metric targets of its latest decision, if any.
  function hpaOf(doc, ns, workload) {
    if (!doc || !doc.status || !doc.status.targets) return null;
    const t = doc.status.targets.find((t) => t.hpa.split("/")[0] === ns && t.target.split("/").pop() === workload);
    if (!t) return null;
    const history = (doc.history || []).filter((h) => h.hpa === t.hpa);
    const latest = history[history.length - 1];
    const metrics = latest && latest.inputs ? latest.inputs.metrics || [] : [];
    const target = (metric, type) => {
      const m = metrics.find((m) => m.metric === metric && m.target && m.target.type === type);
      return m ? m.target.value : null;
    };
    const readings = history.flatMap((h) => ((h.inputs && h.inputs.metrics) || [])
      .filter((m) => m.metric === "Resource/cpu" && m.target && m.target.type === "Utilization" && m.current != null)
      .map((m) => [h.timeMs / 1000, m.current]));
    return {
      status: t, readings,
      cpuUtilisation: target("Resource/cpu", "Utilization"),
      cpuAverage: target("Resource/cpu", "AverageValue"),
      memoryAverage: target("Resource/memory", "AverageValue"),
    };
  }

  function onGrid(grid, points) {
    const out = new Array(grid.x.length).fill(null);
    for (const [t, v] of points) {
      const i = Math.min(Math.round((t - grid.start) / grid.step), out.length - 1);
      if (i >= 0 && t <= grid.end + grid.step) out[i] = v;
    }
    return out;
  }

  const constant = (grid, v) => (v == null ? null : grid.x.map(() => v));

  // ---- the sections --------------------------------------------------------------------------

  async function loadResources(sel, grid, hpa, fresh) {
    const perPod = (metric, fn) => `sum by (pod) (${fn(metric + "{" + sel + "}")})`;
    const rate = (s) => `rate(${s}[${grid.window}])`;
    const same = (s) => s;
    const res = (metric, r) => `sum by (pod) (${metric}{${sel},resource="${r}"})`;
    const [cpuAvg, cpuMax, cpuReq, cpuLim, memAvg, memMax, memReq, memLim] = await Promise.all([
      promRange(`avg(${perPod("container_cpu_usage_seconds_total", rate)})`, grid),
      promRange(`max(${perPod("container_cpu_usage_seconds_total", rate)})`, grid),
      promRange(`avg(${res("kube_pod_container_resource_requests", "cpu")})`, grid),
      promRange(`avg(${res("kube_pod_container_resource_limits", "cpu")})`, grid),
      promRange(`avg(${perPod("container_memory_working_set_bytes", same)})`, grid),
      promRange(`max(${perPod("container_memory_working_set_bytes", same)})`, grid),
      promRange(`avg(${res("kube_pod_container_resource_requests", "memory")})`, grid),
      promRange(`avg(${res("kube_pod_container_resource_limits", "memory")})`, grid),
    ]);
    if (!fresh()) return;
    const withTarget = (list, v, label) => (v == null ? list
      : [...list, { label, values: constant(grid, v), color: COLOR.target, dash: [6, 4] }]);
    draw("chart-cpu", grid.x, withTarget([
      { label: "usage (mean)", values: cpuAvg, color: COLOR.usage },
      { label: "usage (busiest pod)", values: cpuMax, color: COLOR.peak, width: 1 },
      { label: "request", values: cpuReq, color: COLOR.request },
      { label: "limit", values: cpuLim, color: COLOR.limit },
    ], hpa && hpa.cpuAverage, "HPA target"), { fmt: cores });
    draw("chart-memory", grid.x, withTarget([
      { label: "working set (mean)", values: memAvg, color: COLOR.usage },
      { label: "working set (largest pod)", values: memMax, color: COLOR.peak, width: 1 },
      { label: "request", values: memReq, color: COLOR.request },
      { label: "limit", values: memLim, color: COLOR.limit },
    ], hpa && hpa.memoryAverage, "HPA target"), { fmt: bytes, incrs: BINARY_INCRS });
  }

  async function loadUtilisation(sel, grid, hpa, fresh) {
    const util = await promRange(
      `100 * sum(rate(container_cpu_usage_seconds_total{${sel}}[${grid.window}]))` +
      ` / sum(kube_pod_container_resource_requests{${sel},resource="cpu"})`, grid);
    if (!fresh()) return;
    const series = [{ label: "utilisation", values: util, color: COLOR.usage }];
    let note = "no HPA targets this workload's CPU utilisation";
    if (hpa && hpa.cpuUtilisation != null) {
      series.push({ label: "HPA target", values: constant(grid, hpa.cpuUtilisation), color: COLOR.target, dash: [6, 4] });
      series.push({ label: "HPA's reading", values: onGrid(grid, hpa.readings), color: COLOR.hpa, pointsOnly: true });
      note = "";
    }
    draw("chart-utilisation", grid.x, series, { fmt: percent, note });
  }

  // The colocation plan's time-share table: cores it can lend in each hour of the next day, summed
  // over its pools; null for an hour it has no forecast for (it lends nothing then).
  function planned(colocation, hours) {
    const latest = colocation && colocation.status && colocation.status.latest;
    const rows = latest && latest.table ? latest.table.filter((r) => r.needCores != null) : [];
    if (!rows.length) return [];
    const values = hours.map((h) => {
      const at = rows.filter((r) => r.hour === h);
      return at.length ? at.reduce((sum, r) => sum + r.coresLendable, 0) : null;
    });
    return [{ label: "lent by the colocation plan", values, color: COLOR.hpa, withPoints: true }];
  }

  // The overcommit advisor's tidal table when it has one; otherwise the last day's usage per hour.
  // Either way with the colocation plan's lendable cores per hour when it runs.
  async function loadHours(overcommit, colocation, fresh) {
    const hours = Array.from({ length: 24 }, (_, h) => h);
    const plan = planned(colocation, hours);
    const latest = overcommit && overcommit.status && overcommit.status.latest;
    const tidal = latest && latest.tidal ? latest.tidal : [];
    if (tidal.some((row) => row.peakUsage.cpu != null)) {
      const by = (f) => hours.map((h) => { const r = tidal.find((row) => row.hour === h); return r ? f(r) : null; });
      if (!fresh()) return;
      $("hours-source").textContent = "overcommit advisor's tidal table, cores: weekly peak usage and what can be lent";
      const cap = latest.capacity && latest.capacity.cpu;
      draw("chart-hours", hours, [
        { label: "peak usage", values: by((r) => r.peakUsage.cpu), color: COLOR.usage, bars: true },
        { label: "lendable", values: by((r) => r.lendable.cpu), color: COLOR.lend, withPoints: true },
        ...(cap == null ? [] : [{ label: "capacity", values: hours.map(() => cap), color: COLOR.capacity, dash: [6, 4], width: 1 }]),
        ...plan,
      ], { fmt: plain, hours: true, xLabel: "hour of day (advisor's clock)" });
      return;
    }
    // Evaluated at the end of each hour, the current one included (its rate covers what has passed).
    const end = Math.ceil((Date.now() + state.skewMs) / 3600000) * 3600;
    const grid = { start: end - 23 * 3600, end, step: 3600 };
    grid.x = hours.map((h) => grid.start + h * 3600);
    const usage = await promRange("sum(rate(container_cpu_usage_seconds_total[1h]))", grid);
    if (!fresh()) return;
    const perHour = new Array(24).fill(null);
    grid.x.forEach((t, i) => { perHour[new Date((t - 3600) * 1000).getUTCHours()] = usage[i]; });
    $("hours-source").textContent = "mean CPU use of all pods per hour over the last day, cores";
    draw("chart-hours", hours, [{ label: "usage", values: perHour, color: COLOR.usage, bars: true }, ...plan],
      { fmt: plain, hours: true, xLabel: "hour of day (UTC)" });
  }

  async function loadPods(ns, workload, fresh) {
    const body = await getJSON("api/v1/metricsd/pods", { namespace: ns, workload });
    if (!fresh()) return body.data.pods.length;
    const table = $("pods");
    const tbody = table.querySelector("tbody");
    tbody.replaceChildren();
    const cell = (text, cls) => { const td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; return td; };
    const bar = (usage, limit) => {
      const td = document.createElement("td");
      const outer = document.createElement("div");
      outer.className = "bar";
      const inner = document.createElement("div");
      const share = usage != null && limit ? Math.min(1, usage / limit) : 0;
      inner.style.width = `${(share * 100).toFixed(1)}%`;
      inner.className = share > 0.9 ? "hot" : share > 0.7 ? "warm" : "";
      outer.title = limit ? `${(share * 100).toFixed(0)}% of limit` : "no limit";
      outer.appendChild(inner);
      td.appendChild(outer);
      return td;
    };
    const pods = body.data.pods.slice(0, 10);
    for (const p of pods) {
      const tr = document.createElement("tr");
      tr.append(cell(p.pod), cell(p.node),
        cell(cores(p.cpu.usage), "num"), cell(cores(p.cpu.request), "num"), cell(cores(p.cpu.limit), "num"),
        bar(p.cpu.usage, p.cpu.limit),
        cell(bytes(p.memory.usage), "num"), cell(bytes(p.memory.request), "num"), cell(bytes(p.memory.limit), "num"),
        bar(p.memory.usage, p.memory.limit));
      tbody.appendChild(tr);
    }
    table.dataset.rows = String(pods.length);
    return body.data.pods.length;
  }

  function summarise(ns, workload, podCount, hpa, overcommit) {
    const parts = [`${ns}/${workload}: ${podCount} pods`];
    if (hpa) {
      const s = hpa.status;
      parts.push(`HPA ${s.hpa}: ${s.currentReplicas} → ${s.desiredReplicas} replicas ` +
        `(bounds ${s.minReplicas}..${s.maxReplicas}), ${s.rule}${s.alerting ? ", ALERTING at max" : ""}`);
    } else {
      parts.push("no HPA");
    }
    const reqs = overcommit && overcommit.status && overcommit.status.latest ? overcommit.status.latest.requests : [];
    const rec = (r) => reqs.find((x) => x.namespace === ns && x.workload === workload && x.resource === r);
    const cpu = rec("cpu"), mem = rec("memory");
    if (cpu || mem) {
      parts.push(`recommended request per pod: CPU ${cpu ? cores(cpu.recommended) : "–"}, ` +
        `memory ${mem ? bytes(mem.recommended) : "–"}`);
    }
    $("summary").textContent = parts.join(" · ");
  }

  // ---- page flow -----------------------------------------------------------------------------

  async function load() {
    const seq = ++state.seq;
    const fresh = () => seq === state.seq;
    const ns = $("namespace").value, workload = $("workload").value;
    document.body.dataset.loaded = "";
    if (!ns || !workload) { setStatus("no workloads found"); return; }
    location.replace(`#namespace=${encodeURIComponent(ns)}&workload=${encodeURIComponent(workload)}&range=${$("range").value}`);
    for (const fig of document.querySelectorAll("figure.chart")) fig.dataset.state = "loading";
    setStatus("loading…");
    const sel = `namespace=${quote(ns)},workload=${quote(workload)}`;
    const grid = timeGrid(Number($("range").value));
    const [hpaDoc, overcommit, colocation] = await Promise.all([
      getJSON("api/v1/metricsd/hpa", {}, true).catch(() => null),
      getJSON("api/v1/metricsd/overcommit", {}, true).catch(() => null),
      getJSON("api/v1/metricsd/colocation", {}, true).catch(() => null),
    ]);
    const hpa = hpaOf(hpaDoc, ns, workload);
    const guard = (ids, p) => p.catch((e) => {
      if (fresh()) for (const id of ids) setFigure(id, "error", e.message);
      throw e;
    });
    const results = await Promise.allSettled([
      guard(["chart-cpu", "chart-memory"], loadResources(sel, grid, hpa, fresh)),
      guard(["chart-utilisation"], loadUtilisation(sel, grid, hpa, fresh)),
      guard(["chart-hours"], loadHours(overcommit, colocation, fresh)),
      guard([], loadPods(ns, workload, fresh)),
    ]);
    if (!fresh()) return;
    const podCount = results[3].status === "fulfilled" ? results[3].value : 0;
    summarise(ns, workload, podCount, hpa, overcommit);
    const failed = results.filter((r) => r.status === "rejected");
    setStatus(failed.length ? `error: ${failed[0].reason.message}` : `updated ${new Date().toLocaleTimeString()}`);
    document.body.dataset.loaded = `${ns}/${workload}`;
  }

  function setStatus(text) { $("status").textContent = text; }

  function fill(select, values, wanted) {
    select.replaceChildren(...values.map((v) => new Option(v, v)));
    if (wanted && values.includes(wanted)) select.value = wanted;
  }

  async function loadWorkloads(wanted) {
    const ns = $("namespace").value;
    fill($("workload"), ns ? await labelValues("workload", `{namespace=${quote(ns)},workload!=""}`) : [], wanted);
  }

  function schedule() {
    clearInterval(state.timer);
    state.timer = $("auto").checked ? setInterval(() => { if (!document.hidden) load(); }, REFRESH_MS) : null;
  }

  async function init() {
    const hash = new URLSearchParams(location.hash.slice(1));
    if (hash.get("range")) $("range").value = hash.get("range");
    try {
      fill($("namespace"), await labelValues("namespace", '{workload!=""}'), hash.get("namespace"));
      await loadWorkloads(hash.get("workload"));
    } catch (e) {
      setStatus(`error: ${e.message}`);
      return;
    }
    $("namespace").addEventListener("change", () => {
      loadWorkloads().then(load, (e) => setStatus(`error: ${e.message}`));
    });
    $("workload").addEventListener("change", load);
    $("range").addEventListener("change", load);
    $("auto").addEventListener("change", schedule);
    new ResizeObserver(() => {
      for (const [id, u] of state.charts) u.setSize({ width: Math.max(300, $(id).querySelector(".plot").clientWidth), height: 240 });
    }).observe(document.querySelector(".charts"));
    schedule();
    load();
  }

  init();
})();
