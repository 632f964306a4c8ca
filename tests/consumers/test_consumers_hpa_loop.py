"""The HPA controller loop against a real Store behind LocalBackend, on a ManualClock."""

from __future__ import annotations

import json
from typing import Any

from consumers_data import DAY0, HOUR, MIN, local_store, pod_labels, write

from metricsd.clock import ManualClock
from metricsd.consumers.actuators.base import InMemoryScale, LogActuator, WorkloadRef
from metricsd.consumers.hpa.controller import HPAController
from metricsd.consumers.hpa.parse import parse_hpa
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import Unavailable
from metricsd.store.api import StoreAPI

REF = WorkloadRef("shop", "Deployment", "web")


def spec(**extra: Any) -> Any:
    body: dict[str, Any] = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
        "minReplicas": 1, "maxReplicas": 20,
        "metrics": [{"type": "Resource",
                     "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}}],
    }
    body.update(extra)
    return parse_hpa({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                      "metadata": {"name": "web", "namespace": "shop"}, "spec": body})


def feed(api: StoreAPI, pods: int, cores: float, start: int, end: int, request: float = 1.0) -> None:
    """`pods` pods of shop/web, each using `cores` of CPU from start to end, sampled every 10 s."""
    ts = list(range(start, end + 1, 10_000))
    for i in range(pods):
        labels = pod_labels("shop", "web", f"web-{i}")
        write(api, "container_cpu_usage_seconds_total", labels, ts, [cores * (t - start) / 1000 for t in ts])
        write(api, "kube_pod_container_resource_requests", {**labels, "resource": "cpu", "unit": "core"}, ts,
              [request] * len(ts))


async def test_a_hot_workload_is_scaled_up_and_the_decision_is_recorded() -> None:
    api, backend = local_store()
    now = DAY0 + 10 * MIN
    feed(api, 4, 1.0, DAY0, now)  # 100% of a 1-core request against a 50% target
    cluster = InMemoryScale({REF: 4})
    ctl = HPAController([spec()], backend, cluster, ManualClock(now))
    entry = (await ctl.sync_once())[0]
    assert entry["rule"] == "DesiredWithinRange"
    assert entry["inputs"]["currentReplicas"] == 4
    assert entry["inputs"]["metrics"][0]["current"] == 100
    assert entry["result"]["desiredReplicas"] == 8
    assert entry["result"]["action"] == "scaled"
    assert cluster.replicas[REF] == 8
    doc = json.loads(json.dumps({"status": ctl.status(), "history": ctl.history()}, allow_nan=False))
    assert doc["status"]["targets"][0]["desiredReplicas"] == 8
    assert doc["status"]["targets"][0]["scales"] == 1
    assert len(doc["history"]) == 1


async def test_the_log_backend_is_a_dry_run_that_counts_the_reporting_pods() -> None:
    api, backend = local_store()
    now = DAY0 + 10 * MIN
    feed(api, 3, 0.2, DAY0, now)  # 20% against 50%: 3 * 0.4 -> 2
    ctl = HPAController([spec()], backend, LogActuator(), ManualClock(now))
    entry = (await ctl.sync_once())[0]
    assert entry["inputs"]["currentReplicas"] == 3
    # The 300 s stabilisation window holds only this first recommendation, so nothing holds it up.
    assert entry["result"]["desiredReplicas"] == 2
    assert entry["result"]["action"] == "dry-run"
    assert ctl.status()["targets"][0]["scales"] == 0


class NoAggregates:
    """A backend whose live queries fail (no quorum) while the hourly rollups still answer."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def aggregate(self, request: pb.AggregateRequest) -> pb.AggregateResponse:
        raise Unavailable("no quorum for slot 3")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_without_live_data_the_same_hour_yesterday_decides_and_says_so() -> None:
    api, backend = local_store()
    feed(api, 4, 1.5, DAY0 + HOUR, DAY0 + 2 * HOUR)  # yesterday 01:00-02:00: 150% on 4 pods
    cluster = InMemoryScale({REF: 4})
    hpa = spec(metricsd={"historyFallback": {"enabled": True}})
    ctl = HPAController([hpa], NoAggregates(backend), cluster, ManualClock(DAY0 + 25 * HOUR + 10 * MIN))
    entry = (await ctl.sync_once())[0]
    metric = entry["inputs"]["metrics"][0]
    assert metric["source"] == "history"
    assert metric["current"] == 150.0
    assert metric["replicas"] == 12  # 150 / 50 * 4 pods
    assert entry["result"]["usedHistory"] is True
    assert entry["result"]["desiredReplicas"] == 8  # the scale-up policy: at most double per 15 s
    assert any("listing pods" in e for e in entry["result"]["errors"])


async def test_without_live_data_or_history_the_replicas_are_kept() -> None:
    _, backend = local_store()
    ctl = HPAController([spec()], NoAggregates(backend), InMemoryScale({REF: 5}), ManualClock(DAY0))
    entry = (await ctl.sync_once())[0]
    assert entry["rule"] == "InvalidMetrics"
    assert entry["result"]["desiredReplicas"] == 5


async def test_an_alert_is_raised_once_when_the_target_sits_at_max_above_target() -> None:
    api, backend = local_store()
    now = DAY0 + 10 * MIN
    feed(api, 4, 1.0, DAY0, now + 2 * MIN)
    cluster = InMemoryScale({REF: 4})
    clock = ManualClock(now)
    ctl = HPAController([spec(maxReplicas=4, metricsd={"alertAtMaxForSeconds": 30})], backend, cluster, clock)
    raised = []
    for _ in range(5):
        entry = (await ctl.sync_once())[0]
        raised.append(entry["result"].get("alertRaised", False))
        clock.advance(15_000)
    assert raised == [False, False, True, False, False]
    assert [k for k, _ in cluster.published] == ["hpa.alert"]
    assert ctl.status()["targets"][0]["alertsTotal"] == 1
    assert ctl.status()["targets"][0]["alerting"] is True


async def test_a_target_without_pods_or_scale_is_reported_not_guessed() -> None:
    _, backend = local_store()
    ctl = HPAController([spec()], backend, LogActuator(), ManualClock(DAY0))
    entry = (await ctl.sync_once())[0]
    assert entry["rule"] == "NoPods"
    assert "Deployment/shop/web" in entry["message"]
