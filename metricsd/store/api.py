"""The store's API in proto messages, without gRPC: what the servicer and in-process callers share.

``metricsd up`` serves HTTP from the same process as its store; it calls this directly instead of
going through a loopback socket. Bad input raises BadRequest, which the gRPC shell turns into
INVALID_ARGUMENT and the HTTP shell into 400; nothing is stored when it is raised.
"""

from __future__ import annotations

import numpy as np

from metricsd import __version__
from metricsd.model import InvalidSeries
from metricsd.proto import metricsd_pb2 as pb
from metricsd.selector import InvalidSelector
from metricsd.store.engine import Store
from metricsd.store.query import InvalidAggregate, run_aggregate
from metricsd.wire import (
    aggregate_result_to_pb,
    aggregate_spec_from_pb,
    labels_from_pb,
    labels_to_pb,
    matchers_from_pb,
    slot_filter_from_pb,
)

__all__ = ["BadRequest", "StoreAPI"]


class BadRequest(ValueError):
    """The request is malformed; the message says what and names the series when there is one."""


_BAD_INPUT = (InvalidSeries, InvalidSelector, InvalidAggregate)


class StoreAPI:
    """Not safe for concurrent use: call from one thread (the event loop's)."""

    def __init__(self, store: Store, member: str = "store") -> None:
        self.store = store
        self.member = member
        self.status = pb.HealthResponse.SERVING

    def write(self, request: pb.WriteRequest) -> pb.WriteResponse:
        try:
            new = {s.id: labels_from_pb(s.labels) for s in request.series}
            res = self.store.write(
                np.array(request.ids, dtype=np.uint64),
                np.array(request.counts, dtype=np.int64),
                np.array(request.timestamps, dtype=np.int64),
                np.array(request.values, dtype=np.float64),
                new,
            )
        except _BAD_INPUT as e:
            raise BadRequest(str(e)) from e
        return pb.WriteResponse(
            samples_written=res.written, unknown_ids=res.unknown_ids, rejected_too_old=res.too_old,
            rejected_duplicate=res.duplicate,
        )

    def read(self, request: pb.ReadRequest) -> pb.ReadResponse:
        try:
            series = self.store.read(matchers_from_pb(request.matchers), request.start_ms, request.end_ms,
                                     slot_filter_from_pb(request.slots))
        except _BAD_INPUT as e:
            raise BadRequest(str(e)) from e
        resp = pb.ReadResponse()
        for s in series:
            out = resp.series.add(id=s.id)
            out.labels.extend(labels_to_pb(s.labels))
            out.timestamps.extend(s.timestamps.tolist())
            out.values.extend(s.values.tolist())
        return resp

    def aggregate(self, request: pb.AggregateRequest) -> pb.AggregateResponse:
        try:
            spec = aggregate_spec_from_pb(request)
            res = run_aggregate(self.store, spec)
        except _BAD_INPUT as e:
            raise BadRequest(str(e)) from e
        return aggregate_result_to_pb(res, spec)

    def rollups(self, request: pb.ReadRequest) -> pb.RollupsResponse:
        try:
            found = self.store.rollup_points(matchers_from_pb(request.matchers), request.start_ms, request.end_ms,
                                             slot_filter_from_pb(request.slots))
        except _BAD_INPUT as e:
            raise BadRequest(str(e)) from e
        resp = pb.RollupsResponse()
        for sid, labels, p in found:
            out = resp.series.add(id=sid)
            out.labels.extend(labels_to_pb(labels))
            out.hours.extend(p.hour.tolist())
            out.min.extend(p.min.tolist())
            out.max.extend(p.max.tolist())
            out.sum.extend(p.sum.tolist())
            out.count.extend(p.count.tolist())
            out.last.extend(p.last.tolist())
        return resp

    def list_series(self, request: pb.ListSeriesRequest) -> pb.ListSeriesResponse:
        try:
            rows = self.store.select(matchers_from_pb(request.matchers), slot_filter_from_pb(request.slots))
        except _BAD_INPUT as e:
            raise BadRequest(str(e)) from e
        if request.limit:
            rows = rows[: request.limit]
        resp = pb.ListSeriesResponse()
        for row in rows.tolist():
            labels = self.store.index.labels[row]
            assert labels is not None
            resp.series.add(id=self.store.index.ids[row]).labels.extend(labels_to_pb(labels))
        return resp

    def label_values(self, request: pb.LabelValuesRequest) -> pb.LabelValuesResponse:
        if not request.name:
            raise BadRequest("label name is empty")
        try:
            slots = slot_filter_from_pb(request.slots)
            rows = (self.store.select(matchers_from_pb(request.matchers), slots)
                    if request.matchers or slots is not None else None)
        except _BAD_INPUT as e:
            raise BadRequest(str(e)) from e
        return pb.LabelValuesResponse(values=self.store.index.label_values(request.name, rows))

    def health(self, request: pb.HealthRequest) -> pb.HealthResponse:
        return pb.HealthResponse(status=self.status, member=self.member, version=__version__)

    def stats(self, request: pb.StatsRequest) -> pb.StatsResponse:
        st = self.store.stats()
        return pb.StatsResponse(
            series=int(st["series"]), samples=int(st["samples"]), chunk_bytes=int(st["chunk_bytes"]),
            chunk_samples=int(st["chunk_samples"]), bytes_per_sample=float(st["bytes_per_sample"]),
            head_samples=int(st["head_samples"]), pods=int(st["pods"]), rejected=dict(self.store.rejected),
            rollup_buckets=int(st["rollup_buckets"]),
        )
