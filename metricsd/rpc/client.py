"""Clients of the metricsd gRPC API (a store or a proxy alike).

``GrpcBackend`` is the MetricsBackend over a stub, mapping status codes back onto the interface's
errors. ``MetricsClient`` owns the series-id handshake of Write: labels go with a series the first time, then only
its id; when a receiver reports ids it does not know (a restart, another proxy), the batch is
resent with their labels.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

import grpc

from metricsd.proto import metricsd_pb2 as pb
from metricsd.proto import metricsd_pb2_grpc as pb_grpc
from metricsd.rpc.backend import BadRequest, LimitExceeded, Unavailable
from metricsd.rpc.channel import open_channel
from metricsd.rpc.status import error_of, part_error
from metricsd.rpc.stream import StreamUnsupported, WriteStreamClient
from metricsd.rpc.wire import length_delimited, varint
from metricsd.security.settings import ClientSecurity

__all__ = ["GrpcBackend", "MetricsClient", "StreamingBackend", "error_of", "part_error", "parts_body", "parts_results",
           "write_each"]


class MetricsClient:
    def __init__(self, address: str, timeout_s: float = 10.0, security: ClientSecurity | None = None) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.channel = open_channel(address, security)
        self.stub = pb_grpc.MetricsStub(self.channel)

    async def close(self) -> None:
        await self.channel.close(None)

    async def __aenter__(self) -> MetricsClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def write(self, req: pb.WriteRequest, labels_of: Mapping[int, Sequence[pb.Label]] | None = None
                    ) -> pb.WriteResponse:
        """Write a batch; if the receiver reports unknown ids and ``labels_of`` has them, resend once."""
        resp: pb.WriteResponse = await self.stub.Write(req, timeout=self.timeout_s)
        if resp.unknown_ids and labels_of is not None:
            retry = pb.WriteRequest()
            retry.CopyFrom(req)
            for sid in resp.unknown_ids:
                if sid in labels_of:
                    retry.series.add(id=sid).labels.extend(labels_of[sid])
            resp = await self.stub.Write(retry, timeout=self.timeout_s)
        return resp

    async def aggregate(self, req: pb.AggregateRequest) -> pb.AggregateResponse:
        resp: pb.AggregateResponse = await self.stub.Aggregate(req, timeout=self.timeout_s)
        return resp

    async def read(self, req: pb.ReadRequest) -> pb.ReadResponse:
        resp: pb.ReadResponse = await self.stub.Read(req, timeout=self.timeout_s)
        return resp

    async def stats(self) -> pb.StatsResponse:
        resp: pb.StatsResponse = await self.stub.Stats(pb.StatsRequest(), timeout=self.timeout_s)
        return resp

    async def health(self) -> pb.HealthResponse:
        resp: pb.HealthResponse = await self.stub.Health(pb.HealthRequest(), timeout=self.timeout_s)
        return resp


P = TypeVar("P")


async def write_each(write: Callable[[P], Awaitable[pb.WriteResponse]], parts: Sequence[P]
                     ) -> list[pb.WriteResponse | Exception]:
    """WriteParts' results from a ``write`` per part, in order: a receiver without WriteParts."""
    out: list[pb.WriteResponse | Exception] = []
    for part in parts:
        try:
            out.append(await write(part))
        except (BadRequest, LimitExceeded, Unavailable) as e:
            out.append(e)
    return out


class GrpcBackend:
    """A store or proxy over gRPC; maps status codes onto BadRequest / NotOwner / LimitExceeded /
    Unavailable. RESOURCE_EXHAUSTED is also gRPC's own answer to a message over the size limit:
    neither is helped by a retry, so both are LimitExceeded."""

    def __init__(self, stub: pb_grpc.MetricsStub, timeout_s: float = 10.0) -> None:
        self.stub = stub
        self.timeout_s = timeout_s

    async def _call(self, method: str, request: object) -> object:
        try:
            return await getattr(self.stub, method)(request, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as e:
            raise error_of(method, e.code(), e.details() or "") from e

    async def write(self, request: pb.WriteRequest) -> pb.WriteResponse:
        return await self._call("Write", request)  # type: ignore[return-value]

    async def read(self, request: pb.ReadRequest) -> pb.ReadResponse:
        return await self._call("Read", request)  # type: ignore[return-value]

    async def aggregate(self, request: pb.AggregateRequest) -> pb.AggregateResponse:
        return await self._call("Aggregate", request)  # type: ignore[return-value]

    async def rollups(self, request: pb.ReadRequest) -> pb.RollupsResponse:
        return await self._call("Rollups", request)  # type: ignore[return-value]

    async def list_series(self, request: pb.ListSeriesRequest) -> pb.ListSeriesResponse:
        return await self._call("ListSeries", request)  # type: ignore[return-value]

    async def label_values(self, request: pb.LabelValuesRequest) -> pb.LabelValuesResponse:
        return await self._call("LabelValues", request)  # type: ignore[return-value]

    async def digest(self, request: pb.DigestRequest) -> pb.DigestResponse:
        """A store's Digest (store to store, and a proxy's read of a closed hour: proxy/hourread.py)."""
        return await self._call("Digest", request)  # type: ignore[return-value]

    async def health(self) -> pb.HealthResponse:
        return await self._call("Health", pb.HealthRequest())  # type: ignore[return-value]

    async def stats(self) -> pb.StatsResponse:
        return await self._call("Stats", pb.StatsRequest())  # type: ignore[return-value]


class StreamingBackend(GrpcBackend):
    """GrpcBackend on a channel of its own whose writes travel over one WriteStream (rpc/stream.py):
    a message on an open stream costs both ends a third of what a unary Write does. Writes also take
    serialized WriteRequests, so that a proxy encodes a batch once for every store that gets the
    same part. A receiver older than WriteStream (UNIMPLEMENTED) gets WriteParts calls from then on,
    and one older than that a Write per part."""

    def __init__(self, channel: grpc.aio.Channel, timeout_s: float = 10.0) -> None:
        super().__init__(pb_grpc.MetricsStub(channel), timeout_s)
        self.channel = channel
        self.stream = WriteStreamClient(channel, timeout_s)
        self._write_bytes = channel.unary_unary("/metricsd.v1.Metrics/Write", request_serializer=None,
                                                response_deserializer=pb.WriteResponse.FromString)
        self._write_parts_bytes = channel.unary_unary("/metricsd.v1.Metrics/WriteParts", request_serializer=None,
                                                      response_deserializer=pb.WritePartsResponse.FromString)
        self.parts_supported = True  # until the receiver answers WriteParts with UNIMPLEMENTED

    async def write(self, request: pb.WriteRequest) -> pb.WriteResponse:
        result = (await self.write_parts([request.SerializeToString()]))[0]
        if isinstance(result, Exception):
            raise result
        return result

    async def write_bytes(self, part: bytes) -> pb.WriteResponse:
        """A unary Write of a serialized WriteRequest; raises as ``write`` does."""
        try:
            resp: pb.WriteResponse = await self._write_bytes(part, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as e:
            raise error_of("Write", e.code(), e.details() or "") from e
        return resp

    async def write_parts(self, parts: Sequence[bytes]) -> list[pb.WriteResponse | Exception]:
        """Serialized WriteRequests as one message: per part its response, or the error a Write of it
        alone would have raised. Raises, for every part, what ``write`` raises for the call."""
        body = parts_body(parts, self.timeout_s)
        if self.stream.supported:
            try:
                return parts_results(await self.stream.send(body), len(parts))
            except StreamUnsupported:
                pass
        if self.parts_supported:
            try:
                resp: pb.WritePartsResponse = await self._write_parts_bytes(body, timeout=self.timeout_s)
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise error_of("WriteParts", e.code(), e.details() or "") from e
                self.parts_supported = False
            else:
                return parts_results(resp, len(parts))
        return await write_each(self.write_bytes, parts)

    async def close(self) -> None:
        await self.stream.close()
        await self.channel.close(None)


def parts_body(parts: Sequence[bytes], timeout_s: float) -> bytes:
    """A serialized WritePartsRequest of serialized WriteRequests, with the sender's ``timeout_s``
    (timeout_ms, field 2: the receiver writes no part once it has passed, the sender having given up
    on the message and handed it off)."""
    body = b"".join(length_delimited(1, p) for p in parts)
    timeout_ms = min(int(timeout_s * 1000), 2**32 - 1)
    return body + b"\x10" + varint(timeout_ms) if timeout_ms > 0 else body


def parts_results(resp: pb.WritePartsResponse, n_parts: int) -> list[pb.WriteResponse | Exception]:
    """Per part its response, or the error a Write of it alone would have raised. Raises
    Unavailable when the answer does not have a result per part."""
    if len(resp.results) != n_parts:
        raise Unavailable(f"WriteParts: {len(resp.results)} results for {n_parts} parts")
    return [part_error(r) or r.response for r in resp.results]
