"""metricsd's own JSON API under ``/api/v1/metricsd/``, for dashboards and scripts.

Numbers are JSON numbers; a missing value (and a non-finite one) is ``null``. Times are
milliseconds since the epoch. Parameters mirror ``metricsd query``: ``metric``, ``selector``
(``a="x",b=~"y.*"``), ``fn``, ``window``, ``across``, ``by``, ``ratio_*``, and ``time`` or
``start``/``end``/``step``. The OpenAPI document at ``openapi.json`` describes every handler.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from metricsd.clock import Clock
from metricsd.http.openapi import openapi_document
from metricsd.http.params import ApiError, Params, bad, positive_int, read_params
from metricsd.http.promapi import success
from metricsd.http.selfmetrics import SelfMetrics
from metricsd.http.settings import HttpSettings
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import MetricsBackend
from metricsd.rpc.wire import ACROSS_FNS, SERIES_FNS, labels_from_pb, matchers_to_pb
from metricsd.selector import InvalidSelector, Matcher, parse_selector

__all__ = ["NativeAPI"]

_CPU = "container_cpu_usage_seconds_total"
_MEMORY = "container_memory_working_set_bytes"
_REQUESTS = "kube_pod_container_resource_requests"
_LIMITS = "kube_pod_container_resource_limits"

_PerPod = dict[tuple[str, str], tuple[float, dict[str, str]]]


def _num(v: float) -> float | None:
    return v if math.isfinite(v) else None


def _selector(params: Params, metric_param: str, selector_param: str, extra: str = "") -> list[Matcher]:
    metric = params.require(metric_param)
    text = ",".join(x for x in (params.get(selector_param) or "", extra) if x)
    try:
        return parse_selector(text, metric)
    except InvalidSelector as e:
        raise bad(selector_param, str(e)) from None


def _choice(params: Params, name: str, choices: Mapping[str, Any], default: str) -> Any:
    v = params.get(name) or default
    if v not in choices:
        raise bad(name, f"{v!r} is not one of {', '.join(sorted(choices))}")
    return choices[v]


def aggregate_request(params: Params, now_ms: int) -> pb.AggregateRequest:
    """The gRPC Aggregate question asked with HTTP parameters."""
    req = pb.AggregateRequest(across=_choice(params, "across", ACROSS_FNS, "avg"))
    req.query.matchers.extend(matchers_to_pb(_selector(params, "metric", "selector")))
    req.query.series_fn = _choice(params, "fn", SERIES_FNS, "rate")
    req.query.window_ms = params.duration_ms("window", 60_000)
    if req.across == pb.ACROSS_QUANTILE:
        try:
            req.quantile = float(params.get("quantile") or "0.9")
        except ValueError:
            raise bad("quantile", f"cannot parse {params.get('quantile')!r} as a number") from None
    by = params.get("by") or ""
    req.group_by.extend(b.strip() for b in by.split(",") if b.strip())
    if params.get("ratio_metric"):
        # The denominator shares the numerator's matchers apart from the metric name.
        sel = params.get("selector") or ""
        den = _selector(params, "ratio_metric", "ratio_selector", sel)
        req.denominator.matchers.extend(matchers_to_pb(den))
        req.denominator.series_fn = _choice(params, "ratio_fn", SERIES_FNS, "last")
        req.denominator.window_ms = params.duration_ms("ratio_window", 300_000)
    if params.get("start") or params.get("end"):
        req.start_ms = params.time_ms("start", now_ms - 3_600_000)
        req.end_ms = params.time_ms("end", now_ms)
        req.step_ms = params.duration_ms("step", 60_000)
        if req.end_ms < req.start_ms:
            raise bad("end", "end timestamp must not be before start time")
        if req.step_ms <= 0:
            raise bad("step", "must be positive")
    else:
        req.start_ms = req.end_ms = params.time_ms("time", now_ms)
    return req


def aggregate_json(resp: pb.AggregateResponse) -> dict[str, Any]:
    t = len(resp.timestamps)
    values = np.array(resp.values, dtype=np.float64).reshape(len(resp.groups), t)
    return {
        "timestamps": list(resp.timestamps),
        "groups": [
            {"labels": dict(labels_from_pb(g.labels)), "values": [_num(float(v)) for v in values[i]]}
            for i, g in enumerate(resp.groups)
        ],
        "seriesScanned": resp.series_scanned,
        "samplesScanned": resp.samples_scanned,
    }


class NativeAPI:
    def __init__(self, backend: MetricsBackend, settings: HttpSettings, clock: Clock, metrics: SelfMetrics) -> None:
        self.backend = backend
        self.settings = settings
        self.clock = clock
        self.metrics = metrics

    def add_routes(self, app: web.Application) -> None:
        base = "/api/v1/metricsd"
        app.router.add_get(f"{base}/aggregate", self.aggregate)
        app.router.add_post(f"{base}/aggregate", self.aggregate)
        app.router.add_get(f"{base}/pods", self.pods)
        app.router.add_get(f"{base}/series", self.series)
        app.router.add_get(f"{base}/stats", self.stats)
        app.router.add_get(f"{base}/openapi.json", self.openapi)
        app.router.add_get("/metrics", self.self_metrics)

    async def aggregate(self, request: web.Request) -> web.Response:
        params = await read_params(request)
        req = aggregate_request(params, self.clock.now_ms())
        started = self.clock.monotonic()
        resp = await self.backend.aggregate(req)
        self.metrics.query_duration.labels(path="native").observe(self.clock.monotonic() - started)
        return success(aggregate_json(resp))

    async def _per_pod(self, matchers: Sequence[Matcher], fn: Any, window_ms: int, t: int,
                       by: Sequence[str] = ("namespace", "pod")) -> _PerPod:
        req = pb.AggregateRequest(across=pb.ACROSS_SUM, group_by=list(by), start_ms=t, end_ms=t)
        req.query.matchers.extend(matchers_to_pb(matchers))
        req.query.series_fn = fn
        req.query.window_ms = window_ms
        resp = await self.backend.aggregate(req)
        out: _PerPod = {}
        for i, g in enumerate(resp.groups):
            labels = dict(labels_from_pb(g.labels))
            if resp.numerator.count[i] > 0:
                out[(labels.get("namespace", ""), labels.get("pod", ""))] = (float(resp.values[i]), labels)
        return out

    async def pods(self, request: web.Request) -> web.Response:
        """Pods of a workload with their latest usage, requests and limits, busiest CPU first."""
        params = await read_params(request)
        namespace = params.require("namespace")
        workload = params.require("workload")
        t = params.time_ms("time", self.clock.now_ms())
        window = params.duration_ms("window", 120_000)
        look = self.settings.lookback_ms
        sel = f'namespace="{_escape(namespace)}",workload="{_escape(workload)}"'
        cpu_sel = parse_selector(sel, _CPU)
        mem_sel = parse_selector(sel, _MEMORY)
        req_cpu, req_mem, lim_cpu, lim_mem = (
            parse_selector(f'{sel},resource="{res}"', name)
            for name in (_REQUESTS, _LIMITS) for res in ("cpu", "memory")
        )
        cpu, mem, rc, rm, lc, lm = await asyncio.gather(
            self._per_pod(cpu_sel, pb.SERIES_RATE, window, t, ("namespace", "pod", "node")),
            self._per_pod(mem_sel, pb.SERIES_LAST, look, t, ("namespace", "pod", "node")),
            self._per_pod(req_cpu, pb.SERIES_LAST, look, t),
            self._per_pod(req_mem, pb.SERIES_LAST, look, t),
            self._per_pod(lim_cpu, pb.SERIES_LAST, look, t),
            self._per_pod(lim_mem, pb.SERIES_LAST, look, t),
        )
        keys = sorted(set(cpu) | set(mem) | set(rc) | set(rm))

        def val(d: _PerPod, k: tuple[str, str]) -> float | None:
            return _num(d[k][0]) if k in d else None

        pods = []
        for k in keys:
            node = (cpu.get(k) or mem.get(k) or (0.0, {}))[1].get("node", "")
            pods.append({
                "namespace": k[0], "pod": k[1], "node": node,
                "cpu": {"usage": val(cpu, k), "request": val(rc, k), "limit": val(lc, k)},
                "memory": {"usage": val(mem, k), "request": val(rm, k), "limit": val(lm, k)},
            })
        pods.sort(key=lambda p: -(p["cpu"]["usage"] or 0.0))  # type: ignore[index]
        return success({"namespace": namespace, "workload": workload, "time": t, "pods": pods})

    async def series(self, request: web.Request) -> web.Response:
        params = await read_params(request)
        selectors = params.matchers("match[]") + params.matchers("match")
        if not selectors:
            raise bad("match[]", "parameter is missing")
        limit = positive_int(params, "limit", 0)
        resps = await asyncio.gather(*(
            self.backend.list_series(pb.ListSeriesRequest(matchers=matchers_to_pb(m), limit=limit))
            for m in selectors
        ))
        seen: dict[int, dict[str, str]] = {}
        for r in resps:
            for s in r.series:
                seen.setdefault(s.id, dict(labels_from_pb(s.labels)))
        rows = [{"id": f"{sid:016x}", "labels": labels}
                for sid, labels in sorted(seen.items(), key=lambda kv: sorted(kv[1].items()))]
        return success(rows[:limit] if limit else rows)

    async def stats(self, request: web.Request) -> web.Response:
        st, health = await asyncio.gather(self.backend.stats(), self.backend.health())
        return success({
            "series": st.series, "samples": st.samples, "pods": st.pods, "chunkBytes": st.chunk_bytes,
            "chunkSamples": st.chunk_samples, "bytesPerSample": st.bytes_per_sample,
            "headSamples": st.head_samples, "rollupBuckets": st.rollup_buckets, "rejected": dict(st.rejected),
            "health": {"status": pb.HealthResponse.Status.Name(health.status), "member": health.member,
                       "version": health.version},
        })

    async def openapi(self, request: web.Request) -> web.Response:
        return web.json_response(openapi_document())

    async def self_metrics(self, request: web.Request) -> web.Response:
        try:
            self.metrics.observe_stats(await self.backend.stats())
        except Exception as e:  # the process's own metrics are still worth serving
            if not isinstance(e, ApiError | OSError | RuntimeError):
                raise
        body = generate_latest(self.metrics.registry)
        resp = web.Response(body=body)
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"')
