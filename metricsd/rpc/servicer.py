"""The gRPC shell: decode, call the backend, map errors. No logic of its own.

Every store handler runs to completion on the event loop without awaiting between reading and
writing the engine, so the engine (not thread-safe) needs no lock.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import TypeVar

import grpc

from metricsd.proto import metricsd_pb2 as pb
from metricsd.proto import metricsd_pb2_grpc as pb_grpc
from metricsd.rpc.backend import BadRequest, LimitExceeded, MetricsBackend, NotOwner, Unavailable

__all__ = ["MetricsServicer"]

T = TypeVar("T")

log = logging.getLogger("metricsd.rpc")


class MetricsServicer(pb_grpc.MetricsServicer):
    """Serves a MetricsBackend over gRPC: BadRequest becomes INVALID_ARGUMENT, Unavailable UNAVAILABLE,
    NotOwner (a cluster store asked for a slot it does not hold) FAILED_PRECONDITION, LimitExceeded
    (a store's series limits) RESOURCE_EXHAUSTED.

    A store serves its LocalBackend through it; a proxy serves its fan-out backend the same way,
    so clients cannot tell them apart.
    """

    def __init__(self, backend: MetricsBackend) -> None:
        self.backend = backend

    async def _run(self, context: grpc.aio.ServicerContext, method: str, call: Awaitable[T]) -> T:
        try:
            return await call
        except BadRequest as e:
            log.info("%s rejected: %s", method, e)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except LimitExceeded as e:
            log.info("%s refused: %s", method, e)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        except NotOwner as e:
            log.info("%s refused: %s", method, e)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except Unavailable as e:
            log.warning("%s unavailable: %s", method, e)
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        raise AssertionError("unreachable: abort raises")

    async def Write(self, request: pb.WriteRequest, context: grpc.aio.ServicerContext) -> pb.WriteResponse:
        return await self._run(context, "Write", self.backend.write(request))

    async def Read(self, request: pb.ReadRequest, context: grpc.aio.ServicerContext) -> pb.ReadResponse:
        return await self._run(context, "Read", self.backend.read(request))

    async def Aggregate(self, request: pb.AggregateRequest, context: grpc.aio.ServicerContext) -> pb.AggregateResponse:
        return await self._run(context, "Aggregate", self.backend.aggregate(request))

    async def Rollups(self, request: pb.ReadRequest, context: grpc.aio.ServicerContext) -> pb.RollupsResponse:
        return await self._run(context, "Rollups", self.backend.rollups(request))

    async def ListSeries(self, request: pb.ListSeriesRequest, context: grpc.aio.ServicerContext
                         ) -> pb.ListSeriesResponse:
        return await self._run(context, "ListSeries", self.backend.list_series(request))

    async def LabelValues(self, request: pb.LabelValuesRequest, context: grpc.aio.ServicerContext
                          ) -> pb.LabelValuesResponse:
        return await self._run(context, "LabelValues", self.backend.label_values(request))

    async def Health(self, request: pb.HealthRequest, context: grpc.aio.ServicerContext) -> pb.HealthResponse:
        return await self._run(context, "Health", self.backend.health())

    async def Stats(self, request: pb.StatsRequest, context: grpc.aio.ServicerContext) -> pb.StatsResponse:
        return await self._run(context, "Stats", self.backend.stats())
