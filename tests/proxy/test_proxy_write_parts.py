"""Concurrent client batches through a ProxyBackend in front of real stores on loopback gRPC leave
in fewer calls than batches (rpc WriteParts), and every sample arrives on every replica."""

from __future__ import annotations

import asyncio

import pytest
from proxy_cluster import LocalCluster, fast_settings, raw, start_cluster, workload, write_request

T0 = 1_700_000_000_000


@pytest.mark.slow
async def test_concurrent_batches_through_a_proxy_share_calls_and_all_arrive() -> None:
    cluster: LocalCluster = await start_cluster(3)
    try:
        proxy = cluster.proxy(fast_settings())
        series = workload(60)
        # 40 client batches of 3 series each, written at once, as 40 agents would
        batches = [write_request(series[i:i + 3], [T0 + 10_000 * k for k in range(5)], labels=True)
                   for i in range(0, 120, 3)]
        resps = await asyncio.gather(*(proxy.write(b) for b in batches))
        assert all(r.samples_written == 15 and not r.unknown_ids for r in resps)
        calls, parts = proxy.counters["member_write_calls"], proxy.counters["member_write_parts"]
        assert parts >= 40 * 2  # every batch to at least W members
        assert calls < parts  # batches that queued behind a call shared the next one
        background = list(proxy.writes._background)  # the third replica's calls, past the W acks
        await asyncio.gather(*background, return_exceptions=True)
        for lab in series:
            for holder in cluster.holders(lab):
                assert len(raw(cluster.nodes[holder].store, lab)) == 5
    finally:
        await cluster.close()
