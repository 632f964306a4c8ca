"""The autoscaler's three questions, asked of every system (perf/compare.py), the answers in one
shape so they can be compared, and the interleaved latency runs.

(a) the average CPU utilisation of the big workload over the last minute (sum of usage rates over
    sum of CPU requests, as Kubernetes' HPA computes it);
(b) the CPU rate of one pod over the last hour at a 30 s step;
(c) the ten pods using the most CPU in a namespace.

Evaluation times sit 5 s off the 10 s sample grid: Prometheus 2.42 takes a range as the closed
window [t - d, t] while metricsd (like Prometheus 3) takes (t - d, t], and the two differ only
when a sample lies exactly at t - d.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.wire import matchers_to_pb
from metricsd.selector import parse_selector

__all__ = [
    "Answer", "Comparison", "Question", "compare_answers", "from_aggregate", "from_prometheus_json",
    "interleaved", "promql_get", "questions", "summarise",
]  # fmt: skip

Answer = dict[str, dict[int, float]]  # group (a label value, or "") -> evaluation time ms -> value
CPU = "container_cpu_usage_seconds_total"


@dataclass(frozen=True)
class Question:
    key: str
    title: str
    promql: str
    start_ms: int
    end_ms: int
    step_ms: int
    aggregate: pb.AggregateRequest
    group_label: str = ""  # the label that tells answers apart ("" for a single value)
    top: int = 0  # the client keeps the top N groups (the Aggregate request's top_k sends at most these)

    @property
    def instant(self) -> bool:
        return self.start_ms == self.end_ms


def _side(selector: str, metric: str, fn: pb.SeriesFn, window_ms: int) -> pb.AggregateQuery:
    return pb.AggregateQuery(matchers=matchers_to_pb(parse_selector(selector, metric)), series_fn=fn,
                             window_ms=window_ms)


def questions(at_ms: int, pod: str, namespace: str) -> list[Question]:
    """The three questions at evaluation time ``at_ms``; (b) asks about ``pod`` (namespace default),
    (c) about ``namespace``."""
    a = pb.AggregateRequest(query=_side('workload="big"', CPU, pb.SERIES_RATE, 60_000),
                            denominator=_side('resource="cpu",workload="big"', "kube_pod_container_resource_requests",
                                              pb.SERIES_LAST, 300_000),
                            across=pb.ACROSS_SUM, start_ms=at_ms, end_ms=at_ms)
    b_start = at_ms - 3_600_000
    b = pb.AggregateRequest(query=_side(f'namespace="default",pod="{pod}"', CPU, pb.SERIES_RATE, 60_000),
                            across=pb.ACROSS_SUM, start_ms=b_start, end_ms=at_ms, step_ms=30_000)
    c = pb.AggregateRequest(query=_side(f'namespace="{namespace}"', CPU, pb.SERIES_RATE, 60_000),
                            across=pb.ACROSS_SUM, group_by=["pod"], start_ms=at_ms, end_ms=at_ms, top_k=10)
    return [
        Question("a", "avg CPU utilisation of the big workload, 1m",
                 f'sum(rate({CPU}{{workload="big"}}[1m])) / '
                 'sum(kube_pod_container_resource_requests{resource="cpu",workload="big"})', at_ms, at_ms, 0, a),
        Question("b", "CPU rate of one pod, 1 h at 30 s step",
                 f'rate({CPU}{{namespace="default",pod="{pod}"}}[1m])', b_start, at_ms, 30_000, b),
        Question("c", f"top 10 pods by CPU in namespace {namespace}",
                 f'topk(10, sum by (pod) (rate({CPU}{{namespace="{namespace}"}}[1m])))', at_ms, at_ms, 0, c,
                 group_label="pod", top=10),
    ]  # fmt: skip


# --- answers in one shape -------------------------------------------------------------------------


def from_prometheus_json(body: dict[str, Any], group_label: str = "") -> Answer:
    """An Answer from a Prometheus API response (vector, matrix or scalar). Raises ValueError
    for an error response."""
    if body.get("status") != "success":
        raise ValueError(f"query failed: {body.get('errorType')}: {body.get('error')}")
    data = body["data"]
    out: Answer = {}
    kind = data["resultType"]
    if kind == "scalar":
        t, v = data["result"]
        return {"": {round(float(t) * 1000): float(v)}}
    for row in data["result"]:
        key = row["metric"].get(group_label, "") if group_label else ""
        points = row["values"] if kind == "matrix" else [row["value"]]
        out.setdefault(key, {}).update({round(float(t) * 1000): float(v) for t, v in points})
    return out


def from_aggregate(resp: pb.AggregateResponse, group_label: str = "", top: int = 0) -> Answer:
    """An Answer from an AggregateResponse; with ``top``, only the ``top`` largest groups at the
    first evaluation time (as PromQL's topk for an instant query)."""
    times = list(resp.timestamps)
    n = len(times)
    out: Answer = {}
    for g, group in enumerate(resp.groups):
        labels = {lab.name: lab.value for lab in group.labels}
        key = labels.get(group_label, "") if group_label else ""
        row = {t: v for t, v in zip(times, resp.values[g * n:(g + 1) * n], strict=True) if not math.isnan(v)}
        if row:
            out[key] = row
    if top:
        first = times[0] if times else 0
        ranked = sorted(out, key=lambda k: out[k].get(first, -math.inf), reverse=True)[:top]
        out = {k: out[k] for k in ranked}
    return out


@dataclass
class Comparison:
    """How far ``got`` is from ``ref``: the largest and median relative difference over the points
    both have, and what one has that the other lacks."""

    max_rel: float = 0.0
    median_rel: float = 0.0
    points: int = 0
    missing: list[str] = field(default_factory=list)  # "group@t" in ref, not in got
    extra: list[str] = field(default_factory=list)  # in got, not in ref

    def agrees(self, rtol: float) -> bool:
        return not self.missing and not self.extra and self.points > 0 and self.max_rel <= rtol


def rel_diff(a: float, b: float) -> float:
    """|a - b| relative to the larger magnitude; 0 for two zeros or two NaNs."""
    if math.isnan(a) and math.isnan(b):
        return 0.0
    scale = max(abs(a), abs(b))
    return 0.0 if scale == 0.0 else abs(a - b) / scale


def compare_answers(ref: Answer, got: Answer) -> Comparison:
    diffs: list[float] = []
    out = Comparison()
    for key, row in ref.items():
        other = got.get(key, {})
        for t, v in row.items():
            if t in other:
                diffs.append(rel_diff(v, other[t]))
            else:
                out.missing.append(f"{key or '()'}@{t}")
    for key, row in got.items():
        out.extra.extend(f"{key or '()'}@{t}" for t in row if t not in ref.get(key, {}))
    if diffs:
        out.max_rel = max(diffs)
        out.median_rel = float(np.median(diffs))
        out.points = len(diffs)
    return out


# --- asking ---------------------------------------------------------------------------------------


async def promql_get(session: aiohttp.ClientSession, base_url: str, q: Question) -> dict[str, Any]:
    """Ask ``q`` of a Prometheus-compatible HTTP API and return its decoded JSON."""
    if q.instant:
        url = base_url + "/api/v1/query"
        params = {"query": q.promql, "time": f"{q.end_ms / 1000:.3f}"}
    else:
        url = base_url + "/api/v1/query_range"
        params = {"query": q.promql, "start": f"{q.start_ms / 1000:.3f}", "end": f"{q.end_ms / 1000:.3f}",
                  "step": f"{q.step_ms / 1000:g}"}
    async with session.get(url, params=params) as resp:
        body: dict[str, Any] = await resp.json(content_type=None)
        if resp.status != 200:
            raise RuntimeError(f"{base_url}: HTTP {resp.status}: {body}")
        return body


def summarise(seconds: Sequence[float]) -> dict[str, float]:
    """p50 / p99 / mean in milliseconds (NumPy's linear interpolation between ranks)."""
    a = np.asarray(seconds, dtype=np.float64) * 1000.0
    return {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
            "mean_ms": float(a.mean()), "n": int(a.size)}


async def run_timed(call: Callable[[], Awaitable[object]], n: int, concurrency: int) -> list[float]:
    """``n`` calls, ``concurrency`` at a time; each one's wall time in seconds."""
    times: list[float] = []
    sem = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with sem:
            t0 = time.perf_counter()
            await call()
            times.append(time.perf_counter() - t0)

    await asyncio.gather(*(one() for _ in range(n)))
    return times


async def interleaved(calls: dict[str, Callable[[], Awaitable[object]]], n: int, concurrency: int,
                      warmup: int) -> dict[str, list[float]]:
    """``n`` timed calls per system in two passes, A B C D then D C B A, so drift in the machine's
    load over the run falls on every system alike; ``warmup`` untimed calls each first."""
    for call in calls.values():
        await run_timed(call, warmup, concurrency)
    out: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for order, share in ((names, n // 2), (names[::-1], n - n // 2)):
        for name in order:
            out[name].extend(await run_timed(calls[name], share, concurrency))
    return out
