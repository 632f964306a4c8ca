"""A coroutine started at once (metricsd/rpc/eager.py) and a store's WRITE_PARTS frames answered on the
read port's ``data_received`` without a task (metricsd/rpc/readport.py), on a real store and a real
plain-TCP read port on 127.0.0.1: the writes and answers as before, no task a frame, a message that
must wait carried on by a task, and at most a turn's worth of write messages taken a turn."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import pytest

from metricsd.model import make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.client import parts_body
from metricsd.rpc.eager import start_eagerly
from metricsd.rpc.frames import HEADER, Kind, Method, decode_header, encode
from metricsd.rpc.readport import ReadPortServer
from metricsd.rpc.servicer import MetricsServicer
from metricsd.rpc.wire import labels_to_pb
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store


async def test_a_coroutine_that_does_not_wait_is_run_at_once_without_a_task() -> None:
    done: list[int] = []

    async def quick() -> int:
        done.append(1)
        return 1

    assert start_eagerly(quick()) is None
    assert done == [1]  # before the caller's next await


async def test_a_coroutine_that_waits_is_carried_on_by_a_task_from_where_it_waited() -> None:
    steps: list[str] = []
    gate: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def slow() -> int:
        steps.append("before")
        got = await gate
        steps.append("after")
        await asyncio.sleep(0)  # a bare yield too
        return got + 1

    task = start_eagerly(slow())
    assert task is not None and steps == ["before"]
    await asyncio.sleep(0)
    assert not task.done()
    gate.set_result(41)
    assert await task == 42 and steps == ["before", "after"]


async def test_an_error_after_the_wait_is_the_tasks_and_a_cancellation_reaches_the_coroutine() -> None:
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    seen: list[str] = []

    async def fails() -> None:
        await gate
        raise ValueError("after the wait")

    async def cancelled() -> str:
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return "never"

    async def shrugs() -> str:
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            return "answered anyway"
        return "never"

    failing = start_eagerly(fails())
    assert failing is not None
    gate.set_result(None)
    with pytest.raises(ValueError, match="after the wait"):
        await failing
    waiting = start_eagerly(cancelled())
    assert waiting is not None
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert seen == ["cancelled"]
    at_once = start_eagerly(cancelled())  # cancelled before the task's first step: thrown in
    assert at_once is not None
    at_once.cancel()
    with pytest.raises(asyncio.CancelledError):
        await at_once
    assert seen == ["cancelled", "cancelled"]
    shrugging = start_eagerly(shrugs())
    assert shrugging is not None
    await asyncio.sleep(0)
    shrugging.cancel()
    assert await shrugging == "answered anyway"


def _part(pod: int, t_ms: int) -> bytes:
    lab = make_labels("cpu", {"namespace": "ns", "pod": f"pod-{pod}"})
    req = pb.WriteRequest(ids=[series_id(lab)], counts=[1], timestamps=[t_ms], values=[float(pod)])
    req.series.add(id=series_id(lab)).labels.extend(labels_to_pb(lab))
    return req.SerializeToString()


class _Port:
    """A store's read port as metricsd/cmd/store.py serves it (its servicer's writes, in turn),
    without TLS, and a raw client on it."""

    def __init__(self, server: ReadPortServer, store: Store, servicer: MetricsServicer,
                 reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.server, self.store, self.servicer, self.reader, self.writer = server, store, servicer, reader, writer

    async def frame(self) -> tuple[int, Kind, int, bytes]:
        n, rid, kind, code = decode_header(await self.reader.readexactly(HEADER.size))
        return rid, kind, code, await self.reader.readexactly(n)


@pytest.fixture
async def port() -> AsyncIterator[_Port]:
    store = Store()
    backend = LocalBackend(StoreAPI(store))
    server = ReadPortServer(backend, None, max_writes_in_flight=3)
    servicer = MetricsServicer(backend, writes_in_turn=True)
    server.write_parts = servicer.write_parts_body
    bound = await server.start("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", bound)
    p = _Port(server, store, servicer, reader, writer)
    writer.write(encode(Kind.HELLO, 0, 0, b""))
    assert (await p.frame())[1] is Kind.RESPONSE
    yield p
    writer.close()
    await server.stop()


def _writes(first: int, n: int) -> bytes:
    return b"".join(encode(Kind.REQUEST, i, Method.WRITE_PARTS, parts_body([_part(i, 1000)], 5.0))
                    for i in range(first, first + n))


def _written(body: bytes) -> int:
    return pb.WritePartsResponse.FromString(body).results[0].response.samples_written


async def test_write_messages_are_answered_without_a_task_and_at_most_a_turns_worth_a_turn(port: _Port) -> None:
    """Ten messages in one send: each written and answered as before, none through a task of its
    own, and no turn of the loop writing more than max_writes_in_flight (3) of them: the rest wait
    for the next turn, so one connection's burst does not hold the loop."""
    loop = asyncio.get_running_loop()
    made: list[str] = []
    default = loop.get_task_factory()

    def counting(lp: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any]) -> asyncio.Future[Any]:
        made.append(coro.__qualname__)
        return default(lp, coro) if default is not None else asyncio.Task(coro, loop=lp)

    turn = [0]

    def tick() -> None:
        turn[0] += 1
        loop.call_soon(tick)

    per_turn: dict[int, int] = {}
    write = port.servicer.write_parts_body

    async def counted(body: bytes, host: str) -> bytes:
        per_turn[turn[0]] = per_turn.get(turn[0], 0) + 1
        return await write(body, host)

    port.server.write_parts = counted
    loop.set_task_factory(counting)
    handle = loop.call_soon(tick)
    try:
        port.writer.write(_writes(1, 10))
        answers = {}
        for _ in range(10):
            rid, kind, _, body = await port.frame()
            assert kind is Kind.RESPONSE
            answers[rid] = _written(body)
    finally:
        loop.set_task_factory(default)
        handle.cancel()
    assert answers == {i: 1 for i in range(1, 11)}
    assert port.store.stats()["samples"] == 10
    assert not [m for m in made if "_answer" in m or "_carry_on" in m]
    assert max(per_turn.values()) <= 3 and sum(per_turn.values()) == 10


async def test_a_write_message_that_must_wait_is_carried_on_by_a_task_and_answered(port: _Port) -> None:
    """While the store's write turn is held the message waits in a task (counted among the
    connection's writes); it is written and answered once the turn is free, in order after it."""
    assert port.servicer._turn is not None
    conn = next(iter(port.server._conns))
    async with port.servicer._turn:
        port.writer.write(_writes(1, 2))
        for _ in range(200):
            if len(conn.writes) == 2:
                break
            await asyncio.sleep(0.01)
        assert len(conn.writes) == 2 and port.store.stats()["samples"] == 0
    got = [await port.frame() for _ in range(2)]
    assert [(rid, kind, _written(body)) for rid, kind, _, body in got] == [(1, Kind.RESPONSE, 1), (2, Kind.RESPONSE, 1)]
    assert port.store.stats()["samples"] == 2 and not conn.writes
