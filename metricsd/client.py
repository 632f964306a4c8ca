"""A small async client for the metricsd gRPC API (a store or a proxy alike).

It owns the series-id handshake of Write: labels go with a series the first time, then only
its id; when a receiver reports ids it does not know (a restart, another proxy), the batch is
resent with their labels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import grpc

from metricsd.proto import metricsd_pb2 as pb
from metricsd.proto import metricsd_pb2_grpc as pb_grpc
from metricsd.store.server import GRPC_OPTIONS

__all__ = ["MetricsClient"]


class MetricsClient:
    def __init__(self, address: str, timeout_s: float = 10.0) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.channel = grpc.aio.insecure_channel(address, options=GRPC_OPTIONS)
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
