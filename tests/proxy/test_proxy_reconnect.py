"""A store that restarts is used again as soon as its connection is back, not when the proxy's
back-offs run out: health and hinted hand-off both follow the gRPC channel's reconnection."""

from __future__ import annotations

import asyncio
import time

import pytest
from proxy_cluster import LocalCluster, fast_settings, raw, workload, write_request

from metricsd.proxy.members import grpc_connect
from metricsd.proxy.settings import HandoffSettings, HealthSettings

T0 = 1_700_000_000_000
LONG = 60.0  # back-offs far longer than the test: only the reconnect watch can end them in time


async def test_a_restarted_store_is_healthy_and_gets_its_hints_once_it_reconnects(cluster3: LocalCluster) -> None:
    settings = fast_settings(health=HealthSettings(down_initial_s=LONG, down_max_s=LONG),
                             handoff=HandoffSettings(retry_initial_s=LONG, retry_max_s=LONG))
    proxy = cluster3.proxy(settings, connect=grpc_connect(settings.call_timeout_s))
    series = workload(10)
    await proxy.write(write_request(series, [T0], labels=True))
    victim = cluster3.nodes["store-1"]
    await victim.stop()
    for k in (1, 2):
        resp = await proxy.write(write_request(series, [T0 + k * 10_000], labels=False))
        assert resp.samples_written == len(series)  # W = 2 of the other two
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


@pytest.mark.slow
async def test_a_timeout_on_a_connected_channel_is_left_to_the_back_off(cluster3: LocalCluster) -> None:
    """A member that fails while its connection stays up (here: a call refused before it is sent,
    as a timeout on a paused store would be) is not declared back by the watch."""
    settings = fast_settings(health=HealthSettings(down_initial_s=LONG, down_max_s=LONG))
    proxy = cluster3.proxy(settings, connect=grpc_connect(settings.call_timeout_s))
    await proxy.write(write_request(workload(2), [T0], labels=True))  # every channel connected
    proxy.view.health.failure("store-0", "no answer within 2 s")
    await asyncio.sleep(2.5)  # two of the watch's one-second rounds
    assert proxy.view.health.failed("store-0") and not proxy.view.health.is_healthy("store-0")
