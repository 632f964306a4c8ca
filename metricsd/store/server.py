"""The gRPC shell: decode, call the backend, map errors. No logic of its own.

Every store handler runs to completion on the event loop without awaiting between reading and
writing the engine, so the engine (not thread-safe) needs no lock.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import TypeVar

import grpc

from metricsd.backend import LocalBackend, MetricsBackend, NotOwner, Unavailable
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proto import metricsd_pb2_grpc as pb_grpc
from metricsd.store.api import BadRequest, StoreAPI
from metricsd.store.engine import Store

__all__ = ["GRPC_OPTIONS", "MetricsServicer", "StoreServicer", "start_grpc_server"]

T = TypeVar("T")

log = logging.getLogger("metricsd.store")

# Large batches and aggregate replies (per-series partials of big workloads) exceed gRPC's 4 MiB default.
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]

class MetricsServicer(pb_grpc.MetricsServicer):
    """Serves a MetricsBackend over gRPC: BadRequest becomes INVALID_ARGUMENT, Unavailable UNAVAILABLE,
    NotOwner (a cluster store asked for a slot it does not hold) FAILED_PRECONDITION.

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


def StoreServicer(store: Store, member: str = "store") -> MetricsServicer:
    """The gRPC servicer of a store in this process."""
    return MetricsServicer(LocalBackend(StoreAPI(store, member)))


async def start_grpc_server(servicer: pb_grpc.MetricsServicer, host: str, port: int) -> tuple[grpc.aio.Server, int]:
    """Start serving; returns the server and the bound port (useful with port 0)."""
    server = grpc.aio.server(options=GRPC_OPTIONS)
    pb_grpc.add_MetricsServicer_to_server(servicer, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot listen on {host}:{port} (in use?)")
    await server.start()
    return server, bound


async def gc_loop(store: Store, every_s: float = 60.0) -> None:
    """Retention in the background; logs what it dropped and how long it took."""
    while True:
        await asyncio.sleep(every_s)
        t0 = time.perf_counter()
        removed = store.gc()
        log.info("retention pass: %d series removed in %.1f ms", removed, (time.perf_counter() - t0) * 1000)
