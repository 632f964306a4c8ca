"""Through a proxy, samples the stores refuse (too far ahead of their clocks, too old for their
series) come back in the client's answer, counted and explained, and the rest of the batch is
stored on the replicas: no write path answers success for a sample it did not store."""

from __future__ import annotations

import time

from proxy_cluster import raw, start_cluster, write_request

from metricsd.model import make_labels

DAY = 86_400_000


async def test_a_batch_with_a_sample_a_day_ahead_stores_the_rest_and_says_why() -> None:
    cluster = await start_cluster(3)
    try:
        proxy = cluster.proxy()
        now = int(time.time() * 1000)
        ahead = make_labels("cpu", {"namespace": "shop", "pod": "skewed"})
        fine = make_labels("cpu", {"namespace": "shop", "pod": "fine"})
        req = write_request([fine], [now - 1000, now], labels=True)
        req.MergeFrom(write_request([ahead], [now + DAY], labels=True))
        resp = await proxy.write(req)
        assert (resp.samples_written, resp.rejected_too_far_ahead) == (2, 1)
        assert resp.refused.startswith("samples refused: 1 too far ahead: more than 10m after the store's clock")
        await proxy.writes.wait_idle()
        for member, node in cluster.nodes.items():
            assert raw(node.store, ahead) == [], member  # no replica holds it, no series was made
        assert all(len(raw(cluster.nodes[m].store, fine)) == 2 for m in cluster.holders(fine))
        assert proxy.writes.handoff.pending() == {}  # a refusal is an answer, not a failure to hand off
        late = await proxy.write(write_request([fine], [now - 2 * 3600_000], labels=False))
        assert (late.samples_written, late.rejected_too_old) == (0, 1)
        assert "too old for their series" in late.refused
    finally:
        await cluster.close()
