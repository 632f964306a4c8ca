"""Publishing decisions into a real store (metricsd/consumers/publish.py): what is written, that a
failed or hung write never costs a decision, and that the consumers never read their own series."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from consumers_data import DAY0, HOUR
from prometheus_client import CollectorRegistry

from metricsd.agent.batches import write_requests
from metricsd.agent.simulate import SimConfig, Simulator
from metricsd.clock import ManualClock
from metricsd.consumers.consumerset import start_consumers
from metricsd.consumers.publish import DecisionPublisher, Publishing, write_request
from metricsd.model import make_labels
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import Unavailable
from metricsd.rpc.wire import labels_from_pb
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store

EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "examples"
A = make_labels("metricsd_hpa_desired_replicas", {"namespace": "shop", "pod": "hpa:web"})
B = make_labels("metricsd_hpa_current_replicas", {"namespace": "shop", "pod": "hpa:web"})


def test_write_request_sends_labels_once_per_series_in_time_order_and_keeps_the_last_repeat() -> None:
    req = write_request([(20, [(A, 3.0), (B, 2.0)]), (10, [(A, 1.0)]), (20, [(A, 4.0)])])
    assert len(req.ids) == len(req.series) == 2
    by_id = {s.id: labels_from_pb(s.labels) for s in req.series}
    assert set(by_id.values()) == {A, B}
    points: dict[tuple[tuple[str, str], ...], list[tuple[int, float]]] = {}
    i = 0
    for sid, n in zip(req.ids, req.counts, strict=True):
        points[by_id[sid]] = list(zip(req.timestamps[i:i + n], req.values[i:i + n], strict=True))
        i += n
    assert points == {A: [(10, 1.0), (20, 4.0)], B: [(20, 2.0)]}


class _Failing:
    """A backend whose writes fail as a proxy without a write quorum answers."""

    def __init__(self, backend: LocalBackend) -> None:
        self.inner = backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def write(self, request: pb.WriteRequest) -> pb.WriteResponse:
        raise Unavailable("no write quorum for slot 3")


class _Hanging(_Failing):
    async def write(self, request: pb.WriteRequest) -> pb.WriteResponse:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


class _Recording(_Failing):
    """Passes every call through and keeps the matchers of every question asked."""

    def __init__(self, backend: LocalBackend) -> None:
        super().__init__(backend)
        self.questions: list[list[pb.Matcher]] = []

    async def write(self, request: pb.WriteRequest) -> pb.WriteResponse:
        return await self.inner.write(request)

    async def aggregate(self, request: pb.AggregateRequest) -> pb.AggregateResponse:
        self.questions.append(list(request.query.matchers))
        if request.HasField("denominator"):
            self.questions.append(list(request.denominator.matchers))
        return await self.inner.aggregate(request)

    async def rollups(self, request: pb.ReadRequest) -> pb.RollupsResponse:
        self.questions.append(list(request.matchers))
        return await self.inner.rollups(request)

    async def read(self, request: pb.ReadRequest) -> pb.ReadResponse:
        self.questions.append(list(request.matchers))
        return await self.inner.read(request)


async def _simulated_store(now: int) -> LocalBackend:
    """An hour of the simulated cluster `metricsd up` runs (smaller: 40 pods)."""
    backend = LocalBackend(StoreAPI(Store()))
    sim = Simulator(SimConfig(pods=40, workloads=10, nodes=5, seed=3), now - HOUR)
    while sim.next_timestamp_ms <= now:
        n = min(60, (now - sim.next_timestamp_ms) // sim.config.interval_ms + 1)
        ts, values = sim.block(int(n))
        for req in write_requests(sim, ts, values, max_samples=60_000):
            assert not (await backend.write(req)).unknown_ids
    return backend


async def test_published_decisions_are_stored_and_never_read_back_by_the_consumers() -> None:
    now = DAY0 + 12 * HOUR
    backend = await _simulated_store(now)
    recording = _Recording(backend)
    registry = CollectorRegistry()
    first = start_consumers(recording, ManualClock(now), EXAMPLES, registry=registry)  # type: ignore[arg-type]
    assert first.publisher is not None
    decided = {}
    for kind, controller in first.controllers().items():
        decided[kind] = await Publishing(controller, first.publisher).sync_once()
        assert first.publisher.counts[kind].samples > 0, kind
        assert first.publisher.counts[kind].failures == 0, kind
    assert registry.get_sample_value("metricsd_consumer_published_samples_total", {"consumer": "hpa"}) > 0
    # every question the consumers asked names a metric, and none of theirs
    assert recording.questions
    for matchers in recording.questions:
        names = [m.value for m in matchers if m.name == "__name__"]
        assert len(names) == 1 and names[0] and not names[0].startswith("metricsd_"), matchers
    # the published series are there, under the documented keys
    found = await backend.list_series(pb.ListSeriesRequest(matchers=[
        pb.Matcher(type=pb.Matcher.RE, name="__name__", value="metricsd_.+")]))
    keys = {(lab["namespace"], lab["pod"]) for lab in (dict(labels_from_pb(s.labels)) for s in found.series)}
    assert {("default", "hpa:feed-api"), ("video", "hpa:comment"), ("social", "vpa:recommend"),
            ("_cluster", "overcommit:sim"), ("_cluster", "colocation:sim")} <= keys
    # fresh consumers deciding at the same instant over the store that now holds those series
    # decide exactly as the first did on the store without them
    again = start_consumers(backend, ManualClock(now), EXAMPLES, publish=False)
    assert again.publisher is None
    for kind, controller in again.controllers().items():
        assert await controller.sync_once() == decided[kind], kind
    assert again.document("hpa")["publishing"] == {"enabled": False}


async def test_a_failed_or_hung_publish_is_counted_and_the_decision_stands() -> None:
    now = DAY0 + 12 * HOUR
    backend = await _simulated_store(now)
    for broken, error in ((_Failing(backend), "Unavailable: no write quorum for slot 3"),
                          (_Hanging(backend), "TimeoutError: ")):
        registry = CollectorRegistry()
        consumers = start_consumers(backend, ManualClock(now), EXAMPLES, publish=False)
        publisher = DecisionPublisher(broken, registry, timeout_s=0.05)  # type: ignore[arg-type]
        assert consumers.hpa is not None
        entries = await Publishing(consumers.hpa, publisher).sync_once()
        assert isinstance(entries, list) and [e["hpa"] for e in entries] == ["default/feed-api", "video/comment"]
        assert all("desiredReplicas" in e["result"] for e in entries)
        assert publisher.counts["hpa"].failures == 1
        assert publisher.counts["hpa"].last_error == error
        assert publisher.document("hpa") == {"enabled": True, "samples": 0, "failures": 1, "lastError": error}
        assert registry.get_sample_value("metricsd_consumer_publish_failures_total", {"consumer": "hpa"}) == 1.0
