"""metricsd/http/deadlines.py: the hot path's request timeouts on one loop timer, answered as
``asyncio.timeout`` answers them. Every test runs on tests/warploop.py's loop, whose clock jumps
to the next timer: the loop times asserted are exact and no test waits real time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from warploop import run_warped

from metricsd.http.deadlines import Deadline, Deadlines


def warped(body: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """A test of ``body`` run on a fresh WarpLoop (a plain function: pytest-asyncio leaves it be)."""
    def test() -> None:
        run_warped(body())
    test.__name__, test.__qualname__, test.__doc__ = body.__name__, body.__qualname__, body.__doc__
    return test


@warped
async def test_a_block_past_its_deadline_raises_timeout_error() -> None:
    deadlines = Deadlines(0.05)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError):
        async with deadlines.deadline():
            await asyncio.sleep(5)
    assert loop.time() - started == pytest.approx(0.05)


@warped
async def test_blocks_that_end_in_time_share_one_timer_and_are_not_cancelled() -> None:
    deadlines = Deadlines(0.2)
    async with deadlines.deadline():
        await asyncio.sleep(0)
    timer = deadlines.timer
    assert timer is not None
    for _ in range(50):  # each in time: no new timer, the queue holds the last one only
        async with deadlines.deadline():
            await asyncio.sleep(0)
    assert deadlines.timer is timer and len(deadlines.queue) == 1
    await asyncio.sleep(0.3)  # the timer passes the ended blocks without cancelling anything
    assert deadlines.timer is None and not deadlines.queue
    async with deadlines.deadline():  # and a new block arms it again
        await asyncio.sleep(0)
    assert deadlines.timer is not None


@warped
async def test_each_of_concurrent_blocks_expires_at_its_own_deadline() -> None:
    deadlines = Deadlines(0.1)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    ended: list[tuple[str, float]] = []

    async def one(name: str, work: float) -> None:
        try:
            async with deadlines.deadline():
                await asyncio.sleep(work)
            ended.append((f"{name} done", loop.time() - t0))
        except TimeoutError:
            ended.append((f"{name} timed out", loop.time() - t0))

    first = asyncio.create_task(one("a", 5))
    await asyncio.sleep(0.05)
    second = asyncio.create_task(one("b", 0.01))
    third = asyncio.create_task(one("c", 5))
    await asyncio.gather(first, second, third)
    assert [name for name, _ in ended] == ["b done", "a timed out", "c timed out"]
    assert [at for _, at in ended] == pytest.approx([0.06, 0.1, 0.15])


@warped
async def test_a_cancel_from_outside_stays_a_cancellation() -> None:
    deadlines = Deadlines(0.05)

    async def block() -> None:
        async with deadlines.deadline():
            await asyncio.sleep(5)

    task = asyncio.create_task(block())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.1)  # its deadline passes after it ended: nothing to cancel
    assert not deadlines.queue and deadlines.timer is None


@warped
async def test_a_cancel_from_outside_as_the_deadline_passes_stays_a_cancellation() -> None:
    deadlines = Deadlines(5)
    entered: list[Deadline] = []

    async def block() -> None:
        async with deadlines.deadline() as d:
            entered.append(d)
            await asyncio.sleep(5)

    task = asyncio.create_task(block())
    while not entered:
        await asyncio.sleep(0)
    entered[0].expire()  # the deadline's cancel, and the caller's in the same turn: theirs wins
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@warped
async def test_a_deadline_begun_before_the_last_expires_at_its_own_time() -> None:
    """A request begun without a task is given its deadline when a task continues it (hotnow.py),
    from when it began: it goes in the queue in its place, not behind later ones."""
    deadlines = Deadlines(0.3)
    loop = asyncio.get_running_loop()
    ended: dict[str, float] = {}

    async def one(name: str, began: float | None) -> None:
        try:
            async with deadlines.deadline(began):
                await asyncio.sleep(5)
        except TimeoutError:
            ended[name] = loop.time()

    t0 = loop.time()
    late = asyncio.create_task(one("late", None))
    await asyncio.sleep(0.05)
    early = asyncio.create_task(one("early", t0 - 0.2))  # began 0.2 s before the first
    await asyncio.gather(late, early)
    assert ended["early"] - t0 == pytest.approx(0.1), ended  # at t0 + 0.1, not behind "late"'s t0 + 0.3
    assert ended["late"] - t0 == pytest.approx(0.3), ended
