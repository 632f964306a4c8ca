"""A coroutine run at once, in the caller's turn of the event loop, and a task only if it waits.

A task costs a handle, a loop turn before its first step and its bookkeeping. For a store's
WRITE_PARTS frames on the read port (rpc/readport.py) the coroutine almost never waits: the
engine's write does not await, and the answer is corked and sent at the end of the turn. Started
as a task, each frame paid that overhead for nothing (the read port's task was ~5% of a live
cluster store, perf/RESULTS.md issue 24 session 42). Python 3.12's eager tasks do the same;
this is for 3.11.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

__all__ = ["start_eagerly"]

T = TypeVar("T")


def start_eagerly(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T] | None:
    """Runs ``coro`` now up to its first wait. None when it finished without waiting (its result is
    dropped, and an exception it raised propagates to the caller); otherwise the task that
    carries it on from where it waited (cancel it to cancel the coroutine). Needs a running loop."""
    try:
        waited = coro.send(None)
    except StopIteration:
        return None
    return asyncio.get_running_loop().create_task(_CarryOn(coro, waited))


class _CarryOn(Coroutine[Any, Any, T]):
    """A coroutine already started, whose first step yielded ``waited``, for a task to carry on: its
    first step yields that again (the task waits on the same future); every later send, or throw
    (a cancellation, even one before the task's first step), goes to the coroutine itself."""

    def __init__(self, coro: Coroutine[Any, Any, T], waited: Any) -> None:
        self._coro = coro
        self._waited: Any = waited
        self._started = False

    def send(self, value: Any) -> Any:
        if not self._started:
            self._started = True
            return self._waited
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        self._started = True
        return self._coro.throw(typ if val is None else val)

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, None, T]:
        raise TypeError("a started coroutine is carried on by its task, not awaited")
