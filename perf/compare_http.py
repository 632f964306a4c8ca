"""The dashboard's questions over PromQL HTTP, asked of every system in one run (perf/compare.py;
issue 23: the fixed cost of a read request and of the proxy -> store hop).

Five questions, as a user comparing systems would send them, over the Prometheus HTTP API of one
metricsd store (``metricsd up``), of the metricsd cluster's proxy, of Prometheus and of
VictoriaMetrics:

``1``  the literal ``1``: what a request costs before any data is touched;
(b)   ``rate()`` of one pod's CPU counter over 1 h at a 30 s step (perf/compare_queries.py's (b));
(c)   the top 10 pods of a namespace by CPU (compare_queries' (c));
(a)   the HPA's question, sum of usage over sum of requests of 5,000 pods (compare_queries' (a));
(d)   the average memory working set by workload, ``avg by (workload) (...)`` over every pod.

Each is timed at concurrency 1 and 8, p50 and p99, systems interleaved (A B C D D C B A), and
the server CPU each system spent per question is read from /proc around its own runs (for the
cluster: all its processes, and the proxy and the stores apart). The answers of metricsd's two
HTTP endpoints must equal Prometheus' within the run's tolerance first.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
from compare_queries import (
    Question,
    compare_answers,
    from_prometheus_json,
    promql_get,
    questions,
    run_timed,
    summarise,
)
from compare_report import measure

__all__ = ["HTTP_SYSTEMS", "WHOLE_COUNTERS", "check_http_answers", "http_questions", "profile_pids", "proxy_counters",
           "time_http"]

# system name in the results -> the server (perf/compare.py's ``servers`` key) whose HTTP API it asks
HTTP_SYSTEMS = {  # the same names in compare_report.HTTP_SYSTEMS
    "metricsd-promql": "metricsd",
    "metricsd-cluster-promql": "metricsd-cluster",
    "prometheus": "prometheus",
    "victoriametrics": "victoriametrics",
}
MEMORY = "container_memory_working_set_bytes"
Cpu = Callable[[], dict[str, float]]  # CPU seconds so far by role, with "all"
Counters = Callable[[], Awaitable[dict[str, int]]]  # a cluster proxy's whole-query counters so far
# How a cluster's proxy sent its questions (metricsd/proxy/wholequery.py): whole to one store, of
# them taken as cheap (kept on the first store within --spill-queued-ms), spread to another store
# than the first, answered with the store's own time, and that time summed in microseconds.
WHOLE_COUNTERS = ("whole_queries", "whole_query_cheap", "whole_query_spread", "whole_query_timed",
                  "whole_query_timed_us")


def http_questions(at_ms: int, pod: str, namespace: str) -> list[Question]:
    """``1``, (b), (c), (a) and (d), in the order of issue 23's table."""
    qs = {q.key: q for q in questions(at_ms, pod, namespace)}
    one = Question("1", "the literal 1: the fixed cost of a request", "1", at_ms, at_ms, 0, None)
    d = Question("d", "average memory working set by workload", f"avg by (workload) ({MEMORY})", at_ms, at_ms, 0,
                 None, group_label="workload")
    return [one, qs["b"], qs["c"], qs["a"], d]


async def check_http_answers(qs: list[Question], systems: list[str], http: aiohttp.ClientSession,
                             urls: dict[str, str], rtol: float) -> tuple[dict[str, Any], list[str]]:
    """Every question of every system beside Prometheus' answer; failures of metricsd's systems."""
    report: dict[str, Any] = {}
    failures: list[str] = []
    for q in qs:
        ref = from_prometheus_json(await promql_get(http, urls["prometheus"], q), q.group_label)
        row: dict[str, Any] = {"points": sum(len(v) for v in ref.values())}
        for name in systems:
            if name == "prometheus":
                continue
            got = from_prometheus_json(await promql_get(http, urls[name], q), q.group_label)
            c = compare_answers(ref, got)
            row[name] = {"max_rel": c.max_rel, "median_rel": c.median_rel, "points": c.points,
                         "missing": c.missing[:10], "extra": c.extra[:10]}
            if name.startswith("metricsd") and not c.agrees(rtol):
                failures.append(f"({q.key}) {name} over HTTP: max rel. diff {c.max_rel:.3g} over {c.points} "
                                f"points, missing {c.missing[:5]}, extra {c.extra[:5]}")
        report[q.key] = row
    return report, failures


def _minus(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: v - b.get(k, 0.0) for k, v in a.items()}


def proxy_counters(url: str) -> Counters:
    """A cluster proxy's WHOLE_COUNTERS so far, from its stats endpoint (``proxy_*`` entries).

    Read over a connection of its own, never one of the questions' session: the stats route is not
    one of the HTTP hot path's two, so the proxy hands the connection that asks it to aiohttp for
    good (metricsd/http/hotpath.py), and the questions timed right after on that pooled keep-alive
    connection took aiohttp's path, not the hot one the one store's questions took (sessions 43-44:
    the proxy ~0.18 ms a (b) dearer; perf/RESULTS.md, session 44, s44-23)."""
    async def read() -> dict[str, int]:
        async with aiohttp.ClientSession() as own, own.get(url + "/api/v1/metricsd/stats") as r:
            r.raise_for_status()
            rejected = (await r.json())["data"].get("rejected", {})
        return {k: int(rejected.get("proxy_" + k, 0)) for k in WHOLE_COUNTERS}
    return read


async def interleaved_cpu(calls: dict[str, Callable[[], Awaitable[object]]], cpu: dict[str, Cpu], n: int,
                          concurrency: int, warmup: int, counters: dict[str, Counters] | None = None,
                          ) -> tuple[dict[str, list[float]], dict[str, dict[str, float]]]:
    """compare_queries.interleaved, also summing each system's server CPU over its own timed runs
    (seconds by role) and, for a system in ``counters``, each counter's increase over them (as
    ``counter:<name>``), read outside the CPU window."""
    counters = counters or {}
    for call in calls.values():
        await run_timed(call, warmup, concurrency)
    times: dict[str, list[float]] = {name: [] for name in calls}
    spent: dict[str, dict[str, float]] = {name: {} for name in calls}
    names = list(calls)
    for order, share in ((names, n // 2), (names[::-1], n - n // 2)):
        for name in order:
            read = counters.get(name)
            counted = await read() if read is not None else {}
            before = cpu[name]()
            times[name].extend(await run_timed(calls[name], share, concurrency))
            for role, v in _minus(cpu[name](), before).items():
                spent[name][role] = spent[name].get(role, 0.0) + v
            if read is not None:
                for k, v in (await read()).items():
                    spent[name][f"counter:{k}"] = spent[name].get(f"counter:{k}", 0.0) + v - counted.get(k, 0)
    return times, spent


async def time_http(qs: list[Question], systems: list[str], http: aiohttp.ClientSession, urls: dict[str, str],
                    cpu: dict[str, Cpu], n: int, warmup: int, concurrency: list[int],
                    profile: Callable[[str], Any] | None = None,
                    counters: dict[str, Counters] | None = None) -> list[dict[str, Any]]:
    """The timed runs; measures ``http.<key>.c<c>.p50_ms`` / ``p99_ms`` / ``cpu_ms`` (server CPU
    per question, all processes) and, for a cluster, ``cpu_ms_proxy`` / ``cpu_ms_store``; with
    ``counters`` for it, its proxy's WHOLE_COUNTERS over the timed runs (``whole_*``, counts) and
    ``store_own_ms`` (the stores' own time per question sent whole, as they reported it).
    ``profile(key)``: an async context manager wrapped around each question's runs, or None."""
    ms: list[dict[str, Any]] = []
    for q in qs:
        ctx = profile(q.key) if profile is not None else None
        async with ctx if ctx is not None else _nothing():
            for c in concurrency:
                print(f"timing ({q.key}) over HTTP at concurrency {c} ...", flush=True)
                calls = {s: _asker(http, urls[s], q) for s in systems}
                times, spent = await interleaved_cpu(calls, cpu, n, c, warmup, counters)
                for s, t in times.items():
                    pct = summarise(t)
                    base = f"http.{q.key}.c{c}"
                    ms += [measure(s, base + ".p50_ms", pct["p50_ms"], "ms"),
                           measure(s, base + ".p99_ms", pct["p99_ms"], "ms"),
                           measure(s, base + ".cpu_ms", spent[s].get("all", 0.0) / len(t) * 1000, "ms")]
                    for role in ("proxy", "store"):
                        if role in spent[s]:
                            ms.append(measure(s, f"{base}.cpu_ms_{role}", spent[s][role] / len(t) * 1000, "ms"))
                    ms += _whole_measures(s, base, spent[s])
    return ms


def _whole_measures(system: str, base: str, spent: dict[str, float]) -> list[dict[str, Any]]:
    """The WHOLE_COUNTERS' increases (``counter:`` entries of ``spent``) as measures, and the stores'
    own time per question that reported one."""
    got = {k: spent[f"counter:{k}"] for k in WHOLE_COUNTERS if f"counter:{k}" in spent}
    if not got:
        return []
    ms = [measure(system, f"{base}.{k}", v, "count") for k, v in got.items() if k != "whole_query_timed_us"]
    if got.get("whole_query_timed"):
        ms.append(measure(system, f"{base}.store_own_ms", got["whole_query_timed_us"] / got["whole_query_timed"] / 1000,
                          "ms"))
    return ms


def _asker(http: aiohttp.ClientSession, url: str, q: Question) -> Callable[[], Awaitable[object]]:
    return lambda: promql_get(http, url, q)


@asynccontextmanager
async def _nothing() -> AsyncIterator[None]:
    yield


@asynccontextmanager
async def profile_pids(pids: dict[str, int], path_of: Callable[[str], Path]) -> AsyncIterator[None]:
    """py-spy records each process while inside, raw folded stacks into ``path_of(name)``;
    ``METRICSD_PYSPY_ARGS`` adds py-spy options (``--gil``: only samples holding the GIL, so a
    socket send the kernel preempts does not count as the process's time) and ``METRICSD_PYSPY_RATE``
    the sampling rate (default 200 a second)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        yield
        return
    rate = os.environ.get("METRICSD_PYSPY_RATE", "200")
    procs = [subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", rate, "--format", "raw",
                               "--nonblocking", *os.environ.get("METRICSD_PYSPY_ARGS", "").split(),
                               "-o", str(path_of(name))],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for name, pid in pids.items()]
    try:
        await asyncio.sleep(1.0)
        yield
    finally:
        for p in procs:
            p.send_signal(signal.SIGINT)
        for p in procs:
            p.wait(timeout=60)
