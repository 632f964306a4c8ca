"""Remote write out to real receivers: a real VictoriaMetrics and a real Prometheus
(``--web.enable-remote-write-receiver``) take what ``metricsd up --remote-write-url`` sends and
answer the same values as metricsd for the same queries; a VictoriaMetrics really stopped for
60 s (on the sender's injected clock) loses nothing, across a restart of the sender too."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from onward_peers import (
    PROMETHEUS,
    VICTORIA_METRICS,
    free_port,
    get,
    metric_values,
    prometheus_receiver,
    query,
    running,
    scalar,
    victoria_metrics,
    vm_flush,
    wait_for,
)
from processes import stop_process
from prometheus_client import CollectorRegistry

from metricsd.agent.batches import write_requests
from metricsd.agent.simulate import SimConfig, Simulator
from metricsd.clock import ManualClock
from metricsd.onward.target import TargetConfig
from metricsd.onward.tee import Onward, OnwardBackend
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(VICTORIA_METRICS is None or PROMETHEUS is None,
                       reason="victoria-metrics or prometheus is not installed: run `make victoria-metrics-deps "
                              "prometheus-deps` (apt-get, as root)"),
]


def _metricsd_metrics(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        return str(r.read().decode())


def _drained(url: str, targets: int) -> bool:
    """Every target has sent everything queued so far (and something was queued)."""
    text = _metricsd_metrics(url)
    pending = metric_values(text, "metricsd_onward_samples_pending")
    sent = metric_values(text, "metricsd_onward_samples_sent_total")
    return len(pending) == targets and all(v == 0 for v in pending.values()) and len(sent) == targets


def test_victoria_metrics_and_prometheus_answer_what_metricsd_answers(tmp_path: Path) -> None:
    vm = victoria_metrics(tmp_path / "vm")
    prom = prometheus_receiver(tmp_path / "prom")
    http, grpc = free_port(), free_port()
    url = f"http://127.0.0.1:{http}"
    log = tmp_path / "metricsd.log"
    with running(vm, prom):
        argv = [sys.executable, "-m", "metricsd", "up", "--pods", "20", "--no-consumers", "--host", "127.0.0.1",
                "--http-port", str(http), "--grpc-port", str(grpc), "--data-dir", str(tmp_path / "data"),
                "--remote-write-url", vm.url + "/api/v1/write", "--remote-write-url", prom.url + "/api/v1/write"]
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for("metricsd up", lambda: get(url + "/api/v1/status/buildinfo"), [log], timeout_s=120)
            wait_for("both targets drained", lambda: _drained(url, 2), [log, vm.log, prom.log])
            vm_flush(vm)
            text = _metricsd_metrics(url)
            assert not metric_values(text, "metricsd_onward_samples_failed_total"), text
            assert metric_values(text, "metricsd_onward_protocol_version") and all(
                v == 1 for v in metric_values(text, "metricsd_onward_protocol_version").values())
            # A time inside the backfilled hour, between two ticks, so that no sample sits on a window's edge.
            newest = max(float(t) for r in query(url, "container_memory_working_set_bytes[1m]")
                         for t, _ in r["values"])
            at = newest - 900 + 3.7
            questions = [
                "sum(count_over_time(container_memory_working_set_bytes[30m]))",
                "sum(count_over_time(container_cpu_usage_seconds_total[30m]))",
                "sum(container_memory_working_set_bytes)",
                "max(container_cpu_usage_seconds_total)",
                "count(kube_pod_container_resource_requests)",
            ]
            for q in questions:
                ours = scalar(url, q, at)
                assert ours > 0, q
                assert scalar(vm.url, q, at) == ours, (q, "VictoriaMetrics")
                assert scalar(prom.url, q, at) == ours, (q, "Prometheus")
        finally:
            stop_process(proc)


async def _sleep_on(clock: ManualClock, slept: list[float], seconds: float) -> None:
    """The sender's back-off on the manual clock: the time passes there at once; a few ms pass
    for real so that the retries keep hitting the stopped receiver without spinning."""
    slept.append(seconds)
    clock.advance(int(seconds * 1000))
    await asyncio.sleep(0.005)


def _vm_count(vm_url: str, at_s: float) -> float:
    return scalar(vm_url, 'sum(count_over_time({__name__=~".+"}[2h]))', at_s)


async def test_a_receiver_stopped_for_60_s_loses_nothing_even_across_a_sender_restart(tmp_path: Path) -> None:
    port = free_port()
    vm = victoria_metrics(tmp_path / "vm", port)
    now = int(time.time() * 1000) - 30 * 60_000
    clock = ManualClock(now)
    slept: list[float] = []
    target = TargetConfig(url=f"http://127.0.0.1:{port}/api/v1/write", name="vm", shards=3, min_backoff_s=1.0,
                          max_backoff_s=8.0)

    def onward() -> Onward:
        return Onward(tmp_path / "onward", [target], CollectorRegistry(), clock,
                      sleep=lambda s: _sleep_on(clock, slept, s), rand=lambda: 0.0)

    store = LocalBackend(StoreAPI(Store(), "t", clock))
    sim = Simulator(SimConfig(pods=10), now)
    written = 0
    last: list[object] = []

    async def tick(backend: OnwardBackend) -> None:
        nonlocal written
        ts, values = sim.next_tick()
        last.clear()
        for req in write_requests(sim, ts, values, max_samples=10_000, send_labels_for=None):
            assert not (await backend.write(req)).unknown_ids
            written += len(req.timestamps)
            last.append(req)
        clock.advance(10_000)

    async def until(what: str, check: object, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():  # type: ignore[operator]
            assert time.monotonic() < deadline, what
            await asyncio.sleep(0.02)

    with running(vm):
        first = onward()
        first.start()
        backend = OnwardBackend(store, first)
        await tick(backend)
        await until("first tick sent", lambda: first.buffer.pending("vm") == 0)
        vm.stop()  # really stopped: its port refuses connections
        outage_start = clock.now_ms()
        for _ in range(6):  # 60 s of ticks while it is down
            await tick(backend)
        await until("60 s of retries", lambda: clock.now_ms() - outage_start >= 60_000 and len(slept) > 5)
        assert first.buffer.pending("vm") > 0
        assert first.senders[0].lag_s() >= 60
        retried = first.metrics.retries.labels("vm")._value.get()
        assert retried >= 5
        await first.close()  # the sender restarts while the receiver is still down
        second = onward()
        assert second.buffer.pending("vm") > 0
        second.start()
        await tick(OnwardBackend(store, second))
        for req in last:  # a client retrying a write whose answer it lost: the store had it, so has the buffer
            await OnwardBackend(store, second).write(req)  # type: ignore[arg-type]
        vm.start()
        await until("backlog sent", lambda: second.buffer.pending("vm") == 0)
        vm_flush(vm)
        got = wait_for("every sample in VictoriaMetrics",
                       lambda: _vm_count(vm.url, clock.now_ms() / 1000) == written or None, [vm.log], 30)
        assert got
        assert second.metrics.failed.labels("vm")._value.get() == 0
        # No sample twice either: every series has one per tick (1 before, 6 during, 1 after the outage).
        at_s = clock.now_ms() / 1000
        for fn in ("min", "max"):
            assert scalar(vm.url, f"{fn}(count_over_time(container_memory_working_set_bytes[2h]))", at_s) == 8
        await second.close()


async def test_a_metricsd_receiver_is_sent_remote_write_2_0_and_stores_every_sample(tmp_path: Path) -> None:
    """protocol auto against a receiver that takes 2.0 (a real `metricsd up`): the empty 2.0 request
    tells, the sender's 2.0 bodies (symbols once per request) are stored sample for sample."""
    http, grpc_port = free_port(), free_port()
    url = f"http://127.0.0.1:{http}"
    log = tmp_path / "receiver.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "metricsd", "up", "--no-simulate", "--no-consumers",
                                 "--host", "127.0.0.1", "--http-port", str(http), "--grpc-port", str(grpc_port)],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for("metricsd up", lambda: get(url + "/api/v1/status/buildinfo"), [log], timeout_s=120)
        now = int(time.time() * 1000) - 5 * 60_000
        onward = Onward(tmp_path / "onward", [TargetConfig(url=url + "/api/v1/write", name="m", shards=2,
                                                           max_samples_per_send=300)],
                        CollectorRegistry(), ManualClock(now))
        sim = Simulator(SimConfig(pods=6), now)
        written = 0
        for i in range(12):
            ts, values = sim.next_tick()
            for req in write_requests(sim, ts, values, max_samples=500, send_labels_for=None if i == 0 else set()):
                written += onward.queue(req)
        onward.start()
        try:
            deadline = time.monotonic() + 60
            while onward.buffer.pending("m"):
                assert time.monotonic() < deadline, "not sent in 60 s"
                await asyncio.sleep(0.05)
            assert onward.metrics.protocol.labels("m")._value.get() == 2
            assert onward.metrics.sent.labels("m")._value.get() == written
        finally:
            await onward.close()
        at = (now + 12 * 10_000) / 1000
        stored = query(url, '{__name__=~".+"}[10m]', at)  # every raw sample
        assert sum(len(r["values"]) for r in stored) == written
        assert {len(r["values"]) for r in stored} == {12}  # each series once a tick, none twice
    finally:
        stop_process(proc)
