// metricsd's dashboard: two views over the series of the server that serves this page, drawn
// with uPlot.
//
// - workload: one workload's pods (CPU and memory against request, limit and the HPA's targets),
//   its CPU utilisation against the HPA's target next to its replicas over time (the bounds as the
//   schedules change them, a numbered marker at each scaling action, listed with its reason), the
//   VPA's recommendation against the request per container, and its busiest pods;
// - cluster: the nodes the colocation plan lends and returns over the day, the cluster's
//   capacity, requested, used and reclaimable cores and memory, and its usage by hour of day.
//
// On a server with tokens the first 401 or 403 brings up a form for a bearer token (auth.js), and
// the page starts again with it.
//
// <body data-loaded> is set once everything of a view is drawn ("namespace/workload" for the
// workload view, "cluster" for the cluster view), and each chart's <figure> reports its state
// (charts.js), so a browser test (tests/http/test_dashboard_browser.py) can tell a drawn chart from
// an empty one.

import { askForToken, asking, isAuthError, wireTokenForm } from "./auth.js";
import { resizeAll, setFigure } from "./charts.js";
import { loadCapacity, loadHours, loadNodes, summariseCluster } from "./cluster.js";
import { labelValues, quote, timeGrid } from "./data.js";
import { loadAdvice, loadPods, loadReplicas, loadResources, loadUtilisation, loadVpa } from "./workload.js";

const REFRESH_MS = 30000;
const VIEWS = ["workload", "cluster"];
const state = { seq: 0, timer: null, view: "workload" };
const $ = (id) => document.getElementById(id);

function setStatus(text) { $("status").textContent = text; }

// A failure to load: a refused token brings up the token form (which says why), anything else
// goes to the status.
function failed(e) {
  if (!isAuthError(e)) { setStatus(`error: ${e.message}`); return; }
  askForToken(e);
  setStatus(`waiting for a token (HTTP ${e.status})`);
}

// Runs the loaders of one view; a loader that fails marks its charts as failed and the others go on.
async function settle(fresh, jobs) {
  const results = await Promise.allSettled(jobs.map(([ids, p]) => p.catch((e) => {
    if (fresh()) for (const id of ids) setFigure(id, "error", e.message);
    throw e;
  })));
  return results;
}

async function loadWorkload(fresh, grid) {
  const ns = $("namespace").value, workload = $("workload").value;
  if (!ns || !workload) { setStatus("no workloads found"); return null; }
  const sel = `namespace=${quote(ns)},workload=${quote(workload)}`;
  const results = await settle(fresh, [
    [["chart-cpu", "chart-memory"], loadResources(sel, grid, fresh)],
    [["chart-utilisation"], loadUtilisation(sel, grid, fresh)],
    [["chart-replicas"], loadReplicas(sel, grid, fresh)],
    [["chart-vpa-cpu", "chart-vpa-memory"], loadVpa(sel, grid, fresh)],
    [[], loadAdvice(sel)],
    [[], loadPods(ns, workload, fresh)],
  ]);
  if (!fresh()) return results;
  const value = (i) => (results[i].status === "fulfilled" ? results[i].value : null);
  const parts = [`${ns}/${workload}: ${value(5) ?? 0} pods`];
  const hpa = value(2);
  parts.push(hpa ? `HPA ${hpa.name}: ${hpa.line}` : "no HPA");
  const vpa = value(3);
  if (vpa) parts.push(`VPA target ${vpa}`);
  if (value(4)) parts.push(value(4));
  $("summary").textContent = parts.join(" · ");
  return results;
}

async function loadCluster(fresh, grid) {
  const results = await settle(fresh, [
    [["chart-nodes"], loadNodes(grid, fresh)],
    [["chart-cores", "chart-bytes"], loadCapacity(grid, fresh)],
    [["chart-hours"], loadHours(fresh)],
  ]);
  if (fresh()) {
    const value = (i) => (results[i].status === "fulfilled" ? results[i].value : null);
    summariseCluster(value(0), value(1));
  }
  return results;
}

async function load() {
  if (asking()) return;
  const seq = ++state.seq;
  const fresh = () => seq === state.seq;
  const view = state.view;
  document.body.dataset.loaded = "";
  document.body.dataset.view = view;
  for (const v of VIEWS) {
    $(`view-${v}`).hidden = v !== view;
    $(`tab-${v}`).setAttribute("aria-selected", String(v === view));
  }
  const params = new URLSearchParams({ view, namespace: $("namespace").value, workload: $("workload").value,
    range: $("range").value });
  location.replace(`#${params}`);
  for (const fig of document.querySelectorAll(`#view-${view} figure.chart`)) fig.dataset.state = "loading";
  setStatus("loading…");
  const grid = timeGrid(Number($("range").value));
  const results = await (view === "cluster" ? loadCluster(fresh, grid) : loadWorkload(fresh, grid));
  if (!fresh() || results === null) return;
  resizeAll();
  const rejected = results.filter((r) => r.status === "rejected").map((r) => r.reason);
  if (rejected.length) {
    failed(rejected.find(isAuthError) || rejected[0]);
    if (asking()) return;
  } else {
    setStatus(`updated ${new Date().toLocaleTimeString()}`);
  }
  document.body.dataset.loaded = view === "cluster" ? "cluster" : `${$("namespace").value}/${$("workload").value}`;
}

function fill(select, values, wanted) {
  select.replaceChildren(...values.map((v) => new Option(v, v)));
  if (wanted && values.includes(wanted)) select.value = wanted;
}

// The namespace's workloads; the one asked for, else the one selected now if the namespace has it
// (a user may pick one before the list comes back), else the first.
async function loadWorkloads(wanted) {
  const ns = $("namespace").value;
  const values = ns ? await labelValues("workload", `{namespace=${quote(ns)},workload!=""}`) : [];
  fill($("workload"), values, wanted || $("workload").value);
}

function schedule() {
  clearInterval(state.timer);
  state.timer = $("auto").checked ? setInterval(() => { if (!document.hidden) load(); }, REFRESH_MS) : null;
}

function show(view) {
  state.view = VIEWS.includes(view) ? view : "workload";
  load();
}

// The namespaces and workloads, then the view: when the page opens, and again with a new token.
async function start() {
  const hash = new URLSearchParams(location.hash.slice(1));
  try {
    fill($("namespace"), await labelValues("namespace", '{workload!=""}'), $("namespace").value || hash.get("namespace"));
    await loadWorkloads($("workload").value || hash.get("workload"));
  } catch (e) {
    failed(e);
    return;
  }
  load();
}

function init() {
  const hash = new URLSearchParams(location.hash.slice(1));
  if (hash.get("range")) $("range").value = hash.get("range");
  state.view = VIEWS.includes(hash.get("view")) ? hash.get("view") : "workload";
  $("namespace").addEventListener("change", () => {
    loadWorkloads().then(() => show("workload"), failed);
  });
  $("workload").addEventListener("change", () => show("workload"));
  $("range").addEventListener("change", load);
  $("auto").addEventListener("change", schedule);
  for (const v of VIEWS) $(`tab-${v}`).addEventListener("click", () => show(v));
  wireTokenForm(start);
  new ResizeObserver(resizeAll).observe(document.querySelector("main"));
  schedule();
  start();
}

init();
