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
from metricsd.rpc.backend import BadRequest, LimitExceeded, NotOwner, Unavailable
from metricsd.rpc.channel import open_channel
from metricsd.security.settings import ClientSecurity

__all__ = ["GrpcBackend", "MetricsClient", "error_of", "part_error", "write_each"]


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
_CODES = {c.value[0]: c for c in grpc.StatusCode}


def part_error(result: pb.WritePartResult) -> Exception | None:
    """The error a WriteParts result stands for (None: the part was written)."""
    if result.code == 0:
        return None
    return error_of("Write", _CODES.get(result.code, grpc.StatusCode.UNKNOWN), result.message)


def error_of(method: str, code: grpc.StatusCode, details: str) -> Exception:
    """The MetricsBackend error a status code stands for."""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return BadRequest(details or "invalid argument")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return LimitExceeded(details or "resource exhausted")
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return NotOwner(f"{method}: {details}")
    return Unavailable(f"{method}: {code.name}: {details}")


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

    async def health(self) -> pb.HealthResponse:
        return await self._call("Health", pb.HealthRequest())  # type: ignore[return-value]

    async def stats(self) -> pb.StatsResponse:
        return await self._call("Stats", pb.StatsRequest())  # type: ignore[return-value]
