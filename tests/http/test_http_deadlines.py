"""metricsd/http/deadlines.py: the hot path's request timeouts on one loop timer, answered as
``asyncio.timeout`` answers them."""

from __future__ import annotations

import asyncio

import pytest

from metricsd.http.deadlines import Deadline, Deadlines


async def test_a_block_past_its_deadline_raises_timeout_error() -> None:
    deadlines = Deadlines(0.05)
    started = asyncio.get_running_loop().time()
    with pytest.raises(TimeoutError):
        async with deadlines.deadline():
            await asyncio.sleep(5)
    assert 0.04 <= asyncio.get_running_loop().time() - started < 1.0


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


async def test_each_of_concurrent_blocks_expires_at_its_own_deadline() -> None:
    deadlines = Deadlines(0.1)
    ended: list[str] = []

    async def one(name: str, work: float) -> None:
        try:
            async with deadlines.deadline():
                await asyncio.sleep(work)
            ended.append(f"{name} done")
        except TimeoutError:
            ended.append(f"{name} timed out")

    first = asyncio.create_task(one("a", 5))
    await asyncio.sleep(0.05)
    second = asyncio.create_task(one("b", 0.01))
    third = asyncio.create_task(one("c", 5))
    await asyncio.gather(first, second, third)
    assert ended == ["b done", "a timed out", "c timed out"]


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
    assert not deadlines.queue


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
    assert ended["early"] - t0 < 0.2, ended  # at t0 + 0.1, not behind "late"'s t0 + 0.3
    assert ended["late"] - t0 >= 0.29
