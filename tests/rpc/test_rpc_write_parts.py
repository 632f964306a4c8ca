"""rpc WriteParts on a real store over loopback gRPC: each part as a Write of its own; a store
without WriteParts (an older metricsd, UNIMPLEMENTED) gets a Write per part. The proxy's end is
in tests/proxy/test_proxy_write_parts.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from metricsd.model import make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proto import metricsd_pb2_grpc as pb_grpc
from metricsd.proxy.members import MemberClient
from metricsd.rpc.backend import BadRequest
from metricsd.rpc.server import start_grpc_server
from metricsd.rpc.servicer import MAX_WRITE_PARTS, MetricsServicer
from metricsd.rpc.wire import labels_to_pb
from metricsd.store.api import StoreServicer
from metricsd.store.engine import Store

T0 = 1_700_000_000_000


def labelled(pod: str, ts: list[int], value: float = 1.0) -> pb.WriteRequest:
    lab = make_labels("container_cpu_usage_seconds_total", {"namespace": "ns", "pod": pod})
    sid = series_id(lab)
    req = pb.WriteRequest(ids=[sid], counts=[len(ts)], timestamps=ts, values=[value] * len(ts))
    req.series.add(id=sid).labels.extend(labels_to_pb(lab))
    return req


@pytest.fixture
async def store() -> AsyncIterator[tuple[Store, pb_grpc.MetricsStub, MemberClient]]:
    s = Store()
    server, port = await start_grpc_server(StoreServicer(s), "127.0.0.1", 0)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    yield s, pb_grpc.MetricsStub(channel), MemberClient(channel, 10.0)
    await channel.close(None)
    await server.stop(None)


async def test_each_part_is_applied_or_refused_on_its_own(store: tuple[Store, pb_grpc.MetricsStub, MemberClient]
                                                          ) -> None:
    s, stub, _ = store
    good = labelled("a", [T0, T0 + 10_000])
    bad = labelled("b", [T0 + 10_000, T0])  # timestamps not increasing
    unknown = pb.WriteRequest(ids=[12345], counts=[1], timestamps=[T0], values=[1.0])  # no labels
    also_good = labelled("c", [T0])
    resp = await stub.WriteParts(pb.WritePartsRequest(parts=[good, bad, unknown, also_good]))
    codes = [r.code for r in resp.results]
    assert codes == [0, grpc.StatusCode.INVALID_ARGUMENT.value[0], 0, 0]
    assert resp.results[0].response.samples_written == 2
    assert "must strictly increase" in resp.results[1].message
    assert list(resp.results[2].response.unknown_ids) == [12345]
    assert resp.results[3].response.samples_written == 1
    assert s.index.n_alive == 2  # a and c; nothing of b
    assert s.index.row_of(bad.ids[0]) is None


async def test_too_many_parts_is_refused_whole(store: tuple[Store, pb_grpc.MetricsStub, MemberClient]) -> None:
    s, stub, _ = store
    parts = [labelled(f"p{i}", [T0]) for i in range(MAX_WRITE_PARTS + 1)]
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.WriteParts(pb.WritePartsRequest(parts=parts))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"at most {MAX_WRITE_PARTS}" in (e.value.details() or "")
    assert s.index.n_alive == 0


async def test_the_proxy_client_maps_each_part_to_a_response_or_the_error_write_would_raise(
        store: tuple[Store, pb_grpc.MetricsStub, MemberClient]) -> None:
    s, _, member = store
    a, b = labelled("a", [T0]), labelled("b", [T0, T0])
    got = await member.write_parts([a.SerializeToString(), b.SerializeToString()])
    assert isinstance(got[0], pb.WriteResponse) and got[0].samples_written == 1
    assert isinstance(got[1], BadRequest) and "must strictly increase" in str(got[1])
    assert member.stream.supported and member.stream.opened == 1
    # labels appended as wire bytes merge into the part: an id-only part plus its labels
    c = labelled("c", [T0])
    labels = pb.WriteRequest(series=c.series).SerializeToString()
    c.ClearField("series")
    resp = await member.write_bytes(c.SerializeToString() + labels)
    assert resp.samples_written == 1 and not resp.unknown_ids
    assert s.index.n_alive == 2


class OldStore(MetricsServicer):
    """A store of a metricsd release before WriteStream: the generated base answers UNIMPLEMENTED."""

    WriteStream = pb_grpc.MetricsServicer.WriteStream


class OlderStore(OldStore):
    """A store of a metricsd release before WriteParts too."""

    WriteParts = pb_grpc.MetricsServicer.WriteParts


async def test_a_store_without_write_stream_gets_write_parts_calls() -> None:
    s = Store()
    server, port = await start_grpc_server(OldStore(StoreServicer(s).backend), "127.0.0.1", 0)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        member = MemberClient(channel, 10.0)
        parts = [labelled(p, ts).SerializeToString() for p, ts in (("a", [T0]), ("b", [T0, T0]), ("c", [T0]))]
        got = await member.write_parts(parts)
        assert not member.stream.supported and member.parts_supported
        assert [type(g) for g in got] == [pb.WriteResponse, BadRequest, pb.WriteResponse]
        resp = await member.write(labelled("d", [T0]))  # one part, the same way
        assert resp.samples_written == 1 and s.index.n_alive == 3
    finally:
        await channel.close(None)
        await server.stop(None)


async def test_a_store_without_write_parts_gets_a_write_per_part() -> None:
    s = Store()
    servicer = StoreServicer(s)
    server, port = await start_grpc_server(OlderStore(servicer.backend), "127.0.0.1", 0)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        member = MemberClient(channel, 10.0)
        parts = [labelled(p, ts).SerializeToString() for p, ts in (("a", [T0]), ("b", [T0, T0]), ("c", [T0]))]
        got = await member.write_parts(parts)
        assert not member.stream.supported and not member.parts_supported
        assert [type(g) for g in got] == [pb.WriteResponse, BadRequest, pb.WriteResponse]
        assert s.index.n_alive == 2
        parts = [labelled(p, [T0]).SerializeToString() for p in ("d", "e")]
        got = await member.write_parts(parts)  # straight to Write now
        assert all(isinstance(g, pb.WriteResponse) for g in got) and s.index.n_alive == 4
    finally:
        await channel.close(None)
        await server.stop(None)
