"""Readable tables of the consumers' decisions, for `metricsd hpa|vpa|overcommit|colocation status`.

Input is the JSON document the HTTP API serves at /api/v1/metricsd/<kind>: either
{"status": {...}, "history": [...]} or the bare history list. Pure: text in, text out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from metricsd.consumers.quantity import QuantityError, parse_quantity
from metricsd.consumers.wording import amount_words, hpa_entry_why

__all__ = ["format_status", "table"]


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces; None prints as "-"."""
    text = [[("-" if v is None else str(v)) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in text)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in text]
    return "\n".join(lines)


def _history(doc: object) -> list[Mapping[str, Any]]:
    if isinstance(doc, list):
        return [e for e in doc if isinstance(e, Mapping)]
    if isinstance(doc, Mapping):
        entries = doc.get("history", [])
        return [e for e in entries if isinstance(e, Mapping)] if isinstance(entries, list) else []
    raise ValueError("expected a JSON object with a history list, or a list")


def _num(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return "-" if value is None else str(value)


def _mib(value: object) -> str:
    """A byte amount (a number or a quantity string such as 5253177127 or 8Gi) in MiB."""
    try:
        return f"{parse_quantity(value) / 2**20:.0f}Mi"
    except (QuantityError, TypeError, ValueError):
        return _num(value)


def _metric(row: Mapping[str, Any]) -> str:
    name = str(row.get("metric", "")).split("/")[-1]
    target = row.get("target") or {}
    current = row.get("current")
    if target.get("type") == "Utilization":
        return f"{name} {_num(current)}%/{_num(target.get('value'))}%"
    if name == "memory":
        return f"{name} {_mib(current)}/{_mib(target.get('value'))}"
    return f"{name} {_num(current)}/{_num(target.get('value'))}"


def _spec_bounds(doc: object) -> dict[str, tuple[int | None, int | None]]:
    """Each HPA's own bounds from the document's status, for the words of entries that lack them."""
    targets = ((doc.get("status") or {}).get("targets") or []) if isinstance(doc, Mapping) else []
    return {str(t.get("hpa")): (t.get("minReplicas"), t.get("maxReplicas")) for t in targets if isinstance(t, Mapping)}


def _hpa(entries: Sequence[Mapping[str, Any]], spec_bounds: Mapping[str, tuple[int | None, int | None]]) -> str:
    rows = []
    for e in entries:
        res, inputs = e.get("result", {}), e.get("inputs", {})
        bounds = f"{res.get('minReplicas', '?')}..{res.get('maxReplicas', '?')}"
        if res.get("schedule"):
            bounds += f" {res['schedule']}"
        replicas = f"{inputs.get('currentReplicas')} -> {res.get('desiredReplicas', '-')} ({bounds})"
        metrics = ", ".join(_metric(m) for m in inputs.get("metrics", []))
        sources = sorted({str(m.get("source")) for m in inputs.get("metrics", [])})
        action = res.get("action", "none") + (" ALERT" if res.get("alert") else "")
        why = e.get("why") or hpa_entry_why(e, *spec_bounds.get(str(e.get("hpa")), (None, None)))
        rows.append([e.get("time"), e.get("hpa"), e.get("rule"), replicas, metrics, ",".join(sources), action, why])
    headers = ["TIME", "HPA", "RULE", "REPLICAS", "METRICS (current/target)", "SOURCE", "ACTION", "WHY"]
    if any("prediction" in e.get("result", {}) for e in entries):
        headers.append("FORECAST")
        for row, e in zip(rows, entries, strict=True):
            row.append(_forecast(e.get("result", {}).get("prediction")))
    return table(headers, rows)


def _forecast(p: Mapping[str, Any] | None) -> str:
    """A predictive HPA's column: the replicas its forecast asks for and its recent error, or why it
    fell back."""
    if not p:
        return "-"
    error = p.get("error")
    error_text = f" (error {100 * error:.0f}%)" if isinstance(error, int | float) else ""
    if p.get("active"):
        return f"{p.get('replicas')} replicas{error_text}"
    return f"off: {p.get('reason')}{error_text}"


def _vpa(entries: Sequence[Mapping[str, Any]]) -> str:
    rows = []
    for e in entries:
        recs = (e.get("result", {}).get("recommendation") or {}).get("containerRecommendations", [])
        conf = e.get("inputs", {}).get("containers", {})
        if not recs:
            rows.append([e.get("time"), e.get("vpa"), e.get("updateMode"), "-", "-", "-", "-", e.get("rule")])
        for r in recs:
            def span(res: str, r: Mapping[str, Any] = r) -> str:
                t, lo, hi = (r.get(k, {}).get(res) for k in ("target", "lowerBound", "upperBound"))
                if res == "memory":
                    t, lo, hi = (None if v is None else _mib(v) for v in (t, lo, hi))
                return "-" if t is None else f"{t} ({lo}..{hi})"
            c = conf.get(r.get("containerName"), {})
            rows.append([e.get("time"), e.get("vpa"), e.get("updateMode"), r.get("containerName"), span("cpu"),
                         span("memory"), _num(c.get("confidence")), e.get("rule")])
    return table(["TIME", "VPA", "MODE", "CONTAINER", "CPU target (lower..upper)", "MEMORY target (lower..upper)",
                  "CONFIDENCE (days)", "RULE"], rows)


def _overcommit(entries: Sequence[Mapping[str, Any]]) -> str:
    rows = []
    for e in entries:
        res = e.get("result", {})
        cluster = (res.get("reclaimable") or {}).get("cluster", {})
        cpu, mem = (cluster.get(r) for r in ("cpu", "memory"))
        rows.append([e.get("time"), e.get("advisor"), e.get("rule"),
                     None if cpu is None else amount_words(cpu, "cpu"),
                     None if mem is None else amount_words(mem, "memory"), e.get("inputs", {}).get("hoursOfHistory")])
    out = table(["TIME", "ADVISOR", "RULE", "CPU", "MEMORY", "HOURS SEEN"], rows)
    tidal = entries[-1].get("result", {}).get("tidal") if entries else None
    if tidal:
        def gib(v: object) -> str | None:
            return None if not isinstance(v, int | float) else f"{v / 2**30:.1f}"
        trows = [[f"{r['hour']:02d}:00", _num(r["peakUsage"].get("cpu")), _num(r["lendable"].get("cpu")),
                  gib(r["peakUsage"].get("memory")), gib(r["lendable"].get("memory"))] for r in tidal]
        out += "\n\nWhat the cluster can lend, by hour of the day (latest advice):\n"
        out += table(["HOUR", "PEAK CPU", "LENDABLE CPU", "PEAK MEM GiB", "LENDABLE MEM GiB"], trows)
    return out


def _colocation(entries: Sequence[Mapping[str, Any]]) -> str:
    rows = []
    for e in entries:
        for t in e.get("result", {}).get("transitions", []):
            rows.append([t.get("time"), t.get("node"), t.get("pool"), f"{t.get('from')} -> {t.get('to')}",
                         t.get("reason") + (" ALERT" if t.get("alert") else ""), t.get("deadline") or "-",
                         t.get("message")])
    out = table(["TIME", "NODE", "POOL", "MOVE", "REASON", "DEADLINE", "WHY"], rows) if rows else \
        f"Node moves: none in the last {len(entries)} syncs ({entries[-1].get('message')})"
    share = entries[-1].get("result", {}).get("table") if entries else None
    if share:
        trows = [[r["pool"], f"{r['hour']:02d}:00", _num(r["forecastCores"]), _num(r["needCores"]),
                  f"{r['nodesOnline']}/{r['nodes']}", r["nodesLendable"], _num(r["coresLendable"])] for r in share]
        out += "\n\nTime-share table, the next 24 hours (latest plan):\n"
        out += table(["POOL", "HOUR", "FORECAST CPU", "NEED CPU", "ONLINE NODES", "LENDABLE NODES",
                      "LENDABLE CPU"], trows)
    return out


def format_status(kind: str, doc: object, limit: int = 20) -> str:
    """The last `limit` decisions of one consumer as a table. Raises ValueError for an unknown kind
    or a document of the wrong shape."""
    formatters = {"vpa": _vpa, "overcommit": _overcommit, "colocation": _colocation}
    if kind not in formatters and kind != "hpa":
        raise ValueError(f"unknown consumer {kind!r}")
    entries = _history(doc)[-limit:] if limit > 0 else []
    if not entries:
        return f"no {kind} decisions yet"
    if kind == "hpa":
        return _hpa(entries, _spec_bounds(doc))
    return formatters[kind](entries)
