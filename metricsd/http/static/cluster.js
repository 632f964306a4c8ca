// The cluster view: the nodes the colocation plan lends and returns over the day; the cluster's
// capacity, requested, used and reclaimable cores and memory; and its usage by hour of the day
// with what can be lent.

import { BINARY_INCRS, COLOR, draw } from "./charts.js";
import { latest, promInstant, promRange, promRangeBy, serverNow } from "./data.js";
import { amountWords, bytes, count, plain, reclaimableWords } from "./words.js";

const $ = (id) => document.getElementById(id);
const sumOf = (...arrays) => arrays[0].map((_, i) => {
  const present = arrays.map((a) => a[i]).filter((v) => v != null);
  return present.length ? present.reduce((a, b) => a + b, 0) : null;
});
const missing = (grid) => new Array(grid.x.length).fill(null);

// Nodes per phase of the colocation plan (summed over pools): online, moving either way, lent.
// Returns {online, transition, offline} now, or null without a plan.
export async function loadNodes(grid, fresh) {
  const byPhase = await promRangeBy("sum by (phase) (metricsd_colocation_nodes)", grid, (m) => m.phase);
  if (!fresh()) return null;
  const phase = (p) => byPhase.get(p) || missing(grid);
  const online = phase("Online");
  const transition = sumOf(phase("OnlineToOffline"), phase("OfflineToOnline"));
  const offline = phase("Offline");
  draw("chart-nodes", grid.x, [
    { label: "online", values: online, color: COLOR.usage, stepped: true, fmt: count },
    { label: "in transition", values: transition, color: COLOR.transition, stepped: true, fmt: count },
    { label: "offline (lent)", values: offline, color: COLOR.offline, stepped: true, fmt: count },
  ], { fmt: count, emptyNote: "no colocation plan publishes here (metricsd colocation)",
    note: "in transition: draining to be lent, or returning with notice" });
  if (!byPhase.size) return null;
  return { online: latest(online), transition: latest(transition), offline: latest(offline) };
}

// Capacity, requests and use of one resource across the cluster, with the advisor's reclaimable
// amount (negative: under-requested) and, for CPU, the cores the colocation plan lends.
async function capacityChart(id, grid, resource, fresh) {
  const cpu = resource === "cpu";
  const usage = cpu ? `sum(rate(container_cpu_usage_seconds_total[${grid.window}]))`
    : "sum(container_memory_working_set_bytes)";
  const unit = cpu ? "cores" : "bytes";
  const [capacity, requested, used, reclaimable, lent] = await Promise.all([
    promRange(`sum(kube_node_status_capacity{resource="${resource}"})`, grid),
    promRange(`sum(kube_pod_container_resource_requests{resource="${resource}"})`, grid),
    promRange(usage, grid),
    promRange(`sum(metricsd_overcommit_cluster_reclaimable_${unit})`, grid),
    cpu ? promRange("sum(metricsd_colocation_lent_cores)", grid) : Promise.resolve(missing(grid)),
  ]);
  if (!fresh()) return null;
  const fmt = cpu ? plain : bytes;
  const series = [
    { label: "capacity", values: capacity, color: COLOR.capacity, dash: [6, 4], width: 1 },
    { label: "requested", values: requested, color: COLOR.request },
    { label: "used", values: used, color: COLOR.usage },
    { label: "reclaimable", values: reclaimable, color: COLOR.reclaim, stepped: true, width: 2.5,
      fmt: (v) => (v == null ? "–" : amountWords(v, resource)) },
  ];
  if (lent.some((v) => v != null)) {
    series.push({ label: "lent by the colocation plan", values: lent, color: COLOR.lend, stepped: true });
  }
  draw(id, grid.x, series, { fmt, incrs: cpu ? undefined : BINARY_INCRS,
    note: "reclaimable: requests above the overcommit advisor's weekly peak + buffer; below 0: under-requested" });
  return latest(reclaimable);
}

// The overcommit advisor's tidal table when it publishes one; otherwise the last day's usage per
// hour. Either way with the cores the colocation plan can lend in each hour it has a forecast for.
export async function loadHours(fresh) {
  const hours = Array.from({ length: 24 }, (_, h) => h);
  const byHour = (rows) => hours.map((h) => {
    const r = rows.find((row) => parseInt(row.metric.hour, 10) === h);
    return r ? r.value : null;
  });
  const [peak, lendable, capacity, plan] = await Promise.all([
    promInstant("sum by (hour) (metricsd_overcommit_peak_usage_cores)"),
    promInstant("sum by (hour) (metricsd_overcommit_lendable_cores)"),
    promInstant("sum(metricsd_overcommit_capacity_cores)"),
    promInstant("sum by (hour) (metricsd_colocation_planned_lendable_cores" +
      " and on (plan, pool, hour) metricsd_colocation_forecast_cores)"),
  ]);
  const planned = plan.length
    ? [{ label: "lent by the colocation plan", values: byHour(plan), color: COLOR.hpa, withPoints: true }] : [];
  if (peak.length) {
    if (!fresh()) return;
    $("hours-source").textContent = "overcommit advisor's tidal table, cores: weekly peak usage and what can be lent";
    const cap = capacity.length ? capacity[0].value : null;
    draw("chart-hours", hours, [
      { label: "peak usage", values: byHour(peak), color: COLOR.usage, bars: true },
      { label: "lendable", values: byHour(lendable), color: COLOR.lend, withPoints: true },
      ...(cap == null ? [] : [{ label: "capacity", values: hours.map(() => cap), color: COLOR.capacity, dash: [6, 4], width: 1 }]),
      ...planned,
    ], { fmt: plain, hours: true, xLabel: "hour of day (advisor's clock)" });
    return;
  }
  // Evaluated at the end of each hour, the current one included (its rate covers what has passed).
  const end = Math.ceil(serverNow() / 3600) * 3600;
  const grid = { start: end - 23 * 3600, end, step: 3600 };
  grid.x = hours.map((h) => grid.start + h * 3600);
  const usage = await promRange("sum(rate(container_cpu_usage_seconds_total[1h]))", grid);
  if (!fresh()) return;
  const perHour = new Array(24).fill(null);
  grid.x.forEach((t, i) => { perHour[new Date((t - 3600) * 1000).getUTCHours()] = usage[i]; });
  $("hours-source").textContent = "mean CPU use of all pods per hour over the last day, cores";
  draw("chart-hours", hours, [{ label: "usage", values: perHour, color: COLOR.usage, bars: true }, ...planned],
    { fmt: plain, hours: true, xLabel: "hour of day (UTC)" });
}

export async function loadCapacity(grid, fresh) {
  const [cpu, memory] = await Promise.all([
    capacityChart("chart-cores", grid, "cpu", fresh),
    capacityChart("chart-bytes", grid, "memory", fresh),
  ]);
  return { cpu, memory };
}

export function summariseCluster(nodes, reclaim) {
  const parts = [];
  if (nodes) {
    parts.push(`colocation plan: ${count(nodes.online)} nodes online, ${count(nodes.transition)} in transition, ` +
      `${count(nodes.offline)} lent`);
  }
  if (reclaim && (reclaim.cpu != null || reclaim.memory != null)) parts.push(reclaimableWords(reclaim));
  $("summary").textContent = parts.join(" · ") || "no consumer publishes here yet";
}
