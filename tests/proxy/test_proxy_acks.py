"""WriteAcks answers as QuorumTracker does, whatever the order of answers and failures."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.proxy.acks import WriteAcks, write_acks
from metricsd.proxy.quorum import QuorumSettings, QuorumTracker, plan_write

MEMBERS = ["a", "b", "c", "d"]


@given(st.data())
@settings(max_examples=200, deadline=None)
def test_write_acks_agree_with_the_tracker(data: st.DataObject) -> None:
    q = QuorumSettings(rf=3, w=2, r=2)
    plans = []
    for slot in range(data.draw(st.integers(0, 8))):
        replicas = data.draw(st.lists(st.sampled_from(MEMBERS), min_size=0, max_size=3, unique=True))
        plans.append(plan_write(slot, replicas, set(data.draw(st.sets(st.sampled_from(MEMBERS)))), q))
    fast, slow = write_acks(plans), QuorumTracker(plans)
    assert fast.asks() == slow.asks()
    for member in data.draw(st.permutations(sorted(slow.asks()))):
        if slow.done or slow.failed:
            break
        assert (fast.done, fast.failed) == (slow.done, slow.failed)
        if data.draw(st.booleans()):
            fast.record_success(member)
            slow.record_success(member)
        else:
            assert fast.record_failure(member, "refused") == slow.record_failure(member, "refused")
    assert (fast.done, fast.failed) == (slow.done, slow.failed)
    fe, se = fast.error(), slow.error()
    assert (str(fe), getattr(fe, "slots", None)) == (str(se), getattr(se, "slots", None))


def test_healthy_plans_take_the_array_path_and_others_the_tracker() -> None:
    q = QuorumSettings(rf=3, w=2, r=2)
    healthy = [plan_write(s, ["a", "b", "c"], {"a", "b", "c"}, q) for s in range(4)]
    assert isinstance(write_acks(healthy), WriteAcks)
    short = [*healthy, plan_write(4, ["a", "b", "c"], {"a"}, q)]  # one slot cannot reach W
    assert isinstance(write_acks(short), QuorumTracker)
    acks = write_acks(healthy)
    acks.record_success("a")
    assert not acks.done
    acks.record_success("c")
    assert acks.done and acks.error() is None
