"""Leader election against a real etcd: two candidates, hand-over within the lease TTL."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest

from metricsd.cluster.election import LeaderElection
from metricsd.cluster.etcd_kv import EtcdKV
from metricsd.cluster.kv import KV

TTL = 2
Elections = Callable[..., LeaderElection]


@pytest.fixture
async def elections(kv_factory: Callable[[], KV], prefix: str) -> AsyncIterator[Elections]:
    made: list[LeaderElection] = []

    def make(name: str, on_step_down: Callable[[str], None] | None = None) -> LeaderElection:
        election = LeaderElection(
            kv_factory(), prefix + "leader", name, ttl=TTL, retry_s=0.1, on_step_down=on_step_down
        )
        made.append(election)
        return election

    yield make
    for election in made:
        await election.close()


async def test_the_first_candidate_leads_and_the_second_waits(
    elections: Elections,
) -> None:
    a, b = elections("config-a"), elections("config-b")
    await asyncio.wait_for(a.campaign(), 5)
    assert a.is_leader and a.leader_revision > 0
    waiting = asyncio.create_task(b.campaign())
    await asyncio.sleep(0.3)  # give b a chance to (wrongly) win
    assert not waiting.done() and not b.is_leader
    assert await b.leader() == "config-a"
    waiting.cancel()


async def test_a_resigning_leader_hands_over_at_once(elections: Elections) -> None:
    a, b = elections("config-a"), elections("config-b")
    await a.campaign()
    waiting = asyncio.create_task(b.campaign())
    await asyncio.sleep(0.2)
    start = time.monotonic()
    await a.resign()
    await asyncio.wait_for(waiting, 5)
    assert b.is_leader and not a.is_leader
    assert time.monotonic() - start < 1.0
    assert b.leader_revision > a.leader_revision
    assert not a.deposed.is_set()  # resigning is not being deposed


async def test_observe_reports_the_leader_and_each_change(elections: Elections) -> None:
    a, b, watcher = elections("config-a"), elections("config-b"), elections("status")
    seen: list[str | None] = []
    changes = watcher.observe()
    seen.append(await anext(changes))
    await a.campaign()
    seen.append(await asyncio.wait_for(anext(changes), 5))
    waiting = asyncio.create_task(b.campaign())
    await a.resign()
    await asyncio.wait_for(waiting, 5)
    seen.append(await asyncio.wait_for(anext(changes), 5))
    if seen[-1] is None:  # the vacancy between the two may or may not be seen
        seen.append(await asyncio.wait_for(anext(changes), 5))
    assert [s for s in seen if s is not None] == ["config-a", "config-b"]
    assert seen[0] is None
    await changes.aclose()  # type: ignore[attr-defined]


async def test_a_leader_whose_key_is_deleted_steps_down(
    elections: Elections, kv_factory: Callable[[], KV]
) -> None:
    reasons: list[str] = []
    a = elections("config-a", reasons.append)
    await a.campaign()
    await kv_factory().delete(a.key)
    await asyncio.wait_for(a.deposed.wait(), 5)
    assert not a.is_leader
    assert reasons == ["the leader key was deleted"]


async def test_a_deposed_leaders_guarded_write_is_refused(
    elections: Elections, kv_factory: Callable[[], KV], prefix: str
) -> None:
    a, b = elections("config-a"), elections("config-b")
    await a.campaign()
    stale_fence = {a.key: a.leader_revision}
    await a.resign()
    await b.campaign()
    kv = kv_factory()
    assert await kv.compare_and_swap(prefix + "map", 0, b"from b", guards={b.key: b.leader_revision})
    current = await kv.get(prefix + "map")
    assert current is not None
    assert not await kv.compare_and_swap(prefix + "map", current.mod_revision, b"from a", guards=stale_fence)


async def test_when_the_leaders_lease_is_revoked_the_other_takes_over_and_it_steps_down(
    elections: Elections, kv_factory: Callable[[], KV]
) -> None:
    reasons: list[str] = []
    a, b = elections("config-a", reasons.append), elections("config-b")
    await a.campaign()
    waiting = asyncio.create_task(b.campaign())
    await asyncio.sleep(0.2)
    admin = kv_factory()
    assert isinstance(admin, EtcdKV)
    assert a._lease is not None
    start = time.monotonic()
    await admin.revoke_lease_id(a._lease.id)
    await asyncio.wait_for(waiting, TTL)
    assert b.is_leader
    await asyncio.wait_for(a.deposed.wait(), TTL)
    assert time.monotonic() - start < TTL
    assert not a.is_leader
    assert len(reasons) == 1 and reasons[0].startswith(("lease lost", "the leader key was deleted"))


@pytest.mark.slow
async def test_when_the_leader_dies_the_other_takes_over_within_the_ttl(
    kv_factory: Callable[[], KV], prefix: str
) -> None:
    dying_kv = kv_factory()
    a = LeaderElection(dying_kv, prefix + "leader", "config-a", ttl=TTL)
    b = LeaderElection(kv_factory(), prefix + "leader", "config-b", ttl=TTL, retry_s=0.1)
    await a.campaign()
    waiting = asyncio.create_task(b.campaign())
    await asyncio.sleep(0.2)
    start = time.monotonic()
    await dying_kv.close()  # no more keep-alives, no resignation: as if the process was killed
    await asyncio.wait_for(waiting, TTL + 2)
    took = time.monotonic() - start
    assert b.is_leader
    assert await b.leader() == "config-b"
    assert took <= TTL + 1.0, f"take-over took {took:.2f}s with a {TTL}s lease"
    await b.close()
