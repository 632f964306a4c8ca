"""Run a controller's sync on a period until stopped; a failed sync is logged and the loop goes on.

The period is waited with an injectable sleep, so `metricsd up` uses real time while tests and the
simulated day call `sync_once` themselves and move a ManualClock instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

__all__ = ["Periodic", "Syncable"]

log = logging.getLogger("metricsd.consumers")


class Syncable(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def interval_s(self) -> float: ...

    async def sync_once(self) -> object: ...


class Periodic:
    """One task running `sync_once` every `interval_s`, the first time at once."""

    def __init__(self, controller: Syncable, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.controller = controller
        self._sleep = sleep
        self._task: asyncio.Task[None] | None = None
        self.failures = 0

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"consumer-{self.controller.name}")

    async def _run(self) -> None:
        while True:
            try:
                await self.controller.sync_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # a controller outlives one bad sync, as kube-controller-manager does
                self.failures += 1
                log.exception("%s: sync failed", self.controller.name)
            await self._sleep(self.controller.interval_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
