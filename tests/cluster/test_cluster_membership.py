"""Member states: the pure transition function, the drain condition, and a store that leaves the
cluster on a clean stop (real etcd, config server and store processes)."""

from __future__ import annotations

import itertools
import signal
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from cluster_procs import Procs, wait_map
from polling import wait_until

from metricsd.cluster.etcd_kv import EtcdKV
from metricsd.cluster.etcd_server import EtcdServer
from metricsd.cluster.membership import MemberEvent, drained, transition
from metricsd.cluster.shardmap import KeyLayout, Member, MemberState, ShardMap

J, A, L = MemberState.JOINING, MemberState.ACTIVE, MemberState.LEAVING


@pytest.mark.parametrize("state, event, expected", [
    (A, MemberEvent.BEHIND, J), (A, MemberEvent.LEVEL, A), (A, MemberEvent.DRAIN, L),
    (J, MemberEvent.BEHIND, J), (J, MemberEvent.LEVEL, A), (J, MemberEvent.DRAIN, L),
    (L, MemberEvent.BEHIND, L), (L, MemberEvent.LEVEL, L), (L, MemberEvent.DRAIN, L),
])
def test_each_state_and_event_leads_to_one_state(state: MemberState, event: MemberEvent,
                                                  expected: MemberState) -> None:
    assert transition(state, event) is expected


def test_leaving_is_final_whatever_follows() -> None:
    for events in itertools.product(list(MemberEvent), repeat=3):
        state = transition(A, MemberEvent.DRAIN)
        for e in events:
            state = transition(state, e)
        assert state is L


def _map(slots: list[list[str]], states: dict[str, MemberState]) -> ShardMap:
    members = {m: Member(m, f"127.0.0.1:{7100 + i}", s) for i, (m, s) in enumerate(sorted(states.items()))}
    return ShardMap(version=2, rf=2, slots=tuple(tuple(r) for r in slots), members=members)


def test_a_member_is_drained_once_it_holds_no_slot_and_no_one_is_still_copying() -> None:
    assert not drained(None, "s1")
    assert not drained(_map([["s1", "s2"], ["s2", "s3"]], {"s1": L, "s2": A, "s3": A}), "s1")
    assert not drained(_map([["s2", "s3"], ["s3", "s2"]], {"s1": L, "s2": J, "s3": A}), "s1")
    assert drained(_map([["s2", "s3"], ["s3", "s2"]], {"s1": L, "s2": A, "s3": A}), "s1")
    assert drained(_map([["s2", "s3"], ["s3", "s2"]], {"s2": A, "s3": A}), "s1")


@pytest.mark.slow
async def test_a_store_leaving_on_a_clean_stop_publishes_leaving_waits_for_its_slots_to_move_then_exits(
        etcd_server: EtcdServer, etcd_client: Callable[[EtcdServer], EtcdKV], tmp_path: Path) -> None:
    layout = KeyLayout(root=f"/leave-test-{uuid.uuid4().hex[:8]}", cluster="c1")
    kv = etcd_client(etcd_server)
    procs = Procs(tmp_path, etcd_server.endpoint, layout)
    try:
        procs.store("store-1")
        procs.store("store-2")
        leaver = procs.store("store-3", extra=("--deregister-on-exit", "--drain-timeout", "30"))
        procs.config_server("cs-1", slots=8, rf=2)
        await wait_map(kv, layout, lambda m: len(m.members) == 3 and bool(m.slots_of("store-3")))

        leaver.popen.send_signal(signal.SIGTERM)
        await wait_until("store-3's record says leaving", lambda: _record_state(kv, layout, "store-3", L),
                         timeout_s=10)
        after = await wait_map(kv, layout, lambda m: "store-3" not in m.members, timeout_s=20)
        assert after.slots_of("store-3") == [] and sorted(after.members) == ["store-1", "store-2"]
        assert all(len(r) == 2 for r in after.slots)
        await wait_until("store-3 exits", lambda: not leaver.alive, timeout_s=40)
        assert leaver.popen.returncode == 0
        out = leaver.output()
        assert "member store-3: state leaving" in out and "member store-3 drained" in out, out[-3000:]
        assert "not drained" not in out
        assert await kv.get(layout.member_key("store-3")) is None  # deregistered after the drain
    finally:
        procs.close()


async def _record_state(kv: EtcdKV, layout: KeyLayout, member_id: str, state: MemberState) -> bool:
    got = await kv.get(layout.member_key(member_id))
    return got is not None and Member.from_json(got.value).state is state
