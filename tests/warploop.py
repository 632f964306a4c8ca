"""An event loop whose clock jumps to its next timer when nothing is ready, for tests of timers
(deadlines, hedges) that would otherwise wait real time and read it on a loaded machine.

The loop's ``time()`` is a number this module keeps. When the loop would block in ``select`` with a
timer due in ``t`` seconds and no file descriptor is ready, the clock moves ``t`` forward at once
and the timer runs: a test sees the order and the loop times a real wait would give, exactly, in
no real time. Sockets still work (a ready descriptor is answered first), but a test that waits for
another process must not use it: with nothing ready the clock races ahead of that process.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class _WarpSelector(selectors.DefaultSelector):
    def __init__(self) -> None:
        super().__init__()
        self.clock = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout is None or timeout <= 0:
            return ready if ready or timeout is not None else super().select(None)
        self.clock += timeout
        return []


class WarpLoop(asyncio.SelectorEventLoop):
    """asyncio's selector loop on a clock that jumps to the next timer when the loop is idle."""

    def __init__(self) -> None:
        self._warp = _WarpSelector()
        super().__init__(self._warp)

    def time(self) -> float:
        return self._warp.clock


def run_warped(coro: Coroutine[Any, Any, T]) -> T:
    """``coro`` run to its end on a fresh WarpLoop (what ``asyncio.run`` does on a real one)."""
    with asyncio.Runner(loop_factory=WarpLoop) as runner:
        return runner.run(coro)
