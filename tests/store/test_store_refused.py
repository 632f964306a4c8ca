"""A store refuses what it will not keep before it reaches a series, and says so in its answer:
samples more than --max-future after its clock (a sender's clock running ahead), samples older than
it keeps, samples too old for their series. Over the Write RPC, per WriteParts part, and never
logged to the WAL."""

from __future__ import annotations

import shutil
from pathlib import Path

import grpc

from metricsd.clock import ManualClock
from metricsd.model import make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proto import metricsd_pb2_grpc as pb_grpc
from metricsd.rpc.server import start_grpc_server
from metricsd.rpc.servicer import MetricsServicer
from metricsd.rpc.wire import labels_to_pb
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.durable import DurabilitySettings, open_store
from metricsd.store.engine import Store
from metricsd.store.settings import StoreSettings
from metricsd.store.wal import FsyncPolicy

NOW = 1_750_000_000_000  # 2025-06-15T15:06:40Z
MIN = 60_000
DAY = 86_400_000
POD = make_labels("container_cpu_usage_seconds_total", {"namespace": "shop", "pod": "cart-1"})
OTHER = make_labels("container_cpu_usage_seconds_total", {"namespace": "shop", "pod": "cart-2"})


def _req(points: list[tuple[int, float]], labels: tuple[tuple[str, str], ...] = POD) -> pb.WriteRequest:
    sid = series_id(labels)
    req = pb.WriteRequest(ids=[sid], counts=[len(points)], timestamps=[t for t, _ in points],
                          values=[v for _, v in points])
    req.series.add(id=sid).labels.extend(labels_to_pb(labels))
    return req


def _held(store: Store, labels: tuple[tuple[str, str], ...] = POD) -> list[int]:
    row = store.index.row_of(series_id(labels))
    return [] if row is None else store.series_samples(row, 0, 2**62)[0].tolist()


def test_a_sample_from_a_clock_a_day_ahead_is_refused_and_the_series_takes_real_time_samples_after_it() -> None:
    store, clock = Store(), ManualClock(NOW)
    api = StoreAPI(store, clock=clock)
    resp = api.write(_req([(NOW + DAY, 1.0)]))
    assert (resp.samples_written, resp.rejected_too_far_ahead) == (0, 1)
    assert resp.refused.startswith("samples refused: 1 too far ahead: more than 10m after the store's clock "
                                   "(2025-06-15T15:06:40Z), e.g. {__name__=\"container_cpu_usage_seconds_total\", "
                                   "namespace=\"shop\", pod=\"cart-1\"} at 2025-06-16T15:06:40Z")
    assert store.index.n_alive == 0  # refused before it reached a series: none was created
    for k in range(3):  # what the issue saw refused as too_old is stored
        clock.advance(10_000)
        resp = api.write(_req([(clock.now_ms(), float(k))]))
        assert (resp.samples_written, resp.rejected_too_old, resp.refused) == (1, 0, "")
    assert _held(store) == [NOW + 10_000, NOW + 20_000, NOW + 30_000]
    assert api.stats(pb.StatsRequest()).rejected["too_far_ahead"] == 1


def test_within_max_future_is_stored_and_the_limit_is_a_setting() -> None:
    store, clock = Store(StoreSettings(max_future_ms=None)), ManualClock(NOW)
    assert StoreAPI(store, clock=clock).write(_req([(NOW + DAY, 1.0)])).samples_written == 1  # no limit
    store = Store(StoreSettings(max_future_ms=MIN))
    resp = StoreAPI(store, clock=clock).write(_req([(NOW + MIN, 1.0), (NOW + MIN + 1, 2.0)]))
    assert (resp.samples_written, resp.rejected_too_far_ahead) == (1, 1)
    assert "more than 1m after" in resp.refused


def test_1970_and_2100_are_refused_next_to_a_store_of_todays_data() -> None:
    store, clock = Store(), ManualClock(NOW)
    api = StoreAPI(store, clock=clock)
    assert api.write(_req([(NOW, 1.0)], OTHER)).samples_written == 1
    resp = api.write(_req([(0, 1.0), (NOW, 2.0), (4_102_444_800_000, 3.0)]))  # 1970, now, 2100
    assert (resp.samples_written, resp.rejected_too_old, resp.rejected_too_far_ahead) == (1, 1, 1)
    assert "1 too far ahead" in resp.refused and "1 too old: before 2025-06-07T15:06:40Z" in resp.refused
    assert _held(store) == [NOW]


def test_a_sample_too_old_for_its_series_window_is_counted_and_explained() -> None:
    store, clock = Store(), ManualClock(NOW)
    api = StoreAPI(store, clock=clock)
    api.write(_req([(NOW, 1.0)]))
    resp = api.write(_req([(NOW - 2 * 3600_000, 0.5), (NOW + 1000, 2.0)]))
    assert (resp.samples_written, resp.rejected_too_old) == (1, 1)
    assert resp.refused == ("samples refused: 1 too old for their series: older than its newest sample by more than "
                            "the out-of-order window (1h)")
    resend = api.write(_req([(NOW + 1000, 2.0)]))  # a resend of a stored sample is no refusal
    assert (resend.rejected_duplicate, resend.refused) == (1, "")


def test_refused_samples_never_reach_the_wal(tmp_path: Path) -> None:
    clock = ManualClock(NOW)
    _, d = open_store(tmp_path / "d", durability=DurabilitySettings(fsync=FsyncPolicy.NEVER), clock=clock)
    api = d.api()
    assert api.write(_req([(NOW + DAY, 9.0), (NOW, 1.0)])).rejected_too_far_ahead == 1
    assert api.write(_req([(NOW + DAY, 9.0)], OTHER)).rejected_too_far_ahead == 1
    shutil.copytree(tmp_path / "d", tmp_path / "crash", ignore=shutil.ignore_patterns("LOCK"))  # what kill -9 leaves
    d.close(snapshot=False)
    again, d2 = open_store(tmp_path / "crash", durability=DurabilitySettings(fsync=FsyncPolicy.NEVER), clock=clock)
    try:
        assert _held(again) == [NOW] and again.index.row_of(series_id(OTHER)) is None
    finally:
        d2.close(snapshot=False)


async def test_write_parts_over_grpc_report_refused_samples_per_part_and_count_them_per_sender() -> None:
    store, clock = Store(), ManualClock(NOW)
    servicer = MetricsServicer(LocalBackend(StoreAPI(store, clock=clock)))
    server, port = await start_grpc_server(servicer, "127.0.0.1", 0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.MetricsStub(channel)
            bad = _req([(NOW, 1.0)], OTHER)
            bad.timestamps[:] = [NOW, NOW - 1][:1]
            bad.counts[:] = [2]  # counts do not add up: INVALID_ARGUMENT for this part alone
            parts = [_req([(NOW, 1.0)], OTHER), _req([(NOW, 1.0), (NOW + DAY, 2.0)]), bad]
            out = await stub.WriteParts(pb.WritePartsRequest(parts=parts), timeout=10)
            codes = [r.code for r in out.results]
            assert codes == [0, 0, grpc.StatusCode.INVALID_ARGUMENT.value[0]]
            assert (out.results[0].response.samples_written, out.results[0].response.refused) == (1, "")
            second = out.results[1].response
            assert (second.samples_written, second.rejected_too_far_ahead) == (1, 1)
            assert "1 too far ahead" in second.refused
            single = await stub.Write(_req([(NOW + 2 * DAY, 3.0)], OTHER), timeout=10)
            assert (single.samples_written, single.rejected_too_far_ahead) == (0, 1) and single.refused
    finally:
        await server.stop(None)
    assert servicer.refusals.counts == {("127.0.0.1", "too_far_ahead"): 2}
