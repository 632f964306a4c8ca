"""Acks answers as QuorumTracker does, for writes and reads, whatever the order of answers and failures."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.proxy.acks import Acks, acks_for
from metricsd.proxy.quorum import QuorumSettings, QuorumTracker, plan_read, plan_write

MEMBERS = ["a", "b", "c", "d"]


@given(st.data())
@settings(max_examples=200, deadline=None)
def test_acks_agree_with_the_tracker(data: st.DataObject) -> None:
    q = QuorumSettings(rf=3, w=2, r=2)
    read = data.draw(st.booleans())
    plans = []
    for slot in range(data.draw(st.integers(0, 8))):
        replicas = data.draw(st.lists(st.sampled_from(MEMBERS), min_size=0, max_size=3, unique=True))
        healthy = set(data.draw(st.sets(st.sampled_from(MEMBERS))))
        plans.append(plan_read(slot, replicas, healthy, q, data.draw(st.integers(0, 5))) if read
                     else plan_write(slot, replicas, healthy, q))
    fast, slow = acks_for(plans), QuorumTracker(plans)
    assert fast.asks() == slow.asks()
    for member in data.draw(st.permutations(sorted(slow.asks()))):
        if slow.done or slow.failed:
            break
        assert (fast.done, fast.failed) == (slow.done, slow.failed)
        if data.draw(st.booleans()):
            fast.record_success(member)
            slow.record_success(member)
        else:
            more = fast.record_failure(member, "refused")
            assert more == slow.record_failure(member, "refused")
            for spare, slots in more.items():  # a read asks spares; they answer for those slots
                if data.draw(st.booleans()):
                    fast.record_success(spare, slots)
                    slow.record_success(spare, slots)
    assert (fast.done, fast.failed) == (slow.done, slow.failed)
    fe, se = fast.error(), slow.error()
    assert (str(fe), getattr(fe, "slots", None)) == (str(se), getattr(se, "slots", None))


def test_healthy_plans_take_the_array_path_and_others_the_tracker() -> None:
    q = QuorumSettings(rf=3, w=2, r=2)
    healthy = [plan_write(s, ["a", "b", "c"], {"a", "b", "c"}, q) for s in range(4)]
    assert isinstance(acks_for(healthy), Acks)
    short = [*healthy, plan_write(4, ["a", "b", "c"], {"a"}, q)]  # one slot cannot reach W
    assert isinstance(acks_for(short), QuorumTracker)
    reads = [plan_read(s, ["a", "b", "c"], {"a", "b", "c"}, q, s) for s in range(4)]
    assert isinstance(acks_for(reads), Acks)
    assert isinstance(acks_for([*reads, plan_read(4, [], set(), q)]), QuorumTracker)  # a slot with no replicas
    acks = acks_for(healthy)
    acks.record_success("a")
    assert not acks.done
    acks.record_success("c")
    assert acks.done and acks.error() is None


def test_requests_under_the_same_plans_count_their_answers_apart() -> None:
    # acks_for remembers what it derives from a plan list (the live path asks with the same cached
    # plans batch after batch): one request's answers and failures must not leak into the next's
    q = QuorumSettings(rf=3, w=2, r=2)
    plans = [plan_write(s, ["a", "b", "c"], {"a", "b", "c"}, q) for s in range(4)]
    first = acks_for(plans)
    first.record_success("a")
    first.record_success("b")
    assert first.done
    second = acks_for(plans)
    assert isinstance(second, Acks) and not second.done
    assert second.asks() == {m: [0, 1, 2, 3] for m in "abc"}
    second.record_success("a")
    second.record_failure("b", "refused")
    third = acks_for(plans)
    assert not third.done and not third.failed
    third.record_success("c")
    third.record_success("a")
    assert third.done and not second.done
    # the same plans' values in new objects (a new map or health) are a new list: still right
    again = [plan_write(s, ["a", "b", "c"], {"a", "b"}, q) for s in range(4)]
    assert acks_for(again).asks() == {m: [0, 1, 2, 3] for m in "ab"}
