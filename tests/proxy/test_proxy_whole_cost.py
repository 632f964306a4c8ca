"""A whole query's cost as the store measures it (the QUERY frame's ``cpu`` and ANSWER_TIMED,
metricsd/rpc/wholequery.py; the store's ``_Timed``, metricsd/http/wholequery.py) and the spill's
cheap/heavy split learnt from it (metricsd/proxy/wholequery.py): a store answering slowly, as on
a loaded machine or behind a long queue, does not turn a cheap query heavy."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest
from proxy_cluster import SLOTS
from whole_query_harness import QUERIES, Harness, learn_slow, rates_together

from metricsd.http.wholequery import _Timed
from metricsd.promql.limits import QueryLimits
from metricsd.proxy.wholeorder import query_shape
from metricsd.rpc.backend import Unavailable
from metricsd.rpc.wholequery import (
    ANSWER_DATA,
    ANSWER_TIMED,
    LIMIT_NAMES,
    QueryAnswer,
    QueryFrame,
    RunnerSettings,
    decode_answer,
    decode_request,
    encode_request,
    error_answer,
    timed_answer,
)

SHAPE = query_shape(QUERIES[3], True, 0, 0, 1)


def _frame(cpu: bool) -> QueryFrame:
    limits = QueryLimits()
    settings = RunnerSettings(300_000, 1000, True, 10.0, tuple((k, int(getattr(limits, k))) for k in LIMIT_NAMES))
    return QueryFrame(QUERIES[3], True, 1, 1, 1, 5.0, SLOTS, None, settings, cpu)


def test_the_cpu_field_is_sent_only_when_asked_and_must_be_a_bool() -> None:
    assert "cpu" not in orjson.loads(encode_request(_frame(False)))  # what an older proxy sends, byte for byte
    assert decode_request(encode_request(_frame(True))) == _frame(True)
    assert decode_request(encode_request(_frame(False))).cpu is False
    doc = orjson.loads(encode_request(_frame(True)))
    doc["cpu"] = 1
    with pytest.raises(ValueError, match="'cpu'"):
        decode_request(orjson.dumps(doc))


def test_a_timed_answer_carries_the_stores_time_beside_an_ordinary_answer() -> None:
    data = bytes([ANSWER_DATA]) + b'{"resultType":"vector","result":[]}'
    assert decode_answer(timed_answer(1_234_000, data)) == QueryAnswer(data=data[1:], cpu_s=0.001234)
    error = error_answer("bad_data", "no", 400)
    got = decode_answer(timed_answer(5, error))
    assert (got.error_type, got.message, got.status, got.cpu_s) == ("bad_data", "no", 400, 5e-9)
    assert decode_answer(data).cpu_s is None  # a store that predates it
    for bad in (bytes([ANSWER_TIMED]) + b"\0" * 8, bytes([ANSWER_TIMED]) + b"\0" * 3,
                timed_answer(1, timed_answer(1, data)), timed_answer(1, b"\x07")):
        with pytest.raises(Unavailable, match="query frame"):
            decode_answer(bad)


async def _spin(ms: float) -> None:
    end = time.thread_time() + ms / 1000
    while time.thread_time() < end:
        pass


async def test_the_stores_time_counts_its_own_steps_and_waits_not_other_tasks_steps() -> None:
    async def query() -> bytes:
        await _spin(5)
        await asyncio.sleep(0)  # a turn of the loop: another task runs 100 ms of CPU here
        await asyncio.to_thread(time.sleep, 0.02)  # a worker thread's evaluation: its wall time counts
        await _spin(5)
        return b"x"

    timed = _Timed(query())
    other = asyncio.get_running_loop().create_task(_spin(100))
    assert await timed == b"x"
    await other
    # 5 + 20 + 5 ms, not the other's 100. A loaded machine moves it either way: the loop thread
    # descheduled between handing the thread its work and starting the wait's clock (the thread
    # already sleeping) shortens the wait; descheduled when the thread is done lengthens it.
    assert 0.024 <= timed.ns / 1e9 < 0.100, timed.ns


async def test_a_timed_query_cancelled_is_cancelled_inside() -> None:
    inside = asyncio.Event()
    ended: list[str] = []

    async def query() -> bytes:
        inside.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise
        return b""

    async def ask() -> bytes:
        return await _Timed(query())

    task = asyncio.get_running_loop().create_task(ask())
    await inside.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ended == ["cancelled"]


def _slowed(h: Harness, seconds: float) -> None:
    """Every store's read port answers its queries ``seconds`` late (a loaded machine, a queue
    ahead of them): the answer time grows, the store's own time for the query does not."""
    for node in h.nodes.values():
        service = node.service
        assert service is not None

        async def late(body: bytes, answer: Any = service.answer) -> bytes:
            await asyncio.sleep(seconds)
            return bytes(await answer(body))

        node.servers[0].query = late


async def _spread(h: Harness, n: int) -> list[int]:
    services = [node.service for node in h.nodes.values() if node.service is not None]
    before = [s.answered for s in services]
    answers = await rates_together(h, n)
    assert all(a is not None and a.data for a in answers), answers
    return [s.answered - b for s, b in zip(services, before, strict=True)]


@pytest.mark.parametrize("harness", [{"settings": {"whole_spill_work_s": 60.0, "whole_spill_cheap_s": 0.015}}],
                         indirect=True)
async def test_a_cheap_query_answered_late_stays_cheap_and_together(harness: Harness) -> None:
    """Answers 30 ms late (twice the threshold) while the store's own time for one pod's rate is a
    fraction of it: learnt from the store's time, eight started together all go to the first store
    and count as cheap; learnt from the answer time, they would count heavy and spread."""
    path = harness.proxy.whole_queries
    learn_slow(harness, path.latency.settings.max_s)  # no hedge for lateness
    _slowed(harness, 0.030)
    for _ in range(3):
        await rates_together(harness, 1)
    cost = path.costs.cost(SHAPE)
    assert cost is not None and cost < 0.015, cost
    cheap, spread, timed = (harness.counter(k) for k in
                            ("whole_query_cheap", "whole_query_spread", "whole_query_timed"))
    assert timed >= 3
    assert sorted(await _spread(harness, 8)) == [0, 0, 8]
    assert harness.counter("whole_query_cheap") - cheap == 8
    assert harness.counter("whole_query_spread") == spread
    assert harness.counter("whole_query_timed") - timed == 8  # every answer learnt, not the lone ones only


@pytest.mark.parametrize("harness", [{"settings": {"whole_spill_work_s": 60.0, "whole_spill_cheap_s": 1e-9}}],
                         indirect=True)
async def test_heavy_queries_spread_and_are_counted_spread(harness: Harness) -> None:
    path = harness.proxy.whole_queries
    learn_slow(harness, path.latency.settings.max_s)
    for _ in range(2):
        await rates_together(harness, 1)
    assert harness.counter("whole_query_spread") == 0  # one at a time: nothing to spread from
    got = await _spread(harness, 8)
    assert sorted(got) == [2, 3, 3]
    # all but those the least busy in turn put on the first store anyway
    assert harness.counter("whole_query_spread") == 8 - got[path.first % 3]
    assert harness.counter("whole_query_cheap") == 0


def _untimed(h: Harness) -> None:
    """Every store answers as one that predates ANSWER_TIMED: the request's ``cpu`` unknown to it."""
    for node in h.nodes.values():
        service = node.service
        assert service is not None

        async def old(body: bytes, answer: Any = service.answer) -> bytes:
            doc = orjson.loads(body)
            doc.pop("cpu", None)
            return bytes(await answer(orjson.dumps(doc)))

        node.servers[0].query = old


async def test_from_a_store_that_predates_the_timed_answer_the_lone_answer_times_are_learnt(harness: Harness) -> None:
    path = harness.proxy.whole_queries
    learn_slow(harness, path.latency.settings.max_s)
    _untimed(harness)
    for _ in range(3):
        await rates_together(harness, 1)
    assert len(path.costs._times[SHAPE]) == 3 and harness.counter("whole_query_timed") == 0
    await rates_together(harness, 8)
    assert len(path.costs._times[SHAPE]) == 4  # only the first of eight started together was alone
