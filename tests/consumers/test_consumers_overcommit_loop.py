"""The overcommit advisor loop on a real Store, with numbers worked by hand.

Node n1: 8 cores, 32 GiB. Two online pods of shop/web request 2 cores and 4 GiB each and use
0.5 core and 1 GiB, except from 20:00 to 21:00 on the first day, when they use 1 core and 2 GiB.
A best-effort pod (no requests) of batch/job uses 1 core and 1 GiB: a borrower, not counted.
"""

from __future__ import annotations

import json

from consumers_data import DAY0, HOUR, MIN, local_store, write

from metricsd.clock import ManualClock
from metricsd.consumers.actuators.base import InMemoryScale
from metricsd.consumers.overcommit.config import OvercommitConfig, parse_overcommit
from metricsd.consumers.overcommit.controller import OvercommitController
from metricsd.consumers.statusfmt import format_status
from metricsd.store.api import LocalBackend, StoreAPI

GI = 2**30
NOW = DAY0 + 48 * HOUR + 5 * MIN


def peak(t: int) -> bool:
    return DAY0 + 20 * HOUR <= t < DAY0 + 21 * HOUR


def build() -> tuple[StoreAPI, LocalBackend]:
    api, backend = local_store()
    ts = list(range(DAY0, NOW + 1, MIN))
    node = {"namespace": "kube-system", "pod": "node-n1", "node": "n1"}
    write(api, "kube_node_status_capacity", {**node, "resource": "cpu", "unit": "core"}, ts, [8.0] * len(ts))
    write(api, "kube_node_status_capacity", {**node, "resource": "memory", "unit": "byte"}, ts, [32.0 * GI] * len(ts))
    pods = [("shop", "web", "web-0", True), ("shop", "web", "web-1", True), ("batch", "job", "job-0", False)]
    for ns, workload, pod, online in pods:
        labels = {"namespace": ns, "workload": workload, "pod": pod, "container": "app", "node": "n1"}
        counter, cpu = 0.0, []
        for t in ts:
            cpu.append(counter)
            counter += (1.0 if peak(t) or not online else 0.5) * 60
        write(api, "container_cpu_usage_seconds_total", labels, ts, cpu)
        write(api, "container_memory_working_set_bytes", labels, ts,
              [(2.0 if peak(t) and online else 1.0) * GI for t in ts])
        if online:
            write(api, "kube_pod_container_resource_requests", {**labels, "resource": "cpu", "unit": "core"}, ts,
                  [2.0] * len(ts))
            write(api, "kube_pod_container_resource_requests", {**labels, "resource": "memory", "unit": "byte"}, ts,
                  [4.0 * GI] * len(ts))
    return api, backend


async def test_the_advice_matches_the_hand_worked_numbers() -> None:
    _, backend = build()
    sink = InMemoryScale()
    ctl = OvercommitController(OvercommitConfig(), backend, sink, ManualClock(NOW))
    entry = await ctl.sync_once()
    res = entry["result"]
    recs = {(r["workload"], r["resource"]): r for r in res["requests"]}
    assert set(recs) == {("web", "cpu"), ("web", "memory")}  # the best-effort job gets no advice
    assert abs(recs["web", "cpu"]["weekly_peak"] - 1.0) < 1e-9
    assert abs(recs["web", "cpu"]["recommended"] - 1.15) < 1e-9
    assert abs(res["reclaimable"]["cluster"]["cpu"] - (2 * 2.0 - 2 * 1.15)) < 1e-9
    assert recs["web", "memory"]["weekly_peak"] == 2 * GI
    assert abs(res["reclaimable"]["cluster"]["memory"] - (8 * GI - 2 * 2.3 * GI)) < 1
    (node,) = res["nodes"]
    assert node["onlinePods"] == 2
    assert abs(node["borrowable"]["cpu"] - (8 * 0.60 - 1.0)) < 1e-6
    assert abs(node["borrowable"]["memory"] - (32 * GI * 0.65 - 2 * GI)) < 1
    tidal = {r["hour"]: r for r in res["tidal"]}
    assert abs(tidal[20]["lendable"]["cpu"] - (8 - 2.0 - 0.8)) < 1e-9
    assert abs(tidal[3]["lendable"]["cpu"] - (8 - 1.0 - 0.8)) < 1e-9
    assert abs(tidal[20]["lendable"]["memory"] - (32 - 4 - 3.2) * GI) < 1
    assert "most to lend at" in entry["message"]
    assert [k for k, _ in sink.published] == ["overcommit.advice"]
    json.dumps(ctl.history(), allow_nan=False)
    table = format_status("overcommit", {"history": ctl.history()})
    assert "20:00" in table and "1.70 cores reclaimable" in table and "3.40 GiB reclaimable" in table
    assert entry["message"].startswith("reclaimable now: 1.70 cores, 3.40 GiB over 2 workload containers")


async def test_pods_that_need_more_than_they_request_read_as_under_requested() -> None:
    """With a 120% buffer the peaks (1 core, 2 GiB a pod) call for 2.2 cores and 4.4 GiB a pod, above
    the 2 cores and 4 GiB requested: the log line and the status say so in words, not as negatives."""
    _, backend = build()
    sink = InMemoryScale()
    config = parse_overcommit({"kind": "OvercommitAdvisor", "spec": {"buffer": 1.2}})
    ctl = OvercommitController(config, backend, sink, ManualClock(NOW))
    entry = await ctl.sync_once()
    assert entry["message"].startswith("nothing reclaimable now: CPU under-requested by 0.40 cores, memory "
                                       "under-requested by 0.80 GiB over 2 workload containers")
    assert sink.published[-1][1]["message"] == entry["message"]  # what the log backend writes
    table = format_status("overcommit", {"history": ctl.history()})
    assert "under-requested by 0.40 cores" in table and "under-requested by 0.80 GiB" in table


async def test_a_namespace_scope_leaves_other_namespaces_out() -> None:
    _, backend = build()
    config = parse_overcommit({"kind": "OvercommitAdvisor", "spec": {"namespaces": ["batch"]}})
    ctl = OvercommitController(config, backend, InMemoryScale(), ManualClock(NOW))
    entry = await ctl.sync_once()
    assert entry["rule"] == "NoHistory" and entry["result"]["requests"] == []
