"""Helpers for the consumer loop tests: a real Store behind LocalBackend, and series written into it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from metricsd.model import make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.wire import labels_to_pb
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store

MIN = 60_000
HOUR = 3_600_000
# 2024-01-02 00:00 UTC, a Tuesday.
DAY0 = 1_704_153_600_000


def local_store() -> tuple[StoreAPI, LocalBackend]:
    api = StoreAPI(Store())
    return api, LocalBackend(api)


def write(api: StoreAPI, name: str, labels: Mapping[str, str], ts: Sequence[int], values: Sequence[float]) -> None:
    """Write one series' samples (labels included every time: the store accepts known labels again)."""
    lab = make_labels(name, labels)
    sid = series_id(lab)
    req = pb.WriteRequest(ids=[sid], counts=[len(ts)], timestamps=list(ts), values=list(values))
    req.series.add(id=sid).labels.extend(labels_to_pb(lab))
    resp = api.write(req)
    assert not resp.unknown_ids


def pod_labels(ns: str, workload: str, pod: str, container: str = "app", **extra: str) -> dict[str, str]:
    return {"namespace": ns, "workload": workload, "pod": pod, "container": container, "node": "n1", **extra}
