"""A whole query sent at once on a read-port connection that is up (WholeQueryPath._start,
MemberClient.query_now): hedged, replaced and cancelled as one sent from a task of its own, with
nothing left counted or waiting. The three real stores and proxy of whole_query_harness.py."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from whole_query_harness import AT, QUERIES, Harness, learn_slow, stall, warm

from metricsd.rpc.readport_client import ReadPortClient


async def _under_way(port: ReadPortClient, asked: asyncio.Future[Any]) -> None:
    """Wait until the proxy's ask waits on ``port``: the HTTP request, its parse and the proxy's plan
    come first, and a fixed pause for them can be too short on a loaded 2-core machine."""
    deadline = time.monotonic() + 10.0
    while not port._waiting:
        assert not asked.done() and time.monotonic() < deadline, "the ask never reached store-0"
        await asyncio.sleep(0.01)


async def test_a_stalled_store_sent_to_at_once_is_hedged_and_forgotten(harness: Harness) -> None:
    """Sent at once (no task: what waits on the connection is the ask's own sink, not a future),
    answered; then, with a short hedging delay learnt, a stalled store is hedged and its ask forgotten."""
    members = await warm(harness)
    port = members["store-0"]._port_client  # the proxy's first store (fast_settings: first place 0)
    assert port is not None
    learn_slow(harness, 20.0)
    released = asyncio.Event()
    stall(harness, "store-0", released)
    try:
        asked = asyncio.ensure_future(harness.get("/api/v1/query", query=QUERIES[0], time=AT))
        await _under_way(port, asked)
        assert [type(w).__name__ for w in port._waiting.values()] == ["_Sink"]
        released.set()
        status, body = await asyncio.wait_for(asked, 10.0)
        assert status == 200 and body["data"]["result"], body
        assert harness.counter("whole_query_hedges") == 0 and not port._waiting
        released.clear()
        # store-0 alone hedged at once: store-1 keeps its 20 s, or an answer slower than 10 ms (a
        # loaded machine: 1 run in 8) was hedged again to store-2 and counted twice
        learn_slow(harness, 0.01, ["store-0"])
        status, body = await harness.get("/api/v1/query", query=QUERIES[0], time=AT)
        assert status == 200 and body["data"]["result"], body
        assert harness.counter("whole_query_hedges") == 1
        assert sum(harness.proxy.whole_queries.in_flight.values()) == 0
        assert not port._waiting  # the stalled ask forgotten: its late answer dropped
    finally:
        released.set()


async def test_a_store_whose_connection_breaks_under_an_ask_sent_at_once_is_replaced_at_once(
        harness: Harness) -> None:
    port = (await warm(harness))["store-0"]._port_client
    assert port is not None
    learn_slow(harness, 20.0)  # no hedge: the next store is asked because the first failed
    released = asyncio.Event()
    stall(harness, "store-0", released)
    before = [n.service.answered for n in harness.nodes.values() if n.service is not None]
    try:
        asked = asyncio.ensure_future(harness.get("/api/v1/query", query=QUERIES[0], time=AT))
        await _under_way(port, asked)  # the break comes under the ask, not before it is sent
        assert not asked.done()
        t0 = time.monotonic()
        await harness.nodes["store-0"].servers[0].stop()
        status, body = await asyncio.wait_for(asked, 10.0)
        assert status == 200 and body["data"]["result"], body
        assert time.monotonic() - t0 < 5.0
        after = [n.service.answered for n in harness.nodes.values() if n.service is not None]
        assert [a - b for a, b in zip(after, before, strict=True)] == [0, 1, 0]  # store-1, the next
        assert harness.proxy.view.health.failed("store-0") == 1
        assert sum(harness.proxy.whole_queries.in_flight.values()) == 0
    finally:
        released.set()
