"""A store that restarts is used again as soon as its connection is back, not when the proxy's
back-offs run out: health and hinted hand-off both follow the gRPC channel's reconnection."""

from __future__ import annotations

import asyncio
import time

import pytest
from proxy_cluster import LocalCluster, fast_settings, raw, workload, write_request

from metricsd.proxy.members import grpc_connect
from metricsd.proxy.settings import HandoffSettings, HealthSettings
from metricsd.proxy.view import ClusterView

T0 = 1_700_000_000_000
LONG = 60.0  # back-offs far longer than the test: only the reconnect watch can end them in time


async def test_a_restarted_store_is_healthy_and_gets_its_hints_once_it_reconnects(cluster3: LocalCluster) -> None:
    settings = fast_settings(health=HealthSettings(down_initial_s=LONG, down_max_s=LONG),
                             handoff=HandoffSettings(retry_initial_s=LONG, retry_max_s=LONG))
    proxy = cluster3.proxy(settings, connect=grpc_connect(settings.call_timeout_s))
    series = workload(10)
    await proxy.write(write_request(series, [T0], labels=True))
    await proxy.writes.wait_idle()  # W = 2: store-1's part of T0 may still be on its way
    victim = cluster3.nodes["store-1"]
    await victim.stop()
    for k in (1, 2):
        resp = await proxy.write(write_request(series, [T0 + k * 10_000], labels=False))
        assert resp.samples_written == len(series)  # W = 2 of the other two
    # acknowledged by the other two, store-1's calls may not have failed yet (and been handed off)
    await proxy.writes.wait_idle()
    health = proxy.view.health
    assert health.failed("store-1") and not health.is_healthy("store-1")
    assert proxy.writes.handoff.pending()["store-1"][0] > 0
    await victim.restart()  # the same Store, same port; no request is sent meanwhile
    deadline = time.monotonic() + 10.0  # gRPC's reconnect back-off is at most 2 s
    while proxy.writes.handoff.pending() or health.failed("store-1"):
        assert time.monotonic() < deadline, "the restarted store was not used again within 10 s"
        await asyncio.sleep(0.05)
    assert [t for t, _ in raw(victim.store, series[0])] == [T0, T0 + 10_000, T0 + 20_000]
    assert proxy.counters["handoff_dropped"] == 0


async def test_a_timeout_on_a_connected_channel_is_left_to_the_back_off(
        cluster3: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A member that fails while its connection stays up (a timeout on a paused store, reported
    here directly) is not declared back by the watch, however many rounds it runs."""
    monkeypatch.setattr(ClusterView, "WATCH_ROUND_S", 0.01)
    settings = fast_settings(health=HealthSettings(down_initial_s=LONG, down_max_s=LONG))
    proxy = cluster3.proxy(settings, connect=grpc_connect(settings.call_timeout_s))
    await proxy.write(write_request(workload(2), [T0], labels=True))
    await proxy.writes.wait_idle()  # the third replica's write too: every channel connected
    proxy.view.health.failure("store-0", "no answer within 2 s")
    deadline = time.monotonic() + 10.0
    while proxy.counters["reconnect_watch_rounds"] < 5:  # the watch has looked at the channel 5 times
        assert time.monotonic() < deadline, "the watch did not run"
        await asyncio.sleep(0.01)
    assert proxy.view.health.failed("store-0") and not proxy.view.health.is_healthy("store-0")


async def test_a_restarted_store_without_hints_is_healthy_again_once_it_reconnects(cluster3: LocalCluster) -> None:
    """Nothing to hand off (the store failed a read, say): the watch alone makes it healthy, so
    that reads and writes route to it again without waiting for a probe."""
    settings = fast_settings(health=HealthSettings(down_initial_s=LONG, down_max_s=LONG))
    proxy = cluster3.proxy(settings, connect=grpc_connect(settings.call_timeout_s))
    await proxy.write(write_request(workload(2), [T0], labels=True))
    await proxy.writes.wait_idle()
    victim = cluster3.nodes["store-2"]
    await victim.stop()
    proxy.view.health.failure("store-2", "connection refused")
    await victim.restart()
    deadline = time.monotonic() + 10.0
    while proxy.view.health.failed("store-2"):
        assert time.monotonic() < deadline, "the restarted store was not healthy again within 10 s"
        await asyncio.sleep(0.05)
    assert not proxy.writes.handoff.pending() and proxy.counters["handoff_delivered"] == 0
