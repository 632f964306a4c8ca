"""The read port (metricsd/rpc/readport.py) on a real store over real TLS sockets on 127.0.0.1:
the same answers as gRPC, tokens and roles, malformed and hostile input, many requests on one
connection, and a proxy reading through it."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from metricsd.model import make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proxy.members import MemberClient
from metricsd.rpc.backend import BadRequest, LimitExceeded, Unavailable
from metricsd.rpc.channel import open_channel
from metricsd.rpc.frames import HEADER, MAX_BODY, FrameError, Kind, Method, decode_header, encode
from metricsd.rpc.health import start_cluster_grpc
from metricsd.rpc.readport import AdvertisedReadPort, ReadPortServer
from metricsd.rpc.readport_client import ReadPortClient
from metricsd.rpc.servicer import MetricsServicer
from metricsd.rpc.wire import columns_from_list, columns_from_read, labels_from_pb, labels_to_pb, matchers_to_pb
from metricsd.security.auth import Authenticator
from metricsd.security.certs import LocalPKI
from metricsd.security.settings import ClientSecurity, ServerSecurity
from metricsd.security.tls import ClientTLS, ServerTLS
from metricsd.security.tokens import TokenFile, hash_token
from metricsd.selector import parse_selector
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store

TOKENS = {"proxy": ("read,write", "p-token"), "agent": ("write", "w-token")}
PODS = 40


@dataclass
class Served:
    store: Store
    port: int
    grpc_address: str
    server: ReadPortServer
    pki: LocalPKI

    def client(self, token: str | None = "p-token") -> ReadPortClient:
        return ReadPortClient("127.0.0.1", self.port, ClientSecurity(ClientTLS(self.pki.ca, self.pki.cert,
                                                                               self.pki.key), token))


def _write(store: Store) -> None:
    api = StoreAPI(store)
    req = pb.WriteRequest()
    for p in range(PODS):
        labels = make_labels("cpu", {"namespace": "ns", "pod": f"pod-{p}"})
        req.ids.append(series_id(labels))
        req.counts.append(3)
        req.timestamps.extend([1000, 2000, 3000])
        req.values.extend([p, p + 1.0, p + 2.0])
        req.series.add(id=series_id(labels)).labels.extend(labels_to_pb(labels))
    api.write(req)


@pytest.fixture
async def served(pki: LocalPKI, tmp_path: Path) -> AsyncIterator[Served]:
    tokens = tmp_path / "tokens"
    tokens.write_text("".join(f"{n} {role} {hash_token(t)}\n" for n, (role, t) in TOKENS.items()))
    security = ServerSecurity(ServerTLS(pki.cert, pki.key, client_ca=pki.ca), Authenticator(TokenFile(tokens)))
    store = Store()
    _write(store)
    backend = LocalBackend(StoreAPI(store))
    server = ReadPortServer(backend, security, max_in_flight=4, hello_timeout_s=0.5)
    port = await server.start("127.0.0.1", 0)
    grpc_server, grpc_port = await start_cluster_grpc(MetricsServicer(AdvertisedReadPort(backend, port)),
                                                      AdvertisedReadPort(backend, port), "127.0.0.1", 0, security)
    yield Served(store, port, f"127.0.0.1:{grpc_port}", server, pki)
    await server.stop()
    await grpc_server.stop(None)


def _read(sel: str = 'namespace="ns"') -> pb.ReadRequest:
    return pb.ReadRequest(matchers=matchers_to_pb(parse_selector(sel, "cpu")), start_ms=0, end_ms=10_000)


async def test_reads_over_the_read_port_answer_what_the_store_answers(served: Served) -> None:
    backend = LocalBackend(StoreAPI(served.store))
    client = served.client()
    try:
        got = await client.call(Method.READ, _read())
        assert got == await backend.read(_read()) and len(got.series) == PODS
        agg = pb.AggregateRequest(query=pb.AggregateQuery(matchers=_read().matchers, series_fn=pb.SERIES_LAST,
                                                          window_ms=60_000), across=pb.ACROSS_SUM,
                                  start_ms=3000, end_ms=3000)
        assert await client.call(Method.AGGREGATE, agg) == await backend.aggregate(agg)
        lv = pb.LabelValuesRequest(name="pod")
        assert await client.call(Method.LABEL_VALUES, lv) == await backend.label_values(lv)
        # many requests in flight on one connection, more than the server serves at once
        answers = await asyncio.gather(*(client.call(Method.READ, _read(f'pod="pod-{p}"')) for p in range(PODS)))
        assert [a.series[0].values[0] for a in answers] == [float(p) for p in range(PODS)]
        with pytest.raises(BadRequest):  # the store's own refusal, as over gRPC
            await client.call(Method.READ, pb.ReadRequest(matchers=[pb.Matcher(type=pb.Matcher.RE, name="pod",
                                                                              value="(")], end_ms=1))
    finally:
        await client.close()


async def test_columnar_reads_and_listings_travel_the_read_port_whole_and_limits_hold_there(served: Served) -> None:
    """A proxy's member reads a store's columns (ReadRequest.columnar: one SeriesBatch) over the read
    port as over gRPC: the same batch the store gives, the same series as the per-series form, and a
    selection past the request's max_series refused as RESOURCE_EXHAUSTED before any sample is read."""
    backend = LocalBackend(StoreAPI(served.store))
    client = served.client()
    try:
        req = _read()
        req.columnar = True
        got = await client.call(Method.READ, req)
        assert got.HasField("batch") and not got.series and got == await backend.read(req)
        # answered from the store's columns without a message between: the same bytes all the same
        raw = await client.call_raw(Method.READ, req.SerializeToString())
        assert raw == (await backend.read(req)).SerializeToString()
        cols = columns_from_read(got)
        per_series = await backend.read(_read())
        assert [(lab, ts.tolist(), v.tolist()) for lab, ts, v in (cols.series_at(i) for i in range(len(cols)))] == [
            (labels_from_pb(s.labels), list(s.timestamps), list(s.values)) for s in per_series.series]
        listing = pb.ListSeriesRequest(matchers=_read().matchers, columnar=True)
        listed = await client.call(Method.LIST_SERIES, listing)
        assert listed.HasField("batch") and len(columns_from_list(listed)) == PODS
        req.max_series = PODS - 1
        with pytest.raises(LimitExceeded, match="max-series"):
            await client.call(Method.READ, req)
        req.max_series, req.max_samples = 0, 3 * PODS - 1
        with pytest.raises(LimitExceeded, match="max-samples"):
            await client.call(Method.READ, req)
    finally:
        await client.close()


async def test_the_read_port_wants_a_token_with_the_read_role(served: Served) -> None:
    for token, why in ((None, "UNAUTHENTICATED: no bearer token"), ("nope", "UNAUTHENTICATED: unknown or expired"),
                       ("w-token", "PERMISSION_DENIED: agent \\(roles: write\\) may not call Read")):
        client = served.client(token)
        try:
            with pytest.raises(Unavailable, match=why):
                await client.call(Method.READ, _read())
        finally:
            await client.close()


async def _raw(served: Served) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    ctx = ssl.create_default_context(cafile=str(served.pki.ca))
    ctx.load_cert_chain(served.pki.cert, served.pki.key)
    return await asyncio.open_connection("127.0.0.1", served.port, ssl=ctx, server_hostname="127.0.0.1")


async def _frame(reader: asyncio.StreamReader) -> tuple[int, Kind, int, bytes]:
    n, rid, kind, code = decode_header(await reader.readexactly(HEADER.size))
    return rid, kind, code, await reader.readexactly(n)


async def test_malformed_and_hostile_frames_are_refused_and_other_clients_keep_being_served(served: Served) -> None:
    good = served.client()
    try:
        # a request that is not protobuf: INVALID_ARGUMENT for it, the connection goes on
        reader, writer = await _raw(served)
        writer.write(encode(Kind.HELLO, 0, 0, b"p-token"))
        assert (await _frame(reader))[1] is Kind.RESPONSE
        writer.write(encode(Kind.REQUEST, 7, Method.READ, b"\xff\xff\xff"))
        rid, kind, code, body = await _frame(reader)
        assert (rid, kind, code) == (7, Kind.ERROR, grpc.StatusCode.INVALID_ARGUMENT.value[0])
        assert b"malformed request" in body
        writer.write(encode(Kind.REQUEST, 8, 99, b""))
        assert (await _frame(reader))[1:3] == (Kind.ERROR, grpc.StatusCode.UNIMPLEMENTED.value[0])
        # a header announcing a body over the limit: refused, and the connection closed
        writer.write(HEADER.pack(MAX_BODY + 1, 9, Kind.REQUEST, Method.READ, 0))
        rid, kind, code, body = await _frame(reader)
        assert kind is Kind.ERROR and b"over the limit" in body
        assert await reader.read() == b""
        writer.close()
        # garbage instead of a hello, and a client that never says hello: closed
        reader, writer = await _raw(served)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b"not a metricsd read port frame" in await reader.read()
        writer.close()
        reader, writer = await _raw(served)
        assert await asyncio.wait_for(reader.read(), 5.0) == b""  # after the 0.5 s hello timeout
        writer.close()
        # a flood on one connection: frames wait in TCP while 4 are served; all are answered
        reader, writer = await _raw(served)
        writer.write(encode(Kind.HELLO, 0, 0, b"p-token"))
        await _frame(reader)
        body = _read().SerializeToString()
        writer.write(b"".join(encode(Kind.REQUEST, i, Method.READ, body) for i in range(1, 501)))
        ids = {(await _frame(reader))[0] for _ in range(500)}
        assert ids == set(range(1, 501))
        writer.close()
        assert len((await good.call(Method.READ, _read())).series) == PODS
        assert served.store.stats()["samples"] == PODS * 3  # nothing changed
    finally:
        await good.close()


def test_frame_headers_round_trip_and_reject_what_is_out_of_format() -> None:
    frame = encode(Kind.REQUEST, 2**40, Method.AGGREGATE, b"abc")
    assert decode_header(frame[:HEADER.size]) == (3, 2**40, Kind.REQUEST, Method.AGGREGATE)
    assert frame.hex() == "03000000" "0000000000010000" "02" "02" "0000" + b"abc".hex()
    with pytest.raises(FrameError, match="unknown frame kind 9"):
        decode_header(HEADER.pack(0, 1, 9, 0, 0))
    with pytest.raises(FrameError, match="reserved"):
        decode_header(HEADER.pack(0, 1, 2, 1, 7))


async def test_a_proxy_member_reads_over_the_read_port_and_falls_back_to_grpc_when_it_breaks(served: Served) -> None:
    sec = ClientSecurity(ClientTLS(served.pki.ca, served.pki.cert, served.pki.key), "p-token")
    member = MemberClient(open_channel(served.grpc_address, sec), 5.0, served.grpc_address, sec)
    try:
        assert len((await member.read(_read())).series) == PODS
        assert member._port_client is not None  # the Health answer named the port, and it was used
        await served.server.stop()
        assert len((await member.read(_read())).series) == PODS  # over gRPC now
        assert member._port_client is None
    finally:
        await member.close()


async def test_a_broken_connection_is_not_dialled_again_where_another_process_may_listen_now(served: Served) -> None:
    """A restarted store listens on another read port; the old one may belong to another process
    by then. The client fails instead of dialling it again, and its owner asks Health anew."""
    client = served.client()
    try:
        assert len((await client.call(Method.READ, _read())).series) == PODS
        await served.server.stop()
        other = ReadPortServer(LocalBackend(StoreAPI(Store())), None)
        try:
            await other.start("127.0.0.1", served.port)  # a process of another store on the old port
            with pytest.raises(Unavailable, match="the connection broke"):
                await client.call(Method.READ, _read())
        finally:
            await other.stop()
    finally:
        await client.close()


async def test_a_read_port_that_cannot_be_reached_is_given_up_within_the_call_and_asked_for_less_often(
        served: Served, free_ports: Callable[[], int]) -> None:
    """A store whose Health names a port nothing answers on (a firewall, say): each read still
    answers over gRPC at once, and the port is tried again after 5 s, then 10 s, ..."""
    backend = AdvertisedReadPort(LocalBackend(StoreAPI(served.store)), free_ports())
    grpc_server, grpc_port = await start_cluster_grpc(MetricsServicer(backend), backend, "127.0.0.1", 0, None)
    address = f"127.0.0.1:{grpc_port}"
    member = MemberClient(open_channel(address), 5.0, address)
    try:
        waits = []
        for _ in range(3):
            assert len((await member.read(_read())).series) == PODS
            assert member._port_client is None
            waits.append(member._retry_after)
            member._probed_at = -1e9  # as if the wait had passed
        assert waits == [5.0, 10.0, 20.0]
    finally:
        await member.close()
        await grpc_server.stop(None)


async def test_a_whole_query_frame_wants_the_read_role_and_a_failing_method_is_answered_at_once(
        served: Served) -> None:
    """Method 6 (a whole PromQL query, rpc/wholequery.py) on a server that answers it: a token with
    the read role is answered, a write-only one refused as Read would be. A method that raises what
    it should not is answered INTERNAL at once, not left to the client's timeout."""
    import dataclasses

    from metricsd.http.wholequery import QueryService
    from metricsd.promql.limits import QueryLimits
    from metricsd.rpc.wholequery import QueryFrame, RunnerSettings, decode_answer, encode_request

    async def broken(body: bytes) -> bytes:
        raise RuntimeError("a bug")

    backend = LocalBackend(StoreAPI(served.store))
    frame = QueryFrame('sum(cpu{namespace="ns"})', True, 3000, 3000, 1, 5.0, 16, None,
                       RunnerSettings(300_000, 1_000_000, True, 5.0,
                                      tuple(dataclasses.asdict(QueryLimits()).items())))
    for answer in (QueryService(backend).answer, broken):
        served.server.query = answer
        client = served.client()
        try:
            if answer is broken:
                with pytest.raises(Unavailable, match="INTERNAL: internal error: RuntimeError"):
                    await asyncio.wait_for(client.call_raw(Method.QUERY, encode_request(frame)), 2.0)
                continue
            got = decode_answer(await client.call_raw(Method.QUERY, encode_request(frame)))
            assert got.data == b'{"resultType":"vector","result":[{"metric":{},"value":[3,"860"]}]}'
        finally:
            await client.close()
    # a frame naming a trillion slots is refused at once (INVALID_ARGUMENT), not built into a filter
    service = QueryService(backend)
    service.check_slots = lambda f, what: None  # as a cluster's store has: an ownership check
    served.server.query = service.answer
    client = served.client()
    try:
        for slots in (0, -3, 10**12):
            with pytest.raises(BadRequest, match="num_slots must be 1 to 65536"):
                await asyncio.wait_for(client.call_raw(Method.QUERY, encode_request(
                    dataclasses.replace(frame, num_slots=slots))), 2.0)
        got = decode_answer(await client.call_raw(Method.QUERY, encode_request(frame)))  # the connection goes on
        assert got.data.startswith(b'{"resultType":"vector"')
    finally:
        await client.close()
    writer = served.client("w-token")
    try:
        with pytest.raises(Unavailable, match="PERMISSION_DENIED: agent \\(roles: write\\) may not call Query"):
            await writer.call_raw(Method.QUERY, encode_request(frame))
    finally:
        await writer.close()


async def test_requests_sent_with_the_hello_wait_for_its_token_and_a_client_that_does_not_read_is_held(
        served: Served) -> None:
    """A client may send its requests right behind its HELLO: they wait while the token is checked,
    then are answered (not taken for frames before a hello). A client that stops reading its
    answers fills the transport's buffer; the store stops taking its requests (at most
    max_in_flight held) rather than buffering answers without end, and other clients are served."""
    body = _read().SerializeToString()
    reader, writer = await _raw(served)
    writer.write(encode(Kind.HELLO, 0, 0, b"p-token") +
                 b"".join(encode(Kind.REQUEST, i, Method.READ, body) for i in range(1, 4)))
    assert (await _frame(reader))[1] is Kind.RESPONSE
    got = [await _frame(reader) for _ in range(3)]
    assert sorted(rid for rid, kind, _, _ in got if kind is Kind.RESPONSE) == [1, 2, 3]
    # then a flood of big answers it never reads
    big = pb.ReadRequest(matchers=matchers_to_pb(parse_selector('namespace="ns"', "cpu")), start_ms=0,
                         end_ms=10_000).SerializeToString()
    writer.write(b"".join(encode(Kind.REQUEST, i, Method.READ, big) for i in range(10, 20_010)))
    good = served.client()
    try:
        deadline = time.monotonic() + 60
        while not any(c.writable is not None for c in served.server._conns):  # its answers fill the buffers
            assert time.monotonic() < deadline, "the store's buffer to the client that does not read was never full"
            assert all(len(c.tasks) <= served.server.max_in_flight for c in served.server._conns)
            await asyncio.sleep(0.01)
        held = [c for c in served.server._conns if c.writable is not None]
        assert len(held) == 1 and held[0].transport is not None
        for _ in range(100):  # while the client does not read: its answers wait in the requests, not in a buffer
            assert held[0].transport.get_write_buffer_size() < 1 << 20
            await asyncio.sleep(0.01)
        assert held[0].writable is not None and held[0].reading_paused
        assert len(held[0].tasks) == served.server.max_in_flight
        assert len((await asyncio.wait_for(good.call(Method.READ, _read()), 10)).series) == PODS
    finally:
        await good.close()
        writer.close()


async def test_a_request_sent_now_is_answered_as_it_is_read_forgotten_on_demand_and_failed_when_the_line_breaks(
        served: Served) -> None:
    """ReadPortClient.send_now (the proxy's whole queries on a connection that is up), over TLS with
    a token: None until the connection is up; the answer's body, or the store's error as call_raw
    raises it, handed over; a request forgotten leaves nothing waiting and its late answer is
    dropped; a connection that breaks fails what waits on it, and nothing more is sent now."""
    got: list[bytes | Exception] = []
    landed = asyncio.Event()

    def deliver(out: bytes | Exception) -> None:
        got.append(out)
        landed.set()

    client = served.client()
    try:
        assert client.send_now(Method.READ, _read().SerializeToString(), deliver) is None  # not dialled yet
        assert len((await client.call(Method.READ, _read())).series) == PODS
        assert client.send_now(Method.READ, _read().SerializeToString(), deliver) is not None
        await asyncio.wait_for(landed.wait(), 5.0)
        assert len(pb.ReadResponse.FromString(got.pop()).series) == PODS  # type: ignore[arg-type]
        landed.clear()
        assert client.send_now(Method.READ, b"\xff\xff not a request", deliver) is not None
        await asyncio.wait_for(landed.wait(), 5.0)
        assert isinstance(got.pop(), BadRequest)
        released = asyncio.Event()

        async def stall(body: bytes) -> bytes:
            await released.wait()
            return b"late"

        served.server.query = stall
        landed.clear()
        forget = client.send_now(Method.QUERY, b"q", deliver)
        assert forget is not None and client._waiting
        forget()
        assert not client._waiting
        released.set()
        await asyncio.sleep(0.1)  # the late answer read meanwhile
        assert len((await client.call(Method.READ, _read())).series) == PODS
        assert got == []  # dropped
        released.clear()
        assert client.send_now(Method.QUERY, b"q", deliver) is not None
        await served.server.stop()
        await asyncio.wait_for(landed.wait(), 5.0)
        out = got.pop()
        assert isinstance(out, Unavailable) and "the connection broke" in str(out), out
        assert not client._waiting
        assert client.send_now(Method.READ, _read().SerializeToString(), deliver) is None
    finally:
        released.set()
        await client.close()
