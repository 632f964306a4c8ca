"""Waiting on another process's or task's state, with a deadline, for the tests.

A fixed sleep is either too short on a loaded 2-core CI machine or slow everywhere else; these poll
every 50 ms and fail with what they waited for once the deadline passes.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

POLL_S = 0.05


async def wait_until(what: str, check: Callable[[], object | Awaitable[object]], timeout_s: float = 20.0) -> None:
    """Await until ``check()`` (a plain or a coroutine function) is truthy, or fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(POLL_S)


def wait_until_sync(what: str, check: Callable[[], object], timeout_s: float = 20.0) -> None:
    """:func:`wait_until` for a test without an event loop (other processes' state)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(POLL_S)
