"""A WriteRequest from plain series, for tests in any folder."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from metricsd.model import Labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.wire import labels_to_pb

__all__ = ["write_request"]


def write_request(series: Mapping[Labels, tuple[Sequence[int], Sequence[float]]]) -> pb.WriteRequest:
    """Each series with its samples and its labels (so a store that never saw it takes it)."""
    req = pb.WriteRequest()
    for labels, (ts, vals) in series.items():
        sid = series_id(labels)
        req.ids.append(sid)
        req.counts.append(len(ts))
        req.timestamps.extend(ts)
        req.values.extend(vals)
        req.series.add(id=sid).labels.extend(labels_to_pb(labels))
    return req
