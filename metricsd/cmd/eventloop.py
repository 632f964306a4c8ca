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
machine's run of the same A/B decides it.
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


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """None for asyncio's default loop, or uvloop's factory with ``METRICSD_EVENT_LOOP=uvloop``.
    Raises ValueError for another value, or for uvloop when it is not installed."""
    choice = os.environ.get(ENV, DEFAULT).strip().lower() or DEFAULT
    if choice == "asyncio":
        return None
    if choice != "uvloop":
        raise ValueError(f"{ENV}={choice!r}: use asyncio or uvloop")
    try:
        import uvloop
    except ImportError:
        raise ValueError(f"{ENV}=uvloop, but uvloop is not installed (pip install uvloop)") from None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the loop :func:`loop_factory` picks."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
