"""The event loop every metricsd process runs on: uvloop (libuv) when installed, asyncio's own
otherwise or when ``METRICSD_EVENT_LOOP=asyncio`` says so.

aiohttp, asyncio streams and grpc.aio run on uvloop unchanged. A request's fixed cost is mostly
the loop's own work (reading, scheduling, writing), and uvloop does that in C: perf/RESULTS.md
("Reads at Go speed", issue 23) has the A/B, and ``METRICSD_EVENT_LOOP=asyncio`` repeats it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["ENV", "loop_factory", "run"]

ENV = "METRICSD_EVENT_LOOP"
T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop factory, or None for asyncio's default (``METRICSD_EVENT_LOOP=asyncio``, or
    uvloop not installed). Raises ValueError for another value of the variable."""
    choice = os.environ.get(ENV, "uvloop").strip().lower() or "uvloop"
    if choice == "asyncio":
        return None
    if choice != "uvloop":
        raise ValueError(f"{ENV}={choice!r}: use uvloop or asyncio")
    try:
        import uvloop
    except ImportError:  # a platform without a uvloop wheel
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the loop :func:`loop_factory` picks."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
