"""The VPA recommender loop against a real Store behind LocalBackend: feeding, acting, checkpoints."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from consumers_data import DAY0, HOUR, MIN, local_store, pod_labels, write

from metricsd.clock import ManualClock
from metricsd.cluster.etcd_kv import EtcdKV, EtcdSettings
from metricsd.cluster.etcd_server import EtcdServer
from metricsd.consumers.actuators.base import InMemoryScale, WorkloadRef
from metricsd.consumers.quantity import parse_quantity
from metricsd.consumers.vpa.checkpoint import CheckpointStore, EtcdCheckpointStore, FileCheckpointStore
from metricsd.consumers.vpa.controller import VPAController
from metricsd.consumers.vpa.spec import parse_vpa
from metricsd.store.api import StoreAPI

MI = 2**20
REF = WorkloadRef("shop", "Deployment", "web")


def spec(mode: str = "Auto") -> Any:
    return parse_vpa({"apiVersion": "autoscaling.k8s.io/v1", "kind": "VerticalPodAutoscaler",
                      "metadata": {"name": "web", "namespace": "shop"},
                      "spec": {"targetRef": {"kind": "Deployment", "name": "web"},
                               "updatePolicy": {"updateMode": mode}}})


def feed(api: StoreAPI, start: int, end: int, cpu_request: float, oom_pod: int | None = None) -> None:
    """Two pods of shop/web: 0.5 core and a 300 MiB working set each; requests 512 MiB and
    `cpu_request`; limits twice the requests. `oom_pod` is OOM-killed halfway."""
    ts = list(range(start, end + 1, 10_000))
    for i in range(2):
        labels = pod_labels("shop", "web", f"web-{i}")
        write(api, "container_cpu_usage_seconds_total", labels, ts, [0.5 * (t - start) / 1000 for t in ts])
        write(api, "container_memory_working_set_bytes", labels, ts, [300.0 * MI] * len(ts))
        ooms = [1.0 if i == oom_pod and t >= (start + end) // 2 else 0.0 for t in ts]
        write(api, "container_oom_events_total", labels, ts, ooms)
        for metric, factor in (("kube_pod_container_resource_requests", 1.0),
                               ("kube_pod_container_resource_limits", 2.0)):
            write(api, metric, {**labels, "resource": "cpu", "unit": "core"}, ts, [cpu_request * factor] * len(ts))
            write(api, metric, {**labels, "resource": "memory", "unit": "byte"}, ts, [512.0 * MI * factor] * len(ts))


def target(ctl: VPAController, resource: str) -> float:
    rec = ctl.recommendations()["shop/web"]
    assert rec is not None
    return parse_quantity(rec["containerRecommendations"][0]["target"][resource])


async def test_usage_is_fed_once_per_minute_and_recommended() -> None:
    api, backend = local_store()
    now = DAY0 + 3 * HOUR
    feed(api, DAY0, now, cpu_request=1.0)
    ctl = VPAController([spec()], backend, InMemoryScale(), ManualClock(now))
    entry = (await ctl.sync_once())[0]
    # Per pod, 181 one-minute steps from 00:00 to 03:00: a memory peak at each, a CPU rate at each
    # but the first (a rate needs two samples in its window).
    assert entry["inputs"]["samplesFed"] == 2 * (181 + 180)
    assert abs(target(ctl, "cpu") - 0.5 * 1.15) < 0.5 * 1.15 * 0.06  # P90 of 0.5 core, 5% buckets
    assert abs(target(ctl, "memory") - 300 * MI * 1.15) < 300 * MI * 1.15 * 0.06
    assert entry["rule"] == "WithinBounds"  # 1 core lies within [lower, upper] at low confidence
    json.dumps(ctl.history(), allow_nan=False)
    again = (await ctl.sync_once())[0]
    assert again["inputs"]["samplesFed"] == 0  # nothing new since the last sync


async def test_an_oom_kill_bumps_the_memory_target() -> None:
    api, backend = local_store()
    now = DAY0 + 3 * HOUR
    feed(api, DAY0, now, cpu_request=1.0, oom_pod=0)
    ctl = VPAController([spec()], backend, InMemoryScale(), ManualClock(now))
    await ctl.sync_once()
    # The kill replaces pod 0's peak by max(512 MiB + 100 MiB, 512 MiB * 1.2) = 614.4 MiB.
    assert target(ctl, "memory") > 614 * MI * 1.15 * 0.95


async def test_auto_mode_hands_a_request_outside_the_bounds_to_the_backend_once() -> None:
    api, backend = local_store()
    now = DAY0 + 3 * HOUR
    feed(api, DAY0, now, cpu_request=0.1)
    cluster = InMemoryScale()
    clock = ManualClock(now)
    ctl = VPAController([spec("Auto")], backend, cluster, clock)
    entry = (await ctl.sync_once())[0]
    assert entry["rule"] == "Update" and entry["result"]["action"] == "updated"
    update = cluster.resources[REF]
    app = update.containers["app"]
    assert app["requests"]["cpu"] == target(ctl, "cpu")
    assert abs(app["limits"]["cpu"] - 2 * app["requests"]["cpu"]) < 1e-9  # the limit keeps its ratio
    clock.advance(MIN)
    assert (await ctl.sync_once())[0]["result"]["action"] == "none"  # the same target is not sent twice


async def test_off_mode_only_recommends() -> None:
    api, backend = local_store()
    now = DAY0 + HOUR
    feed(api, DAY0, now, cpu_request=0.1)
    cluster = InMemoryScale()
    ctl = VPAController([spec("Off")], backend, cluster, ManualClock(now))
    entry = (await ctl.sync_once())[0]
    assert entry["rule"] == "RecommendOnly" and cluster.resources == {}


@pytest.fixture(params=["file", pytest.param("etcd", marks=pytest.mark.slow)])
async def checkpoints(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Callable[[], CheckpointStore]]:
    """Makes checkpoint stores over one place: a file, or a key in a real etcd on loopback."""
    if request.param == "file":
        yield lambda: FileCheckpointStore(tmp_path / "vpa.json")
        return
    server = EtcdServer(fsync=False)
    server.start()
    clients: list[EtcdKV] = []

    def make() -> CheckpointStore:
        clients.append(EtcdKV(EtcdSettings(endpoint=server.endpoint)))
        return EtcdCheckpointStore(clients[-1], "/metricsd/test/checkpoints/vpa")

    try:
        yield make
    finally:
        for c in clients:
            await c.close()
        server.close()


async def test_a_restart_from_the_checkpoint_recommends_the_same(checkpoints: Callable[[], CheckpointStore]) -> None:
    api, backend = local_store()
    now = DAY0 + 3 * HOUR
    feed(api, DAY0, now + 30 * MIN, cpu_request=1.0)
    clock = ManualClock(now)
    store = checkpoints()
    first = VPAController([spec("Off")], backend, InMemoryScale(), clock, store)
    await first.sync_once()  # the first sync saves a checkpoint
    assert await store.load() is not None

    clock.advance(30 * MIN)
    restarted = VPAController([spec("Off")], backend, InMemoryScale(), clock, checkpoints())
    entry = (await restarted.sync_once())[0]
    await first.sync_once()
    assert entry["inputs"]["samplesFed"] == 4 * 30  # only the half hour after the checkpoint
    assert restarted.recommendations() == first.recommendations()
    assert restarted.checkpoint()["vpas"] == first.checkpoint()["vpas"]


async def test_an_unreadable_checkpoint_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "vpa.json"
    path.write_text("{not json")
    _, backend = local_store()
    ctl = VPAController([spec()], backend, InMemoryScale(), ManualClock(DAY0), FileCheckpointStore(path))
    assert await ctl.load() == 0
