"""The metrics API as an async interface, whatever serves it: a local store, a remote one, a proxy.

The HTTP API, the consumers and the agents depend on this, not on where the data lives:
``LocalBackend`` calls a store in the same process (``metricsd up``), ``GrpcBackend`` talks to a
store or proxy over gRPC. Methods take and return the proto messages of proto/metricsd.proto and
raise BadRequest for malformed input (INVALID_ARGUMENT over gRPC) and Unavailable when the data
cannot be had (a store down, no quorum), so callers map errors the same way everywhere. NotOwner,
a kind of Unavailable (FAILED_PRECONDITION over gRPC), is a cluster store refusing a slot that its
shard map does not give it: the caller's map is out of date, so it refreshes and retries.
"""

from __future__ import annotations

from typing import Protocol

import grpc

from metricsd.proto import metricsd_pb2 as pb
from metricsd.proto import metricsd_pb2_grpc as pb_grpc
from metricsd.store.api import BadRequest, StoreAPI

__all__ = ["BadRequest", "GrpcBackend", "LocalBackend", "MetricsBackend", "NotOwner", "Unavailable"]


class Unavailable(RuntimeError):
    """The data cannot be had now (a store down, no quorum, a timeout); retrying may help."""


class NotOwner(Unavailable):
    """This store does not hold a slot the request names, in the shard map it has; the message
    names the slot and the map version. Refresh the map and ask the slot's current replicas."""


class MetricsBackend(Protocol):
    async def write(self, request: pb.WriteRequest) -> pb.WriteResponse: ...
    async def read(self, request: pb.ReadRequest) -> pb.ReadResponse: ...
    async def aggregate(self, request: pb.AggregateRequest) -> pb.AggregateResponse: ...
    async def rollups(self, request: pb.ReadRequest) -> pb.RollupsResponse: ...
    async def list_series(self, request: pb.ListSeriesRequest) -> pb.ListSeriesResponse: ...
    async def label_values(self, request: pb.LabelValuesRequest) -> pb.LabelValuesResponse: ...
    async def health(self) -> pb.HealthResponse: ...
    async def stats(self) -> pb.StatsResponse: ...


class LocalBackend:
    """A store in this process. Each call runs to completion on the event loop thread."""

    def __init__(self, api: StoreAPI) -> None:
        self.api = api

    async def write(self, request: pb.WriteRequest) -> pb.WriteResponse:
        return self.api.write(request)

    async def read(self, request: pb.ReadRequest) -> pb.ReadResponse:
        return self.api.read(request)

    async def aggregate(self, request: pb.AggregateRequest) -> pb.AggregateResponse:
        return self.api.aggregate(request)

    async def rollups(self, request: pb.ReadRequest) -> pb.RollupsResponse:
        return self.api.rollups(request)

    async def list_series(self, request: pb.ListSeriesRequest) -> pb.ListSeriesResponse:
        return self.api.list_series(request)

    async def label_values(self, request: pb.LabelValuesRequest) -> pb.LabelValuesResponse:
        return self.api.label_values(request)

    async def health(self) -> pb.HealthResponse:
        return self.api.health(pb.HealthRequest())

    async def stats(self) -> pb.StatsResponse:
        return self.api.stats(pb.StatsRequest())


class GrpcBackend:
    """A store or proxy over gRPC; maps status codes onto BadRequest / NotOwner / Unavailable."""

    def __init__(self, stub: pb_grpc.MetricsStub, timeout_s: float = 10.0) -> None:
        self.stub = stub
        self.timeout_s = timeout_s

    async def _call(self, method: str, request: object) -> object:
        try:
            return await getattr(self.stub, method)(request, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise BadRequest(e.details() or "invalid argument") from e
            if e.code() == grpc.StatusCode.FAILED_PRECONDITION:
                raise NotOwner(f"{method}: {e.details()}") from e
            raise Unavailable(f"{method}: {e.code().name}: {e.details()}") from e

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
