"""The colocation controller on a real Store, with numbers worked by hand.

Pool `shared`: nodes n0..n3 of 16 cores. Online Deployment shop/web: four pods requesting 2 cores
and using 1 core each, two on n0 and two on n1, for the whole of yesterday and today; so the
forecast is 8 cores in every hour, and with the 25 % margin online needs 10 cores: one node.
"""

from __future__ import annotations

import json
from pathlib import Path

from consumers_data import DAY0, HOUR, MIN, local_store, write

from metricsd.clock import ManualClock
from metricsd.consumers.actuators.base import InMemoryScale
from metricsd.consumers.colocation.controller import ColocationController
from metricsd.consumers.colocation.spec import parse_colocation
from metricsd.consumers.hpa.parse import load_hpa_yaml
from metricsd.consumers.statusfmt import format_status
from metricsd.proto import metricsd_pb2_grpc as pb_grpc
from metricsd.rpc.channel import open_channel
from metricsd.rpc.client import GrpcBackend
from metricsd.store.api import LocalBackend, StoreAPI

NOW = DAY0 + 26 * HOUR
SPEC = {"kind": "ColocationPlan", "metadata": {"name": "night"}, "spec": {
    "pools": [{"name": "shared", "nodeRegex": "n[0-9]"}], "margin": 0.25, "drainMinutes": 10,
    "noticeMinutes": 15, "returnGraceMinutes": 5, "minLendMinutes": 120, "minOnlineMinutes": 30,
    "surge": [{"name": "web-spike", "service": {"namespace": "shop", "workload": "web"}, "threshold": 12,
               "pool": "shared", "nodes": 2, "order": "oldestLent"}],
    "nodeMarks": {"stateLabel": "example.com/state"}}}
PODS = [("web-0", "n0"), ("web-1", "n0"), ("web-2", "n1"), ("web-3", "n1")]


def fill(api: StoreAPI, start: int, end: int, per_pod: float = 1.0, pods: list[tuple[str, str]] = PODS,
         counters: dict[str, float] | None = None, nodes: tuple[str, ...] = ("n0", "n1", "n2", "n3")) -> None:
    ts = list(range(start, end + 1, MIN))
    for n in nodes:
        write(api, "kube_node_status_capacity", {"namespace": "kube-system", "pod": f"node-{n}", "node": n,
                                                 "resource": "cpu", "unit": "core"}, ts, [16.0] * len(ts))
    counters = counters if counters is not None else {}
    for pod, node in pods:
        labels = {"namespace": "shop", "workload": "web", "pod": pod, "container": "app", "node": node}
        values = []
        for _ in ts:
            values.append(counters.get(pod, 0.0))
            counters[pod] = counters.get(pod, 0.0) + per_pod * 60
        write(api, "container_cpu_usage_seconds_total", labels, ts, values)
        write(api, "kube_pod_container_resource_requests", {**labels, "resource": "cpu", "unit": "core"}, ts,
              [2.0] * len(ts))


def build() -> tuple[StoreAPI, LocalBackend, dict[str, float]]:
    api, backend = local_store()
    counters: dict[str, float] = {}
    fill(api, DAY0, NOW, counters=counters)
    return api, backend, counters


async def test_a_quiet_night_lends_three_nodes_and_a_stuck_drain_comes_back_with_an_alert(tmp_path: Path) -> None:
    api, backend, counters = build()
    sink = InMemoryScale()
    clock = ManualClock(NOW)
    state_file = tmp_path / "colocation-state.json"
    ctl = ColocationController(parse_colocation(SPEC), backend, sink, clock, state_file=state_file)
    entry = await ctl.sync_once()
    res = entry["result"]
    moves = {(t["node"], t["to"], t["reason"]) for t in res["transitions"]}
    # Lend order: fewest online pods first (n2, n3), then n0 before n1 by name; n1 covers the 10 cores.
    assert moves == {("n2", "OnlineToOffline", "Lend"), ("n3", "OnlineToOffline", "Lend"),
                     ("n0", "OnlineToOffline", "Lend")}
    assert entry["rule"] == "Moved" and res["pools"]["shared"]["Online"] == 1
    row = res["table"][0]
    assert (row["forecastCores"], row["needCores"], row["nodesOnline"], row["nodesLendable"], row["coresLendable"]) \
        == (8.0, 10.0, 1, 3, 48.0)
    assert sink.nodes["n0"].state_label == "example.com/state" and sink.nodes["n0"].dst == "OnlineToOffline"
    assert [k for k, _ in sink.published].count("colocation.notice") == 3
    assert json.loads(state_file.read_text())["n0"]["phase"] == "OnlineToOffline"

    # Two minutes on: n2 and n3 never had online pods, so they are lent; web still runs on n0.
    fill(api, NOW + MIN, NOW + 2 * MIN, counters=counters)
    clock.set(NOW + 2 * MIN)
    entry = await ctl.sync_once()
    assert {(t["node"], t["to"], t["reason"]) for t in entry["result"]["transitions"]} == {
        ("n2", "Offline", "Drained"), ("n3", "Offline", "Drained")}

    # At the drain deadline web is still on n0: an alert, and n0 goes back online; n1 is lent
    # instead (n0 is back for less than minOnlineMinutes, so not n0 again).
    fill(api, NOW + 3 * MIN, NOW + 10 * MIN, counters=counters)
    clock.set(NOW + 10 * MIN)
    entry = await ctl.sync_once()
    t, lend = entry["result"]["transitions"]
    assert (lend["node"], lend["to"]) == ("n1", "OnlineToOffline")
    assert (t["node"], t["from"], t["to"], t["reason"], t["alert"]) == ("n0", "OnlineToOffline", "Online",
                                                                        "DrainTimeout", True)
    assert entry["rule"] == "Alert" and ("colocation.alert", t) in [(k, dict(p)) for k, p in sink.published]

    # A restarted controller reads the states back: n2, n3 stay lent, nothing is taken for online.
    again = ColocationController(parse_colocation(SPEC), backend, InMemoryScale(), clock, state_file=state_file)
    assert {n: s.phase.value for n, s in again.states.items()} == {
        "n0": "Online", "n1": "OnlineToOffline", "n2": "Offline", "n3": "Offline"}
    table = format_status("colocation", {"history": ctl.history()})
    assert "DrainTimeout" in table and "n0" in table


async def test_a_surge_of_the_service_takes_two_lent_nodes_back_at_once() -> None:
    api, backend, counters = build()
    sink = InMemoryScale()
    clock = ManualClock(NOW)
    ctl = ColocationController(parse_colocation(SPEC), backend, sink, clock)
    await ctl.sync_once()
    fill(api, NOW + MIN, NOW + 2 * MIN, counters=counters)
    clock.set(NOW + 2 * MIN)
    await ctl.sync_once()  # n2, n3 lent (at NOW + 2 min)
    # web jumps to 3.5 cores a pod: 14 >= 12 cores; the rule takes back 2: the drain of n0 is
    # cancelled first, then the oldest lent (n2 and n3 were lent together: by name, n2).
    fill(api, NOW + 3 * MIN, NOW + 5 * MIN, per_pod=3.5, counters=counters)
    clock.set(NOW + 5 * MIN)
    entry = await ctl.sync_once()
    (surge,) = entry["result"]["surges"]
    assert surge["active"] and abs(surge["load"] - 14.0) < 1e-6 and surge["takenBack"] == ["n0", "n2"]
    back = {t["node"]: t for t in entry["result"]["transitions"] if t["reason"] == "Surge"}
    assert back["n2"]["to"] == "OfflineToOnline" and back["n2"]["deadlineMs"] == NOW + 5 * MIN + 6 * MIN
    assert (back["n0"]["from"], back["n0"]["to"]) == ("OnlineToOffline", "Online")
    assert sink.nodes["n2"].dst == "OfflineToOnline" and sink.nodes["n3"].dst == "Offline"
    assert "surge: web-spike" in entry["message"]


async def test_the_hpa_schedule_raises_the_forecast_and_keeps_nodes_online() -> None:
    _, backend, _ = build()
    hpa = load_hpa_yaml("""
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: web, namespace: shop}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
  minReplicas: 4
  maxReplicas: 40
  metrics:
  - {type: Resource, resource: {name: cpu, target: {type: Utilization, averageUtilization: 60}}}
  metricsd:
    schedules:
    - {name: early, start: "03:00", end: "05:00", minReplicas: 20}
""")
    spec = {**SPEC, "spec": {**SPEC["spec"], "replicaCurves": [  # type: ignore[dict-item]
        {"hpa": "shop/web", "pool": "shared", "coresPerReplica": 2}]}}
    ctl = ColocationController(parse_colocation(spec), backend, InMemoryScale(), ManualClock(NOW), hpas=hpa)
    entry = await ctl.sync_once()
    rows = {r["hour"]: r for r in entry["result"]["table"]}
    assert rows[2]["forecastCores"] == 8.0 and rows[3]["forecastCores"] == 40.0  # 20 replicas * 2 cores
    assert rows[3]["nodesOnline"] == 4 and rows[3]["nodesLendable"] == 0
    # 02:00 + 10 min drain + 2 h lend + 20 min return + 1 min reaches 03:00: nothing can be lent.
    assert entry["result"]["transitions"] == [] and entry["rule"] == "Steady"


async def test_without_yesterday_nothing_is_lent() -> None:
    api, backend = local_store()
    fill(api, NOW - 10 * MIN, NOW)
    ctl = ColocationController(parse_colocation(SPEC), backend, InMemoryScale(), ManualClock(NOW))
    entry = await ctl.sync_once()
    assert entry["result"]["transitions"] == []
    # Only the last row (01:00 tomorrow) has a same hour yesterday: the ten minutes written at 01:50.
    rows = entry["result"]["table"]
    assert all(r["forecastCores"] is None and r["nodesLendable"] == 0 for r in rows[:23])
    assert rows[23]["hourStart"] == "2024-01-04T01:00:00Z" and rows[23]["forecastCores"] == 8.0


async def test_a_lent_node_that_stops_reporting_is_still_called_back() -> None:
    api, backend, counters = build()
    clock = ManualClock(NOW)
    ctl = ColocationController(parse_colocation(SPEC), backend, InMemoryScale(), clock)
    await ctl.sync_once()
    fill(api, NOW + MIN, NOW + 2 * MIN, counters=counters)
    clock.set(NOW + 2 * MIN)
    await ctl.sync_once()  # n2, n3 lent
    # From then on n2 and n3 report nothing (their capacity series end); web surges to 16 cores on
    # n0 and n1. The surge rule still finds the two lent nodes, though no metric names them now.
    later = NOW + 30 * MIN
    fill(api, NOW + 3 * MIN, later, per_pod=8.0, pods=[("web-0", "n0"), ("web-2", "n1")], counters=counters,
         nodes=("n0", "n1"))
    clock.set(later)
    entry = await ctl.sync_once()
    assert entry["inputs"]["nodes"] == 4
    (surge,) = entry["result"]["surges"]
    assert surge["active"] and set(surge["takenBack"]) == {"n2", "n3"}
    nodes = {n["node"]: n["phase"] for n in entry["result"]["nodes"]}
    assert nodes["n2"] == nodes["n3"] == "OfflineToOnline"


async def test_an_unreachable_store_moves_no_node(free_ports: object) -> None:
    channel = open_channel(f"127.0.0.1:{free_ports()}")  # type: ignore[operator]
    try:
        ctl = ColocationController(parse_colocation(SPEC), GrpcBackend(pb_grpc.MetricsStub(channel)), InMemoryScale(),
                                   ManualClock(NOW))
        entry = await ctl.sync_once()
    finally:
        await channel.close(None)
    assert entry["rule"] == "Unavailable" and "cannot read the metrics now" in entry["message"]
    assert ctl.states == {} and ctl.errors == 1
