"""The request timeout of the HTTP hot path's requests, on one loop timer for them all.

``asyncio.timeout(s)`` arms a loop timer per request and cancels it when the request ends: a
``call_at`` and a cancel, each a few Python calls, and the cancelled timer stays in the loop's heap
until its time comes (30 s by default), so at hundreds of requests a second the heap holds
thousands of dead timers and every push and pop compares in Python (``TimerHandle.__lt__``, ~14
calls a proxy's (b) query; perf/RESULTS.md, session 40, s40-23c). Every hot request of a server
has the same timeout, so their deadlines come in order: :class:`Deadlines` keeps them in a queue
and one timer at the earliest still running. A request that ends just leaves; the timer, when it
fires, expires the requests due and sets itself for the next one.

An expired request is cancelled and its block raises TimeoutError, as ``asyncio.timeout`` does
(the same ``uncancel`` check: a cancellation from outside during the block stays a
CancelledError).
"""

from __future__ import annotations

import asyncio
from collections import deque
from types import TracebackType

__all__ = ["Deadline", "Deadlines"]


class Deadline:
    """One request's timeout: ``async with`` it inside the request's task."""

    __slots__ = ("cancelling", "expired", "over", "owner", "task", "when")

    def __init__(self, owner: Deadlines, when: float) -> None:
        self.owner = owner
        self.when = when
        self.task: asyncio.Task[object] | None = None
        self.cancelling = 0
        self.expired = False
        self.over = False

    async def __aenter__(self) -> Deadline:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a request deadline must be used inside a task")
        self.task = task
        self.cancelling = task.cancelling()
        self.owner.add(self)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.over = True
        task, self.task = self.task, None  # not kept alive by the queue until the timer passes it
        if (self.expired and task is not None and task.uncancel() <= self.cancelling
                and exc_type is asyncio.CancelledError):
            raise TimeoutError from exc

    def expire(self) -> None:
        if self.over or self.task is None:
            return
        self.expired = True
        self.task.cancel()


class Deadlines:
    """The deadlines of requests with one timeout (``timeout_s``), in the order they began."""

    __slots__ = ("armed", "loop", "queue", "timeout_s", "timer")

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.queue: deque[Deadline] = deque()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.armed = 0.0  # when the timer fires

    def deadline(self, began: float | None = None) -> Deadline:
        """A request's deadline, ``timeout_s`` from now or from ``began`` (the loop's time a request
        begun without a task began at, metricsd/http/hotnow.py)."""
        loop = self.loop
        if loop is None:
            loop = self.loop = asyncio.get_running_loop()
        return Deadline(self, (loop.time() if began is None else began) + self.timeout_s)

    def add(self, d: Deadline) -> None:
        q = self.queue
        while q and q[0].over:  # the requests ended since: at concurrency 1, the last one
            q.popleft()
        if q and d.when < q[-1].when:  # begun earlier than the last (hotnow.py): in its place, so it expires in time
            i = len(q)
            while i > 0 and q[i - 1].when > d.when:
                i -= 1
            q.insert(i, d)
        else:
            q.append(d)
        if self.timer is None or d.when < self.armed:  # the second only if the loop's clock stepped back
            self._arm(d.when)

    def _arm(self, when: float) -> None:
        assert self.loop is not None
        if self.timer is not None:
            self.timer.cancel()
        self.armed = when
        self.timer = self.loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self.timer = None
        due = self.armed  # asyncio found it due (its clock's resolution early, as for asyncio.timeout's own)
        q = self.queue
        while q and (q[0].over or q[0].when <= due):
            q.popleft().expire()
        if q:
            self._arm(q[0].when)
