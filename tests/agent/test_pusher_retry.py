"""Backoff schedule and target choice, exactly, with time and randomness passed in."""

from __future__ import annotations

import pytest

from metricsd.agent.retry import BackoffPolicy, Failover
from metricsd.clock import ManualClock


def test_backoff_doubles_from_the_base_up_to_the_cap() -> None:
    policy = BackoffPolicy(base_s=0.25, factor=2.0, max_s=10.0, jitter=0.5)
    assert [policy.delay(n, 0.0) for n in range(1, 10)] == [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]


def test_jitter_shortens_the_delay_by_up_to_its_share() -> None:
    policy = BackoffPolicy(base_s=1.0, factor=3.0, max_s=100.0, jitter=0.5)
    assert policy.delay(3, 0.0) == 9.0
    assert policy.delay(3, 0.5) == 6.75
    assert policy.delay(3, 0.999) == pytest.approx(4.5045)
    assert BackoffPolicy(jitter=0.0).delay(2, 0.9) == 0.5


def test_a_huge_failure_count_stays_at_the_cap() -> None:
    assert BackoffPolicy(max_s=7.0).delay(10_000, 0.0) == 7.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"base_s": 0.0}, "backoff needs 0 < base_s <= max_s and factor >= 1"),
        ({"base_s": 2.0, "max_s": 1.0}, "backoff needs 0 < base_s <= max_s and factor >= 1"),
        ({"factor": 0.5}, "backoff needs 0 < base_s <= max_s and factor >= 1"),
        ({"jitter": 1.5}, "backoff jitter must be in [0, 1], got 1.5"),
    ],
)
def test_nonsense_policies_are_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError) as e:
        BackoffPolicy(**kwargs)
    assert str(e.value) == message


def test_one_target_waits_out_its_backoff_schedule() -> None:
    clock = ManualClock()
    f = Failover(1, BackoffPolicy(base_s=0.25, max_s=2.0, jitter=0.0))
    waits = []
    for _ in range(6):
        i, wait = f.next(clock.monotonic())
        assert i == 0
        waits.append(wait)
        clock.advance(round(wait * 1000))
        f.failed(0, clock.monotonic(), 0.0)
    assert waits == [0.0, 0.25, 0.5, 1.0, 2.0, 2.0]
    f.succeeded(0)
    assert f.next(clock.monotonic()) == (0, 0.0) and f.up(0)


def test_a_failed_target_hands_over_to_the_next_at_once() -> None:
    clock = ManualClock()
    f = Failover(3, BackoffPolicy(base_s=1.0, jitter=0.0))
    assert f.next(0.0) == (0, 0.0)
    f.failed(0, clock.monotonic(), 0.0)
    assert f.next(clock.monotonic()) == (1, 0.0)
    f.succeeded(1)
    # Sticky: the second target stays in use even once the first is back.
    clock.advance(5_000)
    assert f.next(clock.monotonic()) == (1, 0.0)
    assert not f.up(0) and f.failures(0) == 1


def test_when_every_target_backs_off_the_first_to_come_back_is_chosen() -> None:
    f = Failover(2, BackoffPolicy(base_s=1.0, jitter=0.0))
    f.failed(0, 0.0, 0.0)  # back at 1.0
    f.failed(1, 0.0, 0.0)  # back at 1.0
    f.failed(1, 0.5, 0.0)  # second failure: back at 2.5
    assert f.next(0.6) == (0, pytest.approx(0.4))
    f.failed(0, 1.0, 0.0)  # back at 3.0
    assert f.next(1.0) == (1, 1.5)


def test_failover_needs_a_target() -> None:
    with pytest.raises(ValueError, match="at least one target"):
        Failover(0)
