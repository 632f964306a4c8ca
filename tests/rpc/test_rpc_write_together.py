"""A store writes consecutive parts of one WriteParts message as one store write (store/api.py
``write_together``) when nothing can tell: every part still gets the answer its own Write would
have had, and where parts could tell (a series in two parts, an unknown id, a bad part, a refused
sample, labels) they are written one by one. Over real loopback gRPC, and through a WAL restart."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from metricsd.clock import ManualClock
from metricsd.model import make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proto import metricsd_pb2_grpc as pb_grpc
from metricsd.rpc.server import start_grpc_server
from metricsd.rpc.servicer import MetricsServicer
from metricsd.rpc.wire import labels_to_pb
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.durable import open_store
from metricsd.store.engine import Store
from metricsd.store.settings import StoreSettings

T0 = 1_700_000_000_000
PODS = [make_labels("container_cpu_usage_seconds_total", {"namespace": "ns", "pod": f"p{i}"}) for i in range(8)]
IDS = [series_id(lab) for lab in PODS]


def ids_only(pods: list[int], ts: list[int], value: float = 1.0) -> pb.WriteRequest:
    """One sample run ``ts`` for each of ``pods``, without labels (the agents' shape once known)."""
    return pb.WriteRequest(ids=[IDS[p] for p in pods], counts=[len(ts)] * len(pods), timestamps=ts * len(pods),
                           values=[value] * (len(ts) * len(pods)))


def introduce(api: StoreAPI) -> None:
    req = pb.WriteRequest(ids=IDS, counts=[1] * len(IDS), timestamps=[T0] * len(IDS), values=[0.0] * len(IDS))
    for sid, lab in zip(IDS, PODS, strict=True):
        req.series.add(id=sid).labels.extend(labels_to_pb(lab))
    assert api.write(req).samples_written == len(IDS)


def held(store: Store, pod: int) -> list[int]:
    row = store.index.row_of(IDS[pod])
    assert row is not None
    return store.series_samples(row, 0, 2**62)[0].tolist()


@pytest.fixture
async def served() -> AsyncIterator[tuple[Store, pb_grpc.MetricsStub]]:
    s = Store(StoreSettings(ooo_window_ms=10 * 60_000))
    api = StoreAPI(s, clock=ManualClock(T0 + 30 * 60_000))
    introduce(api)
    server, port = await start_grpc_server(MetricsServicer(LocalBackend(api)), "127.0.0.1", 0)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    yield s, pb_grpc.MetricsStub(channel)
    await channel.close(None)
    await server.stop(None)


async def test_disjoint_parts_are_one_store_write_and_each_gets_its_own_answer(
        served: tuple[Store, pb_grpc.MetricsStub]) -> None:
    s, stub = served
    before = s._generation
    parts = [ids_only([0, 1], [T0 + 10_000]), ids_only([2, 3, 4], [T0 + 10_000, T0 + 20_000]),
             ids_only([5], [T0 + 10_000])]
    resp = await stub.WriteParts(pb.WritePartsRequest(parts=parts))
    assert [(r.code, r.response.samples_written) for r in resp.results] == [(0, 2), (0, 6), (0, 1)]
    assert s._generation == before + 1  # one apply for the three parts
    assert held(s, 3) == [T0, T0 + 10_000, T0 + 20_000] and held(s, 5) == [T0, T0 + 10_000]


async def test_duplicates_and_too_old_samples_are_counted_in_the_part_that_sent_them(
        served: tuple[Store, pb_grpc.MetricsStub]) -> None:
    s, stub = served
    await stub.WriteParts(pb.WritePartsRequest(parts=[ids_only([0, 1, 2, 3], [T0 + 20 * 60_000])]))
    parts = [ids_only([0], [T0 + 21 * 60_000]),
             ids_only([1, 2], [T0 + 20 * 60_000, T0 + 22 * 60_000]),  # each: a duplicate, then a new sample
             ids_only([4], [T0 + 10_000]),
             ids_only([3], [T0 + 10_000])]  # 20 minutes older than p3's newest: past the 10 m window
    before = s._generation
    resp = await stub.WriteParts(pb.WritePartsRequest(parts=parts))
    got = [(r.response.samples_written, r.response.rejected_duplicate, r.response.rejected_too_old)
           for r in resp.results]
    assert got == [(1, 0, 0), (2, 2, 0), (1, 0, 0), (0, 0, 1)]
    assert "1 too old for their series" in resp.results[3].response.refused and not resp.results[2].response.refused
    assert s._generation == before + 1
    assert held(s, 1) == [T0, T0 + 20 * 60_000, T0 + 22 * 60_000]


async def test_a_series_in_two_parts_is_written_part_by_part_in_order(
        served: tuple[Store, pb_grpc.MetricsStub]) -> None:
    s, stub = served
    before = s._generation
    parts = [ids_only([0, 1], [T0 + 10_000]), ids_only([1], [T0 + 20_000]), ids_only([2], [T0 + 10_000])]
    resp = await stub.WriteParts(pb.WritePartsRequest(parts=parts))
    assert [r.response.samples_written for r in resp.results] == [1 + 1, 1, 1]
    assert held(s, 1) == [T0, T0 + 10_000, T0 + 20_000]
    assert s._generation == before + 2  # the first part alone, then the other two together


async def test_an_unknown_id_or_a_bad_part_leaves_the_others_written_and_counts_once(
        served: tuple[Store, pb_grpc.MetricsStub]) -> None:
    s, stub = served
    unknown = pb.WriteRequest(ids=[12345], counts=[1], timestamps=[T0 + 10_000], values=[1.0])
    bad = ids_only([3], [T0 + 20_000, T0 + 20_000])  # timestamps not increasing
    parts = [ids_only([0], [T0 + 10_000]), unknown, ids_only([1], [T0 + 10_000]), bad, ids_only([2], [T0 + 10_000])]
    resp = await stub.WriteParts(pb.WritePartsRequest(parts=parts))
    assert [r.code for r in resp.results] == [0, 0, 0, grpc.StatusCode.INVALID_ARGUMENT.value[0], 0]
    assert list(resp.results[1].response.unknown_ids) == [12345]
    assert "must strictly increase" in resp.results[3].message
    assert [r.response.samples_written for r in resp.results] == [1, 0, 1, 0, 1]
    assert held(s, 3) == [T0]  # nothing of the bad part
    assert dict(s.refused) == {"invalid": 2}


async def test_malformed_parts_are_refused_each_even_when_together_they_would_add_up(
        served: tuple[Store, pb_grpc.MetricsStub]) -> None:
    s, stub = served
    ts = [T0 + 10_000, T0 + 20_000]
    short = pb.WriteRequest(ids=[IDS[0], IDS[1]], counts=[2], timestamps=ts, values=[1.0, 2.0])  # ids 2, counts 1
    long = pb.WriteRequest(ids=[IDS[2]], counts=[0, 2], timestamps=ts, values=[1.0, 2.0])  # ids 1, counts 2
    uneven = pb.WriteRequest(ids=[IDS[3]], counts=[1], timestamps=ts, values=[1.0, 2.0])  # 1 counted, 2 sent
    under = pb.WriteRequest(ids=[IDS[4]], counts=[3], timestamps=[T0 + 30_000, T0 + 40_000], values=[1.0, 2.0])
    for parts in ([short, long], [uneven, under]):
        resp = await stub.WriteParts(pb.WritePartsRequest(parts=parts))
        assert [r.code for r in resp.results] == [grpc.StatusCode.INVALID_ARGUMENT.value[0]] * 2
    assert [held(s, p) for p in range(5)] == [[T0]] * 5


async def test_a_sample_the_store_refuses_outright_is_refused_in_its_own_part_only(
        served: tuple[Store, pb_grpc.MetricsStub]) -> None:
    s, stub = served
    ahead = ids_only([1], [T0 + 86_400_000])  # most of a day after the store's clock
    parts = [ids_only([0], [T0 + 10_000]), ahead, ids_only([2], [T0 + 10_000])]
    resp = await stub.WriteParts(pb.WritePartsRequest(parts=parts))
    got = [(r.response.samples_written, r.response.rejected_too_far_ahead) for r in resp.results]
    assert got == [(1, 0), (0, 1), (1, 0)]
    assert s.refused["too_far_ahead"] == 1 and held(s, 1) == [T0]


async def test_parts_together_stay_within_the_request_limits() -> None:
    s = Store(StoreSettings())
    api = StoreAPI(s, clock=ManualClock(T0 + 60_000))
    introduce(api)
    limit = s.settings.request_limits.max_series
    assert limit, "the default limits bound a request's series"
    parts = [ids_only([0], [T0 + 10_000]), ids_only([1], [T0 + 10_000])]
    assert len(api.write_together(parts)) == 2
    many = pb.WriteRequest(ids=np.arange(1, limit + 1, dtype=np.uint64).tolist(), counts=[0] * limit)
    assert api.write_together([ids_only([2], [T0 + 10_000]), many]) == []  # together they pass the limit


async def test_a_durable_store_logs_parts_written_together_and_replays_them(tmp_path: Path) -> None:
    _, durability = open_store(tmp_path / "d", fsync="never")
    api = durability.api()
    introduce(api)
    parts = [ids_only([0, 1], [T0 + 10_000]), ids_only([2], [T0 + 10_000, T0 + 20_000])]
    servicer = MetricsServicer(LocalBackend(api))
    resp = await servicer._write_parts(pb.WritePartsRequest(parts=parts))
    assert [r.response.samples_written for r in resp.results] == [2, 2]
    durability.close(snapshot=False)
    again, d2 = open_store(tmp_path / "d", fsync="never")
    try:
        assert held(again, 2) == [T0, T0 + 10_000, T0 + 20_000] and held(again, 0) == [T0, T0 + 10_000]
    finally:
        d2.close(snapshot=False)


def test_the_index_remembers_each_part_not_the_parts_that_came_together() -> None:
    """An agent's batch arrives every tick, but with different neighbours in the proxy's messages:
    the rows of a write of parts are looked up, and remembered, part by part."""
    labels = [make_labels("cpu", {"namespace": "ns", "pod": f"q{i}"}) for i in range(200)]
    ids = [series_id(lab) for lab in labels]
    s = Store()
    api = StoreAPI(s, clock=ManualClock(T0 + 60_000))
    req = pb.WriteRequest(ids=ids, counts=[1] * 200, timestamps=[T0] * 200, values=[0.0] * 200)
    for sid, lab in zip(ids, labels, strict=True):
        req.series.add(id=sid).labels.extend(labels_to_pb(lab))
    api.write(req)
    s.index._batch_rows.clear()
    a, b = (pb.WriteRequest(ids=part, counts=[1] * 100, timestamps=[T0 + 10_000] * 100, values=[1.0] * 100)
            for part in (ids[:100], ids[100:]))
    assert [r.samples_written for r in api.write_together([a, b])] == [100, 100]
    a.timestamps[:] = b.timestamps[:] = [T0 + 15_000] * 100  # the parts again: a batch seen twice is remembered
    assert [r.samples_written for r in api.write_together([a, b])] == [100, 100]
    remembered = set(s.index._batch_rows)
    assert remembered == {hash(np.array(part, np.uint64).tobytes()) for part in (ids[:100], ids[100:])}
    again = pb.WriteRequest(ids=[ids[5]], counts=[1], timestamps=[T0 + 20_000], values=[1.0])
    assert api.write_together([again, again]) == []  # the same series in two parts: part by part


def test_parts_go_together_up_to_a_bound_on_their_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    import metricsd.store.api

    monkeypatch.setattr(metricsd.store.api, "TOGETHER_MAX_SAMPLES", 4)
    s = Store()
    api = StoreAPI(s, clock=ManualClock(T0 + 60_000))
    introduce(api)
    ts = [T0 + 10_000, T0 + 20_000]
    parts = [ids_only([0], ts), ids_only([1], ts), ids_only([2], ts)]
    assert [r.samples_written for r in api.write_together(parts)] == [2, 2]  # not the third
    five = [T0 + 10_000 * k for k in range(1, 6)]
    assert api.write_together([ids_only([3], five), ids_only([4], ts)]) == []  # a first part past it goes alone
