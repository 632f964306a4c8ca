"""A cluster store refuses slots its shard map does not give it, naming the slot and the map version."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from metricsd.cluster.mapsource import StaticMapSource
from metricsd.cluster.shardmap import Member, ShardMap
from metricsd.maths.slots import slot_of
from metricsd.model import make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proto import metricsd_pb2_grpc as pb_grpc
from metricsd.replica.ownership import OwnershipBackend, store_write_slots
from metricsd.rpc.backend import NotOwner, Unavailable
from metricsd.rpc.client import GrpcBackend
from metricsd.rpc.health import (
    HEALTH_SERVICE,
    NOT_SERVING,
    SERVING,
    decode_check_request,
    encode_check_response,
    start_cluster_grpc,
)
from metricsd.rpc.server import GRPC_OPTIONS
from metricsd.rpc.servicer import MetricsServicer
from metricsd.rpc.wire import labels_to_pb
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store

SLOTS = 8


def two_member_map(version: int = 3) -> ShardMap:
    """store-a holds the even slots, store-b the odd ones."""
    members = {m: Member(m, f"127.0.0.1:{port}") for m, port in (("store-a", 7001), ("store-b", 7002))}
    slots = tuple(("store-a",) if i % 2 == 0 else ("store-b",) for i in range(SLOTS))
    return ShardMap(version=version, rf=1, slots=slots, members=members)


def pod_in_slot(parity: int) -> str:
    """A pod name whose slot has the given parity."""
    for i in range(1000):
        if slot_of(f"ns/pod-{i}", SLOTS) % 2 == parity:
            return f"pod-{i}"
    raise AssertionError("no pod found")


def write_of(pod: str, with_labels: bool = True, ts: int = 1000) -> pb.WriteRequest:
    labels = make_labels("cpu", {"namespace": "ns", "pod": pod})
    sid = series_id(labels)
    req = pb.WriteRequest(ids=[sid], counts=[1], timestamps=[ts], values=[1.0])
    if with_labels:
        req.series.add(id=sid).labels.extend(labels_to_pb(labels))
    return req


def backend_for(member: str, shard_map: ShardMap | None) -> tuple[OwnershipBackend, StaticMapSource, Store]:
    store = Store()
    source = StaticMapSource(shard_map if shard_map is not None else two_member_map())
    if shard_map is None:
        source.set(None)  # type: ignore[arg-type]  # no map yet
    backend = OwnershipBackend(LocalBackend(StoreAPI(store, member)), member, source, store_write_slots(store))
    return backend, source, store


async def test_a_write_of_a_held_slot_is_stored() -> None:
    backend, _, store = backend_for("store-a", two_member_map())
    resp = await backend.write(write_of(pod_in_slot(0)))
    assert resp.samples_written == 1 and store.index.n_alive == 1


async def test_a_write_of_a_slot_not_held_is_refused_naming_the_slot_and_version() -> None:
    backend, _, store = backend_for("store-a", two_member_map(version=3))
    pod = pod_in_slot(1)
    with pytest.raises(NotOwner) as e:
        await backend.write(write_of(pod))
    slot = slot_of(f"ns/{pod}", SLOTS)
    assert str(e.value) == (f"member store-a does not hold slot {slot} in shard map version 3 (it holds 4 of 8); "
                            "write refused")
    assert store.index.n_alive == 0 and backend.refused == 1


async def test_a_write_by_id_only_is_checked_against_the_series_the_store_knows() -> None:
    backend, source, _ = backend_for("store-a", two_member_map())
    pod = pod_in_slot(0)
    await backend.write(write_of(pod))
    # The map moves the slot away: a label-less resend by id is now refused too.
    moved = tuple(("store-b",) for _ in range(SLOTS))
    source.set(ShardMap(version=4, rf=1, slots=moved, members=two_member_map().members))
    with pytest.raises(NotOwner, match="version 4"):
        await backend.write(write_of(pod, with_labels=False, ts=2000))


async def test_a_member_holding_every_slot_works_out_no_slots_until_the_map_takes_one_away() -> None:
    """RF = stores (`cluster up`: 3 stores, RF 3): every write and read passes unchecked; once a map
    takes a slot away, they are checked again and a write or read of that slot is refused."""
    every = ShardMap(version=5, rf=1, slots=tuple(("store-a",) for _ in range(SLOTS)),
                     members=two_member_map().members)
    store = Store()
    source = StaticMapSource(every)
    asked: list[int] = []
    slots_of = store_write_slots(store)

    def counting(request: pb.WriteRequest, slot_count: int) -> np.ndarray:
        asked.append(len(request.ids))
        return slots_of(request, slot_count)

    backend = OwnershipBackend(LocalBackend(StoreAPI(store, "store-a")), "store-a", source, counting)
    for parity in (0, 1):
        assert (await backend.write(write_of(pod_in_slot(parity)))).samples_written == 1
    assert asked == [] and store.index.n_alive == 2
    cpu = [pb.Matcher(name="__name__", value="cpu")]
    every_slot = pb.SlotFilter(slot_count=SLOTS, slots=list(range(SLOTS)))
    for read in (backend.read, backend.read_columns):  # reads of any slot pass unchecked too
        got = await read(pb.ReadRequest(matchers=cpu, start_ms=0, end_ms=5000, slots=every_slot))
        assert len(got.series if isinstance(got, pb.ReadResponse) else got) == 2
    with pytest.raises(NotOwner, match="slot_count 16"):  # but not a filter of another slot count
        await backend.read(pb.ReadRequest(matchers=cpu, end_ms=1, slots=pb.SlotFilter(slot_count=16, slots=[0])))
    source.set(two_member_map(version=6))
    with pytest.raises(NotOwner, match="version 6"):
        await backend.write(write_of(pod_in_slot(1), ts=2000))
    assert asked == [1]
    with pytest.raises(NotOwner, match="does not hold slots 1, 3, 5, 7 in shard map version 6"):
        await backend.read_columns(pb.ReadRequest(matchers=cpu, end_ms=5000, slots=every_slot))


async def test_a_member_given_every_slot_by_a_new_map_still_refuses_reads_it_has_not_caught_up() -> None:
    """A store back in a 3-store RF 3 cluster gains every slot at once: holding every slot must not
    let reads of those slots pass unchecked before its catch-up (metricsd/replica/readiness.py)."""
    source = StaticMapSource(two_member_map(version=6))
    backend = OwnershipBackend(LocalBackend(StoreAPI(Store(), "store-a")), "store-a", source,
                               store_write_slots(Store()), catch_up_wait_s=0.0)
    cpu = [pb.Matcher(name="__name__", value="cpu")]
    await backend.read(pb.ReadRequest(matchers=cpu, end_ms=1, slots=pb.SlotFilter(slot_count=SLOTS, slots=[0])))
    source.set(ShardMap(version=7, rf=1, slots=tuple(("store-a",) for _ in range(SLOTS)),
                        members=two_member_map().members))
    with pytest.raises(NotOwner, match="still catching up slots 1, 3, 5, 7, given to it in shard map version 7"):
        await backend.read(pb.ReadRequest(matchers=cpu, end_ms=1, slots=pb.SlotFilter(slot_count=SLOTS,
                                                                                      slots=list(range(SLOTS)))))
    backend.readiness.level(range(SLOTS))
    await backend.read(pb.ReadRequest(matchers=cpu, end_ms=1, slots=pb.SlotFilter(slot_count=SLOTS, slots=[1])))


async def test_an_unknown_id_without_labels_is_left_to_the_store_which_asks_for_labels() -> None:
    backend, _, _ = backend_for("store-a", two_member_map())
    resp = await backend.write(write_of(pod_in_slot(1), with_labels=False))
    assert len(resp.unknown_ids) == 1 and resp.samples_written == 0


@pytest.mark.parametrize("kind", ["read", "aggregate", "list_series", "label_values", "rollups"])
async def test_requests_naming_a_slot_not_held_are_refused(kind: str) -> None:
    backend, _, _ = backend_for("store-a", two_member_map())
    f = pb.SlotFilter(slot_count=SLOTS, slots=[0, 2, 3])
    m = [pb.Matcher(name="__name__", value="cpu")]
    call = {
        "read": lambda: backend.read(pb.ReadRequest(matchers=m, start_ms=0, end_ms=10, slots=f)),
        "rollups": lambda: backend.rollups(pb.ReadRequest(matchers=m, start_ms=0, end_ms=10, slots=f)),
        "aggregate": lambda: backend.aggregate(pb.AggregateRequest(
            query=pb.AggregateQuery(matchers=m, series_fn=pb.SERIES_LAST, window_ms=1000),
            across=pb.ACROSS_SUM, start_ms=10, end_ms=10, slots=f)),
        "list_series": lambda: backend.list_series(pb.ListSeriesRequest(matchers=m, slots=f)),
        "label_values": lambda: backend.label_values(pb.LabelValuesRequest(name="pod", slots=f)),
    }[kind]
    with pytest.raises(NotOwner, match=r"does not hold slot 3 in shard map version 3"):
        await call()


async def test_held_slots_and_unfiltered_requests_are_served() -> None:
    backend, _, _ = backend_for("store-a", two_member_map())
    pod = pod_in_slot(0)
    await backend.write(write_of(pod))
    held = pb.SlotFilter(slot_count=SLOTS, slots=[0, 2, 4, 6])
    got = await backend.read(pb.ReadRequest(start_ms=0, end_ms=5000, slots=held,
                                            matchers=[pb.Matcher(name="__name__", value="cpu")]))
    assert [s.timestamps[0] for s in got.series] == [1000]
    unfiltered = await backend.read(pb.ReadRequest(start_ms=0, end_ms=5000,
                                                   matchers=[pb.Matcher(name="__name__", value="cpu")]))
    assert len(unfiltered.series) == 1


async def test_a_filter_with_another_slot_count_is_refused() -> None:
    backend, _, _ = backend_for("store-a", two_member_map())
    with pytest.raises(NotOwner, match="slot_count 16 but shard map version 3 has 8 slots"):
        await backend.read(pb.ReadRequest(start_ms=0, end_ms=1, slots=pb.SlotFilter(slot_count=16, slots=[0])))


async def test_without_a_map_data_requests_are_unavailable_but_health_answers() -> None:
    backend, _, _ = backend_for("store-a", None)
    with pytest.raises(Unavailable, match="no shard map yet") as e:
        await backend.write(write_of(pod_in_slot(0)))
    assert not isinstance(e.value, NotOwner)
    assert (await backend.health()).status == pb.HealthResponse.NOT_SERVING


def test_health_check_messages_round_trip_by_hand() -> None:
    assert decode_check_request(b"") == ""
    assert decode_check_request(b"\x0a\x08liveness") == "liveness"
    assert encode_check_response(SERVING) == b"\x08\x01"


async def test_over_grpc_a_refused_slot_is_failed_precondition_and_health_is_served() -> None:
    backend, _, _ = backend_for("store-b", two_member_map())
    server, port = await start_cluster_grpc(MetricsServicer(backend), backend, "127.0.0.1", 0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS) as ch:
            stub = pb_grpc.MetricsStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.Write(write_of(pod_in_slot(0)))
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "member store-b does not hold slot" in (e.value.details() or "")
            with pytest.raises(NotOwner, match="Write: member store-b does not hold slot"):
                await GrpcBackend(stub).write(write_of(pod_in_slot(0)))
            check = ch.unary_unary(f"/{HEALTH_SERVICE}/Check", None, None)
            assert await check(b"") == encode_check_response(SERVING)
            assert await check(b"\x0a\x08liveness") == encode_check_response(SERVING)
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await check(b"\x0a\x03foo")
            assert e.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        await server.stop(None)


async def test_the_readiness_check_fails_while_the_store_has_no_map() -> None:
    backend, _, _ = backend_for("store-a", None)
    server, port = await start_cluster_grpc(MetricsServicer(backend), backend, "127.0.0.1", 0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            check = ch.unary_unary(f"/{HEALTH_SERVICE}/Check", None, None)
            assert await check(b"\x0a\x09readiness") == encode_check_response(NOT_SERVING)
            assert await check(b"\x0a\x08liveness") == encode_check_response(SERVING)
    finally:
        await server.stop(None)


async def test_read_selection_refuses_a_slot_not_held_and_answers_held_ones_as_read_columns() -> None:
    """The whole query's in-process read (http/wholequery.py SlotScoped -> read_selection) is
    checked as a read is: a slot not held refused, held slots and no filter answered as read_columns."""
    from metricsd.maths.slots import SlotFilter
    from metricsd.selector import parse_selector

    backend, _, _ = backend_for("store-a", two_member_map())
    await backend.write(write_of(pod_in_slot(0)))
    matchers = parse_selector("", "cpu")
    with pytest.raises(NotOwner, match=r"does not hold slot 3 in shard map version 3"):
        await backend.read_selection(matchers, 0, 5000, slots=SlotFilter(SLOTS, (0, 2, 3)))
    for slots in (None, SlotFilter(SLOTS, (0, 2, 4, 6)), SlotFilter(SLOTS, (2,))):
        got = await backend.read_selection(matchers, 0, 5000, slots=slots)
        f = pb.SlotFilter() if slots is None else pb.SlotFilter(slot_count=SLOTS, slots=slots.slots)
        want = await backend.read_columns(pb.ReadRequest(matchers=[pb.Matcher(name="__name__", value="cpu")],
                                                         start_ms=0, end_ms=5000, slots=f))
        assert got.ids is not None and want.ids is not None
        assert got.ids.tolist() == want.ids.tolist() and got.timestamps.tolist() == want.timestamps.tolist()
        assert len(got) == (0 if slots is not None and slots.slots == (2,) else 1)


async def test_a_cluster_stores_whole_query_reads_by_selection_not_by_a_read_request() -> None:
    """A QUERY frame's PromQL prefetch in a cluster store reaches the store's read_selection through
    the ownership check, not the ReadRequest detour (read_columns), and still answers the series."""
    from metricsd.http.wholequery import SlotScoped
    from metricsd.promql.queries import QueryRunner

    backend, _, _ = backend_for("store-a", two_member_map())
    for ts in range(1000, 200_000, 10_000):
        await backend.write(write_of(pod_in_slot(0), ts=ts))

    async def no_detour(request: pb.ReadRequest) -> object:
        raise AssertionError("read_columns: the ReadRequest detour")

    backend.read_columns = no_detour  # type: ignore[method-assign]
    runner = QueryRunner(SlotScoped(backend))
    result, _ = await runner.range(f'rate(cpu{{pod="{pod_in_slot(0)}"}}[1m])', 100_000, 190_000, 10_000)
    assert len(result.series) == 1
