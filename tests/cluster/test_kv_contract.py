"""The KV contract: every implementation of metricsd.cluster.kv.KV must pass these.

The ``kv`` / ``kv_factory`` fixtures (conftest.py) are parametrised over the implementations.
Tests that stop etcd itself use a private server and the etcd implementation directly.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

import pytest

from metricsd.cluster.etcd_kv import EtcdKV, EtcdSettings
from metricsd.cluster.etcd_server import EtcdServer
from metricsd.cluster.kv import KV, EventType, KeyValue, Lease, WatchCompacted, WatchEvent

EtcdClient = Callable[[EtcdServer], EtcdKV]


async def take(events: AsyncIterator[WatchEvent], n: int, timeout_s: float = 10.0) -> list[WatchEvent]:
    out: list[WatchEvent] = []

    async def collect() -> None:
        async for event in events:
            out.append(event)
            if len(out) == n:
                return

    await asyncio.wait_for(collect(), timeout_s)
    return out


async def eventually_absent(kv: KV, key: str, within_s: float) -> float:
    """Poll until ``key`` is gone; return how long it took. Lease expiry is etcd's real time."""
    start = time.monotonic()
    while await kv.get(key) is not None:
        if time.monotonic() - start > within_s:
            raise AssertionError(f"{key} still present after {within_s}s")
        await asyncio.sleep(0.1)
    return time.monotonic() - start


async def test_get_of_an_absent_key_is_none(kv: KV, prefix: str) -> None:
    assert await kv.get(prefix + "nothing") is None


async def test_put_then_get_returns_the_value_and_the_revision_of_the_put(kv: KV, prefix: str) -> None:
    rev1 = await kv.put(prefix + "a", b"one")
    assert await kv.get(prefix + "a") == (b"one", rev1)
    rev2 = await kv.put(prefix + "a", b"two")
    assert rev2 > rev1
    assert await kv.get(prefix + "a") == (b"two", rev2)


async def test_range_lists_only_keys_under_the_prefix_sorted_with_the_read_revision(
    kv: KV, prefix: str
) -> None:
    await kv.put(prefix + "m/b", b"2")
    rev_a = await kv.put(prefix + "m/a", b"1")
    await kv.put(prefix + "m", b"parent, not under m/")
    last = await kv.put(prefix + "mx", b"sibling")
    result = await kv.range(prefix + "m/")
    assert [item.key for item in result.items] == [prefix + "m/a", prefix + "m/b"]
    assert result.items[0] == KeyValue(prefix + "m/a", b"1", rev_a)
    assert result.revision >= last
    assert (await kv.range(prefix + "zzz/")).items == []


async def test_delete_reports_whether_the_key_existed(kv: KV, prefix: str) -> None:
    await kv.put(prefix + "d", b"x")
    assert await kv.delete(prefix + "d") is True
    assert await kv.get(prefix + "d") is None
    assert await kv.delete(prefix + "d") is False


async def test_compare_and_swap_creates_only_when_absent_and_updates_only_from_the_read_revision(
    kv: KV, prefix: str
) -> None:
    key = prefix + "map"
    assert await kv.compare_and_swap(key, 0, b"v1") is True
    assert await kv.compare_and_swap(key, 0, b"again") is False
    current = await kv.get(key)
    assert current is not None and current.value == b"v1"
    assert await kv.compare_and_swap(key, current.mod_revision, b"v2") is True
    assert await kv.compare_and_swap(key, current.mod_revision, b"stale writer") is False
    latest = await kv.get(key)
    assert latest is not None and latest.value == b"v2"


async def test_compare_and_swap_fails_when_a_guard_key_moved(kv: KV, prefix: str) -> None:
    leader_rev = await kv.put(prefix + "leader", b"me")
    assert await kv.compare_and_swap(prefix + "map", 0, b"v1", guards={prefix + "leader": leader_rev})
    await kv.put(prefix + "leader", b"someone else")
    current = await kv.get(prefix + "map")
    assert current is not None
    ok = await kv.compare_and_swap(prefix + "map", current.mod_revision, b"v2", guards={prefix + "leader": leader_rev})
    assert ok is False
    assert await kv.get(prefix + "map") == current


async def test_compare_and_delete_deletes_only_at_the_expected_revision(kv: KV, prefix: str) -> None:
    rev = await kv.put(prefix + "k", b"x")
    assert await kv.compare_and_delete(prefix + "k", rev - 1) is False
    assert await kv.get(prefix + "k") is not None
    assert await kv.compare_and_delete(prefix + "k", rev) is True
    assert await kv.get(prefix + "k") is None


async def test_watch_from_a_revision_replays_past_changes_then_follows_live_ones(
    kv_factory: Callable[[], KV], prefix: str
) -> None:
    kv, writer = kv_factory(), kv_factory()
    rev_a = await kv.put(prefix + "a", b"1")
    rev_b = await kv.put(prefix + "b", b"2")
    rev_del = await kv.put(prefix + "a", b"1bis")
    await kv.put(prefix.rstrip("/") + "x/outside", b"not watched")
    events = kv.watch(prefix, rev_b)
    first = await take(events, 2)
    assert first == [
        WatchEvent(EventType.PUT, prefix + "b", b"2", rev_b),
        WatchEvent(EventType.PUT, prefix + "a", b"1bis", rev_del),
    ]
    assert rev_a < rev_b
    await writer.delete(prefix + "b")
    rev_c = await writer.put(prefix + "c", b"3")
    live = await take(events, 2)
    assert live[0].type is EventType.DELETE and live[0].key == prefix + "b" and live[0].value == b""
    assert live[1] == WatchEvent(EventType.PUT, prefix + "c", b"3", rev_c)
    assert live[0].mod_revision == rev_c - 1
    await events.aclose()  # type: ignore[attr-defined]


async def test_watch_refuses_a_start_revision_below_one(kv: KV, prefix: str) -> None:
    with pytest.raises(ValueError, match="start revision >= 1"):
        await take(kv.watch(prefix, 0), 1)


async def test_watch_from_a_compacted_revision_raises_watch_compacted(kv: KV, prefix: str) -> None:
    if not isinstance(kv, EtcdKV):
        pytest.skip("compaction is an etcd operation")
    old = await kv.put(prefix + "a", b"1")
    latest = await kv.put(prefix + "a", b"2")
    await kv.compact(latest)
    with pytest.raises(WatchCompacted) as info:
        await take(kv.watch(prefix, old), 1)
    assert info.value.compact_revision == latest
    assert f"from revision {old} cannot resume" in str(info.value)


@pytest.mark.slow
async def test_watch_resumes_after_etcd_restarts_and_loses_no_event(
    private_etcd: EtcdServer, etcd_client: EtcdClient, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    watcher, writer = etcd_client(private_etcd), etcd_client(private_etcd)
    start = await writer.put(prefix + "before", b"0")
    events = watcher.watch(prefix, start)
    assert [e.key for e in await take(events, 1)] == [prefix + "before"]
    await writer.put(prefix + "queued", b"1")  # written, maybe not yet delivered, when etcd stops
    private_etcd.stop()
    await private_etcd.start_async()
    revisions = [await writer.put(f"{prefix}after/{i}", str(i).encode()) for i in range(5)]
    seen = await take(events, 6, timeout_s=15.0)
    assert [e.key for e in seen] == [prefix + "queued"] + [f"{prefix}after/{i}" for i in range(5)]
    assert [e.mod_revision for e in seen[1:]] == revisions
    assert "re-subscribing from revision" in caplog.text
    await events.aclose()  # type: ignore[attr-defined]


async def _leased_member(kv_factory: Callable[[], KV], prefix: str) -> tuple[KV, KV, Lease]:
    """(an owner holding ``prefix + "member"`` on a 2 s lease, another client to observe it, the lease)."""
    owner, observer = kv_factory(), kv_factory()
    lease = await owner.grant(2)
    await owner.put(prefix + "member", b"alive", lease=lease)
    return owner, observer, lease


@pytest.mark.slow
async def test_a_leased_key_vanishes_when_its_owner_stops_keeping_it_alive(
    kv_factory: Callable[[], KV], prefix: str
) -> None:
    owner, observer, _ = await _leased_member(kv_factory, prefix)
    await owner.close()  # the owner dies: no more keep-alives
    took = await eventually_absent(observer, prefix + "member", within_s=6.0)
    assert took >= 1.0  # not deleted at once: the TTL ran out


@pytest.mark.slow
async def test_keep_alive_holds_a_leased_key_past_its_ttl(kv: KV, prefix: str) -> None:
    # a TTL of 3 s, refreshed every second, each refresh given a second: on a loaded 2-core machine a
    # TTL of 2 s (0.67 s a refresh) once ran out 25 ms before a late refresh succeeded
    lease = await kv.grant(3)
    await kv.put(prefix + "member", b"alive", lease=lease)
    await asyncio.sleep(6.5)  # more than twice the TTL, in etcd's real time
    assert await kv.get(prefix + "member") is not None
    assert lease.alive
    await lease.revoke()
    assert await kv.get(prefix + "member") is None
    assert not lease.alive and not lease.lost.is_set()


@pytest.mark.slow
async def test_a_lease_revoked_behind_its_owners_back_is_reported_lost(
    kv_factory: Callable[[], KV], prefix: str
) -> None:
    owner, admin = kv_factory(), kv_factory()
    reported: list[Lease] = []
    lease = await owner.grant(2, on_lost=reported.append)
    await owner.put(prefix + "member", b"alive", lease=lease)
    if not isinstance(admin, EtcdKV):
        pytest.skip("revoking another client's lease is an etcd operation")
    await admin.revoke_lease_id(lease.id)
    await asyncio.wait_for(lease.lost.wait(), 5.0)
    assert reported == [lease]
    assert "expired" in lease.lost_reason
    assert await admin.get(prefix + "member") is None


@pytest.mark.slow
async def test_a_lease_is_reported_lost_when_etcd_stays_unreachable_for_its_ttl(
    private_etcd: EtcdServer, etcd_client: EtcdClient, prefix: str
) -> None:
    kv = etcd_client(private_etcd)
    lease = await kv.grant(2)
    private_etcd.pause()
    try:
        await asyncio.wait_for(lease.lost.wait(), 6.0)
    finally:
        private_etcd.resume()
    assert "no keep-alive succeeded" in lease.lost_reason


def _compute_for(seconds: float) -> None:
    """One loop turn that computes (holding the GIL but for the interpreter's switches), as a store's
    long turns do: a read repair copying whole series, modules compiled on first use."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(1000))


@pytest.mark.slow
async def test_a_loop_turn_longer_than_the_ttl_does_not_lose_the_lease(
    kv_factory: Callable[[], KV], prefix: str
) -> None:
    _, observer, lease = await _leased_member(kv_factory, prefix)
    _compute_for(6.0)  # three TTLs in one turn: no keep-alive could go out from this loop
    assert await observer.get(prefix + "member") is not None
    await asyncio.sleep(1.0)  # a loss reported during the turn would be delivered by now
    assert lease.alive, lease.lost_reason
    await lease.revoke()
    assert await observer.get(prefix + "member") is None


@pytest.mark.slow
async def test_a_lease_is_let_go_when_its_owners_loop_stays_stalled_past_the_limit(
    etcd_server: EtcdServer, prefix: str
) -> None:
    # a wedged process must drop out (its record expires), not be kept alive by its keep-alive thread
    kv = EtcdKV(EtcdSettings(endpoint=etcd_server.endpoint, request_timeout_s=1.0, loop_stall_limit_s=2.0))
    try:
        lease = await kv.grant(2)
        await kv.put(prefix + "member", b"alive", lease=lease)
        _compute_for(5.0)  # past the limit
        await asyncio.wait_for(lease.lost.wait(), 2.0)
        assert "event loop has not run" in lease.lost_reason
        await eventually_absent(kv, prefix + "member", within_s=6.0)  # etcd expired it: no more refreshes
    finally:
        await kv.close()


@pytest.mark.slow
async def test_stopping_a_lease_keeper_logs_no_error(
    etcd_server: EtcdServer, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A keeper on grpc.aio in a second event loop made half the stops log "Event loop is closed" here
    # (gRPC delivers a closed channel's last event through any bound loop); the synchronous keeper
    # binds none, and nothing it ends may log an error
    for _ in range(6):
        kv = EtcdKV(EtcdSettings(endpoint=etcd_server.endpoint, request_timeout_s=1.0))
        lease = await kv.grant(2)
        await kv.put(prefix + "member", b"alive", lease=lease)
        await asyncio.sleep(1.0)  # a refresh or two on the keeper's stream
        await kv.close()
        await asyncio.sleep(0.6)  # a closed channel's late event, were it mishandled, is logged by now
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors


def _lease_keep_alive_counts(server: EtcdServer) -> tuple[int, int, int]:
    """(LeaseKeepAlive calls started, keep-alive requests received, calls ended) by etcd so far (its /metrics)."""
    import urllib.request

    with urllib.request.urlopen(f"{server.client_url}/metrics", timeout=5.0) as resp:
        text = resp.read().decode()
    counts = {"grpc_server_started_total": 0, "grpc_server_msg_received_total": 0, "grpc_server_handled_total": 0}
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        if name in counts and 'grpc_method="LeaseKeepAlive"' in line:
            counts[name] += int(float(line.rsplit(" ", 1)[1]))
    return (counts["grpc_server_started_total"], counts["grpc_server_msg_received_total"],
            counts["grpc_server_handled_total"])


@pytest.mark.slow
async def test_a_lease_is_kept_alive_one_call_a_refresh_across_etcd_restarts(
    private_etcd: EtcdServer, etcd_client: EtcdClient, prefix: str
) -> None:
    """Each refresh is one call that etcd ends after its answer: no stream stays open (a stream
    per lease cost the keeper's process two more threads than a call does)."""
    kv = etcd_client(private_etcd)
    # Refreshed every 2 s. etcd's stop and start (the stop blocks this loop) must take less than
    # the TTL, else the lease is rightly reported lost: CI's 2 cores took more than 2 s.
    lease = await kv.grant(6)
    await kv.put(prefix + "member", b"alive", lease=lease)
    calls, sent, ended = _lease_keep_alive_counts(private_etcd)
    deadline = time.monotonic() + 20.0
    while sent < 3:  # etcd's real time: three refreshes
        assert time.monotonic() < deadline, f"only {sent} keep-alives reached etcd"
        await asyncio.sleep(0.2)
        calls, sent, ended = _lease_keep_alive_counts(private_etcd)
    assert calls == sent  # one request a call
    assert ended >= calls - 1  # each ended by etcd (the newest may be answering as we read)
    private_etcd.stop()
    await private_etcd.start_async()
    deadline = time.monotonic() + 20.0
    while _lease_keep_alive_counts(private_etcd)[1] < 2:  # the counters restart with etcd
        assert time.monotonic() < deadline, "no keep-alive reached etcd after its restart"
        await asyncio.sleep(0.2)
    assert lease.alive and not lease.lost.is_set()
    assert await kv.get(prefix + "member") is not None  # the key outlived the restart with its lease
