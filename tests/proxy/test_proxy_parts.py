"""The proxy's parts on their own: hint queues, member health, the route cache, retries, kept read plans."""

from __future__ import annotations

import asyncio
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.clock import ManualClock
from metricsd.cluster.assign import assign
from metricsd.cluster.shardmap import Member, ShardMap
from metricsd.model import make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proxy.fanout import ReadPlans, plan_reads
from metricsd.proxy.handoff import HintedHandoff, MemberGone
from metricsd.proxy.health import MemberHealth
from metricsd.proxy.members import SlotNotHeld, call_with_retries
from metricsd.proxy.quorum import QuorumSettings
from metricsd.proxy.routing import KEY_MISSES_BEFORE_SKIP, KEY_RETRY_EVERY, Batch, KnownIds, SeriesRouter
from metricsd.proxy.settings import HandoffSettings, HealthSettings, ProxySettings
from metricsd.rpc.backend import BadRequest, Unavailable
from metricsd.rpc.columns import WriteColumns, varints
from metricsd.rpc.wire import labels_from_pb


def _hint(n: int) -> pb.WriteRequest:
    return pb.WriteRequest(ids=[1], counts=[n], timestamps=list(range(1, n + 1)), values=[0.5] * n)


class Deliveries:
    def __init__(self) -> None:
        self.ok = False
        self.gone = False
        self.got: list[int] = []

    async def __call__(self, member: str, request: pb.WriteRequest) -> None:
        if self.gone:
            raise MemberGone(member)
        if not self.ok:
            raise Unavailable("down")
        self.got.append(len(request.timestamps))


async def _until(cond: object) -> None:
    for _ in range(200):
        if cond():  # type: ignore[operator]
            return
        await asyncio.sleep(0.005)
    raise AssertionError("not reached")


async def test_hints_are_delivered_in_order_once_the_member_answers() -> None:
    counters: Counter[str] = Counter()
    deliver = Deliveries()
    h = HintedHandoff(HandoffSettings(retry_initial_s=0.005, retry_max_s=0.01), ManualClock(0), deliver, counters)
    for n in (1, 2, 3):
        assert h.add("a", _hint(n))
    await asyncio.sleep(0.03)
    assert h.pending()["a"][0] == 3 and deliver.got == []
    deliver.ok = True
    await _until(lambda: not h.pending())
    assert deliver.got == [1, 2, 3]
    assert counters["handoff_delivered"] == 3 and counters["handoff_dropped"] == 0
    assert h.add("a", _hint(4))  # a drained queue starts again
    await _until(lambda: deliver.got == [1, 2, 3, 4])
    await h.close()


async def test_hints_past_the_byte_bound_or_the_age_bound_are_dropped_and_counted() -> None:
    counters: Counter[str] = Counter()
    clock = ManualClock(0)
    size = _hint(10).ByteSize()
    h = HintedHandoff(HandoffSettings(max_bytes=2 * size, max_age_s=60, retry_initial_s=0.005, retry_max_s=0.01),
                      clock, Deliveries(), counters)
    assert h.add("a", _hint(10)) and h.add("a", _hint(10))
    assert not h.add("a", _hint(10))
    assert counters["handoff_dropped"] == 1 and counters["handoff_dropped_samples"] == 10
    clock.advance(61_000)
    assert h.add("a", _hint(5))  # the two old ones expire first, making room
    assert counters["handoff_dropped"] == 3 and h.pending()["a"] == (1, _hint(5).ByteSize())
    await h.close()


async def test_the_hints_of_a_member_that_left_the_map_are_dropped() -> None:
    counters: Counter[str] = Counter()
    deliver = Deliveries()
    deliver.gone = True
    h = HintedHandoff(HandoffSettings(), ManualClock(0), deliver, counters)
    h.add("a", _hint(2))
    h.add("a", _hint(3))
    await _until(lambda: not h.pending())
    assert counters["handoff_dropped"] == 2 and counters["handoff_dropped_samples"] == 5
    await h.close()


def test_a_failed_member_is_skipped_with_backoff_then_probed_once() -> None:
    clock = ManualClock(0)
    health = MemberHealth(HealthSettings(down_initial_s=1.0, down_max_s=4.0), clock)
    health.failure("a", "refused")
    assert health.healthy(["a", "b"]) == {"b"}
    assert health.down() == {"a": "refused"}
    clock.advance(1_000)
    assert health.is_healthy("a")  # the probe
    assert not health.is_healthy("a")  # only one at a time
    health.failure("a", "refused")  # the probe failed: back off for 2 s
    clock.advance(1_500)
    assert not health.is_healthy("a")
    clock.advance(600)
    assert health.is_healthy("a")
    health.success("a")
    assert health.is_healthy("a") and health.is_healthy("a") and health.down() == {}


def test_the_route_cache_checks_ids_and_stays_bounded() -> None:
    router = SeriesRouter(capacity=8)
    labels = [make_labels("m", {"namespace": "ns", "pod": f"p{i}"}) for i in range(20)]
    local = router.learn({series_id(lab): lab for lab in labels})
    assert len(router) <= 8 and router.evicted >= 12
    ids = [series_id(lab) for lab in labels]
    hashes, unknown = router.resolve(ids, local)  # the batch's own labels route it whole
    assert unknown == [] and len(hashes) == 20
    _, unknown = router.resolve(ids, {})
    assert 12 <= len(unknown) < 20
    with pytest.raises(BadRequest, match="does not match its labels"):
        router.learn({ids[0] ^ 1: labels[0]})


async def test_retries_back_off_on_unavailable_but_not_on_bad_requests_or_moved_slots() -> None:
    calls: list[str] = []

    def failing(exc: Exception):  # type: ignore[no-untyped-def]
        async def call() -> int:
            calls.append(type(exc).__name__)
            raise exc

        return call

    with pytest.raises(Unavailable):
        await call_with_retries(failing(Unavailable("x")), 1.0, 2, 0.001)
    assert calls == ["Unavailable"] * 3
    calls.clear()
    for exc in (BadRequest("bad"), SlotNotHeld("moved")):
        with pytest.raises(type(exc)):
            await call_with_retries(failing(exc), 1.0, 2, 0.001)
    assert calls == ["BadRequest", "NotOwner"]

    async def slow() -> int:
        await asyncio.sleep(1)
        return 1

    with pytest.raises(Unavailable, match=r"no answer within 0\.01 s"):
        await call_with_retries(slow, 0.01, 0, 0.001)


def test_quorum_sizes_come_from_the_map_and_bad_combinations_are_refused() -> None:
    s = ProxySettings(w=2, r=2)
    assert (s.quorum(3).w, s.quorum(3).r) == (2, 2)
    assert (s.quorum(1).w, s.quorum(1).r) == (1, 1)
    with pytest.raises(ValueError, match="R \\+ W must exceed RF"):
        s.quorum(5)


def test_a_cached_batch_routes_like_its_ids_and_is_forgotten_when_routes_are_evicted() -> None:
    router = SeriesRouter(capacity=16)
    labels = [make_labels("m", {"namespace": "ns", "pod": f"p{i}"}) for i in range(24)]
    entries = [(series_id(lab), lab) for lab in labels]
    router.learn(dict(entries[:10]))
    ids = np.array([sid for sid, _ in entries[:10]], dtype=np.uint64)
    want, unknown = router.resolve(ids.tolist(), {})
    assert unknown == []
    for _ in range(2):  # the first call fills the batch cache, the second answers from it
        got, unknown = router.resolve(ids, {}, ids.tobytes())
        assert unknown == [] and got.tolist() == want.tolist()
    router.learn(dict(entries[10:]))  # past capacity: routes evicted, and with them the cached batches
    assert router.evicted > 0
    _, unknown = router.resolve(ids, {}, ids.tobytes())
    assert unknown, "a cached batch still routed ids the router had evicted"


def test_the_batch_cache_stays_within_its_byte_budget() -> None:
    router = SeriesRouter(capacity=1000, batch_cache_bytes=1_000)
    labels = [make_labels("m", {"namespace": "ns", "pod": f"p{i}"}) for i in range(200)]
    router.learn({series_id(lab): lab for lab in labels})
    all_ids = np.array([series_id(lab) for lab in labels], dtype=np.uint64)
    for i in range(0, 200, 10):
        batch = all_ids[i : i + 10]
        router.resolve(batch, {}, batch.tobytes())
        assert router._batch_bytes <= 1_000


def test_known_ids_remember_complete_batches_until_a_member_forgets() -> None:
    known = KnownIds(limit=100)
    ids, key = [1, 2, 3], b"batch"
    assert known.missing("a", ids, key) == [1, 2, 3]
    known.add("a", ids)
    assert known.missing("a", ids, key) == []  # now complete, and remembered as such
    assert known.missing("a", [1, 2, 3, 4], b"other") == [4]
    known.discard("a", [2])  # the member restarted and said it forgot series 2
    assert known.missing("a", ids, key) == [2]
    known.add("a", [2])
    assert known.missing("a", ids, key) == []
    known.forget(["a"])
    assert known.missing("a", ids, key) == [1, 2, 3]


def test_known_ids_skip_batch_keys_while_they_keep_missing_and_take_them_back_at_a_hit() -> None:
    """A sender whose batches never repeat (a real Prometheus) stops costing a key a batch; one
    batch in KEY_RETRY_EVERY still gets one, and its first hit (batches repeating) brings keys back.
    The answers never depend on it."""
    known = KnownIds(limit=10_000)
    known.add("a", [1, 2, 3])
    for n in range(KEY_MISSES_BEFORE_SKIP):
        assert known.wants_key()
        assert known.missing("a", [1, 2, 3, 4], n.to_bytes(4, "little")) == [4]
    asked = [known.wants_key() for _ in range(4 * KEY_RETRY_EVERY)]
    assert asked.count(True) == 4
    assert known.missing("a", [1, 2, 3], b"repeated") == []  # complete: remembered under its key
    assert not known.wants_key()  # the remembering was no hit
    assert known.missing("a", [1, 2, 3], b"repeated") == []  # a hit
    assert all(known.wants_key() for _ in range(3 * KEY_RETRY_EVERY))
    assert known.missing("a", [1, 2, 3, 5], None) == [5]  # without a key: the same answer, from the ids


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=1, max_size=12), st.integers(1, 6), st.booleans(), st.booleans(),
       st.data())
def test_a_batch_part_in_bytes_is_its_series_and_labels_appended_as_bytes_merge(
        counts: list[int], num_slots: int, with_labels: bool, sender_stamps: bool, data: st.DataObject) -> None:
    """part_bytes(slots) parses to exactly the series of those slots, with their samples, whether it
    is the whole batch or a slice, with the timestamps the sender encoded or encoded afresh; the
    same slots give the same bytes object (encoded once for every member); labels_of(ids)
    appended to it give the part with its labels."""
    router = SeriesRouter(capacity=1000)
    labels = [make_labels("m", {"namespace": "ns", "pod": f"p{i}"}) for i in range(len(counts))]
    ids = np.array([series_id(lab) for lab in labels], dtype=np.uint64)
    stamps = np.concatenate([1_700_000_000_000 + np.arange(n) for n in counts]).astype(np.int64)
    values = np.concatenate([np.full(n, 0.5 * i) for i, n in enumerate(counts)])
    by_id = {series_id(lab): lab for lab in labels}
    columns = WriteColumns(ids, np.array(counts, dtype=np.int64), stamps, values, by_id if with_labels else {},
                           varints(stamps.view(np.uint64)) if sender_stamps else None)
    local = router.learn(columns.labels) if with_labels else {}
    if not with_labels:
        router.learn(by_id)
    hashes, unknown = router.resolve(ids, local)
    assert unknown == []
    batch = Batch.of(columns, router, local, hashes, num_slots)
    every = batch.slot_set()
    slots = sorted(data.draw(st.sets(st.sampled_from(every), min_size=1)))
    raw, part_ids = batch.part_bytes(slots)
    sub = pb.WriteRequest.FromString(raw)
    keep = np.isin(batch.slots, slots)
    assert list(sub.ids) == ids[keep].tolist() == part_ids.tolist() and not sub.series
    assert list(sub.counts) == np.array(counts)[keep].tolist()
    per_sample = np.repeat(keep, counts)
    assert list(sub.timestamps) == stamps[per_sample].tolist() and list(sub.values) == values[per_sample].tolist()
    assert batch.part_bytes(list(slots))[0] is raw
    merged = pb.WriteRequest.FromString(raw + batch.labels_of(part_ids))
    assert {s.id: labels_from_pb(s.labels) for s in merged.series} == {i: by_id[i] for i in part_ids.tolist()}
    hint, hint_ids = batch.sub_request(slots)
    assert hint == sub and hint_ids is part_ids


class _PlanView:
    """What plan_reads and ReadPlans ask of a ClusterView: health, rotation, quorum sizes."""

    def __init__(self, clock: ManualClock) -> None:
        self.health = MemberHealth(HealthSettings(), clock)
        self.settings = ProxySettings()
        self._turn = 0

    def rotation(self) -> int:
        self._turn += 1
        return self._turn

    def quorum(self, shard_map: ShardMap) -> QuorumSettings:
        return self.settings.quorum(shard_map.rf)


def test_kept_read_plans_are_the_plans_of_each_rotation_until_health_changes() -> None:
    members = [Member(m, f"127.0.0.1:{7401 + i}") for i, m in enumerate("abcd")]
    shard_map = assign(members, None, 16, 3)
    kept_view, fresh_view = _PlanView(ManualClock()), _PlanView(ManualClock())
    kept = ReadPlans()
    slots = [0, 3, 7, 15]
    for _ in range(14):  # past the 6 distinct turns of RF 3
        assert kept.plans(kept_view, shard_map, slots) == plan_reads(fresh_view, shard_map, slots)
    for view in (kept_view, fresh_view):
        view.health.failure("b", "refused")
    for _ in range(7):
        got = kept.plans(kept_view, shard_map, slots)
        assert got == plan_reads(fresh_view, shard_map, slots)
        assert all("b" not in p.targets for p in got)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["missing", "missing", "add", "discard", "forget"]),
                          st.sampled_from(["a", "b", "c"]), st.integers(0, 3),
                          st.lists(st.integers(0, 12), max_size=8)), max_size=40))
def test_known_ids_answer_as_a_set_per_member(ops: list[tuple[str, str, int, list[int]]]) -> None:
    """KnownIds' one mask dict for all members answers as one set per member would, whatever the
    order of adds, discards and forgets, with the ids asked as the same array (a batch's members)
    or as new ones; a member past the limit forgets all it knew. The ids known to every member
    (the shortcut's set) stay exactly the members' sets' intersection."""
    limit = 20
    known = KnownIds(limit=limit)
    model: dict[str, set[int]] = {}
    arrays = [np.array(sorted(set(x)), dtype=np.uint64) for x in ([1, 2, 3], [2, 5, 8, 11], [0, 12], [])]
    for op, member, which, ids in ops:
        if op == "missing":
            asked = arrays[which] if which < len(arrays) else np.array(ids, dtype=np.uint64)
            expect = [int(i) for i in asked.tolist() if int(i) not in model.get(member, set())]
            assert known.missing(member, asked) == expect
            assert known.missing(member, asked, asked.tobytes() + member.encode()) == expect
        elif op == "add":
            m = model.setdefault(member, set())
            m.update(ids)
            known.add(member, ids)
            if len(m) > limit:
                m.clear()
        elif op == "discard":
            model.get(member, set()).difference_update(ids)
            known.discard(member, ids)
        else:
            model.pop(member, None)
            known.forget([member])
        # the ids every member knows, kept for the shortcut: exactly those (a superset would send
        # a batch without labels; a subset only costs the masks' walk)
        assert known._everyone == (set.intersection(*model.values()) if model else set())


def test_known_ids_of_many_series_are_forgotten_past_the_limit() -> None:
    known = KnownIds(limit=100)
    known.add("a", range(60))
    known.add("b", range(60))
    assert known.missing("a", np.arange(60, dtype=np.uint64)) == []
    known.add("a", range(60, 101))  # 101 ids: past the limit, "a" forgets them all
    assert known.missing("a", [1, 100]) == [1, 100]
    assert known.missing("b", [1, 100]) == [100]


def test_known_ids_asked_again_with_the_same_array_see_a_discard() -> None:
    """The ids of one batch are asked for each member as one array: the masks looked up for it are
    reused only while nothing changed."""
    known = KnownIds(limit=100)
    batch = np.array([1, 2, 3], dtype=np.uint64)
    known.add("a", [1, 2, 3])
    known.add("b", [1, 2])
    assert known.missing("a", batch) == [] and known.missing("b", batch) == [3]
    known.discard("a", [2])
    assert known.missing("a", batch) == [2]
    known.add("b", [3])
    assert known.missing("b", batch) == []
    known.forget(["b"])
    assert known.missing("b", batch) == [1, 2, 3]


def test_series_router_routes_learnt_ids_cached_and_forgets_them_past_its_capacity() -> None:
    """resolve() from the cache alone (a batch of known ids, also in an order never seen), from a
    batch's own labels mixed with cached ids, unknown ids named; labels_of from both; past the
    capacity the oldest eighth is forgotten, hash and labels together."""
    from metricsd.maths.slots import pod_hash
    from metricsd.model import pod_key
    from metricsd.rpc.columns import labels_entry

    router = SeriesRouter(capacity=16)
    labels = [make_labels("m", {"namespace": "ns", "pod": f"p{i}"}) for i in range(20)]
    ids = [series_id(lab) for lab in labels]
    want = {sid: pod_hash(pod_key(lab)) for sid, lab in zip(ids, labels, strict=True)}
    router.learn({sid: labels[i] for i, sid in enumerate(ids[:8])})
    order = np.array(ids[7::-1], dtype=np.uint64)
    hashes, unknown = router.resolve(order, {}, order.tobytes())
    assert unknown == [] and hashes.tolist() == [want[i] for i in ids[7::-1]]
    local = router.learn({ids[9]: labels[9]})
    hashes, unknown = router.resolve([ids[0], ids[9]], local)
    assert unknown == [] and hashes.tolist() == [want[ids[0]], want[ids[9]]]
    assert router.resolve([ids[0], ids[12]], {})[1] == [ids[12]]
    assert router.labels_of([ids[0], ids[12], ids[9]], local) == (labels_entry(ids[0], labels[0])
                                                                  + labels_entry(ids[9], labels[9]))
    router.learn({sid: labels[i] for i, sid in enumerate(ids) if i >= 10})  # full twice: 2 oldest go each time
    assert len(router) == 15 and router.evicted == 4
    assert router.resolve([ids[3]], {})[1] == [ids[3]] and router.labels_of([ids[3]], {}) == b""
    assert router.labels_of([ids[4]], {}) == labels_entry(ids[4], labels[4])
    assert router.resolve([ids[19]], {})[0].tolist() == [want[ids[19]]]


def test_known_ids_member_bits_stay_bounded_as_members_come_and_go() -> None:
    """Each member forgotten leaves its bit unused; past MAX_BIT everything is forgotten once (labels
    sent again), so masks stay machine-sized, and answers stay right throughout."""
    from metricsd.proxy.routing import MAX_BIT

    known = KnownIds(limit=100)
    for k in range(200):
        known.add(f"m{k}", [1, 2])
        known.add("steady", [3])
        assert known.missing(f"m{k}", [1, 2, 3]) == [3]
        assert known.missing("steady", [3, 4]) == [4]
        known.forget([f"m{k}"])
        assert known.missing(f"m{k}", [1]) == [1]
    assert known._next_bit <= 2 * MAX_BIT and max(known._masks.values()) <= 2 * MAX_BIT
