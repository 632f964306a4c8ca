"""The gRPC servicer of a store process: the Metrics API plus the store-to-store RPCs.

CatchUp and Digest read the store's own data, whatever the backend in front of it does (a cluster
store's OwnershipBackend refuses requests for slots it does not hold; a peer catching up asks for
slots both hold, or that this store held until a map change, so these two are not filtered).
Each page and digest is built on the event loop, like every other store handler, so the engine
needs no lock; a stream yields between pages, and a digest between slices of series
(digestloop.py), letting writes in.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc

from metricsd.proto import metricsd_pb2 as pb
from metricsd.replica.catchup import pages
from metricsd.replica.coverdigest import cover_digest_async
from metricsd.replica.digestloop import store_digest_async
from metricsd.rpc.backend import MetricsBackend
from metricsd.rpc.servicer import MetricsServicer
from metricsd.store.api import StoreAPI

__all__ = ["StoreNodeServicer"]

log = logging.getLogger("metricsd.store")


class StoreNodeServicer(MetricsServicer):
    """MetricsServicer(backend) with CatchUp and Digest served from ``api.store``."""

    def __init__(self, backend: MetricsBackend, api: StoreAPI) -> None:
        super().__init__(backend, writes_in_turn=True)  # a store's writes hold its loop: one part at a time
        self.api = api
        self.pages_served = 0
        self.digests_served = 0

    async def CatchUp(self, request: pb.CatchUpRequest, context: grpc.aio.ServicerContext
                      ) -> AsyncIterator[pb.CatchUpPage]:
        try:
            stream = pages(self.api.store, request)
            while True:
                try:
                    page = next(stream)
                except StopIteration:
                    return
                self.pages_served += 1
                yield page
        except ValueError as e:
            log.info("CatchUp rejected: %s", e)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))

    async def Digest(self, request: pb.DigestRequest, context: grpc.aio.ServicerContext) -> pb.DigestResponse:
        try:
            resp = await (cover_digest_async(self.api.store, request) if request.cover_chunks
                          else store_digest_async(self.api.store, request))
        except ValueError as e:
            log.info("Digest rejected: %s", e)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            raise AssertionError("unreachable: abort raises") from e
        self.digests_served += 1
        return resp
