"""A proxy's whole query on the HTTP hot path without a task (metricsd/http/hotnow.py): answered
from the read port's ``data_received`` when the first store answers in time, in a task when anything
else happens (the hedge, failure and deadline tests of test_proxy_whole_query*.py go through the
same HTTP API and so through the hand-over). The three real stores and proxy of
whole_query_harness.py."""

from __future__ import annotations

import asyncio
import json
import threading
import zlib
from collections import Counter
from collections.abc import Coroutine, Generator
from types import SimpleNamespace
from typing import Any

import pytest
from whole_query_harness import AT, QUERIES, Harness, learn_slow, stall, warm

from metricsd.http import hotpath
from metricsd.http.hotpath import GZIP_ON_LOOP


def _count_tasks(loop: asyncio.AbstractEventLoop) -> Counter[str]:
    """Tasks the loop makes from now, by their coroutine's qualified name."""
    made: Counter[str] = Counter()

    def factory(loop: asyncio.AbstractEventLoop, coro: Generator[Any, None, Any] | Coroutine[Any, Any, Any],
                **kwargs: Any) -> asyncio.Task[Any]:
        made[getattr(coro, "__qualname__", "?")] += 1
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(factory)
    return made


async def test_a_whole_query_answered_in_time_takes_no_task_and_answers_the_same(harness: Harness) -> None:
    await warm(harness)
    learn_slow(harness, 20.0)  # no hedge
    loop = asyncio.get_running_loop()
    made = _count_tasks(loop)
    try:
        answers = [await harness.get("/api/v1/query", query=QUERIES[0], time=AT) for _ in range(3)]
        assert made["HotProtocol._answer"] == 0, made
        assert harness.counter("whole_queries") >= 3
        quorum = await harness.get("/api/v1/query", query=QUERIES[0], time=AT, consistency="quorum")
        assert made["HotProtocol._answer"] == 1, made  # a quorum read: the envelope's task, as before
    finally:
        loop.set_task_factory(None)
    assert all(a[0] == 200 and a[1]["data"]["result"] for a in answers), answers
    assert answers[0] == answers[1] == answers[2]
    assert quorum[0] == 200 and quorum[1]["data"] == answers[0][1]["data"]
    assert sum(harness.proxy.whole_queries.in_flight.values()) == 0


async def test_a_store_past_its_hedge_delay_hands_the_query_to_a_task_that_hedges_it(harness: Harness) -> None:
    members = await warm(harness)
    port = members["store-0"]._port_client
    assert port is not None
    learn_slow(harness, 0.01)
    released = asyncio.Event()
    stall(harness, "store-0", released)
    loop = asyncio.get_running_loop()
    made = _count_tasks(loop)
    try:
        status, body = await asyncio.wait_for(harness.get("/api/v1/query", query=QUERIES[0], time=AT), 10.0)
    finally:
        loop.set_task_factory(None)
        released.set()
    assert status == 200 and body["data"]["result"], body
    assert made["HotProtocol._answer"] == 1, made
    assert harness.counter("whole_query_hedges") >= 1  # a loaded machine's second store may pass 10 ms too
    assert sum(harness.proxy.whole_queries.in_flight.values()) == 0
    assert not port._waiting  # the stalled ask forgotten when the hedge won


async def test_a_whole_answer_is_gzipped_on_the_loop_or_handed_to_a_task_past_the_loops_size(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """hotnow's answer written from the read port's turn (HotProtocol.reply): gzipped there, on the
    loop's thread, when it is past gzip_min_bytes (32 KiB) and at most GZIP_ON_LOOP; past it, in a
    task's worker thread. Where the gzip ran is what is asserted (the thread that called zlib): on a
    loaded machine the small query itself may be handed to a task (a hedge, a store's probe), which
    changes where its answer is written, not where its gzip runs."""
    await warm(harness)
    learn_slow(harness, 20.0)  # no hedge
    selector = "container_cpu_usage_seconds_total"
    start, end = str(float(AT) - 600), AT
    loop = asyncio.get_running_loop()
    threads: list[int] = []

    def compress(data: bytes, level: int = -1, wbits: int = 15) -> bytes:
        threads.append(threading.get_ident())
        return zlib.compress(data, level, wbits)

    monkeypatch.setattr(hotpath, "zlib", SimpleNamespace(compress=compress))
    sizes: list[tuple[int, int]] = []
    for step in ("5", "0.1"):  # ~0.1 MiB, then past GZIP_ON_LOOP
        made = _count_tasks(loop)
        try:
            async with harness.http.get(harness.url + "/api/v1/query_range",
                                        params={"query": selector, "start": start, "end": end, "step": step},
                                        headers={"Accept-Encoding": "gzip"}) as r:
                assert r.status == 200 and r.headers.get("Content-Encoding") == "gzip", r.headers
                raw = await r.read()
                body = json.loads(raw)
        finally:
            loop.set_task_factory(None)
        sizes.append((len(raw), made["HotProtocol._answer"]))
        assert body["data"]["result"] and all(len(s["values"]) > 1 for s in body["data"]["result"])
    (small, _), (large, large_tasks) = sizes
    assert 32 * 1024 <= small <= GZIP_ON_LOOP and large > GZIP_ON_LOOP, sizes
    assert threads[0] == threading.get_ident() and threads[1] != threading.get_ident() and len(threads) == 2
    assert large_tasks == 1, sizes
    assert harness.counter("whole_queries") >= 2
