// Reading the server that serves the page: the Prometheus query API and the native JSON API.
//
// Every number the page draws comes from series, the consumers' decisions included (they publish
// them as metricsd_* series, consumers/recording.py), so the page draws the same on `metricsd up`
// and on a cluster's proxy, where the consumers run in processes of their own.

const STEPS = [10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600];
const TOKEN_KEY = "metricsd.token";
export const clock = { skewMs: 0 };

// The bearer token a server with tokens needs (auth.js asks for it), kept in sessionStorage: this
// tab only, gone when it closes, never in a URL. Where storage is refused, it lasts for this page.
let tokenInMemory = "";
export const token = {
  get() {
    try { return sessionStorage.getItem(TOKEN_KEY) || ""; } catch { return tokenInMemory; }
  },
  set(value) {
    tokenInMemory = value;
    try { sessionStorage.setItem(TOKEN_KEY, value); } catch { /* kept in memory */ }
  },
  forget() {
    tokenInMemory = "";
    try { sessionStorage.removeItem(TOKEN_KEY); } catch { /* nothing kept */ }
  },
};

// The server's token check said no: 401 (no token, or one it does not know) or 403 (a token
// without the role). `sent` says whether this request carried a token.
export class AuthError extends Error {
  constructor(status, message, sent) {
    super(message);
    this.name = "AuthError";
    this.status = status;
    this.sent = sent;
  }
}

export async function getJSON(path, params = {}) {
  const url = new URL(path, document.baseURI);
  for (const [k, v] of Object.entries(params)) url.searchParams.append(k, String(v));
  const headers = { Accept: "application/json" };
  const bearer = token.get();
  if (bearer) headers.Authorization = `Bearer ${bearer}`;
  const resp = await fetch(url, { headers });
  const date = resp.headers.get("Date");
  if (date) clock.skewMs = Date.parse(date) - Date.now(); // draw on the server's clock
  const body = await resp.json().catch(() => null); // a proxy in front may answer in HTML
  const message = body?.error || `${resp.status} ${resp.statusText}`;
  if (resp.status === 401 || resp.status === 403) throw new AuthError(resp.status, message, Boolean(bearer));
  if (!resp.ok || !body || body.status === "error") throw new Error(message);
  return body;
}

export const quote = (s) => '"' + s.replace(/\\/g, "\\\\").replace(/"/g, '\\"') + '"';

export async function labelValues(name, match) {
  return (await getJSON(`api/v1/label/${name}/values`, { "match[]": match })).data;
}

export function serverNow() {
  return (Date.now() + clock.skewMs) / 1000;
}

// start, start+step, ..., end over the last rangeS seconds, about 300 points.
export function timeGrid(rangeS) {
  const step = STEPS.find((s) => s >= rangeS / 300) || STEPS[STEPS.length - 1];
  const end = Math.floor(serverNow() / step) * step; // a later end would cut rate() windows short
  const start = end - Math.floor(rangeS / step) * step;
  const x = [];
  for (let t = start; t <= end; t += step) x.push(t);
  return { start, end, step, x, rangeS, window: `${Math.max(60, step)}s` };
}

function onGridValues(grid, values) {
  const out = new Array(grid.x.length).fill(null);
  for (const [t, v] of values) {
    const i = Math.round((t - grid.start) / grid.step);
    const f = parseFloat(v);
    if (i >= 0 && i < out.length && Number.isFinite(f)) out[i] = f;
  }
  return out;
}

// A PromQL range query reduced to one series, laid onto the grid.
export async function promRange(query, grid) {
  const body = await getJSON("api/v1/query_range", { query, start: grid.start, end: grid.end, step: grid.step });
  const series = body.data.result[0];
  return series ? onGridValues(grid, series.values) : new Array(grid.x.length).fill(null);
}

// A PromQL range query, one array per series keyed by `key(labels)`.
export async function promRangeBy(query, grid, key) {
  const body = await getJSON("api/v1/query_range", { query, start: grid.start, end: grid.end, step: grid.step });
  const out = new Map();
  for (const s of body.data.result) out.set(key(s.metric), onGridValues(grid, s.values));
  return out;
}

// An instant PromQL query: [{metric, value}] at the server's now.
export async function promInstant(query) {
  const body = await getJSON("api/v1/query", { query });
  return body.data.result.map((s) => ({ metric: s.metric, value: parseFloat(s.value[1]) }));
}

// The raw samples of a selector over the grid's range (a range vector evaluated at its end):
// [{metric, t, v}] in time order, where a range query would repeat each sample for five minutes.
export async function rawSamples(selector, grid) {
  const now = serverNow();
  const body = await getJSON("api/v1/query", { query: `${selector}[${Math.ceil(now - grid.start)}s]`, time: now });
  const out = [];
  for (const s of body.data.result) {
    for (const [t, v] of s.values) out.push({ metric: s.metric, t, v: parseFloat(v) });
  }
  return out.sort((a, b) => a.t - b.t);
}

// Points [t, v] on the grid: each at its nearest grid time (the later point wins).
export function onGrid(grid, points) {
  const out = new Array(grid.x.length).fill(null);
  for (const [t, v] of points) {
    const i = Math.min(Math.round((t - grid.start) / grid.step), out.length - 1);
    if (i >= 0 && t <= grid.end + grid.step) out[i] = v;
  }
  return out;
}

export const constant = (grid, v) => (v == null ? null : grid.x.map(() => v));

// The newest non-null value of an array.
export function latest(values) {
  for (let i = values.length - 1; i >= 0; i--) if (values[i] != null) return values[i];
  return null;
}
