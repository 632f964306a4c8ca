"""The event loop every metricsd process runs on: asyncio's own, or uvloop (libuv) with
``METRICSD_EVENT_LOOP=uvloop`` when it is installed (``pip install uvloop``; the dev extra has it).

asyncio's is the default by measurement, not by habit (perf/RESULTS.md, "Reads at Go speed",
issue 23). uvloop halves what an idle-loop gRPC exchange costs in perf/bench_grpc_calls.py, but a
metricsd process serves aiohttp and grpc.aio together, and there three A/Bs of whole processes
(perf/bench_reads.py, the same code on either loop, interleaved) answered the literal ``1``
slower on uvloop (p50 4.26 against 3.24 ms at load 8, CPU per question 0.65 against 0.57 ms),
and rate() of one pod over an hour at the same CPU within the noise. Since the HTTP hot path,
``perf/compare.py --event-loop asyncio,uvloop`` (every metricsd process of a store, a cluster and
a remote-write store on each loop, interleaved; four loaded runs, perf/RESULTS.md "Session 39,
s39-23") found uvloop cheaper for ingest and for ``1`` in most runs, but the cluster's rate() of
one pod at concurrency 8 at 0.89-1.14x asyncio's CPU and 0.85-1.49x its p50, and in every run
10-28 of ~95 measures more than 10% worse: not the clear win a new default needs. The quiet
run of the same A/B (perf/RESULTS.md, "Session 41, lead") settled it: one store's ingest 0.88-0.92x
on uvloop, the cluster's stores' 1.00x, and of ~120 measures 30 more than 10% better and 34 more
than 10% worse (p99s at concurrency 8 up to 3x, the cluster's CPU a rate() at c8 1.27x).

``METRICSD_EVENT_LOOP_<ROLE>`` (``METRICSD_EVENT_LOOP_PROXY=uvloop``) picks the loop of one kind of
process, above ``METRICSD_EVENT_LOOP``: so that the proxy alone can be measured on uvloop in a whole
cluster (``perf/bench_reads.py --cluster-variant NAME=DIR,METRICSD_EVENT_LOOP_PROXY=uvloop``), the
candidate of issue 23 that loaded A/Bs put at -6..-8% of the proxy's CPU a (b) (perf/RESULTS.md,
session 41, s41-23); the quiet A/B of every process had the proxy's CPU a rate() 0.83x at
concurrency 1 and 1.50x at 8, so not the default either.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["DEFAULT", "ENV", "loop_factory", "run"]

ENV = "METRICSD_EVENT_LOOP"
DEFAULT = "asyncio"
T = TypeVar("T")


def loop_factory(role: str | None = None) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """None for asyncio's default loop, or uvloop's factory with ``METRICSD_EVENT_LOOP=uvloop``
    (or ``METRICSD_EVENT_LOOP_<ROLE>=uvloop`` for a process of ``role``, which wins).
    Raises ValueError for another value, or for uvloop when it is not installed."""
    name = ENV
    if role is not None and os.environ.get(f"{ENV}_{role.upper()}", "").strip():
        name = f"{ENV}_{role.upper()}"
    choice = os.environ.get(name, DEFAULT).strip().lower() or DEFAULT
    if choice == "asyncio":
        return None
    if choice != "uvloop":
        raise ValueError(f"{name}={choice!r}: use asyncio or uvloop")
    try:
        import uvloop
    except ImportError:
        raise ValueError(f"{name}=uvloop, but uvloop is not installed (pip install uvloop)") from None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, T], role: str | None = None) -> T:
    """``asyncio.run(main)`` on the loop :func:`loop_factory` picks for ``role``."""
    with asyncio.Runner(loop_factory=loop_factory(role)) as runner:
        return runner.run(main)
