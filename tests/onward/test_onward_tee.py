"""The tee in front of a real store: what the store did not store does not go onward; and where a
cluster sends from and writes Parquet from (its plan)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from metricsd.clock import ManualClock
from metricsd.cmd.cluster import proxies_argv
from metricsd.cmd.clusterplan import ClusterPlan
from metricsd.cmd.main import build_parser
from metricsd.model import make_labels, series_id
from metricsd.onward import records
from metricsd.onward.tee import Onward, OnwardBackend
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.wire import labels_to_pb
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store

NOW = 1_790_000_000_000
HOUR = 3_600_000


def _queued(onward: Onward) -> dict[int, list[int]]:
    """Each series' timestamps in the onward buffer, in the order queued."""
    out: dict[int, list[int]] = {}
    for rec, payload in onward.buffer.payloads(list(onward.buffer.records_from(0))):
        assert not isinstance(payload, Exception)
        if rec.kind != records.SAMPLES:
            continue
        cols = records.decode_samples(payload)
        at = 0
        for sid, n in zip(cols.ids.tolist(), cols.counts.tolist(), strict=True):
            out.setdefault(sid, []).extend(cols.timestamps[at:at + n].tolist())
            at += n
    return out


async def test_a_sample_the_store_refuses_as_too_far_ahead_does_not_go_onward(tmp_path: Path) -> None:
    """Nor does it hold back the series' real-time samples after it (queued, it would have moved
    the series' watermark an hour on, and every later sample would be skipped as out of order)."""
    clock = ManualClock(NOW)
    onward = Onward(tmp_path / "onward", [], CollectorRegistry(), clock)
    backend = OnwardBackend(LocalBackend(StoreAPI(Store(), "t", clock)), onward)  # --max-future: 10 min
    a, b = (make_labels("m", {"namespace": "ns", "pod": "a"}),
            make_labels("m", {"namespace": "ns", "pod": "b"}))
    ida, idb = series_id(a), series_id(b)
    first = pb.WriteRequest(ids=[ida, idb], counts=[2, 1], timestamps=[NOW, NOW + HOUR, NOW + 5_000],
                            values=[1.0, 2.0, 3.0],
                            series=[pb.SeriesLabels(id=i, labels=labels_to_pb(lab)) for i, lab in ((ida, a), (idb, b))])
    resp = await backend.write(first)
    assert resp.rejected_too_far_ahead == 1 and not resp.unknown_ids
    clock.advance(10_000)
    await backend.write(pb.WriteRequest(ids=[ida, idb], counts=[1, 1], timestamps=[NOW + 10_000, NOW + 10_000],
                                        values=[4.0, 5.0]))
    assert _queued(onward) == {ida: [NOW, NOW + 10_000], idb: [NOW + 5_000, NOW + 10_000]}
    skipped = {s.labels["reason"]: s.value for m in onward.metrics.skipped.collect() for s in m.samples
               if s.name.endswith("_total")}
    assert skipped == {"too_far_ahead": 1.0}
    await onward.close()


def test_in_a_cluster_every_proxy_may_write_parquet_and_keeps_its_onward_buffer() -> None:
    """cluster up gives --parquet-dir to every proxy (they elect the writer: tests/cluster/
    test_cluster_parquet_writer.py) and each its own onward buffer."""
    parsed = build_parser().parse_args(["cluster", "up", "--remote-write-url", "http://x/w", "--parquet-dir", "/pq"])
    plan = ClusterPlan(stores=1, proxies=3, config_servers=1, proxy_args=proxies_argv(parsed), proxy_data_dir="/d")
    args = {spec.name: spec.args for spec in plan.proxy_specs()}
    assert all(a[a.index("--parquet-dir") + 1] == "/pq" for a in args.values())
    for i in (1, 2, 3):
        a = args[f"proxy-{i}"]
        assert a[a.index("--data-dir") + 1] == f"/d/proxy-{i}" and "--remote-write-url" in a


def test_cluster_up_passes_every_onward_flag_to_its_proxies_or_refuses_it() -> None:
    """Each flag of the 'sending onward' group that cluster up takes reaches the proxies (a flag
    taken and dropped would be silently ignored), and a shared buffer directory is refused."""
    parsed = build_parser().parse_args(["cluster", "up", "--remote-write-url", "http://x/w",
                                        "--remote-write-buffer-bytes", "99999999", "--parquet-dir", "/pq",
                                        "--parquet-check", "5", "--parquet-clock-file", "/c"])
    argv = proxies_argv(parsed)
    for flag, value in (("--remote-write-url", "http://x/w"), ("--remote-write-buffer-bytes", "99999999"),
                        ("--parquet-dir", "/pq"), ("--parquet-check", "5.0"), ("--parquet-clock-file", "/c")):
        assert argv[argv.index(flag) + 1] == value, flag
    shared = build_parser().parse_args(["cluster", "up", "--remote-write-url", "http://x/w",
                                        "--remote-write-buffer-dir", "/b"])
    with pytest.raises(ValueError, match="--remote-write-buffer-dir"):
        proxies_argv(shared)
