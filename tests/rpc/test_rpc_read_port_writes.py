"""A proxy's writes over a store's read port (WRITE_PARTS, metricsd/rpc/readport.py) on a real store
over real TLS sockets on 127.0.0.1: what the WriteStream stores and answers, the write role, bad
and hostile messages storing nothing, the fall-backs to gRPC (a store that predates the method, a
connection that breaks), and the bounds that keep a busy store's loop its own (write messages in
flight per connection, a message past its sender's deadline not written)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from test_rpc_read_port import Served as ReadPortServed

from metricsd.model import make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proxy.members import MemberClient
from metricsd.rpc.backend import BadRequest, Unavailable
from metricsd.rpc.channel import open_channel
from metricsd.rpc.client import parts_body
from metricsd.rpc.frames import Method
from metricsd.rpc.health import start_cluster_grpc
from metricsd.rpc.readport import AdvertisedReadPort, ReadPortServer
from metricsd.rpc.readport_client import ReadPortClient
from metricsd.rpc.servicer import MAX_WRITE_PARTS, MetricsServicer
from metricsd.rpc.stream import STREAM_IN_FLIGHT
from metricsd.rpc.wire import labels_to_pb, length_delimited
from metricsd.security.auth import Authenticator
from metricsd.security.certs import LocalPKI
from metricsd.security.settings import ClientSecurity, ServerSecurity
from metricsd.security.tls import ClientTLS, ServerTLS
from metricsd.security.tokens import TokenFile, hash_token
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store

TOKENS = {"proxy": ("read,write", "p-token"), "reader": ("read", "r-token")}


@dataclass
class Served(ReadPortServed):
    """test_rpc_read_port's store, with the proxy's write end and the store's servicer."""

    servicer: MetricsServicer | None = None

    def security(self, token: str = "p-token") -> ClientSecurity:
        return ClientSecurity(ClientTLS(self.pki.ca, self.pki.cert, self.pki.key), token)

    def member(self, token: str = "p-token", on_port: bool = True) -> MemberClient:
        """The proxy's end, as proxy/members.py makes it with ``--writes-on-read-port``."""
        sec = self.security(token)
        return MemberClient(open_channel(self.grpc_address, sec), 5.0, self.grpc_address, sec,
                            writes_on_read_port=on_port)


async def _serve(pki: LocalPKI, tmp_path: Path, writes: bool) -> tuple[Served, grpc.aio.Server]:
    """A store as metricsd/cmd/store.py serves it: the read port's writes are its servicer's."""
    tokens = tmp_path / "tokens"
    tokens.write_text("".join(f"{n} {role} {hash_token(t)}\n" for n, (role, t) in TOKENS.items()))
    security = ServerSecurity(ServerTLS(pki.cert, pki.key, client_ca=pki.ca), Authenticator(TokenFile(tokens)))
    store = Store()
    backend = LocalBackend(StoreAPI(store))
    server = ReadPortServer(backend, security)
    port = await server.start("127.0.0.1", 0)
    servicer = MetricsServicer(AdvertisedReadPort(backend, port), writes_in_turn=True)  # as a store's
    if writes:
        server.write_parts = servicer.write_parts_body
    grpc_server, grpc_port = await start_cluster_grpc(servicer, AdvertisedReadPort(backend, port), "127.0.0.1", 0,
                                                      security)
    return Served(store, port, f"127.0.0.1:{grpc_port}", server, pki, servicer), grpc_server


@pytest.fixture
async def served(pki: LocalPKI, tmp_path: Path) -> AsyncIterator[Served]:
    s, grpc_server = await _serve(pki, tmp_path, writes=True)
    yield s
    await s.server.stop()
    await grpc_server.stop(None)


def _part(pods: range, t_ms: int, labels: bool = True) -> bytes:
    req = pb.WriteRequest()
    for p in pods:
        lab = make_labels("cpu", {"namespace": "ns", "pod": f"pod-{p}"})
        req.ids.append(series_id(lab))
        req.counts.append(1)
        req.timestamps.append(t_ms)
        req.values.append(float(p))
        if labels:
            req.series.add(id=series_id(lab)).labels.extend(labels_to_pb(lab))
    return req.SerializeToString()


def _bad_part() -> bytes:
    """Counts that do not add up to the samples: refused whole."""
    return pb.WriteRequest(ids=[1], counts=[2], timestamps=[1000], values=[1.0]).SerializeToString()


async def test_a_proxy_member_writes_over_the_read_port_as_over_the_stream(served: Served) -> None:
    member = served.member()
    try:
        results = await member.write_parts([_part(range(10), 1000), _bad_part(), _part(range(10, 30), 1000),
                                            _part(range(30, 35), 1000, labels=False)])
        assert member._port_client is not None and member.stream.opened == 0  # no WriteStream was needed
        first, bad, third, unknown = results
        assert isinstance(first, pb.WriteResponse) and first.samples_written == 10
        assert isinstance(bad, BadRequest)
        assert isinstance(third, pb.WriteResponse) and third.samples_written == 20
        assert isinstance(unknown, pb.WriteResponse) and len(unknown.unknown_ids) == 5  # resent with labels
        assert served.store.stats()["samples"] == 30
        # the same series again: duplicates counted as the stream counts them, nothing added
        again = await member.write_parts([_part(range(10), 1000, labels=False)])
        assert isinstance(again[0], pb.WriteResponse) and again[0].rejected_duplicate == 10
        assert served.store.stats()["samples"] == 30
        later = await member.write_parts([_part(range(35), 2000)])
        assert isinstance(later[0], pb.WriteResponse) and later[0].samples_written == 35
        assert served.store.stats()["samples"] == 65
        assert member.stream.opened == 0
    finally:
        await member.close()


async def test_writes_on_the_read_port_need_the_write_role_and_bad_messages_store_nothing(served: Served) -> None:
    reader = ReadPortClient("127.0.0.1", served.port, served.security("r-token"))
    body = length_delimited(1, _part(range(5), 1000))
    try:
        with pytest.raises(Unavailable, match="PERMISSION_DENIED: reader \\(roles: read\\) may not call WriteParts"):
            await reader.call_raw(Method.WRITE_PARTS, body, "WriteParts")
    finally:
        await reader.close()
    client = ReadPortClient("127.0.0.1", served.port, served.security())
    try:
        with pytest.raises(BadRequest, match="malformed request"):
            await client.call_raw(Method.WRITE_PARTS, b"\xff\xff\xff", "WriteParts")
        too_many = b"".join(length_delimited(1, _part(range(i, i + 1), 1000)) for i in range(MAX_WRITE_PARTS + 1))
        with pytest.raises(BadRequest, match=f"{MAX_WRITE_PARTS + 1} parts in one WriteParts message"):
            await client.call_raw(Method.WRITE_PARTS, too_many, "WriteParts")
        assert served.store.stats()["samples"] == 0
        # the connection is still good: a well-formed message is written
        answer = pb.WritePartsResponse.FromString(await client.call_raw(Method.WRITE_PARTS, body, "WriteParts"))
        assert [r.response.samples_written for r in answer.results] == [5]
        assert served.store.stats()["samples"] == 5
    finally:
        await client.close()


async def test_a_store_without_writes_on_its_read_port_is_written_over_the_stream(pki: LocalPKI,
                                                                                   tmp_path: Path) -> None:
    s, grpc_server = await _serve(pki, tmp_path, writes=False)
    member = s.member()
    try:
        results = await member.write_parts([_part(range(8), 1000)])
        assert isinstance(results[0], pb.WriteResponse) and results[0].samples_written == 8
        assert not member.writes_over_port and member.stream.opened == 1
        assert member._port_client is not None  # reads keep using the port
        await member.write_parts([_part(range(8), 2000, labels=False)])
        assert member.stream.opened == 1 and s.store.stats()["samples"] == 16
    finally:
        await member.close()
        await s.server.stop()
        await grpc_server.stop(None)


async def test_a_write_whose_read_port_breaks_is_unavailable_and_the_next_goes_over_grpc(served: Served) -> None:
    member = served.member()
    try:
        await member.write_parts([_part(range(4), 1000)])
        assert member._port_client is not None
        await served.server.stop()  # the port's connection breaks under the proxy
        with pytest.raises(Unavailable, match="read port"):  # outcome unknown: the write path hands it off
            await member.write_parts([_part(range(4), 2000, labels=False)])
        assert member._port_client is None
        results = await member.write_parts([_part(range(4), 3000, labels=False)])
        assert isinstance(results[0], pb.WriteResponse) and results[0].samples_written == 4
        assert member.stream.opened == 1
        assert served.store.stats()["samples"] == 8
    finally:
        await member.close()


async def test_without_the_setting_writes_stay_on_the_stream(served: Served) -> None:
    member = served.member(on_port=False)
    try:
        results = await member.write_parts([_part(range(6), 1000)])
        assert isinstance(results[0], pb.WriteResponse) and results[0].samples_written == 6
        assert member.stream.opened == 1
        assert len((await member.read(pb.ReadRequest(matchers=[pb.Matcher(name="__name__", value="cpu")],
                                                     start_ms=0, end_ms=10_000))).series) == 6
        assert member._port_client is not None  # reads took the port, writes did not
    finally:
        await member.close()


async def test_a_message_whose_senders_deadline_passed_while_it_waited_is_not_written(served: Served) -> None:
    """A message with a 1 ms timeout waits its turn behind another write (the store's turn held
    until it waits, then 10 ms more): it is answered DEADLINE_EXCEEDED part by part and none of it
    is stored. Its sender had given up on it and handed it off: writing it anyway is work a busy
    store cannot spare (a store restarted under tests/cluster/test_cluster_proxies.py lost its
    lease to such writes)."""
    assert served.servicer is not None and served.servicer._turn is not None
    client = ReadPortClient("127.0.0.1", served.port, served.security())
    try:
        await client.call_raw(Method.WRITE_PARTS, parts_body([_part(range(2), 1000)], 5.0), "WriteParts")
        async with served.servicer._turn:  # the store busy with another write
            late = asyncio.ensure_future(client.call_raw(
                Method.WRITE_PARTS, parts_body([_part(range(2, 5), 1000), _part(range(5, 7), 1000)], 0.001),
                "WriteParts"))
            # until the message waits for the turn (a fixed sleep let a loaded machine deliver it
            # after the turn was free), then past its 1 ms
            turn = served.servicer._turn
            deadline = time.monotonic() + 10.0
            while not turn._waiters and time.monotonic() < deadline:  # type: ignore[attr-defined]
                await asyncio.sleep(0.005)
            assert turn._waiters, "the late message never reached the store"  # type: ignore[attr-defined]
            await asyncio.sleep(0.01)
        results = pb.WritePartsResponse.FromString(await late).results
        assert [r.code for r in results] == [grpc.StatusCode.DEADLINE_EXCEEDED.value[0]] * 2
        assert "deadline passed before part 2 of 2" in results[1].message
        assert served.store.stats()["samples"] == 2
        # the same parts with time to spare are written
        ok = pb.WritePartsResponse.FromString(await client.call_raw(
            Method.WRITE_PARTS, parts_body([_part(range(2, 5), 1000), _part(range(5, 7), 1000)], 5.0), "WriteParts"))
        assert [r.response.samples_written for r in ok.results] == [3, 2]
    finally:
        await client.close()


async def test_a_connection_has_at_most_a_streams_worth_of_write_messages_under_way(served: Served) -> None:
    """Past STREAM_IN_FLIGHT write messages under way on one connection, the store reads no more of
    its frames (TCP holds the sender back), as a WriteStream's receiver does; each is answered once
    the store's writes go on."""
    assert served.servicer is not None and served.servicer._turn is not None
    client = ReadPortClient("127.0.0.1", served.port, served.security())
    try:
        await client.call_raw(Method.WRITE_PARTS, parts_body([_part(range(1), 1000)], 5.0), "WriteParts")
        conn = next(iter(served.server._conns))
        async with served.servicer._turn:  # the store busy with another write
            calls = [asyncio.ensure_future(client.call_raw(
                Method.WRITE_PARTS, parts_body([_part(range(i, i + 1), 1000)], 30.0), "WriteParts"))
                for i in range(1, STREAM_IN_FLIGHT + 5)]
            for _ in range(200):
                if len(conn.writes) >= STREAM_IN_FLIGHT:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)
            assert len(conn.writes) == STREAM_IN_FLIGHT and conn.reading_paused
        answers = await asyncio.gather(*calls)
        assert [pb.WritePartsResponse.FromString(a).results[0].response.samples_written for a in answers] == \
            [1] * (STREAM_IN_FLIGHT + 4)
        assert served.store.stats()["samples"] == STREAM_IN_FLIGHT + 5
    finally:
        await client.close()
