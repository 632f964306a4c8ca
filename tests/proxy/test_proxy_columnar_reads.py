"""A Read through the proxy with ReadRequest.columnar: one batch per store and one back, the same
series and samples as the per-series form, in label order; a replica that came back empty still
gets what it lacks written back (read repair), as with the per-series form."""

from __future__ import annotations

import asyncio
import time

from proxy_cluster import LocalCluster, fast_settings, raw, selector, workload, write_request

from metricsd.columns import SeriesColumns
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proxy.latency import HedgeSettings
from metricsd.proxy.settings import HandoffSettings
from metricsd.rpc.consistency import Consistency, reading_with
from metricsd.rpc.wire import columns_from_read, labels_from_pb
from metricsd.store.engine import Store

T0 = 1_700_000_000_000
TIMES = [T0 + k * 10_000 for k in range(6)]
EVERYTHING = pb.ReadRequest(matchers=selector('namespace=~".+"'), end_ms=2**62)


def _as_rows(cols: SeriesColumns) -> list[tuple[object, list[int], list[float]]]:
    return [(lab, ts.tolist(), vals.tolist()) for lab, ts, vals in (cols.series_at(i) for i in range(len(cols)))]


async def test_columnar_reads_equal_per_series_reads_and_still_repair(cluster3: LocalCluster) -> None:
    proxy = cluster3.proxy(fast_settings(handoff=HandoffSettings(max_bytes=0)))  # no hand-off: repair only
    series = workload(12)
    await proxy.write(write_request(series, TIMES, labels=True))
    # W = 2: store-0's part may still be on its way; landing after the restart it would fill the new
    # store, and the repair checked below would have nothing to do.
    await proxy.writes.wait_idle()
    victim = cluster3.nodes["store-0"]
    await victim.restart(Store())
    columnar = pb.ReadRequest()
    columnar.CopyFrom(EVERYTHING)
    columnar.columnar = True
    deadline = time.monotonic() + 30  # 10 s was once not enough at load 7
    while True:  # R=2 rotates over the replicas, so store-0 is asked soon
        got = await proxy.read(columnar)
        assert got.HasField("batch") and not got.series
        cols = columns_from_read(got)
        assert len(cols) == len(series) and cols.counts.tolist() == [len(TIMES)] * len(series)
        assert cols.labels.to_list() == sorted(cols.labels.to_list())
        await proxy.reads.repair.wait_idle()
        if all(raw(victim.store, lab) for lab in series if "store-0" in cluster3.holders(lab)):
            break
        assert time.monotonic() < deadline, "read repair did not reach the empty replica"
        await asyncio.sleep(0.05)
    assert proxy.counters["repair_samples"] > 0
    per_series = await proxy.read(EVERYTHING)
    want = [(labels_from_pb(s.labels), list(s.timestamps), list(s.values)) for s in per_series.series]
    assert _as_rows(columns_from_read(await proxy.read(columnar))) == want


async def test_a_columnar_read_of_consistency_one_is_the_quorum_read_even_hedged_and_with_one_store_up(
        cluster3: LocalCluster) -> None:
    """PromQL over HTTP reads with consistency one (rpc/consistency.py) and asks for columns: one
    replica's batch per slot, hedged, must give every series once, as the quorum's per-series read."""
    proxy = cluster3.proxy()
    hedging = cluster3.proxy(fast_settings(hedge=HedgeSettings(initial_s=0.0, min_s=0.0, max_s=0.0)))
    series = workload(12)
    await proxy.write(write_request(series, TIMES, labels=True))
    await proxy.writes.wait_idle()  # W = 2: one replica per slot is read below, store-0 alone at the end
    want = _as_rows(columns_from_read(await proxy.read(EVERYTHING)))
    assert len(want) == len(series)
    columnar = pb.ReadRequest()
    columnar.CopyFrom(EVERYTHING)
    columnar.columnar = True
    with reading_with(Consistency.ONE):
        for p in (proxy, hedging):
            for got in await asyncio.gather(*(p.read(columnar) for _ in range(4))):
                assert got.HasField("batch") and _as_rows(columns_from_read(got)) == want
        for n in list(cluster3.nodes.values())[1:]:
            await n.stop()
        assert _as_rows(columns_from_read(await proxy.read(columnar))) == want
    assert hedging.counters["read_one_hedges"] > 0


async def test_the_proxys_read_columns_are_its_columnar_reads_at_either_consistency_and_still_repair(
        cluster3: LocalCluster) -> None:
    """ProxyBackend.read_columns (what the HTTP API's PromQL engine reads through) merges as the
    columnar Read does without the message in between: the same series, labels and samples in the
    same order, at quorum (replicas compared, an empty replica repaired) and at one (one replica's
    batch per slot, put together), hedged or not."""
    proxy = cluster3.proxy(fast_settings(handoff=HandoffSettings(max_bytes=0)))
    hedging = cluster3.proxy(fast_settings(hedge=HedgeSettings(initial_s=0.0, min_s=0.0, max_s=0.0)))
    series = workload(12)
    await proxy.write(write_request(series, TIMES, labels=True))
    await proxy.writes.wait_idle()  # W = 2: reads of consistency one below may ask the third replica
    columnar = pb.ReadRequest()
    columnar.CopyFrom(EVERYTHING)
    columnar.columnar = True
    want = _as_rows(columns_from_read(await proxy.read(columnar)))
    assert len(want) == len(series) and want == sorted(want, key=lambda r: r[0])  # type: ignore[arg-type,return-value]
    for p in (proxy, hedging):
        assert _as_rows(await p.read_columns(EVERYTHING)) == want
        with reading_with(Consistency.ONE):
            for got in await asyncio.gather(*(p.read_columns(EVERYTHING) for _ in range(4))):
                assert _as_rows(got) == want
            ns, pod = dict(series[0])["namespace"], dict(series[0])["pod"]
            one_pod = pb.ReadRequest(matchers=selector(f'namespace="{ns}", pod="{pod}"'), end_ms=2**62)
            mine = [r for r in want if ("namespace", ns) in r[0] and ("pod", pod) in r[0]]  # type: ignore[operator]
            assert len(mine) > 1 and _as_rows(await p.read_columns(one_pod)) == mine
    victim = cluster3.nodes["store-1"]
    await victim.restart(Store())
    repaired0 = proxy.counters["read_repair_series"]
    for _ in range(3):  # R=2 rotates over the replicas: store-1's empty answer is compared within three reads
        assert _as_rows(await proxy.read_columns(EVERYTHING)) == want
    assert proxy.counters["read_repair_series"] > repaired0
