"""Replica choice and the quorum tracker: pure, synchronous, exact error texts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.proxy.quorum import (
    Op,
    QuorumError,
    QuorumSettings,
    QuorumTracker,
    SlotState,
    plan_read,
    plan_write,
    spread_data,
)

ABC = ("a", "b", "c")
DEFAULT = QuorumSettings()


# -- which replica answers with data (the digest read) ------------------------------------------


def test_data_slots_alternate_between_the_replicas_asked() -> None:
    plans = [plan_read(s, ABC, set(ABC), DEFAULT) for s in range(3)]  # each asks (a, b)
    assert spread_data(plans) == {0: "a", 1: "b", 2: "a"}


def test_a_slot_without_targets_has_no_data_replica() -> None:
    assert spread_data([plan_read(0, (), set(), DEFAULT), plan_read(1, ABC, {"c"}, DEFAULT)]) == {1: "c"}


@given(st.lists(st.tuples(st.permutations(ABC), st.integers(0, 5)), max_size=64))
def test_every_member_asked_gets_a_fair_share_of_data_slots(slots: list[tuple[list[str], int]]) -> None:
    plans = [plan_read(i, replicas, set(ABC), DEFAULT, offset) for i, (replicas, offset) in enumerate(slots)]
    owners = spread_data(plans)
    assert sorted(owners) == list(range(len(plans)))
    assert all(owners[p.slot] in p.targets for p in plans)
    share = {m: sum(1 for o in owners.values() if o == m) for m in ABC}
    # A member took its last data slot when it had no more than the slot's other targets, so its
    # share ends at most one above theirs.
    for member in set(owners.values()):
        last = max(slot for slot, o in owners.items() if o == member)
        assert all(share[member] <= share[other] + 1 for other in plans[last].targets)


def test_slots_asking_the_same_members_split_evenly() -> None:
    plans = [plan_read(s, ABC, set(ABC), DEFAULT, s % 2) for s in range(7)]  # (a, b) or (b, c)... rotated
    owners = spread_data([p for p in plans if set(p.targets) == {"a", "b"}])
    counts = sorted(sum(1 for o in owners.values() if o == m) for m in "ab")
    assert counts[1] - counts[0] <= 1 and sum(counts) == len(owners)


# -- settings ---------------------------------------------------------------------------------


def test_the_defaults_are_rf_3_w_2_r_2() -> None:
    assert (DEFAULT.rf, DEFAULT.w, DEFAULT.r) == (3, 2, 2)


@pytest.mark.parametrize(
    ("rf", "w", "r", "message"),
    [
        (3, 1, 2, "R + W must exceed RF so that every read overlaps the last acknowledged write: R=2 + W=1 <= RF=3"),
        (3, 4, 2, "W must be between 1 and RF=3, got 4"),
        (3, 2, 0, "R must be between 1 and RF=3, got 0"),
        (0, 1, 1, "RF must be at least 1, got 0"),
    ],
)
def test_settings_that_could_lose_an_acknowledged_write_are_refused(rf: int, w: int, r: int, message: str) -> None:
    with pytest.raises(ValueError) as info:
        QuorumSettings(rf=rf, w=w, r=r)
    assert str(info.value) == message


def test_a_slot_with_fewer_replicas_than_rf_needs_fewer_answers_but_never_zero() -> None:
    assert DEFAULT.required(Op.WRITE, 3) == 2
    assert DEFAULT.required(Op.WRITE, 1) == 1
    assert DEFAULT.required(Op.READ, 2) == 2
    assert DEFAULT.required(Op.READ, 0) == 1


# -- replica choice ---------------------------------------------------------------------------


def test_a_write_goes_to_every_healthy_replica_and_skips_the_unhealthy_one() -> None:
    plan = plan_write(7, ABC, {"a", "c"}, DEFAULT)
    assert plan.targets == ("a", "c")
    assert plan.unhealthy == ("b",)
    assert plan.required == 2
    assert plan.tolerable_failures == 0


def test_a_write_with_all_replicas_healthy_tolerates_one_failure() -> None:
    assert plan_write(0, ABC, set(ABC), DEFAULT).tolerable_failures == 1


def test_a_write_with_two_replicas_down_cannot_reach_its_quorum() -> None:
    plan = plan_write(0, ABC, {"a"}, DEFAULT)
    assert plan.tolerable_failures == -1


def test_a_read_asks_r_replicas_in_map_order_and_keeps_the_rest_as_spares() -> None:
    plan = plan_read(3, ABC, set(ABC), DEFAULT)
    assert (plan.targets, plan.spares, plan.required) == (("a", "b"), ("c",), 2)
    assert plan.tolerable_failures == 1


def test_a_read_rotates_its_preference_by_the_offset() -> None:
    assert plan_read(3, ABC, set(ABC), DEFAULT, offset=1).targets == ("b", "c")
    assert plan_read(3, ABC, set(ABC), DEFAULT, offset=5).targets == ("c", "a")


def test_a_read_asks_unhealthy_replicas_last() -> None:
    plan = plan_read(3, ABC, {"b", "c"}, DEFAULT)
    assert (plan.targets, plan.spares, plan.unhealthy) == (("b", "c"), ("a",), ("a",))
    plan = plan_read(3, ABC, {"c"}, DEFAULT)  # fewer healthy than R: an unhealthy one at once
    assert (plan.targets, plan.spares) == (("c", "a"), ("b",))


# -- tracker ----------------------------------------------------------------------------------


def test_a_write_is_done_once_w_replicas_acknowledged_in_every_slot() -> None:
    tracker = QuorumTracker([plan_write(1, ABC, set(ABC), DEFAULT), plan_write(2, ("b", "c", "a"), set(ABC), DEFAULT)])
    assert tracker.asks() == {"a": [1, 2], "b": [1, 2], "c": [1, 2]}
    tracker.record_success("a")
    assert not tracker.done
    tracker.record_success("b")
    assert tracker.done and not tracker.failed
    assert tracker.error() is None
    assert tracker.pending() == {"c": [1, 2]}


def test_a_write_survives_one_failed_replica_and_names_it_for_hinted_hand_off() -> None:
    tracker = QuorumTracker([plan_write(1, ABC, set(ABC), DEFAULT)])
    tracker.record_failure("b", "unavailable")
    assert tracker.state(1) is SlotState.PENDING
    tracker.record_success("a")
    tracker.record_success("c")
    assert tracker.done
    assert tracker.lagging_replicas() == {1: ["b"]}


def test_a_write_fails_as_soon_as_a_slot_cannot_reach_w() -> None:
    tracker = QuorumTracker([plan_write(1, ABC, set(ABC), DEFAULT), plan_write(2, ABC, set(ABC), DEFAULT)])
    tracker.record_failure("b", "unavailable")
    tracker.record_failure("c", "deadline exceeded", slots=[1])
    assert tracker.failed and tracker.failed_slots() == [1]
    assert tracker.state(2) is SlotState.PENDING


def test_the_write_error_names_each_slot_without_a_quorum_and_why() -> None:
    tracker = QuorumTracker(
        [
            plan_write(3, ABC, set(ABC), DEFAULT),
            plan_write(5, ABC, set(ABC), DEFAULT),
            plan_write(9, ABC, {"c"}, DEFAULT),
        ]
    )
    tracker.record_success("a")
    tracker.record_failure("b", "unavailable")
    tracker.record_failure("c", "deadline exceeded", slots=[3])
    tracker.record_success("c", slots=[5, 9])
    error = tracker.error()
    assert isinstance(error, QuorumError)
    assert error.slots == (3, 9)
    assert error.op is Op.WRITE
    assert str(error) == (
        "write quorum not reached for 2 of 3 slots: "
        "slot 3 got 1 of 2 required acks (b: unavailable, c: deadline exceeded); "
        "slot 9 got 1 of 2 required acks (a: unhealthy, not asked, b: unhealthy, not asked)"
    )


def test_a_slot_with_no_replicas_fails_with_a_clear_reason() -> None:
    tracker = QuorumTracker([plan_write(4, (), set(), DEFAULT)])
    assert tracker.failed
    assert str(tracker.error()) == (
        "write quorum not reached for 1 of 1 slots: slot 4 got 0 of 1 required acks (no replicas in the shard map)"
    )


def test_a_read_that_loses_a_replica_asks_the_spare() -> None:
    tracker = QuorumTracker([plan_read(6, ABC, set(ABC), DEFAULT)])
    assert tracker.asks() == {"a": [6], "b": [6]}
    assert tracker.record_failure("a", "unavailable") == {"c": [6]}
    tracker.record_success("b")
    assert not tracker.done
    tracker.record_success("c")
    assert tracker.done
    assert tracker.lagging_replicas() == {6: ["a"]}


def test_a_read_asks_no_spare_once_the_slot_is_done() -> None:
    tracker = QuorumTracker([plan_read(6, ABC, set(ABC), DEFAULT)])
    tracker.record_success("a")
    tracker.record_success("b")
    assert tracker.record_failure("c", "late", slots=None) == {}


def test_the_read_error_lists_failed_and_unanswered_replicas_after_the_deadline() -> None:
    tracker = QuorumTracker([plan_read(2, ABC, set(ABC), DEFAULT)])
    tracker.record_failure("a", "unavailable")
    tracker.record_success("b")
    assert not tracker.failed and not tracker.done  # the spare c has not answered yet
    assert str(tracker.error()) == (
        "read quorum not reached for 1 of 1 slots: slot 2 got 1 of 2 required replies (a: unavailable, c: no answer)"
    )


def test_a_read_whose_healthy_replica_fails_asks_the_unhealthy_one_and_fails_only_with_it() -> None:
    """A member marked down may be back (a chaos run failed a read while the store the proxy
    still marked down had been serving for 4 s): it is the last spare, not left out."""
    tracker = QuorumTracker([plan_read(2, ABC, {"a", "b"}, DEFAULT)])
    assert tracker.state(2) is SlotState.PENDING
    assert tracker.record_failure("a", "unavailable") == {"c": [2]}
    assert not tracker.failed
    tracker.record_success("b")
    tracker.record_success("c")
    assert tracker.done
    tracker = QuorumTracker([plan_read(2, ABC, {"a", "b"}, DEFAULT)])
    tracker.record_failure("a", "unavailable")
    tracker.record_failure("c", "connection refused")
    assert tracker.failed
    assert str(tracker.error()) == (
        "read quorum not reached for 1 of 1 slots: "
        "slot 2 got 0 of 2 required replies (a: unavailable, b: no answer, c: connection refused)"
    )


def test_the_error_lists_at_most_ten_slots() -> None:
    tracker = QuorumTracker([plan_read(i, ("a",), set(), DEFAULT) for i in range(12)])
    message = str(tracker.error())
    assert message.startswith("read quorum not reached for 12 of 12 slots: slot 0 got 0 of 1 required replies")
    assert "slot 9 got" in message and "slot 10 got" not in message
    assert message.endswith("; and 2 more")


def test_an_answer_from_a_member_that_was_not_asked_is_a_bug() -> None:
    tracker = QuorumTracker([plan_read(6, ABC, set(ABC), DEFAULT)])
    with pytest.raises(ValueError) as info:
        tracker.record_success("c", slots=[6])
    assert str(info.value) == "c was not asked for slot 6"
    tracker.record_success("a", slots=[6])
    with pytest.raises(ValueError) as again:
        tracker.record_failure("a", "late", slots=[6])
    assert str(again.value) == "a already answered for slot 6"


def test_a_tracker_counts_either_writes_or_reads() -> None:
    with pytest.raises(ValueError, match="either writes or reads"):
        QuorumTracker([plan_write(1, ABC, set(ABC), DEFAULT), plan_read(2, ABC, set(ABC), DEFAULT)])
    with pytest.raises(ValueError, match="slot 1 planned twice"):
        QuorumTracker([plan_write(1, ABC, set(ABC), DEFAULT), plan_write(1, ABC, set(ABC), DEFAULT)])


@given(st.data())
@settings(max_examples=200, deadline=None)
def test_kept_counts_agree_with_the_slots_under_any_order_of_answers(data: st.DataObject) -> None:
    """The tracker keeps done / failed / waiting as counts; after every answer they equal what a
    pass over the slots computes, and done / failed match the quorum rule."""
    members = ["a", "b", "c", "d"]
    q = QuorumSettings(rf=3, w=2, r=2)
    op = data.draw(st.sampled_from([Op.WRITE, Op.READ]))
    plans = []
    for slot in range(data.draw(st.integers(1, 8))):
        replicas = data.draw(st.lists(st.sampled_from(members), min_size=0, max_size=3, unique=True))
        healthy = data.draw(st.sets(st.sampled_from(members)))
        plans.append(plan_write(slot, replicas, healthy, q) if op is Op.WRITE
                     else plan_read(slot, replicas, healthy, q, offset=data.draw(st.integers(0, 3))))
    tracker = QuorumTracker(plans)
    tracker._check()
    for _ in range(20):
        pending = tracker.pending()
        if not pending:
            break
        member = data.draw(st.sampled_from(sorted(pending)))
        slots = data.draw(st.one_of(st.none(), st.lists(st.sampled_from(pending[member]), min_size=1, unique=True)))
        if data.draw(st.booleans()):
            tracker.record_success(member, slots)
        else:
            tracker.record_failure(member, "refused", slots)
        tracker._check()
        states = [tracker.state(p.slot) for p in plans]
        assert tracker.done == all(s is SlotState.DONE for s in states)
        assert tracker.failed == any(s is SlotState.FAILED for s in states)
