// How values read on the page: units, and the consumers' numbers in words an owner understands.
//
// amountWords, reclaimableWords and statusLine are the page's copies of metricsd/consumers/wording.py
// (amount_words, reclaimable_words, hpa_status_line): the log, `metricsd overcommit status` and the
// page must say the same thing. Both are checked against tests/consumers/data/wording_cases.json
// (the Python tests directly, these in Chromium by tests/http/test_dashboard_browser.py).
// The HPA's reason in words is not rebuilt here: it arrives as the `why` label of
// metricsd_hpa_decision, written by the Python function.

const GIB = 2 ** 30;

export function cores(v) {
  if (v == null) return "–";
  return Math.abs(v) < 1 ? `${Math.round(v * 1000)}m` : v.toFixed(2);
}

export function bytes(v) {
  if (v == null) return "–";
  const units = ["B", "Ki", "Mi", "Gi", "Ti"];
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${v.toFixed(Math.abs(v) >= 100 || i === 0 ? 0 : 1)}${units[i]}`;
}

export const percent = (v) => (v == null ? "–" : `${v.toFixed(0)}%`);
export const plain = (v) => (v == null ? "–" : v.toFixed(1));
export const count = (v) => (v == null ? "–" : String(Math.round(v)));

// One resource's reclaimable amount: "54.53 cores reclaimable" or "under-requested by 48.42 GiB".
// Negative means the pods' weekly peaks need more than they request; one that prints as 0.00 is not.
export function amountWords(value, resource, reclaimableWord = true) {
  const [amount, unit] = resource === "cpu" ? [value, "cores"] : [value / GIB, "GiB"];
  if (amount < 0 && (-amount).toFixed(2) !== "0.00") return `under-requested by ${(-amount).toFixed(2)} ${unit}`;
  return `${(amount > 0 ? amount : 0).toFixed(2)} ${unit}` + (reclaimableWord ? " reclaimable" : "");
}

// The advisor's cluster total, {cpu: cores, memory: bytes}, as one phrase.
export function reclaimableWords(cluster) {
  const reclaim = [], short = [];
  for (const [resource, name] of [["cpu", "CPU"], ["memory", "memory"]]) {
    const value = cluster[resource];
    if (value == null) continue;
    const words = amountWords(value, resource, false);
    if (words.startsWith("under-requested")) short.push(`${name} ${words}`);
    else reclaim.push(words);
  }
  if (!reclaim.length && !short.length) return "reclaimable now: nothing measured";
  if (!reclaim.length) return "nothing reclaimable now: " + short.join(", ");
  return "reclaimable now: " + reclaim.join(", ") + short.map((s) => `; ${s}`).join("");
}

// "34 -> 36 replicas (bounds 36..60): schedule evening-peak raises the minimum from 10 to 36".
export function statusLine(current, desired, min, max, why) {
  const bounds = `(bounds ${min == null ? "?" : min}..${max == null ? "?" : max})`;
  let head;
  if (current == null) head = "no replica count";
  else if (desired == null || desired === current) head = `stays at ${current} replicas`;
  else head = `${current} -> ${desired} replicas`;
  return `${head} ${bounds}: ${why}`;
}
