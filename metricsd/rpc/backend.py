"""The metrics API as an async interface, whatever serves it: a local store, a remote one, a proxy.

The HTTP API, the consumers and the agents depend on this, not on where the data lives:
``metricsd.store.api.LocalBackend`` calls a store in the same process (``metricsd up``),
``metricsd.rpc.client.GrpcBackend`` talks to a store or proxy over gRPC, and the proxy's fan-out
backend implements it over many stores. This module is the contract alone: it imports nothing of
metricsd but the generated messages. Methods take and return the proto messages of proto/metricsd.proto and
raise BadRequest for malformed input (INVALID_ARGUMENT over gRPC) and Unavailable when the data
cannot be had (a store down, no quorum), so callers map errors the same way everywhere. NotOwner,
a kind of Unavailable (FAILED_PRECONDITION over gRPC), is a cluster store refusing a slot that its
shard map does not give it: the caller's map is out of date, so it refreshes and retries.
"""

from __future__ import annotations

from typing import Protocol

from metricsd.proto import metricsd_pb2 as pb

__all__ = ["BadRequest", "LimitExceeded", "MetricsBackend", "NotOwner", "Unavailable"]


class BadRequest(ValueError):
    """The request is malformed; the message says what and names the series when there is one.
    Nothing was stored when it is raised."""


class LimitExceeded(RuntimeError):
    """A store's capacity limit refused the write (its total series, or a namespace's new series
    per minute): the request is well formed, but storing it would create series the store will not
    hold now. RESOURCE_EXHAUSTED over gRPC, 429 over HTTP. The message names the limit, its value
    and a series; nothing was stored. Samples of series the store already holds are still accepted,
    so a sender that splits new series from known ones loses only the new ones."""


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
