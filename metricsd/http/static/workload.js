// The workload view: one workload's pods against request, limit and the HPA's targets; its
// replicas over time with the bounds the schedules set and a marker at each scaling action; the
// VPA's recommendation against the request per container; its busiest pods.

import { BINARY_INCRS, COLOR, draw, setFigure } from "./charts.js";
import { getJSON, latest, onGrid, promInstant, promRange, promRangeBy, rawSamples } from "./data.js";
import { amountWords, bytes, cores, count, percent, statusLine } from "./words.js";

const $ = (id) => document.getElementById(id);
const ACTIONS_LISTED = 30;

// ---- CPU, memory and utilisation ------------------------------------------------------------

// An HPA target of this workload over time (schedules may change it), or null without one.
async function hpaTarget(sel, grid, metric, type) {
  const v = await promRange(`max(metricsd_hpa_metric_target{${sel},metric="${metric}",target_type="${type}"})`, grid);
  return v.some((x) => x != null) ? v : null;
}

export async function loadResources(sel, grid, fresh) {
  const perPod = (metric, fn) => `sum by (pod) (${fn(metric + "{" + sel + "}")})`;
  const rate = (s) => `rate(${s}[${grid.window}])`;
  const same = (s) => s;
  const res = (metric, r) => `sum by (pod) (${metric}{${sel},resource="${r}"})`;
  const [cpuAvg, cpuMax, cpuReq, cpuLim, memAvg, memMax, memReq, memLim, cpuTarget, memTarget] = await Promise.all([
    promRange(`avg(${perPod("container_cpu_usage_seconds_total", rate)})`, grid),
    promRange(`max(${perPod("container_cpu_usage_seconds_total", rate)})`, grid),
    promRange(`avg(${res("kube_pod_container_resource_requests", "cpu")})`, grid),
    promRange(`avg(${res("kube_pod_container_resource_limits", "cpu")})`, grid),
    promRange(`avg(${perPod("container_memory_working_set_bytes", same)})`, grid),
    promRange(`max(${perPod("container_memory_working_set_bytes", same)})`, grid),
    promRange(`avg(${res("kube_pod_container_resource_requests", "memory")})`, grid),
    promRange(`avg(${res("kube_pod_container_resource_limits", "memory")})`, grid),
    hpaTarget(sel, grid, "Resource/cpu", "AverageValue"),
    hpaTarget(sel, grid, "Resource/memory", "AverageValue"),
  ]);
  if (!fresh()) return;
  const withTarget = (list, v) => (v == null ? list
    : [...list, { label: "HPA target", values: v, color: COLOR.target, dash: [6, 4], stepped: true }]);
  draw("chart-cpu", grid.x, withTarget([
    { label: "usage (mean)", values: cpuAvg, color: COLOR.usage },
    { label: "usage (busiest pod)", values: cpuMax, color: COLOR.peak, width: 1 },
    { label: "request", values: cpuReq, color: COLOR.request },
    { label: "limit", values: cpuLim, color: COLOR.limit },
  ], cpuTarget), { fmt: cores });
  draw("chart-memory", grid.x, withTarget([
    { label: "working set (mean)", values: memAvg, color: COLOR.usage },
    { label: "working set (largest pod)", values: memMax, color: COLOR.peak, width: 1 },
    { label: "request", values: memReq, color: COLOR.request },
    { label: "limit", values: memLim, color: COLOR.limit },
  ], memTarget), { fmt: bytes, incrs: BINARY_INCRS });
}

export async function loadUtilisation(sel, grid, fresh) {
  const [util, target, readings] = await Promise.all([
    promRange(`100 * sum(rate(container_cpu_usage_seconds_total{${sel}}[${grid.window}]))` +
      ` / sum(kube_pod_container_resource_requests{${sel},resource="cpu"})`, grid),
    hpaTarget(sel, grid, "Resource/cpu", "Utilization"),
    rawSamples(`metricsd_hpa_metric_current{${sel},metric="Resource/cpu",target_type="Utilization"}`, grid),
  ]);
  if (!fresh()) return;
  const series = [{ label: "utilisation", values: util, color: COLOR.usage }];
  let note = "no HPA targets this workload's CPU utilisation";
  if (target != null) {
    series.push({ label: "HPA target", values: target, color: COLOR.target, dash: [6, 4], stepped: true });
    series.push({ label: "HPA's reading", values: onGrid(grid, readings.map((r) => [r.t, r.v])),
      color: COLOR.hpa, pointsOnly: true, pointSize: grid.rangeS > 3600 ? 3 : 5 });
    note = "";
  }
  // The readings are instants the line averages over; one far off it (4 pods at 550% before the
  // first scale-up) would squash the line, so the range follows the line and the target.
  draw("chart-utilisation", grid.x, series, { fmt: percent, note, rangeFrom: ["utilisation", "HPA target"] });
}

// ---- replicas and scaling actions -----------------------------------------------------------

// The scaling actions among the HPA's decisions: consecutive decisions to do the same thing (a dry
// run repeats its "would scale" every sync) are one action, with how often and until when.
// `currents` (raw samples of the current count, published with each decision) gives each action's
// starting count: the newest at or before it.
export function scalingActions(decisions, currents = []) {
  const out = [];
  let run = null;
  let k = 0, from = null;
  for (const d of decisions) {
    while (k < currents.length && currents[k].t <= d.t) from = currents[k++].v;
    const action = d.metric.action || "none";
    const same = run && action === run.action && d.v === run.desired && (d.metric.why || "") === run.why;
    if (action === "none") { run = null; continue; }
    if (same) { run.last = d.t; run.times++; continue; }
    run = { t: d.t, last: d.t, times: 1, action, from, desired: d.v, reason: d.metric.reason || "",
      why: d.metric.why || "", schedule: d.metric.schedule || "" };
    out.push(run);
  }
  out.forEach((a, i) => { a.n = i + 1; });
  return out;
}

const hhmm = (t) => new Date(t * 1000).toLocaleTimeString();

function actionMarkers(grid, actions, kind, label, color, hollow) {
  const mine = actions.filter((a) => a.action === kind);
  if (!mine.length) return [];
  const values = new Array(grid.x.length).fill(null);
  const labels = new Array(grid.x.length).fill(null);
  const at = new Array(grid.x.length).fill(null);
  for (const a of mine) {
    const i = Math.min(Math.max(Math.round((a.t - grid.start) / grid.step), 0), values.length - 1);
    values[i] = a.desired;
    labels[i] = labels[i] ? `${labels[i]},${a.n}` : String(a.n);
    at[i] = a;
  }
  return [{
    label, values, labels, color, pointsOnly: true, pointSize: 9, hollow,
    value: (i) => (at[i] ? `#${at[i].n} ${at[i].from ?? "?"} → ${at[i].desired}` : "–"),
  }];
}

function listActions(actions) {
  const table = $("actions");
  const tbody = table.querySelector("tbody");
  tbody.replaceChildren();
  const shown = actions.slice(-ACTIONS_LISTED).reverse();
  for (const a of shown) {
    const tr = document.createElement("tr");
    const cell = (text, cls) => { const td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; return td; };
    const when = a.times > 1 ? `${hhmm(a.t)} (${a.times} syncs, until ${hhmm(a.last)})` : hhmm(a.t);
    tr.append(cell(String(a.n), "num"), cell(when), cell(`${a.from ?? "?"} → ${a.desired}`, "num"),
      cell(a.action), cell(a.why || a.reason, "why"));
    tbody.appendChild(tr);
  }
  table.dataset.rows = String(shown.length);
  $("actions-section").hidden = shown.length === 0;
}

// Returns what the summary says of the HPA: {name, line} or null without one.
export async function loadReplicas(sel, grid, fresh) {
  const kinds = ["current", "desired", "min", "max"];
  const [[current, desired, min, max], decisions, currents] = await Promise.all([
    Promise.all(kinds.map((k) => promRange(`max(metricsd_hpa_${k}_replicas{${sel}})`, grid))),
    rawSamples(`metricsd_hpa_decision{${sel}}`, grid),
    rawSamples(`metricsd_hpa_current_replicas{${sel}}`, grid),
  ]);
  if (!fresh()) return null;
  if (![current, desired, min, max].some((v) => v.some((x) => x != null)) && !decisions.length) {
    setFigure("chart-replicas", "absent", "no HPA scales this workload");
    $("actions-section").hidden = true;
    return null;
  }
  const actions = scalingActions(decisions, currents);
  draw("chart-replicas", grid.x, [
    // drawn in this order, so the replica count lies on top of a bound or wish it equals
    { label: "min", values: min, color: COLOR.bound, stepped: true, width: 1.5, dash: [6, 4], fmt: count },
    { label: "max", values: max, color: COLOR.limit, stepped: true, width: 1.5, dash: [6, 4], fmt: count },
    { label: "desired", values: desired, color: COLOR.hpa, stepped: true, width: 1, dash: [2, 3], fmt: count },
    { label: "replicas", values: current, color: COLOR.usage, stepped: true, width: 2.5, fmt: count },
    ...actionMarkers(grid, actions, "scaled", "scaling action", COLOR.action, false),
    ...actionMarkers(grid, actions, "dry-run", "dry run (would scale)", COLOR.action, true),
    ...actionMarkers(grid, actions, "failed", "failed action", COLOR.limit, false),
  ], { fmt: count, note: actions.length ? "numbered markers: the scaling actions listed below" : "" });
  listActions(actions);
  const last = decisions[decisions.length - 1];
  if (!last) return null;
  const name = last.metric.hpa || "";
  const line = statusLine(latest(current), last.v, latest(min), latest(max), last.metric.why || last.metric.reason);
  return { name, line };
}

// ---- the VPA --------------------------------------------------------------------------------

const BOUNDS = [["target", "target", COLOR.hpa, undefined, 2], ["upper", "upper bound", COLOR.bound, [4, 3], 1],
  ["lower", "lower bound", COLOR.bound, [4, 3], 1]];

async function vpaChart(id, sel, grid, resource, metric, fmt, incrs, fresh) {
  const [recs, requests] = await Promise.all([
    promRangeBy(`max by (container, bound) (${metric}{${sel},bound=~"target|lower|upper"})`, grid,
      (m) => `${m.container}/${m.bound}`),
    promRangeBy(`avg by (container) (kube_pod_container_resource_requests{${sel},resource="${resource}"})`, grid,
      (m) => m.container),
  ]);
  if (!fresh()) return null;
  const containers = [...new Set([...recs.keys()].map((k) => k.split("/")[0]))].sort();
  if (!containers.length) { setFigure(id, "absent", "no VPA recommends for this workload"); return null; }
  const series = [], bands = [];
  for (const c of containers) {
    const name = (what) => (containers.length > 1 ? `${c}: ${what}` : what);
    for (const [bound, what, color, dash, width] of BOUNDS) {
      const values = recs.get(`${c}/${bound}`);
      if (values) series.push({ label: name(what), values, color, dash, width, stepped: true });
    }
    bands.push([name("upper bound"), name("lower bound")]);
    series.push({ label: name("request"), values: requests.get(c) || new Array(grid.x.length).fill(null),
      color: COLOR.request });
  }
  draw(id, grid.x, series, { fmt, incrs, bands, note: "per pod: the recommendation's target between its bounds" });
  const target = latest(recs.get(`${containers[0]}/target`) || []);
  const request = latest(requests.get(containers[0]) || []);
  return { target, request };
}

export async function loadVpa(sel, grid, fresh) {
  const [cpu, memory] = await Promise.all([
    vpaChart("chart-vpa-cpu", sel, grid, "cpu", "metricsd_vpa_recommendation_cores", cores, undefined, fresh),
    vpaChart("chart-vpa-memory", sel, grid, "memory", "metricsd_vpa_recommendation_bytes", bytes, BINARY_INCRS,
      fresh),
  ]);
  if (!cpu && !memory) return null;
  const part = (r, fmt, name) => (r && r.target != null ? `${name} ${fmt(r.target)} (request ${fmt(r.request)})` : null);
  return [part(cpu, cores, "CPU"), part(memory, bytes, "memory")].filter(Boolean).join(", ");
}

// ---- the overcommit advisor on this workload --------------------------------------------------

export async function loadAdvice(sel) {
  const rows = await promInstant(`{__name__=~"metricsd_overcommit_(recommended_request|reclaimable)_(cores|bytes)",${sel}}`);
  const get = (name) => rows.filter((r) => r.metric.__name__ === name).reduce((a, r) => (a == null ? r.value : a + r.value), null);
  const parts = [];
  for (const [resource, unit, fmt, name] of [["cpu", "cores", cores, "CPU"], ["memory", "bytes", bytes, "memory"]]) {
    const rec = get(`metricsd_overcommit_recommended_request_${unit}`);
    const reclaim = get(`metricsd_overcommit_reclaimable_${unit}`);
    if (rec == null) continue;
    parts.push(`${name} ${fmt(rec)} a pod` + (reclaim == null ? "" : ` (${amountWords(reclaim, resource)})`));
  }
  return parts.length ? `overcommit advisor's request: ${parts.join(", ")}` : null;
}

// ---- the busiest pods -----------------------------------------------------------------------

export async function loadPods(ns, workload, fresh) {
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
