"""rpc WriteStream: the receiving end's ordering (pure asyncio) and both ends over loopback gRPC on a
real store: pipelined writes on one stream, a refused message, a receiver that hangs, a receiver that
restarts, a flood beside other calls, and tokens over TLS."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from metricsd.model import make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import BadRequest, Unavailable
from metricsd.rpc.channel import open_channel
from metricsd.rpc.client import MetricsClient, StreamingBackend
from metricsd.rpc.server import start_grpc_server
from metricsd.rpc.servicer import MAX_WRITE_PARTS
from metricsd.rpc.stream import answer_in_order
from metricsd.rpc.wire import labels_to_pb, length_delimited
from metricsd.security.auth import Authenticator
from metricsd.security.certs import LocalPKI
from metricsd.security.settings import ClientSecurity, ServerSecurity
from metricsd.security.tls import ClientTLS, ServerTLS
from metricsd.security.tokens import TokenFile, hash_token
from metricsd.store.api import LocalBackend, StoreAPI, StoreServicer
from metricsd.store.engine import Store

T0 = 1_700_000_000_000


def labelled(pod: str, ts: list[int]) -> pb.WriteRequest:
    lab = make_labels("container_cpu_usage_seconds_total", {"namespace": "ns", "pod": pod})
    sid = series_id(lab)
    req = pb.WriteRequest(ids=[sid], counts=[len(ts)], timestamps=ts, values=[1.0] * len(ts))
    req.series.add(id=sid).labels.extend(labels_to_pb(lab))
    return req


# --- the receiving end's order ------------------------------------------------------------------


async def _requests(n: int) -> AsyncIterator[pb.WritePartsRequest]:
    for i in range(n):
        yield pb.WritePartsRequest(parts=[pb.WriteRequest(ids=[i])])


async def test_answers_keep_the_order_of_the_messages_and_at_most_in_flight_run_at_once() -> None:
    running, most = 0, 0

    async def handle(req: pb.WritePartsRequest) -> pb.WritePartsResponse:
        nonlocal running, most
        running += 1
        most = max(most, running)
        i = req.parts[0].ids[0]
        for _ in range(20 - i):  # the later messages finish first: fewer loop iterations, no clock
            await asyncio.sleep(0)
        running -= 1
        return pb.WritePartsResponse(results=[pb.WritePartResult(response=pb.WriteResponse(samples_written=i))])

    got = [r.results[0].response.samples_written async for r in answer_in_order(_requests(20), handle, in_flight=4)]
    assert got == list(range(20))
    assert most == 4


async def test_an_error_ends_the_stream_and_cancels_the_messages_after_it() -> None:
    cancelled: list[int] = []

    async def handle(req: pb.WritePartsRequest) -> pb.WritePartsResponse:
        i = req.parts[0].ids[0]
        if i == 2:
            raise BadRequest("message 2 is bad")
        try:
            if i > 2:
                await asyncio.Event().wait()  # never set: only cancellation ends it
        except asyncio.CancelledError:
            cancelled.append(i)
            raise
        return pb.WritePartsResponse()

    got = []
    with pytest.raises(BadRequest, match="message 2"):
        async for r in answer_in_order(_requests(6), handle, in_flight=8):
            got.append(r)
    await asyncio.sleep(0)
    assert len(got) == 2 and cancelled and all(i > 2 for i in cancelled)


# --- both ends over gRPC --------------------------------------------------------------------------


class SlowBackend(LocalBackend):
    """A store whose writes wait for ``release``: a receiver that hangs."""

    def __init__(self, store: Store) -> None:
        super().__init__(StoreAPI(store))
        self.release = asyncio.Event()
        self.release.set()

    async def write(self, request: pb.WriteRequest) -> pb.WriteResponse:
        await self.release.wait()
        return await super().write(request)


@pytest.fixture
async def store() -> AsyncIterator[tuple[Store, SlowBackend, StreamingBackend, str]]:
    from metricsd.rpc.servicer import MetricsServicer

    s = Store()
    backend = SlowBackend(s)
    server, port = await start_grpc_server(MetricsServicer(backend), "127.0.0.1", 0)
    client = StreamingBackend(open_channel(f"127.0.0.1:{port}"), timeout_s=2.0)
    yield s, backend, client, f"127.0.0.1:{port}"
    await client.close()
    await server.stop(None)


async def test_writes_in_flight_share_one_stream_and_each_gets_its_own_answer(
        store: tuple[Store, SlowBackend, StreamingBackend, str]) -> None:
    s, _, client, _ = store
    reqs = [labelled(f"p{i}", [T0, T0 + 10_000]) for i in range(50)] + [labelled("bad", [T0, T0])]
    got = await asyncio.gather(*(client.write(r) for r in reqs), return_exceptions=True)
    assert all(isinstance(g, pb.WriteResponse) and g.samples_written == 2 for g in got[:50])
    assert isinstance(got[50], BadRequest) and "must strictly increase" in str(got[50])
    assert client.stream.opened == 1
    assert s.index.n_alive == 50 and s.stats()["samples"] == 100


async def test_a_message_of_too_many_parts_is_refused_and_the_next_goes_on_a_new_stream(
        store: tuple[Store, SlowBackend, StreamingBackend, str]) -> None:
    s, _, client, _ = store
    parts = [labelled(f"p{i}", [T0]).SerializeToString() for i in range(MAX_WRITE_PARTS + 1)]
    with pytest.raises(BadRequest, match=f"at most {MAX_WRITE_PARTS}"):
        await client.stream.send(b"".join(length_delimited(1, p) for p in parts))
    assert s.index.n_alive == 0
    assert (await client.write(labelled("a", [T0]))).samples_written == 1
    assert client.stream.opened == 2


async def test_a_receiver_that_hangs_fails_every_waiting_message_after_the_timeout(
        store: tuple[Store, SlowBackend, StreamingBackend, str]) -> None:
    _, backend, client, addr = store
    client.stream.timeout_s = 0.5
    backend.release.clear()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    got = await asyncio.gather(*(client.write(labelled(f"p{i}", [T0])) for i in range(3)), return_exceptions=True)
    assert all(isinstance(g, Unavailable) for g in got), got
    assert 0.4 < loop.time() - t0 < 2.0
    async with MetricsClient(addr, timeout_s=2) as other:  # the server still answers others
        assert (await other.health()).status == pb.HealthResponse.SERVING
    backend.release.set()
    assert (await client.write(labelled("after", [T0]))).samples_written == 1
    assert client.stream.opened == 2


async def test_a_receiver_that_restarts_fails_the_stream_and_the_next_write_reconnects() -> None:
    from metricsd.rpc.servicer import MetricsServicer

    s = Store()
    server, port = await start_grpc_server(StoreServicer(s), "127.0.0.1", 0)
    client = StreamingBackend(open_channel(f"127.0.0.1:{port}"), timeout_s=2.0)
    try:
        assert (await client.write(labelled("a", [T0]))).samples_written == 1
        await server.stop(None)
        with pytest.raises(Unavailable):
            await client.write(labelled("b", [T0]))
        server, _ = await start_grpc_server(MetricsServicer(StoreServicer(s).backend), "127.0.0.1", port)
        for _ in range(50):  # the channel reconnects with back-off
            try:
                resp = await client.write(labelled("b", [T0]))
                break
            except Unavailable:
                await asyncio.sleep(0.1)
        assert resp.samples_written == 1 and s.index.n_alive == 2
        assert client.stream.opened >= 2
    finally:
        await client.close()
        await server.stop(None)


@pytest.mark.slow
async def test_a_flood_on_one_stream_does_not_stop_other_calls(
        store: tuple[Store, SlowBackend, StreamingBackend, str]) -> None:
    s, _, client, addr = store
    # a message's time runs from its send: the last waits for all before it (4 M samples took 63 s
    # at load 8, past the 60 s this had)
    client.stream.timeout_s = 240.0
    big = [labelled(f"p{i}", list(range(T0, T0 + 20_000 * 10_000, 10_000))) for i in range(200)]
    flood = asyncio.gather(*(client.write(r) for r in big))
    # Health's own deadline is generous (a loaded 2-core machine once took past 2 s for one answer);
    # what the test asks is that calls are answered WHILE the flood runs: a server that served the
    # stream first would answer once, after it, and fail `answered >= 2`.
    async with MetricsClient(addr, timeout_s=10) as other:
        answered = 0
        while not flood.done():
            assert (await other.health()).status == pb.HealthResponse.SERVING
            answered += 1
            await asyncio.sleep(0.01)
    assert all(r.samples_written == 20_000 for r in await flood)
    assert answered >= 2 and s.stats()["samples"] == 200 * 20_000


TOKENS = {"agent": ("write", "w-token"), "graf": ("read", "r-token")}


async def test_a_stream_needs_a_token_with_the_write_role(pki: LocalPKI, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("".join(f"{n} {role} {hash_token(t)}\n" for n, (role, t) in TOKENS.items()))
    s = Store()
    security = ServerSecurity(ServerTLS(pki.cert, pki.key, client_ca=pki.ca), Authenticator(TokenFile(tokens)))
    server, port = await start_grpc_server(StoreServicer(s), "127.0.0.1", 0, security)

    def backend(token: str | None) -> StreamingBackend:
        sec = ClientSecurity(ClientTLS(pki.ca, pki.cert, pki.key), token)
        # 30 s: a loaded machine's TLS handshakes once outlasted 5
        return StreamingBackend(open_channel(f"127.0.0.1:{port}", sec), timeout_s=30.0)

    anonymous, graf, agent = backend(None), backend("r-token"), backend("w-token")
    try:
        with pytest.raises(Unavailable, match="UNAUTHENTICATED"):
            await anonymous.write(labelled("a", [T0]))
        with pytest.raises(Unavailable, match=r"PERMISSION_DENIED.*WriteStream: it needs role write"):
            await graf.write(labelled("a", [T0]))
        assert s.stats()["samples"] == 0
        assert (await agent.write(labelled("a", [T0]))).samples_written == 1
        assert anonymous.stream.supported and graf.stream.supported  # refused, not unimplemented
    finally:
        for b in (anonymous, graf, agent):
            await b.close()
        await server.stop(None)


def test_the_policy_gives_write_stream_the_write_role() -> None:
    from metricsd.security.policy import grpc_role
    from metricsd.security.tokens import Role

    assert grpc_role("/metricsd.v1.Metrics/WriteStream") == Role.WRITE
