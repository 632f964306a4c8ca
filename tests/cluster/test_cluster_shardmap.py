"""The shard map's JSON form, its validation (exact messages) and the etcd key layout."""

from __future__ import annotations

import asyncio
import json

import pytest

from metricsd.cluster.assign import assign
from metricsd.cluster.shardmap import KeyLayout, Member, MemberState, ShardMap, ShardMapError

MEMBERS = {m.id: m for m in [Member("store-1", "127.0.0.1:7101"), Member("store-2", "127.0.0.1:7102")]}


def sample() -> ShardMap:
    return ShardMap(version=3, rf=2, slots=(("store-1", "store-2"), ("store-2", "store-1")), members=MEMBERS)


def test_a_map_survives_a_json_round_trip() -> None:
    smap = assign([*MEMBERS.values(), Member("store-3", "10.0.0.3:7101", MemberState.JOINING)], None, 64, 3)
    again = ShardMap.from_json(smap.to_json())
    assert again == smap
    assert again.members["store-3"].state is MemberState.JOINING


def test_the_json_layout_is_the_documented_one() -> None:
    assert json.loads(sample().to_json()) == {
        "format": 1,
        "version": 3,
        "rf": 2,
        "slots": [["store-1", "store-2"], ["store-2", "store-1"]],
        "members": {
            "store-1": {"address": "127.0.0.1:7101", "state": "active"},
            "store-2": {"address": "127.0.0.1:7102", "state": "active"},
        },
    }


def test_queries_on_a_map() -> None:
    smap = sample()
    assert smap.num_slots == 2
    assert smap.replicas(1) == ("store-2", "store-1")
    assert smap.slots_of("store-1") == [0, 1]
    assert smap.load() == {"store-1": 2, "store-2": 2}
    assert smap.address("store-2") == "127.0.0.1:7102"
    assert str(smap) == "ShardMap(v3, 2 slots, rf 2, load: store-1=2, store-2=2)"
    with pytest.raises(IndexError, match=r"slot 2 out of range 0\.\.1"):
        smap.replicas(2)


def test_an_empty_map_has_no_replicas() -> None:
    empty = ShardMap.empty(4, 3)
    assert empty.version == 0 and empty.slots == ((), (), (), ())


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("{", "shard map: not valid JSON"),
        ("[]", "shard map: want a JSON object"),
        ('{"format": 2}', "shard map: unsupported format 2, this build reads 1"),
        (
            '{"format": 1, "version": 1, "rf": 3, "slots": "x"}',
            "shard map: slots must be a list of lists of member ids",
        ),
        ('{"format": 1, "version": -1, "rf": 3, "slots": [[]]}', "version must be an integer >= 0, got -1"),
        ('{"format": 1, "version": 1, "rf": 0, "slots": [[]]}', "rf must be an integer >= 1, got 0"),
        ('{"format": 1, "version": 1, "rf": 3, "slots": []}', "a shard map needs at least one slot"),
        ('{"format": 1, "version": 1, "rf": 3, "slots": [["x"]]}', "slot 0: unknown member(s) x"),
        (
            '{"format": 1, "version": 1, "rf": 1, "slots": [["a", "a"]], "members": {"a": {"address": "h:1"}}}',
            "slot 0: a member appears twice in ['a', 'a']",
        ),
        (
            '{"format": 1, "version": 1, "rf": 1, "slots": [["a", "b"]], '
            '"members": {"a": {"address": "h:1"}, "b": {"address": "h:2"}}}',
            "slot 0: 2 replicas exceed rf 1",
        ),
        (
            '{"format": 1, "version": 1, "rf": 1, "slots": [[]], "members": {"a": {"address": "h"}}}',
            "member a: invalid gRPC address 'h', want host:port",
        ),
        (
            '{"format": 1, "version": 1, "rf": 1, "slots": [[]], "members": {"a": {"address": "h:1", "state": "x"}}}',
            "member a: unknown state 'x' (one of joining, active, leaving)",
        ),
        (
            '{"format": 1, "version": 1, "rf": 1, "slots": [[]], "members": {"a/b": {"address": "h:1"}}}',
            "invalid member id 'a/b': use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit",
        ),
    ],
)
def test_a_bad_map_is_refused_with_a_message_naming_the_fault(doc: str, message: str) -> None:
    with pytest.raises(ShardMapError) as info:
        ShardMap.from_json(doc)
    assert str(info.value).startswith(message)


def test_a_member_record_round_trips_and_ipv6_addresses_are_accepted() -> None:
    member = Member("store-9", "[::1]:7109", MemberState.LEAVING)
    assert Member.from_json(member.to_json()) == member
    assert json.loads(member.to_json()) == {"id": "store-9", "address": "[::1]:7109", "state": "leaving"}


def test_the_key_layout_is_the_documented_one() -> None:
    keys = KeyLayout(root="/metricsd", cluster="prod")
    assert keys.map_key == "/metricsd/prod/map"
    assert keys.leader_key == "/metricsd/prod/leader"
    assert keys.members_prefix == "/metricsd/prod/members/"
    assert keys.member_key("store-1") == "/metricsd/prod/members/store-1"
    assert keys.member_id_of("/metricsd/prod/members/store-1") == "store-1"
    with pytest.raises(ValueError, match="not a member key"):
        keys.member_id_of("/metricsd/prod/map")
    with pytest.raises(ValueError, match="root must start with '/'"):
        KeyLayout(root="metricsd/")


def test_member_records_are_read_and_a_broken_one_is_reported_not_fatal() -> None:
    keys = KeyLayout()
    good = Member("store-1", "127.0.0.1:7101")
    members, errors = keys.members_from(
        [
            (keys.member_key("store-1"), good.to_json()),
            (keys.member_key("store-2"), Member("store-3", "127.0.0.1:7103").to_json()),
            (keys.member_key("store-4"), b"not json"),
        ]
    )
    assert members == {"store-1": good}
    at = "member record at '/metricsd/default/members/"
    assert errors[0] == at + "store-2' ignored: the record names member 'store-3'"
    assert errors[1].startswith(at + "store-4' ignored: member record: not valid JSON")


async def test_a_static_source_hands_a_set_map_to_next_map() -> None:
    from metricsd.cluster.mapsource import StaticMapSource

    first = assign([Member("a", "127.0.0.1:7100")], None, 4, 1)
    source = StaticMapSource(first)
    assert await source.next_map(None, 0) is first
    assert await source.next_map(first, 0.05) is None
    waiting = asyncio.ensure_future(source.next_map(first, 5.0))
    await asyncio.sleep(0)
    second = assign([Member("a", "127.0.0.1:7100"), Member("b", "127.0.0.1:7101")], first, 4, 1)
    source.set(second)
    assert await waiting is second
